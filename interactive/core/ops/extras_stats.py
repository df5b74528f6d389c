"""Small statistics MLX has: count_nonzero, minmax and median, composed from the primitives
MLX records for them (NotEqual + AsType + Sum; Min and Max; Transpose + Sort + Slice ...).
"""

from __future__ import annotations

import math
from typing import Sequence, Union

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from .binary import add, multiply, not_equal
from .convert import cast, incompatible
from .indexing import _slice
from .reduction import any as _any
from .reduction import max as _max
from .reduction import min as _min
from .reduction import sum as _sum
from .shape import expand_dims, flatten, squeeze, transpose
from .sort import sort
from .ternary import where

__all__ = ["count_nonzero", "minmax", "median"]

Axis = Union[None, int, Sequence[int]]

_CNZ_SIG = ("count_nonzero(a: array, /, *, axis: None | int | Sequence[int] = None, keepdims: "
            "bool = False, stream: StreamOrDevice = None) -> array")


def count_nonzero(a: array, /, *, axis: Axis = None, keepdims: bool = False,
                  stream: StreamOrDevice = None) -> array:
    """How many elements are non-zero along ``axis`` (int32): ``sum(cast(a != 0, int32))``."""
    if not isinstance(a, array):
        raise incompatible("count_nonzero", _CNZ_SIG, a)
    s = resolve_stream(stream)
    nz = cast(not_equal(a, 0, stream=s), _dt.int32, s)
    return _sum(nz, axis, keepdims, stream=s)


_MINMAX_SIG = ("minmax(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = "
               "False, *, stream: StreamOrDevice = None) -> tuple[array, array]")


def minmax(a: array, /, axis: Axis = None, keepdims: bool = False, *,
           stream: StreamOrDevice = None) -> tuple:
    """``(min(a, axis, keepdims), max(a, axis, keepdims))``."""
    if not isinstance(a, array):
        raise incompatible("minmax", _MINMAX_SIG, a)
    return (_min(a, axis, keepdims, stream=stream), _max(a, axis, keepdims, stream=stream))


_MEDIAN_SIG = ("median(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = "
               "False, *, stream: StreamOrDevice = None) -> array")


def _median_axes(a: array, axis: Axis) -> list:
    raw = list(range(a.ndim)) if axis is None else (
        [axis] if isinstance(axis, int) else list(axis))
    axes = []
    for ax in raw:
        n = int(ax) + a.ndim if int(ax) < 0 else int(ax)
        if not 0 <= n < a.ndim:
            raise IndexError(f"[median] axis {ax} is out of bounds for array with {a.ndim} "
                             "dimensions.")
        if n in axes:
            raise ValueError("[median] Received duplicate axis.")
        axes.append(n)
    return sorted(axes)


def median(a: array, /, axis: Axis = None, keepdims: bool = False, *,
           stream: StreamOrDevice = None) -> array:
    """The median over ``axis`` (all axes by default); NaN where a NaN is present.

    As MLX: move the axes last (one Transpose), merge them (Flatten), Sort, take the middle
    element(s), average in ``at_least_float``, and Select NaN where the input had one.
    """
    if not isinstance(a, array):
        raise incompatible("median", _MEDIAN_SIG, a)
    axes = _median_axes(a, axis)
    s = resolve_stream(stream)
    kept = [i for i in range(a.ndim) if i not in axes]
    x = transpose(a, kept + axes, stream=s)
    if len(axes) != 1:
        x = flatten(x, a.ndim - len(axes), -1, stream=s)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("[median] Cannot take median along empty axis.")
    dt = a.dtype if _dt.is_inexact(a.dtype) else _dt.float32
    inexact = _dt.is_inexact(a.dtype)
    if inexact:
        has_nan = _any(not_equal(x, x, stream=s), -1, True, stream=s)
    srt = sort(x, -1, stream=s)
    lead = srt.shape[:-1]

    def middle(i: int) -> array:
        piece = _slice(srt, (0,) * len(lead) + (i,), lead + (i + 1,), (1,) * srt.ndim, s)
        return cast(piece, dt, s)

    if n % 2:
        med = middle(n // 2)
    else:
        both = add(middle(n // 2 - 1), middle(n // 2), stream=s)
        med = multiply(both, array(0.5, dt), stream=s)
    if inexact:
        med = where(has_nan, array(math.nan, dt), med, stream=s)
    out = squeeze(med, -1, stream=s)
    if keepdims and axes:
        out = expand_dims(out, axes, stream=s)
    return out
