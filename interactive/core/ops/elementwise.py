"""Elementwise ops: unary, binary and ternary, with MLX's dtype rules.

Each op records one primitive (after any AsType / Broadcast nodes its inputs need, as MLX
does) whose CPU rule lives in ``tapescope.kernels.rules.elementwise`` under the same name.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import BINARY, TERNARY, UNARY, Primitive, register
from .convert import astype, broadcast_arrays, to_array, to_arrays

__all__ = ["add", "subtract", "multiply", "divide", "exp", "negative"]


def unary(name: str, a: Any, stream: StreamOrDevice, dtype: Optional[_dt.Dtype] = None,
          out_dtype: Optional[_dt.Dtype] = None) -> array:
    """Record unary primitive ``name`` on ``a`` cast to ``dtype``; the output is ``out_dtype``."""
    register(name, UNARY)
    s = resolve_stream(stream)
    a = to_array(a)
    if dtype is not None:
        a = astype(a, dtype, s)
    return array._make([a.shape], [out_dtype or a.dtype], Primitive(name, s), [a])[0]


def binary(name: str, a: Any, b: Any, stream: StreamOrDevice,
           dtype: Optional[_dt.Dtype] = None, out_dtype: Optional[_dt.Dtype] = None) -> array:
    """Record binary primitive ``name``: promote, cast, broadcast, then one node.

    ``dtype`` overrides the promoted compute dtype; ``out_dtype`` (e.g. bool for
    comparisons) the output's.
    """
    register(name, BINARY)
    s = resolve_stream(stream)
    a, b = to_arrays(a, b)
    dt = dtype or _dt.promote_types(a.dtype, b.dtype)
    a, b = broadcast_arrays(astype(a, dt, s), astype(b, dt, s), stream=s)
    return array._make([a.shape], [out_dtype or dt], Primitive(name, s), [a, b])[0]


def float_dtype(d: _dt.Dtype) -> _dt.Dtype:
    """MLX's ``at_least_float``: inexact dtypes stay, everything else computes in float32."""
    return d if _dt.is_inexact(d) else _dt.float32


def add(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise addition with numpy-style broadcasting."""
    return binary("Add", a, b, stream)


def subtract(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise subtraction."""
    return binary("Subtract", a, b, stream)


def multiply(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise multiplication."""
    return binary("Multiply", a, b, stream)


def divide(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise true division (integers divide in float32)."""
    a, b = to_arrays(a, b)
    return binary("Divide", a, b, stream, dtype=float_dtype(_dt.promote_types(a.dtype, b.dtype)))


def exp(a: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise exponential."""
    a = to_array(a)
    return unary("Exp", a, stream, dtype=float_dtype(a.dtype))


def negative(a: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise negation."""
    a = to_array(a)
    if a.dtype == _dt.bool_:
        raise ValueError("[negative] Not supported for bool, use logical_not instead.")
    return unary("Negative", a, stream)
