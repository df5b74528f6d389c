"""Small ops MLX has that no other family covers: view, trunc, logical_xor, full_like, flip,
unstack, diff, asarray, result_type, can_cast and searchsorted.

Each is built from the primitives MLX records for it (checked with ``mx.export_to_dot``):
``view`` records ``View`` and ``searchsorted`` records ``SearchSorted`` (rules in
``tapescope.kernels.rules.extras``); the others compose existing ops.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import Primitive
from ..compile_trace import in_dynamic_tracing, note_partners
from .binary import less, not_equal, subtract
from .convert import broadcast, broadcast_shapes, cast, incompatible, to_array, to_arrays
from .elementwise import unary
from .indexing import _slice
from .shape import _axis, split, squeeze
from .ternary import where

__all__ = ["view", "trunc", "logical_xor", "full_like", "flip", "unstack", "diff", "asarray",
           "result_type", "can_cast", "searchsorted"]


_SCALARS = (bool, int, float, complex)


def _scalar_or_array(fname: str, sig: str, a: Any, *rest: Any) -> array:
    """A ``scalar | array`` argument as an array (MLX's binding error otherwise)."""
    if isinstance(a, array):
        return a
    if isinstance(a, _SCALARS):
        return to_array(a)
    if isinstance(a, (list, tuple)):
        raise ValueError("Invalid type list received in array initialization.")
    raise incompatible(fname, sig, a, *rest)


_VIEW_SIG = "view(a: scalar | array, dtype: Dtype, stream: StreamOrDevice = None) -> array"


def view(a: Union[int, float, bool, complex, array], dtype: _dt.Dtype,
         stream: StreamOrDevice = None) -> array:
    """The bits of ``a`` read as ``dtype``; the last axis scales by the itemsize ratio."""
    if not isinstance(dtype, _dt.Dtype):
        raise incompatible("view", _VIEW_SIG, a, dtype)
    a = _scalar_or_array("view", _VIEW_SIG, a, dtype)
    if a.dtype == dtype:
        return a._handle()
    ibytes, obytes = a.dtype.size, dtype.size
    shape = list(a.shape)
    if ibytes != obytes:
        if not shape:
            raise ValueError("[view] Changing the type of a scalar is only allowed for types "
                             "with the same size.")
        if ibytes > obytes:
            shape[-1] *= ibytes // obytes
        else:
            if (shape[-1] * ibytes) % obytes:
                raise ValueError("[view] When viewing as a larger dtype, the size in bytes of "
                                 "the last axis must be a multiple of the requested type size.")
            shape[-1] = shape[-1] * ibytes // obytes
    s = resolve_stream(stream)
    return array._make1(tuple(shape), dtype, Primitive("View", s, dtype=dtype.np), [a])


def trunc(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Round towards zero: ``where(a < 0, ceil(a), floor(a))``; integers pass through."""
    if not isinstance(a, array):
        raise incompatible("trunc", "trunc(a: array, /, *, stream: StreamOrDevice = None) -> array",
                           a)
    if a.dtype == _dt.complex64:
        raise ValueError("[trunc] Not supported for complex64.")
    if _dt.is_integer(a.dtype):
        return a._handle()
    s = resolve_stream(stream)
    return where(less(a, array(0, a.dtype), stream=s), unary("Ceil", a, s), unary("Floor", a, s), stream=s)


def logical_xor(a: Any, b: Any, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise logical exclusive or: ``cast(a, bool) != cast(b, bool)``."""
    a, b = to_arrays(a, b)
    s = resolve_stream(stream)
    return not_equal(cast(a, _dt.bool_, s), cast(b, _dt.bool_, s), stream=s)


_FULL_LIKE_SIG = ("full_like(a: array, vals: scalar | array, dtype: Dtype | None = None, *, "
                  "stream: StreamOrDevice = None) -> array")


def full_like(a: array, vals: Any, dtype: Optional[_dt.Dtype] = None, *,
              stream: StreamOrDevice = None) -> array:
    """``a``'s shape (broadcast with ``vals``') filled with ``vals`` as ``dtype`` (default ``a``'s)."""
    if not isinstance(a, array) or (dtype is not None and not isinstance(dtype, _dt.Dtype)):
        args = (a, vals) if dtype is None else (a, vals, dtype)
        raise incompatible("full_like", _FULL_LIKE_SIG, *args)
    dtype = dtype or a.dtype
    s = resolve_stream(stream)
    v = cast(to_array(vals, dtype), dtype, s)
    shape = broadcast_shapes(a.shape, v.shape)  # as MLX: the values may widen the shape
    b = broadcast(v, shape, stream=s)
    if b._d is not v._d and in_dynamic_tracing():  # follows ``a`` (MLX: broadcast_arrays)
        note_partners(b, [a])
    return array._make1(shape, dtype, Primitive("Full", s), [b])


_FLIP_SIG = ("flip(a: array, /, axis: None | int | Sequence[int] = None, *, "
             "stream: StreamOrDevice = None) -> array")


def flip(a: array, /, axis: Union[None, int, Sequence[int]] = None, *,
         stream: StreamOrDevice = None) -> array:
    """Reverse the order of elements along ``axis`` (all axes by default): one Slice."""
    if not isinstance(a, array):
        raise incompatible("flip", _FLIP_SIG, a)
    axes = range(a.ndim) if axis is None else ((axis,) if isinstance(axis, int) else axis)
    flipped = set()
    for ax in axes:
        n = _axis(ax, a.ndim)
        if n is None:
            raise IndexError(f"[flip] Axis {ax} is out of bounds for array with {a.ndim} "
                             "dimensions.")
        flipped.add(n)
    if not flipped:
        return a._handle()
    start, stop, strides = [], [], []
    for i, d in enumerate(a.shape):
        lo, hi, st = (slice(None, None, -1) if i in flipped else slice(None)).indices(d)
        start.append(lo)
        stop.append(hi)
        strides.append(st)
    return _slice(a, start, stop, strides, resolve_stream(stream))


def unstack(x: array, /, *, axis: int = 0, stream: StreamOrDevice = None) -> tuple:
    """Split ``x`` into a tuple of arrays along ``axis``, removing that axis (Split + Squeeze)."""
    if not isinstance(x, array):
        raise incompatible("unstack", "unstack(x: array, /, *, axis: int = 0, stream: "
                           "StreamOrDevice = None) -> tuple[array, ...]", x)
    ax = _axis(axis, x.ndim)
    if ax is None:
        raise IndexError(f"[unstack] Axis {axis} is out of bounds for array with {x.ndim} "
                         "dimensions.")
    n = x.shape[ax]
    if n == 0:
        return ()
    s = resolve_stream(stream)
    parts = [x] if n == 1 else split(x, n, ax, stream=s)
    return tuple(squeeze(p, ax, stream=s) for p in parts)


def diff(a: array, /, n: int = 1, axis: int = -1, *, stream: StreamOrDevice = None) -> array:
    """The ``n``-th discrete difference along ``axis``: ``a[1:] - a[:-1]``, ``n`` times."""
    if not isinstance(a, array):
        raise incompatible("diff", "diff(a: array, /, n: int = 1, axis: int = -1, *, "
                           "stream: StreamOrDevice = None) -> array", a)
    ax = _axis(axis, a.ndim)
    if ax is None:
        raise IndexError("[diff] Axis is out of bounds for the array.")
    if n < 0:
        raise ValueError("[diff] Order `n` must be non-negative.")
    s = resolve_stream(stream)
    x = a
    for _ in range(n):
        size = x.shape[ax]
        start = [0] * x.ndim
        stop = list(x.shape)
        ones = [1] * x.ndim
        start[ax] = min(1, size)
        hi = _slice(x, start, stop, ones, s)
        start[ax], stop[ax] = 0, max(size - 1, 0)
        lo = _slice(x, start, stop, ones, s)
        x = subtract(hi, lo, stream=s)
    return x


_ASARRAY_SIG = ("asarray(a: scalar | array | Sequence | DLPackCompatible, dtype: Dtype | None "
                "= None, *, copy: bool | None = None) -> array")


def asarray(a: Any, dtype: Optional[_dt.Dtype] = None, *, copy: Optional[bool] = None) -> array:
    """``a`` as an array (sharing an array's data unless ``copy`` or a new ``dtype``)."""
    if dtype is not None and not isinstance(dtype, _dt.Dtype):
        raise incompatible("asarray", _ASARRAY_SIG, a, dtype)
    if copy is False:
        if hasattr(a, "__array_interface__") or hasattr(a, "__dlpack__") and not isinstance(a, array):
            raise ValueError("[convert] Cannot import a CPU array without a copy.")
        raise ValueError("Unable to avoid copy while creating an array as requested.")
    if not isinstance(a, array):
        return array(a, dtype)
    target = dtype or a.dtype
    if copy:
        s = resolve_stream(None)
        return array._make1(a.shape, target, Primitive("AsType", s, dtype=target.np), [a])
    return cast(a, target) if target != a.dtype else array._wrap(a._d)


def _dtype_of(x: Any) -> Optional[_dt.Dtype]:
    if isinstance(x, _dt.Dtype):
        return x
    if isinstance(x, array):
        return x.dtype
    return None


def result_type(*arrays_and_dtypes: Union[array, _dt.Dtype]) -> _dt.Dtype:
    """The dtype that promoting all the given arrays and dtypes together gives."""
    if not arrays_and_dtypes:
        raise ValueError("[result_type] At least one array or dtype is required.")
    out = None
    for x in arrays_and_dtypes:
        d = _dtype_of(x)
        if d is None:
            raise ValueError("[result_type] Inputs must be arrays or dtypes.")
        out = d if out is None else _dt.promote_types(out, d)
    return out


def can_cast(from_: Union[array, _dt.Dtype], to: _dt.Dtype) -> bool:
    """Whether promoting ``from_`` with ``to`` gives ``to``."""
    if not isinstance(to, _dt.Dtype):
        raise incompatible("can_cast", "can_cast(from_: array | Dtype, to: Dtype) -> bool",
                           from_, to)
    d = _dtype_of(from_)
    if d is None:
        raise ValueError("[can_cast] `from_` must be an array or a dtype.")
    return _dt.promote_types(d, to) == to


_SS_SIG = ("searchsorted(sorted_sequence: array, values: array, /, side: str = 'left', *, "
           "stream: StreamOrDevice = None) -> array")


def searchsorted(sorted_sequence: array, values: array, /, side: str = "left", *,
                 stream: StreamOrDevice = None) -> array:
    """Indices (uint32, shaped like ``values``) keeping the 1-D ``sorted_sequence`` sorted."""
    if not isinstance(sorted_sequence, array) or not isinstance(values, array):
        raise incompatible("searchsorted", _SS_SIG, sorted_sequence, values)
    if side not in ("left", "right"):
        raise ValueError(f"[searchsorted] Invalid side '{side}'. Expected 'left' or 'right'.")
    if sorted_sequence.ndim != 1:
        raise ValueError("[searchsorted] The sorted sequence must be 1-D but has "
                         f"{sorted_sequence.ndim} dimensions.")
    s = resolve_stream(stream)
    dt = _dt.promote_types(sorted_sequence.dtype, values.dtype)
    seq, vals = cast(sorted_sequence, dt, s), cast(values, dt, s)
    return array._make1(values.shape, _dt.uint32, Primitive("SearchSorted", s, side=side),
                        [seq, vals])
