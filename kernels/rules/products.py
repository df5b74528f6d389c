"""Rules for matrix products: Matmul and AddMM (batched over leading, equal batch dims)."""

from __future__ import annotations

from ..cpu.threads import fit_blas_threads
from ..primitives import MATMUL, define, elements
from .forms import on_host


def _wide(xp, a):
    """Half-precision floats multiply-accumulate in float32 (rounded back on store)."""
    d = a.dtype  # float16 ('f') or ml_dtypes' bfloat16 ('V'), the only 2-byte dtypes of
    if d.itemsize == 2 and d.kind in "fV":  # those kinds; ``dtype.name`` costs ~4 us
        return a.astype(xp.float32)
    return a


def _matmul_flops(in_shapes: list, out_shapes: list) -> int:
    """A multiply and an add per (output element, k): 2 * M * N * K per batch."""
    return 2 * elements(out_shapes[0]) * int(in_shapes[0][-1])


def _addmm_flops(in_shapes: list, out_shapes: list) -> int:
    """The product's 2 * M * N * K and the scaled add of ``c``: 2 per output element."""
    return _matmul_flops(in_shapes, out_shapes) + 2 * elements(out_shapes[0])


def _product_shape(shapes: list, **_) -> list:
    """The first input's shape with the second's last dimension."""
    return [tuple(shapes[0][:-1]) + tuple(shapes[1][-1:])]


def _into(xp, res, out):
    """``res`` stored into ``out`` (the evaluator's buffer) on the host, else ``res``: a
    device's product is written fresh (its ``out`` may be a donated operand's memory)."""
    if out is None or not on_host(xp):
        return res
    out[...] = res
    return out


@define("Matmul", family=MATMUL, kernel="gemm", out=True, flops=_matmul_flops, shape=_product_shape)
def matmul(xp, a, b, out=None):
    """``a @ b`` over the last two axes; batch dims are already broadcast to match (the
    CPU's small 2-D products are planned BLAS calls: cpu/gemm.py; CUDA's one cuBLAS GEMM:
    cuda/gemm.py)."""
    if on_host(xp):
        fit_blas_threads()  # the host's BLAS takes the free cores (cpu/threads.py)
    return _into(xp, xp.matmul(_wide(xp, a), _wide(xp, b)), out)


@define("AddMM", family=MATMUL, kernel="gemm", out=True, flops=_addmm_flops, shape=_product_shape)
def addmm(xp, a, b, c, *, alpha, beta, out=None):
    """``alpha * (a @ b) + beta * c``."""
    if on_host(xp):
        fit_blas_threads()
    res = xp.matmul(_wide(xp, a), _wide(xp, b))
    if alpha != 1.0:
        res = res * res.dtype.type(alpha)
    if beta == 0.0:
        return _into(xp, res, out)
    cw = _wide(xp, c)
    return _into(xp, res + (cw if beta == 1.0 else cw * cw.dtype.type(beta)), out)
