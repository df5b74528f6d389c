"""VJP / JVP of ``Compiled`` (a fused tape): the tape is replayed as the primitives it fused,
on the node's inputs, and that small graph is differentiated with the same walks. So
``grad(compile(f))`` differentiates the un-fused ops, and compiling the result fuses the
backward chains again."""

from __future__ import annotations

from .. import dtypes as _dt
from ..array import array
from ..device import resolve_stream
from ..primitive import Primitive
from tapescope.kernels.primitives import BROADCAST, REGISTRY, broadcast_shapes
from . import engine
from .registry import defjvp, defvjp


def replay_tape(tape, inputs: list, shape=None) -> list:
    """The tape's ops recorded on ``inputs`` (one array per tape input); its outputs.

    A Broadcast is recorded when its consumer is: a shapeless tape (``mlx.nn``'s compiled
    activations) reused at new shapes keeps the Broadcast shape of its first trace, so the
    shape is the consumer's broadcast of its inputs where the recorded one no longer fits
    (the tape's output ``shape`` for a Broadcast that is an output), as the forward run
    follows numpy broadcasting (kernels/codegen/interpret.py)."""
    env = {x.name: a for x, a in zip(tape.inputs, inputs)}
    pending: dict = {}  # Broadcast op name -> (its input, recorded shape, params)
    s = resolve_stream(None)

    def emit(name: str, target) -> None:
        src, recorded, params = pending.pop(name)
        try:
            final = broadcast_shapes(recorded, target)
        except ValueError:
            final = tuple(target)
        prim = Primitive("Broadcast", s, **{**params, "shape": tuple(final)})
        env[name] = array._make1(tuple(final), src.dtype, prim, [src])

    for op in tape.ops:
        if REGISTRY[op.primitive].family == BROADCAST:
            params = dict(op.params)
            pending[op.name] = (env[op.inputs[0]], tuple(params["shape"]), params)
            continue
        shapes = [tuple((pending[n][0] if n in pending else env[n]).shape) for n in op.inputs]
        for n in op.inputs:
            if n in pending:
                emit(n, broadcast_shapes(*shapes))
        prim = Primitive(op.primitive, s, **dict(op.params))
        ins = [env[n] for n in op.inputs]
        if tape.reduction is not None and shape is not None:  # a fused reduction's value
            out_shape = tape.reduction.shape_of(op.name, shape)
        else:
            out_shape = prim.defn.shape([tuple(a.shape) for a in ins], **prim.kw)[0]
        env[op.name] = array._make1(tuple(out_shape), _dt.from_numpy(op.dtype), prim, ins)
    for n in tape.outputs:
        if n in pending:
            emit(n, pending[n][1] if shape is None else shape)
    return [env[n] for n in tape.outputs]


def _compiled_vjp(p, c, argnums, o, *, tape, shape):
    outs = replay_tape(tape, p, shape)
    seeds = [(k, ck) for k, ck in enumerate(c) if ck is not None]
    return engine.backward(outs, p, seeds, argnums)


def _compiled_jvp(p, t, argnums, o, *, tape, shape):
    outs = replay_tape(tape, p, shape)
    return engine.forward(outs, p, t, argnums)


defvjp("Compiled", _compiled_vjp)
defjvp("Compiled", _compiled_jvp)
