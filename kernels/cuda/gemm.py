"""Matmul and AddMM on the GPU as one cuBLAS GEMM each, as MLX's CUDA backend runs them.

MLX (``mlx/backend/cuda/matmul.cpp``, ``gemms/cublas_gemm.cpp``) reads each operand's last
two axes as a row-major or a transposed matrix where its strides allow (``check_transpose``:
row stride = columns, or column stride = rows), copies it contiguous otherwise, collapses the
batch axes to one stride, and calls cuBLAS once: float32 in TF32 unless ``MLX_ENABLE_TF32=0``
(``settings.tf32`` here), float16 / bfloat16 stored as themselves with float32 accumulation
(``CUBLAS_COMPUTE_32F``; the result rounded to nearest even on store), complex64 as float32.
AddMM writes ``c`` (broadcast) into the output and lets the GEMM add ``beta * c`` (MLX's
``copy_gpu(c, out)`` path; it uses cublasLt's bias epilogue where ``c`` is one row).

Row-major ``C = A @ B`` is column-major ``C^T = B^T A^T``: cuBLAS is called with the
operands swapped and ``m, n = N, M``. bfloat16 arrays are ``BF16Array``s (``bfloat16.py``):
their uint16 storage is handed to cuBLAS as ``CUDA_R_16BF``, so no float32 copy is made.
Without cuBLAS bindings (the stand-in CuPy of the tests) the definitions' rules run.

One row times a transposed weight (``x @ w.T`` with M = 1 and no ``c``: an ``nn.Linear`` in
decoding) is MLX's gemv instead (``gemms/gemv.cu``, which MLX takes for M = 1 before
cuBLAS): ``codegen/gemv_cuda.py``'s kernel, a ``primitive_plans.KernelPlan`` the eval loop
launches from C by cuLaunchKernel, float32 accumulation in every dtype, never TF32 (MLX's
gemv has no TF32 either); where the kernel does not build, the GEMM.

A planned GEMM is launched from C as well (``cuda/_driver.c``: ``GemmPlan.cublas``'s words,
cublasSetStream_v2 + cublasGemmStridedBatchedEx of the libcublas CuPy's binding links, with
CuPy's handle; AddMM's ``c`` copied in first by its copy kernel's plan, ``GemmPlan.copy``,
launched there too), as MLX's ``Matmul::eval_gpu`` calls cuBLAS from C++. CuPy's binding stays
for what has no plan: the first call of a layout (``gemm``), an operand copied first, an
empty product, a ``c`` whose copy kernel does not build, the attention prefill's and the
quantized qmm's GEMMs (``strided_batched``), and a backend without the C launch.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import cupy
import numpy as np

from ..common.strides import one_stride
from ..kernel_call import KernelRule
from ..primitives import by_kernel
from ..settings import settings
from . import bfloat16 as bf16

try:  # CuPy's thin cuBLAS bindings (cupy_backends/cuda/libs/cublas.pyx)
    from cupy_backends.cuda.libs import cublas as _cublas
except ImportError:  # pragma: no cover - a CuPy without them
    _cublas = None

# cudaDataType_t / cublasComputeType_t (library_types.h, cublas_api.h)
_R_32F, _R_16F, _C_32F, _R_16BF = 0, 2, 4, 14
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1

# dtype -> (cuBLAS data type, compute type, the scalars' numpy type, TF32 applies)
_TYPES = {
    np.dtype(np.float32): (_R_32F, _COMPUTE_32F, np.float32, True),
    np.dtype(np.float16): (_R_16F, _COMPUTE_32F, np.float32, False),
    bf16.BF16: (_R_16BF, _COMPUTE_32F, np.float32, False),
    np.dtype(np.complex64): (_C_32F, _COMPUTE_32F, np.complex64, True),
}  # float64 never reaches a GPU stream (MLX refuses it there: core/array.py)


# settings.tf32 as cuda/_driver.c reads it per GEMM launched in C (a list settings.watch
# keeps: the switch as last assigned or read)
TF32: list = [True]


def _watch_tf32(value: Any) -> None:
    TF32[0] = bool(value)


settings.watch("tf32", _watch_tf32)


def available() -> bool:
    """Whether this CuPy has the cuBLAS bindings the GEMM calls."""
    return _cublas is not None and hasattr(_cublas, "gemmStridedBatchedEx")


@functools.lru_cache(maxsize=None)
def _tf32_capable(device_id: int) -> bool:
    return int(cupy.cuda.Device(device_id).compute_capability) >= 80


@functools.lru_cache(maxsize=None)
def _scalar(value: complex, kind: type) -> np.ndarray:
    """A host scalar cuBLAS reads through its pointer (kept alive by the cache)."""
    return np.array(value, dtype=kind)


def _layout(x: Any) -> Optional[tuple]:
    """(transposed, leading dimension, batch stride) of ``x`` as cuBLAS reads it in place
    (MLX's ``check_transpose`` and ``collapse_batches``), or None."""
    item = x.itemsize
    r, c = x.shape[-2], x.shape[-1]
    sr, sc = x.strides[-2] // item, x.strides[-1] // item
    if (sc == 1 or c == 1) and (sr == c or r == 1):
        layout = (False, max(c, 1))
    elif (sr == 1 or r == 1) and (sc == r or c == 1):
        layout = (True, max(r, 1))
    else:
        return None
    batch = _batch_stride(x)
    return None if batch is None else layout + (batch,)


def _batch_stride(x: Any) -> Optional[int]:
    """One stride in elements over ``x``'s leading (batch) axes, or None where they do not
    collapse (MLX's ``collapse_batches``); 0 for a broadcast batch."""
    return one_stride(x.shape[:-2], [s // x.itemsize for s in x.strides[:-2]])


def _target(given: Any, shape: tuple, A: Any, B: Any) -> Any:
    """The evaluator's buffer ``given`` (its storage) where the GEMM can write it: the
    product's shape and storage dtype, row-contiguous, not an operand's memory (cuBLAS
    reads A and B while it writes C; ``c`` is copied into it first, so it may be c's)."""
    t = bf16.storage(given) if given is not None else None
    if (t is None or type(t) is not cupy.ndarray or t.shape != shape or t.dtype != A.dtype
            or not t.flags.c_contiguous or cupy.may_share_memory(t, A)
            or cupy.may_share_memory(t, B)):
        return None
    return t


def gemm(xp: Any, a: Any, b: Any, c: Any = None, *, alpha: float = 1.0,
         beta: float = 0.0, out: Any = None) -> Any:
    """``a @ b`` (Matmul), or ``alpha * (a @ b) + beta * c`` (AddMM), batch axes already
    broadcast to match, as one cuBLAS GEMM on the current CuPy stream, into ``out`` (the
    evaluator's buffer, MLX's ``out.set_data``) where it fits, else into a new array."""
    dt = a.dtype
    got = _TYPES.get(dt)
    if got is None or b.dtype != dt or not available():
        return _fallback(xp, a, b, c, alpha, beta)
    A, B = bf16.storage(a), bf16.storage(b)
    M, K = A.shape[-2], A.shape[-1]
    out_shape = tuple(A.shape[:-2]) + (M, B.shape[-1])
    target = _target(out, out_shape, A, B)
    res = target if target is not None else cupy.empty(out_shape, dtype=A.dtype)
    if res.size and K:
        # a copy in row-major order where cuBLAS cannot read an operand in place
        A = A if _layout(A) is not None else cupy.ascontiguousarray(A)
        B = B if _layout(B) is not None else cupy.ascontiguousarray(B)
        p = _plan(A, B, dt, c is not None and beta != 0.0, alpha, beta, c)
        if isinstance(p, GemmPlan):
            p.run((A, B, c), res)
        else:  # the gemv's KernelPlan
            p(A, B, res)
    elif res.size:  # an empty sum: beta * c, or zeros
        if c is None or beta == 0.0:
            res.fill(0)
        elif beta != 1.0:
            scaled = cupy.broadcast_to(bf16.value(c) * got[2](beta), out_shape)
            return bf16.narrow(scaled) if dt == bf16.BF16 else scaled.astype(dt)
        else:
            res[...] = bf16.storage(c)
    if target is not None:
        return out  # the evaluator's own array (a BF16Array over ``target`` for bfloat16)
    return bf16.BF16Array(res) if dt == bf16.BF16 else res


gemm.takes_bfloat16 = True  # cuda/backend.py: bfloat16 operands come as BF16Arrays


def data_type(dtype) -> int:
    """cuBLAS's ``cudaDataType_t`` of storage ``dtype`` (float32, float16, bfloat16)."""
    return _TYPES[np.dtype(dtype)][0]


def full_compute_type(dtype) -> int:
    """The compute type of a GEMM over ``dtype`` values at full float32 (never TF32: the
    quantized products, as MLX's ``qmm`` kernels compute)."""
    return _TYPES[np.dtype(dtype)][1]


def compute_type(dtype) -> int:
    """The compute type of a GEMM over ``dtype`` values: float32 accumulation, TF32 for
    float32 where ``settings.tf32`` (MLX_ENABLE_TF32) and the GPU has it."""
    _, compute, _, tf32 = _TYPES[np.dtype(dtype)]
    if tf32 and settings.tf32 and _tf32_capable(cupy.cuda.runtime.getDevice()):
        return _COMPUTE_32F_FAST_TF32
    return compute


def strided_batched(trans_a: bool, trans_b: bool, m: int, n: int, k: int, alpha: float,
                    a: int, a_type: int, lda: int, sa: int, b: int, b_type: int, ldb: int,
                    sb: int, c: int, c_type: int, ldc: int, sc: int, count: int,
                    compute: int, beta: float = 0.0, kind: type = np.float32) -> None:
    """One ``cublasGemmStridedBatchedEx`` in cuBLAS's column-major terms (pointers as
    integers, strides in elements) on the current CuPy stream: ``C = alpha op(A) op(B) +
    beta C`` for ``count`` matrices, the scalars of numpy type ``kind``. Every GEMM of the
    CUDA backend is this call."""
    _cublas.gemmStridedBatchedEx(
        cupy.cuda.device.get_cublas_handle(), _OP_T if trans_a else _OP_N,
        _OP_T if trans_b else _OP_N, m, n, k, _scalar(alpha, kind).ctypes.data,
        a, a_type, lda, sa, b, b_type, ldb, sb, _scalar(beta, kind).ctypes.data,
        c, c_type, ldc, sc, count, compute, _GEMM_DEFAULT)


def _fallback(xp, a, b, c, alpha, beta):
    """The definitions' rules at MLX's precision (``precision.matmul_rule``)."""
    from ..rules.products import addmm, matmul
    from .precision import matmul_rule

    if c is None:
        return matmul_rule(matmul)(xp, a, b)
    return matmul_rule(addmm)(xp, a, b, c, alpha=alpha, beta=beta)


class GemmPlan:
    """One GEMM call's cuBLAS arguments for one call layout (the operands' types, dtypes,
    shapes and strides, ``alpha`` / ``beta``: ``KernelRule``'s key), made once: later calls
    of that layout are launched by the eval loop from C (core/_loop.c run_node, a device's
    planned rule) into a fresh allocator buffer: ``cuda/_driver.c``'s cuBLAS call (else
    ``CudaBackend.launch_fused``, this class's ``call``), with none of the rule's layout
    checks (MLX's ``Matmul::eval_gpu`` is one C++ call). A
    layout the GEMM cannot read in place (a copy first), an empty product or sum, or a
    dtype without a cuBLAS type has no plan: ``gemm`` runs."""

    __slots__ = ("args", "beta", "tf32", "out_shape", "out_dtype", "primitive", "scalars",
                 "cublas", "copy", "lane")
    name = variant = "cublas_gemm_strided_batched"
    entry = None

    def __init__(self, args: tuple, beta: float, tf32: bool, out_shape: tuple, out_dtype,
                 c: Any = None):
        self.args, self.beta, self.tf32 = args, beta, tf32
        self.out_shape, self.out_dtype = out_shape, out_dtype
        self.primitive = "Matmul"  # (the primitive it was planned for: the timeline's name)
        # the host addresses of alpha and beta as cuBLAS reads them (``_scalar``'s arrays,
        # kept by its cache), taken once: ``.ctypes`` builds Python objects per read
        kind = args[-1]
        self.scalars = (int(_scalar(args[5], kind).ctypes.data),
                        int(_scalar(beta, kind).ctypes.data))
        # cuda/_driver.c's launch in C: cublasGemmStridedBatchedEx's arguments in its
        # column-major terms (B first), the compute type without TF32 and whether TF32
        # applies (the switch read per call), the scalars' addresses; ``lane``: its record
        tb, ta, n, m, k, _, ldb, sb, lda, sa, ldc, sc, count, t, compute, _ = args
        self.cublas = (_OP_T if tb else _OP_N, _OP_T if ta else _OP_N, n, m, k, ldb, sb,
                       lda, sa, ldc, sc, count, t, compute, int(bool(tf32)), *self.scalars)
        # AddMM's c copied into the output first: the one-op copy kernel's plan for c's
        # layout (MLX's copy_gpu(c, out)); none to be had, no launch in C (``lane`` False)
        self.copy = _copy_plan(c, out_shape, out_dtype) if beta else None
        self.lane = False if beta and self.copy is None else None

    def launch_detail(self) -> dict:
        """The timeline's ``kernel_launch`` detail of a launch from C (cuBLAS's sizes)."""
        tb, ta, n, m, k = self.args[:5]
        return {"m": m, "n": n, "k": k, "batch": self.args[12], "library": "cublas"}

    def takes(self, out) -> bool:
        """Whether ``out`` is a buffer the GEMM writes as it is (the loop's fresh buffer)."""
        t = bf16.storage(out)
        return (tuple(out.shape) == self.out_shape and out.dtype == self.out_dtype
                and type(t) is cupy.ndarray and t.flags.c_contiguous)

    def __call__(self, *arrays) -> None:
        """``plan(a, b[, c], out)`` on the current CUDA stream."""
        self.run(arrays[:-1], bf16.storage(arrays[-1]))

    def call(self, inputs, outs, stream=None) -> None:
        """The GEMM on ``stream`` (``launch_fused``'s call: the loop's fresh output)."""
        if stream is None:
            self.run(inputs, bf16.storage(outs[0]))
            return
        with stream:  # cuBLAS and the copy of ``c`` on the node's stream
            self.run(inputs, bf16.storage(outs[0]))

    def run(self, ins, res) -> None:
        """``res = alpha a @ b (+ beta c)`` for operands of the planned layout."""
        if self.beta:  # the GEMM adds beta * res (MLX's copy_gpu(c, out)): the copy kernel
            if self.copy is not None:  # (the one _driver.c launches)
                self.copy.call((ins[2],), (res,))
            else:
                res[...] = bf16.storage(ins[2])
        a, b = bf16.storage(ins[0]), bf16.storage(ins[1])
        tb, ta, n, m, k, _, ldb, sb, lda, sa, ldc, sc, count, t, compute, _ = self.args
        if self.tf32 and settings.tf32:
            compute = _COMPUTE_32F_FAST_TF32
        alpha, beta = self.scalars
        # (row-major C = A B is column-major C^T = B^T A^T: B comes first; strided_batched's
        # call with the scalars' addresses already taken)
        _cublas.gemmStridedBatchedEx(
            cupy.cuda.device.get_cublas_handle(), _OP_T if tb else _OP_N, _OP_T if ta else _OP_N,
            n, m, k, alpha, b.data.ptr, t, ldb, sb, a.data.ptr, t, lda, sa, beta,
            res.data.ptr, t, ldc, sc, count, compute, _GEMM_DEFAULT)


def _copy_plan(c: Any, shape: tuple, dtype: Any):
    """The loaded plan of the copy kernel writing ``c`` (a device array, broadcast) into a
    row-major ``dtype`` of ``shape`` (``bfloat16.elementwise_tape``'s ``AsType``), or None."""
    from . import compiled

    if type(c) is not cupy.ndarray and type(c) is not bf16.BF16Array:
        return None
    try:
        tape = bf16.elementwise_tape("AsType", [c.dtype], dtype, [c.ndim == 0])
        ln = compiled.kernel_for(tape, [c], shape)
    except Exception:  # (no kernel to be had: the Python copy)
        return None
    return ln if ln is not None and ln.order == "C" else None


def gemm_plan(a: Any, b: Any, c: Any = None, *, alpha: float = 1.0,
              beta: float = 0.0) -> Optional[GemmPlan]:
    """The plan of a GEMM call of these operands' layouts (None: ``gemm`` runs it)."""
    dt = a.dtype
    if dt not in _TYPES or b.dtype != dt or not available() or (c is None and beta != 0.0):
        return None
    return _plan(bf16.storage(a), bf16.storage(b), dt, c is not None, alpha, beta, c)


def _plan(A: Any, B: Any, dt: Any, with_c: bool, alpha: float, beta: float, c: Any = None
          ) -> Optional[GemmPlan]:
    """The plan over storage operands ``A`` and ``B`` of dtype ``dt``: None for an empty
    product or sum, or an operand that cuBLAS cannot read in place (a copy first)."""
    dtype_id, compute, kind, tf32 = _TYPES[dt]
    M, K = A.shape[-2], A.shape[-1]
    N = B.shape[-1]
    out_shape = tuple(A.shape[:-2]) + (M, N)
    count = 1
    for s in out_shape[:-2]:
        count *= s
    if not (M and N and K and count):
        return None
    la, lb = _layout(A), _layout(B)
    if la is None or lb is None:
        return None
    if M == 1 and not with_c and alpha == 1.0:
        p = _gemv_plan(A, B, dt, la, lb, N, K, count, out_shape)
        if p is not None:
            return p
    args = (lb[0], la[0], N, M, K, alpha, lb[1], lb[2], la[1], la[2], N, M * N, count,
            dtype_id, compute, kind)
    return GemmPlan(args, float(beta) if with_c else 0.0,
                    tf32 and _tf32_capable(cupy.cuda.runtime.getDevice()), out_shape, dt, c)


class _GemvStep:
    """The gemv kernel's launch as ``KernelPlan`` reads a ``reductions.Step``: a block per
    ``gemv_cuda.WARPS`` output columns of each batch entry, its arguments in the signature's
    order (int64 values; None where a buffer goes) and where each buffer goes."""

    __slots__ = ("spec", "grid", "block", "args", "bufs", "arrays")

    def __init__(self, spec, ints: dict):
        from ..codegen.gemv_cuda import WARPS

        self.spec, self.grid, self.block = spec, ints["B"] * -(-ints["N"] // WARPS), 32 * WARPS
        self.args, self.bufs, self.arrays = [], [], []
        for i, (kind, name) in enumerate(spec.params()):
            if kind == "int":
                self.args.append(int(ints[name]))
            else:
                self.bufs.append((i, name))
                self.args.append(None)


def _gemv_plan(A: Any, B: Any, dt: Any, la: tuple, lb: tuple, N: int, K: int, count: int,
               out_shape: tuple):
    """The gemv's ``KernelPlan`` for a row ``A`` (unit stride along K) times ``B`` whose
    columns are unit-stride along K (a row-major weight's transpose: its rows), or None: the
    GEMM (another layout or dtype, no build)."""
    from ..codegen.gemv_cuda import TYPES, GemvSpec, cuda_source
    from .. import kernel_registry
    from . import compiled
    from .primitive_plans import KernelPlan

    name = "bfloat16" if dt == bf16.BF16 else np.dtype(dt).name
    item = B.itemsize
    if (name not in TYPES or (K > 1 and (A.strides[-1] != item or B.strides[-2] != item))
            or B.strides[-1] % item):
        return None
    spec = GemvSpec(name)
    try:
        entry = compiled.get_kernel(spec.name, spec.layout, lambda: cuda_source(spec),
                                    key=spec.name, tape=spec)
    except kernel_registry.BuildError:
        return None
    ints = dict(B=count, N=N, K=K, w_rs=B.strides[-1] // item, x_bs=la[2], w_bs=lb[2])
    return KernelPlan(_GemvStep(spec, ints), entry, {"x": 0, "w": 1}, {}, out_shape, dt,
                      "Matmul")


def _fits(out: Any, shape: tuple, dtype: Any, ins: tuple) -> bool:
    """Whether the evaluator's buffer takes the product (``_target``'s checks)."""
    return out is not None and _target(out, tuple(shape), bf16.storage(ins[0]),
                                       bf16.storage(ins[1])) is not None and out.dtype == dtype


def _empty(shape: tuple, dtype: Any) -> Any:
    return bf16.BF16Array(cupy.empty(shape, bf16.U16)) if dtype == bf16.BF16 else cupy.empty(
        shape, dtype=dtype)


def _slow(xp: Any, *ins, out: Any = None, **kw) -> Any:
    return gemm(xp, *ins, out=out, **kw)


_slow.takes_bfloat16 = True


# none over a CuPy without cuBLAS bindings: the definitions' rules run (cuda/backend.py)
def _plan_of(primitive: str):
    def plan(*ins, **kw) -> Optional[GemmPlan]:
        p = gemm_plan(*ins, **kw)
        if p is not None:
            p.primitive = primitive
        return p

    return plan


# (one KernelRule per primitive: its plans are keyed by the primitive's name, as the loop's)
RULES: dict = {n: KernelRule(n, _plan_of(n), _slow, _fits, _empty)
               for n in by_kernel({"gemm": gemm})} if available() else {}
