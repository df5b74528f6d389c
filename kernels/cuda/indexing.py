"""MLX's ``GatherAxis`` and ``ScatterAxis`` with ``reduce="sum"`` on an NVIDIA GPU: one
generated CUDA kernel a call, as MLX's CUDA backend runs ``gather_axis`` / ``scatter_axis``
(mlx/backend/cuda/indexing.cpp, device/gather_axis.cuh, device/scatter_axis.cuh).

Each is a ``KernelRule`` whose plan for a call layout (``AxisPlan``: the kernel's arguments
packed once; a scatter's two launches, the input copied into the output, then the scatter)
the eval loop launches from C from the second call of that layout on
(``cuda/primitive_plans.py``), as MLX launches its kernels from C++.

``take_along_axis`` and its VJP (every cross-entropy's ``ScatterAxis`` of the gradient) ran
the array-module rules (``rules/indexing.py``): index grids of aranges, a bounds check of
four CuPy launches and a host read, CuPy's advanced indexing or ``add.at``: ~700 us of host
time for a (64, 10) gather on the H200. Here a thread walks output (gather) or update
(scatter) elements in a grid-stride loop: it unravels its position over the indices' shape,
reads its index (any integer type), wraps a negative one by the axis's size and moves the
element (gather: by its byte size, so every dtype, bfloat16's bits too) or adds it
atomically into a contiguous copy of the input (scatter; float32, float16, bfloat16, float64
and the 32 / 64-bit integers: the dtypes with a CUDA ``atomicAdd``). bfloat16 scatters on
its storage (``takes_bfloat16``: cuda/backend.py hands the ``BF16Array``s over unwidened),
each update added as ``atomicAdd`` on ``__nv_bfloat16`` adds it (float math, one round to
nearest even per add), as MLX's CUDA scatter does (device/scatter_ops.cuh, ``ScatterSum``
through atomic_ops.cuh) and as the CPU adds bfloat16 one update at a time; what its kernel
does not take goes the float32 way (``bfloat16.rule``'s: widened, the rule, rounded back).

An index outside ``[-size, size)`` raises numpy's IndexError, as the CPU's rules do
(``rules/indexing.py``), but not at the launch: a thread with a bad index moves nothing (a
gather writes 0 for that element, a scatter drops that update) and notes it in its
stream's bounds record (``codegen/bounds_text.py``: the first bad index of the launch, its
axis and size), which the host reads where it waits for the stream (``cuda/bounds.py``):
no host synchronisation at the launch (a read back there was a full synchronisation of the
stream inside every cross-entropy step, twice: the gather and its VJP's scatter). MLX's
CUDA backend checks none (device/gather_axis.cuh and scatter_axis.cuh read
``absolute_index(idx, size)`` and move the element, however far out). What the kernels do
not take (another scatter reduction, a dtype without an atomic add, host inputs, no NVRTC)
runs the rule.
"""

from __future__ import annotations

from typing import Optional

import cupy
import numpy as np

from .. import kernel_registry, timeline
from ..common.strides import elem_strides as _elem_strides
from ..primitives import REGISTRY, by_kernel
from ..codegen import bounds_text
from . import bounds, compiled
from . import bfloat16 as bf16
from .bfloat16 import BF16Array
from ..kernel_call import KernelRule
from .primitive_plans import _MASK, SCRATCH, KernelPlan
from .reductions import launch_recorded

BLOCK = 256
_MOVE = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
_INDEX = {"int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
          "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int"}
# (uint64 indices run the rule: one above 2^63 would read as negative here)
_ADD = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16",
        "float64": "double", "int32": "int",
        "uint32": "unsigned int", "int64": "unsigned long long",
        "uint64": "unsigned long long"}  # (int64 adds as its two's-complement bits)


def _source(name: str, scatter: bool, elem: str, index: str, ndim: int, axis: int,
            report: Optional[int] = None) -> str:
    """The gather / scatter kernel over an ``ndim`` walk, the index moving along ``axis``
    (``report``: the axis an index out of bounds names, where the walk's is not the array's:
    a one-index Gather's)."""
    per = ("n", "sa", "si", "su") if scatter else ("n", "sa", "si")  # size, strides
    dims = ", ".join(f"long long {p}{d}" for d in range(ndim) for p in per)
    walk = "\n".join(
        f"    {{ const long long c = r % n{d}; r /= n{d}; io += c * si{d};"
        + (f" uo += c * su{d};" if scatter else "")
        + ("" if d == axis else f" ao += c * sa{d};") + " }"
        for d in reversed(range(ndim)))
    if scatter:
        args = (f"const {index}* __restrict__ idx, const {elem}* __restrict__ upd, "
                f"{elem}* __restrict__ out")
        move = "    atomicAdd(out + ao, upd[uo]);"
        drop = ""  # (the update dropped)
    else:
        args = (f"const {elem}* __restrict__ a, const {index}* __restrict__ idx, "
                f"{elem}* __restrict__ out")
        move = "    out[t] = a[ao];"
        drop = f" out[t] = ({elem})0;"  # (the element reads 0)
    unsigned = int(index.startswith("unsigned"))
    return f"""#include <cuda_fp16.h>
#include <cuda_bf16.h>

{bounds_text.CUDA}
extern "C" __global__ void {name}({args}, unsigned long long* bounds, long long n,
    long long size, {dims}) {{
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {{
    long long r = t, ao = 0, io = 0{", uo = 0" if scatter else ""};
{walk}
    long long j = (long long)idx[io];
    if (j < -size || j >= size) {{
      bounds_note(bounds, (unsigned long long)t, (unsigned long long)j, {axis if report is None else report}, size,
                  (unsigned long long)idx, {unsigned});{drop}
      continue;
    }}
    if (j < 0) j += size;
    ao += j * sa{axis};
{move}
  }}
}}
"""


def _fallback(name: str, why: str, xp, ins, kw):
    t0 = timeline.now() if timeline.enabled else 0
    res = REGISTRY[name].rule(xp, *ins, **kw)
    if t0:
        timeline.add("kernel_fallback", t0, timeline.now(), name=name, device="gpu",
                     detail={"reason": why, "runtime": "cupy", "primitive": name})
    return res


def _copy_source(name: str, elem: str, ndim: int) -> str:
    """A strided copy of ``a`` (any strides, a broadcast's 0 too) into the row-major
    ``out``, element by element (``elem``: the bytes' type): a scatter's first launch."""
    dims = ", ".join(f"long long n{d}, long long sa{d}" for d in range(ndim))
    walk = "\n".join(f"    {{ const long long c = r % n{d}; r /= n{d}; ao += c * sa{d}; }}"
                     for d in reversed(range(ndim)))
    return f"""extern "C" __global__ void {name}(const {elem}* __restrict__ a,
    {elem}* __restrict__ out, long long n{", " + dims if dims else ""}) {{
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {{
    long long r = t, ao = 0;
{walk}
    out[t] = a[ao];
  }}
}}
"""


def _kernel(name: str, scatter: bool, elem: str, index, axis: int, ndim: int,
            report: Optional[int] = None):
    """(kernel name, its loaded entry) of the gather or scatter; BuildError without one."""
    kname = (f"{'scatter_axis_sum' if scatter else 'gather_axis'}_{elem.replace(' ', '_')}_"
             f"{_INDEX[index.name].replace(' ', '_')}_{ndim}d_axis{axis}"
             + ("" if report is None else f"_names{report}"))
    return kname, compiled.get_kernel(kname, f"{ndim}d", lambda: _source(
        kname, scatter, elem, _INDEX[index.name], ndim, axis, report), key=kname)


def _ints(shape: tuple, strides: tuple, size: Optional[int]) -> tuple:
    """(element count, the integer arguments after the arrays): the count, the axis's
    ``size`` (None: a copy has none), then per dimension its size and each array's stride."""
    n = 1
    for s in shape:
        n *= int(s)
    ints = [n] if size is None else [n, int(size)]
    for d in range(len(shape)):
        ints += [int(shape[d])] + [int(st[d]) for st in strides]
    return n, ints


def _run(name: str, scatter: bool, elem: str, index, axis: int, shape: tuple, bufs: tuple,
         strides: tuple, size: int) -> Optional[str]:
    """One launch over ``shape`` (the indices'); ``strides`` per dimension: (of the moved
    array, of the indices[, of the updates]). None, or why it could not run."""
    ndim = len(shape)
    try:
        kname, entry = _kernel(name, scatter, elem, index, axis, ndim)
    except kernel_registry.BuildError as e:
        return str(e)
    n, ints = _ints(shape, strides, size)
    word = bounds.word_for(cupy.cuda.get_current_stream().ptr)  # (read at the host's wait)
    args = list(bufs) + [np.uint64(word)] + [np.int64(v) for v in ints]
    grid = max(1, min(-(-n // BLOCK), 8192))
    launch_recorded(entry, grid, BLOCK, tuple(args), kname, {"variant": f"{ndim}d", "primitive": name})
    return None


class AxisPlan(KernelPlan):
    """One launch of a gather / scatter kernel for one call layout: the arrays' pointers at
    the first words (inputs ``ins`` in the kernel's order, the output at ``out_at``), then
    (``checked``: the gather and the scatter, not the copy) the stream's bounds word in a
    ``SCRATCH`` slot (``scratch_for``: ``bounds.word_for``), the integer arguments packed
    once; ``then``: the launches after it (a scatter is the input's copy into the output,
    then the scatter into it), issued in order by the eval loop's C launch
    (``cuda/_driver.c``) as a ``PlanSequence``'s are."""

    __slots__ = ("then",)

    def __init__(self, entry, name: str, ins: tuple, out_at: int, ints: list, n: int,
                 out_shape: tuple, out_dtype, primitive: str, then: tuple = (),
                 checked: bool = True):
        nptr = len(ins) + 1 + int(checked)
        words = [0] * nptr + [int(v) & _MASK for v in ints] + [0, 0]  # (two spare words)
        slots = [(i, j) for j, i in enumerate(ins)] + ([(SCRATCH, nptr - 1)] if checked else [])
        self.primitive, self.keep, self.then, self.dims = primitive, [], then, ()
        grid = max(1, min(-(-n // BLOCK), 8192))
        self._set_pack(entry, words, list(range(nptr + len(ints))), slots, (), out_at,
                       nptr + len(ints), grid, BLOCK, [np.dtype(out_dtype)], "C",
                       tuple(out_shape), name, f"{len(out_shape)}d")

    scratch_for = staticmethod(bounds.word_for)  # (the C launch asks it per CUDA stream)

    def call(self, inputs, outs, hit: bool = True, stream=None) -> None:
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        word = bounds.word_for(stream.ptr)
        for p in (self, *self.then):
            p._launch_one(inputs, outs[0], word, stream, hit)


def _gather_plan(a, indices, *, axis) -> Optional[AxisPlan]:
    """The plan of a gather of these layouts (None: ``gather_axis`` runs it)."""
    raw = a.raw if type(a) is BF16Array else a
    if (not _usable(raw, indices) or indices.dtype.name not in _INDEX
            or raw.itemsize not in _MOVE or indices.size == 0):
        return None
    sa, si = _elem_strides(raw), _elem_strides(indices)
    if sa is None or si is None:
        return None
    try:
        kname, entry = _kernel("GatherAxis", False, _MOVE[raw.itemsize], indices.dtype, axis,
                               indices.ndim)
    except kernel_registry.BuildError:
        return None
    n, ints = _ints(indices.shape, (sa, si), raw.shape[axis])
    return AxisPlan(entry, kname, (0, 1), 2, ints, n, indices.shape, a.dtype, "GatherAxis")


def _scatter_plan(a, indices, updates, *, axis, reduce) -> Optional[AxisPlan]:
    """The plan of a scatter-sum of these layouts: the input copied into the output (one
    kernel), then the updates added into it (None: ``scatter_axis`` runs it)."""
    half = type(a) is BF16Array
    ra, ru = (a.raw, bf16.storage(updates)) if half else (a, updates)
    if (reduce != "sum" or not _usable(ra, indices, ru) or a.dtype.name not in _ADD
            or updates.dtype != a.dtype or indices.dtype.name not in _INDEX
            or indices.size == 0 or updates.shape != indices.shape or ra.size == 0):
        return None
    sa, si, su = _elem_strides(ra), _elem_strides(indices), _elem_strides(ru)
    if sa is None or si is None or su is None:
        return None
    so = [0] * ra.ndim  # the output's row-major element strides
    acc = 1
    for d in reversed(range(ra.ndim)):
        so[d] = acc
        acc *= int(ra.shape[d])
    elem = _MOVE[ra.itemsize]
    cname = f"copy_strided_{elem.replace(' ', '_')}_{ra.ndim}d"
    try:
        copy = compiled.get_kernel(cname, f"{ra.ndim}d", lambda: _copy_source(cname, elem, ra.ndim),
                                   key=cname)
        kname, entry = _kernel("ScatterAxis", True, _ADD[a.dtype.name], indices.dtype, axis,
                               indices.ndim)
    except kernel_registry.BuildError:
        return None
    n, ints = _ints(indices.shape, (so, si, su), ra.shape[axis])
    scatter = AxisPlan(entry, kname, (1, 2), 2, ints, n, a.shape, a.dtype, "ScatterAxis")
    m, cints = _ints(ra.shape, (sa,), None)
    return AxisPlan(copy, cname, (0,), 1, cints, m, a.shape, a.dtype, "ScatterAxis",
                    then=(scatter,), checked=False)


def _usable(*arrays) -> bool:
    return all(type(a) is cupy.ndarray for a in arrays)


def gather_axis(xp, a, indices, *, axis, out=None):
    """The rule where no plan takes the call (``out``, the evaluator's buffer, unused: the
    result is a new array, as a ``KernelRule``'s may be)."""
    kw = {"axis": axis}
    wrap = type(a) is BF16Array
    raw = a.raw if wrap else a
    if not _usable(raw, indices) or indices.dtype.name not in _INDEX or raw.itemsize not in _MOVE:
        return _fallback("GatherAxis", "no CUDA gather_axis kernel for these inputs", xp,
                         (a, indices), kw)
    out = cupy.empty(indices.shape, dtype=raw.dtype)
    if out.size == 0:
        return BF16Array(out) if wrap else out
    sa, si = _elem_strides(raw), _elem_strides(indices)
    if sa is None or si is None:
        return _fallback("GatherAxis", "strides that are not whole elements", xp, (a, indices), kw)
    why = _run("GatherAxis", False, _MOVE[raw.itemsize], indices.dtype, axis, indices.shape,
               (raw, indices, out), (sa, si), raw.shape[axis])
    if why:
        return _fallback("GatherAxis", why, xp, (a, indices), kw)
    return BF16Array(out) if wrap else out


def gather_walk(a_strides: tuple, idx_shape: tuple, idx_strides: tuple, axis: int,
                slice_sizes: tuple) -> tuple:
    """MLX's one-index ``Gather`` as the gather_axis kernel's walk: (walk shape, the moved
    array's strides along it, the indices' strides along it, the window's element count).
    The walk is the indices' shape then the window's other axes; its first axis is the
    kernel's gathered one (the index times ``a``'s stride on ``axis``); the indices' other
    axes move nothing in ``a`` and the window's axes nothing in the indices, so the output
    comes out in Gather's order (the indices' shape, then the window). Element strides."""
    ishape, istr = (tuple(idx_shape), tuple(idx_strides)) if idx_shape else ((1,), (0,))
    others = [d for d in range(len(a_strides)) if d != axis]
    window = 1
    for d in others:
        window *= int(slice_sizes[d])
    walk = ishape + tuple(int(slice_sizes[d]) for d in others)
    moved = (a_strides[axis],) + (0,) * (len(ishape) - 1) + tuple(a_strides[d] for d in others)
    return walk, moved, istr + (0,) * len(others), window


def _one_index(a, indices, slice_sizes, axes):
    """(storage, the index array, its axis) of a one-index Gather the kernel takes, else None."""
    raw = a.raw if type(a) is BF16Array else a
    if (len(indices) != 1 or slice_sizes[axes[0]] != 1 or not _usable(raw, indices[0])
            or indices[0].dtype.name not in _INDEX or raw.itemsize not in _MOVE):
        return None
    return raw, indices[0], axes[0]


def _walked(raw, idx, k: int, slice_sizes):
    """(the kernel's name and entry, its element count and integer arguments) of a one-index
    Gather over ``gather_walk``'s walk; None where strides are not whole elements.
    BuildError without a kernel."""
    sa, si = _elem_strides(raw), _elem_strides(idx)
    if sa is None or si is None:
        return None
    walk, moved, istr, _ = gather_walk(sa, idx.shape, si, k, slice_sizes)
    kname, entry = _kernel("Gather", False, _MOVE[raw.itemsize], idx.dtype, 0, len(walk),
                           report=k)
    return kname, entry, *_ints(walk, (moved, istr), raw.shape[k])


def _gather_one_plan(a, *indices, axes, slice_sizes) -> Optional[AxisPlan]:
    """The plan of a one-index Gather of these layouts (None: ``gather`` runs it)."""
    got = _one_index(a, indices, slice_sizes, axes)
    if got is None or got[1].size == 0 or got[0].size == 0:
        return None
    raw, idx, k = got
    try:
        walked = _walked(raw, idx, k, slice_sizes)
    except kernel_registry.BuildError:
        return None
    if walked is None:
        return None
    kname, entry, n, ints = walked
    return AxisPlan(entry, kname, (0, 1), 2, ints, n, tuple(idx.shape) + tuple(slice_sizes),
                    a.dtype, "Gather")


def gather(xp, a, *indices, axes, slice_sizes, out=None):
    """MLX's ``Gather`` with one index array (``a[idx]``, ``take``: an embedding's lookup)
    as one launch of the gather_axis kernel over ``gather_walk``'s walk (MLX's CUDA backend
    has one general kernel, mlx/backend/cuda/device/gather.cuh, whose per-element walk this
    is for one index array); the rule where no plan takes the call. Several index arrays, a
    window wider than 1 on the gathered axis, or what the kernel does not take run the
    definition's rule (``out`` unused, as ``gather_axis``'s)."""
    kw = {"axes": axes, "slice_sizes": slice_sizes}
    got = _one_index(a, indices, slice_sizes, axes)
    if got is None:
        return _gather_rule("no CUDA gather kernel for these inputs", xp, a, indices, kw)
    raw, idx, k = got
    shape = tuple(idx.shape) + tuple(slice_sizes)
    res = cupy.empty(shape, dtype=raw.dtype)
    if res.size:
        try:
            walked = _walked(raw, idx, k, slice_sizes)
        except kernel_registry.BuildError as e:
            return _gather_rule(str(e), xp, a, indices, kw)
        if walked is None:
            return _gather_rule("strides that are not whole elements", xp, a, indices, kw)
        kname, entry, n, ints = walked
        word = bounds.word_for(cupy.cuda.get_current_stream().ptr)  # (read at the host's wait)
        args = [raw, idx, res, np.uint64(word)] + [np.int64(v) for v in ints]
        launch_recorded(entry, max(1, min(-(-n // BLOCK), 8192)), BLOCK, tuple(args), kname,
                        {"variant": f"{(len(ints) - 2) // 3}d", "primitive": "Gather"})
    return BF16Array(res) if type(a) is BF16Array else res


gather.takes_bfloat16 = True  # (a BF16Array's bits moved as they are)


def _gather_rule(why: str, xp, a, indices, kw: dict):
    """The definition's rule where the kernel does not take the call (bfloat16: its bits
    gathered as they are)."""
    if type(a) is not BF16Array:
        return _fallback("Gather", why, xp, (a, *indices), kw)
    return BF16Array(_fallback("Gather", why, xp, (a.raw, *indices), kw))


def scatter_axis(xp, a, indices, updates, *, axis, reduce, out=None):
    """The rule where no plan takes the call (another reduction, a dtype or layout the
    kernel does not take; ``out`` unused, as ``gather_axis``'s)."""
    kw = {"axis": axis, "reduce": reduce}
    ins = (a, indices, updates)
    half = type(a) is BF16Array  # (bfloat16: its storage, ``raw``)
    ra, ru = (a.raw, bf16.storage(updates)) if half else (a, updates)
    if (reduce != "sum" or not _usable(ra, indices, ru) or a.dtype.name not in _ADD
            or updates.dtype != a.dtype or indices.dtype.name not in _INDEX):
        return _scatter_rule("no CUDA scatter_axis kernel for these inputs", xp, ins, kw)
    out = cupy.array(ra, order="C")  # the input copied, never written (rules/indexing.py)
    if indices.size == 0:
        return BF16Array(out) if half else out
    si, su = _elem_strides(indices), _elem_strides(ru)
    if si is None or su is None or updates.shape != indices.shape:
        return _scatter_rule("updates not of the indices' shape", xp, ins, kw)
    so = _elem_strides(out)
    why = _run("ScatterAxis", True, _ADD[a.dtype.name], indices.dtype, axis, indices.shape,
               (indices, ru, out), (so, si, su), a.shape[axis])
    if why:
        return _scatter_rule(why, xp, ins, kw)
    return BF16Array(out) if half else out


scatter_axis.takes_bfloat16 = True  # cuda/backend.py: bfloat16 inputs come as BF16Arrays


def _scatter_rule(why: str, xp, ins: tuple, kw: dict):
    """The definition's rule where the kernel does not take the call; bfloat16 the way
    ``bfloat16.rule`` takes it (assigning: its bits moved; a reduction: on float32 copies,
    rounded back)."""
    a, indices, updates = ins
    if type(a) is not BF16Array and type(updates) is not BF16Array:
        return _fallback("ScatterAxis", why, xp, ins, kw)
    if kw["reduce"] == "none":
        return BF16Array(_fallback("ScatterAxis", why, xp,
                                   (bf16.storage(a), indices, bf16.storage(updates)), kw))
    res = _fallback("ScatterAxis", why, xp, (bf16.value(a), indices, bf16.value(updates)), kw)
    return bf16.cast(res, bf16.BF16)


gather_axis.takes_bfloat16 = True  # (a BF16Array's bits moved as they are)


def _fits(out, shape, dtype, ins) -> bool:
    """Whether the evaluator's buffer takes the kernels' result: its shape and dtype,
    row-contiguous storage, none of the inputs' memory."""
    t = bf16.storage(out) if out is not None else None
    return (t is not None and type(t) is cupy.ndarray and out.shape == tuple(shape)
            and out.dtype == dtype and t.flags.c_contiguous
            and not any(cupy.may_share_memory(t, bf16.storage(a)) for a in ins))


def _empty(shape: tuple, dtype):
    return BF16Array(cupy.empty(shape, bf16.U16)) if dtype == bf16.BF16 else cupy.empty(
        shape, dtype=dtype)


# primitive name -> rule, for the definitions that name these kernels (PrimitiveDef.kernel):
# KernelRules, their plans launched by the eval loop from C once a layout has made one
RULES: dict = {name: KernelRule(name, plan, rule, _fits, _empty) for name, (plan, rule) in
               by_kernel({"gather": (_gather_one_plan, gather),
                          "gather_axis": (_gather_plan, gather_axis),
                          "scatter_axis": (_scatter_plan, scatter_axis)}).items()}
