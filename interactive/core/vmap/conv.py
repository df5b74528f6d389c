"""Batching rule of Convolution (``Convolution::vmap`` in ``mlx/primitives.cpp``): a mapped
input folds its batch into N, a mapped weight into the output channels, and both mapped
become a grouped convolution with ``groups * batch`` groups. One known difference: a mapped
weight of a grouped conv keeps each group's filters together (MLX 0.32.4's flattening mixes
batches across groups and returns wrong values; checked against a loop in tests)."""

from __future__ import annotations

from .. import ops as mx
from ..device import resolve_stream
from ..ops.conv import _conv_general
from .registry import defvmap


def _conv(inputs, vaxes, primals, outputs, *, strides, padding_lo, padding_hi,
          kernel_dilation, input_dilation, groups, flip):
    s = resolve_stream(None)

    def conv(x, w, g):
        return _conv_general(x, w, strides, padding_lo, padding_hi, kernel_dilation,
                             input_dilation, g, flip, s)

    (x, w), (ax, aw) = inputs, vaxes
    if ax >= 0 and aw < 0:
        x = mx.moveaxis(x, ax, 0) if ax > 0 else x
        out = conv(mx.flatten(x, 0, 1), w, groups)
        return [mx.unflatten(out, 0, (x.shape[0], x.shape[1]))], [0]
    if ax < 0 and aw >= 0:
        w = mx.moveaxis(w, aw, 0) if aw > 0 else w
        b, c_out = w.shape[0], w.shape[1]
        if groups == 1:
            out = conv(x, mx.flatten(w, 0, 1), groups)
            out = mx.unflatten(out, -1, (b, c_out))
            return [out], [out.ndim - 2]
        # MLX flattens (batch, C_out) here too, which puts batches' filters in the wrong
        # groups: keep each group's filters of every batch together instead
        og = c_out // groups
        w = mx.swapaxes(mx.unflatten(w, 1, (groups, og)), 0, 1)  # (groups, B, og, ...)
        out = conv(x, mx.flatten(w, 0, 2), groups)
        out = mx.swapaxes(mx.unflatten(out, -1, (groups, b, og)), -3, -2)
        out = mx.flatten(out, -2, -1)
        return [out], [out.ndim - 2]
    if ax >= 0 and aw >= 0:
        b = x.shape[ax]
        x = mx.flatten(mx.moveaxis(x, ax, -2), -2, -1)
        w = mx.moveaxis(w, aw, 0) if aw > 0 else w
        c_out = w.shape[1]
        out = conv(x, mx.flatten(w, 0, 1), groups * b)
        out = mx.unflatten(out, -1, (b, c_out))
        return [out], [out.ndim - 2]
    return [conv(x, w, groups)], [-1]


defvmap("Convolution", _conv)
