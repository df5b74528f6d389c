"""Sorting: sort, argsort, partition, argpartition (MLX's ``Sort``, ``ArgSort``,
``Partition``, ``ArgPartition`` along one axis) and topk (a Partition then a Slice).
``axis=None`` works on the flattened array; indices are uint32."""

from __future__ import annotations

from typing import Optional

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import Primitive
from .convert import _fmt_shape
from .reduction import check_int, op, require_array

__all__ = ["sort", "argsort", "partition", "argpartition", "topk"]


def _prepare(fname: str, sig: str, a: array, axis: Optional[int]) -> tuple[tuple, int]:
    """The shape worked on (flattened for ``axis=None``) and the normalised axis, validated
    before anything is recorded."""
    require_array(fname, sig, a)
    if axis is None:
        return (a.size,), 0
    axis = check_int(fname, axis)
    ax = axis + a.ndim if axis < 0 else axis
    if ax < 0 or ax >= a.ndim:
        raise IndexError(f"[{fname}] Axis {axis} is out of bounds for array with {a.ndim} dimensions.")
    return a.shape, ax


def _input(a: array, axis: Optional[int], s) -> array:
    return op("reshape")(a, (-1,), stream=s) if axis is None else a


def _sig(fname: str, extra: str = "") -> str:
    return (f"{fname}(a: array, /, {extra}axis: None | int = -1, *, "
            "stream: StreamOrDevice = None) -> array")


def sort(a: array, /, axis: Optional[int] = -1, *, stream: StreamOrDevice = None) -> array:
    """The values sorted along ``axis`` (NaNs last)."""
    shape, ax = _prepare("sort", _sig("sort"), a, axis)
    s = resolve_stream(stream)
    return array._make([shape], [a.dtype], Primitive("Sort", s, axis=ax), [_input(a, axis, s)])[0]


def argsort(a: array, /, axis: Optional[int] = -1, *, stream: StreamOrDevice = None) -> array:
    """Indices (uint32) that sort ``a`` along ``axis``; stable for equal values."""
    shape, ax = _prepare("argsort", _sig("argsort"), a, axis)
    s = resolve_stream(stream)
    return array._make([shape], [_dt.uint32], Primitive("ArgSort", s, axis=ax),
                       [_input(a, axis, s)])[0]


def _kth(fname: str, kth: int, shape: tuple, ax: int, axis: Optional[int]) -> int:
    kth = check_int(fname, kth, "kth")
    n = shape[ax]
    k = kth + n if kth < 0 else kth
    if k < 0 or k >= n:
        sep = "" if fname == "partition" else " "  # MLX's partition message lacks the space
        raise ValueError(f"[{fname}] Received invalid kth {kth}{sep}along axis {axis} for array "
                         f"with shape: {_fmt_shape(shape)}")
    return k


def partition(a: array, /, kth: int, axis: Optional[int] = -1, *,
              stream: StreamOrDevice = None) -> array:
    """Values rearranged so that the ``kth`` is in sorted position, smaller ones before it
    and larger ones after it (in unspecified order)."""
    shape, ax = _prepare("partition", _sig("partition", "kth: int, "), a, axis)
    k = _kth("partition", kth, shape, ax, axis)
    s = resolve_stream(stream)
    return array._make([shape], [a.dtype], Primitive("Partition", s, kth=k, axis=ax),
                       [_input(a, axis, s)])[0]


def argpartition(a: array, /, kth: int, axis: Optional[int] = -1, *,
                 stream: StreamOrDevice = None) -> array:
    """Indices (uint32) that partition ``a`` around its ``kth`` element along ``axis``."""
    shape, ax = _prepare("argpartition", _sig("argpartition", "kth: int, "), a, axis)
    k = _kth("argpartition", kth, shape, ax, axis)
    s = resolve_stream(stream)
    return array._make([shape], [_dt.uint32], Primitive("ArgPartition", s, kth=k, axis=ax),
                       [_input(a, axis, s)])[0]


def topk(a: array, /, k: int, axis: Optional[int] = -1, *,
         stream: StreamOrDevice = None) -> array:
    """The ``k`` largest values along ``axis`` (in unspecified order)."""
    shape, ax = _prepare("topk", _sig("topk", "k: int, "), a, axis)
    k = check_int("topk", k, "k")
    n = shape[ax]
    if k < 0 or k > n:
        raise ValueError(f"[topk] Received invalid k={k} along axis {axis} for array with "
                         f"shape: {_fmt_shape(a.shape)}")
    s = resolve_stream(stream)
    x = _input(a, axis, s)
    if k == n:
        return x
    part = partition(x, -k if k else 0, ax, stream=s) if k else x
    index = tuple(slice(None) if i != ax else slice(n - k, n) for i in range(len(shape)))
    return part[index]
