"""Rules for matrix products: Matmul and AddMM (batched over leading, equal batch dims)."""

from __future__ import annotations

from ..cpu.threads import fit_blas_threads
from ..primitives import MATMUL, define


def _wide(xp, a):
    """Half-precision floats multiply-accumulate in float32 (rounded back on store)."""
    if a.dtype.name in ("bfloat16", "float16"):
        return a.astype(xp.float32)
    return a


@define("Matmul", family=MATMUL)
def matmul(xp, a, b):
    """``a @ b`` over the last two axes; batch dims are already broadcast to match."""
    if getattr(xp, "__name__", "") == "numpy":
        fit_blas_threads()  # BLAS takes the free cores (cpu/threads.py)
    return xp.matmul(_wide(xp, a), _wide(xp, b))


@define("AddMM", family=MATMUL)
def addmm(xp, a, b, c, *, alpha, beta):
    """``alpha * (a @ b) + beta * c``."""
    if getattr(xp, "__name__", "") == "numpy":
        fit_blas_threads()
    out = xp.matmul(_wide(xp, a), _wide(xp, b))
    if alpha != 1.0:
        out = out * out.dtype.type(alpha)
    if beta == 0.0:
        return out
    cw = _wide(xp, c)
    return out + (cw if beta == 1.0 else cw * cw.dtype.type(beta))
