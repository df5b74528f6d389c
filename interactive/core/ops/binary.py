"""Elementwise ops, part 2: binary arithmetic, comparison, logical and bitwise ops.

Every op takes ``scalar | array`` operands typed by MLX's weak-scalar rule (``to_arrays``),
promotes, casts, broadcasts and records one primitive named as MLX prints it.
"""

from __future__ import annotations

from typing import Any

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import Primitive
from .convert import broadcast_arrays, broadcast_shapes, cast, incompatible, to_arrays
from .elementwise import binary, float_dtype

__all__ = [
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "divmod", "power",
    "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "logaddexp", "arctan2", "bitwise_and",
    "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
]

_SIG = "{}(a: scalar | array, b: scalar | array, stream: StreamOrDevice = None) -> array"
_SIG_KW = "{}(a: scalar | array, b: scalar | array, /, *, stream: StreamOrDevice = None) -> array"


def operands(op: str, a: Any, b: Any, sig: str = _SIG) -> tuple[array, array]:
    """Both operands as arrays (weakly typed scalars); None is MLX's TypeError."""
    if a is None or b is None:
        raise incompatible(op, sig.format(op), a, b)
    return to_arrays(a, b)


def given(op: str, a: Any, b: Any, sig: str = _SIG) -> tuple[Any, Any]:
    """Both operands as given, for ``binary`` to convert (its ``to_arrays``); None is MLX's
    TypeError."""
    if a is None or b is None:
        raise incompatible(op, sig.format(op), a, b)
    return a, b


def add(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise addition with numpy-style broadcasting."""
    return binary("Add", *given("add", a, b), stream)


def subtract(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise subtraction."""
    return binary("Subtract", *given("subtract", a, b), stream)


def multiply(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise multiplication."""
    return binary("Multiply", *given("multiply", a, b), stream)


def divide(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise true division (integers divide in float32)."""
    a, b = operands("divide", a, b)
    return binary("Divide", a, b, stream, dtype=float_dtype(_dt.promote_types(a.dtype, b.dtype)))


def floor_divide(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise floor division (``floor(a / b)`` for floats, plain division for complex)."""
    return binary("FloorDivide", *given("floor_divide", a, b), stream)


def remainder(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise remainder with the sign of the divisor (Python's ``%``)."""
    a, b = operands("remainder", a, b)
    if _dt.promote_types(a.dtype, b.dtype) == _dt.complex64:
        raise ValueError("[remainder] Complex type not supported.")
    return binary("Remainder", a, b, stream)


def divmod(a: Any, b: Any, stream: StreamOrDevice = None) -> list:
    """``[floor_divide(a, b), remainder(a, b)]`` as one ``DivMod`` node with two outputs."""
    a, b = operands("divmod", a, b)
    dt = _dt.promote_types(a.dtype, b.dtype)
    if dt == _dt.complex64:
        raise ValueError("[divmod] Complex type not supported.")
    broadcast_shapes(a.shape, b.shape)
    s = resolve_stream(stream)
    a, b = broadcast_arrays(cast(a, dt, s), cast(b, dt, s), stream=s)
    return array._make([a.shape, a.shape], [dt, dt], Primitive("DivMod", s), [a, b])


def power(a: Any, b: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise power (integer powers wrap; negative integer exponents give 0)."""
    return binary("Power", *given("power", a, b, _SIG_KW), stream)


def maximum(a: Any, b: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise maximum (NaN propagates)."""
    return binary("Maximum", *given("maximum", a, b, _SIG_KW), stream)


def minimum(a: Any, b: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise minimum (NaN propagates)."""
    return binary("Minimum", *given("minimum", a, b, _SIG_KW), stream)


def _compare(name: str, op: str, a: Any, b: Any, stream: StreamOrDevice) -> array:
    return binary(name, *given(op, a, b), stream, out_dtype=_dt.bool_)


def equal(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise ``a == b``."""
    return _compare("Equal", "equal", a, b, stream)


def not_equal(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise ``a != b``."""
    return _compare("NotEqual", "not_equal", a, b, stream)


def less(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise ``a < b``."""
    return _compare("Less", "less", a, b, stream)


def less_equal(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise ``a <= b``."""
    return _compare("LessEqual", "less_equal", a, b, stream)


def greater(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise ``a > b``."""
    return _compare("Greater", "greater", a, b, stream)


def greater_equal(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise ``a >= b``."""
    return _compare("GreaterEqual", "greater_equal", a, b, stream)


_SIG_LOGICAL = "{}(a: array, b: array, /, *, stream: StreamOrDevice = None) -> array"


def logical_and(a: array, b: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise logical and (inputs cast to bool)."""
    a, b = operands("logical_and", a, b, _SIG_LOGICAL)
    return binary("LogicalAnd", a, b, stream, dtype=_dt.bool_)


def logical_or(a: array, b: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise logical or (inputs cast to bool)."""
    a, b = operands("logical_or", a, b, _SIG_LOGICAL)
    return binary("LogicalOr", a, b, stream, dtype=_dt.bool_)


def logaddexp(a: Any, b: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise ``log(exp(a) + exp(b))``, computed stably."""
    a, b = operands("logaddexp", a, b, _SIG_KW)
    return binary("LogAddExp", a, b, stream, dtype=float_dtype(_dt.promote_types(a.dtype, b.dtype)))


def arctan2(a: Any, b: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise inverse tangent of ``a / b`` in the right quadrant."""
    a, b = operands("arctan2", a, b, _SIG_KW)
    dt = float_dtype(_dt.promote_types(a.dtype, b.dtype))
    if dt == _dt.complex64:
        raise ValueError("[arctan2] Not supported for complex64.")
    return binary("ArcTan2", a, b, stream, dtype=dt)


def _bitwise(name: str, op: str, a: Any, b: Any, stream: StreamOrDevice, shift: bool = False) -> array:
    a, b = operands(op, a, b)
    dt = _dt.promote_types(a.dtype, b.dtype)
    shown = (a.dtype, b.dtype)
    if op == "right_shift":  # MLX casts both inputs before checking, so it names that type
        shown = (dt, dt) if dt != _dt.bool_ else (_dt.uint8, _dt.uint8)
    if not (_dt.is_integer(dt) or dt == _dt.bool_):
        raise RuntimeError(f"[{op}] Only allowed on integer or boolean types but got types "
                           f"{shown[0].name} and {shown[1].name}.")
    if shift and dt == _dt.bool_:
        dt = _dt.uint8
    return binary(name, a, b, stream, dtype=dt)


def bitwise_and(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise bitwise and of integers or bools."""
    return _bitwise("BitwiseAnd", "bitwise_and", a, b, stream)


def bitwise_or(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise bitwise or of integers or bools."""
    return _bitwise("BitwiseOr", "bitwise_or", a, b, stream)


def bitwise_xor(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise bitwise xor of integers or bools."""
    return _bitwise("BitwiseXor", "bitwise_xor", a, b, stream)


def left_shift(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise ``a << b`` (bools shift as uint8)."""
    return _bitwise("LeftShift", "left_shift", a, b, stream, shift=True)


def right_shift(a: Any, b: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise ``a >> b`` (arithmetic for signed integers; bools shift as uint8)."""
    return _bitwise("RightShift", "right_shift", a, b, stream, shift=True)
