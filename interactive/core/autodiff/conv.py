"""VJP / JVP rules of Convolution, after ``Convolution::vjp`` in ``mlx/primitives.cpp``.

The input's cotangent is a convolution of the output's cotangent with the weight (channels
swapped per group, the flip toggled; strides become input dilation and the input's dilation
the stride), sliced where its padding came out negative. The weight's cotangent is a
convolution of the input (channels and batch swapped per group) with the cotangent (its
batch as channels), flipped back when the forward conv flipped. MLX takes a patches path
(``conv_weight_backward_patches``) for undilated, unflipped, ungrouped convs; it computes the
same values, so the general form serves every case here. Where the gradients' convs get
negative padding, it crops the dilated input exactly (``_conv_exact``): MLX slices whole
elements there, which gives wrong shapes under input dilation or uneven padding (tests
compare with ``jax.grad`` instead). The JVP is linear in each input.
"""

from __future__ import annotations

from .. import ops as mx
from ..device import resolve_stream
from ..ops.conv import _conv_general
from ..ops.indexing import _slice
from .registry import defjvp, defvjp


def _dilate(n: int, d: int) -> int:
    return 0 if n == 0 else (n - 1) * d + 1


def _group_transpose(x, groups: int, group_dim: int, ax_a: int, ax_b: int):
    """MLX's ``group_transpose``: swap two axes with the channel axis split into groups."""
    if groups == 1:
        return mx.swapaxes(x, 0, -1)
    shape = list(x.shape)
    gd = group_dim % len(shape)
    shape.insert(gd, groups)
    shape[gd + 1] //= groups
    return mx.flatten(mx.swapaxes(mx.reshape(x, shape), ax_a, ax_b), gd, gd + 1)


def _conv_exact(x, w, stride, lo, hi, kd, idil, groups, flip, s):
    """A conv whose negative padding crops the *dilated* input, as the gradients need.
    ``conv_general`` (as MLX's) slices whole input elements instead, which differs under
    input dilation, so each side here drops the elements the crop reaches and pads back
    the zeros it over-removed."""
    nd = x.ndim - 2
    lo, hi = list(lo), list(hi)
    start, stop = [0] * x.ndim, list(x.shape)
    for i in range(nd):
        n, d = x.shape[1 + i], idil[i]
        if lo[i] < 0:
            r = -(lo[i] // d)  # ceil(-lo / d) elements reached by the crop
            start[1 + i], lo[i] = r, r * d + lo[i]
        if hi[i] < 0:
            r = -(hi[i] // d)
            stop[1 + i] = n - r
            hi[i] = _dilate(n, d) + hi[i] - _dilate(max(n - r - start[1 + i], 0), d) - \
                (start[1 + i] * d)
    if start != [0] * x.ndim or stop != list(x.shape):
        x = _slice(x, start, stop, [1] * x.ndim, s)
    return _conv_general(x, w, stride, lo, hi, kd, idil, groups, flip, s)


def _conv_vjp(p, c, argnums, o, *, strides, padding_lo, padding_hi, kernel_dilation,
              input_dilation, groups, flip):
    x, w, ct = p[0], p[1], c[0]
    s = resolve_stream(None)
    nd = x.ndim - 2
    out = []
    for a in argnums:
        if a == 0:
            # ct dilated by the strides, padded so its windows over the flipped kernel cover
            # exactly the dilated input from its first element; input dilation as the stride
            lo = [_dilate(w.shape[1 + i], kernel_dilation[i]) - padding_lo[i] - 1
                  for i in range(nd)]
            hi = [_dilate(x.shape[1 + i], input_dilation[i]) + padding_lo[i]
                  - _dilate(ct.shape[1 + i], strides[i]) for i in range(nd)]
            out.append(_conv_exact(ct, _group_transpose(w, groups, 0, 1, -1), input_dilation,
                                   lo, hi, kernel_dilation, strides, groups, not flip, s))
        else:
            hi = [_dilate(ct.shape[1 + i], strides[i]) - _dilate(x.shape[1 + i], input_dilation[i])
                  + _dilate(w.shape[1 + i], kernel_dilation[i]) - padding_lo[i] - 1
                  for i in range(nd)]
            g = _conv_exact(_group_transpose(x, groups, -1, 0, -1), mx.swapaxes(ct, 0, -1),
                            kernel_dilation, list(padding_lo), hi, strides, input_dilation,
                            groups, False, s)
            if flip:
                g = _slice(g, [0] + [n - 1 for n in g.shape[1:-1]] + [0],
                           [g.shape[0]] + [-1] * nd + [g.shape[-1]], [1] + [-1] * nd + [1], s)
            out.append(mx.swapaxes(g, 0, -1))
    return out


def _conv_jvp(p, t, argnums, o, **params):
    s = resolve_stream(None)
    args = [params[k] for k in ("strides", "padding_lo", "padding_hi", "kernel_dilation",
                                "input_dilation", "groups", "flip")]
    acc = None
    for i, ti in zip(argnums, t):
        x, w = (ti, p[1]) if i == 0 else (p[0], ti)
        term = _conv_general(x, w, *args, s)
        acc = term if acc is None else mx.add(acc, term)
    return [acc]


defvjp("Convolution", _conv_vjp)
defjvp("Convolution", _conv_jvp)
