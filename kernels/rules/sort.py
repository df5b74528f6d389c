"""Rules for Sort, ArgSort, Partition and ArgPartition along one axis (NaNs sort last)."""

from __future__ import annotations

from ..primitives import SORT, define, same_shape


def _sortable(xp, a):
    """bfloat16 sorts through float32 (exact; ordering is identical)."""
    return a.astype(xp.float32) if a.dtype.name == "bfloat16" else a


@define("Sort", family=SORT, shape=same_shape)
def sort(xp, a, *, axis):
    return xp.sort(_sortable(xp, a), axis=axis)


@define("ArgSort", family=SORT, shape=same_shape)
def argsort(xp, a, *, axis):
    """Stable: equal elements keep their order, as MLX's merge sort does."""
    return xp.argsort(_sortable(xp, a), axis=axis, kind="stable").astype(xp.uint32)


@define("Partition", family=SORT)
def partition(xp, a, *, kth, axis):
    return xp.partition(_sortable(xp, a), kth, axis=axis)


@define("ArgPartition", family=SORT)
def argpartition(xp, a, *, kth, axis):
    return xp.argpartition(_sortable(xp, a), kth, axis=axis).astype(xp.uint32)
