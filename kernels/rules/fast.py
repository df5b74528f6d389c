"""MLX's fast primitives (``mlx/fast_primitives.h``): ``RMSNorm``, ``LayerNorm``, their VJPs
``RMSNormVJP`` / ``LayerNormVJP``, ``RoPE`` and ``ScaledDotProductAttention``.

The rules here are the array-module forms (numpy, CuPy) every runtime falls back to; the
CPU runs generated kernels of the same math (``cpu/fast_kernels.py``,
``codegen/norm_kernels.py``, ``codegen/attention_kernels.py``). MLX's semantics, as its GPU kernels compute them: the
statistics and the rotation in float32, the normalised value rounded to the output type
before the weight's multiply and the bias's add (in that type); the weight / bias inputs are
MLX's scalar 1 / 0 when none was given (``mlx/fast.cpp`` passes ``array(1, out_type)``).
"""

from __future__ import annotations

import math

from ..primitives import FAST, define
from .elementwise import finish

_F32 = "float32"


def _same_shape(shapes: list, **_) -> list:
    return [tuple(shapes[0])]


def _vjp_shapes(shapes: list, **_) -> list:
    return [tuple(s) for s in shapes[:-1]]


_DTYPE = "interactive/core/fast.py (MLX's out_type: the promoted x / weight / bias)"


def _stat(xp, x, eps):
    """(x as float32, rsqrt(mean(x^2) + eps)) over the last axis."""
    y = x.astype(xp.float32)
    return y, 1 / xp.sqrt(xp.mean(y * y, axis=-1, keepdims=True) + xp.float32(eps))


def _rows_flops(per: int):
    return lambda ins, outs: per * _n(ins[0])


def _n(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


@define("RMSNorm", family=FAST, kernel="rms", shape=_same_shape, dtype=_DTYPE, out=True, flops=_rows_flops(4))
def rms_norm(xp, x, w, *, eps, out=None):
    """``w * T(x * rsqrt(mean(x^2) + eps))`` over the last axis (T: x's dtype)."""
    y, n = _stat(xp, x, eps)
    res = (y * n).astype(x.dtype)
    if w.ndim:
        res = res * w
    return finish(res.astype(x.dtype, copy=False), out)


@define("LayerNorm", family=FAST, kernel="layer_norm", shape=_same_shape, dtype=_DTYPE, out=True, flops=_rows_flops(7))
def layer_norm(xp, x, w, b, *, eps, out=None):
    """``w * T((x - mean) * rsqrt(var + eps)) + b`` over the last axis, the variance of the
    centred values (MLX's two passes)."""
    y = x.astype(xp.float32)
    xc = y - xp.mean(y, axis=-1, keepdims=True)
    n = 1 / xp.sqrt(xp.mean(xc * xc, axis=-1, keepdims=True) + xp.float32(eps))
    res = (xc * n).astype(x.dtype)
    if w.ndim:
        res = res * w
    if b.ndim:
        res = res + b
    return finish(res.astype(x.dtype, copy=False), out)


def _row_sum(xp, v, w):
    """The weight's gradient: ``v`` summed over every axis but the last, in w's dtype (a
    scalar weight, MLX's stand-in, gets zero)."""
    if not w.ndim:
        return xp.zeros_like(w)
    return v.reshape(-1, v.shape[-1]).sum(axis=0).astype(w.dtype)


@define("RMSNormVJP", family=FAST, kernel="vjp_rms", shape=_vjp_shapes, dtype="the primals' (x, weight)",
        flops=_rows_flops(10))
def rms_norm_vjp(xp, x, w, g, *, eps):
    """(dx, dw) of RMSNorm at ``x``, ``w`` for the cotangent ``g``, in float32:
    ``dx = g w n - x mean(g w x) n^3``, ``dw = sum(g x n)`` over the rows."""
    y, n = _stat(xp, x, eps)
    gf = g.astype(xp.float32)
    gw = gf * w.astype(xp.float32)
    m = xp.mean(gw * y, axis=-1, keepdims=True)
    gx = gw * n - y * m * (n * n * n)
    return gx.astype(x.dtype), _row_sum(xp, gf * y * n, w)


@define("LayerNormVJP", family=FAST, kernel="vjp_layer_norm", shape=_vjp_shapes, dtype="the primals' (x, weight, bias)",
        flops=_rows_flops(14))
def layer_norm_vjp(xp, x, w, b, g, *, eps):
    """(dx, dw, db) of LayerNorm, in float32 (MLX's fallback in ``mlx/fast.cpp``): with
    ``xc = x - mean``, ``n = rsqrt(var + eps)``, ``wg = w g``:
    ``dx = (wg - mean(wg)) n - xc mean(wg xc) n^3``, ``dw = sum(g xc n)``, ``db = sum(g)``."""
    y = x.astype(xp.float32)
    xc = y - xp.mean(y, axis=-1, keepdims=True)
    n = 1 / xp.sqrt(xp.mean(xc * xc, axis=-1, keepdims=True) + xp.float32(eps))
    gf = g.astype(xp.float32)
    wg = gf * w.astype(xp.float32)
    gx = (wg - xp.mean(wg, axis=-1, keepdims=True)) * n \
        - xc * xp.mean(wg * xc, axis=-1, keepdims=True) * (n * n * n)
    return gx.astype(x.dtype), _row_sum(xp, gf * xc * n, w), _row_sum(xp, gf, b)


def inv_freqs(xp, dims: int, base: float, freqs=None):
    """RoPE's inverse frequencies in float32: ``1 / freqs``, or MLX's
    ``exp(-i * log(base) / (dims / 2))``."""
    half = dims // 2
    if freqs is not None:
        return (1 / freqs.astype(xp.float32)).astype(xp.float32)
    return xp.exp(xp.arange(0, -half, -1, dtype=xp.float32)
                  * xp.float32(math.log(base) / half)).astype(xp.float32)


def rope_bhld(shape: tuple) -> tuple:
    """MLX's (B, H, L, D) view of a RoPE input (``mlx/fast.cpp``'s fallback): 3-D gets a head
    axis, the axes between the first and the last two are the heads."""
    if len(shape) == 3:
        return (shape[0], 1, shape[1], shape[2])
    h = 1
    for d in shape[1:-2]:
        h *= int(d)
    return (shape[0], h, shape[-2], shape[-1])


@define("RoPE", family=FAST, kernel="rope", shape=_same_shape, dtype="the input's", out=True,
        flops=_rows_flops(3))
def rope(xp, x, offset, *freqs, dims, traditional, base, scale, forward, out=None):
    """Rotary positional encoding of the first ``dims`` features of (B, H, L, D) rows at
    positions ``(l + offset[b]) * scale``, rotated in float32 and rounded once
    (``forward=False``: the inverse rotation, RoPE's VJP)."""
    B, H, L, D = rope_bhld(x.shape)
    v = x.reshape(B, H, L, D)
    inv = inv_freqs(xp, dims, base, freqs[0] if freqs else None)
    off = offset.reshape(-1).astype(xp.float32)
    off = off.reshape(-1, 1, 1, 1) if off.size > 1 else off.reshape(1, 1, 1, 1)
    pos = (xp.arange(L, dtype=xp.float32).reshape(1, 1, L, 1) + off) * xp.float32(scale)
    theta = pos * inv
    cs, sn = xp.cos(theta), xp.sin(theta)
    if traditional:
        x1, x2 = v[..., 0:dims:2].astype(xp.float32), v[..., 1:dims:2].astype(xp.float32)
    else:
        x1, x2 = v[..., :dims // 2].astype(xp.float32), v[..., dims // 2:dims].astype(xp.float32)
    if forward:
        r1, r2 = x1 * cs - x2 * sn, x1 * sn + x2 * cs
    else:
        r1, r2 = x2 * sn + x1 * cs, x2 * cs - x1 * sn
    res = xp.empty((B, H, L, D), dtype=x.dtype)
    if traditional:
        res[..., 0:dims:2], res[..., 1:dims:2] = r1, r2
    else:
        res[..., :dims // 2], res[..., dims // 2:dims] = r1, r2
    if dims < D:
        res[..., dims:] = v[..., dims:]
    return finish(res.reshape(x.shape), out)


def _sdpa_shape(shapes: list, **_) -> list:
    q, v = shapes[0], shapes[2]
    return [(q[0], q[1], q[2], v[3])]


def _sdpa_flops(ins, outs):
    B, H, L, D = (int(d) for d in ins[0])
    return 2 * B * H * L * int(ins[1][2]) * (D + int(ins[2][3]))


_F32_LOWEST = -3.4028234663852886e38  # finfo(float32).min: MLX's fallback's masked score
SDPA_SCORES = 1 << 23  # scores (float32) of one query block of the array-module rule (~32 MB)


@define("ScaledDotProductAttention", family=FAST, kernel="attention", shape=_sdpa_shape,
        dtype="interactive/core/fast.py (MLX's final_type: q, k, v promoted)", flops=_sdpa_flops)
def scaled_dot_product_attention(xp, q, k, v, *rest, scale, causal, has_mask, has_sinks,
                                 scores=SDPA_SCORES):
    """``softmax(q kᵀ scale + mask) v`` over (B, heads, L, D) inputs in float32 (float64 in float64), rounded once
    to the inputs' dtype (MLX's fused kernels: ``sdpa_vector.h``, ``steel/attn``): ``k`` /
    ``v`` with ``heads / kv_heads`` query heads each; ``causal``: query ``i`` sees keys up to
    ``i + kL - L``; a mask (``rest[0]``, broadcast to (B, heads, L, kL)): boolean (False: the
    float32 lowest score, as MLX's fallback's ``finfo.min``) or additive; ``sinks``
    (``rest[-1]``, one per head): a logit in the softmax's denominator with no value. Blocks
    of query rows bound the scores held at once (``SDPA_SCORES``), each block's scores
    updated in place (two matmuls and three passes over them); a GPU's rule gives a larger
    ``scores`` (its passes are bandwidth-bound, each launch costs host time)."""
    B, H, L, D = q.shape
    Hk, kL = k.shape[1], k.shape[2]
    reps = H // Hk
    mask = rest[0] if has_mask else None
    ct = xp.float64 if q.dtype == xp.float64 else xp.float32  # float64 stays float64 (MLX's CPU)
    sinks = rest[-1].astype(ct).reshape(Hk, reps, 1, 1) if has_sinks else None
    out = xp.empty((B, H, L, v.shape[3]), dtype=q.dtype)
    kf = k.astype(ct, copy=False).reshape(B, Hk, 1, kL, D)
    vf = v.astype(ct, copy=False).reshape(B, Hk, 1, kL, v.shape[3])
    low = ct(_F32_LOWEST) if ct is xp.float32 else ct(xp.finfo(ct).min)
    block = max(16, scores // max(1, B * H * kL))
    for i0 in range(0, L, block):
        i1 = min(L, i0 + block)
        qf = q[:, :, i0:i1].astype(ct, copy=False).reshape(B, Hk, reps, i1 - i0, D)
        s = xp.matmul(qf, xp.swapaxes(kf, -1, -2))  # the block's scores, updated in place
        s *= ct(scale)
        if causal:
            keep = (xp.arange(i0, i1).reshape(-1, 1) + (kL - L)) >= xp.arange(kL).reshape(1, -1)
            xp.copyto(s, low, where=~keep)
        if mask is not None:
            m = mask[:, :, i0:i1].reshape(B, Hk, reps, i1 - i0, kL)
            if m.dtype == xp.bool_:
                xp.copyto(s, low, where=~m)
            else:
                s += m.astype(ct)
        mx_ = s.max(axis=-1, keepdims=True)
        if sinks is not None:
            mx_ = xp.maximum(mx_, sinks)
        s -= mx_
        xp.exp(s, out=s)
        den = s.sum(axis=-1, keepdims=True)
        if sinks is not None:
            den = den + xp.exp(sinks - mx_)
        o = xp.matmul(s, vf)
        o /= den
        out[:, :, i0:i1] = o.reshape(B, H, i1 - i0, v.shape[3]).astype(q.dtype)
    return out
