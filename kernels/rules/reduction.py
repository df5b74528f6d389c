"""Rules for reductions: Sum/Prod/Max/Min/And/Or (MLX's ``Reduce``), ArgReduce, LogSumExp,
Softmax. Every reduction keeps the reduced axes (size 1), as MLX's primitives do. Each takes
``out=`` (the evaluator's buffer, which the generated kernels write into directly)."""

from __future__ import annotations

from ..primitives import REDUCE, define, elements, same_shape
from .elementwise import finish


def _wide(xp, a):
    """Half-precision floats accumulate in float32 (the result is rounded back on store)."""
    d = a.dtype  # float16 ('f') or ml_dtypes' bfloat16 ('V'): the 2-byte dtypes of those kinds
    if d.itemsize == 2 and d.kind in "fV":
        return a.astype(xp.float32)
    return a


# mlx/primitives.h's Reduce::ReduceType and ArgReduce::ReduceType, in declaration order
_REDUCE_TYPES = ("and", "or", "sum", "prod", "min", "max")
_ARG_TYPES = ("argmin", "argmax")


def _reduce(monoid: str) -> dict:
    """A Reduce's definition facets: its monoid, MLX's generated reduce kernel, and MLX's
    export of it as one ``Reduce`` class (its ReduceType code, then the axes)."""
    code = _REDUCE_TYPES.index(monoid)
    return {"kernel": "reduce", "monoid": monoid,
            "export": lambda name, kw: ("Reduce", [code, list(kw["axes"])])}


def keep_axes(shapes: list, *, axes, **_) -> list:
    """The output shape of a Reduce: the input's, with the reduced ``axes`` kept as size 1."""
    return [tuple(1 if i in axes else n for i, n in enumerate(shapes[0]))]


@define("Sum", family=REDUCE, shape=keep_axes, out=True, **_reduce("sum"))
def reduce_sum(xp, a, *, axes, out=None):
    return finish(xp.sum(_wide(xp, a), axis=axes, keepdims=True), out)


@define("Prod", family=REDUCE, shape=keep_axes, out=True, **_reduce("prod"))
def reduce_prod(xp, a, *, axes, out=None):
    return finish(xp.prod(_wide(xp, a), axis=axes, keepdims=True), out)


@define("Max", family=REDUCE, shape=keep_axes, out=True, **_reduce("max"))
def reduce_max(xp, a, *, axes, out=None):
    return finish(xp.max(_wide(xp, a), axis=axes, keepdims=True), out)


@define("Min", family=REDUCE, shape=keep_axes, out=True, **_reduce("min"))
def reduce_min(xp, a, *, axes, out=None):
    return finish(xp.min(_wide(xp, a), axis=axes, keepdims=True), out)


@define("And", family=REDUCE, shape=keep_axes, out=True, **_reduce("and"))
def reduce_and(xp, a, *, axes, out=None):
    return finish(xp.all(a, axis=axes, keepdims=True), out)


@define("Or", family=REDUCE, shape=keep_axes, out=True, **_reduce("or"))
def reduce_or(xp, a, *, axes, out=None):
    return finish(xp.any(a, axis=axes, keepdims=True), out)


def _arg_shape(shapes: list, *, axis, **_) -> list:
    out = list(shapes[0])
    out[axis] = 1
    return [tuple(out)]


@define("ArgReduce", family=REDUCE, out=True, kernel="arg_reduce", shape=_arg_shape,
        export=lambda name, kw: (name, [_ARG_TYPES.index(kw["reduce_type"]), kw["axis"]]))
def arg_reduce(xp, a, *, reduce_type, axis, out=None):
    """Index of the first max / min along ``axis`` (NaN counts as the extreme, as in MLX)."""
    a = _wide(xp, a)
    fn = xp.argmax if reduce_type == "argmax" else xp.argmin
    return finish(fn(a, axis=axis, keepdims=True).astype(xp.uint32), out)


def _per_input(k: int):
    """``k`` operations per input element (LogSumExp: max, subtract, exp, add; Softmax
    also divides)."""
    return lambda in_shapes, out_shapes: k * elements(in_shapes[0])


@define("LogSumExp", family=REDUCE, out=True, flops=_per_input(4), kernel="logsumexp",
        shape=lambda shapes, **_: [tuple(shapes[0][:-1]) + (1,)],
        fused_alone=True)
def logsumexp(xp, a, out=None):
    """log(sum(exp(a))) over the last axis, stable; where the max is +-inf the max itself."""
    a = _wide(xp, a)
    m = xp.max(a, axis=-1, keepdims=True)
    inf = xp.isinf(m)
    safe = xp.where(inf, xp.zeros_like(m), m)
    res = safe + xp.log(xp.sum(xp.exp(a - safe), axis=-1, keepdims=True))
    return finish(xp.where(inf, m, res), out)


@define("Softmax", family=REDUCE, out=True, flops=_per_input(5), kernel="softmax", shape=same_shape,
        fused_alone=True)
def softmax(xp, a, *, precise, out=None):
    """exp(a - max) / sum(exp(a - max)) over the last axis (float32 math when ``precise``)."""
    dtype = a.dtype
    if precise or dtype.name == "bfloat16":
        a = a.astype(xp.float32)
    e = xp.exp(a - xp.max(a, axis=-1, keepdims=True))
    return finish((e / xp.sum(e, axis=-1, keepdims=True)).astype(dtype), out)
