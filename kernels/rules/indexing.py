"""Rules for slicing, gathering and scattering primitives.

Slice / DynamicSlice return views of their input. SliceUpdate and DynamicSliceUpdate write
into the eval loop's output buffer, their input's own where it was donated; Scatter and
ScatterAxis copy their input first and never write into it. Gather / Scatter and
their Axis forms raise IndexError for an index outside ``[-size, size)`` (numpy's message);
MLX reads or writes out of bounds there (garbage values, or a crash) instead.
"""

from __future__ import annotations

from ..primitives import INDEXING, define, same_shape
from .forms import assign as _assign
from .forms import scatter as _scatter_into
from .shape import export_axes_first


def _slices(start, stop, strides):
    # Bounds come normalised by ``slice.indices``: with a negative step, -1 means "before
    # index 0", which Python slicing would read as "the last element".
    out = []
    for b, e, s in zip(start, stop, strides):
        if s < 0 and b < 0:
            out.append(slice(0, 0))
            continue
        if s < 0 and e < 0:
            e = None
        out.append(slice(b, e, s))
    return tuple(out)


def _slice_strides(st: tuple, in_shape: tuple, out_shape: tuple, *, strides, **_) -> tuple:
    """Each axis's stride times its step (a basic slice is always a view)."""
    return tuple(s * k for s, k in zip(st, strides))


@define("Slice", family=INDEXING, view=True, view_strides=_slice_strides)
def slice_(xp, a, *, start_indices, end_indices, strides):
    return a[_slices(start_indices, end_indices, strides)]


_SLICE_REDUCE = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}


def _slice_update_label(name: str, kw: dict) -> str:
    """MLX prints a reducing update with its reduction: ``SliceUpdate Sum``."""
    return f"{name} {kw['reduce'].capitalize()}" if "reduce" in kw else name


def _updated(xp, a, update, out):
    """``(out, update)``: the array an update writes into and the update to write. ``out``
    is the eval loop's buffer where it gives one: ``a``'s own when nobody else holds ``a``
    (donated: only the window is written, as MLX's ``copy`` takes a donatable input's buffer
    in SliceUpdate / DynamicSliceUpdate, mlx/backend/cpu/primitives.cpp, so a KV cache's
    update costs the update, not the cache), else a fresh one ``a`` is copied into, or the
    update's own (same shape: the update is read first)."""
    if out is None:
        return a.copy(), update
    if not xp.may_share_memory(out, a):
        if xp.may_share_memory(out, update):
            update = update.copy()
        out[...] = a
    return out, update


@define("SliceUpdate", family=INDEXING, out=True, moves=True, label=_slice_update_label,
        shape=same_shape)
def slice_update(xp, a, update, *, start_indices, end_indices, strides, reduce="none", out=None):
    """The slice of ``a`` replaced by ``update``, or (``reduce``: MLX's SliceUpdate Sum / Prod
    / Max / Min) combined with it elementwise (into ``out``: ``_updated``)."""
    out, update = _updated(xp, a, update, out)
    window = _slices(start_indices, end_indices, strides)
    if reduce == "none":
        out[window] = update
    else:
        out[window] = getattr(xp, _SLICE_REDUCE[reduce])(out[window], update)
    return out


def _dynamic_window(a, start, axes, sizes):
    """A window of ``sizes`` (one per axis) starting at ``start`` on ``axes``, 0 elsewhere."""
    idx = [slice(0, size) for size in sizes]
    for ax, st in zip(axes, start.reshape(-1).tolist()):
        st = int(st)
        st = st + a.shape[ax] if st < 0 else st
        st = min(max(st, 0), a.shape[ax] - sizes[ax])  # clamp the window into the array
        idx[ax] = slice(st, st + sizes[ax])
    return tuple(idx)


@define("DynamicSlice", family=INDEXING, moves=True)
def dynamic_slice(xp, a, start, *, axes, slice_size):
    return a[_dynamic_window(a, start, axes, slice_size)]


@define("DynamicSliceUpdate", family=INDEXING, out=True, moves=True)
def dynamic_slice_update(xp, a, update, start, *, axes, out=None):
    """``update`` written at ``start`` on ``axes`` of ``a`` (into ``out``: ``_updated``)."""
    window = _dynamic_window(a, start, axes, update.shape)
    out, update = _updated(xp, a, update, out)
    out[window] = update
    return out


def out_of_bounds(index: int, size: int, axis: int) -> IndexError:
    """numpy's error for an index outside ``[-size, size)``."""
    return IndexError(f"index {index} is out of bounds for axis {axis} with size {size}")


def check_bounds(ind, size: int, axis: int) -> None:
    """Raise ``out_of_bounds`` for the first value of the integer array ``ind`` outside
    ``[-size, size)`` (``axis``: the indexed array's axis, for the message)."""
    bad = ind >= size
    if ind.dtype.kind != "u":
        bad |= ind < -size
    if bool(bad.any()):
        raise out_of_bounds(int(ind[bad][0]), size, axis)


def _wrapped(xp, ind, size, axis):
    """``ind`` as int64 with negative values counted from the end, after ``check_bounds``
    (without it, numpy would wrap -4 of size 3 a second time, as -1); indices all in
    ``[0, size)`` (the common case, two reductions tell) index as they are."""
    if ind.size and bool((ind.min() >= 0) & (ind.max() < size)):
        return ind
    check_bounds(ind, size, axis)
    ind = ind.astype(xp.int64)
    return xp.where(ind < 0, ind + size, ind)


def _grid(xp, shape, indices, axes, slice_sizes):
    """Advanced-index tuple selecting, for each index position, a window of ``slice_sizes``
    whose start along ``axes[k]`` is ``indices[k]`` (negative starts count from the end)."""
    ndim = len(shape)
    ishape = indices[0].shape if indices else ()
    ni = len(ishape)
    grid = []
    for d in range(ndim):
        win = xp.arange(slice_sizes[d]).reshape((1,) * ni + tuple(
            slice_sizes[d] if j == d else 1 for j in range(ndim)))
        if d in axes:
            ind = _wrapped(xp, indices[axes.index(d)], shape[d], d)
            grid.append(ind.reshape(ishape + (1,) * ndim) + win)
        else:
            grid.append(win)
    return tuple(grid)


def _gather_shape(shapes: list, *, slice_sizes, **_) -> list:
    """The indices' shape, then one window of ``slice_sizes``."""
    idx = shapes[1] if len(shapes) > 1 else ()
    return [tuple(idx) + tuple(slice_sizes)]


@define("Gather", family=INDEXING, moves=True, kernel="gather", export=export_axes_first,
        shape=_gather_shape)
def gather(xp, a, *indices, axes, slice_sizes):
    # Output: indices' shape followed by one window of ``slice_sizes``.
    return a[_grid(xp, a.shape, list(indices), list(axes), slice_sizes)]


_SCATTER = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}


@define("Scatter", family=INDEXING, moves=True, shape=same_shape)
def scatter(xp, a, *rest, axes, reduce):
    *indices, updates = rest
    sizes = updates.shape[len(updates.shape) - a.ndim:]
    grid = _grid(xp, a.shape, indices, list(axes), sizes)
    out = a.copy()
    if reduce == "none":
        _assign(xp, out, grid, updates)  # the last of repeated positions wins, as MLX's loop
    else:
        # ufunc.at combines repeated indices (numpy's; CuPy's lacks prod: forms.scatter)
        _scatter_into(xp, _SCATTER[reduce], out, grid, updates)
    return out


def _axis_grid(xp, a_shape, indices, axis):
    ind = _wrapped(xp, indices, a_shape[axis], axis)
    grid = []
    for d in range(len(a_shape)):
        if d == axis:
            grid.append(ind)
        else:
            shp = [1] * len(a_shape)
            shp[d] = indices.shape[d]
            grid.append(xp.arange(indices.shape[d]).reshape(shp))
    return tuple(grid)


@define("GatherAxis", family=INDEXING, moves=True, kernel="gather_axis",
        shape=lambda shapes, **_: [tuple(shapes[1])])
def gather_axis(xp, a, indices, *, axis):
    return a[_axis_grid(xp, a.shape, indices, axis)]


@define("ScatterAxis", family=INDEXING, moves=True, kernel="scatter_axis", shape=same_shape)
def scatter_axis(xp, a, indices, updates, *, axis, reduce):
    out = a.copy()
    grid = _axis_grid(xp, a.shape, indices, axis)
    if reduce == "none":
        _assign(xp, out, grid, updates)  # the last of repeated positions wins, as MLX's loop
    else:
        _scatter_into(xp, _SCATTER[reduce], out, grid, updates)
    return out


@define("MaskedScatter", family=INDEXING, moves=True)
def masked_scatter(xp, a, mask, src):
    # The k-th selected element (row-major) takes the k-th element of the flattened source.
    out = a.copy()
    count = int(mask.sum())
    flat = src.reshape(-1)
    if flat.size < count:
        raise RuntimeError("[MaskedScatter::eval_cpu] Source does not have enough elements for mask.")
    out[mask] = flat[:count]
    return out
