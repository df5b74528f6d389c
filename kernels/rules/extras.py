"""Rules for View (bit reinterpretation) and SearchSorted.

View copies a non-row-contiguous input first (as MLX does) and otherwise returns a view of
its buffer; SearchSorted is ``xp.searchsorted`` as uint32 indices.
"""

from __future__ import annotations

from ..primitives import SHAPE, SORT, define


def _view_label(name: str, kw: dict) -> str:
    """MLX's ``View::name()``: "View" and the dtype it reads the bits as."""
    dt = kw.get("dtype")
    return f"{name} {getattr(dt, 'name', dt)}"


@define("View", family=SHAPE, moves=True, label=_view_label)
def view(xp, a, *, dtype):
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    if a.ndim == 0:
        return a.reshape((1,)).view(dtype).reshape(())
    return a.view(dtype)


@define("SearchSorted", family=SORT)
def searchsorted(xp, seq, values, *, side):
    return xp.searchsorted(seq, values, side=side).astype(xp.uint32)
