"""Batching rules of the elementwise primitives (mlx/primitives.cpp ``vmap_binary_op`` /
``vmap_ternary_op``): a unary op runs on the batched input as is; the inputs of a binary or
ternary op get leading 1-axes to one rank and their mapped axes moved to one place, and the
op broadcasts the unmapped ones. AsType, StopGradient and DivMod batch the same way."""

from __future__ import annotations

from tapescope.kernels import primitives

from .. import ops as mx
from ..autodiff.registry import record
from ..ops.elementwise import binary
from .registry import defvmap


def _unary(name: str):
    def rule(inputs, vaxes, primals, outputs, **params):
        x = inputs[0]
        return record(name, [x], [x.shape], [outputs[0].dtype], **params), vaxes

    return rule


def align(inputs: list, axes: list):
    """MLX's ``vmap_binary_op`` / ``vmap_ternary_op``: the inputs reshaped to one rank with
    the mapped axes at the first input's place (its leading 1-axis when it is unmapped)."""
    if all(a == -1 for a in axes):
        return list(inputs), -1
    ndim = max(x.ndim + (a == -1) for x, a in zip(inputs, axes))
    to_ax = ndim - inputs[0].ndim + axes[0]
    out = []
    for x, a in zip(inputs, axes):
        from_ax = ndim - x.ndim + a
        if x.ndim < ndim:
            x = mx.reshape(x, (1,) * (ndim - x.ndim) + tuple(x.shape))
        if from_ax != to_ax:  # an unmapped input's leading 1-axis moves too
            perm = list(range(ndim))
            perm.pop(from_ax)
            perm.insert(to_ax, from_ax)
            x = mx.transpose(x, perm)
        out.append(x)
    return out, to_ax


def _binary(name: str):
    def rule(inputs, vaxes, primals, outputs, **params):
        (a, b), to_ax = align(inputs, vaxes)
        return [binary(name, a, b, None, dtype=primals[0].dtype,
                       out_dtype=outputs[0].dtype)], [to_ax]

    return rule


def _divmod(inputs, vaxes, primals, outputs):
    (a, b), to_ax = align(inputs, vaxes)
    return list(mx.divmod(a, b)), [to_ax, to_ax]


def _select(inputs, vaxes, primals, outputs):
    (c, a, b), to_ax = align(inputs, vaxes)
    return [mx.where(c, a, b)], [to_ax]


for _name, _d in list(primitives.REGISTRY.items()):
    if _d.family == primitives.UNARY:
        defvmap(_name, _unary(_name))
    elif _d.family == primitives.BINARY:
        defvmap(_name, _binary(_name))
defvmap("AsType", _unary("AsType"))
defvmap("DivMod", _divmod)
defvmap("Select", _select)
