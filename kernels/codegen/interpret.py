"""Run a tape op by op with the array module's primitive rules (the fallback executor)."""

from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np

from ..primitives import BROADCAST, REGISTRY
from .tape import Tape

_BF16 = np.dtype(ml_dtypes.bfloat16)


def _small_power(op, env: dict, xp):
    """``x ** n`` for a float ``x`` and a constant exponent n in 0..4, by multiplying in
    float64 and rounding once to the dtype (within an ulp, as ``powf`` is): numpy's float
    power calls the scalar libm ``pow`` per element, ~60 ns each, 100x a multiply. None
    when the op is not of that form."""
    a, b = (env[n] for n in op.inputs)
    if (not REGISTRY[op.primitive].power or a.dtype.kind != "f" or a.dtype.itemsize > 4
            or xp.ndim(b) != 0 or b.dtype.kind not in "fiu"):
        return None
    n = float(b)
    if n not in (0.0, 1.0, 2.0, 3.0, 4.0):
        return None
    x = a.astype(np.float64)
    val = xp.ones_like(x) if n == 0 else x
    for _ in range(int(n) - 1):
        val = val * x
    return val.astype(op.dtype)


def bind_inputs(tape: Tape, inputs: Sequence, xp=np) -> dict:
    """Input name -> array: the caller's arrays, and the tape's constants made in their dtype
    with ``xp`` (the interpreters' starting environment)."""
    return {x.name: xp.asarray(np.asarray(x.constant).astype(x.dtype)) if x.is_constant else a
            for x, a in zip(tape.inputs, inputs)}


def interpret(tape: Tape, inputs: Sequence, shape: Sequence[int], xp=np,
              fast_power: bool = False) -> list:
    """The tape's outputs computed with ``rules`` (numpy broadcasting stands in for Broadcast).

    Each op's result is rounded to its dtype, as the unfused graph would be, and bfloat16
    elementwise math runs in float32 as the CPU backend does. ``fast_power``: small integer
    powers of floats multiply (``_small_power``) instead of calling numpy's power.
    """
    env = bind_inputs(tape, inputs, xp)
    with np.errstate(all="ignore"):
        for op in tape.ops:
            args = [env[n] for n in op.inputs]
            defn = REGISTRY[op.primitive]
            if defn.family == BROADCAST:
                val = args[0]
            elif fast_power and defn.power and (
                    val := _small_power(op, env, xp)) is not None:
                pass
            else:
                if defn.elementwise:  # not AsType: bfloat16 math runs in float32
                    args = [a.astype(np.float32) if a.dtype == _BF16 else a for a in args]
                val = defn.rule(xp, *args, **dict(op.params))
            val = xp.asarray(val)
            if val.dtype != op.dtype:
                val = val.astype(op.dtype)
            env[op.name] = val
    return [xp.ascontiguousarray(xp.broadcast_to(env[n], tuple(shape))) for n in tape.outputs]


BLOCK = 1 << 15  # elements per block of ``interpret_blocked``: a tape's temporaries stay in cache


def interpret_blocked(tape: Tape, inputs: Sequence, shape: Sequence[int], xp=np) -> list:
    """``interpret`` over blocks of leading-axis rows, each written into the outputs: the
    same values (every op is elementwise, so a block's results are the whole's), with
    temporaries that fit in cache instead of a fresh whole-size array per op. Tapes with
    other ops, and shapes that do not split, run whole. Small integer powers multiply
    (``_small_power``): this runs the compiled path's tapes, whose kernels call ``powf``."""
    shape = tuple(int(s) for s in shape)
    size = 1
    for s in shape:
        size *= s
    inner = size // shape[0] if shape and shape[0] else 0
    if (size < 2 * BLOCK or not inner or inner > BLOCK
            or any(not REGISTRY[op.primitive].fusable for op in tape.ops)):
        return interpret(tape, inputs, shape, xp, fast_power=True)
    rows = max(1, BLOCK // inner)
    views = [a if x.is_constant or xp.ndim(a) == 0
             else xp.broadcast_to(a, shape) for x, a in zip(tape.inputs, inputs)]
    outs = [xp.empty(shape, dtype=tape.dtype_of(n)) for n in tape.outputs]
    for i in range(0, shape[0], rows):
        j = min(shape[0], i + rows)
        part = [v if x.is_constant or xp.ndim(v) == 0 else v[i:j]
                for x, v in zip(tape.inputs, views)]
        for o, r in zip(outs, interpret(tape, part, (j - i,) + shape[1:], xp,
                                                 fast_power=True)):
            o[i:j] = r
    return outs
