"""Batching rule of ``Compiled`` (a fused tape): the tape is replayed as the primitives it
fused, on the node's own inputs, and that small graph is batched with the same walk, as
autodiff differentiates it. MLX never meets a Compiled node under vmap (a compiled function
called on tracers runs its function, mlx/compile.cpp), so ``vmap(compile(f))`` batches the
un-fused ops either way; ``compile(vmap(f))`` fuses the batched graph."""

from __future__ import annotations

from ..autodiff.compiled import replay_tape
from .engine import batch_graph
from .registry import defvmap


def _compiled(inputs, vaxes, primals, outputs, *, tape, shape):
    outs = replay_tape(tape, primals, shape)
    tmap = {id(p._d): (x, ax) for p, x, ax in zip(primals, inputs, vaxes) if x._d is not p._d}
    batch_graph([o._d for o in outs], tmap)
    res = [tmap.get(id(o._d), (o, -1)) for o in outs]
    return [r[0] for r in res], [r[1] for r in res]


defvmap("Compiled", _compiled)
