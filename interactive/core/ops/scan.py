"""Scans: cumsum, cumprod, cummax, cummin, logcumsumexp (MLX's ``Scan`` primitive, printed
``CumSum``, ``CumProd``, ``CumMax``, ``CumMin``, ``CumLogAddExp``), with ``axis``,
``reverse`` and ``inclusive``. ``axis=None`` scans the flattened array."""

from __future__ import annotations

from typing import Optional

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import Primitive
from .convert import cast
from .reduction import check_int, op, require_array

__all__ = ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]

_NAMES = {"sum": "CumSum", "prod": "CumProd", "max": "CumMax", "min": "CumMin",
          "logaddexp": "CumLogAddExp"}

_SIG = ("{0}(a: array, /, axis: int | None = None, *, reverse: bool = False, "
        "inclusive: bool = True{1}, stream: StreamOrDevice = None) -> array")


def _scan(fname: str, reduce_type: str, a: array, axis: Optional[int], reverse: bool,
          inclusive: bool, dtype: Optional[_dt.Dtype], stream: StreamOrDevice,
          flatten: str = "flatten") -> array:
    has_dtype = reduce_type in ("sum", "prod")
    require_array(fname, _SIG.format(fname, ", dtype: Dtype | None = None" if has_dtype else ""), a)
    if dtype is not None and not isinstance(dtype, _dt.Dtype):
        raise TypeError(f"{fname}(): incompatible function arguments: dtype must be a "
                        f"mlx.core.Dtype, got {type(dtype).__name__}.")
    s = resolve_stream(stream)
    if axis is None:
        a = op(flatten)(a, stream=s) if flatten == "flatten" else op("reshape")(a, [-1], stream=s)
        axis = 0
    axis = check_int(fname, axis)
    if axis >= a.ndim or axis < -a.ndim:
        raise IndexError(f"[{fname}] Axis {axis} is out of bounds for array with {a.ndim} dimensions.")
    axis %= a.ndim
    if reduce_type == "logaddexp":
        out_dtype = a.dtype if _dt.is_inexact(a.dtype) else _dt.float32
        x = cast(a, out_dtype, s)
    else:
        out_dtype = dtype or a.dtype
        if reduce_type == "sum" and out_dtype == _dt.bool_:
            out_dtype = _dt.int32
            x = a if a.dtype == _dt.bool_ else cast(a, _dt.bool_, s)
        else:
            x = cast(a, out_dtype, s)
    prim = Primitive(_NAMES[reduce_type], s, reduce_type=reduce_type, axis=axis,
                     reverse=bool(reverse), inclusive=bool(inclusive))
    return array._make([a.shape], [out_dtype], prim, [x])[0]


def cumsum(a: array, /, axis: Optional[int] = None, *, reverse: bool = False,
           inclusive: bool = True, dtype: Optional[_dt.Dtype] = None,
           stream: StreamOrDevice = None) -> array:
    """Cumulative sum along ``axis`` (bool input sums in int32)."""
    return _scan("cumsum", "sum", a, axis, reverse, inclusive, dtype, stream)


def cumprod(a: array, /, axis: Optional[int] = None, *, reverse: bool = False,
            inclusive: bool = True, dtype: Optional[_dt.Dtype] = None,
            stream: StreamOrDevice = None) -> array:
    """Cumulative product along ``axis``."""
    return _scan("cumprod", "prod", a, axis, reverse, inclusive, dtype, stream)


def cummax(a: array, /, axis: Optional[int] = None, *, reverse: bool = False,
           inclusive: bool = True, stream: StreamOrDevice = None) -> array:
    """Cumulative maximum along ``axis``."""
    return _scan("cummax", "max", a, axis, reverse, inclusive, None, stream)


def cummin(a: array, /, axis: Optional[int] = None, *, reverse: bool = False,
           inclusive: bool = True, stream: StreamOrDevice = None) -> array:
    """Cumulative minimum along ``axis``."""
    return _scan("cummin", "min", a, axis, reverse, inclusive, None, stream)


def logcumsumexp(a: array, /, axis: Optional[int] = None, *, reverse: bool = False,
                 inclusive: bool = True, stream: StreamOrDevice = None) -> array:
    """Cumulative ``log(sum(exp(a)))`` along ``axis``, in at least float32."""
    return _scan("logcumsumexp", "logaddexp", a, axis, reverse, inclusive, None, stream,
                 flatten="reshape")
