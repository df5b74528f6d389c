"""MLX's ``QuantizedMatmul`` and ``GatherQMM`` as generated CUDA.

An affine 4- or 8-bit ``quantized_matmul`` of up to ``qmv_cuda.MAX_ROWS`` rows with a
transposed weight (decoding) is a ``KernelPlan`` (``qmv_plan``: ``codegen/qmv_cuda.py``'s
kernel, compiled by NVRTC through the fused kernels' cache, x / scales / biases / output read
and written in their own type, bfloat16 as its 16 bits, float32 accumulation; its launch
words packed once per layout), so later calls of that layout are launched by the eval loop
from C (``primitive_plans.py``) with no Python code, as MLX's CUDA backend launches its
``qmv_kernel`` (mlx/backend/cuda/quantized/qmm/qmv.cu) from C++. A batch whose operands each
walk it with one stride is one launch; rows of a batch over one weight matrix are folded
into the call's rows. More rows are a ``QmmPlan``: the kernel's dequant form writes each
weight matrix the batch reads into a tile of x's type (kept per CUDA stream), then one
cuBLAS strided-batched GEMM at full float32 (MLX's ``qmm_naive`` computes float32 in
float32; its sm80 / sm90 kernels take the half types), launched by the eval loop through
``launch_fused`` from the second call, as ``gemm.GemmPlan`` is.

Every other call (the fp modes, an untransposed weight, other widths and group sizes, a
batch no one stride walks, ``GatherQMM``) runs the rule below (``codegen/quantized.py``'s
sources, compiled through CuPy's ``RawKernel``, which caches the cubins on disk), planned as
the CPU's (``kernels/cpu/quantized.py``, MLX's ``qmm.cu`` dispatch): each matrix of the
broadcast or gathered batch is an offset into x, w, scales and biases; up to ``MAX_ROWS``
rows of a transposed product run ``qmv`` (a warp per output, MLX's ``qmv_kernel``),
everything else each entry's weight matrix dequantized once into a float32 tile and
multiplied by cuBLAS (the CPU's ``_qmm`` with BLAS); bfloat16 through float32 copies.
Float32 compute, rounded once to the output type by the evaluator.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .. import kernel_registry
from ..codegen import qmv_cuda
from ..codegen.quantized import MAX_ROWS, QuantSpec, cuda_source
from ..common.strides import batch_offsets, elem_strides, one_stride
from ..kernel_call import KernelRule
from ..primitives import by_kernel
from ..rules.quantized import FP4_LUT, fp8_decode, fp_scale
from . import bfloat16 as bf16, compiled, gemm
from .primitive_plans import KernelPlan, fits

_kernels: dict = {}
WARPS = 4  # output rows per qmv block


def _kernel(spec: QuantSpec, dequant: bool = False):
    import cupy

    key = (spec.name, dequant)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cupy.RawKernel(cuda_source(spec, dequant),
                                           spec.name + ("_dequant" if dequant else ""))
    return k


def _offsets(xp, a, unit: int):
    return batch_offsets(a, unit)


_consts: dict = {}  # (device, what) -> a small device array made once (tables, offsets)


def _const(xp, key, make):
    """A small read-only device array made once per device and key (a call's uploads and
    small kernels cost more than the one-row product itself)."""
    key = (xp.cuda.runtime.getDevice(),) + key
    got = _consts.get(key)
    if got is None:
        if len(_consts) > 512:
            _consts.clear()
        got = make()
        xp.cuda.get_current_stream().synchronize()  # other streams may read it next
        _consts[key] = got
    return got


def _table(xp, mode: str, bits: int):
    if mode == "affine":
        return _const(xp, ("zeros",), lambda: xp.zeros((1, 1), xp.float32))
    if bits == 4:
        return _const(xp, ("fp4",), lambda: xp.asarray(FP4_LUT, dtype=xp.float32))
    return _const(xp, ("fp8",), lambda: xp.ascontiguousarray(
        fp8_decode(xp, xp.arange(256, dtype=xp.uint8))))


def _launch(xp, x, w, scales, b, x_idx, w_sel, *, group_size, bits, mode, transpose,
            gathered=False):
    """out (entries, M, N) float32: entry i is matrix ``x_idx[i]`` of x times matrix
    ``w_sel[i]`` of w."""
    f32 = xp.float32
    x = xp.ascontiguousarray(x.astype(f32, copy=False) if x.ndim >= 2
                             else x.astype(f32, copy=False).reshape(1, -1))
    w = xp.ascontiguousarray(w)
    s = xp.ascontiguousarray(scales.astype(f32, copy=False) if mode == "affine"
                             else fp_scale(xp, scales, group_size))
    bb = xp.ascontiguousarray(b.astype(f32, copy=False)) if b is not None else _table(xp, "affine", 0)
    M, K = x.shape[-2], x.shape[-1]
    N = w.shape[-2] if transpose else w.shape[-1] * 32 // bits

    def sel(a, unit):
        offs = _offsets(xp, a, unit)
        return offs[w_sel] if len(offs) > 1 else np.zeros(len(w_sel), np.int64) + offs[0]

    def uploads():
        return [xp.asarray(o) for o in (_offsets(xp, x, 4)[x_idx], sel(w, 1), sel(s, 4), sel(bb, 4))]

    nb = len(x_idx)
    spec = QuantSpec("qmv_t", "affine" if mode == "affine" else "table", bits)
    if not (transpose and M <= MAX_ROWS):
        return _dense(xp, x, w, s, bb, x_idx, sel, spec, M, N, K, nb, group_size, transpose)
    if gathered:
        offs = uploads()
    else:  # the batch's offsets follow from the shapes and strides alone: uploaded once
        offs = _const(xp, ("offsets", nb) + tuple((a.shape, a.strides) for a in (x, w, s, bb)),
                      uploads)
    out = xp.empty((nb, M, N), f32)
    ints = [np.int64(v) for v in (nb, M, N, K, group_size)]
    args = (x, w, s, bb, _table(xp, mode, bits), out, *offs, *ints)
    grid = ((N + WARPS - 1) // WARPS, M, nb)
    _kernel(spec)(grid, (32 * WARPS,), args)
    return out


def _dense(xp, x, w, s, bb, x_idx, sel, spec, M, N, K, nb, gs, transpose):
    """More rows than qmv takes (or w not transposed): each entry's weight matrix
    dequantized once into a float32 tile (again only where the next entry's differs) and
    multiplied with cuBLAS, as the CPU does with BLAS (``kernels/cpu/quantized.py``'s
    ``_qmm``)."""
    f32 = xp.float32
    x_offs = _offsets(xp, x, 4)[x_idx]
    w_offs, s_offs, b_offs = sel(w, 1), sel(s, 4), sel(bb, 4)
    R, C = (N, K) if transpose else (K, N)
    tile = xp.empty((R, C), f32)
    out = xp.empty((nb, M, N), f32)
    wb, sf, bf = w.view(xp.uint8).reshape(-1), s.reshape(-1), bb.reshape(-1)
    xf = x.reshape(-1)
    table = _table(xp, "affine" if spec.kind == "affine" else "fp", spec.bits)
    kern = _kernel(spec, dequant=True)
    block = 256
    grid = ((C + block - 1) // block, min(R, 65535))
    last = None
    for i in range(nb):
        key = (int(w_offs[i]), int(s_offs[i]), int(b_offs[i]))
        if key != last:
            kern(grid, (block,), (wb[key[0]:], sf[key[1]:], bf[key[2]:],
                                  table, tile, np.int64(R), np.int64(C), np.int64(gs)))
            last = key
        xm = xf[int(x_offs[i]): int(x_offs[i]) + M * K].reshape(M, K)
        xp.matmul(xm, tile.T if transpose else tile, out=out[i])
    return out


def quantized_matmul(xp, x, w, scales, *biases, group_size, bits, mode, transpose):
    b = biases[0] if biases else None
    if x.ndim <= 2 < w.ndim:  # MLX's kernel reads w's first matrix for an unbatched x
        w, scales = w.reshape(-1, *w.shape[-2:])[0], scales.reshape(-1, *scales.shape[-2:])[0]
        b = None if b is None else b.reshape(-1, *b.shape[-2:])[0]
    nb = int(np.prod(x.shape[:-2], dtype=np.int64)) if x.ndim > 2 else 1
    idx = np.arange(nb)
    out = _launch(xp, x, w, scales, b, idx, idx, group_size=group_size, bits=bits, mode=mode,
                  transpose=transpose)
    n = out.shape[-1]
    return out.reshape(*x.shape[:-1], n)


def _rule(xp, *ins, out=None, **kw):
    """The rule's path (``out``, the evaluator's buffer, unused): bfloat16 through float32
    copies, rounded once (``bfloat16.rule``'s way)."""
    if any(type(a) is bf16.BF16Array or type(a) is bf16.Widened for a in ins):
        return bf16.narrow(quantized_matmul(xp, *[bf16.value(a) for a in ins], **kw))
    return quantized_matmul(xp, *ins, **kw)


_rule.takes_bfloat16 = True  # cuda/backend.py: bfloat16 inputs come as BF16Arrays


def _arguments(spec, ints: dict) -> tuple:
    """A step's arguments in the signature's order (int64 values; None where a buffer goes)
    and where each buffer goes: (position, name)."""
    args, bufs = [], []
    for i, (kind, name) in enumerate(spec.params()):
        if kind == "int":
            args.append(int(ints[name]))
        else:
            bufs.append((i, name))
            args.append(None)
    return args, bufs


class _QmvStep:
    """The qmv kernel's launch as ``KernelPlan`` reads a ``reductions.Step``: its grid (a
    block per ``qmv_cuda.WARPS`` output columns of each batch entry), block, arguments in
    the signature's order (int64 values; None where a buffer goes) and where each buffer
    goes."""

    __slots__ = ("spec", "grid", "block", "args", "bufs", "arrays")

    def __init__(self, spec, ints: dict):
        self.spec = spec
        self.grid = ints["B"] * -(-ints["N"] // qmv_cuda.WARPS)
        self.block = 32 * qmv_cuda.WARPS
        self.args, self.bufs = _arguments(spec, ints)
        self.arrays = []


def _rows(a) -> bool:
    """Whether ``a``'s last two axes are a row-contiguous matrix."""
    st = elem_strides(a)
    return (st is not None and (a.shape[-1] == 1 or st[-1] == 1)
            and (a.shape[-2] == 1 or st[-2] == a.shape[-1]))


def qmv_call(x, w, scales, biases, *, group_size, bits, transpose):
    """(spec, integer arguments, output shape) of the call's qmv launch, or of its dequant
    launch (``spec.rows`` 0: more than ``MAX_ROWS`` rows, ``QmmPlan``'s first step) for these
    device arrays; None where neither takes the call (a weight not transposed, a type or
    width with no kernel, a layout one stride per operand does not walk)."""
    import cupy

    ops = (x, w, scales, biases)
    if any(type(a) is not cupy.ndarray and type(a) is not bf16.BF16Array for a in ops):
        return None
    dt = x.dtype
    if (not transpose or w.dtype != np.uint32 or scales.dtype != dt or biases.dtype != dt
            or w.ndim < 2 or x.ndim < 1 or 0 in x.shape or 0 in w.shape):
        return None
    K, N = x.shape[-1], w.shape[-2]
    M = x.shape[-2] if x.ndim >= 2 else 1
    if w.shape[-1] * 32 != K * bits or scales.shape[-1] * group_size != K:
        return None
    xs = elem_strides(x)
    if xs is None or (K > 1 and xs[-1] != 1) or not all(_rows(a) for a in ops[1:]):
        return None
    x_rs = xs[-2] if x.ndim >= 2 and M > 1 else 0
    batch = tuple(x.shape[:-2])
    nb = int(np.prod(batch, dtype=np.int64)) if batch else 1

    def stride(a):  # the one element stride walking the batch (0: one matrix for all)
        if a.ndim <= 2 or not batch:
            return 0  # (x unbatched over a batched w: MLX reads w's first matrix)
        if tuple(a.shape[:-2]) != batch:
            return None
        return one_stride(batch, elem_strides(a)[:-2])

    bs = [stride(a) for a in ops]
    if any(b is None for b in bs):
        return None
    x_bs, w_bs, s_bs, b_bs = bs
    rows, B = M, nb
    if nb > 1 and w_bs == s_bs == b_bs == 0 and (M == 1 or x_bs == M * x_rs):
        rows, B, x_rs, x_bs = nb * M, 1, (x_bs if M == 1 else x_rs), 0  # one weight: rows
    ints = dict(B=B, N=N, K=K, x_rs=x_rs, x_bs=x_bs, w_bs=w_bs, s_bs=s_bs, b_bs=b_bs)
    form_rows = rows if rows <= qmv_cuda.MAX_ROWS else 0
    if not qmv_cuda.takes(dt.name, bits, group_size, form_rows):
        return None
    return qmv_cuda.QmvSpec(dt.name, bits, group_size, form_rows), ints, tuple(x.shape[:-1]) + (N,)


def _entry(spec):
    try:
        return compiled.get_kernel(spec.name, spec.layout, lambda: qmv_cuda.cuda_source(spec),
                                   key=spec.name, tape=spec)
    except kernel_registry.BuildError:
        return None


def qmv_plan(x, w, scales, *biases, group_size, bits, mode, transpose):
    """The call's plan: a qmv ``KernelPlan`` (up to ``MAX_ROWS`` rows: its launch words
    packed once per layout, later calls launched by the eval loop from C) or a
    ``QmmPlan`` (more rows); None where the rule runs the call: another mode, no biases, a
    call ``qmv_call`` declines, no kernel or no cuBLAS."""
    if mode != "affine" or len(biases) != 1:
        return None
    call = qmv_call(x, w, scales, biases[0], group_size=group_size, bits=bits,
                    transpose=transpose)
    if call is None:
        return None
    spec, ints, out_shape = call
    entry = _entry(spec)
    if entry is None:
        return None
    if spec.rows == 0:
        return _qmm_plan(x, spec, entry, ints, out_shape)
    return KernelPlan(_QmvStep(spec, ints), entry, {"x": 0, "w": 1, "scales": 2, "biases": 3},
                      {}, out_shape, x.dtype, "QuantizedMatmul")


class _DequantStep:
    """The dequant kernel's launch as ``KernelPlan`` reads a ``reductions.Step``: a thread
    per run of ``128 / bits`` codes of each weight matrix the batch reads."""

    __slots__ = ("spec", "grid", "block", "args", "bufs", "arrays")

    def __init__(self, spec, ints: dict):
        self.spec, self.block = spec, qmv_cuda.DEQUANT_THREADS
        self.grid = -(-ints["total"] // self.block)
        self.args, self.bufs = _arguments(spec, ints)
        self.arrays = []


_tiles: dict = {}  # CUDA stream pointer -> the dequantized weight tile its qmm calls share


def _tile(stream, size: int, dtype):
    """A device buffer of at least ``size`` elements of ``dtype`` for this CUDA stream (the
    qmm calls on one stream run in order, so each reuses it; made on that stream, so CuPy's
    pool never hands a replaced one to another stream before this one is done with it)."""
    import cupy

    key = (stream.ptr, np.dtype(dtype).str)
    got = _tiles.get(key)
    if got is None or got.size < size:
        with stream:
            got = _tiles[key] = cupy.empty(size, dtype=dtype)
    return got


class QmmPlan:
    """Many rows (MLX's ``qmm``): each weight matrix the batch reads dequantized into a tile
    of x's type (the dequant kernel, its launch packed once: float32 values rounded once),
    then one cuBLAS strided-batched GEMM over the batch, float32 accumulation (full float32
    for float32, as MLX's ``qmm_naive``), into the output. Launched by the eval loop through
    ``CudaBackend.launch_fused`` (``lane`` False: cuBLAS is no kernel of ours), as a
    ``gemm.GemmPlan`` is."""

    __slots__ = ("dequant", "tile_size", "tile_dtype", "args", "out_shape", "out_dtype",
                 "name", "variant")
    lane = False
    primitive = "QuantizedMatmul"
    entry = None

    def __init__(self, dequant: KernelPlan, tile_size: int, args: tuple, out_shape, out_dtype):
        self.dequant, self.tile_size, self.args = dequant, tile_size, args
        self.tile_dtype = bf16.U16 if np.dtype(out_dtype) == bf16.BF16 else np.dtype(out_dtype)
        self.out_shape, self.out_dtype = tuple(out_shape), np.dtype(out_dtype)
        self.name, self.variant = dequant.name + "+cublas_gemm", dequant.variant

    def takes(self, out) -> bool:
        """Whether ``out`` is a buffer the GEMM writes as it is (the loop's fresh buffer)."""
        import cupy

        t = bf16.storage(out)
        return (tuple(out.shape) == self.out_shape and out.dtype == self.out_dtype
                and type(t) is cupy.ndarray and t.flags.c_contiguous)

    def __call__(self, *arrays) -> None:
        self.call(arrays[:-1], arrays[-1:])

    def call(self, inputs, outs, stream=None) -> None:
        import cupy

        if stream is None:
            stream = cupy.cuda.get_current_stream()
        tile = _tile(stream, self.tile_size, self.tile_dtype)
        self.dequant._launch_one(inputs, tile, 0, stream, True)
        (N, R, K, ldb, sa, sb, sc, count, t, compute) = self.args
        x, out = bf16.storage(inputs[0]), bf16.storage(outs[0])
        with stream:  # (row-major out = x tileᵀ is column-major outᵀ = tile xᵀ)
            gemm.strided_batched(True, False, N, R, K, 1.0, int(tile.data.ptr), t, K, sa,
                                 int(x.data.ptr), t, ldb, sb, int(out.data.ptr), t, N, sc,
                                 count, compute)

    def launch_detail(self) -> dict:
        return {"runtime": "cuda", "variant": self.variant, "primitive": self.primitive}


def _qmm_plan(x, spec, entry, ints: dict, out_shape) -> Optional[QmmPlan]:
    """The ``QmmPlan`` of a call of more than ``MAX_ROWS`` rows (None: no cuBLAS, or x's
    rows closer than K apart)."""
    B, N, K, x_rs = ints["B"], ints["N"], ints["K"], ints["x_rs"]
    rows = int(np.prod(out_shape[:-1], dtype=np.int64)) // B
    if not gemm.available() or (rows > 1 and x_rs < K):
        return None
    one = ints["w_bs"] == ints["s_bs"] == ints["b_bs"] == 0  # one weight matrix for all
    nw = 1 if one else B
    dints = dict(total=nw * N * K // (128 // spec.bits), N=N, K=K, w_bs=ints["w_bs"],
                 s_bs=ints["s_bs"], b_bs=ints["b_bs"])
    dq = KernelPlan(_DequantStep(spec, dints), entry, {"w": 1, "scales": 2, "biases": 3}, {},
                    (nw, N, K), x.dtype, "QuantizedMatmul")
    dt = np.dtype(x.dtype)
    compute = gemm.full_compute_type(dt)  # float32 accumulation, TF32 never (MLX's qmm)
    args = (N, rows, K, max(x_rs, K) if rows == 1 else x_rs, 0 if one else N * K,
            ints["x_bs"], rows * N, B, gemm.data_type(dt), compute)
    return QmmPlan(dq, nw * N * K, args, out_shape, dt)


def _empty(shape, dtype):
    import cupy

    if dtype == bf16.BF16:
        return bf16.BF16Array(cupy.empty(shape, dtype=bf16.U16))
    return cupy.empty(shape, dtype=dtype)


def gather_qmm(xp, x, w, scales, *rest, group_size, bits, mode, transpose, left_sorted,
               right_sorted):
    *b, lhs, rhs = rest
    li = xp.asnumpy(lhs).reshape(-1).astype(np.int64)
    ri = xp.asnumpy(rhs).reshape(-1).astype(np.int64)
    nx = int(np.prod(x.shape[:-2], dtype=np.int64))
    nw = int(np.prod(w.shape[:-2], dtype=np.int64))
    if li.size and (li.min() < 0 or li.max() >= nx or ri.min() < 0 or ri.max() >= nw):
        raise IndexError("[gather_qmm] an index lies outside the batch")
    out = _launch(xp, x, w, scales, b[0] if b else None, li, ri, group_size=group_size,
                  bits=bits, mode=mode, transpose=transpose, gathered=True)
    return out.reshape(*lhs.shape, *out.shape[-2:])


# primitive name -> rule, for the definitions that name these kernels (PrimitiveDef.kernel)
# (QuantizedMatmul: decoding's qmv plans launched from C, every other call the rule)
RULES: dict = by_kernel({"quantized_matmul": KernelRule("QuantizedMatmul", qmv_plan, _rule,
                                                        fits, _empty),
                         "gather_qmm": gather_qmm})
