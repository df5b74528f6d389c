"""Rules for the creation primitives: Full (materialise a broadcast value) and Arange."""

from __future__ import annotations

from ..primitives import CREATION, define


@define("Full", family=CREATION)
def full(xp, a):
    # The input is the (broadcast) fill value; Full gives it its own contiguous buffer.
    return xp.array(a, copy=True, order="C")


@define("Arange", family=CREATION)
def arange(xp, *, start, step, size, dtype):
    # MLX's CPU kernel: out[i] = start + i * step, computed in the output dtype.
    if size == 0:
        return xp.zeros((0,), dtype=dtype)
    base = xp.arange(size).astype(dtype)
    return (xp.asarray(start, dtype=dtype) + base * xp.asarray(step, dtype=dtype)).astype(dtype)
