"""VJP / JVP rules of ``FFT`` and ``Hadamard``: both linear, so a JVP is the op on the
tangent. A VJP follows MLX's convention for complex cotangents (the conjugate of JAX's, so
that real gradients agree): the adjoint. A forward complex FFT's is ``n * ifft``, an inverse
one's ``fft / n``; rfftn's is the real part of ``n * ifftn`` of the cotangent zero-padded to
the input length; irfftn's is ``fftn`` of the cotangent cut to the half spectrum, over ``n``,
with the bins that stand for two (all but DC and, for even n, Nyquist) counted twice."""

from __future__ import annotations

import math


from .. import dtypes as _dt
from .. import ops as mx
from ..array import array
from .registry import defjvp, defvjp, record1, same_op
from .shape import linear_jvp


def _c2c(x, inverse: bool, axes):
    return record1("FFT", [x], x.shape, _dt.complex64, axes=tuple(axes), inverse=inverse,
                   real=False, out_shape=tuple(x.shape))


def _fft_vjp(p, c, argnums, o, *, axes, inverse, real, out_shape):
    x, ct = p[0], c[0]
    last = axes[-1]
    if not real:
        n = math.prod(x.shape[a] for a in axes)
        g = _c2c(ct, not inverse, axes)
        return [mx.multiply(g, float(n) if not inverse else 1.0 / n)]
    if not inverse:  # rfftn: x real (n on the last axis), ct complex (n // 2 + 1)
        n = math.prod(x.shape[a] for a in axes)
        pads = [(0, 0)] * ct.ndim
        pads[last] = (0, x.shape[last] - ct.shape[last])
        full = mx.pad(ct, pads) if pads[last][1] else ct
        return [mx.multiply(mx.real(_c2c(full, True, axes)), float(n))]
    # irfftn: x complex (m = n // 2 + 1 on the last axis), ct real (n)
    n, m = ct.shape[last], x.shape[last]
    total = math.prod(ct.shape[a] for a in axes)
    g = _c2c(mx.astype(ct, _dt.complex64), False, axes)
    idx = [slice(None)] * ct.ndim
    idx[last] = slice(0, m)
    g = g[tuple(idx)]
    w = [1.0] + [2.0] * (m - 1)
    if n % 2 == 0 and m > 1:
        w[-1] = 1.0
    shape = [1] * ct.ndim
    shape[last] = m
    wa = mx.reshape(array([v / total for v in w], _dt.float32), tuple(shape))
    return [mx.multiply(g, wa)]


defvjp("FFT", _fft_vjp)
defjvp("FFT", linear_jvp("FFT"))


def _hadamard_vjp(p, c, argnums, o, *, scale):
    return same_op("Hadamard", [c[0]], o, scale=scale)  # the matrix is symmetric


defvjp("Hadamard", _hadamard_vjp)
defjvp("Hadamard", linear_jvp("Hadamard"))
