"""VJP / JVP rules of MLX's fast primitives (``mlx/fast.cpp``).

``RMSNorm`` / ``LayerNorm``'s VJP is one ``RMSNormVJP`` / ``LayerNormVJP`` node over the
primals and the cotangent (MLX's ``RMSNorm::vjp``), ``RoPE``'s the inverse rotation of the
cotangent (``forward`` flipped; MLX refuses the offset's and the frequencies'). Their JVPs,
and the VJP primitives' own transformations, are those of MLX's fallback compositions
(``Custom::jvp`` / ``Custom::vjp`` transform ``fallback_``): the tangent written out from
the composition here, the VJP primitives' through ``jvp`` / ``vjp`` of their composition.
"""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from ..array import array
from .registry import defjvp, defvjp, record


def _rms_vjp(p, c, argnums, o, *, eps):
    x, w = p
    grads = record("RMSNormVJP", [x, w, c[0]], [x.shape, w.shape], [x.dtype, w.dtype], eps=eps)
    return [grads[i] for i in argnums]


def _tangents(p, t, argnums) -> list:
    """One tangent per primal: the given ones, zeros elsewhere (``Custom::jvp``)."""
    out = [None] * len(p)
    for i, tt in zip(argnums, t):
        out[i] = tt
    return out


def _f32(a):
    return mx.astype(a, _dt.float32)


def _rms_jvp(p, t, argnums, o, *, eps):
    """The tangent of ``T(x n) * w`` with ``n = rsqrt(mean(x^2) + eps)``:
    ``T((dx - x n^2 mean(x dx)) n) * w + T(x n) * dw``."""
    x, w = p
    dx, dw = _tangents(p, t, argnums)
    xf = _f32(x)
    n = mx.rsqrt(mx.mean(mx.square(xf), -1, keepdims=True) + array(eps, _dt.float32))
    out = None
    if dx is not None:
        dxf = _f32(dx)
        d = (dxf - xf * mx.square(n) * mx.mean(xf * dxf, -1, keepdims=True)) * n
        out = mx.astype(d, x.dtype)
        if w.ndim:
            out = out * w
    if dw is not None and w.ndim:
        term = mx.astype(xf * n, x.dtype) * dw
        out = term if out is None else out + term
    return [out if out is not None else mx.zeros_like(o[0])]


def _layer_vjp(p, c, argnums, o, *, eps):
    x, w, b = p
    grads = record("LayerNormVJP", [x, w, b, c[0]], [x.shape, w.shape, b.shape],
                   [x.dtype, w.dtype, b.dtype], eps=eps)
    return [grads[i] for i in argnums]


def _layer_jvp(p, t, argnums, o, *, eps):
    """The tangent of ``T(xc n) * w + b`` (``xc = x - mean(x)``, ``n = rsqrt(mean(xc^2) +
    eps)``): ``T((dxc - xc n^2 mean(xc dxc)) n) * w + T(xc n) * dw + db``."""
    x, w, b = p
    dx, dw, db = _tangents(p, t, argnums)
    xf = _f32(x)
    xc = xf - mx.mean(xf, -1, keepdims=True)
    n = mx.rsqrt(mx.mean(mx.square(xc), -1, keepdims=True) + array(eps, _dt.float32))
    out = None
    if dx is not None:
        dxf = _f32(dx)
        dxc = dxf - mx.mean(dxf, -1, keepdims=True)
        d = (dxc - xc * mx.square(n) * mx.mean(xc * dxc, -1, keepdims=True)) * n
        out = mx.astype(d, x.dtype)
        if w.ndim:
            out = out * w
    if dw is not None and w.ndim:
        term = mx.astype(xc * n, x.dtype) * dw
        out = term if out is None else out + term
    if db is not None and b.ndim:
        term = mx.broadcast_to(db, o[0].shape)
        out = term if out is None else out + term
    return [out if out is not None else mx.zeros_like(o[0])]


def _rope_vjp(p, c, argnums, o, *, dims, traditional, base, scale, forward):
    if len(argnums) > 1 or argnums[0] != 0:
        raise ValueError("[RoPE::vjp] vjp for offset or frequencies not supported")
    from ..fast import _record_rope

    g = c[0]
    return [_record_rope([g] + list(p[1:]), None, dims=dims, traditional=traditional, base=base,
                        scale=scale, forward=not forward)]


def _rope_jvp(p, t, argnums, o, *, dims, traditional, base, scale, forward):
    """RoPE is linear in ``x``: the tangent is the rotation of ``dx`` (MLX's fallback's
    jvp; the offset and frequencies are integer / constant inputs)."""
    from ..fast import _record_rope

    dx = _tangents(p, t, argnums)[0]
    if dx is None:
        return [mx.zeros_like(o[0])]
    return [_record_rope([dx] + list(p[1:]), None, dims=dims, traditional=traditional, base=base,
                        scale=scale, forward=forward)]


def _composed(fallback):
    """The VJP primitive's vjp and jvp: those of its composition (MLX's ``Custom``)."""
    from .api import jvp, vjp

    def vjp_rule(p, c, argnums, o, *, eps):
        live = [ci if ci is not None else mx.zeros_like(pi) for ci, pi in zip(c, p)]  # out i: primal i
        _, grads = vjp(lambda *a: fallback(*a, eps=eps), list(p), live)
        return [grads[i] for i in argnums]

    def jvp_rule(p, t, argnums, o, *, eps):
        tangents = [ti if ti is not None else mx.zeros_like(pi)
                    for ti, pi in zip(_tangents(p, t, argnums), p)]
        _, out = jvp(lambda *a: fallback(*a, eps=eps), list(p), tangents)
        return out

    return vjp_rule, jvp_rule


def rms_vjp_fallback(x, w, g, *, eps):
    """MLX's ``RMSNorm::vjp`` fallback: ``[dx, dw]`` composed."""
    n = mx.rsqrt(mx.mean(mx.square(x), -1, keepdims=True) + array(eps, x.dtype))
    n3 = mx.power(n, array(3, x.dtype))
    gw = g * w
    tt = mx.mean(gw * x, -1, keepdims=True)
    gx = gw * n - x * tt * n3
    axes = list(range(g.ndim - 1))
    dw = mx.zeros_like(w) if w.ndim == 0 else mx.sum(g * (x * n), axes)
    return [gx, dw]


def layer_vjp_fallback(x, w, b, g, *, eps):
    """MLX's ``LayerNorm::vjp`` fallback: ``[dx, dw, db]`` composed."""
    norm = array(1.0 / x.shape[-1], x.dtype)
    mu = mx.sum(x, -1, keepdims=True) * norm
    mu2 = mx.sum(mx.square(x), -1, keepdims=True) * norm
    n = mx.rsqrt(mu2 - mx.square(mu) + array(eps, x.dtype))
    n3 = mx.power(n, array(3, x.dtype))
    xc = x - mu
    wg = w * g
    sumwg = mx.sum(wg, -1, keepdims=True) * norm
    sumwgxc = mx.sum(wg * xc, -1, keepdims=True) * norm
    gx = (wg - sumwg) * n - xc * sumwgxc * n3
    axes = list(range(g.ndim - 1))
    dw = mx.zeros_like(w) if w.ndim == 0 else mx.sum(g * (xc * n), axes)
    db = mx.zeros_like(b) if b.ndim == 0 else mx.sum(g, axes)
    return [gx, dw, db]


defvjp("RMSNorm", _rms_vjp)
defjvp("RMSNorm", _rms_jvp)
defvjp("LayerNorm", _layer_vjp)
defjvp("LayerNorm", _layer_jvp)
defvjp("RoPE", _rope_vjp)
defjvp("RoPE", _rope_jvp)
for _name, _fb in (("RMSNormVJP", rms_vjp_fallback), ("LayerNormVJP", layer_vjp_fallback)):
    _v, _j = _composed(_fb)
    defvjp(_name, _v)
    defjvp(_name, _j)


def _sdpa_rules():
    """``ScaledDotProductAttention``'s vjp and jvp: those of MLX's fallback composition
    (``Custom::vjp`` / ``Custom::jvp``; MLX 0.32's ``ScaledDotProductAttentionVJP`` is only
    reached on CUDA with the logsumexp output, its Metal and CPU backends use the fallback's).
    The mask's and the sinks' cotangents are the composition's too."""
    from .api import jvp, vjp
    from ..fast import _sdpa_fallback

    def vjp_rule(p, c, argnums, o, **params):
        _, grads = vjp(lambda *a: _sdpa_fallback(*a, **params), list(p), [c[0]])
        return [grads[i] for i in argnums]

    def jvp_rule(p, t, argnums, o, **params):
        tangents = [ti if ti is not None else mx.zeros_like(pi)
                    for ti, pi in zip(_tangents(p, t, argnums), p)]
        _, out = jvp(lambda *a: _sdpa_fallback(*a, **params), list(p), tangents)
        return out

    return vjp_rule, jvp_rule


_v, _j = _sdpa_rules()
defvjp("ScaledDotProductAttention", _v)
defjvp("ScaledDotProductAttention", _j)
