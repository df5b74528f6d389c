"""Elementwise ops, part 1: the shared helpers and every unary op, with MLX's dtype rules.

Each op records one primitive (after any AsType / Broadcast nodes its inputs need, as MLX
does) whose rule lives in ``tapescope.kernels.rules.elementwise`` under the same name.
Binary ops are in ``ops/binary.py``; where / clip / nan_to_num / isclose in ``ops/ternary.py``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import Primitive
from .convert import broadcast_shapes, cast, incompatible, to_array, to_arrays

__all__ = [
    "abs", "negative", "sign", "sqrt", "rsqrt", "square", "reciprocal", "exp", "expm1", "log",
    "log1p", "log2", "log10", "sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh",
    "tanh", "arcsinh", "arccosh", "arctanh", "floor", "ceil", "round", "sigmoid", "erf", "erfinv",
    "degrees", "radians", "logical_not", "bitwise_invert", "isnan", "isinf", "isposinf",
    "isneginf", "isfinite", "real", "imag", "conjugate", "conj", "stop_gradient",
]

_SIG_UNARY = "{}(a: array, /, *, stream: StreamOrDevice = None) -> array"


def arg(v: Any, op: str, sig: str = _SIG_UNARY) -> array:
    """An op's array argument: arrays pass, scalars / numpy convert, None is a TypeError."""
    if v.__class__ is array:
        return v
    if v is None:
        raise incompatible(op, sig.format(op), v)
    return to_array(v)


def unary(name: str, a: array, stream: StreamOrDevice, dtype: Optional[_dt.Dtype] = None,
          out_dtype: Optional[_dt.Dtype] = None) -> array:
    """Record unary primitive ``name`` on ``a`` cast to ``dtype``; the output is ``out_dtype``."""
    s = resolve_stream(stream)
    if a.__class__ is not array:
        a = to_array(a)
    if dtype is not None and a._d.dtype is not dtype:
        a = cast(a, dtype, s)
    return array._make1(a._d.shape, out_dtype or a._d.dtype, Primitive(name, s), [a])


def binary_py(name: str, a: Any, b: Any, stream: StreamOrDevice,
              dtype: Optional[_dt.Dtype] = None, out_dtype: Optional[_dt.Dtype] = None) -> array:
    """Record binary primitive ``name``: promote, cast, broadcast, then one node.

    ``a`` / ``b``: arrays or ``scalar | array`` values (``to_arrays``: a scalar next to an
    array typed weakly against it).

    ``dtype`` overrides the promoted compute dtype; ``out_dtype`` (e.g. bool for
    comparisons) the output's. The shapes are checked before any node is recorded.
    """
    s = resolve_stream(stream)
    if a.__class__ is not array or b.__class__ is not array:
        a, b = to_arrays(a, b)
    ad, bd = a._d.dtype, b._d.dtype
    dt = dtype or (ad if ad is bd else _dt.promote_types(ad, bd))
    shape = a._d.shape
    if shape == b._d.shape:  # the common case: nothing to broadcast
        if ad is not dt:
            a = cast(a, dt, s)
        if bd is not dt:
            b = cast(b, dt, s)
        return array._make1(shape, out_dtype or dt, Primitive(name, s), [a, b])
    bshape = b._d.shape
    # a 0-d operand (a Python scalar's) broadcasts to the other's shape; else numpy's rule,
    # which raises before anything is recorded
    out = shape if not bshape else bshape if not shape else broadcast_shapes(shape, bshape)
    if ad is not dt:
        a = cast(a, dt, s)
    if bd is not dt:
        b = cast(b, dt, s)
    if shape != out:
        a = _broadcast(a, out, s)
    if b._d.shape != out:
        b = _broadcast(b, out, s)
    return array._make1(out, out_dtype or dt, Primitive(name, s), [a, b])


binary = binary_py


def _c_binary() -> None:
    """``binary`` in C (core/_binary.c: the same steps, nodes and descs), where the
    extension is built and ``settings.c_call`` is on; ``binary_py`` otherwise."""
    from tapescope.kernels.allocator import BufferHandle, allocator
    from tapescope.kernels.backends import stream_backend
    from tapescope.kernels.primitives import REGISTRY
    from tapescope.kernels.settings import settings

    if not settings.c_call or getattr(array._make1, "__module__", None) != "tapescope.core._call":
        return
    from .. import _call

    _call.configure_binary({
        "primitive_type": Primitive, "registry": REGISTRY, "promote_types": _dt.promote_types,
        "to_array": to_array, "cast": cast, "broadcast_shapes": broadcast_shapes,
        "resolve_stream": resolve_stream, "allocator": allocator, "handle_type": BufferHandle,
        "np_array": np.array, "array_type": array, "dtype_type": _dt.Dtype,
        # where a Python scalar's 0-d array is host data the CPU's allocator adopts: the
        # host's streams, and a device's that keeps its scalars there (CUDA's import_host)
        "host_stream": lambda s: (stream_backend(s).array_type is np.ndarray
                                  or stream_backend(s).allocator.scalars_on_host),
        "float16": _dt.float16, "bfloat16": _dt.bfloat16, "float32": _dt.float32, "float64": _dt.float64,
        "complex64": _dt.complex64,
        "inexact": {d for d in _dt.__dict__.values() if isinstance(d, _dt.Dtype) and _dt.is_inexact(d)}})
    globals()["binary"] = _call.binary
    from ..primitive import construct_in_c

    construct_in_c(_call.primitive)  # Primitive(...) made in C too, with binary's configuration
    from . import convert

    scalar_py, scalar_c = convert._scalar, _call.scalar

    def _scalar(v: Any, dtype: _dt.Dtype) -> array:
        a = scalar_c(v, dtype)
        return a if a is not None else scalar_py(v, dtype)

    _scalar.__doc__ = scalar_py.__doc__
    _scalar.__wrapped__ = scalar_py  # (the Python version, which GPU streams take)
    convert._scalar = _scalar


_c_binary()


def _broadcast(a: array, shape: tuple, s) -> array:
    """A Broadcast node to a shape already known to be valid (MLX's broadcast_to)."""
    return array._make1(shape, a._d.dtype, Primitive("Broadcast", s, shape=shape), [a])


def float_dtype(d: _dt.Dtype) -> _dt.Dtype:
    """MLX's ``at_least_float``: inexact dtypes stay, everything else computes in float32."""
    return d if _dt.is_inexact(d) else _dt.float32


def full_of(shape: tuple, value: Any, dtype: _dt.Dtype, s) -> array:
    """``mx.full(shape, value, dtype)`` as MLX builds it (Broadcast + Full)."""
    from .. import ops

    fn = getattr(ops, "full", None)
    if fn is not None:
        return fn(shape, array(value, dtype), dtype, stream=s)
    from .convert import broadcast_to  # the creation family is absent: build it as MLX does

    v = broadcast_to(array(value, dtype), shape, stream=s)
    return array._make([v.shape], [dtype], Primitive("Full", s), [v])[0]


def _no_complex(op: str, a: array) -> None:
    if a.dtype == _dt.complex64:
        raise ValueError(f"[{op}] Not supported for complex64.")


def _float_unary(name: str, op: str, a: Any, stream: StreamOrDevice, complex_ok: bool = True) -> array:
    a = arg(a, op)
    if not complex_ok:
        _no_complex(op, a)
    return unary(name, a, stream, dtype=float_dtype(a.dtype))


def abs(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise absolute value (complex gives float32 magnitudes)."""
    a = arg(a, "abs")
    s = resolve_stream(stream)
    out = unary("Abs", a, s)
    return cast(out, _dt.float32, s) if a.dtype == _dt.complex64 else out


def negative(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise negation."""
    a = arg(a, "negative")
    if a.dtype == _dt.bool_:
        raise ValueError("[negative] Not supported for bool, use logical_not instead.")
    return unary("Negative", a, stream)


def sign(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise sign (-1, 0, 1; ``a / |a|`` for complex)."""
    return unary("Sign", arg(a, "sign"), stream)


def sqrt(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise square root."""
    return _float_unary("Sqrt", "sqrt", a, stream)


def rsqrt(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise reciprocal square root."""
    return _float_unary("Rsqrt", "rsqrt", a, stream)


def square(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise square (keeps the dtype)."""
    return unary("Square", arg(a, "square"), stream)


def reciprocal(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise reciprocal, as MLX builds it: ``divide(1, a)``."""
    a = arg(a, "reciprocal")
    from .binary import divide

    return divide(array(1.0, float_dtype(a.dtype)), a, stream=stream)


def exp(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise exponential."""
    return _float_unary("Exp", "exp", a, stream)


def expm1(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise ``exp(a) - 1``, accurate near zero."""
    return _float_unary("Expm1", "expm1", a, stream, complex_ok=False)


def log(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise natural logarithm."""
    return _float_unary("Log", "log", a, stream)


def log1p(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise ``log(1 + a)``."""
    return _float_unary("Log1p", "log1p", a, stream)


def log2(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise base-2 logarithm."""
    return _float_unary("Log2", "log2", a, stream)


def log10(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise base-10 logarithm."""
    return _float_unary("Log10", "log10", a, stream)


def sin(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise sine."""
    return _float_unary("Sin", "sin", a, stream)


def cos(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise cosine."""
    return _float_unary("Cos", "cos", a, stream)


def tan(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise tangent."""
    return _float_unary("Tan", "tan", a, stream)


def arcsin(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise inverse sine."""
    return _float_unary("ArcSin", "arcsin", a, stream)


def arccos(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise inverse cosine."""
    return _float_unary("ArcCos", "arccos", a, stream)


def arctan(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise inverse tangent."""
    return _float_unary("ArcTan", "arctan", a, stream)


def sinh(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise hyperbolic sine."""
    return _float_unary("Sinh", "sinh", a, stream)


def cosh(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise hyperbolic cosine."""
    return _float_unary("Cosh", "cosh", a, stream)


def tanh(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise hyperbolic tangent."""
    return _float_unary("Tanh", "tanh", a, stream)


def arcsinh(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise inverse hyperbolic sine."""
    return _float_unary("ArcSinh", "arcsinh", a, stream)


def arccosh(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise inverse hyperbolic cosine."""
    return _float_unary("ArcCosh", "arccosh", a, stream)


def arctanh(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise inverse hyperbolic tangent."""
    return _float_unary("ArcTanh", "arctanh", a, stream)


def floor(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise floor (integers and bools pass through)."""
    a = arg(a, "floor")
    _no_complex("floor", a)
    return unary("Floor", a, stream)


def ceil(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise ceiling (integers and bools pass through)."""
    a = arg(a, "ceil")
    _no_complex("ceil", a)
    return unary("Ceil", a, stream)


def round(a: array, /, decimals: int = 0, stream: StreamOrDevice = None) -> array:
    """Round half to even to ``decimals`` places (MLX: scale, Round, unscale, cast back)."""
    sig = "round(a: array, /, decimals: int = 0, stream: StreamOrDevice = None) -> array"
    if a is None or not isinstance(decimals, int) or isinstance(decimals, bool):
        raise incompatible("round", sig, a, decimals)
    a = to_array(a)
    s = resolve_stream(stream)
    if decimals == 0:
        return unary("Round", a, s)
    from .binary import multiply

    dtype = float_dtype(a.dtype)
    scale = np.float32(10.0 ** decimals)
    out = multiply(a, array(scale, dtype), stream=s)
    out = unary("Round", out, s)
    out = multiply(out, array(np.float32(1.0) / scale, dtype), stream=s)
    return cast(out, a.dtype, s)


def sigmoid(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise logistic sigmoid ``1 / (1 + exp(-a))``."""
    return _float_unary("Sigmoid", "sigmoid", a, stream, complex_ok=False)


def erf(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise error function."""
    return _float_unary("Erf", "erf", a, stream, complex_ok=False)


def erfinv(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise inverse error function."""
    return _float_unary("ErfInv", "erfinv", a, stream, complex_ok=False)


def _scaled(op: str, a: Any, factor: float, stream: StreamOrDevice) -> array:
    a = arg(a, op, "{}(a: scalar | array, /, *, stream: StreamOrDevice = None) -> array")
    from .binary import multiply

    return multiply(a, array(factor, float_dtype(a.dtype)), stream=stream)


def degrees(a: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Convert angles from radians to degrees."""
    return _scaled("degrees", a, 180.0 / math.pi, stream)


def radians(a: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Convert angles from degrees to radians."""
    return _scaled("radians", a, math.pi / 180.0, stream)


def logical_not(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise logical not (the input is cast to bool)."""
    return unary("LogicalNot", arg(a, "logical_not"), stream, dtype=_dt.bool_)


def bitwise_invert(a: Any, stream: StreamOrDevice = None) -> array:
    """Element-wise bitwise inversion of integers (logical not of bools)."""
    a = arg(a, "bitwise_invert", "{}(a: scalar | array, stream: StreamOrDevice = None) -> array")
    if _dt.is_inexact(a.dtype):
        raise ValueError("[bitwise_invert] Bitwise inverse only allowed on integer types.")
    return unary("BitwiseInvert", a, stream)


_SIG_PRED = "{}(a: array, stream: StreamOrDevice = None) -> array"


def _exact(a: array) -> bool:
    return a.dtype == _dt.bool_ or _dt.is_integer(a.dtype)


def isnan(a: array, stream: StreamOrDevice = None) -> array:
    """Element-wise test for NaN."""
    a = arg(a, "isnan", _SIG_PRED)
    s = resolve_stream(stream)
    if _exact(a):
        return full_of(a.shape, False, _dt.bool_, s)
    from .binary import not_equal

    return not_equal(a, a, stream=s)


def isposinf(a: array, stream: StreamOrDevice = None) -> array:
    """Element-wise test for positive infinity."""
    a = arg(a, "isposinf", _SIG_PRED)
    s = resolve_stream(stream)
    if _exact(a):
        return full_of(a.shape, False, _dt.bool_, s)
    from .binary import equal

    return equal(a, array(math.inf, a.dtype), stream=s)


def isneginf(a: array, stream: StreamOrDevice = None) -> array:
    """Element-wise test for negative infinity."""
    a = arg(a, "isneginf", _SIG_PRED)
    s = resolve_stream(stream)
    if _exact(a):
        return full_of(a.shape, False, _dt.bool_, s)
    from .binary import equal

    return equal(a, array(-math.inf, a.dtype), stream=s)


def isinf(a: array, stream: StreamOrDevice = None) -> array:
    """Element-wise test for positive or negative infinity."""
    a = arg(a, "isinf", _SIG_PRED)
    s = resolve_stream(stream)
    if _exact(a):
        return full_of(a.shape, False, _dt.bool_, s)
    from .binary import logical_or

    if a.dtype == _dt.complex64:  # as MLX: infinite when either part is
        return logical_or(isinf(real(a, stream=s), stream=s), isinf(imag(a, stream=s), stream=s),
                          stream=s)
    return logical_or(isposinf(a, stream=s), isneginf(a, stream=s), stream=s)


def isfinite(a: array, stream: StreamOrDevice = None) -> array:
    """Element-wise test for finite values (not infinite and not NaN)."""
    a = arg(a, "isfinite", _SIG_PRED)
    s = resolve_stream(stream)
    if _exact(a):
        return full_of(a.shape, True, _dt.bool_, s)
    from .binary import logical_or

    return logical_not(logical_or(isinf(a, stream=s), isnan(a, stream=s), stream=s), stream=s)


def real(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """The real part (the array itself unless complex)."""
    a = arg(a, "real")
    if a.dtype != _dt.complex64:
        return a._handle()
    return unary("Real", a, stream, out_dtype=_dt.float32)


def imag(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """The imaginary part (zeros of the same dtype unless complex)."""
    a = arg(a, "imag")
    s = resolve_stream(stream)
    if a.dtype != _dt.complex64:
        return full_of(a.shape, 0, a.dtype, s)
    return unary("Imag", a, s, out_dtype=_dt.float32)


def conjugate(a: array, *, stream: StreamOrDevice = None) -> array:
    """The complex conjugate (the array itself unless complex)."""
    a = arg(a, "conjugate", "{}(a: array, *, stream: StreamOrDevice = None) -> array")
    if a.dtype != _dt.complex64:
        return a._handle()
    return unary("Conjugate", a, stream)


def conj(a: array, *, stream: StreamOrDevice = None) -> array:
    """The complex conjugate; the same as ``conjugate``."""
    a = arg(a, "conj", "{}(a: array, *, stream: StreamOrDevice = None) -> array")
    return conjugate(a, stream=stream)


def stop_gradient(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """The identity, with no gradient flowing back through it."""
    return unary("StopGradient", arg(a, "stop_gradient"), stream)

