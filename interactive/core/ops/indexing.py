"""Indexing ops: take, take_along_axis, put_along_axis, slice, slice_update, diag,
diagonal, trace; and the Slice / Gather / Scatter helpers that ``a[idx]`` builds on.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from tapescope.kernels.rules.indexing import check_bounds, out_of_bounds

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import Primitive
from .convert import broadcast, broadcast_arrays, broadcast_shapes, cast, _fmt_shape, to_array
from .shape import _axis, flatten, reshape, squeeze, transpose

__all__ = ["take", "take_along_axis", "put_along_axis", "slice", "slice_update", "diag",
           "diagonal", "trace"]


_builtin_slice = slice


# -- primitive helpers (used by array indexing too) -----------------------------------------
def _slice_shape(start: Sequence[int], stop: Sequence[int], strides: Sequence[int]) -> tuple:
    return tuple([len(range(b, e, st)) for b, e, st in zip(start, stop, strides)])


def _slice(a: array, start: Sequence[int], stop: Sequence[int], strides: Sequence[int],
           s) -> array:
    """Record a static Slice (a view); bounds are already normalised as ``slice.indices``."""
    start, stop, strides = tuple(map(int, start)), tuple(map(int, stop)), tuple(map(int, strides))
    shape = _slice_shape(start, stop, strides)
    d = a._d
    if shape == d.shape and strides.count(1) == len(strides):
        return a
    prim = Primitive("Slice", s, start_indices=start, end_indices=stop, strides=strides)
    return array._make1(shape, d.dtype, prim, [a])


def _slice_update(a: array, update: array, start: Sequence[int], stop: Sequence[int],
                  strides: Sequence[int], s, reduce: str = "none") -> array:
    """Record a SliceUpdate writing ``update`` (broadcast, cast) into the slice of ``a``, or
    with ``reduce`` (sum, prod, max, min) combining it with the slice (MLX's SliceUpdate
    Sum / Prod / Max / Min; the parameter is recorded only then)."""
    start, stop, strides = tuple(map(int, start)), tuple(map(int, stop)), tuple(map(int, strides))
    shape = _slice_shape(start, stop, strides)
    d = a._d
    update = cast(update, d.dtype, s)
    if update._d.shape != shape:
        update = broadcast(update, shape, stream=s)
    if reduce == "none":
        prim = Primitive("SliceUpdate", s, start_indices=start, end_indices=stop, strides=strides)
    else:
        prim = Primitive("SliceUpdate", s, start_indices=start, end_indices=stop, strides=strides,
                         reduce=reduce)
    return array._make1(d.shape, d.dtype, prim, [a, update])


def _check_indices(indices: Sequence[array]) -> None:
    for i in indices:
        if not _dt.is_integer(i.dtype):
            raise ValueError("[gather] Got indices with invalid dtype. Indices must be integral.")


def _check_index(index: Any, size: int, axis: int) -> None:
    """IndexError (numpy's message) for an index outside ``[-size, size)``: an int, or an
    integer array whose values are already computed on the host. A lazy index array, or one
    on a device (reading it here would wait for the device), is checked when its Gather /
    Scatter runs (MLX reads or writes out of bounds instead: garbage, or a crash)."""
    if not isinstance(index, array):
        if not -size <= index < size:
            raise out_of_bounds(index, size, axis)
    elif (index._d.node is None and type(index._d.data) is np.ndarray
          and _dt.is_integer(index.dtype)):
        check_bounds(index._d.data, size, axis)


def _gather(a: array, indices: list, axes: Sequence[int], slice_sizes: Sequence[int], s) -> array:
    """Record a Gather: output shape is the indices' broadcast shape + ``slice_sizes``."""
    _check_indices(indices)
    indices = list(broadcast_arrays(*indices, stream=s)) if len(indices) > 1 else list(indices)
    ishape = indices[0].shape if indices else ()
    prim = Primitive("Gather", s, axes=tuple(axes), slice_sizes=tuple(int(x) for x in slice_sizes))
    return array._make([ishape + tuple(slice_sizes)], [a.dtype], prim, [a] + indices)[0]


def _scatter(a: array, indices: list, updates: array, axes: Sequence[int], reduce: str,
             s) -> array:
    """Record a Scatter (``reduce`` none/sum/prod/max/min); updates: indices' shape + window."""
    _check_indices(indices)
    indices = list(broadcast_arrays(*indices, stream=s)) if len(indices) > 1 else list(indices)
    updates = cast(updates, a.dtype, s)
    prim = Primitive("Scatter", s, axes=tuple(axes), reduce=reduce)
    return array._make([a.shape], [a.dtype], prim, [a] + indices + [updates])[0]


# -- public ops --------------------------------------------------------------------------------
def take(a: array, /, indices: Any, axis: Optional[int] = None, *,
         stream: StreamOrDevice = None) -> array:
    """Elements of ``a`` at ``indices`` along ``axis`` (of the flattened array when None)."""
    a = to_array(a)
    s = resolve_stream(stream)
    if axis is None:
        a, axis = flatten(a, stream=s), 0
    ax = _axis(axis, a.ndim)
    if ax is None:
        raise IndexError(f"[take] Received invalid axis {axis} for array with {a.ndim} dimensions.")
    if isinstance(indices, int):
        if a.size == 0:
            raise ValueError("[take] Cannot do a non-empty take from an array with zero elements.")
        # As MLX: the slice [i, i + 1) with Python's bounds, so an index past either end
        # selects nothing and Squeeze raises (MLX's ValueError, not numpy's IndexError).
        start, stop = [0] * a.ndim, list(a.shape)
        start[ax], stop[ax], _ = _builtin_slice(indices, indices + 1).indices(a.shape[ax])
        stop[ax] = max(stop[ax], start[ax])
        return squeeze(_slice(a, start, stop, [1] * a.ndim, s), ax, stream=s)
    idx = to_array(indices)
    if idx.dtype == _dt.bool_:
        raise ValueError("[Gather] Boolean indices not supported.")
    _check_indices([idx])
    if a.shape[ax] == 0 and idx.size:
        raise ValueError("[take] Cannot do a non-empty take from an empty axis.")
    _check_index(idx, a.shape[ax], ax)
    sizes = list(a.shape)
    sizes[ax] = 1
    g = _gather(a, [idx], (ax,), sizes, s)
    k = idx.ndim
    if ax > 0:  # numpy places the indices' axes where ``axis`` was
        perm = list(range(k, k + ax)) + list(range(k)) + list(range(k + ax, k + a.ndim))
        g = transpose(g, perm, stream=s)
    return squeeze(g, k + ax, stream=s)


def take_along_axis(a: array, /, indices: array, axis: Optional[int] = -1, *,
                    stream: StreamOrDevice = None) -> array:
    """Values of ``a`` at ``indices`` along ``axis`` (indices broadcast on the other axes)."""
    a, indices = to_array(a), to_array(indices)
    s = resolve_stream(stream)
    if axis is None:  # MLX flattens the array only
        return take_along_axis(flatten(a, stream=s), indices, 0, stream=s)
    ax = _along_axis("take_along_axis", "GatherAxis::eval_cpu] Cannot gather", a, indices, axis)
    a, idx = _broadcast_except(ax, s, a, indices)
    _check_index(indices, a.shape[ax], ax)  # (its known values; broadcasting makes it lazy)
    prim = Primitive("GatherAxis", s, axis=ax)
    return array._make([idx.shape], [a.dtype], prim, [a, idx])[0]


def _along_axis(op: str, kernel_error: str, a: array, indices: array, axis: int,
                runs: bool = True) -> int:
    """The normalised ``axis`` of take/put_along_axis, after MLX's checks (and errors; its
    kernel's index-type error only where a kernel ``runs``: MLX never evaluates an empty
    scatter)."""
    ax = _axis(axis, a.ndim)
    if ax is None:
        raise IndexError(f"[{op}] Axis {axis} is out of bounds for array with {a.ndim} dimensions.")
    if indices.ndim != a.ndim:
        raise ValueError(f"[{op}] Indices of dimension {indices.ndim} does not match "
                         f"array of dimension {a.ndim}.")
    if runs and not _dt.is_integer(indices.dtype):
        raise RuntimeError(f"[{kernel_error} with indices type.")
    return ax


def _broadcast_except(ax: int, s, *arrays: array) -> tuple:
    """Broadcast ``arrays`` (of one rank) against each other on every axis but ``ax``."""
    b = list(broadcast_shapes(*[x.shape[:ax] + x.shape[ax + 1:] for x in arrays]))
    return tuple(broadcast(x, tuple(b[:ax]) + (x.shape[ax],) + tuple(b[ax:]), stream=s)
                 for x in arrays)


def put_along_axis(a: array, /, indices: array, values: Any, axis: Optional[int] = None, *,
                   stream: StreamOrDevice = None) -> array:
    """A copy of ``a`` with ``values`` written at ``indices`` along ``axis``."""
    a, indices = to_array(a), to_array(indices)
    s = resolve_stream(stream)
    if axis is None:
        out = put_along_axis(flatten(a, stream=s), indices, values, 0, stream=s)
        return reshape(out, a.shape, stream=s)
    ax = _along_axis("put_along_axis", "ScatterAxis::eval_cpu] Cannot scatter", a, indices, axis,
                     runs=a.size > 0)
    if a.size == 0:
        return a
    # As MLX's scatter_axis: values lose leading size-1 axes beyond the indices' rank, are
    # broadcast with the indices, then all three broadcast together except on ``axis``.
    upd = cast(to_array(values, a.dtype), a.dtype, s)
    if upd.ndim > indices.ndim:
        upd = squeeze(upd, tuple(range(upd.ndim - indices.ndim)), stream=s)
    idx, upd = broadcast_arrays(indices, upd, stream=s)
    a, idx, upd = _broadcast_except(ax, s, a, idx, upd)
    _check_index(indices, a.shape[ax], ax)  # (its known values; broadcasting makes it lazy)
    prim = Primitive("ScatterAxis", s, axis=ax, reduce="none")
    return array._make([a.shape], [a.dtype], prim, [a, idx, upd])[0]


def _dyn_start(start_indices: Any, axes: Sequence[int], a: array) -> tuple:
    start = to_array(start_indices)
    if not _dt.is_integer(start.dtype):
        raise ValueError(f"[slice] Start indices must be integers, got type {start.dtype.name}.")
    norm = []
    for ax in axes:
        n = _axis(ax, a.ndim)
        if n is None:
            raise IndexError(f"[slice] Invalid axis {ax} for array with dimension {a.ndim}.")
        norm.append(n)
    return start, tuple(norm)


def slice(a: array, start_indices: array, axes: Sequence[int], slice_size: Sequence[int], *,
          stream: StreamOrDevice = None) -> array:
    """A window of ``slice_size`` starting at (array) ``start_indices`` on ``axes``."""
    a = to_array(a)
    sizes = tuple(int(x) for x in slice_size)
    if len(sizes) != a.ndim:
        raise ValueError(f"[slice] Invalid slice size for array with {a.ndim} dimensions.")
    start, axes = _dyn_start(start_indices, axes, a)
    if any(z < 0 or z > d for z, d in zip(sizes, a.shape)):
        raise ValueError(f"[slice] Invalid slice size {_fmt_shape(sizes)} for array with shape "
                         f"{_fmt_shape(a.shape)}.")
    s = resolve_stream(stream)
    prim = Primitive("DynamicSlice", s, axes=axes, slice_size=sizes)
    return array._make([sizes], [a.dtype], prim, [a, start])[0]


def slice_update(a: array, update: array, start_indices: array, axes: Sequence[int], *,
                 stream: StreamOrDevice = None) -> array:
    """A copy of ``a`` with ``update`` written at (array) ``start_indices`` on ``axes``."""
    a, update = to_array(a), to_array(update)
    start, axes = _dyn_start(start_indices, axes, a)
    if update.ndim > a.ndim or any(u > d for u, d in zip(update.shape[::-1], a.shape[::-1])):
        raise ValueError(f"[broadcast_shapes] Shapes {_fmt_shape(update.shape)} and "
                         f"{_fmt_shape(a.shape)} cannot be broadcast.")
    s = resolve_stream(stream)
    shape = (1,) * (a.ndim - update.ndim) + update.shape
    update = cast(reshape(update, shape, stream=s), a.dtype, s)
    prim = Primitive("DynamicSliceUpdate", s, axes=axes)
    return array._make([a.shape], [a.dtype], prim, [a, update, start])[0]


def diagonal(a: array, offset: int = 0, axis1: int = 0, axis2: int = 1,
             stream: StreamOrDevice = None) -> array:
    """The ``offset`` diagonal over ``axis1``/``axis2``, as the last axis of the result."""
    a = to_array(a)
    if a.ndim < 2:
        raise ValueError(f"[diagonal] Array must have at least two dimensions, but got {a.ndim} "
                         "dimensions.")
    ax1, ax2 = _axis(axis1, a.ndim), _axis(axis2, a.ndim)
    if ax1 is None:
        raise IndexError(f"[diagonal] Invalid axis1 {axis1} for array with {a.ndim} dimensions.")
    if ax2 is None:
        raise IndexError(f"[diagonal] Invalid axis2 {axis2} for array with {a.ndim} dimensions.")
    if ax1 == ax2:
        raise ValueError("[diagonal] axis1 and axis2 cannot be the same axis")
    from .creation import arange

    s = resolve_stream(stream)
    r0, c0 = max(0, -offset), max(0, offset)
    length = max(0, min(a.shape[ax1] - r0, a.shape[ax2] - c0))
    if length == 0:
        r0 = c0 = 0
    rows = arange(r0, r0 + length, stream=s)
    cols = arange(c0, c0 + length, stream=s)
    sizes = list(a.shape)
    sizes[ax1] = sizes[ax2] = 1
    g = _gather(a, [rows, cols], (ax1, ax2), sizes, s)
    g = squeeze(g, (ax1 + 1, ax2 + 1), stream=s)
    return transpose(g, list(range(1, g.ndim)) + [0], stream=s) if g.ndim > 1 else g


def diag(a: array, /, k: int = 0, *, stream: StreamOrDevice = None) -> array:
    """The ``k``-th diagonal of a 2-D array, or a 2-D array with a 1-D array on it."""
    a = to_array(a)
    if a.ndim == 2:
        return diagonal(a, k, 0, 1, stream=stream)
    if a.ndim != 1:
        raise ValueError(f"[diag] array must be 1-D or 2-D, got array with {a.ndim} dimensions.")
    from .creation import arange, zeros

    s = resolve_stream(stream)
    n = a.shape[0] + abs(k)
    out = zeros((n, n), a.dtype, stream=s)
    if a.size == 0:
        return out
    rows = arange(max(0, -k), max(0, -k) + a.shape[0], stream=s)
    cols = arange(max(0, k), max(0, k) + a.shape[0], stream=s)
    return _scatter(out, [rows, cols], reshape(a, (a.shape[0], 1, 1), stream=s), (0, 1), "none", s)


def trace(a: array, /, offset: int = 0, axis1: int = 0, axis2: int = 1,
          dtype: Optional[_dt.Dtype] = None, *, stream: StreamOrDevice = None) -> array:
    """The sum of the ``offset`` diagonal over ``axis1``/``axis2``."""
    from .. import ops

    a = to_array(a)
    if a.ndim < 2:
        raise ValueError(f"[trace] Array must have at least two dimensions, but got {a.ndim} "
                         "dimensions.")
    s = resolve_stream(stream)
    out = ops.sum(diagonal(a, offset, axis1, axis2, stream=s), -1, stream=s)
    return cast(out, dtype, s) if dtype is not None else out
