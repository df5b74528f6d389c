"""Scalars to arrays (MLX's weak-scalar rule), ``astype`` and broadcasting."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import ASTYPE, BROADCAST, Primitive, register

__all__ = ["astype", "broadcast_to", "broadcast_arrays", "broadcast_shapes"]

register("AsType", ASTYPE)
register("Broadcast", BROADCAST)

Scalar = (bool, int, float, complex, np.generic)


def _scalar_dtype(v: Any, like: Optional[_dt.Dtype]) -> _dt.Dtype:
    """The dtype a Python scalar takes next to an array of dtype ``like`` (weak typing)."""
    if isinstance(v, (bool, np.bool_)):
        return _dt.bool_
    if isinstance(v, (int, np.integer)):
        if like is None or like == _dt.bool_:
            return _dt.int32 if -(2**31) <= int(v) < 2**31 else _dt.int64
        if _dt.is_integer(like):
            info = np.iinfo(like.np)
            if not info.min <= int(v) <= info.max:
                raise ValueError(f"Converting {int(v)} to {like.name} would result in overflow.")
        return like
    if isinstance(v, (float, np.floating)):
        return like if like is not None and _dt.is_inexact(like) else _dt.float32
    if isinstance(v, (complex, np.complexfloating)):
        return _dt.complex64
    raise ValueError(f"Invalid type {type(v).__name__} received in array initialization.")


def to_array(v: Any, like: Optional[_dt.Dtype] = None) -> array:
    """``v`` as an array; a Python scalar is typed weakly against ``like``."""
    if isinstance(v, array):
        return v
    if isinstance(v, Scalar):
        return array(v, _scalar_dtype(v, like))
    return array(v)


def to_arrays(a: Any, b: Any) -> tuple[array, array]:
    """Two operands as arrays, scalars adopting the other operand's dtype where MLX does."""
    if isinstance(a, array) and not isinstance(b, array):
        return a, to_array(b, a.dtype)
    if isinstance(b, array) and not isinstance(a, array):
        return to_array(a, b.dtype), b
    return to_array(a), to_array(b)


def astype(a: array, dtype: _dt.Dtype, stream: StreamOrDevice = None) -> array:
    """Cast to ``dtype`` (no node when the dtype already matches)."""
    a = to_array(a)
    if not isinstance(dtype, _dt.Dtype):
        raise TypeError(f"[astype] Expected a mlx.core.Dtype, got {type(dtype).__name__}.")
    if a.dtype == dtype:
        return a
    s = resolve_stream(stream)
    return array._make([a.shape], [dtype], Primitive("AsType", s, dtype=dtype.np), [a])[0]


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


def broadcast_shapes(*shapes: Sequence[int], op: str = "broadcast_shapes") -> tuple:
    """The numpy-style broadcast of the given shapes, or MLX's ValueError."""
    if not shapes:
        raise ValueError("[broadcast_shapes] No input shapes provided.")
    out = tuple(shapes[0])
    for sh in shapes[1:]:
        sh = tuple(sh)
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


def broadcast_to(a: Any, shape: Sequence[int], stream: StreamOrDevice = None) -> array:
    """Broadcast ``a`` to ``shape`` (a view; no node when the shape already matches)."""
    a = to_array(a)
    shape = tuple(int(s) for s in shape)
    if a.shape == shape:
        return a
    bshape = broadcast_shapes(a.shape, shape)
    if bshape != shape:
        raise ValueError(f"[broadcast_to] Cannot broadcast array of shape {_fmt_shape(a.shape)} "
                         f"into shape {_fmt_shape(shape)}.")
    s = resolve_stream(stream)
    return array._make([shape], [a.dtype], Primitive("Broadcast", s, shape=shape), [a])[0]


def broadcast_arrays(*arrays: Any, stream: StreamOrDevice = None) -> tuple:
    """Broadcast arrays against each other."""
    arrs = [to_array(x) for x in arrays]
    shape = broadcast_shapes(*[x.shape for x in arrs])
    return tuple(broadcast_to(x, shape, stream=stream) for x in arrs)
