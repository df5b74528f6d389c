"""VJP / JVP rules of the scans: CumSum, CumProd, CumMax, CumMin, CumLogAddExp.

CumSum is linear (its transpose: the cumulative sum the other way). The others are written
for the inclusive scan; an exclusive scan's output is the inclusive one shifted a place, so
its cotangent is shifted back first. CumProd is exact with zeros (a product of the others
before the first zero, the first zero's own product after it, zero beyond), as MLX's is;
CumMax / CumMin send each cotangent to the latest element that set the running extreme
(MLX's choice among ties).
"""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from .registry import defjvp, defvjp


def _slice_axis(x, axis, lo, hi):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(lo, hi)
    return x[tuple(idx)]


def _shift_to_inclusive(c, axis, reverse):
    """Cotangent of the inclusive scan from that of the exclusive one (out_ex[i] = in[i-1])."""
    n = c.shape[axis]
    if n == 0:
        return c
    zshape = list(c.shape)
    zshape[axis] = 1
    z = mx.zeros(tuple(zshape), c.dtype)
    if not reverse:  # in[k] feeds out_ex[k+1]
        return mx.concatenate([_slice_axis(c, axis, 1, n), z], axis=axis)
    return mx.concatenate([z, _slice_axis(c, axis, 0, n - 1)], axis=axis)


def _rcumsum(x, axis, reverse):
    """Sum over the elements at or after each one in the scan's direction."""
    return mx.cumsum(x, axis=axis, reverse=not reverse)


def _cumsum_vjp(p, c, argnums, o, *, reduce_type, axis, reverse, inclusive):
    return [mx.cumsum(c[0], axis=axis, reverse=not reverse, inclusive=inclusive)]


def _cumsum_jvp(p, t, argnums, o, *, reduce_type, axis, reverse, inclusive):
    return [mx.cumsum(t[0], axis=axis, reverse=reverse, inclusive=inclusive)]


defvjp("CumSum", _cumsum_vjp)
defjvp("CumSum", _cumsum_jvp)


def _inclusive(fn):
    """Wrap an inclusive-scan VJP so that exclusive scans shift their cotangent first."""

    def vjp(p, c, argnums, o, *, reduce_type, axis, reverse, inclusive):
        x, ct = p[0], c[0]
        out = o[0]
        if not inclusive:
            ct = _shift_to_inclusive(ct, axis, reverse)
            out = _scan(reduce_type, x, axis, reverse)
        return [fn(x, ct, out, axis, reverse)]

    return vjp


def _scan(reduce_type, x, axis, reverse):
    f = {"prod": mx.cumprod, "max": mx.cummax, "min": mx.cummin,
         "logaddexp": mx.logcumsumexp}[reduce_type]
    return f(x, axis=axis, reverse=reverse)


def _cumprod_grad(x, c, out, axis, reverse):
    zero = mx.equal(x, 0)
    nz = mx.cumsum(mx.astype(zero, _dt.int32), axis=axis, reverse=reverse)
    before = mx.equal(nz, 0)
    first = mx.logical_and(zero, mx.equal(nz, 1))
    safe = mx.where(before, x, mx.ones_like(x))
    g_before = mx.divide(_rcumsum(mx.multiply(c, out), axis, reverse), safe)
    x1 = mx.where(first, mx.ones_like(x), x)
    prod1 = mx.cumprod(x1, axis=axis, reverse=reverse)
    g_first = _rcumsum(mx.multiply(c, prod1), axis, reverse)
    return mx.where(before, g_before, mx.where(first, g_first, mx.zeros_like(x)))


def _extreme_source(x, out, axis, reverse):
    """For each position of a running max / min ``out`` of ``x``: the index along ``axis``
    of the element it came from (the latest one equal to it, in scan order)."""
    n = x.shape[axis]
    shape = [1] * x.ndim
    shape[axis] = n
    pos = mx.broadcast_to(mx.reshape(mx.arange(n, dtype=_dt.int32), tuple(shape)), x.shape)
    hit = mx.equal(x, out)
    if not reverse:
        src = mx.cummax(mx.where(hit, pos, mx.full(x.shape, -1, _dt.int32)), axis=axis)
    else:
        src = mx.cummin(mx.where(hit, pos, mx.full(x.shape, n, _dt.int32)), axis=axis,
                        reverse=True)
    return mx.stop_gradient(src)  # locally constant in x: no gradient through the indices


def _cumext_grad(x, c, out, axis, reverse):
    return _scatter_add_axis(mx.zeros_like(x), _extreme_source(x, out, axis, reverse), c, axis)


def _scatter_add_axis(z, idx, upd, axis):
    from .registry import record1

    return record1("ScatterAxis", [z, idx, upd], z.shape, z.dtype, axis=axis, reduce="sum")


def _cumlse_grad(x, c, out, axis, reverse):
    m = mx.stop_gradient(mx.max(out, axis=axis, keepdims=True))
    acc = _rcumsum(mx.multiply(c, mx.exp(mx.subtract(m, out))), axis, reverse)
    return mx.multiply(mx.exp(mx.subtract(x, m)), acc)


defvjp("CumProd", _inclusive(_cumprod_grad))
defvjp("CumMax", _inclusive(_cumext_grad))
defvjp("CumMin", _inclusive(_cumext_grad))
defvjp("CumLogAddExp", _inclusive(_cumlse_grad))


def _scan_jvp():
    """JVP of a nonlinear scan, written for the inclusive scan and shifted for exclusive."""

    def jvp(p, t, argnums, o, *, reduce_type, axis, reverse, inclusive):
        x, tx, out = p[0], t[0], o[0]
        if reduce_type == "prod":
            incl = _scan("prod", x, axis, reverse)
            parts = _cumprod_jvp_inclusive(x, tx, incl, axis, reverse)
        elif reduce_type in ("max", "min"):
            incl = _scan(reduce_type, x, axis, reverse)
            src = _extreme_source(x, incl, axis, reverse)
            parts = mx.take_along_axis(tx, src, axis=axis)
        else:  # logaddexp: d out_i = sum_{k<=i} t_k exp(x_k - out_i)
            incl = _scan("logaddexp", x, axis, reverse)
            m = mx.stop_gradient(mx.max(x, axis=axis, keepdims=True))
            s = mx.cumsum(mx.multiply(tx, mx.exp(mx.subtract(x, m))), axis=axis, reverse=reverse)
            parts = mx.multiply(s, mx.exp(mx.subtract(m, incl)))
        if inclusive:
            return [parts]
        n = x.shape[axis]
        zshape = list(x.shape)
        zshape[axis] = 1
        z = mx.zeros(tuple(zshape), parts.dtype)
        if not reverse:
            return [mx.concatenate([z, _slice_axis(parts, axis, 0, n - 1)], axis=axis)]
        return [mx.concatenate([_slice_axis(parts, axis, 1, n), z], axis=axis)]

    return jvp


def _cumprod_jvp_inclusive(x, t, incl, axis, reverse):
    """sum_{k<=i} t_k * prod_{j<=i, j != k} x_j, exact with zeros."""
    zero = mx.equal(x, 0)
    nz = mx.cumsum(mx.astype(zero, _dt.int32), axis=axis, reverse=reverse)
    safe = mx.where(zero, mx.ones_like(x), x)
    # no zero up to i: out_i * cumsum(t / x); one zero at k0: t_k0 * prod of the others
    a = mx.multiply(incl, mx.cumsum(mx.divide(t, safe), axis=axis, reverse=reverse))
    t0 = mx.where(zero, t, mx.zeros_like(t))
    others = mx.cumprod(safe, axis=axis, reverse=reverse)
    b = mx.multiply(mx.cumsum(t0, axis=axis, reverse=reverse), others)
    return mx.where(mx.equal(nz, 0), a, mx.where(mx.equal(nz, 1), b, mx.zeros_like(x)))


for _n in ("CumProd", "CumMax", "CumMin", "CumLogAddExp"):
    defjvp(_n, _scan_jvp())
