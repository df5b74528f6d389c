"""Batching rules of the reductions (mlx/primitives.cpp ``Reduce::vmap`` and the others):
the reduced axes shift past the mapped one and the result keeps its dims, so the mapped
axis stays where it was. LogSumExp and Softmax work on the last axis: when that is the
mapped one it is swapped away (LogSumExp) or the op runs on axis -2 (Softmax, as MLX)."""

from __future__ import annotations

from .. import ops as mx
from ..autodiff.registry import record1
from .registry import defvmap, shift


def _reduce(name: str):
    def rule(inputs, vaxes, primals, outputs, *, axes):
        x, ax = inputs[0], vaxes[0]
        red = tuple(shift(a, ax) for a in axes)
        kept = tuple(1 if i in red else n for i, n in enumerate(x.shape))
        return [record1(name, [x], kept, outputs[0].dtype, axes=red)], [ax]

    return rule


for _name in ("Sum", "Prod", "Max", "Min", "And", "Or"):
    defvmap(_name, _reduce(_name))


def _arg_reduce(inputs, vaxes, primals, outputs, *, reduce_type, axis):
    x, ax = inputs[0], vaxes[0]
    red = shift(axis, ax)
    kept = tuple(1 if i == red else n for i, n in enumerate(x.shape))
    return [record1("ArgReduce", [x], kept, outputs[0].dtype, reduce_type=reduce_type,
                    axis=red)], [ax]


def _logsumexp(inputs, vaxes, primals, outputs):
    x, ax = inputs[0], vaxes[0]
    if ax == x.ndim - 1:
        x = mx.swapaxes(x, -1, -2)
        ax = x.ndim - 2
    return [mx.logsumexp(x, -1, keepdims=True)], [ax]


def _softmax(inputs, vaxes, primals, outputs, *, precise):
    x, ax = inputs[0], vaxes[0]
    axis = -1 if ax < x.ndim - 1 else -2  # (MLX takes -2 for an unmapped input too)
    return [mx.softmax(x, axis, precise=precise)], [ax]


def _number_of_elements(inputs, vaxes, primals, outputs, *, axes, inverted, dtype):
    """MLX's NumberOfElements::vmap: the counted axes shift past the mapped one; the count is
    the same for every mapped slice, so the output is unmapped."""
    from ..array import array
    from ..device import resolve_stream
    from ..primitive import Primitive

    x, ax = inputs[0], vaxes[0]
    prim = Primitive("NumberOfElements", resolve_stream(None), axes=tuple(shift(a, ax) for a in axes),
                     inverted=inverted, dtype=dtype)
    return [array._make([()], [outputs[0].dtype], prim, [x])[0]], [-1]


defvmap("ArgReduce", _arg_reduce)
defvmap("NumberOfElements", _number_of_elements)
defvmap("LogSumExp", _logsumexp)
defvmap("Softmax", _softmax)
