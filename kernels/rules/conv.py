"""MLX's ``Convolution`` primitive: channels-last N-d convolution as an im2col and a matmul.

Input ``(N, *spatial, C_in)``, weight ``(C_out, *kernel, C_in / groups)`` (the op has already
promoted both to one floating type and turned negative padding into a slice, as
``conv_general`` in ``mlx/ops.cpp`` does). The input is dilated and padded with zeros in one
assignment, the windows are gathered along each spatial axis with ``take`` (an index
``out * stride + k * kernel_dilation``), and the windows of each group meet its filters in one
batched ``matmul``. ``flip`` reverses the kernel's spatial axes (convolution rather than
cross-correlation). float16 / bfloat16 accumulate in float32 and round once, as MLX's CPU
backend does (``mlx/backend/cpu/conv.cpp``).
"""

from __future__ import annotations

from ..primitives import MATMUL, define


def _dilate(size: int, d: int) -> int:
    return 0 if size == 0 else (size - 1) * d + 1


def out_shape(in_shape, wt_shape, strides, padding_lo, padding_hi, kernel_dilation,
              input_dilation) -> tuple:
    """MLX's ``Convolution::conv_out_shape`` (``mlx/primitives.cpp``) for checked arguments."""
    spatial = []
    for i in range(len(in_shape) - 2):
        n = _dilate(in_shape[1 + i], input_dilation[i]) + padding_lo[i] + padding_hi[i]
        k = _dilate(wt_shape[1 + i], kernel_dilation[i])
        q = abs(n - k) // strides[i]  # C's division, truncating toward zero
        spatial.append((q if n >= k else -q) + 1)
    return (in_shape[0], *spatial, wt_shape[0])


def _shape(shapes: list, *, strides, padding_lo, padding_hi, kernel_dilation, input_dilation,
           **_) -> list:
    return [out_shape(shapes[0], shapes[1], strides, padding_lo, padding_hi, kernel_dilation,
                      input_dilation)]


def _dtype(dtypes: list, **_) -> list:
    """The inputs' (one floating type: the op promotes them first)."""
    return [dtypes[0]]


def _wide(xp, a):
    return a.astype(xp.float32) if a.dtype.name in ("float16", "bfloat16") else a


def _export(name: str, kw: dict) -> tuple:
    """MLX's state: its five std::vector<int> (strides, paddings, dilations), then groups and flip."""
    vals = list(kw.values())
    return name, [list(v) for v in vals[:5]] + vals[5:]


@define("Convolution", family=MATMUL, shape=_shape, dtype=_dtype, export=_export)
def convolution(xp, x, w, *, strides, padding_lo, padding_hi, kernel_dilation, input_dilation,
                groups, flip):
    """``out[n, o..., c] = sum_{k..., j} xpad[n, o*s + k*kd, g(c)*cg + j] * w[c, k..., j]``."""
    dtype = x.dtype
    xw, ww = _wide(xp, x), _wide(xp, w)
    nsp = x.ndim - 2
    n, cin, cout = x.shape[0], x.shape[-1], w.shape[0]
    ksz = w.shape[1:-1]
    osz = out_shape(x.shape, w.shape, strides, padding_lo, padding_hi, kernel_dilation,
                    input_dilation)[1:-1]
    # zero-dilated, zero-padded input, in one assignment
    # (a window may run past the high end when MLX's truncating division lets a short input
    # through with stride > 1: MLX reads zeros there, so the padding grows to cover it)
    padded = [max(lo + _dilate(s, d) + hi, (o - 1) * st + _dilate(k, kd))
              for s, d, lo, hi, o, st, k, kd in zip(x.shape[1:-1], input_dilation, padding_lo,
                                                    padding_hi, osz, strides, ksz,
                                                    kernel_dilation)]
    z = xp.zeros((n, *padded, cin), dtype=xw.dtype)
    z[(slice(None),) + tuple(slice(lo, lo + _dilate(s, d), d) for s, d, lo in
                             zip(x.shape[1:-1], input_dilation, padding_lo))] = xw
    # windows: take along each spatial axis -> (N, O1, K1, O2, K2, ..., C_in)
    for i in range(nsp):
        idx = ((xp.arange(osz[i]) * strides[i])[:, None]
               + (xp.arange(ksz[i]) * kernel_dilation[i])[None, :])
        z = xp.take(z, idx, axis=1 + 2 * i)
    order = [0] + [1 + 2 * i for i in range(nsp)] + [2 + 2 * i for i in range(nsp)] + [1 + 2 * nsp]
    m = n
    for o in osz:
        m *= o
    kprod = 1
    for k in ksz:
        kprod *= k
    cg, og = cin // groups, cout // groups
    cols = xp.transpose(z, order).reshape(m, kprod, groups, cg)
    cols = xp.transpose(cols, (2, 0, 1, 3)).reshape(groups, m, kprod * cg)
    if flip:
        ww = ww[(slice(None),) + (slice(None, None, -1),) * nsp]
    filt = xp.transpose(ww.reshape(groups, og, kprod * cg), (0, 2, 1))
    out = xp.matmul(cols, filt)  # (groups, M, og)
    out = xp.transpose(out, (1, 0, 2)).reshape(n, *osz, cout)
    return out.astype(dtype)
