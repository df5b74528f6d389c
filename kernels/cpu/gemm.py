"""Small matrix products on the CPU as planned BLAS calls: ``Matmul`` and ``AddMM``.

A 2-D product of float32 or float64 operands, each row- or column-major (a transposed
view passes as BLAS's transpose flag), of at most ``SMALL_PRODUCT`` multiply-adds is a
``KernelRule`` plan (``kernels/kernel_call.py``): a ``KernelCall`` of ``_gemm.c``'s
``gemm``, which calls numpy's own OpenBLAS (its CBLAS ``?gemm``, or ``?gemv`` for a product
of one row or one column: a decoding step's ``x @ W.T`` reads the weight once instead of
packing it first) into the eval loop's output buffer, so the loop runs the node from C without the rule's Python, numpy's ufunc
machinery or a result to adopt. ``AddMM`` copies ``c`` into the output and passes ``beta``
to the gemm, as MLX's CPU backend does (mlx/backend/cpu/matmul.cpp). OpenBLAS runs a
product that small on one thread (interface/gemm.c: ``MNK <= 65536 * 4``), so the thread
policy (``threads.fit_blas_threads``, before every other BLAS call) has nothing to fit. What
no plan takes (batches, other dtypes, other strides, larger products, no BLAS found, the
extension not built) runs the primitive's rule (``rules/products.py``).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from typing import Optional

import numpy as np

from .. import timeline
from ..kernel_call import KernelCall, KernelRule
from ..primitives import REGISTRY

SMALL_PRODUCT = 65536 * 4  # m * n * k at most: OpenBLAS's one-thread products
_DTYPES = {np.dtype(np.float32): ("s", 0), np.dtype(np.float64): ("d", 1)}
# argv's places (_gemm.c): the arrays' pointers go last
_A, _B, _C, _OUT = 15, 16, 17, 18


def _openblas_paths() -> list:
    """The OpenBLAS libraries loaded in this process, numpy's first."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line and ".so" in line}
    except OSError:
        return []
    return sorted(paths, key=lambda p: ("numpy" not in p, p))


@functools.lru_cache(maxsize=None)
def cblas(prefix: str, routine: str = "gemm") -> Optional[tuple]:
    """(address, 64-bit integers) of the CBLAS ``?gemm`` (``prefix`` "s" or "d"; ``routine``
    "gemv": ``?gemv``) of numpy's OpenBLAS, or None where none is found."""
    for path in _openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        r = f"{prefix}{routine}"
        for name, ilp64 in ((f"scipy_cblas_{r}64_", 1), (f"cblas_{r}64_", 1),
                            (f"scipy_cblas_{r}", 0), (f"cblas_{r}", 0)):
            fn = getattr(lib, name, None)
            if fn is not None:
                return ctypes.cast(fn, ctypes.c_void_p).value, ilp64
    return None


def _gemv(prefix: str, ilp64: int) -> int:
    """The ``?gemv`` of the library ``?gemm`` came from (the same integers), else 0: a
    product of one row or column is one matrix-vector pass (_gemm.c)."""
    gv = cblas(prefix, "gemv")
    return gv[0] if gv is not None and gv[1] == ilp64 else 0


@functools.lru_cache(maxsize=None)
def _trampoline() -> Optional[int]:
    try:
        from . import _gemm
    except ImportError:
        return None
    return _gemm.address()


def _operand(a: np.ndarray) -> Optional[tuple]:
    """(transposed, leading dimension) of a 2-D operand BLAS reads as it lies, else None."""
    rows, cols = a.shape
    s0, s1 = (s // a.itemsize for s in a.strides)
    if any(s % a.itemsize for s in a.strides):
        return None
    if (s1 == 1 or cols == 1) and s0 >= max(1, cols):
        return 0, max(1, s0)
    if (s0 == 1 or rows == 1) and s1 >= max(1, rows):
        return 1, max(1, s1)
    return None


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _plan(name: str, a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0):
    """The KernelCall of this product's layout, or None (the rule runs it)."""
    if (type(a) is not np.ndarray or type(b) is not np.ndarray or a.ndim != 2 or b.ndim != 2
            or a.dtype != b.dtype or a.dtype not in _DTYPES):
        return None
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or 0 in (m, n, k) or m * n * k > SMALL_PRODUCT:
        return None
    if c is not None and (type(c) is not np.ndarray or c.dtype != a.dtype or c.shape != (m, n)
                          or any(s % c.itemsize for s in c.strides)):
        return None
    fa, fb = _operand(a), _operand(b)
    prefix, f64 = _DTYPES[a.dtype]
    fn, gemm = cblas(prefix), _trampoline()
    if fa is None or fb is None or fn is None or gemm is None:
        return None
    has_c = c is not None and beta != 0.0  # beta 0: c is not read (the rule's, BLAS's)
    cs = tuple(s // c.itemsize for s in c.strides) if has_c else (0, 0)
    argv = (fn[0], f64, fn[1], m, n, k, fa[0], fa[1], fb[0], fb[1], _bits(alpha), _bits(beta),
            int(has_c), cs[0], cs[1], 0, 0, 0, 0, _gemv(prefix, fn[1]))
    slots = (_A, _B, _C, _OUT) if c is not None else (_A, _B, _OUT)
    detail = {"runtime": "blas", "variant": f"{'nt'[fa[0]]}{'nt'[fb[0]]}", "primitive": name,
              "tier": "kernel"}
    kernel = f"{prefix}gemv" if (m == 1 or n == 1) and argv[-1] else f"{prefix}gemm"

    def note(t0: int, t1: int, arrays: tuple) -> None:
        timeline.add("kernel_launch", t0, t1, name=kernel, device="cpu", detail=dict(detail))

    return KernelCall(gemm, True, argv, slots, None, None, note, (m, n), a.dtype)


def _fits(out, shape: tuple, dtype, ins) -> bool:
    """The output buffer the plan writes: its shape and dtype, row-contiguous, writeable (an
    input's memory too: _gemm.c computes into a temporary first)."""
    return (out is not None and out.shape == tuple(shape) and out.dtype == dtype
            and out.flags.c_contiguous and out.flags.writeable)


def _rule(name: str) -> KernelRule:
    return KernelRule(name, functools.partial(_plan, name), REGISTRY[name].rule, fits=_fits)


def _products() -> dict:
    """Matmul and AddMM, found by their definitions' rules."""
    from ..rules import products

    return {n: _rule(n) for n, d in REGISTRY.items() if d.rule in (products.matmul, products.addmm)}


RULES = _products()
