"""MLX's float32 matmul precision on CUDA: TensorFloat-32 unless ``MLX_ENABLE_TF32=0``.

MLX's CUDA backend multiplies float32 and complex64 matrices with cuBLAS's
``CUBLAS_COMPUTE_32F_FAST_TF32`` (inputs rounded to TF32's 10-bit mantissa, float32
accumulation) unless the environment sets ``MLX_ENABLE_TF32=0``; float16 / bfloat16 use
``CUBLAS_COMPUTE_32F`` either way (mlx/backend/cuda/gemms/cublas_gemm.cpp, mlx/utils.h
``env::enable_tf32``; its convolutions follow the same switch, backend/cuda/conv.cpp).
tapescope's switch is ``tapescope.settings.tf32`` (that variable; assignable in Python).

CuPy keeps its GEMM compute type per dtype in one process-wide table
(``cupy._core._routines_linalg``; ``CUPY_TF32=1`` fills it at first use). A matmul-family
rule on the GPU runs between :func:`compute_type`'s set and restore, so the user's own CuPy
calls in the same process keep CuPy's setting. A CuPy without that table (the stand-in
CuPy of the tests) or a device before sm_80 (no TF32) computes in float32.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import numpy as np

from ..settings import settings

_WIDE = (np.dtype(np.float32), np.dtype(np.complex64))


@functools.lru_cache(maxsize=None)
def _table() -> Any:
    """CuPy's compute-type table module, or None where this CuPy has none (looked up once:
    a failed import searches the whole path again each time)."""
    try:
        from cupy._core import _routines_linalg
    except ImportError:
        return None
    return _routines_linalg if hasattr(_routines_linalg, "set_compute_type") else None


def _tf32_capable() -> bool:
    import cupy

    try:
        return int(cupy.cuda.Device().compute_capability) >= 80
    except Exception:  # no device (the stand-in CuPy): nothing to switch
        return False


@contextlib.contextmanager
def compute_type(tf32: bool) -> Iterator[None]:
    """float32 / complex64 GEMMs in TF32 (``tf32``) or full float32 inside the block."""
    table = _table()
    if table is None:
        yield
        return
    want = table.COMPUTE_TYPE_TF32 if tf32 and _tf32_capable() else table.COMPUTE_TYPE_FP32
    before = table.get_compute_type(np.float32)
    if before == want:
        yield
        return
    table.set_compute_type(np.float32, want)
    try:
        yield
    finally:
        table.set_compute_type(np.float32, before)


def matmul_rule(rule: Callable) -> Callable:
    """``rule`` (a matmul-family definition's) run at MLX's precision: TF32 where
    ``settings.tf32`` is on and its array inputs are float32 or complex64."""

    def run(xp: Any, *inputs: Any, **params: Any) -> Any:
        wide = all(getattr(x, "dtype", _WIDE[0]) in _WIDE for x in inputs)
        with compute_type(settings.tf32 and wide):
            return rule(xp, *inputs, **params)

    run.__name__ = getattr(rule, "__name__", "matmul")
    run.__doc__ = rule.__doc__
    return run
