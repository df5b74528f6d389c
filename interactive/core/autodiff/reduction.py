"""VJP / JVP rules of the reductions: Sum, Prod, Max, Min (MLX's ``Reduce``), LogSumExp,
Softmax; And / Or / ArgReduce have zero derivatives. Each keeps the reduced axes (size 1),
so a cotangent broadcasts straight back to the input's shape."""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from ..compile_trace import in_dynamic_tracing, note_partners
from ..device import resolve_stream
from ..ops.convert import broadcast_known
from .registry import defjvp, defvjp, same_op


def _bcast(c, x):
    """``c`` broadcast to ``x``'s shape; in a shapeless trace it follows ``x``'s shape (MLX's
    ``broadcast_arrays({cotan, in})``, mlx/primitives.cpp Reduce::vjp)."""
    # (mx.broadcast_to's node without its checks: the kept axes broadcast to x's shape)
    out = broadcast_known(c, x._d.shape, resolve_stream(None))
    if out._d is not c._d and in_dynamic_tracing():
        note_partners(out, [x])
    return out


def _sum_vjp(p, c, argnums, o, *, axes):
    return [_bcast(c[0], p[0])]


def _sum_jvp(p, t, argnums, o, *, axes):
    return same_op("Sum", [t[0]], o, axes=axes)


defvjp("Sum", _sum_vjp)
defjvp("Sum", _sum_jvp)


def _prod_grad(x, axes):
    """d prod / d x_i = the product of the others: exclusive products from both sides along
    the reduced axes moved last and flattened (MLX's way; exact with zeros)."""
    nd = x.ndim
    axes = sorted(axes)
    rest = [i for i in range(nd) if i not in axes]
    perm = rest + axes
    xt = mx.transpose(x, perm) if perm != list(range(nd)) else x
    lead = tuple(xt.shape[:len(rest)])
    flat = mx.reshape(xt, lead + (-1,))
    left = mx.cumprod(flat, axis=-1, inclusive=False)
    right = mx.cumprod(flat, axis=-1, reverse=True, inclusive=False)
    g = mx.reshape(mx.multiply(left, right), xt.shape)
    if perm != list(range(nd)):
        inv = [0] * nd
        for i, a in enumerate(perm):
            inv[a] = i
        g = mx.transpose(g, inv)
    return g


def _prod_vjp(p, c, argnums, o, *, axes):
    g = _prod_grad(p[0], axes)
    if g.dtype == _dt.complex64:  # MLX's cotangent convention: times the conjugate
        g = mx.conjugate(g)
    return [mx.multiply(g, _bcast(c[0], p[0]))]


def _prod_jvp(p, t, argnums, o, *, axes):
    return [mx.sum(mx.multiply(t[0], _prod_grad(p[0], axes)), axis=list(axes), keepdims=True)]


defvjp("Prod", _prod_vjp)
defjvp("Prod", _prod_jvp)


def _extreme_weights(x, out, axes):
    """Where the input equals the max (min), shared equally among ties (MLX's rule)."""
    mask = mx.astype(mx.equal(x, out), x.dtype)
    return mx.divide(mask, mx.sum(mask, axis=list(axes), keepdims=True))


def _extreme(name):
    def vjp(p, c, argnums, o, *, axes):
        return [mx.multiply(_bcast(c[0], p[0]), _extreme_weights(p[0], o[0], axes))]

    def jvp(p, t, argnums, o, *, axes):
        return [mx.sum(mx.multiply(t[0], _extreme_weights(p[0], o[0], axes)), axis=list(axes),
                       keepdims=True)]

    defvjp(name, vjp)
    defjvp(name, jvp)


_extreme("Max")
_extreme("Min")


def _zero(name):
    defvjp(name, lambda p, c, argnums, o, **_: [mx.zeros_like(p[i]) for i in argnums])
    defjvp(name, lambda p, t, argnums, o, **_: [mx.zeros_like(x) for x in o])


for _n in ("And", "Or", "ArgReduce"):
    _zero(_n)


def _lse_vjp(p, c, argnums, o):
    return [mx.multiply(_bcast(c[0], p[0]), mx.exp(mx.subtract(p[0], o[0])))]


def _lse_jvp(p, t, argnums, o):
    w = mx.exp(mx.subtract(p[0], o[0]))
    return [mx.sum(mx.multiply(t[0], w), axis=-1, keepdims=True)]


defvjp("LogSumExp", _lse_vjp)
defjvp("LogSumExp", _lse_jvp)


def _softmax_vjp(p, c, argnums, o, *, precise):
    s = o[0]
    return [mx.multiply(s, mx.subtract(c[0], mx.sum(mx.multiply(s, c[0]), axis=-1, keepdims=True)))]


def _softmax_jvp(p, t, argnums, o, *, precise):
    s = o[0]
    return [mx.multiply(s, mx.subtract(t[0], mx.sum(mx.multiply(s, t[0]), axis=-1, keepdims=True)))]


defvjp("Softmax", _softmax_vjp)
defjvp("Softmax", _softmax_jvp)
