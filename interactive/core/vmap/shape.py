"""Batching rules of the layout primitives (mlx/primitives.cpp): Reshape moves the mapped
axis first and reshapes to it; ExpandDims, Squeeze, Flatten, Unflatten, Transpose,
Broadcast, Concatenate, Split and Pad shift their axes past the mapped one; Copy,
Contiguous and View keep it where it is. AsStrided has no rule in MLX."""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from ..autodiff.registry import record1
from .registry import defvmap, move_to, shift, without


def _reshape(inputs, vaxes, primals, outputs, *, shape, **_):
    x, ax = inputs[0], vaxes[0]
    if ax >= 0:
        return [mx.reshape(move_to(x, ax, 0), (x.shape[ax],) + tuple(shape))], [0]
    return [mx.reshape(x, tuple(shape))], [ax]


def _axes_around(axes, ax: int, step: int) -> tuple:
    """``axes`` of the unbatched op moved past the mapped axis ``ax``, and where the mapped
    axis ends up when each axis before it is inserted (``step`` 1) or removed (-1)."""
    new, out = [], ax
    for s in axes:
        if s >= ax:
            new.append(s + 1)
        else:
            new.append(s)
            out += step
    return new, out


def _expand_dims(inputs, vaxes, primals, outputs, *, axes, **_):
    if vaxes[0] < 0:
        return [mx.expand_dims(inputs[0], list(axes))], [-1]
    new, ax = _axes_around(axes, vaxes[0], 1)
    return [mx.expand_dims(inputs[0], new)], [ax]


def _squeeze(inputs, vaxes, primals, outputs, *, axes, **_):
    if vaxes[0] < 0:
        return [mx.squeeze(inputs[0], list(axes))], [-1]
    new, ax = _axes_around(axes, vaxes[0], -1)
    return [mx.squeeze(inputs[0], new)], [ax]


def _flatten(inputs, vaxes, primals, outputs, *, start_axis, end_axis, **_):
    x, ax = inputs[0], vaxes[0]
    start, end = start_axis, end_axis
    if ax < 0:
        pass
    elif ax < start:
        start, end = start + 1, end + 1
    elif ax <= end:
        start, end = start + 1, end + 1
        x, ax = mx.moveaxis(x, ax, 0), 0
    else:
        ax -= end - start
    return [mx.flatten(x, start, end)], [ax]


def _unflatten(inputs, vaxes, primals, outputs, *, axis, shape, **_):
    ax = vaxes[0]
    k = len(shape) - primals[0].ndim + 1  # how many axes ``axis`` becomes
    sizes = tuple(shape[axis:axis + k])
    if ax < 0:
        pass
    elif ax <= axis:
        axis += 1
    else:
        ax += k - 1
    return [mx.unflatten(inputs[0], axis, sizes)], [ax]


def _transpose(inputs, vaxes, primals, outputs, *, axes):
    v = vaxes[0]
    perm = list(axes)
    if v >= 0:
        perm = [d + 1 if d >= v else d for d in axes]
        perm.insert(v, v)
    return [mx.transpose(inputs[0], perm)], [v]


def _broadcast(inputs, vaxes, primals, outputs, *, shape):
    x, ax = inputs[0], vaxes[0]
    shape = list(shape)
    if ax >= 0:
        diff = len(shape) - x.ndim + 1
        shape.insert(ax + diff, x.shape[ax])
        ax += diff
    return [mx.broadcast_to(x, tuple(shape))], [ax]


def _concatenate(inputs, vaxes, primals, outputs, *, axis):
    first = next((i for i, a in enumerate(vaxes) if a >= 0), None)
    if first is None:
        return [mx.concatenate(list(inputs), axis)], [-1]
    out_ax = vaxes[first]
    cat = shift(axis, out_ax)
    cat_shape = list(inputs[first].shape)
    parts = []
    for x, a in zip(inputs, vaxes):
        if a >= 0:
            parts.append(move_to(x, a, out_ax))
        else:
            cat_shape[cat] = x.shape[axis]
            parts.append(mx.broadcast_to(mx.expand_dims(x, out_ax), tuple(cat_shape)))
    return [mx.concatenate(parts, cat)], [out_ax]


def _split(inputs, vaxes, primals, outputs, *, indices, axis):
    outs = mx.split(inputs[0], list(indices), shift(axis, vaxes[0]))
    return list(outs), [vaxes[0]] * len(outs)


def _pad(inputs, vaxes, primals, outputs, *, axes, low_pad_size, high_pad_size):
    if vaxes[1] >= 0:
        raise ValueError("[Pad::vmap] Vmap over padding value is not supported.")
    x, ax = inputs[0], vaxes[0]
    pad_axes = tuple(shift(a, ax) for a in axes)
    shape = list(x.shape)
    for a, lo, hi in zip(pad_axes, low_pad_size, high_pad_size):
        shape[a] += lo + hi
    return [record1("Pad", [x, inputs[1]], tuple(shape), x.dtype, axes=pad_axes,
                    low_pad_size=tuple(low_pad_size), high_pad_size=tuple(high_pad_size))], [ax]


def _same(name: str):
    """A rule recording the node's own primitive on the batched input (the axis stays)."""

    def rule(inputs, vaxes, primals, outputs, **params):
        x = inputs[0]
        return [record1(name, [x], x.shape, outputs[0].dtype, **params)], list(vaxes)

    return rule


def _view(inputs, vaxes, primals, outputs, *, dtype):
    x, ax = inputs[0], vaxes[0]
    if ax == x.ndim - 1:  # the last axis changes size with the itemsize: map another one
        x, ax = mx.moveaxis(x, ax, 0), 0
    return [mx.view(x, _dt.from_numpy(dtype))], [ax]


defvmap("Reshape", _reshape)
defvmap("ExpandDims", _expand_dims)
defvmap("Squeeze", _squeeze)
defvmap("Flatten", _flatten)
defvmap("Unflatten", _unflatten)
defvmap("Transpose", _transpose)
defvmap("Broadcast", _broadcast)
defvmap("Concatenate", _concatenate)
defvmap("Split", _split)
defvmap("Pad", _pad)
defvmap("Copy", _same("Copy"))
defvmap("Contiguous", _same("Contiguous"))
defvmap("Full", _same("Full"))
defvmap("View", _view)
without("AsStrided", "MLX has no vmap for AsStrided (strides name the unbatched layout): "
        "raises [Primitive::vmap] Not implemented for AsStrided.")
