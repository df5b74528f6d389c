"""Batching rules of Matmul and AddMM (mlx/primitives.cpp): each mapped operand's mapped axis
goes first and the product broadcasts over it; the output's mapped axis is 0."""

from __future__ import annotations

from .. import ops as mx
from .registry import defvmap


def _first(x, ax):
    return mx.moveaxis(x, ax, 0) if ax > 0 else x


def _matmul(inputs, vaxes, primals, outputs):
    a, b = (_first(x, ax) for x, ax in zip(inputs, vaxes))
    return [mx.matmul(a, b)], [0]


def _addmm(inputs, vaxes, primals, outputs, *, alpha, beta):
    a, b, c = (_first(x, ax) for x, ax in zip(inputs, vaxes))
    return [mx.addmm(c, a, b, alpha=alpha, beta=beta)], [0]


defvmap("Matmul", _matmul)
defvmap("AddMM", _addmm)
