"""``mx.vmap`` (MLX 0.32's semantics) over the lazy graph.

``engine`` batches the recorded graph; the rule modules (one per op family, as
``tapescope.kernels.rules`` and ``autodiff``) register each primitive's batching rule onto its
definition, or state why it has none (MLX raises for it too). ``custom`` batches
``mx.custom_function`` (its ``@f.vmap`` rule, or the body batched again).
"""

from . import (  # noqa: F401 - each module registers its rules
    compiled, conv, custom, distributed, elementwise, fast, fft, indexing, linalg, masked_mm, products, quantized, random, reduction,
    scan, shape, without,
)
from .api import vmap  # noqa: F401

__all__ = ["vmap"]
