"""MLX's ``GatherAxis`` and ``ScatterAxis`` with ``reduce="sum"`` on an NVIDIA GPU: one
generated CUDA kernel a call, as MLX's CUDA backend runs ``gather_axis`` / ``scatter_axis``
(mlx/backend/cuda/indexing.cpp, device/gather_axis.cuh, device/scatter_axis.cuh).

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

The house's bounds semantics are kept (the rules' IndexError with numpy's message for an
index outside ``[-size, size)``; MLX reads or writes out of bounds there): a thread with a
bad index moves nothing and lowers a device word to its position (``atomicMin``), and the
host reads that word after the launch (one small device-to-host copy: the host waits for
the stream once a call, as the rules' check did). What the kernels do not take (another
scatter reduction, a dtype without an atomic add, host inputs, no NVRTC) runs the rule.
"""

from __future__ import annotations

from typing import Optional

import cupy
import numpy as np

from .. import kernel_registry, timeline
from ..common.strides import elem_strides as _elem_strides
from ..primitives import REGISTRY, by_kernel
from ..rules.indexing import out_of_bounds
from . import compiled
from . import bfloat16 as bf16
from .bfloat16 import BF16Array
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
_NONE = (1 << 64) - 1  # the bad-position word before any thread lowers it


def _source(name: str, scatter: bool, elem: str, index: str, ndim: int, axis: int) -> str:
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
    else:
        args = (f"const {elem}* __restrict__ a, const {index}* __restrict__ idx, "
                f"{elem}* __restrict__ out")
        move = "    out[t] = a[ao];"
    return f"""#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void {name}({args}, unsigned long long* bad, long long n,
    long long size, {dims}) {{
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {{
    long long r = t, ao = 0, io = 0{", uo = 0" if scatter else ""};
{walk}
    long long j = (long long)idx[io];
    if (j < -size || j >= size) {{ atomicMin(bad, (unsigned long long)t); continue; }}
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


def _run(name: str, scatter: bool, elem: str, index, axis: int, shape: tuple, bufs: tuple,
         strides: tuple, size: int) -> Optional[str]:
    """One launch over ``shape`` (the indices'); ``strides`` per dimension: (of the moved
    array, of the indices[, of the updates]). None, or why it could not run."""
    ndim = len(shape)
    kname = (f"{'scatter_axis_sum' if scatter else 'gather_axis'}_{elem.replace(' ', '_')}_"
             f"{_INDEX[index.name].replace(' ', '_')}_{ndim}d_axis{axis}")
    try:
        entry = compiled.get_kernel(kname, f"{ndim}d", lambda: _source(
            kname, scatter, elem, _INDEX[index.name], ndim, axis), key=kname)
    except kernel_registry.BuildError as e:
        return str(e)
    n = 1
    for s in shape:
        n *= int(s)
    bad = _bad_word()
    args = list(bufs) + [bad, np.int64(n), np.int64(size)]
    for d in range(ndim):
        args += [np.int64(shape[d])] + [np.int64(st[d]) for st in strides]
    grid = max(1, min(-(-n // BLOCK), 8192))
    launch_recorded(entry, grid, BLOCK, tuple(args), kname, {"variant": f"{ndim}d", "primitive": name})
    first = int(bad.get()[0])  # (the host waits for the stream here)
    if first != _NONE:
        raise _IndexOut(first)
    return None


_words: dict = {}  # (device, CUDA stream) -> its bad-position word


def _bad_word():
    """The current stream's bad-position word, set to none (the stream orders its users)."""
    st = cupy.cuda.get_current_stream()
    key = (cupy.cuda.runtime.getDevice(), st.ptr)
    w = _words.get(key)
    if w is None:
        w = _words[key] = cupy.empty(1, dtype=cupy.uint64)
    cupy.cuda.runtime.memsetAsync(w.data.ptr, 0xFF, 8, st.ptr)
    return w


class _IndexOut(Exception):
    """A thread saw an index out of bounds at this position of the indices."""


def _raise_first(indices, pos: int, size: int, axis: int):
    at = np.unravel_index(pos, indices.shape)
    raise out_of_bounds(int(indices[at]), size, axis) from None


def _usable(*arrays) -> bool:
    return all(type(a) is cupy.ndarray for a in arrays)


def gather_axis(xp, a, indices, *, axis):
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
    try:
        why = _run("GatherAxis", False, _MOVE[raw.itemsize], indices.dtype, axis,
                   indices.shape, (raw, indices, out), (sa, si), raw.shape[axis])
    except _IndexOut as e:
        _raise_first(indices, e.args[0], raw.shape[axis], axis)
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


def gather(xp, a, *indices, axes, slice_sizes):
    """MLX's ``Gather`` with one index array (``a[idx]``, ``take``: an embedding's lookup)
    as one launch of the gather_axis kernel over ``gather_walk``'s walk (MLX's CUDA backend
    has one general kernel, mlx/backend/cuda/device/gather.cuh, whose per-element walk this
    is for one index array). Several index arrays, a window wider than 1 on the gathered
    axis, or what the kernel does not take run the rule."""
    kw = {"axes": axes, "slice_sizes": slice_sizes}
    wrap = type(a) is BF16Array
    raw = a.raw if wrap else a
    if (len(indices) != 1 or slice_sizes[axes[0]] != 1 or not _usable(raw, indices[0])
            or indices[0].dtype.name not in _INDEX or raw.itemsize not in _MOVE):
        return _fallback("Gather", "no CUDA gather kernel for these inputs", xp, (a, *indices), kw)
    (idx,), k = indices, axes[0]
    sa, si = _elem_strides(raw), _elem_strides(idx)
    if sa is None or si is None:
        return _fallback("Gather", "strides that are not whole elements", xp, (a, *indices), kw)
    walk, moved, istr, window = gather_walk(sa, idx.shape, si, k, slice_sizes)
    out = cupy.empty(walk, dtype=raw.dtype)
    if out.size:
        try:
            why = _run("Gather", False, _MOVE[raw.itemsize], idx.dtype, 0, walk,
                       (raw, idx, out), (moved, istr), raw.shape[k])
        except _IndexOut as e:
            _raise_first(idx.reshape(walk[:max(idx.ndim, 1)]), e.args[0] // window,
                         raw.shape[k], k)
        if why:
            return _fallback("Gather", why, xp, (a, *indices), kw)
    out = out.reshape(tuple(idx.shape) + tuple(slice_sizes))
    return BF16Array(out) if wrap else out


def scatter_axis(xp, a, indices, updates, *, axis, reduce):
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
    try:
        why = _run("ScatterAxis", True, _ADD[a.dtype.name], indices.dtype, axis, indices.shape,
                   (indices, ru, out), (so, si, su), a.shape[axis])
    except _IndexOut as e:
        _raise_first(indices, e.args[0], a.shape[axis], axis)
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


# primitive name -> rule, for the definitions that name these kernels (PrimitiveDef.kernel)
RULES: dict = by_kernel({"gather": gather, "gather_axis": gather_axis,
                         "scatter_axis": scatter_axis})
