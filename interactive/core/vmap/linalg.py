"""Batching rules of the factorizations (mlx/primitives.cpp): they already batch over leading
axes, so a mapped axis among the matrix axes moves first (Inverse, Cholesky and SVD move
any mapped axis first, Eigh and Eig only one of the last two). MLX has no rule for QRF and
LUF."""

from __future__ import annotations

from .. import ops as mx
from ..autodiff.registry import record
from .registry import defvmap, without


def _factorization(name: str, always_first: bool):
    def rule(inputs, vaxes, primals, outputs, **params):
        x, ax = inputs[0], vaxes[0]
        if ax > 0 and (always_first or ax >= x.ndim - 2):
            x, ax = mx.moveaxis(x, ax, 0), 0
        live = [o for o in outputs if o is not None]
        lead = len(primals[0].shape) - 2  # each output: the input's batch axes, then its own
        shapes = [tuple(x.shape[:-2]) + tuple(o.shape[lead:]) for o in live]
        outs = record(name, [x], shapes, [o.dtype for o in live], **params)
        return outs, [ax] * len(outs)

    return rule


for _name in ("Inverse", "Cholesky", "SVD"):
    defvmap(_name, _factorization(_name, True))
for _name in ("Eigh", "Eig"):
    defvmap(_name, _factorization(_name, False))
for _name in ("QRF", "LUF"):
    without(_name, f"MLX has no vmap for {_name}: raises [Primitive::vmap] Not implemented "
            f"for {_name}.")
