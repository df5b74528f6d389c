"""Differentiable test cases shared by tests/test_grad.py and tests/test_jvp.py: each is a
tapescope function and the same function written with jax.numpy, with inputs in the domain
where both are smooth (no ties, no kinks, no zeros for divisions)."""

from __future__ import annotations

import numpy as np

import tapescope.core as mx


def _pos(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def _unit(rng, shape):
    return rng.uniform(-0.8, 0.8, shape)


def _any(rng, shape):
    return rng.normal(size=shape)


def _gt1(rng, shape):
    return rng.uniform(1.2, 3.0, shape)


def _distinct(rng, shape):
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) + rng.uniform(0.1, 0.4, shape)) / n


def _nonzero(rng, shape):
    return rng.choice([-1, 1], size=shape) * rng.uniform(0.5, 2.0, shape)


def cases():
    """(name, mx function, jax function, input generators with shapes)."""
    import jax.numpy as jnp
    import jax

    S = (3, 4)
    C = []

    def add(name, f, g, *inputs):
        C.append((name, f, g, list(inputs)))

    un = [("exp", mx.exp, jnp.exp, _any), ("expm1", mx.expm1, jnp.expm1, _any),
          ("log", mx.log, jnp.log, _pos), ("log1p", mx.log1p, jnp.log1p, _pos),
          ("log2", mx.log2, jnp.log2, _pos), ("log10", mx.log10, jnp.log10, _pos),
          ("sin", mx.sin, jnp.sin, _any), ("cos", mx.cos, jnp.cos, _any),
          ("tan", mx.tan, jnp.tan, _unit), ("arcsin", mx.arcsin, jnp.arcsin, _unit),
          ("arccos", mx.arccos, jnp.arccos, _unit), ("arctan", mx.arctan, jnp.arctan, _any),
          ("sinh", mx.sinh, jnp.sinh, _any), ("cosh", mx.cosh, jnp.cosh, _any),
          ("tanh", mx.tanh, jnp.tanh, _any), ("arcsinh", mx.arcsinh, jnp.arcsinh, _any),
          ("arccosh", mx.arccosh, jnp.arccosh, _gt1), ("arctanh", mx.arctanh, jnp.arctanh, _unit),
          ("sqrt", mx.sqrt, jnp.sqrt, _pos), ("rsqrt", mx.rsqrt, jax.lax.rsqrt, _pos),
          ("square", mx.square, jnp.square, _any), ("abs", mx.abs, jnp.abs, _nonzero),
          ("negative", mx.negative, jnp.negative, _any),
          ("sigmoid", mx.sigmoid, jax.nn.sigmoid, _any), ("erf", mx.erf, jax.scipy.special.erf, _any),
          ("erfinv", mx.erfinv, jax.scipy.special.erfinv, _unit),
          ("floor", mx.floor, jnp.floor, _any), ("sign", mx.sign, jnp.sign, _nonzero),
          ("stop_gradient", mx.stop_gradient, jax.lax.stop_gradient, _any),
          ("reciprocal", mx.reciprocal, jnp.reciprocal, _nonzero)]
    for name, f, g, gen in un:
        add(name, f, g, (gen, S))
    bi = [("add", mx.add, jnp.add, _any, _any), ("subtract", mx.subtract, jnp.subtract, _any, _any),
          ("multiply", mx.multiply, jnp.multiply, _any, _any),
          ("divide", mx.divide, jnp.divide, _any, _nonzero),
          ("power", mx.power, jnp.power, _pos, _any),
          ("logaddexp", mx.logaddexp, jnp.logaddexp, _any, _any),
          ("arctan2", mx.arctan2, jnp.arctan2, _any, _nonzero),
          ("maximum", mx.maximum, jnp.maximum, _distinct, _distinct),
          ("minimum", mx.minimum, jnp.minimum, _distinct, _distinct),
          ("remainder", mx.remainder, jnp.remainder, _pos, _gt1)]
    for name, f, g, ga, gb in bi:
        add(name, f, g, (ga, S), (gb, S))
    add("broadcast_add", mx.add, jnp.add, (_any, (3, 1)), (_any, (4,)))
    add("where", lambda a, b: mx.where(a > 0, a, b), lambda a, b: jnp.where(a > 0, a, b),
        (_any, S), (_any, S))
    add("astype", lambda a: mx.astype(a, mx.float16).astype(a.dtype) * a,
        lambda a: a.astype(jnp.float16).astype(a.dtype) * a, (_any, S))
    for ax in (None, 0, 1, (0, 1)):
        add(f"sum{ax}", lambda a, ax=ax: mx.sum(a, axis=ax), lambda a, ax=ax: jnp.sum(a, axis=ax),
            (_any, S))
        add(f"prod{ax}", lambda a, ax=ax: mx.prod(a, axis=ax), lambda a, ax=ax: jnp.prod(a, axis=ax),
            (_pos, S))
        add(f"max{ax}", lambda a, ax=ax: mx.max(a, axis=ax), lambda a, ax=ax: jnp.max(a, axis=ax),
            (_distinct, S))
        add(f"min{ax}", lambda a, ax=ax: mx.min(a, axis=ax), lambda a, ax=ax: jnp.min(a, axis=ax),
            (_distinct, S))
        add(f"mean{ax}", lambda a, ax=ax: mx.mean(a, axis=ax), lambda a, ax=ax: jnp.mean(a, axis=ax),
            (_any, S))
    add("prod_with_zero", lambda a: mx.prod(a * mx.array([[1.0, 0.0, 1.0, 1.0]], a.dtype), axis=1),
        lambda a: jnp.prod(a * jnp.array([[1.0, 0.0, 1.0, 1.0]], a.dtype), axis=1), (_pos, S))
    add("logsumexp", lambda a: mx.logsumexp(a, axis=1), lambda a: jax.nn.logsumexp(a, axis=1),
        (_any, S))
    add("logsumexp_all", lambda a: mx.logsumexp(a), lambda a: jax.nn.logsumexp(a), (_any, S))
    add("softmax", lambda a: mx.softmax(a, axis=-1), lambda a: jax.nn.softmax(a, axis=-1),
        (_any, S))
    add("var", lambda a: mx.var(a, axis=0), lambda a: jnp.var(a, axis=0), (_any, S))
    add("reshape", lambda a: mx.reshape(a, (2, 6)) * mx.arange(12).reshape(2, 6).astype(a.dtype),
        lambda a: jnp.reshape(a, (2, 6)) * jnp.arange(12).reshape(2, 6).astype(a.dtype), (_any, S))
    add("transpose", lambda a: mx.transpose(a) * mx.arange(12).reshape(4, 3).astype(a.dtype),
        lambda a: a.T * jnp.arange(12).reshape(4, 3).astype(a.dtype), (_any, S))
    add("transpose3", lambda a: mx.transpose(a, (2, 0, 1)), lambda a: jnp.transpose(a, (2, 0, 1)),
        (_any, (2, 3, 4)))
    add("expand_squeeze", lambda a: mx.squeeze(mx.expand_dims(a, 1) * 2, 1),
        lambda a: jnp.squeeze(jnp.expand_dims(a, 1) * 2, 1), (_any, S))
    add("flatten", lambda a: mx.flatten(a), lambda a: jnp.ravel(a), (_any, S))
    add("slice", lambda a: a[1:, ::2], lambda a: a[1:, ::2], (_any, S))
    add("slice_neg", lambda a: a[::-1, 1:3], lambda a: a[::-1, 1:3], (_any, S))
    add("slice_update", _su,
        lambda a, b: a.at[1:3, 1:3].set(b), (_any, S), (_any, (2, 2)))
    add("concatenate", lambda a, b: mx.concatenate([a, b], axis=1),
        lambda a, b: jnp.concatenate([a, b], axis=1), (_any, S), (_any, (3, 2)))
    add("split", lambda a: mx.split(a, [1, 3], axis=1)[1] * 3,
        lambda a: jnp.split(a, [1, 3], axis=1)[1] * 3, (_any, S))
    add("split_all", lambda a: mx.concatenate(mx.split(a, 2, axis=0)[::-1], axis=0) * mx.arange(12).reshape(4, 3).astype(a.dtype),
        lambda a: jnp.concatenate(jnp.split(a, 2, axis=0)[::-1], axis=0) * jnp.arange(12).reshape(4, 3).astype(a.dtype),
        (_any, (4, 3)))
    add("pad", lambda a: mx.pad(a, [(1, 2), (0, 1)]), lambda a: jnp.pad(a, [(1, 2), (0, 1)]),
        (_any, S))
    add("take", lambda a: mx.take(a, mx.array([0, 2, 2]), axis=1),
        lambda a: jnp.take(a, jnp.array([0, 2, 2]), axis=1), (_any, S))
    add("take_flat", lambda a: mx.take(a, mx.array([[0, 5], [11, 5]])),
        lambda a: jnp.take(a, jnp.array([[0, 5], [11, 5]])), (_any, S))
    add("fancy_index", lambda a: a[mx.array([2, 0, 2]), 1:],
        lambda a: a[jnp.array([2, 0, 2]), 1:], (_any, S))
    add("take_along_axis", lambda a: mx.take_along_axis(a, mx.array([[0], [3], [1]]), axis=1),
        lambda a: jnp.take_along_axis(a, jnp.array([[0], [3], [1]]), axis=1), (_any, S))
    add("put_along_axis", lambda a, b: mx.put_along_axis(a, mx.array([[0], [3], [1]]), b, axis=1),
        lambda a, b: jnp.put_along_axis(a, jnp.array([[0], [3], [1]]), b, axis=1, inplace=False),
        (_any, S), (_any, (3, 1)))
    add("scatter_set", lambda a, b: _at(a, b, "set"), lambda a, b: a.at[jnp.array([0, 2])].set(b),
        (_any, S), (_any, (2, 4)))
    add("scatter_add", lambda a, b: _at(a, b, "add"), lambda a, b: a.at[jnp.array([0, 2])].add(b),
        (_any, S), (_any, (2, 4)))
    add("matmul", mx.matmul, jnp.matmul, (_any, (3, 4)), (_any, (4, 2)))
    add("matmul_batched", mx.matmul, jnp.matmul, (_any, (2, 3, 4)), (_any, (4, 2)))
    add("matvec", mx.matmul, jnp.matmul, (_any, (3, 4)), (_any, (4,)))
    add("addmm", lambda c, a, b: mx.addmm(c, a, b, alpha=0.5, beta=2.0),
        lambda c, a, b: 2.0 * c + 0.5 * (a @ b), (_any, (3, 2)), (_any, (3, 4)), (_any, (4, 2)))
    for rev in (False, True):
        for inc in (True, False):
            tag = f"{'rev' if rev else 'fwd'}_{'inc' if inc else 'exc'}"
            add(f"cumsum_{tag}", lambda a, r=rev, i=inc: mx.cumsum(a, axis=1, reverse=r, inclusive=i),
                lambda a, r=rev, i=inc: _jcum(jnp.cumsum, a, r, i, 0.0), (_any, S))
            add(f"cumprod_{tag}", lambda a, r=rev, i=inc: mx.cumprod(a, axis=1, reverse=r, inclusive=i),
                lambda a, r=rev, i=inc: _jcum(jnp.cumprod, a, r, i, 1.0), (_pos, S))
            add(f"cummax_{tag}", lambda a, r=rev, i=inc: mx.cummax(a, axis=1, reverse=r, inclusive=i),
                lambda a, r=rev, i=inc: _jcum(lambda x, axis: jax.lax.cummax(x, axis=axis), a, r, i, -jnp.inf),
                (_distinct, S))
            add(f"logcumsumexp_{tag}", lambda a, r=rev, i=inc: mx.logcumsumexp(a, axis=1, reverse=r, inclusive=i),
                lambda a, r=rev, i=inc: _jcum(lambda x, axis: jax.lax.cumlogsumexp(x, axis=axis), a, r, i, -jnp.inf),
                (_any, S))
    add("cumprod_zero", lambda a: mx.cumprod(a * mx.array([1.0, 0.0, 1.0, 0.0], a.dtype), axis=1),
        lambda a: jnp.cumprod(a * jnp.array([1.0, 0.0, 1.0, 0.0], a.dtype), axis=1), (_pos, S))
    add("cummin", lambda a: mx.cummin(a, axis=0), lambda a: jax.lax.cummin(a, axis=0),
        (_distinct, S))
    add("sort", lambda a: mx.sort(a, axis=1) * mx.arange(4).astype(a.dtype),
        lambda a: jnp.sort(a, axis=1) * jnp.arange(4).astype(a.dtype), (_distinct, S))
    add("sort_axis0", lambda a: mx.sort(a, axis=0) * mx.arange(3).reshape(3, 1).astype(a.dtype),
        lambda a: jnp.sort(a, axis=0) * jnp.arange(3).reshape(3, 1).astype(a.dtype), (_distinct, S))
    add("topk", lambda a: mx.sort(mx.topk(a, 2, axis=1), axis=1),
        lambda a: jnp.sort(jax.lax.top_k(a, 2)[0], axis=1), (_distinct, S))
    add("fft", lambda a: mx.abs(mx.fft.fft(a)), lambda a: jnp.abs(jnp.fft.fft(a)), (_any, S))
    add("fft2_real", lambda a: mx.real(mx.fft.fft2(a)) + mx.imag(mx.fft.ifft2(a)) * 3,
        lambda a: jnp.real(jnp.fft.fft2(a)) + jnp.imag(jnp.fft.ifft2(a)) * 3, (_any, S))
    add("rfft", lambda a: mx.abs(mx.fft.rfft(a)), lambda a: jnp.abs(jnp.fft.rfft(a)), (_any, S))
    add("rfft_odd", lambda a: mx.imag(mx.fft.rfft(a)) * 2 + mx.real(mx.fft.rfft(a)),
        lambda a: jnp.imag(jnp.fft.rfft(a)) * 2 + jnp.real(jnp.fft.rfft(a)), (_any, (3, 5)))
    add("irfft", lambda a: mx.fft.irfft(mx.fft.rfft(a) * mx.array([1.0, 2.0, 3.0])),
        lambda a: jnp.fft.irfft(jnp.fft.rfft(a) * jnp.array([1.0, 2.0, 3.0])), (_any, S))
    add("irfft_odd", lambda a: mx.fft.irfft(mx.fft.rfft(a) * mx.array([1.0, 2.0, 3.0]), n=5),
        lambda a: jnp.fft.irfft(jnp.fft.rfft(a) * jnp.array([1.0, 2.0, 3.0]), n=5), (_any, (3, 5)))
    # n-D: axes not at the end, in any order, with s cropping and padding, odd lengths
    T = (2, 3, 4)
    w3 = [1.0, 2.0, 3.0]
    add("fftn_axes", lambda a: mx.abs(mx.fft.fftn(a, axes=[0, 2])),
        lambda a: jnp.abs(jnp.fft.fftn(a, axes=(0, 2))), (_any, T))
    add("fftn_s", lambda a: mx.real(mx.fft.fftn(a, s=[1, 5], axes=[0, 2]))
        + mx.imag(mx.fft.fftn(a, s=[1, 5], axes=[0, 2])) * 2,
        lambda a: jnp.real(jnp.fft.fftn(a, s=(1, 5), axes=(0, 2)))
        + jnp.imag(jnp.fft.fftn(a, s=(1, 5), axes=(0, 2))) * 2, (_any, T))
    add("ifftn_axes", lambda a: mx.real(mx.fft.ifftn(a, axes=[2, 1])) * 3
        + mx.imag(mx.fft.ifftn(a, axes=[2, 1])),
        lambda a: jnp.real(jnp.fft.ifftn(a, axes=(2, 1))) * 3
        + jnp.imag(jnp.fft.ifftn(a, axes=(2, 1))), (_any, T))
    add("rfftn_axes", lambda a: mx.abs(mx.fft.rfftn(a, axes=[2, 1])),
        lambda a: jnp.abs(jnp.fft.rfftn(a, axes=(2, 1))), (_any, T))
    add("rfftn_s", lambda a: mx.imag(mx.fft.rfftn(a, s=[3, 6], axes=[0, 2])) * 2
        + mx.real(mx.fft.rfftn(a, s=[3, 6], axes=[0, 2])),
        lambda a: jnp.imag(jnp.fft.rfftn(a, s=(3, 6), axes=(0, 2))) * 2
        + jnp.real(jnp.fft.rfftn(a, s=(3, 6), axes=(0, 2))), (_any, T))
    add("irfftn_axes", lambda a: mx.fft.irfftn(mx.fft.rfftn(a, axes=[0, 2]) * mx.array(w3),
                                               s=[2, 4], axes=[0, 2]),
        lambda a: jnp.fft.irfftn(jnp.fft.rfftn(a, axes=(0, 2)) * jnp.array(w3), s=(2, 4),
                                 axes=(0, 2)), (_any, T))
    add("irfftn_odd_s", lambda a: mx.fft.irfftn(mx.fft.rfftn(a, axes=[1, 2]) * mx.array(w3),
                                                s=[3, 5], axes=[1, 2]),
        lambda a: jnp.fft.irfftn(jnp.fft.rfftn(a, axes=(1, 2)) * jnp.array(w3), s=(3, 5),
                                 axes=(1, 2)), (_any, T))
    if hasattr(mx, "hadamard_transform"):
        add("hadamard", lambda a: mx.hadamard_transform(a) * mx.arange(4).astype(a.dtype),
            lambda a: (a @ jnp.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]],
                                     a.dtype) / 2.0) * jnp.arange(4).astype(a.dtype), (_any, S))
    def jrms(a, w):
        return a * jax.lax.rsqrt(jnp.mean(a * a, -1, keepdims=True) + 1e-5) * w

    def jln(a, w, b):
        c = a - jnp.mean(a, -1, keepdims=True)
        return c * jax.lax.rsqrt(jnp.mean(c * c, -1, keepdims=True) + 1e-5) * w + b

    def jrope(a):
        inv = 100.0 ** (-jnp.arange(2) / 2)
        th = (jnp.arange(3)[:, None] + 2) * 0.5 * inv
        c, s_ = jnp.cos(th).astype(a.dtype), jnp.sin(th).astype(a.dtype)
        x1, x2 = a[..., 0:4:2], a[..., 1:4:2]
        rot = jnp.stack([x1 * c - x2 * s_, x1 * s_ + x2 * c], -1).reshape(a.shape[:-1] + (4,))
        return jnp.concatenate([rot, a[..., 4:]], -1)

    add("rms_norm", lambda a, w: mx.fast.rms_norm(a, w, 1e-5), jrms, (_any, (3, 5)), (_any, (5,)))
    add("layer_norm", lambda a, w, b: mx.fast.layer_norm(a, w, b, 1e-5), jln, (_any, (3, 5)),
        (_any, (5,)), (_any, (5,)))
    add("rope_traditional", lambda a: mx.fast.rope(a, 4, traditional=True, base=100.0, scale=0.5,
                                                   offset=2), jrope, (_any, (2, 3, 6)))

    def conv_jax(a, w, strides, pad, kd, idil, groups, flip):
        nd = a.ndim - 2
        sp = "DHW"[3 - nd:]
        w = jnp.flip(w, axis=tuple(range(1, nd + 1))) if flip else w
        return jax.lax.conv_general_dilated(
            a, w, strides, pad, idil, kd, ("N" + sp + "C", "O" + sp + "I", "N" + sp + "C"),
            feature_group_count=groups, precision=jax.lax.Precision.HIGHEST)

    add("conv2d_grouped_flipped",
        lambda a, w: mx.conv_general(a, w, stride=[2, 1], padding=([1, 0], [0, 2]),
                                     kernel_dilation=[1, 2], groups=2, flip=True),
        lambda a, w: conv_jax(a, w, (2, 1), [(1, 0), (0, 2)], (1, 2), (1, 1), 2, True),
        (_any, (2, 5, 6, 4)), (_any, (4, 3, 2, 2)))
    add("conv_transpose1d",
        lambda a, w: mx.conv_transpose1d(a, w, stride=2, padding=1, output_padding=1),
        lambda a, w: conv_jax(a, w, (1,), [(1, 2)], (1,), (2,), 1, True),
        (_any, (2, 5, 3)), (_any, (4, 3, 3)))
    add("as_strided", lambda a: mx.as_strided(a, (3, 3), (1, 2), 1),
        lambda a: jnp.ravel(a)[jnp.array([[1, 3, 5], [2, 4, 6], [3, 5, 7]])], (_any, S))
    add("mlp", _mlp_mx, _mlp_jax, (_any, (5, 4)), (_any, (4, 3)), (_any, (3,)))
    return C


def _su(a, b):
    out = mx.array(a)
    out[1:3, 1:3] = b  # a SliceUpdate
    return out


def _at(a, b, how):
    idx = mx.array([0, 2])
    return a.at[idx].add(b) if how == "add" else _set(a, idx, b)


def _set(a, idx, b):
    out = mx.array(a)
    out[idx] = b
    return out


def _jcum(fn, a, reverse, inclusive, ident):
    import jax.numpy as jnp

    x = jnp.flip(a, 1) if reverse else a
    y = fn(x, axis=1)
    if not inclusive:
        y = jnp.concatenate([jnp.full_like(y[:, :1], ident), y[:, :-1]], axis=1)
    return jnp.flip(y, 1) if reverse else y


def _mlp_mx(x, w, b):
    return mx.tanh(x @ w + b) @ mx.ones((3, 2), x.dtype)


def _mlp_jax(x, w, b):
    import jax.numpy as jnp

    return jnp.tanh(x @ w + b) @ jnp.ones((3, 2), x.dtype)
