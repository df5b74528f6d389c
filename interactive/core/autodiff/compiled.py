"""VJP / JVP of ``Compiled`` (a fused tape): the tape is replayed as the primitives it fused,
on the node's inputs, and that small graph is differentiated with the same walks. So
``grad(compile(f))`` differentiates the un-fused ops, and compiling the result fuses the
backward chains again."""

from __future__ import annotations

from .. import dtypes as _dt
from ..array import array
from ..device import resolve_stream
from ..primitive import Primitive
from . import engine
from .registry import defjvp, defvjp


def replay_tape(tape, inputs: list) -> list:
    """The tape's ops recorded on ``inputs`` (one array per tape input); its outputs."""
    env = {x.name: a for x, a in zip(tape.inputs, inputs)}
    s = resolve_stream(None)
    for op in tape.ops:
        prim = Primitive(op.primitive, s, **dict(op.params))
        ins = [env[n] for n in op.inputs]
        shape = prim.defn.shape([tuple(a.shape) for a in ins], **prim.kw)[0]
        env[op.name] = array._make1(tuple(shape), _dt.from_numpy(op.dtype), prim, ins)
    return [env[n] for n in tape.outputs]


def _compiled_vjp(p, c, argnums, o, *, tape, shape):
    outs = replay_tape(tape, p)
    seeds = [(k, ck) for k, ck in enumerate(c) if ck is not None]
    return engine.backward(outs, p, seeds, argnums)


def _compiled_jvp(p, t, argnums, o, *, tape, shape):
    outs = replay_tape(tape, p)
    return engine.forward(outs, p, t, argnums)


defvjp("Compiled", _compiled_vjp)
defjvp("Compiled", _compiled_jvp)
