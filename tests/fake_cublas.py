"""A stand-in for CuPy's cuBLAS bindings (``cupy_backends.cuda.libs.cublas``) over
``tests/fake_cupy.py``'s numpy memory: ``gemmStridedBatchedEx`` computed in float64 from the
raw pointers, leading dimensions and strides it is given, in cuBLAS's column-major terms, so
the CUDA backend's GEMM calls (``kernels/cuda/gemm.py``, the attention prefill's) are checked
against float64 numpy without a GPU. ``CALLS`` counts them, ``PY_CALLS`` those made through
the Python binding. A stand-in ``libcublas.so.12`` (``fake_libcublas.c``, built here with
``cc``) is loaded too, so ``cuda/_driver.c``'s launch of a GemmPlan in C finds its entry
points as it finds CuPy's libcublas; its GEMMs (``c_gemms()``, their words ``LAST``) are
computed by the same float64 code through a runner while ``compute(True)`` (the default).
Install after ``fake_cupy``, before tapescope is imported."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import ml_dtypes
import numpy as np

CALLS = [0]  # every GEMM, from Python or from C
PY_CALLS = [0]  # those through the Python binding (gemmStridedBatchedEx below)
COMPUTE = [True]  # False: calls counted, nothing computed (host-cost measurements)
LAST: list = [None]  # the last C call's 24 words (fake_libcublas.c: arguments, then stream)
_lib: list = [None, None]  # the stand-in library, its runner callback (kept alive)
_TYPES = {0: np.dtype(np.float32), 2: np.dtype(np.float16), 4: np.dtype(np.complex64),
          14: np.dtype(ml_dtypes.bfloat16)}


def _view(ptr: int, dtype: np.dtype, count: int, rows: int, cols: int, ld: int, stride: int):
    """``count`` column-major ``rows x cols`` matrices at ``ptr`` (numpy memory) as a
    (count, rows, cols) view."""
    it = dtype.itemsize
    if ld < max(1, rows):
        raise ValueError(f"cuBLAS: leading dimension {ld} below the {rows} rows")
    extent = ((count - 1) * stride + (rows - 1) + (cols - 1) * ld + 1) * it
    buf = (ctypes.c_char * extent).from_address(ptr)
    return np.ndarray((count, rows, cols), dtype, buf, 0, (stride * it, it, ld * it))


def gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                         Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, count, compute,
                         algo):
    CALLS[0] += 1
    PY_CALLS[0] += 1
    if COMPUTE[0]:
        _compute(transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                 strideB, beta, C, Ctype, ldc, strideC, count)


def _from_c() -> None:
    """The stand-in library's runner: its last GEMM computed from its argument words."""
    w = list(_lib[0].fake_cublas_args()[:24])
    LAST[0] = w
    CALLS[0] += 1
    _compute(*w[1:21])


def _compute(transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB,
             beta, C, Ctype, ldc, strideC, count):
    a_t, b_t, c_t = _TYPES[Atype], _TYPES[Btype], _TYPES[Ctype]
    scal = ctypes.c_float if c_t.kind != "c" and a_t.kind != "c" else None
    al = scal.from_address(alpha).value if scal else complex(*(ctypes.c_float * 2).from_address(alpha))
    be = scal.from_address(beta).value if scal else complex(*(ctypes.c_float * 2).from_address(beta))
    a = _view(A, a_t, count, *((k, m) if transa else (m, k)), lda, strideA)
    b = _view(B, b_t, count, *((n, k) if transb else (k, n)), ldb, strideB)
    c = _view(C, c_t, count, m, n, ldc, strideC)
    wide = np.complex128 if c_t.kind == "c" else np.float64
    av, bv = a.astype(wide), b.astype(wide)
    if transa:
        av = av.swapaxes(1, 2)
    if transb:
        bv = bv.swapaxes(1, 2)
    res = al * (av @ bv)
    if be != 0:
        res = res + be * c.astype(wide)
    c[...] = res.astype(c_t)


def build(folder=None) -> str:
    """The stand-in libcublas's path, built from ``fake_libcublas.c`` once per source."""
    src = Path(__file__).parent / "fake_libcublas.c"
    tag = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    folder = Path(folder or Path(tempfile.gettempdir()) / f"tapescope_fake_libcublas_{os.getuid()}_{tag}")
    out = folder / "libcublas.so.12"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"libcublas.so.12.{os.getpid()}"
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC",
                        "-Wl,-soname,libcublas.so.12", "-o", str(tmp), str(src)], check=True)
        os.replace(tmp, out)
    return str(out)


def compute(on: bool) -> None:
    """GEMMs computed on the host (``on``) or only counted (host-cost measurements: no
    Python runs for a GEMM launched from C)."""
    COMPUTE[0] = bool(on)
    if _lib[0] is not None:
        _lib[0].fake_cublas_set_runner(ctypes.cast(_lib[1], ctypes.c_void_p) if on else None)


def c_gemms() -> int:
    """GEMMs made through the stand-in library (launched from C) so far."""
    return int(_lib[0].fake_cublas_gemms()) if _lib[0] is not None else 0


def install() -> None:
    """``cupy_backends.cuda.libs.cublas`` and the few CuPy calls around it (the handle, the
    device's number and compute capability) on the stand-in CuPy."""
    cupy = sys.modules["cupy"]
    if _lib[0] is None:
        lib = ctypes.CDLL(build(), mode=ctypes.RTLD_GLOBAL)
        lib.fake_cublas_gemms.restype = ctypes.c_longlong
        lib.fake_cublas_args.restype = ctypes.POINTER(ctypes.c_longlong)
        lib.fake_cublas_set_runner.argtypes = [ctypes.c_void_p]
        _lib[0], _lib[1] = lib, ctypes.CFUNCTYPE(None)(_from_c)
        compute(COMPUTE[0])
    names = ["cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs"]
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    lib = types.ModuleType("cupy_backends.cuda.libs.cublas")
    lib.gemmStridedBatchedEx = gemmStridedBatchedEx
    sys.modules[lib.__name__] = lib
    sys.modules["cupy_backends.cuda.libs"].cublas = lib
    # CuPy's ``a.data.ptr`` (a MemoryPointer's address): the numpy memory's
    cupy.ndarray.data = property(lambda a: types.SimpleNamespace(ptr=a.ctypes.data))
    if not hasattr(cupy.cuda, "device"):
        cupy.cuda.device = types.SimpleNamespace(get_cublas_handle=lambda: 0)
    if not hasattr(cupy.cuda.Device, "compute_capability"):
        cupy.cuda.Device.compute_capability = "90"
