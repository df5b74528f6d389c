"""Reductions: sum, prod, max, min, all, any, mean, var, std, argmax, argmin, logsumexp,
softmax — with MLX's axis / keepdims rules, output dtypes and primitive decompositions.

A reduction records MLX's ``Reduce`` primitive under its printed name (``Sum``, ``Prod``,
``Max``, ``Min``, ``And``, ``Or``) with the sorted ``axes`` it reduces, keeping those axes
as size 1; ``keepdims=False`` adds a ``Squeeze`` as MLX does. Composite ops (mean, var, std,
logsumexp and softmax off the last axis) record the same elementwise primitives MLX records.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

from .. import dtypes as _dt
from ..array import array
from ..compile_trace import in_dynamic_tracing
from ..device import StreamOrDevice, resolve_stream
from ..primitive import REDUCE, REGISTRY, Primitive
from . import convert, elementwise
from .convert import cast

__all__ = ["sum", "prod", "max", "min", "all", "any", "mean", "var", "std", "argmax",
           "argmin", "logsumexp", "softmax"]


Axis = Union[None, int, Sequence[int]]

_py_sum, _py_max, _py_min, _py_all, _py_any = sum, max, min, all, any  # shadowed below


_ops = []  # tapescope.core.ops, once imported (it imports this module)


def op(name: str):
    """A tapescope.core op by name, looked up at call time (other families define it)."""
    if not _ops:
        from .. import ops

        _ops.append(ops)
    fn = getattr(_ops[0], name, None)
    if fn is None:
        raise NotImplementedError(f"[{name}] is not implemented in tapescope yet.")
    return fn


def require_array(fname: str, signature: str, *args: Any) -> None:
    """MLX's binding error when an argument declared ``array`` is something else."""
    for a in args:
        if not isinstance(a, array):
            kinds = ", ".join(type(x).__name__ for x in args)
            raise TypeError(f"{fname}(): incompatible function arguments. The following "
                            f"argument types are supported:\n    1. {signature}\n\n"
                            f"Invoked with types: {kinds}")


def check_int(fname: str, value: Any, what: str = "axis") -> int:
    """An int argument (a Python bool counts, as in MLX's bindings) or a TypeError."""
    if isinstance(value, (int,)) or (hasattr(value, "__index__") and not isinstance(value, float)
                                     and not isinstance(value, array)):
        return int(value)
    raise TypeError(f"{fname}(): incompatible function arguments: {what} must be an int, "
                    f"got {type(value).__name__}.")


_SIG = ("{0}(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, "
        "*, stream: StreamOrDevice = None) -> array")


def axes_list(fname: str, a: array, axis: Axis) -> list:
    """The axes an ``axis`` argument names (all axes for None), unnormalised."""
    if axis is None:
        return list(range(a.ndim))
    if isinstance(axis, (list, tuple)):
        return [check_int(fname, x) for x in axis]
    return [check_int(fname, axis)]


def reduce_shape(a: array, axes: list) -> tuple[tuple, tuple, bool]:
    """MLX's ``compute_reduce_shape``: sorted unique axes, kept shape, whether a no-op."""
    shape = a._d.shape
    ndim = len(shape)
    seen = set()
    for ax in axes:
        ax_ = ax + ndim if ax < 0 else ax
        if ax_ < 0 or ax_ >= ndim:
            raise IndexError(f"Invalid axis {ax} for array with {ndim} dimensions.")
        seen.add(ax_)
    if len(seen) != len(axes):
        raise ValueError("Duplicate axes detected in reduction.")
    if len(seen) == 1:  # the common case: one axis
        (ax_,) = seen
        kept = shape[:ax_] + (1,) + shape[ax_ + 1:]
    else:
        kept = tuple(1 if i in seen else d for i, d in enumerate(shape))
    noop = kept == shape
    if noop and seen:
        # a size-1 axis at trace time may be larger on replay: a shapeless compile's trace
        # keeps the reduction (MLX's compute_reduce_shape under in_dynamic_tracing)
        noop = not in_dynamic_tracing()
    return tuple(sorted(seen)), kept, noop


def squeeze_axes(x: array, axes: tuple, keepdims: bool, s) -> array:
    """Drop the reduced axes unless ``keepdims`` (a ``Squeeze`` node, as MLX records)."""
    if keepdims or not axes:
        return x
    # the axes are reduce_shape's (sorted, unique, in range) and of size 1: the node squeeze
    # records, without its checks
    shape = x._d.shape
    if len(axes) == 1:
        (ax,) = axes
        out = shape[:ax] + shape[ax + 1:]
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return array._make1(out, x._d.dtype, Primitive("Squeeze", s, shape=out, axes=tuple(axes)), [x])


def _sum_dtype(d: _dt.Dtype) -> _dt.Dtype:
    if d in (_dt.bool_, _dt.int8, _dt.int16):
        return _dt.int32
    if d in (_dt.uint8, _dt.uint16):
        return _dt.uint32
    return d


_monoids: dict = {}  # primitive name -> its monoid (the definition's, asked once)


def _one_axis(shape: tuple, axis: int) -> Optional[tuple]:
    """``reduce_shape``'s (axes, kept shape, no-op) for one int ``axis`` in range and longer
    than 1 (the common case), without its lists and checks; None otherwise."""
    ax = axis + len(shape) if axis < 0 else axis
    if 0 <= ax < len(shape) and shape[ax] > 1:
        return (ax,), shape[:ax] + (1,) + shape[ax + 1:], False
    return None


def _reduce_py(name: str, fname: str, a: array, axis: Axis, keepdims: bool, stream) -> array:
    """Record reduction ``name`` (a Reduce primitive) over ``axis``, then its Squeeze unless
    ``keepdims``: MLX's axes checks and errors, output dtype and no-op cases."""
    monoid = _monoids.get(name)
    if monoid is None:
        monoid = _monoids[name] = REGISTRY[name].monoid
    got = None
    if a.__class__ is array and axis.__class__ is int:
        got = _one_axis(a._d.shape, axis)  # (an axis longer than 1: never an empty max)
    if got is None:
        if a.__class__ is not array:  # (the signature formatted only for the error)
            require_array(fname, _SIG.format(fname), a)
        got = reduce_shape(a, axes_list(fname, a, axis))
        if monoid in ("max", "min") and a.size == 0:
            for ax in got[0]:
                if a.shape[ax] == 0:
                    raise ValueError(f"[{fname}] Cannot {fname} reduce over axis {ax} with size 0.")
    axes, kept, noop = got
    s = resolve_stream(stream)
    d = a._d.dtype
    arithmetic, logical = monoid in ("sum", "prod"), monoid in ("and", "or")
    if arithmetic:
        out_dtype = _sum_dtype(d)
    elif logical:
        out_dtype = _dt.bool_
    else:
        out_dtype = d
    if not axes:  # nothing to reduce: sum/prod/max/min give the input, all/any a bool cast
        return cast(a, _dt.bool_, s) if logical else a._handle()
    if noop:
        return squeeze_axes(cast(a, out_dtype, s), axes, keepdims, s)
    x = a
    if arithmetic and out_dtype is not d and d is not _dt.bool_:
        x = cast(a, out_dtype, s)
    out = array._make1(kept, out_dtype, Primitive(name, s, axes=axes), [x])
    return squeeze_axes(out, axes, keepdims, s)


def sum(a: array, /, axis: Axis = None, keepdims: bool = False, *,
        stream: StreamOrDevice = None) -> array:
    """Sum over the given axes (bool / small ints accumulate in int32 or uint32)."""
    return _reduce("Sum", "sum", a, axis, keepdims, stream)


def prod(a: array, /, axis: Axis = None, keepdims: bool = False, *,
         stream: StreamOrDevice = None) -> array:
    """Product over the given axes."""
    return _reduce("Prod", "prod", a, axis, keepdims, stream)


def max(a: array, /, axis: Axis = None, keepdims: bool = False, *,
        stream: StreamOrDevice = None) -> array:
    """Maximum over the given axes (NaN propagates)."""
    return _reduce("Max", "max", a, axis, keepdims, stream)


def min(a: array, /, axis: Axis = None, keepdims: bool = False, *,
        stream: StreamOrDevice = None) -> array:
    """Minimum over the given axes (NaN propagates)."""
    return _reduce("Min", "min", a, axis, keepdims, stream)


def all(a: array, /, axis: Axis = None, keepdims: bool = False, *,
        stream: StreamOrDevice = None) -> array:
    """Logical and over the given axes."""
    return _reduce("And", "all", a, axis, keepdims, stream)


def any(a: array, /, axis: Axis = None, keepdims: bool = False, *,
        stream: StreamOrDevice = None) -> array:
    """Logical or over the given axes."""
    return _reduce("Or", "any", a, axis, keepdims, stream)


_INEXACT = frozenset(d for d in vars(_dt).values() if isinstance(d, _dt.Dtype) and _dt.is_inexact(d))


def _float_dtype(d: _dt.Dtype) -> _dt.Dtype:
    return d if d in _INEXACT else _dt.float32


def _count(fname: str, a: array, axis: Axis) -> tuple[list, int]:
    """Axes validated as MLX's mean does, and how many elements they cover."""
    if axis.__class__ is int:  # the common case: one axis in range
        shape = a._d.shape
        if -len(shape) <= axis < len(shape):
            return [axis], shape[axis]
    axes = axes_list(fname, a, axis)
    for ax in axes:
        if ax < -a.ndim or ax >= a.ndim:
            raise IndexError(f"[mean] axis {ax} is out of bounds for array with {a.ndim} dimensions.")
    n = 1
    for ax in set(x % a.ndim for x in axes):
        n *= a.shape[ax]
    return axes, n


def _inv(n: int) -> float:
    return 1.0 / n if n else math.inf


_SCALAR_DTYPES = (_dt.float32, _dt.float16, _dt.float64, _dt.complex64)


def number_of_elements(a: array, axes: Sequence[int], inverted: bool, dtype: _dt.Dtype,
                       n: int, s) -> array:
    """MLX's normalizer: the constant ``n`` (or 1/n), or while a shapeless compile traces a
    NumberOfElements node (under StopGradient) that counts on the shapes it is given."""
    if not in_dynamic_tracing():
        v = _inv(n) if inverted else n
        if dtype in _SCALAR_DTYPES:  # (MLX's array(v, dtype): v fits, as float / int)
            return convert._scalar(float(v), dtype)
        return array(v, dtype)
    axes = tuple(ax % a.ndim for ax in axes)
    node = array._make([()], [dtype], Primitive("NumberOfElements", resolve_stream(s), axes=axes,
                                                  inverted=bool(inverted), dtype=dtype.np), [a])[0]
    return op("stop_gradient")(node, stream=s)


def mean(a: array, /, axis: Axis = None, keepdims: bool = False, *,
         stream: StreamOrDevice = None) -> array:
    """Arithmetic mean: ``sum * (1/n)`` in ``at_least_float`` of the input dtype."""
    if a.__class__ is not array:
        require_array("mean", _SIG.format("mean"), a)
    axes, n = _count("mean", a, axis)
    d = a._d.dtype
    dtype = d if d in _INEXACT else _dt.float32
    # (``axis`` itself where it is an int or None: the axes it names, sum's common case)
    total = _reduce("Sum", "sum", a, axis if axis is None or axis.__class__ is int else axes,
                    keepdims, stream)
    return _multiply(total, number_of_elements(a, axes, True, dtype, n, stream), stream)


_VSIG = ("{0}(a: array, /, axis: None | int | Sequence[int] = None, keepdims: bool = False, "
         "ddof: int = 0, *, stream: StreamOrDevice = None) -> array")


def var(a: array, /, axis: Axis = None, keepdims: bool = False, ddof: int = 0, *,
        stream: StreamOrDevice = None) -> array:
    """Variance with ``ddof`` delta degrees of freedom (NaN when ``n - ddof <= 0``)."""
    require_array("var", _VSIG.format("var"), a)
    ddof = check_int("var", ddof, "ddof")
    axes, n = _count("mean", a, axis)
    dtype = _float_dtype(a.dtype)
    mu = mean(a, axes, True, stream=stream)
    d = op("subtract")(a, mu, stream=stream)
    if a.dtype == _dt.complex64:
        sq = op("real")(op("multiply")(op("conjugate")(d, stream=stream), d, stream=stream),
                        stream=stream)
        dtype = _dt.float32
    else:
        sq = op("square")(d, stream=stream)
    v = sum(sq, axes, keepdims, stream=stream)
    if ddof != 0:
        sub = op("subtract")(number_of_elements(a, axes, False, dtype, n, stream),
                             array(ddof, dtype), stream=stream)
        denom = op("maximum")(sub, array(0, dtype), stream=stream)
        return op("divide")(v, denom, stream=stream)
    return op("multiply")(v, number_of_elements(a, axes, True, dtype, n, stream), stream=stream)


def std(a: array, /, axis: Axis = None, keepdims: bool = False, ddof: int = 0, *,
        stream: StreamOrDevice = None) -> array:
    """Standard deviation: ``sqrt(var(a, axis, keepdims, ddof))``."""
    require_array("std", _VSIG.format("std"), a)
    return op("sqrt")(var(a, axis, keepdims, ddof, stream=stream), stream=stream)


_ASIG = ("{0}(a: array, /, axis: None | int = None, keepdims: bool = False, *, "
         "stream: StreamOrDevice = None) -> array")


def _arg_reduce_py(fname: str, a: array, axis: Optional[int], keepdims: bool, stream) -> array:
    """Record ArgReduce ``fname`` (uint32 indices) over ``axis`` (None: the flattened array),
    then its Squeeze unless ``keepdims``, with MLX's checks and errors."""
    if a.__class__ is array and axis.__class__ is int:
        got = _one_axis(a._d.shape, axis)  # the common case, as _reduce takes it
        if got is not None and 0 not in a._d.shape:
            axes, kept, _ = got
            s = resolve_stream(stream)
            out = array._make1(kept, _dt.uint32,
                               Primitive("ArgReduce", s, reduce_type=fname, axis=axes[0]), [a])
            return squeeze_axes(out, axes, keepdims, s)
    require_array(fname, _ASIG.format(fname), a)
    if axis is not None and (isinstance(axis, (list, tuple)) or isinstance(axis, float)):
        require_array(fname, _ASIG.format(fname), axis)
    s = resolve_stream(stream)
    if axis is None:
        if a.size == 0:
            raise ValueError(f"[{fname}] Cannot {fname} reduce zero size array.")
        flat = op("flatten")(a, stream=s) if a.ndim != 1 else a
        out = _arg_reduce(fname, flat, 0, True, s)
        if keepdims:
            return op("expand_dims")(out, list(range(1, a.ndim)), stream=s) if a.ndim > 1 else (
                out if a.ndim == 1 else squeeze_axes(out, (0,), False, s))
        return squeeze_axes(out, (0,), False, s)  # (squeeze(out)'s node: the (1,) to ())
    axis = check_int(fname, axis)
    if a.size == 0:  # before the axis's check, as MLX's argmax / argmin
        raise ValueError(f"[{fname}] Cannot {fname} reduce zero size array.")
    axes, kept, noop = reduce_shape(a, [axis])
    if noop:
        out = op("zeros")(kept, _dt.uint32, stream=s)
    else:
        out = array._make([kept], [_dt.uint32],
                          Primitive("ArgReduce", s, reduce_type=fname, axis=axes[0]), [a])[0]
    return squeeze_axes(out, axes, keepdims, s)


_reduce, _arg_reduce = _reduce_py, _arg_reduce_py


def _multiply(a: array, b: array, stream) -> array:
    """``multiply(a, b)`` of two arrays: elementwise.binary's Multiply (ops/binary.py's)."""
    return elementwise.binary("Multiply", a, b, stream)


def _c_reduce() -> None:
    """``_reduce`` / ``_arg_reduce`` / ``_last_reduce`` / ``_softmax`` in C (core/_reduce.c: their common
    case, the same nodes and descs; every other case, errors included, calls the Python
    versions), where the extension is built and ``settings.c_call`` is on."""
    from tapescope.kernels.settings import settings

    if not settings.c_call or elementwise.binary is elementwise.binary_py:
        return
    from .. import _call

    every = [d for d in vars(_dt).values() if isinstance(d, _dt.Dtype)]
    # the input dtypes whose output needs no cast node, by the Reduce's monoid (_reduce_py's
    # rule): a bool sum counts in int32 itself
    arithmetic = {d: _sum_dtype(d) for d in every if _sum_dtype(d) is d or d is _dt.bool_}
    same = {d: d for d in every}
    logical = {d: _dt.bool_ for d in every}
    by_monoid = {"sum": arithmetic, "prod": arithmetic, "max": same, "min": same,
                 "and": logical, "or": logical}
    out_dtypes = {name: by_monoid[defn.monoid] for name, defn in REGISTRY.items()
                  if defn.family == REDUCE and defn.monoid in by_monoid}
    config = {"array_type": array, "resolve_stream": resolve_stream, "uint32": _dt.uint32,
              "out_dtypes": out_dtypes, "reduce_py": _reduce_py, "arg_reduce_py": _arg_reduce_py,
              # logsumexp computes in at_least_float: the inexact dtypes but complex (which
              # take its composition)
              "float_dtypes": {d: d for d in _INEXACT if d is not _dt.complex64},
              "last_reduce_py": _last_reduce_py, "softmax_py": _softmax_py}
    _call.configure_reduce(config)
    globals().update(_reduce=_call.reduce, _arg_reduce=_call.arg_reduce,
                     _last_reduce=_call.last_reduce, _softmax=_call.softmax,
                     _reduce_config=config)


def argmax(a: array, /, axis: Optional[int] = None, keepdims: bool = False, *,
           stream: StreamOrDevice = None) -> array:
    """Indices (uint32) of the maxima along ``axis``; ties go to the lowest index."""
    return _arg_reduce("argmax", a, axis, keepdims, stream)


def argmin(a: array, /, axis: Optional[int] = None, keepdims: bool = False, *,
           stream: StreamOrDevice = None) -> array:
    """Indices (uint32) of the minima along ``axis``; ties go to the lowest index."""
    return _arg_reduce("argmin", a, axis, keepdims, stream)


def _over_last(a: array, axes: list) -> bool:
    """Whether ``axes`` (as given) reduce over the last axis after axes of size 1, each
    following the one before as written: [-1], or [0, 1] of a (1, n) array. MLX's LogSumExp
    and Softmax primitives run there, the compositions elsewhere (mlx/ops.cpp logsumexp,
    softmax)."""
    return bool(axes) and (axes[-1] == a.ndim - 1 or axes[-1] == -1) and _py_all(
        axes[i] + 1 == axes[i + 1] and a.shape[axes[i]] == 1 for i in range(len(axes) - 1))


def logsumexp(a: array, /, axis: Axis = None, keepdims: bool = False, *,
              stream: StreamOrDevice = None) -> array:
    """``log(sum(exp(a)))`` computed stably; where the maximum is +-inf, the maximum."""
    return _last_reduce("LogSumExp", a, axis, keepdims, stream)


def _last_reduce_py(name: str, a: array, axis: Axis, keepdims: bool, stream) -> array:
    """logsumexp's recording: MLX's LogSumExp primitive (``name``) over the last axis, its
    composition otherwise, MLX's checks and errors."""
    if a.__class__ is not array:
        require_array("logsumexp", _SIG.format("logsumexp"), a)
    axes = axes_list("logsumexp", a, axis)
    if a.size == 0:
        raise ValueError("[logsumexp] Received empty array.")
    if a.ndim == 0 and axes:
        raise ValueError("[logsumexp] Received non-empty axes for array with 0 dimensions.")
    s = resolve_stream(stream)
    if _over_last(a, axes) and a.dtype != _dt.complex64:
        dtype = _float_dtype(a.dtype)
        kept = a.shape[:-1] + (1,)
        out = array._make([kept], [dtype], Primitive(name, s), [cast(a, dtype, s)])[0]
        return squeeze_axes(out, reduce_shape(a, axes)[0], keepdims, s)
    maxval = op("stop_gradient")(max(a, axes, True, stream=s), stream=s)
    e = op("exp")(op("subtract")(a, maxval, stream=s), stream=s)
    out = op("log")(sum(e, axes, keepdims, stream=s), stream=s)
    out = op("add")(out, op("reshape")(maxval, out.shape, stream=s), stream=s)
    if not keepdims:
        maxval = squeeze_axes(maxval, reduce_shape(a, axes)[0], False, s)
    return op("where")(op("isinf")(maxval, stream=s), maxval, out, stream=s)


def softmax(a: array, /, axis: Axis = None, *, precise: bool = False,
            stream: StreamOrDevice = None) -> array:
    """``exp(a - max) / sum(exp(a - max))`` over ``axis`` (float32 math when ``precise``)."""
    return _softmax(a, axis, precise, stream)


def _softmax_py(a: array, axis: Axis, precise: bool, stream) -> array:
    """softmax's recording: MLX's Softmax primitive over the last axis, its composition
    otherwise, MLX's checks and errors (core/_reduce.c's softmax: the common case in C)."""
    if a.__class__ is array and axis.__class__ is int:  # the common case: the last axis
        shape = a._d.shape
        if shape and (axis == -1 or axis == len(shape) - 1) and 0 not in shape:
            s = resolve_stream(stream)
            d = a._d.dtype
            dtype = d if d in _INEXACT else _dt.float32
            return array._make1(shape, dtype, Primitive("Softmax", s, precise=bool(precise)),
                                [cast(a, dtype, s)])
    require_array("softmax", "softmax(a: array, /, axis: None | int | Sequence[int] = None, *, "
                  "precise: bool = False, stream: StreamOrDevice = None) -> array", a)
    axes = axes_list("softmax", a, axis)
    if a.size == 0:
        return a._handle()
    if a.ndim == 0 and axes:
        raise ValueError("[softmax] Received non-empty axes for array with 0 dimensions.")
    s = resolve_stream(stream)
    if _over_last(a, axes):
        dtype = _float_dtype(a.dtype)
        return array._make([a.shape], [dtype], Primitive("Softmax", s, precise=bool(precise)),
                           [cast(a, dtype, s)])[0]
    x = cast(a, _dt.float32, s) if precise else a
    a_max = op("stop_gradient")(max(x, axes, True, stream=s), stream=s)
    ex = op("exp")(op("subtract")(x, a_max, stream=s), stream=s)
    out = op("divide")(ex, sum(ex, axes, True, stream=s), stream=s)
    return cast(out, a.dtype, s)


_last_reduce, _softmax = _last_reduce_py, _softmax_py
_c_reduce()
