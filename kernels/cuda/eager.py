"""One-op CUDA kernels for eager elementwise ops, launched by the eval loop as a fused call.

MLX's CUDA backend runs an eager unary, binary or ternary op as one kernel of its own per
op and types (mlx/backend/cuda/unary.cu, binary.cu, ternary.cu; copy.cu for ``AsType``),
not through a library's array call. Here an eager elementwise node on a GPU stream is the
one-op tape of its primitive (``bfloat16.elementwise_tape``: the renderer's code, as a
compiled function's fused kernels), its call plan for the inputs' layouts loaded once
(``compiled.kernel_for``: NVRTC, cached in memory and on disk), and launched by the loop
like any loaded fused call (core/_loop.c run_node through the backend's C launch,
cuda/_driver.c), with no CuPy call and no device context on the way. Where the renderer
has no kernel for an op and types (noted once in the kernel cache), or an input is not a
plain CuPy array (bfloat16 storage: cuda/bfloat16.py's rules), the node's rule runs
through CuPy as before.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import cupy
import numpy as np

from . import compiled
from .bfloat16 import BF16, elementwise_tape

_none: set = set()  # (primitive, dtypes, params) the renderer refused: the rule from now on


def plan_for(prim: Any, ins: Sequence, dtype: Any, shape: tuple) -> Optional[Any]:
    """The loaded plan of ``prim``'s one-op kernel reading the device arrays ``ins`` and
    writing ``dtype`` of ``shape`` (a ``compiled.Launch``), or None: the rule runs."""
    dtype = np.dtype(dtype)
    if dtype == BF16 or dtype.kind == "V" or not ins:
        return None
    for x in ins:
        if type(x) is not cupy.ndarray or x.size == 0:
            return None
    params = prim.params
    dts = tuple(x.dtype for x in ins)
    key = (prim.name, dts, dtype, params)
    try:
        if key in _none:
            return None
        tape = elementwise_tape(prim.name, dts, dtype, [x.ndim == 0 for x in ins], params)
        return compiled.kernel_for(tape, ins, tuple(shape))
    except TypeError:  # a parameter that cannot key a tape (a list): the rule
        return None
    except Exception:  # noqa: BLE001 - the renderer refuses the op: the rule from now on
        _none.add(key)
        return None
