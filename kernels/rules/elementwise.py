"""Rules for elementwise primitives (unary, binary, ternary): ``fn(xp, *inputs)``."""

from __future__ import annotations

from . import rule


@rule("Add")
def add(xp, a, b):
    return xp.add(a, b)


@rule("Subtract")
def subtract(xp, a, b):
    return xp.subtract(a, b)


@rule("Multiply")
def multiply(xp, a, b):
    return xp.multiply(a, b)


@rule("Divide")
def divide(xp, a, b):
    return xp.true_divide(a, b)


@rule("Exp")
def exp(xp, a):
    return xp.exp(a)


@rule("Negative")
def negative(xp, a):
    return xp.negative(a)
