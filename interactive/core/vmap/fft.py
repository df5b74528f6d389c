"""Batching rules of FFT and Hadamard (mlx/primitives.cpp): the transformed axes shift past
the mapped one; Hadamard works on the last axis, so a mapped last axis goes first."""

from __future__ import annotations

from .. import ops as mx
from ..autodiff.registry import record1
from .registry import defvmap, shift


def _fft(inputs, vaxes, primals, outputs, *, axes, inverse, real, out_shape):
    x, ax = inputs[0], vaxes[0]
    new_axes = tuple(shift(a, ax) for a in axes)
    shape = list(x.shape)  # the transformed axes take the node's sizes
    for a, b in zip(new_axes, axes):
        shape[a] = out_shape[b]
    return [record1("FFT", [x], tuple(shape), outputs[0].dtype, axes=new_axes, inverse=inverse,
                    real=real, out_shape=tuple(shape))], [ax]


def _hadamard(inputs, vaxes, primals, outputs, *, scale):
    x, ax = inputs[0], vaxes[0]
    if ax == x.ndim - 1:
        x, ax = mx.moveaxis(x, ax, 0), 0
    return [record1("Hadamard", [x], x.shape, outputs[0].dtype, scale=scale)], [ax]


defvmap("FFT", _fft)
defvmap("Hadamard", _hadamard)
