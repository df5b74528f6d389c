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
