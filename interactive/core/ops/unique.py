"""``mx.unique``: the sorted unique elements of the flattened array at a static ``size``,
composed of sort, scan and scatter primitives as MLX 0.32 composes it (no primitive of its
own; the graph MLX records was read from its ``export_function`` callback and its DOT).

The values are sorted (``ArgSort`` and a gather when index or inverse is asked for), each
run of equal values gets an id (a cumulative sum of "differs from the previous"), and a
``Scatter`` max of (position + 1) per id finds each run's start; ids past ``size`` are cut
off, entries with no run take ``fill_value`` (the first sorted value by default) and a
count of 0, and the inverse's ids are clamped to ``size - 1``.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import dtypes as _dt
from ..array import array
from ..device import BadArgs, StreamOrDevice, binding, resolve_stream
from .binary import add, greater, maximum, minimum, not_equal, subtract
from .convert import _fmt_shape, cast, to_array
from .creation import arange, full
from .elementwise import stop_gradient
from .indexing import _scatter, _slice, take
from .scan import cumsum
from .shape import concatenate, expand_dims, flatten, reshape
from .sort import argsort, sort
from .ternary import where

__all__ = ["unique"]

_SIG = ("unique(a: array, /, size: int, return_index: bool = False, return_inverse: bool = "
        "False, return_counts: bool = False, fill_value: scalar | array | None = None, *, "
        "stream: StreamOrDevice = None) -> array | tuple[array, ...]")


def _nb_int(v: Any) -> int:
    """``v`` as nanobind's ``int`` caster takes it (bools and ``__index__`` types, 32 bits)."""
    if isinstance(v, float) or not hasattr(v, "__index__"):
        raise BadArgs("size")
    v = v.__index__()
    if not -2 ** 31 <= v < 2 ** 31:
        raise BadArgs("size")
    return v


def _fill(fill_value: Any, dtype: _dt.Dtype) -> Optional[array]:
    """The fill value as an array (MLX's binding makes one of anything, typing a scalar
    weakly against ``a``)."""
    if fill_value is None:
        return None
    return to_array(fill_value, dtype)


def _u32(v: int) -> array:
    return array(v, _dt.uint32)


@binding(_SIG)
def unique(a: array, /, size: int, return_index: bool = False, return_inverse: bool = False,
           return_counts: bool = False, fill_value: Any = None, *,
           stream: StreamOrDevice = None) -> Any:
    """The sorted unique elements of the flattened ``a``, ``size`` of them (truncated, or
    padded with ``fill_value``); with the index of each one's first occurrence (uint32), the
    inverse (uint32, ``a``'s shape, clamped to ``size - 1``) and the counts (int32, 0 for
    padding) as asked, in that order."""
    if not isinstance(a, array):
        raise BadArgs("a")
    size = _nb_int(size)
    for flag in (return_index, return_inverse, return_counts):
        if not isinstance(flag, bool):
            raise BadArgs("flag")
    fill = _fill(fill_value, a.dtype)
    s = resolve_stream(stream)
    if size < 0:
        raise ValueError(f"[unique] Received negative size {size}.")
    if fill is not None:
        if fill.size != 1:
            raise ValueError(f"[unique] Fill value must have one element, but got shape "
                             f"{_fmt_shape(fill.shape)}.")
        if fill.ndim:
            fill = reshape(fill, (), stream=s)
        fill = cast(fill, a.dtype, s)
    n = a.size
    if n == 0:
        if size != 0 and fill is None:
            raise ValueError("[unique] A fill value is required for an empty input with a non-zero size.")
        outs = [flatten(a, stream=s) if fill is None else full((size,), fill, stream=s),
                full((size,), _u32(0), stream=s), full(a.shape, _u32(0), stream=s),
                full((size,), array(0, _dt.int32), stream=s)]
        return _select(outs, return_index, return_inverse, return_counts)

    flat = flatten(a, stream=s)
    if return_index or return_inverse:
        perm = stop_gradient(argsort(flat, stream=s), stream=s)
        srt = take(flat, perm, 0, stream=s)
    else:
        perm, srt = None, sort(flat, stream=s)
    new = concatenate([array([True]), not_equal(_slice(srt, (1,), (n,), (1,), s),
                                                _slice(srt, (0,), (n - 1,), (1,), s), stream=s)],
                      stream=s)
    one, zero = _u32(1), _u32(0)
    ids = stop_gradient(subtract(cumsum(cast(new, _dt.uint32, s), stream=s), one, stream=s),
                        stream=s)
    length = max(n, size)  # room for every id, whatever the size
    # each run's start + 1 at its id (0: no run), cut to ``size``
    starts = where(new, add(arange(0, n, dtype=_dt.uint32, stream=s), one, stream=s), zero,
                   stream=s)
    first = _scatter(full((length,), zero, stream=s), [ids], expand_dims(starts, 1, stream=s),
                     (0,), "max", s)
    first = stop_gradient(_slice(first, (0,), (size,), (1,), s), stream=s)
    valid = greater(first, zero, stream=s)
    pos = subtract(maximum(first, one, stream=s), one, stream=s)
    pad = fill if fill is not None else _slice(srt, (0,), (1,), (1,), s)
    values = where(valid, take(srt, pos, 0, stream=s), pad, stream=s)
    outs = [values, None, None, None]
    if return_index:
        outs[1] = take(perm, pos, 0, stream=s)
    if return_inverse:
        last = _u32(max(size - 1, 0))
        inv = _scatter(full((n,), zero, stream=s), [perm],
                       expand_dims(minimum(ids, last, stream=s), 1, stream=s), (0,), "none", s)
        outs[2] = reshape(inv, a.shape, stream=s)
    if return_counts:
        ones = full((n, 1), array(1, _dt.int32), stream=s)
        counts = _scatter(full((length,), array(0, _dt.int32), stream=s), [ids], ones, (0,),
                          "sum", s)
        outs[3] = _slice(counts, (0,), (size,), (1,), s)
    return _select(outs, return_index, return_inverse, return_counts)


def _select(outs: list, return_index: bool, return_inverse: bool, return_counts: bool) -> Any:
    """The values alone, or the tuple of what was asked for (MLX's order)."""
    if not (return_index or return_inverse or return_counts):
        return outs[0]
    wanted = (True, return_index, return_inverse, return_counts)
    return tuple(o for o, w in zip(outs, wanted) if w)
