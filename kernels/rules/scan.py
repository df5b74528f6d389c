"""Rules for MLX's ``Scan`` primitives: CumSum, CumProd, CumMax, CumMin, CumLogAddExp.

Each takes ``axis``, ``reverse`` and ``inclusive``; an exclusive scan shifts the inclusive
one by one place and starts from the reduction's identity.
"""

from __future__ import annotations

from ..primitives import SCAN, define, same_shape
from .elementwise import finish
from .forms import accumulate, log_step_scan, sequential


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
            return accumulate(xp, "logical_and", a, axis)
        return xp.cumprod(a, axis=axis, dtype=a.dtype)
    if name == "max":
        return accumulate(xp, "maximum", a, axis)
    if name == "min":
        return accumulate(xp, "minimum", a, axis)
    if a.dtype.kind == "c":
        return _complex_logaddexp_scan(xp, a, axis)
    return accumulate(xp, "logaddexp", a, axis)


def _complex_logaddexp(xp, acc, x):
    """MLX's LogAddExp on complex: the larger real part plus log1p(exp(smaller - larger))."""
    first = acc.real >= x.real
    m, n = xp.where(first, acc, x), xp.where(first, x, acc)
    return m + xp.log1p(xp.exp(n - m))


def _complex_logaddexp_scan(xp, a, axis):
    """Complex log-add-exp along ``axis``: one step at a time where the backend declares
    sequential forms (as MLX's CPU loop), a log-step scan elsewhere (no host loop over the
    axis)."""
    if not sequential(xp):
        return log_step_scan(xp, a, axis, lambda p, q: _complex_logaddexp(xp, p, q))
    moved = xp.moveaxis(a, axis, 0)
    out = xp.empty_like(moved)
    if moved.shape[0]:
        acc = out[0] = moved[0]
        for i in range(1, moved.shape[0]):
            acc = out[i] = _complex_logaddexp(xp, acc, moved[i])
    return xp.moveaxis(out, 0, axis)


# mlx/primitives.h's Scan::ReduceType, in declaration order
_SCAN_TYPES = ("max", "min", "sum", "prod", "logaddexp")


def _export(name: str, kw: dict) -> tuple:
    """MLX exports every scan as one ``Scan`` class: its ReduceType code, axis, reverse, inclusive."""
    return "Scan", [_SCAN_TYPES.index(kw["reduce_type"]), kw["axis"], kw["reverse"], kw["inclusive"]]


@define("CumSum", family=SCAN, out=True, kernel="scan", monoid="sum", export=_export, shape=same_shape)
@define("CumProd", family=SCAN, out=True, kernel="scan", monoid="prod", export=_export, shape=same_shape)
@define("CumMax", family=SCAN, out=True, kernel="scan", monoid="max", export=_export, shape=same_shape)
@define("CumMin", family=SCAN, out=True, kernel="scan", monoid="min", export=_export, shape=same_shape)
@define("CumLogAddExp", family=SCAN, out=True, monoid="logaddexp", export=_export, shape=same_shape)
def scan(xp, a, *, reduce_type, axis, reverse, inclusive, out=None):
    """Inclusive or exclusive, forward or reverse cumulative ``reduce_type`` along ``axis``."""
    res = _scan(xp, a, reduce_type, axis, reverse, inclusive)
    return finish(res, out)


def _scan(xp, a, reduce_type, axis, reverse, inclusive):
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
