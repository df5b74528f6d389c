"""MLX's ``QuantizedMatmul``, ``GatherQMM`` and affine ``Quantize`` as generated C on the CPU.

``RULES`` are the CPU backend's rules for them (``Backend.kernel_rules``, beside the
reductions of ``primitive_kernels.py``). A call is planned as MLX's CPU dispatch plans it
(``mlx/backend/cpu/quantized.cpp``): every matrix of the (broadcast or gathered) batch is
an offset into x, w, scales and biases; up to ``MAX_ROWS`` rows per matrix run the vector
kernel (``qmv_t`` / ``qmv_n``: the packed weight read once), more rows dequantize each
distinct weight matrix once into a float32 tile (``dequant``) and multiply it with BLAS (a
gathered batch whose consecutive entries share a weight, MLX's ``sorted_indices``, shares
the tile). The kernels compute in float32; the result is rounded to the output type once.
``Quantize`` runs one row of groups per work item (the rule's float32 steps, bit for bit).
A call no kernel takes (no compiler, a failed build, an index out of range, a group size
MLX's CPU has no kernel for) runs the
primitive's array-module rule, recorded as a ``kernel_fallback`` with why.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

from .. import timeline
from ..codegen.c_ops import Unsupported
from ..kernel_call import KernelCall, KernelRule
from ..codegen.quantized import MAX_ROWS, QuantSpec, c_source
from ..common.strides import batch_offsets as _batch_offsets
from ..fallback import run_rule
from ..primitives import REGISTRY, by_kernel
from ..rules.quantized import FP4_LUT, fp8_decode
from . import compiler
from .threads import fit_blas_threads

_F32 = np.dtype(np.float32)
_SMALL = 1 << 16  # weight bytes below which a kernel runs holding the GIL
_entries: dict = {}  # kernel name -> (compiler generation, KernelEntry or the BuildError)
_tables: dict = {}


def _entry(spec: QuantSpec):
    got = _entries.get(spec.name)
    if got is not None and got[0] == compiler.generation():
        return got[1]
    try:
        entry = compiler.get_kernel(spec.name, spec.layout, lambda tc: c_source(spec))
    except (compiler.BuildError, Unsupported) as e:
        entry = e if isinstance(e, compiler.BuildError) else compiler.BuildError(str(e))
    _entries[spec.name] = (compiler.generation(), entry)
    return entry


def _table(mode: str, bits: int) -> np.ndarray:
    """The value of each code: e2m1 (mxfp4 / nvfp4), e4m3 (mxfp8); affine needs none."""
    key = (mode, bits)
    t = _tables.get(key)
    if t is None:
        if mode == "affine":
            t = np.zeros(1, _F32)
        elif bits == 4:
            t = np.asarray(FP4_LUT, _F32)
        else:
            t = np.ascontiguousarray(fp8_decode(np, np.arange(256, dtype=np.uint8)), _F32)
        _tables[key] = t
    return t


def _f32(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == _F32 else a.astype(_F32)


def _matrix_rows(a: np.ndarray) -> np.ndarray:
    """``a`` with its last two axes row-contiguous (MLX's ``ensure_row_contiguous_last_dims``);
    its batch axes keep their strides (a broadcast batch is not copied)."""
    isz = a.itemsize
    if a.ndim >= 2 and a.shape[-1] > 1 and a.strides[-1] != isz:
        return np.ascontiguousarray(a)
    if a.ndim >= 2 and a.shape[-2] > 1 and a.strides[-2] != a.shape[-1] * isz:
        return np.ascontiguousarray(a)
    return a


class _Operands:
    """x, w, scales, biases as the kernels read them: float32 x / scales / biases, the
    matrix offsets of each batch entry, and the shapes."""

    def __init__(self, x, w, scales, b, *, group_size, bits, mode, transpose):
        self.mode, self.bits, self.gs, self.transpose = mode, bits, group_size, transpose
        x = _matrix_rows(_f32(x) if x.ndim >= 2 else _f32(x).reshape(1, -1))
        self.w = _matrix_rows(w)
        # fp scales stay bytes: the kernels decode e8m0 / e4m3 (codegen/quantized.py)
        self.s = _matrix_rows(_f32(scales) if mode == "affine" else scales)
        self.scale = "float" if mode == "affine" else ("e4m3" if group_size == 16 else "e8m0")
        self.b = (_matrix_rows(_f32(b)) if b is not None else np.zeros((1, 1), _F32))
        self.x = x
        self._x3 = None
        self.M, self.K = x.shape[-2], x.shape[-1]
        cols = w.shape[-1] * 32 // bits
        self.N = w.shape[-2] if transpose else cols
        self.x_offs = _batch_offsets(x, 4)
        self.w_offs = _batch_offsets(self.w, 1)
        self.s_offs = _batch_offsets(self.s, self.s.itemsize)
        self.b_offs = _batch_offsets(self.b, 4) if b is not None else np.zeros(1, np.int64)

    def matrix(self, i: int) -> np.ndarray:
        """Matrix ``i`` (M, K) of x's flattened batch."""
        if self._x3 is None:
            self._x3 = self.x.reshape(-1, self.M, self.K)
        return self._x3[i]


def _why_not(o: _Operands) -> Optional[str]:
    sizes = _spec(o, "dequant").group_sizes
    if o.gs not in sizes:
        return f"group size {o.gs} (the kernels of this mode take {', '.join(map(str, sizes))})"
    return None


def _spec(o: _Operands, form: str) -> QuantSpec:
    return QuantSpec(form, "affine" if o.mode == "affine" else "table", o.bits, o.scale)


_fallback = run_rule  # (prim_name, why, xp, args, kw): the definition's rule, recorded


def _record(spec: QuantSpec, prim_name: str, t0: int) -> None:
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=spec.name, device="cpu",
                     detail={"runtime": "cpu", "variant": spec.layout, "primitive": prim_name,
                             "tier": "kernel"})


def _qmv(o: _Operands, entry, spec, x_idx, w_offs, s_offs, b_offs, prim_name: str):
    """Every batch entry's rows through the vector kernel: out (entries, M, N) float32."""
    nb = len(x_idx)
    out = np.empty((nb, o.M, o.N), _F32)
    _qmv_call(o, entry, spec, o.x_offs[x_idx], w_offs, s_offs, b_offs, prim_name,
              out.shape)(o.x, o.w, o.s, o.b, out)
    return out


def _qmv_call(o: _Operands, entry, spec, x_offs, w_offs, s_offs, b_offs, prim_name: str,
              out_shape: tuple, biases: bool = True):
    """The vector kernel's KernelCall over these matrix offsets: x, w, scales, biases
    (``biases`` False: not an array of the call, the zero _Operands made is its constant)
    and the output (``out_shape``: the (entries, M, N) products in order, float32)."""
    nb = len(x_offs)
    keep = [np.ascontiguousarray(a, np.int64) for a in (x_offs, w_offs, s_offs, b_offs)]
    table = _table(o.mode, o.bits)
    gil = o.w.nbytes < _SMALL and nb * o.M * o.N < _SMALL
    # a KernelCall puts the arrays' data pointers into the argument vector in C (no ctypes
    # array, no ``.ctypes`` object per array); it counts the entry's hit and calls ``note``
    # while the timeline records; the table and the offsets are constants of the call
    argv = (0, 0, 0, 0 if biases else o.b.ctypes.data, table.ctypes.data, 0,
            *(a.ctypes.data for a in keep), nb, o.M, o.N, o.K, o.gs)
    return KernelCall(_address(entry.fast_fn(gil=gil)), gil, argv,
                      _QMV_SLOTS if biases else _QMV_SLOTS_NO_BIASES, (table, o.b, *keep),
                      entry, _launch_note(spec, prim_name), tuple(out_shape), _F32)


_QMV_SLOTS = (0, 1, 2, 3, 5)  # the qmv kernels' arrays (codegen/quantized.py): x, w, scales,
_QMV_SLOTS_NO_BIASES = (0, 1, 2, 5)  # biases, out (the table and the four offset arrays
# are the call's constants)
_addresses: dict = {}  # id(ctypes function) -> (the function, its address)
_notes: dict = {}  # (kernel, primitive) -> its launch's timeline note


def _address(fn) -> int:
    got = _addresses.get(id(fn))
    if got is None or got[0] is not fn:
        got = _addresses[id(fn)] = (fn, ctypes.cast(fn, ctypes.c_void_p).value)
    return got[1]


def _launch_note(spec: QuantSpec, prim_name: str):
    """``_record``'s timeline record as a KernelCall's ``note(t0, t1, arrays)``."""
    key = (spec.name, prim_name)
    note = _notes.get(key)
    if note is None:
        detail = {"runtime": "cpu", "variant": spec.layout, "primitive": prim_name,
                  "tier": "kernel"}

        def note(t0: int, t1: int, arrays) -> None:
            timeline.add("kernel_launch", t0, t1, name=spec.name, device="cpu",
                         detail=dict(detail))

        _notes[key] = note
    return note


def _dequant(o: _Operands, entry, spec, w_off: int, s_off: int, b_off: int, tile, prim_name):
    """The weight matrix at these offsets as float32 into ``tile`` (rows x cols)."""
    rows, cols = tile.shape
    table = _table(o.mode, o.bits)
    ptrs = [o.w.ctypes.data + int(w_off), o.s.ctypes.data + o.s.itemsize * int(s_off),
            o.b.ctypes.data + 4 * int(b_off), table.ctypes.data, tile.ctypes.data,
            rows, cols, o.gs]
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    t0 = timeline.now() if timeline.enabled else 0
    entry.fast_fn(gil=tile.size < _SMALL)(argv)
    _record(spec, prim_name, t0)
    entry.hits += 1


def _qmm(o: _Operands, entry, spec, x_idx, w_offs, s_offs, b_offs, prim_name: str):
    """Many rows: each distinct weight matrix (a run of equal offsets) dequantized once into
    a float32 tile, multiplied with each entry's rows by BLAS."""
    nb = len(x_idx)
    out = np.empty((nb, o.M, o.N), _F32)
    wshape = (o.N, o.K) if o.transpose else (o.K, o.N)
    tile = np.empty(wshape, _F32)
    last = None
    fit_blas_threads()
    for i in range(nb):
        key = (w_offs[i], s_offs[i], b_offs[i])
        if key != last:
            _dequant(o, entry, spec, *key, tile, prim_name)
            last = key
        np.matmul(o.matrix(int(x_idx[i])), tile.T if o.transpose else tile, out=out[i])
    return out


def _run(o: _Operands, x_idx, w_offs, s_offs, b_offs, prim_name: str, xp, args, kw):
    why = _why_not(o)
    if why is None:
        form = ("qmv_t" if o.transpose else "qmv_n") if o.M <= MAX_ROWS else "dequant"
        spec = _spec(o, form)
        entry = _entry(spec)
        if isinstance(entry, compiler.BuildError):
            compiler.note_fallback(spec.name, spec.layout, "", str(entry))
            why = str(entry)
    if why is not None:
        return None, why
    run = _qmv if form != "dequant" else _qmm
    return run(o, entry, spec, x_idx, w_offs, s_offs, b_offs, prim_name), None


def _operands(x, w, scales, biases: tuple, kw: dict):
    """The operands of a QuantizedMatmul call and each of x's batch entries' offsets into
    w, scales and biases."""
    b = biases[0] if biases else None
    if x.ndim <= 2 < w.ndim:  # MLX's kernel reads w's first matrix for an unbatched x
        w, scales = w.reshape(-1, *w.shape[-2:])[0], scales.reshape(-1, *scales.shape[-2:])[0]
        b = None if b is None else b.reshape(-1, *b.shape[-2:])[0]
    o = _Operands(x, w, scales, b, **kw)
    nb = len(o.x_offs)

    def each(offs):  # a 2-D operand serves every entry of x's batch
        return offs if len(offs) == nb else np.zeros(nb, np.int64) + offs[0]

    return o, each(o.w_offs), each(o.s_offs), each(o.b_offs)


def qmv_plan(x, w, scales, *biases, group_size, bits, mode, transpose):
    """The vector kernel's KernelCall for a QuantizedMatmul of this layout (float32 x of
    at most ``MAX_ROWS`` rows a matrix, every operand's matrices row-contiguous: no copy,
    the kernel built), or None: the rule runs it. The eval loop calls it from C."""
    kw = dict(group_size=group_size, bits=bits, mode=mode, transpose=transpose)
    ins = (x, w, scales, *biases)
    if (any(type(a) is not np.ndarray for a in ins) or x.dtype != _F32 or x.ndim < 2
            or x.size == 0 or w.size == 0 or (mode == "affine" and biases
                                              and (scales.dtype != _F32 or biases[0].dtype != _F32))):
        return None
    o, w_offs, s_offs, b_offs = _operands(x, w, scales, biases, kw)
    copied = (o.x is not x or o.w is not w or o.s is not scales
              or (biases and o.b is not biases[0]))
    if copied or o.M > MAX_ROWS or _why_not(o) is not None:
        return None
    spec = _spec(o, "qmv_t" if transpose else "qmv_n")
    entry = _entry(spec)
    if isinstance(entry, compiler.BuildError):
        return None
    return _qmv_call(o, entry, spec, o.x_offs, w_offs, s_offs, b_offs, "QuantizedMatmul",
                     tuple(x.shape[:-1]) + (o.N,), biases=bool(biases))


def _rule(xp, *ins, out=None, **kw):
    """QuantizedMatmul's rule where no plan takes the call (``out`` unused)."""
    return quantized_matmul(xp, *ins, **kw)


def quantized_matmul(xp, x, w, scales, *biases, group_size, bits, mode, transpose):
    kw = dict(group_size=group_size, bits=bits, mode=mode, transpose=transpose)
    args = (x, w, scales, *biases)
    if x.size == 0 or w.size == 0:
        return REGISTRY["QuantizedMatmul"].rule(xp, *args, **kw)
    o, w_offs, s_offs, b_offs = _operands(x, w, scales, biases, kw)
    out, why = _run(o, np.arange(len(o.x_offs)), w_offs, s_offs, b_offs, "QuantizedMatmul",
                    xp, args, kw)
    if out is None:
        return _fallback("QuantizedMatmul", why, xp, args, kw)
    return out.reshape(*x.shape[:-1], o.N)


def gather_qmm(xp, x, w, scales, *rest, group_size, bits, mode, transpose, left_sorted,
               right_sorted):
    kw = dict(group_size=group_size, bits=bits, mode=mode, transpose=transpose)
    allkw = dict(kw, left_sorted=left_sorted, right_sorted=right_sorted)
    args = (x, w, scales, *rest)
    *b, lhs, rhs = rest
    if x.size == 0 or w.size == 0 or lhs.size == 0:
        return REGISTRY["GatherQMM"].rule(xp, *args, **allkw)
    o = _Operands(x, w, scales, b[0] if b else None, **kw)
    li = lhs.reshape(-1).astype(np.int64)
    ri = rhs.reshape(-1).astype(np.int64)
    nw = len(o.w_offs)
    if (li.min() < 0 or li.max() >= len(o.x_offs) or ri.min() < 0 or ri.max() >= nw):
        return _fallback("GatherQMM", "an index outside the batch", xp, args, allkw)

    def at(offs):
        return offs[ri] if len(offs) == nw else np.zeros(len(ri), np.int64) + offs[0]

    out, why = _run(o, li, at(o.w_offs), at(o.s_offs), at(o.b_offs), "GatherQMM",
                    xp, args, kw)
    if out is None:
        return _fallback("GatherQMM", why, xp, args, allkw)
    return out.reshape(*lhs.shape, o.M, o.N)


def quantize(xp, w, *, group_size, bits, mode="affine"):
    """Affine quantization per group (``affine_quantize_b{bits}``): packed codes, float32
    scales and biases (the evaluator stores them in w's type)."""
    kw = dict(group_size=group_size, bits=bits, mode=mode)
    if (w.size == 0 or w.dtype.name not in ("float32", "float16", "bfloat16")
            or group_size not in QuantSpec("quantize", "affine", bits).group_sizes):
        return REGISTRY["Quantize"].rule(xp, w, **kw)
    spec = QuantSpec("quantize", "affine", bits)
    entry = _entry(spec)
    if isinstance(entry, compiler.BuildError):
        compiler.note_fallback(spec.name, spec.layout, "", str(entry))
        return _fallback("Quantize", str(entry), xp, (w,), kw)
    shape = w.shape
    src = np.ascontiguousarray(_f32(w))
    rows, cols = src.size // shape[-1], shape[-1]
    sshape = shape[:-1] + (cols // group_size,)
    wq = np.empty(shape[:-1] + (cols * bits // 32,), np.uint32)
    scales, biases = np.empty(sshape, _F32), np.empty(sshape, _F32)
    ptrs = [src.ctypes.data, wq.ctypes.data, scales.ctypes.data, biases.ctypes.data,
            rows, cols, group_size]
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    t0 = timeline.now() if timeline.enabled else 0
    entry.fast_fn(gil=src.size < _SMALL)(argv)
    _record(spec, "Quantize", t0)
    entry.hits += 1
    return [wq, scales, biases]


# primitive name -> rule, for the definitions that name these kernels (PrimitiveDef.kernel)
# (QuantizedMatmul: a layout's vector-kernel call planned once, called by the eval loop
# from C; every other call the rule)
RULES: dict = by_kernel({"quantized_matmul": KernelRule("QuantizedMatmul", qmv_plan, _rule),
                         "gather_qmm": gather_qmm, "quantize": quantize})
