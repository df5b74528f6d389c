"""Elementwise ops, part 3: ``where`` (the ``Select`` primitive) and the ops MLX composes
from elementwise primitives: clip, nan_to_num, isclose, allclose, array_equal."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import Primitive
from .binary import (add, less_equal, logical_and, logical_or, maximum, minimum,
                     multiply, subtract)
from .convert import broadcast_arrays, broadcast_shapes, cast, incompatible, to_array, to_arrays
from .elementwise import abs, isnan, isneginf, isposinf, logical_not

__all__ = ["where", "clip", "nan_to_num", "isclose", "allclose", "array_equal"]


def where(condition: Any, x: Any, y: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Select from ``x`` where ``condition`` is true and from ``y`` elsewhere."""
    if condition is None or x is None or y is None:
        raise incompatible("where", "where(condition: scalar | array, x: scalar | array, y: scalar "
                           "| array, /, *, stream: StreamOrDevice = None) -> array", condition, x, y)
    c = to_array(condition)
    x, y = to_arrays(x, y)
    s = resolve_stream(stream)
    dt = _dt.promote_types(x.dtype, y.dtype)
    broadcast_shapes(c.shape, x.shape, y.shape)
    c, x, y = broadcast_arrays(cast(c, _dt.bool_, s), cast(x, dt, s), cast(y, dt, s), stream=s)
    return array._make([c.shape], [dt], Primitive("Select", s), [c, x, y])[0]


def clip(a: array, /, a_min: Any, a_max: Any, *, stream: StreamOrDevice = None) -> array:
    """Clip to ``[a_min, a_max]`` (either may be None) with maximum / minimum, as MLX does."""
    if a_min is None and a_max is None:
        raise ValueError("At most one of a_min and a_max may be None")
    a = to_array(a)
    lo = None if a_min is None else to_array(a_min, a.dtype)
    hi = None if a_max is None else to_array(a_max, a.dtype)
    shapes = [a.shape] + [v.shape for v in (lo, hi) if v is not None]
    broadcast_shapes(*shapes)
    s = resolve_stream(stream)
    out = a
    if lo is not None:
        out = maximum(out, lo, stream=s)
    if hi is not None:
        out = minimum(out, hi, stream=s)
    return out


_HALF_MAX = {_dt.float32: float(np.finfo(np.float32).max), _dt.float16: 65504.0}


def _type_max(d: _dt.Dtype) -> float:
    if d == _dt.bfloat16:
        return float(_dt.finfo(_dt.bfloat16).max)
    if d in _HALF_MAX:
        return _HALF_MAX[d]
    raise ValueError(f"[nan_to_num] Does not yet support given type: {d.name}.")


def nan_to_num(a: Any, nan: float = 0.0, posinf: Optional[float] = None,
               neginf: Optional[float] = None, *, stream: StreamOrDevice = None) -> array:
    """Replace NaN with ``nan`` and infinities with ``posinf`` / ``neginf`` (default: the
    dtype's largest finite values)."""
    a = to_array(a)
    d = a.dtype
    if not _dt.is_inexact(d):
        return a._handle()
    pos = np.float32(posinf) if posinf is not None else _type_max(d)
    neg = np.float32(neginf) if neginf is not None else -_type_max(d)
    s = resolve_stream(stream)
    out = where(isnan(a, stream=s), array(np.float32(nan), d), a, stream=s)
    out = where(isposinf(a, stream=s), array(pos, d), out, stream=s)
    return where(isneginf(a, stream=s), array(neg, d), out, stream=s)


def isclose(a: array, b: array, /, rtol: float = 1e-05, atol: float = 1e-08, *,
            equal_nan: bool = False, stream: StreamOrDevice = None) -> array:
    """Element-wise ``|a - b| <= atol + rtol * |b|``, with infinities equal only to themselves."""
    if a is None or b is None:
        raise incompatible("isclose", "isclose(a: array, b: array, /, rtol: float = 1e-05, atol: "
                           "float = 1e-08, *, equal_nan: bool = False, stream: StreamOrDevice = "
                           "None) -> array", a, b)
    a, b = to_array(a), to_array(b)
    broadcast_shapes(a.shape, b.shape)
    s = resolve_stream(stream)
    rhs = add(array(atol, _dt.float32), multiply(array(rtol, _dt.float32), abs(b, stream=s), stream=s),
              stream=s)
    out = less_equal(abs(subtract(a, b, stream=s), stream=s), rhs, stream=s)
    a_pos, b_pos = isposinf(a, stream=s), isposinf(b, stream=s)
    a_neg, b_neg = isneginf(a, stream=s), isneginf(b, stream=s)
    any_inf = logical_or(logical_or(a_pos, a_neg, stream=s), logical_or(b_pos, b_neg, stream=s),
                         stream=s)
    both_inf = logical_or(logical_and(a_pos, b_pos, stream=s), logical_and(a_neg, b_neg, stream=s),
                          stream=s)
    out = logical_and(out, logical_not(any_inf, stream=s), stream=s)
    out = logical_or(out, both_inf, stream=s)
    if equal_nan:
        both_nan = logical_and(isnan(a, stream=s), isnan(b, stream=s), stream=s)
        out = logical_or(out, both_nan, stream=s)
    return out


def allclose(a: array, b: array, /, rtol: float = 1e-05, atol: float = 1e-08, *,
             equal_nan: bool = False, stream: StreamOrDevice = None) -> array:
    """Whether every element of ``a`` and ``b`` is close (see ``isclose``)."""
    from .reduction import all as all_

    return all_(isclose(a, b, rtol, atol, equal_nan=equal_nan, stream=stream), stream=stream)


def array_equal(a: Any, b: Any, equal_nan: bool = False, stream: StreamOrDevice = None) -> array:
    """Whether ``a`` and ``b`` have the same shape and equal elements (NaNs equal with
    ``equal_nan``); a scalar bool array, False for different shapes."""
    if a is None or b is None:
        raise incompatible("array_equal", "array_equal(a: scalar | array, b: scalar | array, "
                           "equal_nan: bool = False, stream: StreamOrDevice = None) -> array", a, b)
    a, b = to_arrays(a, b)
    if a.shape != b.shape:
        return array(False)
    from .reduction import all as all_

    s = resolve_stream(stream)
    dt = _dt.promote_types(a.dtype, b.dtype)
    name = "NaNEqual" if equal_nan and _dt.is_inexact(dt) else "Equal"
    eq = array._make([a.shape], [_dt.bool_], Primitive(name, s),
                     [cast(a, dt, s), cast(b, dt, s)])[0]
    return all_(eq, stream=s)
