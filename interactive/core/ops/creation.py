"""Creation ops: zeros, ones, full, arange, linspace, eye, tri, tril/triu, meshgrid.

``full`` records MLX's ``Full`` on a broadcast of the fill value; ``arange`` records
``Arange``; the rest are compositions of primitives, as in MLX.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from typing import Any, Optional, Sequence, Union

from .. import dtypes as _dt
from ..array import array, check_dimensions
from ..device import BadArgs, StreamOrDevice, binding, resolve_stream
from ..primitive import Primitive
from ..compile_trace import in_dynamic_tracing, note_partners
from . import convert
from .convert import broadcast, broadcast_known, cast, int32, to_array

__all__ = ["zeros", "ones", "full", "zeros_like", "ones_like", "arange", "linspace", "eye",
           "identity", "tri", "tril", "triu", "meshgrid"]


def _shape(shape: Union[int, Sequence[int]]) -> tuple:
    if shape is None:
        raise BadArgs("shape")
    if isinstance(shape, int):
        check_dimensions((shape,))
    shape = (int(shape),) if isinstance(shape, int) else _dims(shape)
    if any(d < 0 for d in shape):
        raise ValueError("[full] Negative dimensions not allowed.")
    return shape


def _dims(shape: Any) -> tuple:
    """A sequence's dimensions as nanobind converts ``std::variant<int, Shape>``: each
    element by ``__index__`` (ints, numpy integers); a float, a string, a numpy scalar in
    place of the sequence: MLX's ``std::bad_cast``."""
    try:
        return tuple(int32(operator.index(d)) for d in shape)
    except TypeError:
        raise RuntimeError("std::bad_cast") from None


def _check_dtype(dtype: Any) -> None:
    if dtype is not None and not isinstance(dtype, _dt.Dtype):
        raise BadArgs("dtype")


def _int(v: Any, name: str) -> int:
    """``v`` as nanobind's ``int`` argument takes it (anything with ``__index__``)."""
    if isinstance(v, float):
        raise BadArgs(name)
    try:
        return operator.index(v)
    except TypeError:
        raise BadArgs(name) from None


_STREAM = "*, stream: StreamOrDevice = None) -> array"
_SHAPE_DTYPE = "(shape: int | Sequence[int], dtype: Dtype | None = float32, " + _STREAM
_LIKE = "(a: array, /, dtype: Dtype | None = None, " + _STREAM
_ARANGE = ("arange(start : int | float, stop : None | int | float, step : None | int | float, "
           "dtype: Dtype | None = None, " + _STREAM,
           "arange(stop : int | float, step : None | int | float = None, dtype: Dtype | None = "
           "None, " + _STREAM)


def _full(shape: tuple, vals: array, stream: StreamOrDevice) -> array:
    """``shape`` (``_shape``'s: non-negative ints) filled with ``vals``: Broadcast + Full."""
    s = resolve_stream(stream)
    # a 0-d value broadcasts to any shape: its Broadcast node without broadcast's checks
    b = broadcast_known(vals, shape, s) if not vals._d.shape else broadcast(vals, shape, stream=s)
    return array._make([shape], [vals.dtype], Primitive("Full", s), [b])[0]


@binding("full(shape: int | Sequence[int], vals: scalar | array, dtype: Dtype | None = None, "
         + _STREAM)
def full(shape: Union[int, Sequence[int]], vals: Any, dtype: Optional[_dt.Dtype] = None, *,
         stream: StreamOrDevice = None) -> array:
    """An array of ``shape`` filled with ``vals`` (broadcast); a scalar takes ``dtype`` weakly."""
    _check_dtype(dtype)
    if vals is None:
        raise BadArgs("vals")
    shape = _shape(shape)
    # As MLX: a Python scalar is typed against ``dtype`` (an int adopts it, a float only an
    # inexact one); an array keeps its own dtype.
    return _full(shape, to_array(vals, dtype), stream)


@binding("zeros" + _SHAPE_DTYPE)
def zeros(shape: Union[int, Sequence[int]], dtype: Optional[_dt.Dtype] = _dt.float32, *,
          stream: StreamOrDevice = None) -> array:
    """An array of zeros."""
    _check_dtype(dtype)
    shape = _shape(shape)
    return _full(shape, convert._scalar(0, dtype or _dt.float32), stream)  # (array(0, dtype)'s)


@binding("ones" + _SHAPE_DTYPE)
def ones(shape: Union[int, Sequence[int]], dtype: Optional[_dt.Dtype] = _dt.float32, *,
         stream: StreamOrDevice = None) -> array:
    """An array of ones."""
    _check_dtype(dtype)
    shape = _shape(shape)
    return _full(shape, convert._scalar(1, dtype or _dt.float32), stream)


@binding("zeros_like" + _LIKE)
def zeros_like(a: array, /, dtype: Optional[_dt.Dtype] = None, *,
               stream: StreamOrDevice = None) -> array:
    """Zeros with the shape (and, unless given, the dtype) of ``a``."""
    if a.__class__ is array and dtype is None:  # an array's shape is _shape's already
        return _like(_full(a._d.shape, convert._scalar(0, a._d.dtype), stream), a)
    _check_dtype(dtype)
    a = to_array(a)
    return _like(zeros(a.shape, dtype or a.dtype, stream=stream), a)


@binding("ones_like" + _LIKE)
def ones_like(a: array, /, dtype: Optional[_dt.Dtype] = None, *,
              stream: StreamOrDevice = None) -> array:
    """Ones with the shape (and, unless given, the dtype) of ``a``."""
    if a.__class__ is array and dtype is None:
        return _like(_full(a._d.shape, convert._scalar(1, a._d.dtype), stream), a)
    _check_dtype(dtype)
    a = to_array(a)
    return _like(ones(a.shape, dtype or a.dtype, stream=stream), a)


def _like(out: array, a: array) -> array:
    """In a shapeless trace the fill's Broadcast follows ``a``'s shape (MLX's ``full_like``:
    ``broadcast_arrays({a, vals})``, mlx/ops.cpp)."""
    node = out._d.node
    if in_dynamic_tracing() and node is not None and node.primitive.defn.fill:
        note_partners(array._wrap(node.inputs[0]), [a])
    return out


def _stop_given(fn):
    """MLX's two ``arange`` overloads: a ``start=`` keyword needs ``stop`` (``arange(start=1,
    step=2)`` matches neither)."""

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> array:
        if "start" in kwargs and "stop" not in kwargs and len(args) < 2:
            raise BadArgs("start")
        return fn(*args, **kwargs)

    return op


@binding(*_ARANGE)
@_stop_given
def arange(start: Union[None, int, float] = None, stop: Union[None, int, float] = None,
           step: Union[None, int, float] = None, dtype: Optional[_dt.Dtype] = None, *,
           stream: StreamOrDevice = None) -> array:
    """Evenly spaced values in ``[start, stop)``; ``arange(stop)`` starts at 0."""
    if start is None and stop is None:
        raise BadArgs("start")
    if stop is None:
        start, stop = 0, start
    elif start is None:
        start = 0
    _check_dtype(dtype)
    vals = (start, stop, 1 if step is None else step)
    for v in vals:
        if not isinstance(v, (int, float)):
            raise BadArgs("start")
    if dtype is None and any(isinstance(v, bool) for v in vals):
        raise ValueError("bool not supported for arange.")
    start, stop, step = vals
    if dtype is None:
        if any(isinstance(v, float) for v in vals):
            dtype = _dt.float32
        elif all(-(2**31) <= v < 2**31 for v in vals):
            dtype = _dt.int32
        else:
            dtype = _dt.int64
    if dtype == _dt.bool_:
        raise ValueError("bool not supported for arange.")
    # MLX's order of checks (mlx/ops.cpp arange)
    if any(math.isnan(v) for v in vals) or math.isinf(start) or math.isinf(stop):
        raise ValueError("[arange] Cannot compute length.")
    if step == 0:
        raise ValueError("[arange] step must be nonzero.")
    if math.isinf(step):  # one element when the range goes the step's way, else none
        size = 1 if (step > 0 and start < stop) or (step < 0 and start > stop) else 0
        return array([start] * size, dtype)
    real = (float(stop) - float(start)) / float(step)
    size = math.ceil(real)
    if size > 2**31 - 1:
        raise ValueError("[arange] Maximum size exceeded.")
    size = max(size, 0)
    if _dt.is_integer(dtype):  # MLX: start and start + step cast to the dtype; step = difference
        start, step = int(start), int(start + step) - int(start)
    s = resolve_stream(stream)
    prim = Primitive("Arange", s, start=start, step=step, size=size, dtype=dtype.np)
    return array._make([(size,)], [dtype], prim, [])[0]


@binding("linspace(start: scalar, stop: scalar, num: int | None = 50, endpoint: bool = True, "
         "dtype: Dtype | None = float32, stream: StreamOrDevice = None) -> array")
def linspace(start: Any, stop: Any, num: Optional[int] = 50, endpoint: bool = True,
             dtype: Optional[_dt.Dtype] = _dt.float32, stream: StreamOrDevice = None) -> array:
    """``num`` evenly spaced samples from ``start`` to ``stop`` (inclusive when ``endpoint``)."""
    from .. import ops
    add, divide, multiply, subtract = ops.add, ops.divide, ops.multiply, ops.subtract

    for v in (start, stop):  # MLX's "scalar": a real number or an array, not a complex
        if not isinstance(v, (numbers.Real, array)):
            raise BadArgs("start")
    num = _int(num, "num")  # (None too, whatever the signature says)
    if not isinstance(endpoint, bool):  # (not numpy's bool either)
        raise BadArgs("endpoint")
    _check_dtype(dtype)
    if num < 0:
        raise ValueError(f"[linspace] number of samples, {num}, must be non-negative.")
    dtype = dtype or _dt.float32
    s = resolve_stream(stream)
    if num == 1:
        return cast(array([start], _dt.float32), dtype, s)
    inner = _dt.float64 if dtype == _dt.float64 else _dt.float32  # MLX's inner type
    seq = arange(0, num, dtype=inner, stream=s)
    denom = num - 1 if endpoint else num
    t = divide(seq, array(denom, inner), stream=s)
    t_bar = subtract(array(1.0, inner), t, stream=s)
    out = add(multiply(t_bar, array(start, inner), stream=s),
              multiply(t, array(stop, inner), stream=s), stream=s)
    return cast(out, dtype, s)


@binding("eye(n: int, m: int | None = None, k: int = 0, dtype: Dtype | None = float32, "
         + _STREAM)
def eye(n: int, m: Optional[int] = None, k: int = 0, dtype: Optional[_dt.Dtype] = _dt.float32, *,
        stream: StreamOrDevice = None) -> array:
    """A 2-D array with ones on the ``k``-th diagonal and zeros elsewhere."""
    n, k = _int(n, "n"), _int(k, "k")
    m = n if m is None else _int(m, "m")
    _check_dtype(dtype)
    if n < 0 or m < 0:
        raise ValueError("[eye] N and M must be positive integers.")
    dtype = dtype or _dt.float32
    from .indexing import _scatter

    s = resolve_stream(stream)
    out = zeros((n, m), dtype, stream=s)
    length = max(0, min(n, m - k) if k >= 0 else min(n + k, m))
    if length == 0:
        return out
    rows = arange(max(0, -k), max(0, -k) + length, stream=s)
    cols = arange(max(0, k), max(0, k) + length, stream=s)
    return _scatter(out, [rows, cols], ones((length, 1, 1), dtype, stream=s), (0, 1), "none", s)


@binding("identity(n: int, dtype: Dtype | None = float32, " + _STREAM)
def identity(n: int, dtype: Optional[_dt.Dtype] = _dt.float32, *,
             stream: StreamOrDevice = None) -> array:
    """The ``n`` x ``n`` identity matrix."""
    n = _int(n, "n")
    _check_dtype(dtype)
    return eye(n, n, 0, dtype, stream=stream)


def _tri_mask(n: int, m: int, k: int, s) -> array:
    """Boolean (n, m) mask of ``col <= row + k`` (MLX: two Aranges and GreaterEqual)."""
    from .. import ops
    from .shape import expand_dims

    rows = broadcast(expand_dims(arange(0, n, stream=s), 1, stream=s), (n, m), stream=s)
    cols = broadcast(expand_dims(arange(-k, m - k, stream=s), 0, stream=s), (n, m), stream=s)
    return ops.greater_equal(rows, cols, stream=s)


@binding("tri(n: int, m: int | None = None, k: int = 0, dtype: Dtype | None = None, " + _STREAM)
def tri(n: int, m: Optional[int] = None, k: int = 0, dtype: Optional[_dt.Dtype] = None, *,
        stream: StreamOrDevice = None) -> array:
    """An (n, m) array with ones at and below the ``k``-th diagonal."""
    n, k = _int(n, "n"), _int(k, "k")
    m = n if m is None else _int(m, "m")
    _check_dtype(dtype)
    s = resolve_stream(stream)
    return cast(_tri_mask(max(n, 0), max(m, 0), k, s), dtype or _dt.float32, s)


def _tril_triu(name: str, x: array, k: int, lower: bool, stream: StreamOrDevice) -> array:
    from .. import ops

    x = to_array(x)
    if x.ndim < 2:
        raise ValueError(f"[{name}] array must be at least 2-D")
    s = resolve_stream(stream)
    n, m = x.shape[-2:]
    mask = _tri_mask(n, m, k if lower else k - 1, s)
    zero = zeros((), x.dtype, stream=s)
    if lower:
        return ops.where(mask, x, zero, stream=s)
    return ops.where(mask, zero, x, stream=s)


def tril(x: array, k: int = 0, *, stream: StreamOrDevice = None) -> array:
    """Zero the elements above the ``k``-th diagonal of the last two axes."""
    return _tril_triu("tril", x, k, True, stream)


def triu(x: array, k: int = 0, *, stream: StreamOrDevice = None) -> array:
    """Zero the elements below the ``k``-th diagonal of the last two axes."""
    return _tril_triu("triu", x, k, False, stream)


def meshgrid(*arrays: array, sparse: Optional[bool] = False, indexing: Optional[str] = "xy",
             stream: StreamOrDevice = None) -> tuple:
    """Coordinate arrays from 1-D coordinate vectors (``indexing`` "xy" or "ij")."""
    from .shape import reshape

    if indexing not in ("xy", "ij"):
        raise ValueError("[meshgrid] Invalid indexing value. Valid values are 'xy' and 'ij'.")
    arrs = [to_array(a) for a in arrays]
    n = len(arrs)
    if n == 0:
        return ()
    # "xy" (Cartesian) swaps the roles of the first two axes.
    pos = list(range(n))
    if indexing == "xy" and n > 1:
        pos[0], pos[1] = 1, 0
    full_shape = [1] * n
    outs = []
    for i, a in enumerate(arrs):
        shape = [1] * n
        shape[pos[i]] = -1 if a.size else 0
        full_shape[pos[i]] = a.size
        outs.append(reshape(a, shape, stream=stream))
    if sparse:
        return tuple(outs)
    return tuple(broadcast(o, full_shape, stream=stream) for o in outs)
