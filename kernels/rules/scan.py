"""Rules for MLX's ``Scan`` primitives: CumSum, CumProd, CumMax, CumMin, CumLogAddExp.

Each takes ``axis``, ``reverse`` and ``inclusive``; an exclusive scan shifts the inclusive
one by one place and starts from the reduction's identity.
"""

from __future__ import annotations

from ..primitives import SCAN, define


def _identity(xp, name, dtype):
    """The value an exclusive scan starts from."""
    if name == "sum":
        return 0
    if name == "prod":
        return 1
    if dtype.kind == "b":
        return name == "min"
    if dtype.kind in "iu":
        info = xp.iinfo(dtype)
        return info.min if name == "max" else info.max
    return -xp.inf if name in ("max", "logaddexp") else xp.inf


def _accumulate(xp, name, a, axis):
    if name == "sum":
        return xp.cumsum(a, axis=axis, dtype=a.dtype)
    if name == "prod":
        if a.dtype.kind == "b":
            return xp.logical_and.accumulate(a, axis=axis)
        return xp.cumprod(a, axis=axis, dtype=a.dtype)
    if name == "max":
        return xp.maximum.accumulate(a, axis=axis)
    if name == "min":
        return xp.minimum.accumulate(a, axis=axis)
    return xp.logaddexp.accumulate(a, axis=axis)


@define("CumSum", "CumProd", "CumMax", "CumMin", "CumLogAddExp", family=SCAN)
def scan(xp, a, *, reduce_type, axis, reverse, inclusive):
    """Inclusive or exclusive, forward or reverse cumulative ``reduce_type`` along ``axis``."""
    out_dtype = a.dtype
    if reduce_type == "sum" and a.dtype.kind == "b":
        a = a.astype(xp.int32)
    elif a.dtype.name in ("bfloat16", "float16"):
        a = a.astype(xp.float32)
    if reverse:
        a = xp.flip(a, axis=axis)
    out = _accumulate(xp, reduce_type, a, axis)
    if not inclusive and a.shape[axis] > 0:
        ident = xp.full_like(xp.take(out, xp.arange(1), axis=axis),
                             _identity(xp, reduce_type, out.dtype))
        head = xp.take(out, xp.arange(a.shape[axis] - 1), axis=axis)
        out = xp.concatenate([ident, head], axis=axis)
    if reverse:
        out = xp.flip(out, axis=axis)
    if out_dtype.kind == "b" and reduce_type != "sum":
        return out.astype(out_dtype)
    return out
