"""Batching rules of the collectives (``mlx/distributed/primitives.cpp``): AllReduce and Send
act elementwise, so the batched input goes through with its axis. AllGather concatenates on
axis 0, so a mapped axis 0 moves to 1 first (a 0-d slice gets an axis 0 of one): every batch
element is gathered on its own (MLX 0.32.4 gathers the batch axis itself instead). MLX has
no batching rule for ReduceScatter; Recv has no inputs."""

from __future__ import annotations

from .. import ops as mx
from ..autodiff.registry import record1
from .registry import defvmap, without


def _same(name):
    def rule(inputs, vaxes, primals, outputs, **params):
        x = inputs[0]
        return [record1(name, [x], x.shape, outputs[0].dtype, **params)], [vaxes[0]]

    return rule


def _all_gather(inputs, vaxes, primals, outputs, *, comm):
    x, ax = inputs[0], vaxes[0]
    if x.ndim == 1:  # slices are 0-d: each gathers to (size,)
        x, ax = mx.expand_dims(x, 0), 1
    elif ax == 0:
        x, ax = mx.moveaxis(x, 0, 1), 1
    shape = (x.shape[0] * comm.Get_size(),) + tuple(x.shape[1:])
    return [record1("AllGather", [x], shape, outputs[0].dtype, comm=comm)], [ax]


defvmap("AllReduce", _same("AllReduce"))
defvmap("Send", _same("Send"))
defvmap("AllGather", _all_gather)
without("ReduceScatter", "MLX has no vmap for ReduceScatter: [Primitive::vmap] Not implemented "
        "for Sum ReduceScatter.")
without("Recv", "no inputs: never on a path from a mapped argument (MLX has no vmap for Recv "
        "either)")
