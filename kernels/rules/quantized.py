"""Quantization: MLX's ``Quantize`` (affine), ``QuantizedMatmul``, ``GatherQMM``, ``QQMatmul``,
``GatherQQMM``, ``ToFP8`` and ``FromFP8`` primitives.

Packed weights are a little-endian bit stream of ``bits``-wide codes read as uint32 words (the
layout of ``mlx/backend/cpu/quantized.cpp``: whole words for 2, 4 and 8 bits, 3- and 5-byte
packs for 3, 5 and 6 bits, which is the same stream). Affine codes are ``q * scale + bias``;
"mxfp4" / "nvfp4" codes index the e2m1 table and "mxfp8" codes are e4m3 bytes, times a scale
that is an e8m0 exponent (``2^(s - 127)``, groups of 32) or an e4m3 byte (nvfp4, groups of 16).
The matmuls dequantize and multiply in float32 and round once (MLX's CPU kernels accumulate
in the input type; tests compare within float tolerance). The e4m3 conversions follow
``detail::ToFP8`` / ``FromFP8`` (``mlx/backend/cpu/unary_ops.h``) bit for bit: float32 bit
arithmetic, saturating at 448 (inf and nan too), 0x7F / 0xFF decode to nan.
"""

from __future__ import annotations

from ..primitives import QUANTIZED, define

FP4_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
           -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_OPS = "interactive/core/ops/quantized.py (the op computes it, as mlx/ops.cpp does)"


def _f32(xp, a):
    return a if a.dtype == xp.float32 else a.astype(xp.float32)


def _same_shape(shapes: list, **_) -> list:
    return [tuple(shapes[0])]


# -- e4m3 ----------------------------------------------------------------------------------
def fp8_encode(xp, a):
    """float -> e4m3 byte (uint8), MLX's ``detail::ToFP8`` on the value as float32."""
    u32 = xp.uint32
    bits = xp.ascontiguousarray(_f32(xp, a)).view(u32)
    sign = bits & u32(0x80000000)
    fb = bits ^ sign
    # below 2^-6: add 2^14 (the float of bits 141 << 23) and keep the low mantissa bits
    small = fb < u32(121 << 23)
    low = xp.where(small, fb, u32(0)).view(xp.float32) + xp.float32(2.0 ** 14)
    low = xp.ascontiguousarray(low).view(u32)
    low = (low - u32(141 << 23)) & u32(0xFF)
    # normal: rebias the exponent, round the 20 dropped bits to nearest even
    high = fb + u32((((7 - 127) << 23) + 0x7FFFF) % (1 << 32)) + ((fb >> u32(20)) & u32(1))
    high = (high >> u32(20)) & u32(0xFF)
    out = xp.where(small, low, high)
    out = xp.where(fb >= u32(543 << 21), u32(0x7E), out)
    return (out | (sign >> u32(24))).astype(xp.uint8)


def fp8_decode(xp, b):
    """e4m3 byte -> float32: the byte's magnitude as float16 bits, times 256; 0x7F / 0xFF
    are nan (the float16 nan 0x7F80 widened, as MLX 0.32.4 returns it)."""
    b = b.astype(xp.uint16)
    mag = b & xp.uint16(127)
    out = xp.ascontiguousarray(mag << xp.uint16(7)).view(xp.float16).astype(xp.float32)
    out = out * xp.float32(256.0)
    out = xp.where(mag == xp.uint16(127), xp.asarray(0x7FF00000, dtype=xp.uint32).view(xp.float32), out)
    return xp.where((b & xp.uint16(128)) != 0, -out, out)


@define("ToFP8", family=QUANTIZED, shape=_same_shape, dtype="uint8")
def to_fp8(xp, a):
    """float16 / bfloat16 / float32 -> e4m3 bytes."""
    return fp8_encode(xp, a)


@define("FromFP8", family=QUANTIZED, shape=_same_shape, dtype="the ``dtype`` parameter")
def from_fp8(xp, b, *, dtype):
    """e4m3 bytes -> float32 (every e4m3 value is exact in each float type; the evaluator
    stores it as ``dtype``)."""
    return fp8_decode(xp, b)


# -- packing ---------------------------------------------------------------------------------
def pack(xp, q, bits: int):
    """Codes (..., K) (< 2**bits) -> uint32 words (..., K * bits / 32), little-endian stream."""
    q = q.astype(xp.uint32)
    lead, k = q.shape[:-1], q.shape[-1]
    if 32 % bits == 0:
        q = q.reshape(*lead, k * bits // 32, 32 // bits)
        shifts = xp.arange(0, 32, bits, dtype=xp.uint32)
    else:
        q = ((q[..., None] >> xp.arange(bits, dtype=xp.uint32)) & xp.uint32(1))
        q = q.reshape(*lead, k * bits // 32, 32)
        shifts = xp.arange(32, dtype=xp.uint32)
    return (q << shifts).sum(axis=-1, dtype=xp.uint32)


def unpack(xp, w, bits: int):
    """uint32 words (..., W) -> codes (..., W * 32 / bits) as uint32."""
    lead, nw = w.shape[:-1], w.shape[-1]
    w = w.astype(xp.uint32)
    mask = xp.uint32((1 << bits) - 1)
    if 32 % bits == 0:
        q = (w[..., None] >> xp.arange(0, 32, bits, dtype=xp.uint32)) & mask
        return q.reshape(*lead, nw * 32 // bits)
    b = (w[..., None] >> xp.arange(32, dtype=xp.uint32)) & xp.uint32(1)
    b = b.reshape(*lead, nw * 32 // bits, bits)
    return (b << xp.arange(bits, dtype=xp.uint32)).sum(axis=-1, dtype=xp.uint32)


def fp_scale(xp, s, group_size: int):
    """A uint8 scale as float32: e4m3 (groups of 16, nvfp4) or the e8m0 power ``2^(s-127)``."""
    if group_size == 16:
        return fp8_decode(xp, s)
    return xp.ldexp(xp.float32(1.0), s.astype(xp.int32) - 127).astype(xp.float32)


def dequantized(xp, w, scales, biases, *, group_size: int, bits: int, mode: str):
    """The float32 matrix (..., K) that packed ``w`` and its scales (and biases) stand for."""
    q = unpack(xp, w, bits)
    lead, k = q.shape[:-1], q.shape[-1]
    q = q.reshape(*lead, k // group_size, group_size)
    if mode == "affine":
        v = q.astype(xp.float32) * _f32(xp, scales)[..., None] + _f32(xp, biases)[..., None]
    else:
        v = (xp.asarray(FP4_LUT, dtype=xp.float32)[q] if bits == 4
             else fp8_decode(xp, q.astype(xp.uint8)))
        v = v * fp_scale(xp, scales, group_size)[..., None]
    return v.reshape(*lead, k)


# -- affine quantization ------------------------------------------------------------------------
def _quantize_shapes(shapes: list, *, group_size, bits, **_) -> list:
    s = tuple(shapes[0])
    return [s[:-1] + (s[-1] * bits // 32,), s[:-1] + (s[-1] // group_size,),
            s[:-1] + (s[-1] // group_size,)]


@define("Quantize", family=QUANTIZED, kernel="quantize", shape=_quantize_shapes,
        dtype="uint32 words, then scales and biases in the input's dtype")
def quantize(xp, w, *, group_size, bits, mode="affine"):
    """Affine quantization per group, as ``quantize`` in ``mlx/backend/cpu/quantized.cpp``:
    float32 min / max, a scale that puts the larger-magnitude edge exactly on a code (1 bit:
    the minimum and the range, as MLX 0.32.4), codes rounded to nearest even and clipped to
    ``[0, 2^bits - 1]``."""
    if w.dtype.name not in ("float32", "float16", "bfloat16"):
        raise RuntimeError("[fast::Quantize::eval_cpu] Only supports floating point inputs")
    f32 = xp.float32
    shape = w.shape
    g = _f32(xp, w).reshape(-1, group_size)
    n_bins = f32((1 << bits) - 1)
    w_max, w_min = g.max(axis=-1), g.min(axis=-1)
    mask = xp.abs(w_min) > xp.abs(w_max)
    scale = xp.maximum((w_max - w_min) / n_bins, f32(1e-7)).astype(f32)
    scale = xp.where(mask, scale, -scale)
    edge = xp.where(mask, w_min, w_max)
    q0 = xp.rint(edge / scale)
    nz = q0 != 0
    scale = xp.where(nz, edge / xp.where(nz, q0, f32(1)), scale).astype(f32)
    bias = xp.where(nz, edge, f32(0)).astype(f32)
    if bits == 1:  # MLX 0.32.4's 1 bit: the group's minimum and its range
        scale = xp.maximum(w_max - w_min, f32(1e-7)).astype(f32)
        bias = w_min.astype(f32)
    q = xp.clip(xp.rint((g - bias[:, None]) / scale[:, None]), f32(0), n_bins)
    wq = pack(xp, q.reshape(shape), bits)
    sshape = shape[:-1] + (shape[-1] // group_size,)
    return [wq, scale.reshape(sshape), bias.reshape(sshape)]


# -- the matmuls ------------------------------------------------------------------------------------
def _matmul(xp, x, w, transpose: bool):
    """x (..., M, K) @ w^T (w (..., N, K)) or x @ w (w (..., K, N)), in float32."""
    return xp.matmul(_f32(xp, x), xp.swapaxes(w, -1, -2) if transpose else w)


def _outer(w: tuple, transpose: bool, bits: int) -> int:
    """The product's last dimension: w's rows transposed, else its packed columns unpacked."""
    return w[-2] if transpose else w[-1] * 32 // bits


def _qmm_shape(shapes: list, *, transpose, bits, **_) -> list:
    """MLX's QuantizedMatmul::output_shapes: x's shape with w's outer size last."""
    x, w = tuple(shapes[0]), shapes[1]
    return [x[:-1] + (_outer(w, transpose, bits),)]


def _gather_qmm_shape(shapes: list, *, mode, transpose, bits, **_) -> list:
    """MLX's GatherQMM::output_shapes: the indices' shape, x's rows, w's outer size."""
    x, w = shapes[0], shapes[1]
    lhs = shapes[4] if mode == "affine" else shapes[3]
    return [tuple(lhs) + (x[-2], _outer(w, transpose, bits))]


@define("QuantizedMatmul", family=QUANTIZED, kernel="quantized_matmul", shape=_qmm_shape,
        out=True)
def quantized_matmul(xp, x, w, scales, *biases, group_size, bits, mode, transpose, out=None):
    """``x @ dequantize(w).T`` (or ``x @ dequantize(w)``), rounded to x's type once (``out``,
    the evaluator's buffer, unused: a backend's kernel writes into it)."""
    b = biases[0] if biases else None
    if x.ndim <= 2 < w.ndim:  # MLX's kernel reads w's first matrix for an unbatched x
        w, scales = w.reshape(-1, *w.shape[-2:])[0], scales.reshape(-1, *scales.shape[-2:])[0]
        b = None if b is None else b.reshape(-1, *b.shape[-2:])[0]
    wd = dequantized(xp, w, scales, b, group_size=group_size, bits=bits, mode=mode)
    return _matmul(xp, x, wd, transpose)


def _flat_batch(xp, a):
    return a.reshape(-1, *a.shape[-2:])


@define("GatherQMM", family=QUANTIZED, kernel="gather_qmm", shape=_gather_qmm_shape)
def gather_qmm(xp, x, w, scales, *rest, group_size, bits, mode, transpose, left_sorted,
               right_sorted):
    """Matrix ``lhs[i]`` of x (its batch flattened) times dequantized matrix ``rhs[i]`` of w,
    for each index of the (broadcast) index arrays ``lhs``, ``rhs``."""
    *b, lhs, rhs = rest
    wd = dequantized(xp, w, scales, b[0] if b else None, group_size=group_size, bits=bits,
                     mode=mode)
    xs = _flat_batch(xp, x)[lhs.reshape(-1).astype(xp.int64)]
    ws = _flat_batch(xp, wd)[rhs.reshape(-1).astype(xp.int64)]
    out = _matmul(xp, xs, ws, transpose)
    return out.reshape(*lhs.shape, *out.shape[-2:])


# -- qqmm: the input quantized on the fly -----------------------------------------------------------
def fp4_code(xp, v):
    """float32 -> e2m1 code (MLX's ``to_fp4_e2m1``: ties to the even code, nan to 0x7)."""
    a = xp.abs(v)
    bounds = ((5.0, False), (3.5, True), (2.5, False), (1.75, True), (1.25, False),
              (0.75, True), (0.25, False))
    code = xp.zeros(v.shape, dtype=xp.uint8)
    for i, (t, inclusive) in enumerate(bounds):  # the largest code whose bound holds
        hit = (a >= xp.float32(t)) if inclusive else (a > xp.float32(t))
        code = xp.where((code == 0) & hit, xp.uint8(7 - i), code)
    code = xp.where(xp.isnan(v), xp.uint8(7), code)
    return code | xp.where(xp.signbit(v), xp.uint8(8), xp.uint8(0))


def fp_quantize_dequantize(xp, a, *, group_size: int, bits: int, global_scale=None):
    """``a`` (..., K) rounded through fp quantization, as ``fp_quantize_dequantize`` of
    ``mlx/backend/cpu/quantized.cpp`` (with nvfp4's global scale folded into the scale, as
    ``fp_quantize`` in ``mlx/ops.cpp`` does)."""
    f32 = xp.float32
    g = _f32(xp, a).reshape(-1, group_size)
    scale = xp.abs(g).max(axis=-1) / f32(6.0 if bits == 4 else 448.0)
    if group_size == 16:
        enc = f32(1.0) if global_scale is None else f32(448.0 * 6.0) / _f32(xp, global_scale).reshape(())
        scale = fp8_decode(xp, fp8_encode(xp, scale * enc)) / enc
    else:
        with_log = xp.log2(xp.where(scale > 0, scale, f32(1)))
        n = xp.where(scale > 0, xp.round(with_log), f32(-127))
        # MLX 0.32.4 rounds the exponent up where 2^n falls below the scale (as its fp_quantize)
        n = xp.clip(xp.where(xp.ldexp(f32(1.0), n.astype(xp.int32)) < scale, n + 1, n), -127, 127)
        n = xp.where(xp.isfinite(scale), n, f32(128))
        scale = xp.ldexp(f32(1.0), n.astype(xp.int32)).astype(f32)
    scale = scale[:, None]
    v = xp.where(scale == 0, f32(0), g / xp.where(scale == 0, f32(1), scale))
    if bits == 8:
        v = fp8_decode(xp, fp8_encode(xp, v))
    else:
        v = xp.asarray(FP4_LUT, dtype=f32)[fp4_code(xp, v)]
    return (scale * v).reshape(a.shape)


def _qq_operands(xp, x, w, scales, globals_, group_size, bits, mode):
    gx, gw = globals_ if globals_ else (None, None)
    xq = fp_quantize_dequantize(xp, x, group_size=group_size, bits=bits, global_scale=gx)
    if w.dtype == xp.uint32:
        wd = dequantized(xp, w, scales, None, group_size=group_size, bits=bits, mode=mode)
        if gw is not None:
            wd = wd * (_f32(xp, gw).reshape(()) / xp.float32(448.0 * 6.0))
    else:
        wd = fp_quantize_dequantize(xp, w, group_size=group_size, bits=bits, global_scale=gw)
    return xq, wd


@define("QQMatmul", family=QUANTIZED)
def qqmm(xp, x, w, *rest, group_size, bits, mode):
    """``x`` quantized and dequantized on the fly, times ``w`` (dequantized, or quantized on
    the fly when it is a float matrix) transposed."""
    scales = rest[0] if len(rest) in (1, 3) else None
    globals_ = rest[-2:] if len(rest) >= 2 else None
    xq, wd = _qq_operands(xp, x, w, scales, globals_, group_size, bits, mode)
    return _matmul(xp, xq, wd, True)


@define("GatherQQMM", family=QUANTIZED)
def gather_qqmm(xp, x, w, lhs, rhs, *rest, group_size, bits, mode):
    """``qqmm`` of matrix ``lhs[i]`` of x with matrix ``rhs[i]`` of w per index."""
    scales = rest[0] if len(rest) in (1, 3) else None
    globals_ = rest[-2:] if len(rest) >= 2 else None
    xq, wd = _qq_operands(xp, x, w, scales, globals_, group_size, bits, mode)
    xs = _flat_batch(xp, xq)[lhs.reshape(-1).astype(xp.int64)]
    ws = _flat_batch(xp, wd)[rhs.reshape(-1).astype(xp.int64)]
    out = _matmul(xp, xs, ws, True)
    return out.reshape(*lhs.shape, *out.shape[-2:])
