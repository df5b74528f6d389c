"""Operators and method forms of ``mx.array`` (attached to the class at import)."""

from __future__ import annotations

from . import ops
from .array import array


def _reflect(fn):
    return lambda self, other: fn(other, self)


def _install() -> None:
    A = array
    A.__add__ = lambda self, o: ops.add(self, o)
    A.__radd__ = _reflect(ops.add)
    A.__sub__ = lambda self, o: ops.subtract(self, o)
    A.__rsub__ = _reflect(ops.subtract)
    A.__mul__ = lambda self, o: ops.multiply(self, o)
    A.__rmul__ = _reflect(ops.multiply)
    A.__truediv__ = lambda self, o: ops.divide(self, o)
    A.__rtruediv__ = _reflect(ops.divide)
    A.__neg__ = lambda self: ops.negative(self)
    A.astype = lambda self, dtype, stream=None: ops.astype(self, dtype, stream=stream)
    A.exp = lambda self, *, stream=None: ops.exp(self, stream=stream)


_install()


# ---- reductions and scans (owner: reductions/scans/products/sort) --------------------
def _install_reductions() -> None:
    """Method forms of the reductions and scans, with MLX's method signatures."""
    A = array

    def _reduction(name):
        fn = getattr(ops, name)

        def method(self, axis=None, keepdims=False, *, stream=None):
            return fn(self, axis, keepdims, stream=stream)

        method.__name__ = name
        method.__doc__ = fn.__doc__
        return method

    for name in ("sum", "prod", "max", "min", "all", "any", "mean", "logsumexp",
                 "argmax", "argmin"):
        setattr(A, name, _reduction(name))

    def _moment(name):
        fn = getattr(ops, name)

        def method(self, axis=None, keepdims=False, ddof=0, *, correction=None, stream=None):
            return fn(self, axis, keepdims, ddof if correction is None else correction,
                      stream=stream)

        method.__name__ = name
        method.__doc__ = fn.__doc__
        return method

    A.var = _moment("var")
    A.std = _moment("std")

    def _scan(name):
        fn = getattr(ops, name)

        def method(self, axis=None, *, reverse=False, inclusive=True, stream=None):
            return fn(self, axis, reverse=reverse, inclusive=inclusive, stream=stream)

        method.__name__ = name
        method.__doc__ = fn.__doc__
        return method

    for name in ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"):
        setattr(A, name, _scan(name))


_install_reductions()
