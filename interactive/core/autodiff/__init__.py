"""Reverse and forward mode: ``grad``, ``value_and_grad``, ``vjp``, ``jvp``,
``custom_function``, ``checkpoint`` (MLX 0.32's semantics), over the lazy graph.

``engine`` walks the recorded graph; the rule modules (one per op family, as
``tapescope.kernels.rules``) register each primitive's VJP and JVP onto its definition, or
state why it has none.
"""

from . import (  # noqa: F401 - each module registers its rules
    compiled, conv, distributed, elementwise, fast, fft, indexing, masked_mm, products, quantized,
    reduction, scan, shape, sort, without,
)
from .api import grad, jvp, value_and_grad, vjp  # noqa: F401
from .custom import checkpoint, custom_function  # noqa: F401
from .engine import is_backward  # noqa: F401

__all__ = ["grad", "value_and_grad", "vjp", "jvp", "custom_function", "checkpoint"]
