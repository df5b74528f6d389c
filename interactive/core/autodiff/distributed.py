"""VJP / JVP rules of the collectives, as MLX's (``mlx/distributed/primitives.cpp``):
AllReduce's VJP passes the cotangent through unchanged (for sum, max and min alike) and its
JVP is the same reduction of the tangent; AllGather's VJP is this rank's block of the
cotangent and its JVP the gather of the tangent. MLX has none for ReduceScatter, Send, Recv."""

from __future__ import annotations

from .. import ops as mx
from .registry import defjvp, defvjp, without
from .shape import linear_jvp


def _all_reduce_vjp(p, c, argnums, o, **params):
    return [c[0]]


def _all_gather_vjp(p, c, argnums, o, *, comm):
    x = p[0]
    m = 1 if x.ndim == 0 else x.shape[0]
    r = comm.Get_rank()
    return [mx.reshape(c[0][r * m:(r + 1) * m], x.shape)]


defvjp("AllReduce", _all_reduce_vjp)
defjvp("AllReduce", linear_jvp("AllReduce"))
defvjp("AllGather", _all_gather_vjp)
defjvp("AllGather", linear_jvp("AllGather"))
without("ReduceScatter",
        vjp="MLX has no VJP for ReduceScatter: [Primitive::vjp] Not implemented for Sum "
            "ReduceScatter.",
        jvp="MLX has no JVP for ReduceScatter: [Primitive::jvp] Not implemented for Sum "
            "ReduceScatter.")
without("Send", vjp="MLX has no VJP for Send: [Primitive::vjp] Not implemented for Send.",
        jvp="MLX has no JVP for Send: [Primitive::jvp] Not implemented for Send.")
without("Recv", vjp="no inputs: nothing to differentiate (MLX has no VJP for Recv)",
        jvp="no inputs: nothing to differentiate (MLX has no JVP for Recv)")
