"""Rules for the creation primitives: Full (materialise a broadcast value) and Arange."""

from __future__ import annotations

from ..primitives import CREATION, define


@define("Full", family=CREATION, out=True, shape=lambda shapes, **_: [tuple(shapes[0])],
        moves=True, fill=True)
def full(xp, a, out=None):
    # The input is the (broadcast) fill value; Full gives it its own contiguous buffer: the
    # allocator's (``out``, so freed arrays' buffers are reused), else a new one.
    if out is not None and out.shape == a.shape and out.flags.c_contiguous:
        out[...] = a
        return out
    return xp.array(a, copy=True, order="C")


@define("Arange", family=CREATION, shape=lambda shapes, *, size, **_: [(int(size),)])
def arange(xp, *, start, step, size, dtype):
    # MLX's CPU kernel (mlx/backend/cpu/arange.h): out[i] = start; start += step, in the
    # output dtype, with step = T(start + step) - T(start); integers get that step already.
    if size == 0:
        return xp.zeros((0,), dtype=dtype)
    if xp.issubdtype(xp.dtype(dtype), xp.integer):  # C casts: out-of-range values wrap
        base = xp.arange(size).astype(dtype)
        return (xp.asarray(start).astype(dtype) + base * xp.asarray(step).astype(dtype)).astype(dtype)
    first = xp.asarray(start, dtype=dtype)
    vals = xp.full((size,), xp.asarray(start + step, dtype=dtype) - first, dtype=dtype)
    vals[0] = first
    return xp.cumsum(vals, dtype=dtype)  # numpy accumulates one element after another


_COUNT_HAS_NO_GRADIENT = "a count of elements has no derivative (MLX wraps it in StopGradient)"


@define("NumberOfElements", family=CREATION, shape=lambda shapes, **_: [()],
        why={"vjp": _COUNT_HAS_NO_GRADIENT, "jvp": _COUNT_HAS_NO_GRADIENT})
def number_of_elements(xp, a, *, axes, inverted, dtype):
    """The number of elements of ``a`` along ``axes`` (its reciprocal when ``inverted``) as a
    0-d array of ``dtype``: MLX's normalizer of mean / var while a shapeless compile traces
    (mlx/ops.cpp number_of_elements; computed in double, then cast)."""
    n = 1.0
    for ax in axes:
        n *= a.shape[ax]
    value = (1.0 / n if n else float("inf")) if inverted else n
    return xp.asarray(value).astype(dtype)
