"""MLX's ``QuantizedMatmul`` and ``GatherQMM`` as generated CUDA, planned once per call
layout and launched by the eval loop from C.

Every quantization MLX's CUDA backend takes (affine 2, 3, 4, 5, 6 and 8 bits in groups of
32, 64 and 128; mxfp4, mxfp8, nvfp4: ``codegen/qmv_cuda.py``'s ``MODES``) goes through one
kernel generator and two plans, as MLX's ``QuantizedMatmul::eval_gpu`` /
``GatherQMM::eval_gpu`` (mlx/backend/cuda/quantized/quantized.cpp) dispatch:

- up to ``qmv_cuda.MAX_ROWS`` rows of a transposed weight (decoding) are a ``KernelPlan`` of
  the ``qmv`` kernel (``qmv_plan``; MLX's ``qmv_kernel``, mlx/backend/cuda/quantized/qmm/
  qmv.cu), compiled by NVRTC through the fused kernels' cache, x / scales / biases / output
  read and written in their own type, bfloat16 as its 16 bits, float32 accumulation; its
  launch words packed once per layout, so later calls are launched by the eval loop from C
  (``primitive_plans.py``) with no Python code. A batch whose operands each walk it with one
  stride is one launch; rows of a batch over one weight matrix are folded into the call's
  rows. ``GatherQMM`` of up to ``MAX_ROWS`` rows an entry is the same kernel's gather form
  (MLX's ``gather_qmv_kernel``): the index arrays are two more inputs of the plan, read by
  the kernel, so a mixture-of-experts step's calls launch from C as well.
- more rows, or an untransposed weight, are a ``QmmPlan`` (MLX's ``qmm``): the kernel's
  dequant form writes each weight matrix the batch reads into a tile of x's type, then one
  cuBLAS strided-batched GEMM at full float32 (MLX's ``qmm_naive`` computes float32 in
  float32; its sm80 / sm90 kernels take the half types). The tile is an allocator buffer
  taken per call and freed right after the GEMM is enqueued (stream-ordered: the allocator
  holds it until the stream has run, then caches it for the next call).

A call no plan takes as it comes (a batch no one stride walks, x's columns strided, a
lazily widened bfloat16 input, index arrays of another integer type) runs the rule: its
operands copied row-contiguous (indices as int64), then the plan of that layout; what no
plan takes at all (1-bit codes, a ``GatherQMM`` of more than ``MAX_ROWS`` rows an entry,
no cuBLAS) runs the definitions' composition (``rules/quantized.py``) in float32.
"""

from __future__ import annotations

from typing import Optional

import cupy
import numpy as np

from .. import kernel_registry
from ..codegen import qmv_cuda
from ..common.strides import collapse, elem_strides, one_stride
from ..kernel_call import KernelRule
from ..primitives import by_kernel
from ..rules import quantized as qrules
from ..rules.indexing import check_bounds
from . import bfloat16 as bf16, bounds, compiled, gemm
from .primitive_plans import SCRATCH, KernelPlan, fits


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


class _Step:
    """A kernel's launch as ``KernelPlan`` reads a ``reductions.Step``: its grid (qmv: a
    block per ``qmv_cuda.WARPS`` output columns of each batch entry; dequant: a thread per
    run of codes), block, arguments in the signature's order and where each buffer goes."""

    __slots__ = ("spec", "grid", "block", "args", "bufs", "arrays")

    def __init__(self, spec, ints: dict):
        self.spec = spec
        if spec.rows:
            self.grid, self.block = ints["B"] * -(-ints["N"] // qmv_cuda.WARPS), 32 * qmv_cuda.WARPS
        else:
            self.block = qmv_cuda.DEQUANT_THREADS
            self.grid = -(-ints["total"] // self.block)
        self.args, self.bufs = _arguments(spec, ints)
        self.arrays = []


def _rows(a) -> bool:
    """Whether ``a``'s last two axes are a row-contiguous matrix."""
    st = elem_strides(a)
    return (st is not None and (a.shape[-1] == 1 or st[-1] == 1)
            and (a.shape[-2] == 1 or st[-2] == a.shape[-1]))


def _types_ok(ops, x, w, scales, biases, mode) -> bool:
    """The operands' kinds and dtypes a kernel takes: device arrays (bfloat16 as its bits),
    x of a kernel type, a uint32 weight, affine scales and biases of x's type, fp scales
    uint8."""
    if any(type(a) is not cupy.ndarray and type(a) is not bf16.BF16Array for a in ops):
        return False
    dt = x.dtype
    if dt.name not in qmv_cuda.TYPES or w.dtype != np.uint32 or w.ndim < 2 or x.ndim < 1:
        return False
    if mode == "affine":
        return biases is not None and scales.dtype == dt and biases.dtype == dt
    return biases is None and scales.dtype == np.uint8


def _dims(x, w, scales, group_size, bits, transpose) -> Optional[tuple]:
    """(M, N, K, R, C): x's rows, the product's columns and inner size, and the packed
    weight matrix's rows and codes a row; None where the shapes do not agree."""
    K = x.shape[-1]
    M = x.shape[-2] if x.ndim >= 2 else 1
    R, C = w.shape[-2], w.shape[-1] * 32 // bits
    if w.shape[-1] * 32 != C * bits or scales.shape[-1] * group_size != C or scales.shape[-2] != R:
        return None
    N = R if transpose else C
    if (C if transpose else R) != K or 0 in (M, N, K):
        return None
    return M, N, K, R, C


def _x_layout(x, M: int, K: int) -> Optional[int]:
    """x's row stride (0: one row), None where its columns are not unit-stride."""
    xs = elem_strides(x)
    if xs is None or (K > 1 and xs[-1] != 1):
        return None
    return xs[-2] if x.ndim >= 2 and M > 1 else 0


def _call(x, w, scales, biases, *, group_size, bits, mode, transpose):
    """(spec, integer arguments, output shape) of a ``QuantizedMatmul``'s launch: its qmv
    launch, or (``spec.rows`` 0: more than ``MAX_ROWS`` rows or an untransposed weight,
    ``QmmPlan``'s first step) its dequant launch, with the GEMM's ``x_rs`` / ``x_bs`` /
    ``rows`` / ``B`` beside the dequant's integers; None where neither takes the call."""
    ops = (x, w, scales) + ((biases,) if biases is not None else ())
    if not _types_ok(ops, x, w, scales, biases, mode):
        return None
    dims = _dims(x, w, scales, group_size, bits, transpose)
    if dims is None or not all(_rows(a) for a in ops[1:]):
        return None
    M, N, K, R, C = dims
    x_rs = _x_layout(x, M, K)
    if x_rs is None:
        return None
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
    x_bs, w_bs, s_bs = bs[:3]
    b_bs = bs[3] if biases is not None else 0
    rows, B = M, nb
    one = w_bs == s_bs == b_bs == 0  # one weight matrix for every entry
    if nb > 1 and one and (M == 1 or x_bs == M * x_rs):
        rows, B, x_rs, x_bs = nb * M, 1, (x_bs if M == 1 else x_rs), 0  # one weight: rows
    out_shape = tuple(x.shape[:-1]) + (N,)
    dt = x.dtype.name
    if transpose and rows <= qmv_cuda.MAX_ROWS:
        if not qmv_cuda.takes(dt, mode, bits, group_size, rows):
            return None
        ints = dict(B=B, N=N, K=K, x_rs=x_rs, x_bs=x_bs, w_bs=w_bs, s_bs=s_bs, b_bs=b_bs)
        return qmv_cuda.QmvSpec(dt, bits, group_size, rows, mode), ints, out_shape
    if not qmv_cuda.takes(dt, mode, bits, group_size, 0):
        return None
    spec = qmv_cuda.QmvSpec(dt, bits, group_size, 0, mode)
    nw = 1 if one else B
    ints = dict(total=nw * R * C // spec.ept, N=R, K=C, w_bs=w_bs, s_bs=s_bs, b_bs=b_bs,
                x_rs=x_rs, x_bs=x_bs, rows=rows, B=B, nw=nw, M=N, Kx=K)
    return spec, ints, out_shape


def _entry(spec):
    try:
        return compiled.get_kernel(spec.name, spec.layout, lambda: qmv_cuda.cuda_source(spec),
                                   key=spec.name, tape=spec)
    except kernel_registry.BuildError:
        return None


def _places(spec) -> dict:
    """Buffer name -> the call's input index (x, w, scales[, biases][, lhs, rhs]); a
    gather's bounds word is the stream's (``SCRATCH``: ``GatherQmvPlan.scratch_for``)."""
    names = ["x", "w", "scales"] + (["biases"] if spec.affine else [])
    if spec.index:
        names += ["lhs", "rhs"]
    places = {n: i for i, n in enumerate(names)}
    if spec.index:
        places["bounds"] = SCRATCH
    return places


class GatherQmvPlan(KernelPlan):
    """The gather-qmv ``KernelPlan``: its bounds word (an index outside the batch noted
    there, raised at the host's wait: ``cuda/bounds.py``) the launching stream's, in its
    ``SCRATCH`` slot, from C (``scratch_for``) and from Python (``call``)."""

    __slots__ = ()
    scratch_for = staticmethod(bounds.word_for)

    def call(self, inputs, outs, hit: bool = True, stream=None) -> None:
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        self._launch_one(inputs, outs[0], bounds.word_for(stream.ptr), stream, hit)


def _planned(call, dtype, primitive: str, qmm=None):
    """The plan of a ``_call`` / ``_gather_call`` answer (spec, integer arguments, output
    shape): the kernel's ``KernelPlan`` (a gather's ``GatherQmvPlan``), its launch words
    packed once per layout, or ``qmm(spec, entry, ints, out_shape)`` for the dequant form;
    None without an answer or a kernel."""
    if call is None:
        return None
    spec, ints, out_shape = call
    entry = _entry(spec)
    if entry is None:
        return None
    if spec.rows == 0:
        return qmm(spec, entry, ints, out_shape)
    return (GatherQmvPlan if spec.index else KernelPlan)(
        _Step(spec, ints), entry, _places(spec), {}, out_shape, dtype, primitive)


def qmv_plan(x, w, scales, *biases, group_size, bits, mode, transpose):
    """The call's plan: a qmv ``KernelPlan`` (up to ``MAX_ROWS`` rows of a transposed
    weight: its launch words packed once per layout, later calls launched by the eval loop
    from C) or a ``QmmPlan`` (more rows, or untransposed); None where the rule runs the
    call: a layout or type ``_call`` declines, no kernel or no cuBLAS."""
    call = _call(x, w, scales, biases[0] if biases else None, group_size=group_size,
                 bits=bits, mode=mode, transpose=transpose)
    return _planned(call, x.dtype, "QuantizedMatmul",
                    lambda spec, entry, ints, shape: _qmm_plan(x, spec, entry, ints, shape, transpose))


class QmmPlan:
    """Many rows, or an untransposed weight (MLX's ``qmm``): each weight matrix the batch
    reads dequantized into a tile of x's type (the dequant kernel, its launch packed once:
    float32 values rounded once), then one cuBLAS strided-batched GEMM over the batch,
    float32 accumulation (full float32 for float32, as MLX's ``qmm_naive``), into the
    output. The tile is an allocator buffer taken per call and freed once the GEMM is
    enqueued (the allocator holds a buffer freed while a stream runs, then caches it).
    Launched by the eval loop through ``CudaBackend.launch_fused`` (``lane`` False: cuBLAS
    is no kernel of ours), as a ``gemm.GemmPlan`` is."""

    __slots__ = ("dequant", "tile_bytes", "args", "out_shape", "out_dtype", "name", "variant")
    lane = False
    primitive = "QuantizedMatmul"
    entry = None

    def __init__(self, dequant: KernelPlan, tile_bytes: int, args: tuple, out_shape, out_dtype):
        self.dequant, self.tile_bytes, self.args = dequant, tile_bytes, args
        self.out_shape, self.out_dtype = tuple(out_shape), np.dtype(out_dtype)
        self.name, self.variant = dequant.name + "+cublas_gemm", dequant.variant

    def takes(self, out) -> bool:
        """Whether ``out`` is a buffer the GEMM writes as it is (the loop's fresh buffer)."""
        t = bf16.storage(out)
        return (tuple(out.shape) == self.out_shape and out.dtype == self.out_dtype
                and type(t) is cupy.ndarray and t.flags.c_contiguous)

    def __call__(self, *arrays) -> None:
        self.call(arrays[:-1], arrays[-1:])

    def call(self, inputs, outs, stream=None) -> None:
        from ..backends import backend

        if stream is None:
            stream = cupy.cuda.get_current_stream()
        alloc = backend("gpu").allocator
        buf = alloc.malloc(self.tile_bytes)
        try:
            tile = buf.raw
            self.dequant._launch_one(inputs, tile, 0, stream, True)
            (ta, N, R, K, lda, ldb, sa, sb, sc, count, t, compute) = self.args
            x, out = bf16.storage(inputs[0]), bf16.storage(outs[0])
            with stream:  # (row-major out = x tile(ᵀ) is column-major outᵀ = tile(ᵀ) xᵀ)
                gemm.strided_batched(ta, False, N, R, K, 1.0, int(tile.data.ptr), t, lda, sa,
                                     int(x.data.ptr), t, ldb, sb, int(out.data.ptr), t, N,
                                     sc, count, compute)
        finally:
            alloc.free(buf)  # held until the stream has run the GEMM, then cached

    def launch_detail(self) -> dict:
        return {"runtime": "cuda", "variant": self.variant, "primitive": self.primitive}


def _qmm_plan(x, spec, entry, ints: dict, out_shape, transpose: bool) -> Optional[QmmPlan]:
    """The ``QmmPlan`` of the call (None: no cuBLAS, or x's rows closer than K apart)."""
    R, C, rows, B, nw = ints["N"], ints["K"], ints["rows"], ints["B"], ints["nw"]
    N, K, x_rs = ints["M"], ints["Kx"], ints["x_rs"]
    if not gemm.available() or (rows > 1 and x_rs < K):
        return None
    dq = KernelPlan(_Step(spec, ints), entry, {n: i for n, i in _places(spec).items() if n != "x"},
                    {}, (nw, R, C), x.dtype, "QuantizedMatmul")
    dt = np.dtype(x.dtype)
    compute = gemm.full_compute_type(dt)  # float32 accumulation, TF32 never (MLX's qmm)
    # the tile (nw, R, C) row-major: transposed (N = R, K = C) it is column-major Kx N (op T,
    # lda K); untransposed (K = R, N = C) column-major N x K (op N, lda N)
    args = (transpose, N, rows, K, C, max(x_rs, K) if rows == 1 else x_rs,
            0 if nw == 1 else R * C, ints["x_bs"], rows * N, B, gemm.data_type(dt), compute)
    return QmmPlan(dq, nw * R * C * dt.itemsize, args, out_shape, dt)


def _joint_dims(shape, s1, s2) -> Optional[list]:
    """The index arrays' shared shape as (size, stride in lhs, stride in rhs), size-1 dims
    dropped and neighbours merged where both walk them with one stride, padded to three;
    None past three."""
    out: list = []
    for n, a, b in zip(shape, s1, s2):
        if n == 1:
            continue
        if out and out[-1][1] == a * n and out[-1][2] == b * n:
            out[-1] = (out[-1][0] * n, a, b)
        else:
            out.append((n, a, b))
    if len(out) > 3:
        return None
    return [(1, 0, 0)] * (3 - len(out)) + out


def _gather_call(x, w, scales, biases, lhs, rhs, *, group_size, bits, mode, transpose):
    """(spec, integer arguments, output shape) of a ``GatherQMM``'s gather-qmv launch, or
    None: more than ``MAX_ROWS`` rows an entry, untransposed, or a layout or type no one
    launch takes."""
    ops = (x, w, scales) + ((biases,) if biases is not None else ())
    if not transpose or x.ndim < 2 or not _types_ok(ops, x, w, scales, biases, mode):
        return None
    if any(type(i) is not cupy.ndarray or i.dtype.name not in qmv_cuda.INDEX_TYPES
           or i.shape != lhs.shape for i in (lhs, rhs)):
        return None
    dims = _dims(x, w, scales, group_size, bits, transpose)
    if dims is None or not all(_rows(a) for a in ops[1:]) or lhs.size == 0:
        return None
    M, N, K, _, _ = dims
    x_rs = _x_layout(x, M, K)
    if x_rs is None or M > qmv_cuda.MAX_ROWS:
        return None

    def stride(a):  # the one element stride walking a's flattened batch
        return one_stride(a.shape[:-2], elem_strides(a)[:-2]) if a.ndim > 2 else 0

    bs = [stride(a) for a in ops]
    ist = [elem_strides(i) for i in (lhs, rhs)]
    if any(b is None for b in bs) or None in ist:
        return None
    jd = _joint_dims(lhs.shape, *ist)
    if jd is None:
        return None
    index = lhs.dtype.name if lhs.dtype == rhs.dtype else None
    if index is None or not qmv_cuda.takes(x.dtype.name, mode, bits, group_size, M, index):
        return None
    nx = int(np.prod(x.shape[:-2], dtype=np.int64))
    nw = int(np.prod(w.shape[:-2], dtype=np.int64))
    (_, l0, r0), (i1, l1, r1), (i2, l2, r2) = jd
    ints = dict(B=int(lhs.size), N=N, K=K, x_rs=x_rs, x_bs=bs[0], w_bs=bs[1], s_bs=bs[2],
                b_bs=bs[3] if biases is not None else 0, nx=nx, nw=nw, i1=i1, i2=i2,
                l0=l0, l1=l1, l2=l2, r0=r0, r1=r1, r2=r2)
    spec = qmv_cuda.QmvSpec(x.dtype.name, bits, group_size, M, mode, index)
    return spec, ints, tuple(lhs.shape) + (M, N)


def gather_plan(x, w, scales, *rest, group_size, bits, mode, transpose, left_sorted,
                right_sorted):
    """The ``GatherQMM`` call's plan: the gather-qmv ``KernelPlan`` (the index arrays its
    last two inputs), or None where the rule runs it."""
    *b, lhs, rhs = rest
    call = _gather_call(x, w, scales, b[0] if b else None, lhs, rhs, group_size=group_size,
                        bits=bits, mode=mode, transpose=transpose)
    return _planned(call, x.dtype, "GatherQMM")


def _empty(shape, dtype):
    if dtype == bf16.BF16:
        return bf16.BF16Array(cupy.empty(shape, dtype=bf16.U16))
    return cupy.empty(shape, dtype=dtype)


def _contiguous(a, index: bool = False):
    """An operand as a row-contiguous device array (bfloat16 as its bits; an index array
    as int64)."""
    if type(a) is bf16.Widened:
        return a.value()
    if type(a) is bf16.BF16Array:
        return a if a.raw.flags.c_contiguous else bf16.BF16Array(cupy.ascontiguousarray(a.raw))
    if index and a.dtype.name not in qmv_cuda.INDEX_TYPES:
        return cupy.ascontiguousarray(a.astype(np.int64))
    return cupy.ascontiguousarray(a)


def _slow(name: str, composition, n_idx: int = 0):
    """The rule of calls no plan takes as they come: the operands copied row-contiguous (the
    last ``n_idx``, index arrays, as int64 where their type has no kernel) and that layout's
    plan, else ``composition`` (the definitions' float32 rule; bfloat16 through float32
    copies, rounded once)."""

    def run(xp, *ins, out=None, **kw):
        rule = RULES[name]
        copies = tuple(_contiguous(a, i >= len(ins) - n_idx) for i, a in enumerate(ins))
        p = rule.planned(copies, kw) if any(c is not a for c, a in zip(copies, ins)) else None
        if p is not None:
            res = _empty(p.out_shape, p.out_dtype)
            p(*copies, res)
            return res
        if any(type(a) is bf16.BF16Array or type(a) is bf16.Widened for a in ins):
            return bf16.narrow(composition(xp, *[bf16.value(a) for a in ins], **kw))
        return composition(xp, *ins, **kw)

    run.takes_bfloat16 = True  # cuda/backend.py: bfloat16 inputs come as BF16Arrays
    return run


def _gather_composition(xp, x, w, scales, *rest, **kw):
    """The definitions' ``gather_qmm`` with the indices checked first, numpy's error for
    ``x[lhs]`` then ``w[rhs]`` over the flattened batches (the rule's fancy indexing would
    raise CuPy's, or wrap)."""
    *_, lhs, rhs = rest
    nx = int(np.prod(x.shape[:-2], dtype=np.int64))
    nw = int(np.prod(w.shape[:-2], dtype=np.int64))
    for i, n in ((lhs, nx), (rhs, nw)):
        if i.size:
            check_bounds(i.reshape(-1), n, 0)
    return qrules.gather_qmm(xp, x, w, scales, *rest, **kw)


# primitive name -> rule, for the definitions that name these kernels (PrimitiveDef.kernel)
RULES: dict = by_kernel({
    "quantized_matmul": KernelRule("QuantizedMatmul", qmv_plan,
                                   _slow("QuantizedMatmul", qrules.quantized_matmul), fits, _empty),
    "gather_qmm": KernelRule("GatherQMM", gather_plan, _slow("GatherQMM", _gather_composition, 2),
                             fits, _empty)})
