"""Rules for elementwise primitives (unary, binary, ternary): ``fn(xp, *inputs)``."""

from __future__ import annotations

from . import rule


@rule("Add", out=True)
def add(xp, a, b, out=None):
    return xp.add(a, b, out=out)


@rule("Subtract", out=True)
def subtract(xp, a, b, out=None):
    return xp.subtract(a, b, out=out)


@rule("Multiply", out=True)
def multiply(xp, a, b, out=None):
    return xp.multiply(a, b, out=out)


@rule("Divide")
def divide(xp, a, b):
    return xp.true_divide(a, b)


@rule("Exp")
def exp(xp, a):
    return xp.exp(a)


@rule("Negative")
def negative(xp, a):
    return xp.negative(a)
