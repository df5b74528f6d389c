"""Batching rule of RandomBits (mlx/primitives.cpp): a batch of keys draws a batch of bit
arrays, one per key; the key's last axis is its (2,) pair, so a key mapped there is
transposed first."""

from __future__ import annotations

from .. import ops as mx
from ..autodiff.registry import record
from .registry import defvmap


def _random_bits(inputs, vaxes, primals, outputs, *, shape, width):
    key, kax = inputs[0], vaxes[0]
    if kax == key.ndim - 1:
        key = mx.swapaxes(key, kax, kax - 1)
        kax -= 1
    shape = list(shape)
    if kax >= 0:
        shape.insert(kax, key.shape[kax])
    shape = tuple(shape)
    return record("RandomBits", [key], [shape], [outputs[0].dtype], shape=shape,
                  width=width), [kax]


defvmap("RandomBits", _random_bits)
