"""A float (or complex) cast to bool on the GPU as a bit test, so a subnormal stays true.

CuPy compiles every kernel of its own (ufuncs, ``astype``'s copy kernel) with ``-ftz=true``
(``cupy/cuda/compiler.py``, ``_compile_with_cache_cuda``, appended unconditionally): the
cast's ``x != 0`` then reads a subnormal input as zero and gives False. MLX's CUDA kernels
keep subnormals (NVRTC's default ``--ftz=false``, ``mlx/backend/cuda/jit_module.cpp``; its
cast is ``static_cast<bool>``), as this runtime's generated kernels do
(``compiled.nvrtc_compile``). A value is true unless it is +0 or -0: its bits without the
sign bit are nonzero (NaN and infinities are true), integer operations that no flush
touches. Other casts are the array-module rule's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..primitives import REGISTRY

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _nonzero(xp, a: Any) -> Any:
    u = _UINT[a.dtype.itemsize]
    magnitude = u((1 << (8 * a.dtype.itemsize - 1)) - 1)
    return (a.view(u) & magnitude) != u(0)


def astype(xp, a: Any, *, dtype: Any) -> Any:
    """``AsType``'s rule on the GPU: float / complex to bool by the bits, else the
    array-module rule."""
    if np.dtype(dtype) == np.bool_:
        kind = a.dtype.kind
        if kind == "f" and a.dtype.itemsize in _UINT:
            return _nonzero(xp, a)
        if kind == "c":
            return _nonzero(xp, a.real) | _nonzero(xp, a.imag)
    return REGISTRY["AsType"].rule(xp, a, dtype=dtype)
