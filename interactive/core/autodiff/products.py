"""VJP / JVP rules of Matmul and AddMM (batch dims are already broadcast to match)."""

from __future__ import annotations

from .. import ops as mx
from .registry import defjvp, defvjp


def _t(x):
    return mx.swapaxes(x, -1, -2)


def _matmul_vjp(p, c, argnums, o, **_):
    a, b = p[0], p[1]
    return [mx.matmul(c[0], _t(b)) if i == 0 else mx.matmul(_t(a), c[0]) for i in argnums]


def _matmul_jvp(p, t, argnums, o, **_):
    acc = None
    for i, ti in zip(argnums, t):
        term = mx.matmul(ti, p[1]) if i == 0 else mx.matmul(p[0], ti)
        acc = term if acc is None else mx.add(acc, term)
    return [acc]


defvjp("Matmul", _matmul_vjp)
defjvp("Matmul", _matmul_jvp)


def _addmm_vjp(p, c, argnums, o, *, alpha, beta):
    a, b = p[0], p[1]
    out = []
    for i in argnums:
        if i == 0:
            g = mx.matmul(c[0], _t(b))
            out.append(g if alpha == 1.0 else mx.multiply(g, alpha))
        elif i == 1:
            g = mx.matmul(_t(a), c[0])
            out.append(g if alpha == 1.0 else mx.multiply(g, alpha))
        else:
            out.append(c[0] if beta == 1.0 else mx.multiply(c[0], beta))
    return out


def _addmm_jvp(p, t, argnums, o, *, alpha, beta):
    acc = None
    for i, ti in zip(argnums, t):
        if i == 0:
            term = mx.multiply(mx.matmul(ti, p[1]), alpha)
        elif i == 1:
            term = mx.multiply(mx.matmul(p[0], ti), alpha)
        else:
            term = mx.multiply(ti, beta)
        acc = term if acc is None else mx.add(acc, term)
    return [acc]


defvjp("AddMM", _addmm_vjp)
defjvp("AddMM", _addmm_jvp)
