"""Run a tape op by op with the array module's primitive rules (the fallback executor)."""

from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np

from ..primitives import REGISTRY
from .tape import Tape

_BF16 = np.dtype(ml_dtypes.bfloat16)


def interpret(tape: Tape, inputs: Sequence, shape: Sequence[int], xp=np) -> list:
    """The tape's outputs computed with ``rules`` (numpy broadcasting stands in for Broadcast).

    Each op's result is rounded to its dtype, as the unfused graph would be, and bfloat16
    elementwise math runs in float32 as the CPU backend does.
    """
    env = {}
    for x, a in zip(tape.inputs, inputs):
        env[x.name] = xp.asarray(np.asarray(x.constant).astype(x.dtype)) if x.is_constant else a
    with np.errstate(all="ignore"):
        for op in tape.ops:
            args = [env[n] for n in op.inputs]
            defn = REGISTRY[op.primitive]
            if op.primitive == "Broadcast":
                val = args[0]
            else:
                if defn.elementwise:  # not AsType: bfloat16 math runs in float32
                    args = [a.astype(np.float32) if a.dtype == _BF16 else a for a in args]
                val = defn.rule(xp, *args, **dict(op.params))
            val = xp.asarray(val)
            if val.dtype != op.dtype:
                val = val.astype(op.dtype)
            env[op.name] = val
    return [xp.ascontiguousarray(xp.broadcast_to(env[n], tuple(shape))) for n in tape.outputs]
