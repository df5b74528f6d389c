"""``array.__getitem__``, ``array.__setitem__`` and the ``array.at[idx]`` updates, as MLX.

Basic indices (ints, slices, None, Ellipsis) become a Slice (a view), then Squeeze and
ExpandDims; a lone int, integer arrays and lists become a Gather; assignment records a
SliceUpdate or a Scatter, and ``x.at[idx].add(v)`` a Scatter that accumulates repeats.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as _dt
from .array import array
from .device import resolve_stream
from .primitive import Primitive
from .ops.convert import broadcast, cast, _fmt_shape, to_array
from .ops.creation import arange
from .ops.indexing import _check_index, _gather, _scatter, _slice, _slice_update
from .ops.shape import expand_dims, reshape, reshape_known, squeeze, transpose

_INVALID = "Cannot index mlx array using the given type."
_2_31 = 2**31


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _int32_index(i: int) -> int:
    """MLX's int and slice indices are 32-bit (its ValueError for larger ones)."""
    if not -(2**31) <= i < 2**31:
        raise ValueError("Slice indices must be 32-bit integers.")
    return i


def _bound(v: Any) -> None:
    """A slice bound: None, or an int within MLX's 32-bit range."""
    if v is not None and (type(v) is int or _is_int(v)):
        _int32_index(int(v))


def _entry(x: Any) -> Any:
    """One index entry validated and normalised: int, slice, None, Ellipsis or an array."""
    t = type(x)
    if t is slice:  # the common entries first, by exact type (a bool is not an int here)
        for v in (x.start, x.stop, x.step):
            if v is not None and (type(v) is not int or not -_2_31 <= v < _2_31):
                _bound(v)
        return x
    if t is int:
        return _int32_index(x)
    if x is None or x is Ellipsis:
        return x
    if isinstance(x, (bool, np.bool_)):
        raise ValueError(_INVALID)
    if _is_int(x):
        return _int32_index(int(x))
    if isinstance(x, slice):
        for v in (x.start, x.stop, x.step):
            if _is_int(v):
                _int32_index(int(v))
        return x
    if x is None or x is Ellipsis:
        return x
    if isinstance(x, (list, np.ndarray)):
        x = array(x)
    if isinstance(x, array):
        if x.dtype == _dt.bool_:
            raise ValueError("boolean indices are not yet supported")
        return x
    raise ValueError(_INVALID)


def _expand(a: array, idx: Any) -> tuple:
    """The index as a tuple of entries with the Ellipsis expanded and axes padded."""
    entries = [_entry(x) for x in (idx if type(idx) is tuple or isinstance(idx, tuple) else (idx,))]
    ellipsis, nones = -1, 0
    for i, e in enumerate(entries):
        if e is Ellipsis:
            if ellipsis >= 0:
                raise ValueError("An index can only have a single ellipsis (...)")
            ellipsis = i
        elif e is None:
            nones += 1
    used = len(entries) - nones - (ellipsis >= 0)
    ndim = len(a._d.shape)
    if used > ndim:
        if ndim == 0:
            raise ValueError("too many indices for array: array is 0-dimensional")
        raise ValueError(f"Too many indices for array with {ndim} dimensions.")
    fill = [slice(None)] * (ndim - used)
    if ellipsis >= 0:
        entries[ellipsis:ellipsis + 1] = fill
    else:
        entries += fill
    return tuple(entries)


def _check_entries(a: array, entries: tuple) -> None:
    """IndexError (numpy's message) for an int, or an integer array whose values are known,
    outside ``[-n, n)`` of the axis of ``a`` it indexes (ints first, as numpy). A lazy index
    array is checked when its Gather / Scatter runs; that message names the axis of the
    primitive's operand, which counts the axes that None entries added before it."""
    for e in entries:
        if type(e) is not slice and e is not None:
            break
    else:  # nothing to check
        return
    axes = [(e, d) for d, e in enumerate(e for e in entries if e is not None)]
    for e, d in sorted(axes, key=lambda ed: not isinstance(ed[0], int)):
        if isinstance(e, (int, array)):
            _check_index(e, a.shape[d], d)


def _int_bounds(i: int, n: int) -> tuple:
    """The slice ``[i, i + 1)`` of an in-bounds (``_check_entries``) int index."""
    i = i + n if i < 0 else i
    return i, i + 1


def _basic(a: array, entries: tuple, s) -> array:
    """Slice, then Squeeze the int axes, then ExpandDims the None axes."""
    shape = a._d.shape
    start, stop, step, ints, nones = [], [], [], [], []
    ax = kept = 0  # kept: the position among the entries that are not ints
    for e in entries:
        if e is None:
            nones.append(kept)
            kept += 1
            continue
        if e.__class__ is slice:
            b, f, st = e.indices(shape[ax])
            start.append(b), stop.append(f), step.append(st)
            kept += 1
        else:  # an int
            b, f = _int_bounds(e, shape[ax])
            start.append(b), stop.append(f), step.append(1), ints.append(ax)
        ax += 1
    out = _slice(a, start, stop, step, s)
    if ints:
        out = squeeze(out, ints, stream=s)
    return expand_dims(out, nones, stream=s) if nones else out


def _strip_none(a: array, entries: tuple, s) -> tuple:
    """Turn None entries into full slices over new size-1 axes of ``a``."""
    nones = [i for i, e in enumerate(entries) if e is None]
    if not nones:
        return a, entries
    return expand_dims(a, nones, stream=s), tuple(slice(None) if e is None else e for e in entries)


def _advanced(a: array, entries: tuple, s) -> array:
    """Gather for indices with integer arrays (numpy's placement of the indexed axes)."""
    a, entries = _strip_none(a, entries, s)
    start, stop, step = [], [], []
    for d, e in enumerate(entries):
        if isinstance(e, slice):
            b, f, st = e.indices(a.shape[d])
        else:
            b, f, st = 0, a.shape[d], 1
        start.append(b), stop.append(f), step.append(st)
    x = _slice(a, start, stop, step, s)
    adv = [d for d, e in enumerate(entries) if not isinstance(e, slice)]
    indices = [e if isinstance(e, array) else array(e, _dt.int32) for e in entries
               if not isinstance(e, slice)]
    sizes = [1 if d in adv else x.shape[d] for d in range(x.ndim)]
    g = _gather(x, indices, adv, sizes, s)
    k = g.ndim - x.ndim
    g = squeeze(g, [k + d for d in adv], stream=s)
    p = adv[0]
    if adv == list(range(p, p + len(adv))) and p > 0:
        rest = g.ndim - k
        perm = list(range(k, k + p)) + list(range(k)) + list(range(k + p, k + rest))
        g = transpose(g, perm, stream=s)
    return g


def getitem(a: array, idx: Any) -> array:
    """``a[idx]`` with MLX's semantics: always a new array object (``x[:]`` too), so that
    updating it in place leaves ``a`` alone."""
    out = _getitem(a, idx)
    return array._wrap(out._d) if out is a else out


def _getitem(a: array, idx: Any) -> array:
    s = resolve_stream(None)
    if idx is Ellipsis or (isinstance(idx, tuple) and len(idx) == 0):
        return a
    if _is_int(idx) and not isinstance(idx, (bool, np.bool_)):
        _int32_index(int(idx))
        if a.ndim == 0:
            raise ValueError("too many indices for array: array is 0-dimensional")
        _check_index(int(idx), a.shape[0], 0)
        sizes = (1,) + a.shape[1:]
        return squeeze(_gather(a, [array(int(idx), _dt.int32)], (0,), sizes, s), 0, stream=s)
    entries = _expand(a, idx)
    _check_entries(a, entries)
    for e in entries:
        if isinstance(e, array):
            return _advanced(a, entries, s)
    return _basic(a, entries, s)


def _fit(value: array, shape: tuple, s) -> array:
    """``value`` broadcast to ``shape`` (extra leading size-1 axes dropped, as numpy)."""
    if value._d.shape == shape:
        return value
    while value.ndim > len(shape) and value.shape[0] == 1:
        value = squeeze(value, 0, stream=s)
    return broadcast(value, shape, stream=s)


def _scatter_indices(a: array, entries: tuple, s) -> tuple:
    """Index arrays, one per axis, broadcast to the shape ``a[entries]`` has (numpy order)."""
    adv = [d for d, e in enumerate(entries) if not isinstance(e, slice)]
    idx = [e if isinstance(e, array) else array(e, _dt.int32) for e in entries
           if not isinstance(e, slice)]
    ishape = ()
    for i in idx:
        ishape = np.broadcast_shapes(ishape, i.shape)
    ishape = tuple(ishape)
    sl = {d: arange(*e.indices(a.shape[d]), stream=s) for d, e in enumerate(entries)
          if isinstance(e, slice)}
    order = [d for d in sl]  # slice axes keep their order
    adjacent = bool(adv) and adv == list(range(adv[0], adv[0] + len(adv)))
    pos = adv[0] if adjacent else 0
    before = [d for d in order if d < pos] if adjacent else []
    after = [d for d in order if d not in before]
    target = tuple(sl[d].shape[0] for d in before) + ishape + tuple(sl[d].shape[0] for d in after)
    nb, ni = len(before), len(ishape)
    out = []
    for d, e in enumerate(entries):
        if d in sl:
            j = before.index(d) if d in before else nb + ni + after.index(d)
            shp = [1] * len(target)
            shp[j] = target[j]
            arr = reshape(sl[d], shp, stream=s)
        else:
            arr = idx[adv.index(d)]
            arr = reshape(arr, (1,) * (ni - arr.ndim) + arr.shape, stream=s)
            arr = reshape(arr, (1,) * nb + arr.shape + (1,) * len(after), stream=s)
        out.append(broadcast(arr, target, stream=s))
    return out, target


def _scatter_update(a: array, idx: Any, value: array, reduce: str) -> array:
    """Scatter ``value`` into ``a[idx]`` with ``reduce`` (none, sum, prod, max, min)."""
    s = resolve_stream(None)
    if a.ndim == 0:
        entries = _expand(a, idx) if not (isinstance(idx, tuple) and not idx) else ()
        base = broadcast(value, (), stream=s)
        return _scatter(a, [], base, (), reduce, s)
    entries = _expand(a, idx)
    x, stripped = _strip_none(a, entries, s)
    indices, target = _scatter_indices(x, stripped, s)
    upd = _fit(value, target, s)  # MLX: the update's shape is checked first
    _check_entries(a, entries)
    upd = reshape(upd, target + (1,) * x.ndim, stream=s)
    out = _scatter(x, indices, upd, tuple(range(x.ndim)), reduce, s)
    return reshape(out, a.shape, stream=s) if x.ndim != a.ndim else out


def _bool_mask(idx: Any) -> Any:
    """``idx`` as a boolean mask array when it is one (a bool, bool array or list of bools)."""
    if isinstance(idx, (bool, np.bool_)):
        return array(bool(idx))
    if isinstance(idx, list) and idx and all(isinstance(x, (bool, np.bool_)) for x in idx):
        return array(idx)
    if isinstance(idx, np.ndarray) and idx.dtype == np.bool_:
        return array(idx)
    if isinstance(idx, array) and idx.dtype == _dt.bool_:
        return idx
    return None


def _masked_update(a: array, mask: array, v: array, s) -> array:
    """``a[mask] = v`` (MLX's MaskedScatter): selected elements take ``v``'s values in order."""
    if mask.shape != a.shape[:mask.ndim]:
        raise ValueError("[masked_scatter] The boolean mask should have the same shape as the "
                         "beginning of the indexed array but the mask has shape "
                         f"{_fmt_shape(mask.shape)} and the array has shape {_fmt_shape(a.shape)}")
    m = reshape(mask, mask.shape + (1,) * (a.ndim - mask.ndim), stream=s)
    m = broadcast(m, a.shape, stream=s)
    if mask.ndim < a.ndim or v.size == 1:
        src = broadcast(reshape(v, (1,) * (a.ndim - v.ndim) + v.shape, stream=s)
                           if v.ndim < a.ndim else v, a.shape, stream=s)
    else:
        src = v
    prim = Primitive("MaskedScatter", s)
    return array._make([a.shape], [a.dtype], prim, [a, m, src])[0]


def setitem(a: array, idx: Any, value: Any) -> None:
    """``a[idx] = value``: ``a`` now refers to a new lazy array (SliceUpdate or Scatter)."""
    s = resolve_stream(None)
    v = cast(to_array(value, a.dtype), a.dtype, s)
    mask = _bool_mask(idx)
    if mask is not None:
        a._d = _masked_update(a, mask, v, s)._d
        return
    if idx is Ellipsis or (isinstance(idx, tuple) and len(idx) == 0):
        a._d = _fit(v, a.shape, s)._d
        return
    entries = _expand(a, idx) if not _is_int(idx) or a.ndim else None
    if entries is None:
        raise ValueError("too many indices for array: array is 0-dimensional")
    for e in entries:
        if isinstance(e, array):
            a._d = _scatter_update(a, idx, v, "none")._d
            return
    a._d = _basic_update(a, entries, v, "none", s)._d


def _basic_update(a: array, entries: tuple, v: array, reduce: str, s) -> array:
    """``a[entries]`` (ints, slices, None: no arrays) updated with ``v`` by ``reduce`` (none,
    sum, prod, max, min): a SliceUpdate of the window, MLX's ``slice_update[_add|...]``
    (replacing the whole array: just ``v`` broadcast)."""
    _check_entries(a, entries)
    shape = a._d.shape
    start, stop, step = [], [], []
    window, target = [], []  # the window's shape; the shape ``a[entries]`` has (None: 1)
    ax = 0
    for e in entries:
        if e is None:
            target.append(1)
            continue
        if e.__class__ is slice:
            b, f, st = e.indices(shape[ax])
            n = len(range(b, f, st))
            target.append(n)
        else:  # an int
            b, f = _int_bounds(e, shape[ax])
            st = n = 1
        start.append(b), stop.append(f), step.append(st), window.append(n)
        ax += 1
    window, target = tuple(window), tuple(target)
    upd = reshape_known(_fit(v, target, s), window, s)  # (target holds window's elements)
    if reduce == "none" and window == shape and step.count(1) == len(step):
        return upd
    return _slice_update(a, upd, start, stop, step, s, reduce)


def _update(a: array, idx: Any, v: array, reduce: str) -> array:
    """``x.at[idx]``'s update: a SliceUpdate for a basic index, as MLX's ``mlx_add_item``
    and its siblings (python/src/indexing.cpp), else a Scatter."""
    if not (isinstance(idx, tuple) and not idx) and idx is not Ellipsis and a.ndim:
        entries = _expand(a, idx)
        if not any(isinstance(e, array) for e in entries):
            return _basic_update(a, entries, v, reduce, resolve_stream(None))
    return _scatter_update(a, idx, v, reduce)


_NO_INDEX = object()  # ``x.at`` before it is indexed


class ArrayAt:
    """A helper object to apply updates at specific indices: ``x.at[idx].add(v)`` is an
    out-of-place scatter that accumulates repeated indices (``x.at`` is one, unindexed)."""

    __slots__ = ("_a", "_idx")

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("mlx.core.ArrayAt: no constructor defined!")

    @classmethod
    def _new(cls, a: array, idx: Any) -> "ArrayAt":
        at = object.__new__(cls)
        at._a, at._idx = a, idx
        return at

    def __getitem__(self, idx: Any) -> "ArrayAt":
        return ArrayAt._new(self._a, idx)

    def _indices(self) -> Any:
        if self._idx is _NO_INDEX:
            raise ValueError("Must give indices to array.at (e.g. `x.at[0].add(4)`).")
        return self._idx

    def _upd(self, v: Any) -> array:
        return cast(to_array(v, self._a.dtype), self._a.dtype, resolve_stream(None))

    def add(self, value: Any) -> array:
        """``x[idx] += value``, accumulating repeated indices."""
        return _update(self._a, self._indices(), self._upd(value), "sum")

    def subtract(self, value: Any) -> array:
        """``x[idx] -= value``, accumulating repeated indices."""
        from .ops import negative

        return _update(self._a, self._indices(), negative(self._upd(value)), "sum")

    def multiply(self, value: Any) -> array:
        """``x[idx] *= value``, accumulating repeated indices."""
        return _update(self._a, self._indices(), self._upd(value), "prod")

    def divide(self, value: Any) -> array:
        """``x[idx] /= value`` (a product with the reciprocal, cast to x's dtype)."""
        from .ops import divide

        recip = divide(array(1, self._a.dtype), self._upd(value))
        return _update(self._a, self._indices(), recip, "prod")

    def maximum(self, value: Any) -> array:
        """``x[idx] = maximum(x[idx], value)``."""
        return _update(self._a, self._indices(), self._upd(value), "max")

    def minimum(self, value: Any) -> array:
        """``x[idx] = minimum(x[idx], value)``."""
        return _update(self._a, self._indices(), self._upd(value), "min")


def at(a: array) -> ArrayAt:
    """``x.at``: out-of-place scatter updates, ``x.at[idx].add(v)``."""
    return ArrayAt._new(a, _NO_INDEX)
