"""Rules for layout primitives that produce views or casts: Broadcast, AsType, ..."""

from __future__ import annotations

from . import rule


@rule("Broadcast")
def broadcast(xp, a, *, shape):
    return xp.broadcast_to(a, shape)


@rule("AsType")
def astype(xp, a, *, dtype):
    return a.astype(dtype)
