"""Scalars to arrays (MLX's weak-scalar rule), ``astype`` and broadcasting."""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import numpy as np

from .. import dtypes as _dt
from ..array import ArrayDesc, array
from ..device import BadArgs, StreamOrDevice, binding, nb_type_name, resolve_stream
from ..primitive import Primitive

__all__ = ["astype", "broadcast_to", "broadcast_arrays", "broadcast_shapes", "isdtype"]

isdtype = _dt.isdtype  # exported here because tapescope.core re-exports every op module


# What MLX's bindings accept where they say ``scalar | array``: Python scalars, mx arrays,
# and array-likes (numpy arrays and numpy scalars). Lists, strings, ... are refused.
Scalar = (bool, int, float, complex, np.generic)
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def type_name(obj: Any) -> str:
    """A value's type as MLX's bindings name it in messages."""
    return nb_type_name(obj)


def incompatible(fn: str, signature: str, *args: Any) -> TypeError:
    """The TypeError MLX's bindings raise for an argument of a type they do not accept."""
    types = ", ".join(type_name(a) for a in args)
    return TypeError(f"{fn}(): incompatible function arguments. The following argument types "
                     f"are supported:\n    1. {signature}\n\nInvoked with types: {types}")


def is_scalar_or_array(v: Any) -> bool:
    """Whether ``v`` is something MLX converts where an op takes ``scalar | array``."""
    # MLX's ScalarOrArray (python/src/utils.h) takes any nb::ndarray: a DLPack producer too
    return isinstance(v, (array, np.ndarray) + Scalar) or hasattr(type(v), "__dlpack__")


def _wrap_int(v: int, bits: int) -> int:
    """``v`` converted to a signed ``bits``-bit integer as C does (two's complement wrap)."""
    m = 1 << bits
    v %= m
    return v - m if v >= m // 2 else v


# Python floats that convert to these dtypes without overflow (NaN fails the range test, so
# bfloat16's NaN rule stays the constructor's)
_FAST_FLOAT_LIMIT = {_dt.float32: float(np.finfo(np.float32).max),
                     _dt.complex64: float(np.finfo(np.float32).max),
                     _dt.float64: float(np.finfo(np.float64).max), _dt.float16: 65504.0,
                     _dt.bfloat16: 3.3895313892515355e38}  # (bfloat16's largest finite)
# MLX makes a Python float a float32 first, then casts it: a 16-bit float rounds twice
_THROUGH_FLOAT32 = (_dt.float16, _dt.bfloat16)


def _scalar(v: Any, dtype: _dt.Dtype) -> array:
    """A 0-d array of a Python scalar already known to fit ``dtype`` (the fast path)."""
    if dtype in _THROUGH_FLOAT32 and v.__class__ is not int:
        v = np.float32(v)
    return array._wrap(ArrayDesc((), dtype, resolve_stream(None), data=np.array(v, dtype=dtype.np)))


def _weak_int(v: int, like: Optional[_dt.Dtype]) -> array:
    if not _INT64[0] <= v <= _INT64[1]:
        raise RuntimeError("std::bad_cast")
    default = _dt.int32 if _INT32[0] <= v <= _INT32[1] else _dt.int64
    if like is None:
        return _scalar(v, default)
    if like is _dt.bool_:  # MLX takes the int as a C int here: wrapped to 32 bits
        return _scalar(_wrap_int(v, 32), _dt.int32)
    if like.kind in "ui":
        if like.size < 8:
            info = np.iinfo(like.np)
            if not info.min <= v <= info.max:
                raise ValueError(f"Converting {v} to {like.name} would result in overflow.")
        elif like is _dt.uint64 and v < 0:
            return array(v, like)  # the constructor's wrap rules
        return _scalar(v, like)
    if like.kind in "fc" and -65504 <= v <= 65504:  # exact enough for every float dtype
        return _scalar(v, like)
    return array(v, like)


def _weak_float(v: float, like: Optional[_dt.Dtype]) -> array:
    """A float typed weakly: ``like`` when inexact, else float32."""
    dt = like if like is not None and _dt.is_inexact(like) else _dt.float32
    lim = _FAST_FLOAT_LIMIT.get(dt)
    if lim is not None and -lim <= v <= lim:  # fits without overflow, and is not NaN
        return _scalar(v, dt)
    return array(v, dt)


def to_array(v: Any, like: Optional[_dt.Dtype] = None) -> array:
    """``v`` as an array, as MLX's bindings convert a ``scalar | array`` argument.

    With ``like`` (the dtype of the other, array operand) a Python scalar is typed weakly:
    an int takes an integer/float ``like`` (raising on overflow), a float takes an inexact
    ``like`` and is float32 otherwise; numpy scalars and arrays are cast to ``like``.
    """
    if v.__class__ is float:  # the common operand (an optimizer's, a loss's): its own test
        return _weak_float(v, like)
    if isinstance(v, array):
        return v
    if isinstance(v, bool):
        return array(v, _dt.bool_)
    if isinstance(v, int):
        return _weak_int(v, like)
    if isinstance(v, float):  # (numpy's float64 too)
        return _weak_float(v, like)
    if isinstance(v, complex):
        return array(v, _dt.complex64)
    if isinstance(v, (np.ndarray, np.generic)) or hasattr(type(v), "__dlpack__"):
        out = array(v)  # (a DLPack producer, e.g. a torch tensor: MLX's nb::ndarray operand)
        return out if like is None else cast(out, like)
    if v is None:
        raise incompatible("array", "array(a: scalar | array) -> array", v)
    if hasattr(type(v), "__mlx_array__"):  # an ArrayLike
        return to_array(v.__mlx_array__(), like)
    raise ValueError(f"Invalid type {type_name(v)} received in array initialization.")


def to_arrays(a: Any, b: Any) -> tuple[array, array]:
    """Two operands as arrays: a non-array next to an array is typed weakly against it."""
    if isinstance(a, array) and not isinstance(b, array):
        return a, to_array(b, a.dtype)
    if isinstance(b, array) and not isinstance(a, array):
        return to_array(a, b.dtype), b
    return to_array(a), to_array(b)


def astype(a: array, dtype: _dt.Dtype, /, *, stream: StreamOrDevice = None) -> array:
    """Convert an array to a given type."""
    out = cast(a, dtype, stream)
    # MLX returns a new handle even when the dtype matches (the same array, shared): an
    # in-place operator on the result (``lr = p.astype(t); lr *= 2`` in mlx.optimizers' Muon)
    # must not overwrite the caller's handle
    return array._wrap(out._d) if out is a else out


def cast(a: Any, dtype: _dt.Dtype, stream: StreamOrDevice = None) -> array:
    """``astype`` for internal callers (stream positional): no node when the dtype matches."""
    if a.__class__ is array and a._d.dtype is dtype:  # the common case (dtypes are singletons)
        return a._handle()
    a = to_array(a)
    if not isinstance(dtype, _dt.Dtype):
        raise TypeError(f"[astype] Expected a mlx.core.Dtype, got {type(dtype).__name__}.")
    if a.dtype == dtype:
        return a._handle()
    s = resolve_stream(stream)
    return array._make([a.shape], [dtype], Primitive("AsType", s, dtype=dtype.np), [a])[0]


def int32(v: Any) -> int:
    """``v`` as MLX's bindings take a C++ ``int`` (shape dimensions, axes): nanobind's
    OverflowError outside the 32-bit range; anything without ``__index__`` (a float, a string,
    numpy's float32) is refused as nanobind's int caster refuses it (``BadArgs``)."""
    try:
        v = operator.index(v)
    except TypeError:
        raise BadArgs(f"expected an int, got {type(v).__name__}") from None
    if not -(2**31) <= v < 2**31:
        raise OverflowError(f"Integer value {v} is outside the supported range "
                            "[-2147483648, 2147483647].")
    return v


_INT_ONLY = frozenset((int,))


def int32s(v: Sequence[Any]) -> tuple:
    """A sequence as a tuple of ``int32`` values (shapes, axes), each checked as ``int32``
    checks it; a tuple of plain in-range ints (the common case) is checked in one pass."""
    t = tuple(v)
    if not t:
        return t
    if set(map(type, t)) <= _INT_ONLY and -(2**31) <= min(t) and max(t) < 2**31:
        return t
    return tuple(int32(x) for x in t)


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


def broadcast_shapes(*shapes: Sequence[int]) -> tuple:
    """The shape the given shapes broadcast to (numpy's rule), or MLX's ValueError."""
    return broadcast_shape_of(shapes)


def broadcast_shape_of(shapes: Sequence[Sequence[int]], op: str = "broadcast_shapes") -> tuple:
    """``broadcast_shapes`` for internal callers; ``op`` names the caller in the error."""
    if not shapes:
        raise ValueError("[broadcast_shapes] No input shapes provided.")
    out = tuple(shapes[0])
    for sh in shapes[1:]:
        sh = tuple(sh)
        if sh == out:  # the common case: nothing to broadcast
            continue
        n = max(len(out), len(sh))
        a = (1,) * (n - len(out)) + out
        b = (1,) * (n - len(sh)) + sh
        res = []
        for x, y in zip(a, b):
            if x == y or y == 1:
                res.append(x)
            elif x == 1:
                res.append(y)
            else:
                raise ValueError(f"[{op}] Shapes {_fmt_shape(out)} and {_fmt_shape(sh)} cannot be broadcast.")
        out = tuple(res)
    return out


@binding("broadcast_to(a: scalar | array, /, shape: Sequence[int], *, stream: StreamOrDevice = "
         "None) -> array")
def broadcast_to(a: Any, /, shape: Sequence[int], *, stream: StreamOrDevice = None) -> array:
    """Broadcast an array to the given shape."""
    return broadcast(a, shape, stream)


def broadcast(a: Any, shape: Sequence[int], stream: StreamOrDevice = None) -> array:
    """``broadcast_to`` for internal callers (a view; no node when the shape already matches)."""
    a = to_array(a)
    shape = int32s(shape)
    if a._d.shape == shape:
        return a._handle()
    if any(d < 0 for d in shape):
        raise ValueError("[broadcast_to] Negative dimensions not allowed.")
    bshape = broadcast_shapes(a.shape, shape)
    if bshape != shape:
        raise ValueError(f"Cannot broadcast array of shape {_fmt_shape(a.shape)} "
                         f"into shape {_fmt_shape(shape)}.")
    s = resolve_stream(stream)
    return array._make([shape], [a.dtype], Primitive("Broadcast", s, shape=shape), [a])[0]


def broadcast_known(a: array, shape: tuple, s) -> array:
    """``broadcast`` to a shape of ints already known to be ``a``'s broadcast (an op that
    computed it with ``broadcast_shapes``): the handle when equal, else one Broadcast node."""
    if a._d.shape == shape:
        return a._handle()
    return array._make1(shape, a._d.dtype, Primitive("Broadcast", s, shape=shape), [a])


def broadcast_arrays(*arrays: Any, stream: StreamOrDevice = None) -> tuple:
    """Broadcast arrays against each other."""
    arrs = [to_array(x) for x in arrays]
    shape = broadcast_shapes(*[x.shape for x in arrs])
    outs = tuple(broadcast(x, shape, stream) for x in arrs)
    from ..compile_trace import in_dynamic_tracing, note_partners

    if in_dynamic_tracing():  # each follows the others' shapes (MLX: their stop-gradients)
        for i, (x, o) in enumerate(zip(arrs, outs)):
            if o._d is not x._d:
                note_partners(o, arrs[:i] + arrs[i + 1:])
    return outs
