"""VJP / JVP rules of the quantization primitives, after ``QuantizedMatmul::vjp`` / ``jvp``,
``GatherQMM::vjp`` and ``QQMatmul::vjp`` in ``mlx/primitives.cpp``; ``Quantize`` (MLX's
``fast::Quantize``, a Custom primitive) is differentiated through its fallback composition,
as MLX's ``Custom::vjp`` / ``jvp`` do.

The cotangent of x is the same product against the transposed matrix; affine scales and
biases get ``sum(dW * codes)`` and ``sum(dW)`` per group, with ``dW = c^T x``. GatherQMM's
``dW`` per index is a product of the gathered x and the cotangent, scatter-added at the
right-hand indices (MLX's ``gather_mm_grad`` computes the same with gather_mm / segmented_mm).
"""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from ..device import resolve_stream
from ..ops.indexing import _scatter
from ..ops.quantized import (_quantized_matmul, affine_dequantize, affine_quantize_composed,
                             gather_qmm, qqmm)
from .custom import _default_jvp, _default_vjp
from .registry import defjvp, defvjp, without


def _t(x):
    return mx.swapaxes(x, -1, -2)


def _scales_grad(tag: str, mode: str) -> None:
    if mode != "affine":
        raise ValueError(f"[{tag}::vjp] no gradient wrt scales in {mode} quantization.")


def _codes(w, scales, group_size: int, bits: int):
    """The unscaled codes of ``w``, grouped: dequantize with ones and zeros."""
    s = resolve_stream(None)
    q = affine_dequantize(w, mx.ones_like(scales), mx.zeros_like(scales), group_size, bits, s)
    return mx.unflatten(mx.astype(q, scales.dtype), -1, (-1, group_size))


def _scale_bias_grads(i: int, dsb, w, scales, group_size: int, bits: int):
    if i == 3:
        return mx.sum(dsb, -1, keepdims=False)
    return mx.sum(mx.multiply(dsb, _codes(w, scales, group_size, bits)), -1, keepdims=False)


def _qmm_vjp(p, c, argnums, o, *, group_size, bits, mode, transpose):
    s = resolve_stream(None)
    x, w, scales = p[0], p[1], p[2]
    biases = p[3] if mode == "affine" else None
    out, dsb = [], None
    for i in argnums:
        if i == 0:
            out.append(_quantized_matmul(c[0], w, scales, biases, not transpose, group_size,
                                         bits, mode, s))
        elif i == 1:
            raise RuntimeError("[QuantizedMatmul::vjp] no gradient wrt the quantized weights.")
        else:
            _scales_grad("QuantizedMatmul", mode)
            if dsb is None:
                nd = w.ndim
                fc, fx = mx.flatten(c[0], 0, -nd), mx.flatten(x, 0, -nd)
                dw = mx.matmul(_t(fc), fx) if transpose else mx.matmul(_t(fx), fc)
                dsb = mx.unflatten(dw, -1, (-1, group_size))
            out.append(_scale_bias_grads(i, dsb, w, scales, group_size, bits))
    return out


def _qmm_jvp(p, t, argnums, o, *, group_size, bits, mode, transpose):
    if len(argnums) > 1 or argnums[0] != 0:
        raise RuntimeError("[QuantizedMatmul::jvp] No JVP wrt the quantized matrix yet.")
    biases = p[3] if mode == "affine" else None
    return [_quantized_matmul(t[0], p[1], p[2], biases, transpose, group_size, bits, mode,
                              resolve_stream(None))]


defvjp("QuantizedMatmul", _qmm_vjp)
defjvp("QuantizedMatmul", _qmm_jvp)


def _gather_qmm_vjp(p, c, argnums, o, *, group_size, bits, mode, transpose, left_sorted,
                    right_sorted):
    s = resolve_stream(None)
    x, w, scales = p[0], p[1], p[2]
    lhs, rhs = p[-2], p[-1]
    biases = p[3] if mode == "affine" else None
    cot = c[0]
    m, k = cot.shape[-2], x.shape[-1]
    is_sorted = left_sorted or right_sorted
    no_broadcast = rhs.size * m * k == x.size
    out, dsb = [], None
    for i in argnums:
        if i == 0:
            g = gather_qmm(cot, w, scales, biases, None, rhs, not transpose, group_size, bits,
                           mode, sorted_indices=is_sorted, stream=s)
            if is_sorted and no_broadcast:
                out.append(g)
            else:
                flat = mx.flatten(mx.zeros_like(x), 0, -3)
                upd = mx.expand_dims(g, -3)
                out.append(mx.reshape(_scatter(flat, [lhs], upd, [0], "sum", s), x.shape))
        elif i > 3:
            raise RuntimeError("[GatherQMM::vjp] cannot compute the gradient wrt the indices.")
        elif i == 1:
            raise RuntimeError("[GatherQMM::vjp] no gradient wrt the quantized weights.")
        else:
            _scales_grad("GatherQMM", mode)
            if dsb is None:
                dsb = mx.unflatten(_gather_mm_grad(x, cot, lhs, rhs, tuple(w.shape[:-2])), -1,
                                   (-1, group_size))
            out.append(_scale_bias_grads(i, dsb, w, scales, group_size, bits))
    return out


def _gather_mm_grad(x, dy, lhs, rhs, batch_shape: tuple):
    """``sum over i with rhs[i] == b of dy[i]^T @ x[lhs[i]]`` for every matrix b of w's batch."""
    s = resolve_stream(None)
    n, k = dy.shape[-1], x.shape[-1]
    segments = 1
    for d in batch_shape:
        segments *= d
    xs = mx.take(mx.flatten(x, 0, -3) if x.ndim > 2 else mx.expand_dims(x, 0),
                 mx.flatten(lhs) if lhs.ndim else mx.reshape(lhs, (1,)), axis=0)
    dw = mx.matmul(_t(mx.reshape(dy, (-1,) + tuple(dy.shape[-2:]))), xs)
    acc = mx.zeros((segments, n, k), dtype=dw.dtype)
    idx = mx.flatten(rhs) if rhs.ndim else mx.reshape(rhs, (1,))
    acc = _scatter(acc, [idx], mx.expand_dims(dw, -3), [0], "sum", s)
    return mx.reshape(acc, batch_shape + (n, k))


defvjp("GatherQMM", _gather_qmm_vjp)
without("GatherQMM", jvp="MLX has no JVP for GatherQMM: raises GatherQMM::jvp NYI")


def _qqmm_vjp(p, c, argnums, o, *, group_size, bits, mode):
    s = resolve_stream(None)
    cot = c[0]
    amax = (mx.astype(mx.max(mx.abs(cot)), _dt.float32) if len(p) == 4 else None)

    def scale(i):
        return p[i] if len(p) == 4 else None

    out = []
    for i in argnums:
        if i == 0:
            out.append(qqmm(cot, _t(p[1]), None, group_size, bits, mode, amax, scale(3),
                            stream=s))
        elif i == 1:
            out.append(qqmm(_t(cot), _t(p[0]), None, group_size, bits, mode, amax, scale(2),
                            stream=s))
        else:
            out.append(mx.zeros_like(p[i]))
    return out


defvjp("QQMatmul", _qqmm_vjp)
without("QQMatmul", jvp="MLX has no JVP for QQMatmul: raises QQMM::jvp NYI")
without("GatherQQMM", vjp="MLX has no VJP for GatherQQMM: raises [Primitive::vjp] Not "
        "implemented for GatherQQMM.", jvp="MLX has no JVP for GatherQQMM: raises "
        "[Primitive::jvp] Not implemented for GatherQQMM.")


def _quantize_fallback(group_size: int, bits: int):
    def fun(arrs: list) -> list:
        return affine_quantize_composed(arrs[0], group_size, bits, resolve_stream(None))

    return fun


def _quantize_vjp(p, c, argnums, o, *, group_size, bits, mode):
    return _default_vjp(_quantize_fallback(group_size, bits))(list(p), list(c), list(o))


def _quantize_jvp(p, t, argnums, o, *, group_size, bits, mode):
    return _default_jvp(_quantize_fallback(group_size, bits))(list(p), list(t), list(argnums))


defvjp("Quantize", _quantize_vjp)
defjvp("Quantize", _quantize_jvp)

for _name in ("ToFP8", "FromFP8"):
    without(_name, vjp=f"MLX has no VJP for {_name}: raises [Primitive::vjp] Not implemented "
            f"for {_name}.", jvp=f"MLX has no JVP for {_name}: raises [Primitive::jvp] Not "
            f"implemented for {_name}.")
