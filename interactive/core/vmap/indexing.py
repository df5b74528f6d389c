"""Batching rules of the indexing primitives (mlx/primitives.cpp): Slice / SliceUpdate /
DynamicSlice / DynamicSliceUpdate take the whole mapped axis; Gather and Scatter add an
``arange`` index over the mapped axis when both the array and the indices are mapped;
GatherAxis / ScatterAxis line the mapped axes up; MaskedScatter folds the mapped axis into
the first. Start indices of the dynamic slices cannot be mapped (MLX's errors)."""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from ..autodiff.registry import record1
from ..device import resolve_stream
from ..ops.indexing import _broadcast_except, _gather
from .registry import defvmap, move_to, shift


def _ins(seq, at: int, v) -> tuple:
    seq = list(seq)
    seq.insert(at, v)
    return tuple(seq)


def _slice(inputs, vaxes, primals, outputs, *, start_indices, end_indices, strides):
    x, ax = inputs[0], vaxes[0]
    if ax < 0:
        return [record1("Slice", [x], outputs[0].shape, x.dtype, start_indices=start_indices,
                        end_indices=end_indices, strides=strides)], [-1]
    shape = _ins(outputs[0].shape, ax, x.shape[ax])
    return [record1("Slice", [x], shape, x.dtype, start_indices=_ins(start_indices, ax, 0),
                    end_indices=_ins(end_indices, ax, x.shape[ax]),
                    strides=_ins(strides, ax, 1))], [ax]


def _common(src, upd, src_ax, upd_ax):
    """Both operands of an update mapped on one axis (MLX: broadcast the unmapped source,
    expand the unmapped update)."""
    if src_ax == -1:
        src = mx.expand_dims(src, upd_ax)
        shape = list(src.shape)
        shape[upd_ax] = upd.shape[upd_ax]
        src = mx.broadcast_to(src, tuple(shape))
        src_ax = upd_ax
    if upd_ax == -1:  # (broadcast too: a dynamic update's extent is the update's shape)
        upd = mx.expand_dims(upd, src_ax)
        shape = list(upd.shape)
        shape[src_ax] = src.shape[src_ax]
        upd = mx.broadcast_to(upd, tuple(shape))
        upd_ax = src_ax
    return src, move_to(upd, upd_ax, src_ax), src_ax


def _slice_update(inputs, vaxes, primals, outputs, *, start_indices, end_indices, strides,
                  **reduce):
    if vaxes[0] < 0 and vaxes[1] < 0:
        return [record1("SliceUpdate", list(inputs), inputs[0].shape, inputs[0].dtype,
                        start_indices=start_indices, end_indices=end_indices,
                        strides=strides, **reduce)], [-1]
    src, upd, ax = _common(inputs[0], inputs[1], vaxes[0], vaxes[1])
    return [record1("SliceUpdate", [src, upd], src.shape, src.dtype,
                    start_indices=_ins(start_indices, ax, 0),
                    end_indices=_ins(end_indices, ax, src.shape[ax]),
                    strides=_ins(strides, ax, 1), **reduce)], [ax]


def _dynamic_slice(inputs, vaxes, primals, outputs, *, axes, slice_size):
    if vaxes[1] >= 0:
        raise ValueError("[DynamicSlice::vmap] vmap over start indices not yet supported.")
    x, start = inputs
    vax = vaxes[0]
    new_axes = tuple(shift(a, vax) for a in axes)
    sizes = _ins(slice_size, vax, x.shape[vax]) if vax >= 0 else tuple(slice_size)
    return [record1("DynamicSlice", [x, start], sizes, x.dtype, axes=new_axes,
                    slice_size=sizes)], [vax]


def _dynamic_slice_update(inputs, vaxes, primals, outputs, *, axes):
    if vaxes[2] >= 0:
        raise RuntimeError("[DynamicSliceUpdate::vmap] vmap over start indices not yet "
                           "supported.")
    if vaxes[0] < 0 and vaxes[1] < 0:
        return [record1("DynamicSliceUpdate", list(inputs), inputs[0].shape, inputs[0].dtype,
                        axes=axes)], [-1]
    src, upd, ax = _common(inputs[0], inputs[1], vaxes[0], vaxes[1])
    new_axes = tuple(shift(a, ax) for a in axes)
    return [record1("DynamicSliceUpdate", [src, upd, inputs[2]], src.shape, src.dtype,
                    axes=new_axes)], [ax]


def _gather_rule(inputs, vaxes, primals, outputs, *, axes, slice_sizes):
    src, indices = inputs[0], list(inputs[1:])
    gather_axes, sizes = list(axes), list(slice_sizes)
    src_mapped = vaxes[0] >= 0
    mapped_idx = [a for a in vaxes[1:] if a >= 0]
    out_ax = mapped_idx[0] if mapped_idx else (vaxes[0] if src_mapped else -1)
    if mapped_idx:  # every index array with its mapped axis at out_ax
        for i, a in enumerate(vaxes[1:]):
            if a >= 0:
                indices[i] = move_to(indices[i], a, out_ax)
            else:
                indices[i] = mx.expand_dims(indices[i], out_ax)
    idx_dims = indices[0].ndim if indices else 0
    if src_mapped:
        gather_axes = [a + 1 if a >= vaxes[0] else a for a in gather_axes]
        if mapped_idx:  # index the mapped axis of the source by the slice number
            n = src.shape[vaxes[0]]
            shape = [1] * idx_dims
            shape[out_ax] = n
            indices.append(mx.reshape(mx.arange(n), tuple(shape)))
            sizes.insert(vaxes[0], 1)
            gather_axes.append(vaxes[0])
        else:
            sizes.insert(out_ax, src.shape[out_ax])
            out_ax += idx_dims
    out = _gather(src, indices, gather_axes, sizes, resolve_stream(None))
    if src_mapped and mapped_idx:
        out = mx.squeeze(out, idx_dims + vaxes[0])
    return [out], [out_ax]


def _scatter_rule(inputs, vaxes, primals, outputs, *, axes, reduce):
    ins = list(inputs)
    scatter_axes = list(axes)
    src_ax = vaxes[0]
    first = next((i for i, a in enumerate(vaxes) if a >= 0), None)
    if first is None:
        return [record1("Scatter", ins, ins[0].shape, ins[0].dtype, axes=tuple(axes),
                        reduce=reduce)], [-1]
    size = ins[first].shape[vaxes[first]]
    if src_ax < 0:
        src_ax = 0
        ins[0] = mx.repeat(mx.expand_dims(ins[0], 0), size, 0)
    for i in range(1, len(vaxes) - 1):  # the index arrays: mapped axis first
        if vaxes[i] >= 0:
            ins[i] = move_to(ins[i], vaxes[i], 0)
        else:
            ins[i] = mx.repeat(mx.expand_dims(ins[i], 0), size, 0)
        if scatter_axes[i - 1] >= src_ax:
            scatter_axes[i - 1] += 1
    idx_ndim = ins[1].ndim
    slot = mx.reshape(mx.arange(size, dtype=ins[1].dtype), (size,) + (1,) * (idx_ndim - 1))
    ins.insert(len(ins) - 1, mx.broadcast_to(slot, ins[1].shape))
    scatter_axes.append(src_ax)
    # the updates: the slice number first, a window of 1 on the source's mapped axis
    # (MLX puts that window axis first, which is the same place when src_ax is 0)
    upd, uax = ins[-1], vaxes[-1]
    if uax < 0:
        upd = mx.repeat(mx.expand_dims(upd, [0, idx_ndim + src_ax]), size, 0)
    else:
        upd = mx.moveaxis(upd, uax, 0)
        upd = mx.expand_dims(upd, idx_ndim + src_ax)
    ins[-1] = upd
    return [record1("Scatter", ins, ins[0].shape, ins[0].dtype, axes=tuple(scatter_axes),
                    reduce=reduce)], [src_ax]


def _aligned(inputs, vaxes):
    """The inputs with their mapped axes at the first mapped one's place (MLX's GatherAxis /
    ScatterAxis: unmapped inputs get a 1-axis there, broadcast by the op)."""
    out_ax = next((a for a in vaxes if a >= 0), -1)
    if out_ax < 0:
        return list(inputs), -1
    return [move_to(x, a, out_ax) if a >= 0 else mx.expand_dims(x, out_ax)
            for x, a in zip(inputs, vaxes)], out_ax


def _gather_axis(inputs, vaxes, primals, outputs, *, axis):
    (a, idx), out_ax = _aligned(inputs, vaxes)
    return [mx.take_along_axis(a, idx, shift(axis, out_ax))], [out_ax]


def _scatter_axis(inputs, vaxes, primals, outputs, *, axis, reduce):
    (a, idx, upd), out_ax = _aligned(inputs, vaxes)
    ax = shift(axis, out_ax)
    idx, upd = mx.broadcast_arrays(idx, upd)
    a, idx, upd = _broadcast_except(ax, resolve_stream(None), a, idx, upd)
    return [record1("ScatterAxis", [a, idx, upd], a.shape, a.dtype, axis=ax,
                    reduce=reduce)], [out_ax]


def _masked_scatter(inputs, vaxes, primals, outputs):
    """Slice b's k-th selected element takes the k-th element of slice b's source (MLX's
    kernel treats axis 0 as the batch, mlx/backend/cpu/masked_scatter.cpp); our MaskedScatter
    has no batch axis, so the batch is a cumulative count, a gather and a select."""
    first = next((i for i, a in enumerate(vaxes) if a >= 0), None)
    if first is None:
        return [record1("MaskedScatter", list(inputs), inputs[0].shape, inputs[0].dtype)], [-1]
    size = inputs[first].shape[vaxes[first]]
    flat = []
    for x, a in zip(inputs, vaxes):
        if a > 0:
            x = mx.moveaxis(x, a, 0)
        elif a < 0:
            x = mx.broadcast_to(mx.expand_dims(x, 0), (size,) + tuple(x.shape))
        flat.append(mx.reshape(x, (size, -1)))
    a, mask, src = flat
    n_src = src.shape[1]
    pos = mx.subtract(mx.cumsum(mask.astype(_dt.int32), axis=1), 1)
    pos = mx.clip(pos, 0, max(n_src - 1, 0))
    vals = mx.take_along_axis(src, pos, axis=1) if n_src else a
    out = mx.where(mask, vals, a)
    return [mx.reshape(out, (size,) + tuple(outputs[0].shape))], [0]


defvmap("Slice", _slice)
defvmap("SliceUpdate", _slice_update)
defvmap("DynamicSlice", _dynamic_slice)
defvmap("DynamicSliceUpdate", _dynamic_slice_update)
defvmap("Gather", _gather_rule)
defvmap("Scatter", _scatter_rule)
defvmap("GatherAxis", _gather_axis)
defvmap("ScatterAxis", _scatter_axis)
defvmap("MaskedScatter", _masked_scatter)
