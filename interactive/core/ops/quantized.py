"""Quantization: ``quantize`` / ``dequantize`` in MLX's four modes, ``quantized_matmul``,
``gather_qmm``, ``qqmm``, ``gather_qqmm`` and the e4m3 conversions ``to_fp8`` / ``from_fp8``.

What MLX 0.32.4 records on the CPU is recorded here: affine ``quantize`` is one ``Quantize``
node (``fast::Quantize``), affine ``dequantize`` and the fp modes ("mxfp4", "mxfp8", "nvfp4")
are MLX's compositions of ops (the ``fallback`` lambdas of ``affine_dequantize``,
``fp_quantize`` and ``fp_dequantize`` in ``mlx/ops.cpp``, with 0.32.4's rounding of the e8m0
exponent up when ``2^round(log2 s)`` falls below the scale), the matmuls are ``QuantizedMatmul``,
``GatherQMM``, ``QQMatmul`` and ``GatherQQMM`` nodes and the conversions ``ToFP8`` / ``FromFP8``.
Checks, their order and their messages are ``mlx/ops.cpp``'s (and 0.32.4's for gather_qmm's
per-expert global scale, which its CPU refuses). Known differences: ``qqmm`` computes every
shape (MLX's CPU raises "[QQMatmul] NYI for the general case" unless ``w`` is quantized and
``x`` has one row, and ignores nvfp4's global scales there; its GPU semantics are followed),
``gather_qqmm`` computes (MLX's CPU raises "[GatherQQMM] NYI"), and float64 inputs of
``to_fp8`` / ``from_fp8`` are converted correctly (MLX's CPU reads them as float32 data).
"""

from __future__ import annotations

from typing import Any, Optional

from .. import dtypes as _dt
from ..array import array
from ..device import BadArgs, StreamOrDevice, binding, resolve_stream
from ..primitive import Primitive
from .convert import _fmt_shape, _scalar

__all__ = ["quantize", "dequantize", "quantized_matmul", "gather_qmm", "qqmm", "gather_qqmm",
           "to_fp8", "from_fp8"]

_SIG_QUANTIZE = ("quantize(w: array, /, group_size: int | None = None, bits: int | None = None, "
                 "mode: str = 'affine', *, global_scale: array | None = None, "
                 "stream: StreamOrDevice = None) -> tuple[array, array, array]")
_SIG_DEQUANTIZE = ("dequantize(w: array, /, scales: array, biases: array | None = None, "
                   "group_size: int | None = None, bits: int | None = None, "
                   "mode: str = 'affine', global_scale: array | None = None, "
                   "dtype: Dtype | None = None, *, stream: StreamOrDevice = None) -> array")
_SIG_QMM = ("quantized_matmul(x: array, w: array, /, scales: array, biases: array | None = None, "
            "transpose: bool = True, group_size: int | None = None, bits: int | None = None, "
            "mode: str = 'affine', *, stream: StreamOrDevice = None) -> array")
_SIG_GQMM = ("gather_qmm(x: array, w: array, /, scales: array, biases: array | None = None, "
             "lhs_indices: array | None = None, rhs_indices: array | None = None, "
             "transpose: bool = True, group_size: int | None = None, bits: int | None = None, "
             "mode: str = 'affine', global_scale: array | None = None, *, "
             "sorted_indices: bool = False, stream: StreamOrDevice = None) -> array")
_SIG_QQMM = ("qqmm(x: array, w: array, scales: array | None = None, group_size: int | None = None, "
             "bits: int | None = None, mode: str = 'nvfp4', global_scale_x: array | None = None, "
             "global_scale_w: array | None = None, *, stream: StreamOrDevice = None) -> array")
_SIG_GQQMM = ("gather_qqmm(x: array, w: array, /, scales: array | None = None, "
              "lhs_indices: array | None = None, rhs_indices: array | None = None, "
              "group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', "
              "global_scale_x: array | None = None, global_scale_w: array | None = None, *, "
              "sorted_indices: bool = False, stream: StreamOrDevice = None) -> array")
_SIG_TO_FP8 = "to_fp8(x: array, *, stream: StreamOrDevice = None) -> array"
_SIG_FROM_FP8 = ("from_fp8(x: array, dtype: Dtype = bfloat16, *, "
                 "stream: StreamOrDevice = None) -> array")

MODES = ("affine", "mxfp4", "mxfp8", "nvfp4")
# mode -> (default group size, default bits): quantization_params_from_mode in mlx/ops.cpp
_DEFAULTS = {"affine": (64, 4), "nvfp4": (16, 4), "mxfp4": (32, 4), "mxfp8": (32, 8)}
FP4_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
           -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _M():
    """The ops namespace (imported when first called: this module is part of it)."""
    from .. import ops

    return ops


# -- argument checks (nanobind's types first, then MLX's values) ----------------------------
def _arr(v: Any, optional: bool = False) -> None:
    if not (isinstance(v, array) or (optional and v is None)):
        raise BadArgs()


def _opt_int(v: Any) -> None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
        raise BadArgs()


def _str(v: Any) -> None:
    if not isinstance(v, str):
        raise BadArgs()


def _bool(v: Any) -> None:
    if not isinstance(v, bool):
        raise BadArgs()


def _mode(mode: str, tag: str) -> str:
    """MLX's ``string_to_quantization_mode``."""
    if mode not in MODES:
        raise ValueError(f"[{tag}] Invalid quantization mode '{mode}'.")
    return mode


def _params(mode: str, group_size: Optional[int], bits: Optional[int]) -> tuple:
    gs, b = _DEFAULTS[mode]
    return (gs if group_size is None else group_size), (b if bits is None else bits)


def _mode_with_type(tag: str, scales: array, biases: Optional[array], out_type, mode: str):
    """MLX's ``validate_mode_with_type``: (output dtype, mode)."""
    _mode(mode, tag)
    if out_type is not None and not _dt.is_floating(out_type):
        raise ValueError(f"[{tag}] Only real floating types are supported but "
                         f"output dtype == {out_type.name}.")
    if mode == "affine":
        if biases is None:
            raise ValueError(f"[{tag}] Biases must be provided for affine quantization.")
        dtype = _dt.promote_types(scales.dtype, biases.dtype)
        if not _dt.is_floating(dtype):
            raise ValueError(f"[{tag}] Only real floating types are supported but "
                             f"scales.dtype() == {scales.dtype.name} and biases.dtype() == "
                             f"{biases.dtype.name}.")
        return (out_type if out_type is not None else dtype), mode
    if scales.dtype != _dt.uint8:
        raise ValueError(f"[{tag}] Scale type must be uint8 but received type "
                         f"{scales.dtype.name}.")
    if biases is not None:
        raise ValueError(f"[{tag}] Biases must be null for quantization mode '{mode}'.")
    return (out_type if out_type is not None else _dt.bfloat16), mode


def _global_scale(tag: str, mode: str, g: Optional[array]) -> None:
    """MLX's ``validate_global_scale``."""
    if g is None:
        return
    if mode != "nvfp4":
        raise ValueError(f"[{tag}] Global scale is only supported for 'nvfp4' quantization mode.")
    if g.size != 1:
        raise ValueError(f"[{tag}] Global scale must be a scalar but got shape "
                         f"{_fmt_shape(g.shape)}.")
    if g.dtype != _dt.float32:
        raise ValueError(f"[{tag}] Global scale must have dtype float32 but got "
                         f"{g.dtype.name}.")


def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncating toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _validate_input(tag: str, w: array, scales: array, group_size: int, bits: int,
                    biases: Optional[array] = None) -> None:
    """MLX's ``validate_quantized_input``."""
    if w.dtype != _dt.uint32:
        raise ValueError(f"[{tag}] The weight matrix should be uint32 but received "
                         f"{w.dtype.name}")
    if biases is not None and scales.shape != biases.shape:
        raise ValueError(f"[{tag}] Scales and biases should have the same shape. Received "
                         f"scales with shape {_fmt_shape(scales.shape)} and biases with "
                         f"{_fmt_shape(biases.shape)}")
    if tuple(w.shape[:-2]) != tuple(scales.shape[:max(w.ndim - 2, 0)]):
        raise ValueError(f"[{tag}] Weight and scales should have the same batch shape. "
                         f"Received weight with shape {_fmt_shape(w.shape)}, scales with "
                         f"{_fmt_shape(scales.shape)}.")
    if _cdiv(w.shape[-1] * 32, bits) != scales.shape[-1] * group_size:
        raise ValueError(f"[{tag}] The shapes of the weight and scales are incompatible based "
                         f"on bits and group_size. w.shape() == {_fmt_shape(w.shape)} and "
                         f"scales.shape() == {_fmt_shape(scales.shape)} with "
                         f"group_size={group_size} and bits={bits}")


def _matmul_dims(tag: str, x: array, w: array, scales: array, biases: Optional[array],
                 transpose: bool, group_size: int, bits: int) -> tuple:
    """MLX's ``extract_quantized_matmul_dims``: (inner, outer) of the expanded matrix."""
    _validate_input(tag, w, scales, group_size, bits, biases)
    inner = _cdiv(w.shape[-1] * 32, bits) if transpose else w.shape[-2]
    outer = w.shape[-2] if transpose else _cdiv(w.shape[-1] * 32, bits)
    if inner != x.shape[-1]:
        raise ValueError(f"[{tag}] Last dimension of first input with shape (..., "
                         f"{x.shape[-1]}) does not match the expanded quantized matrix "
                         f"({inner}, {outer}) computed from shape {_fmt_shape(w.shape)} with "
                         f"group_size={group_size}, bits={bits} and "
                         f"transpose={'true' if transpose else 'false'}")
    return inner, outer


def _const(v, dtype) -> array:
    """``array(v, dtype)``: a 0-d constant (an int of an integer type it fits, the shifts'
    and masks' common case, made directly: the constructor's value dispatch left out)."""
    if type(v) is int and dtype.kind in "ui" and 0 <= v < (1 << (8 * dtype.size - 1)):
        return _scalar(v, dtype)
    return array(v, dtype)


# -- quantize ------------------------------------------------------------------------------
@binding(_SIG_QUANTIZE)
def quantize(w: array, /, group_size: Optional[int] = None, bits: Optional[int] = None,
             mode: str = "affine", *, global_scale: Optional[array] = None,
             stream: StreamOrDevice = None):
    """Quantize ``w`` per ``group_size`` elements of its rows: (packed uint32 weights,
    scales, biases) in "affine" mode, (weights, uint8 scales) in the fp modes."""
    _arr(w)
    _opt_int(group_size)
    _opt_int(bits)
    _str(mode)
    _arr(global_scale, optional=True)
    s = resolve_stream(stream)
    _mode(mode, "quantize")
    group_size, bits = _params(mode, group_size, bits)
    if not _dt.is_floating(w.dtype):
        raise ValueError(f"[quantize] Only real floating types can be quantized but w has "
                         f"type {w.dtype.name}.")
    if w.ndim < 2:
        raise ValueError(f"[quantize] The matrix to be quantized must have at least 2 "
                         f"dimension but it has only {w.ndim}.")
    if w.shape[-1] % group_size != 0:
        raise ValueError(f"[quantize] The last dimension of the matrix needs to be divisible "
                         f"by the quantization group size {group_size}. However the provided  "
                         f"matrix has shape {_fmt_shape(w.shape)}")
    _global_scale("quantize", mode, global_scale)
    if mode == "affine":  # a list, as MLX's binding returns it
        return _affine_quantize(w, group_size, bits, s)
    return _fp_quantize(w, group_size, bits, mode, global_scale, s)


def _affine_quantize(w: array, group_size: int, bits: int, s) -> list:
    if group_size not in (32, 64, 128):
        raise ValueError(f"[quantize] The requested group size {group_size} is not supported. "
                         "The supported group sizes are 32, 64, and 128.")
    if bits < 1 or bits > 8 or bits == 7:  # MLX 0.32.4 added 1 bit
        raise ValueError(f"[quantize] The requested number of bits {bits} is not supported. "
                         "The supported bits are 1, 2, 3, 4, 5, 6 and 8.")
    wq_shape = w.shape[:-1] + (w.shape[-1] * bits // 32,)
    s_shape = w.shape[:-1] + (w.shape[-1] // group_size,)
    prim = Primitive("Quantize", s, group_size=group_size, bits=bits, mode="affine")
    return array._make([wq_shape, s_shape, s_shape], [_dt.uint32, w.dtype, w.dtype], prim, [w])


def affine_quantize_composed(w: array, group_size: int, bits: int, s) -> list:
    """The fallback of ``affine_quantize`` (``mlx/ops.cpp``) as ops: what ``Quantize``'s
    gradient and batching go through, as MLX's Custom primitive does."""
    M = _M()
    wshape = list(w.shape[:-1]) + [-1]
    f32 = _dt.float32
    zero, n_bins, eps = _const(0, f32), _const((1 << bits) - 1, f32), _const(1e-7, f32)
    packed = M.reshape(w, (-1, w.shape[-1] // group_size, group_size), stream=s)
    w_max = M.astype(M.max(packed, axis=-1, keepdims=True, stream=s), f32, stream=s)
    w_min = M.astype(M.min(packed, axis=-1, keepdims=True, stream=s), f32, stream=s)
    mask = M.greater(M.abs(w_min, stream=s), M.abs(w_max, stream=s), stream=s)
    scales = M.maximum(M.divide(M.subtract(w_max, w_min, stream=s), n_bins, stream=s), eps,
                       stream=s)
    scales = M.where(mask, scales, M.negative(scales, stream=s), stream=s)
    edge = M.where(mask, w_min, w_max, stream=s)
    q0 = M.round(M.divide(edge, scales, stream=s), stream=s)
    scales = M.where(M.not_equal(q0, zero, stream=s), M.divide(edge, q0, stream=s), scales,
                     stream=s)
    biases = M.where(M.equal(q0, zero, stream=s), zero, edge, stream=s)
    if bits == 1:  # MLX 0.32.4's 1 bit: the minimum and the range
        scales = M.maximum(M.subtract(w_max, w_min, stream=s), eps, stream=s)
        biases = w_min
    q = M.clip(M.round(M.divide(M.subtract(packed, biases, stream=s), scales, stream=s),
                       stream=s), zero, n_bins, stream=s)
    q = M.astype(q, _dt.uint32, stream=s)
    if 32 % bits == 0:  # pack_and_quantize: whole codes per word
        q = M.reshape(q, (q.shape[0], -1, 32 // bits), stream=s)
        shifts = M.power(_const(2, _dt.uint32), M.arange(0, 32, bits, dtype=_dt.uint32, stream=s),
                         stream=s)
        q = M.sum(M.multiply(q, shifts, stream=s), axis=2, stream=s)
    else:  # one bit at a time
        q = M.expand_dims(q, -1, stream=s)
        q = M.bitwise_and(M.right_shift(q, M.arange(bits, dtype=_dt.uint32, stream=s), stream=s),
                          array([1], _dt.uint32), stream=s)
        shape = list(q.shape)
        q = M.reshape(q, shape[:-2] + [-1, 32], stream=s)
        q = M.sum(M.left_shift(q, M.arange(32, dtype=_dt.uint32, stream=s), stream=s), axis=-1,
                  stream=s)
    return [M.reshape(q, wshape, stream=s),
            M.reshape(M.astype(scales, w.dtype, stream=s), wshape, stream=s),
            M.reshape(M.astype(biases, w.dtype, stream=s), wshape, stream=s)]


def _fp_check(tag: str, mode: str, group_size: int, bits: int) -> None:
    expected_gs = 16 if mode == "nvfp4" else 32
    expected_bits = 8 if mode == "mxfp8" else 4
    if group_size != expected_gs:
        raise ValueError(f"[{tag}] {mode} quantization requires group size {expected_gs} but "
                         f"got {group_size}.")
    if bits != expected_bits:
        raise ValueError(f"[{tag}] {mode} quantization requires bits to be {expected_bits} but "
                         f"got {bits}.")


def _fp_quantize(w: array, group_size: int, bits: int, mode: str,
                 global_scale: Optional[array], s) -> list:
    """The fallback of ``fp_quantize`` (``mlx/ops.cpp``) as MLX 0.32.4 composes it."""
    _fp_check("quantize", mode, group_size, bits)
    M = _M()
    maxval = 6.0 if bits == 4 else 448.0
    new_shape = tuple(w.shape[:-1]) + (-1,)
    wq = M.reshape(w, (-1, group_size), stream=s)
    scales = M.divide(M.max(M.abs(wq, stream=s), axis=-1, keepdims=True, stream=s),
                      _const(maxval, w.dtype), stream=s)
    if group_size == 16:  # e4m3 scales, nvfp4's global scale folded in
        enc = (M.divide(_const(448.0 * 6.0, _dt.float32), global_scale, stream=s)
               if global_scale is not None else _const(1.0, _dt.float32))
        scales = to_fp8(M.multiply(scales, enc, stream=s), stream=s)
        wq = M.multiply(M.divide(wq, from_fp8(scales, w.dtype, stream=s), stream=s), enc,
                        stream=s)
    else:  # e8m0 scales: 2^e with e the smallest power not below the scale near log2
        zero = _const(0, scales.dtype)
        e = M.astype(M.round(M.log2(scales, stream=s), stream=s), _dt.int32, stream=s)
        below = M.less(M.power(_const(2.0, w.dtype), M.astype(e, w.dtype, stream=s), stream=s),
                       scales, stream=s)
        e = M.where(below, M.add(e, _const(1, _dt.int32), stream=s), e, stream=s)
        scales = M.where(M.equal(scales, zero, stream=s), zero,
                         M.astype(e, scales.dtype, stream=s), stream=s)
        wq = M.divide(wq, M.power(_const(2.0, w.dtype), scales, stream=s), stream=s)
        scales = M.astype(M.add(scales, _const(127, _dt.int32), stream=s), _dt.uint8, stream=s)
    if bits == 4:
        lut = M.astype(array(list(FP4_LUT), _dt.float32), w.dtype, stream=s)
        wq = M.argmin(M.abs(M.subtract(M.expand_dims(wq, -1, stream=s), lut, stream=s),
                            stream=s), axis=-1, keepdims=False, stream=s)
        shifts = M.power(_const(2, _dt.uint32), M.arange(0, 32, 4, dtype=_dt.uint32, stream=s),
                         stream=s)
        wq = M.reshape(wq, (-1, 4, 8), stream=s)
        wq = M.sum(M.multiply(wq, shifts, stream=s), axis=-1, keepdims=False, stream=s)
    else:
        wq = M.view(to_fp8(wq, stream=s), _dt.uint32, stream=s)
    return [M.reshape(wq, new_shape, stream=s), M.reshape(scales, new_shape, stream=s)]


# -- dequantize ------------------------------------------------------------------------------
@binding(_SIG_DEQUANTIZE)
def dequantize(w: array, /, scales: array, biases: Optional[array] = None,
               group_size: Optional[int] = None, bits: Optional[int] = None,
               mode: str = "affine", global_scale: Optional[array] = None,
               dtype: Optional[_dt.Dtype] = None, *, stream: StreamOrDevice = None) -> array:
    """The matrix that quantized ``w`` with its ``scales`` (and ``biases``) stands for."""
    _arr(w)
    _arr(scales)
    _arr(biases, optional=True)
    _opt_int(group_size)
    _opt_int(bits)
    _str(mode)
    _arr(global_scale, optional=True)
    if dtype is not None and not isinstance(dtype, _dt.Dtype):
        raise BadArgs()
    s = resolve_stream(stream)
    out_type, mode = _mode_with_type("dequantize", scales, biases, dtype, mode)
    group_size, bits = _params(mode, group_size, bits)
    if bits <= 0:
        raise ValueError(f"[dequantize] Invalid value for bits: {bits}")
    if group_size <= 0:
        raise ValueError(f"[dequantize] Invalid value for group_size: {group_size}")
    if w.dtype != _dt.uint32:
        raise ValueError("[dequantize] The matrix should be given as a uint32")
    if w.ndim < 2:
        raise ValueError(f"[dequantize] The matrix to be dequantized must have at least 2 "
                         f"dimension but it has only {w.ndim}.")
    _global_scale("dequantize", mode, global_scale)
    if mode == "affine":
        out = affine_dequantize(w, scales, biases, group_size, bits, s)
        return _M().astype(out, out_type, stream=s)
    return _fp_dequantize(w, scales, group_size, bits, out_type, mode, global_scale, s)


def affine_dequantize(w: array, scales: array, biases: array, group_size: int, bits: int,
                      s) -> array:
    """The fallback of ``affine_dequantize`` (``mlx/ops.cpp``): codes by shifts, times the
    scale plus the bias (in the promoted type of uint32 and the scales)."""
    M = _M()
    wshape, sshape, bshape = list(w.shape), list(scales.shape), list(biases.shape)
    if len(wshape) != len(sshape) or len(wshape) != len(bshape):
        raise ValueError("[dequantize] Shape of scales and biases does not match the matrix")
    wshape[-1] = sshape[-1] = bshape[-1] = -1
    if wshape != sshape or wshape != bshape:
        raise ValueError("[dequantize] Shape of scales and biases does not match the matrix")
    out_size = _cdiv(w.shape[-1] * 32, bits)
    if out_size != scales.shape[-1] * group_size:
        raise ValueError(f"[dequantize] Shape of scales and biases does not match the matrix "
                         f"given the quantization parameters. Provided matrix of shape "
                         f"{_fmt_shape(w.shape)} and scales/biases of shape "
                         f"{_fmt_shape(scales.shape)} with group_size={group_size} and "
                         f"bits={bits}.")
    u32 = _dt.uint32
    if 32 % bits == 0:
        parts = []
        for start in range(0, 32, bits):
            part = M.right_shift(M.left_shift(w, _const(32 - (start + bits), u32), stream=s),
                                 _const(32 - bits, u32), stream=s)
            parts.append(M.expand_dims(part, -1, stream=s))
        w = M.concatenate(parts, -1, stream=s)
    else:
        w = M.expand_dims(w, -1, stream=s)
        w = M.bitwise_and(M.right_shift(w, M.arange(32, dtype=u32, stream=s), stream=s),
                          array([1], u32), stream=s)
        shape = list(w.shape)
        shape[-2:] = [-1, bits]
        w = M.reshape(w, shape, stream=s)
        w = M.sum(M.left_shift(w, M.arange(bits, dtype=u32, stream=s), stream=s), axis=-1,
                  keepdims=False, stream=s)
    w = M.reshape(w, wshape + [group_size], stream=s)
    w = M.multiply(w, M.expand_dims(scales, -1, stream=s), stream=s)
    w = M.add(w, M.expand_dims(biases, -1, stream=s), stream=s)
    return M.reshape(w, sshape, stream=s)


def _fp_dequantize(w: array, scales: array, group_size: int, bits: int, out_type, mode: str,
                   global_scale: Optional[array], s) -> array:
    """The fallback of ``fp_dequantize`` (``mlx/ops.cpp``)."""
    _fp_check("dequantize", mode, group_size, bits)
    wshape, sshape = list(w.shape), list(scales.shape)
    if len(wshape) != len(sshape):
        raise ValueError("[dequantize] Shape of scales does not match the matrix")
    wshape[-1] = sshape[-1] = -1
    if wshape != sshape:
        raise ValueError("[dequantize] Shape of scales does not match the matrix")
    if _cdiv(w.shape[-1] * 32, bits) != scales.shape[-1] * group_size:
        raise ValueError(f"[dequantize] Shape of scales does not match the matrix given the "
                         f"quantization parameters. Provided matrix of shape "
                         f"{_fmt_shape(w.shape)} and scales of shape "
                         f"{_fmt_shape(scales.shape)}.")
    M = _M()
    if bits == 4:
        lut = M.astype(array(list(FP4_LUT), _dt.float32), out_type, stream=s)
        out = M.view(M.reshape(w, (-1, 4), stream=s), _dt.int8, stream=s)
        lo = M.take(lut, M.bitwise_and(out, _const(0x0F, _dt.int8), stream=s), stream=s)
        hi = M.take(lut, M.right_shift(out, _const(4, _dt.int8), stream=s), stream=s)
        out = M.concatenate([M.expand_dims(lo, -1, stream=s), M.expand_dims(hi, -1, stream=s)],
                            -1, stream=s)
    else:
        out = from_fp8(M.view(w, _dt.uint8, stream=s), out_type, stream=s)
    out = M.reshape(out, (-1, group_size), stream=s)
    sc = M.reshape(scales, (-1, 1), stream=s)
    if group_size == 16:
        inv = (M.divide(global_scale, _const(448.0 * 6.0, out_type), stream=s)
               if global_scale is not None else _const(1.0, out_type))
        sc = M.multiply(from_fp8(sc, out_type, stream=s), inv, stream=s)
    else:
        sc = M.subtract(M.astype(sc, out_type, stream=s), _const(127, out_type), stream=s)
        sc = M.power(_const(2.0, out_type), sc, stream=s)
    return M.reshape(M.multiply(out, sc, stream=s), wshape, stream=s)


# -- the matmuls ---------------------------------------------------------------------------------
@binding(_SIG_QMM)
def quantized_matmul(x: array, w: array, /, scales: array, biases: Optional[array] = None,
                     transpose: bool = True, group_size: Optional[int] = None,
                     bits: Optional[int] = None, mode: str = "affine", *,
                     stream: StreamOrDevice = None) -> array:
    """``x @ dequantize(w).T`` (``transpose``) or ``x @ dequantize(w)``, one QuantizedMatmul."""
    for v in (x, w, scales):
        _arr(v)
    _arr(biases, optional=True)
    _bool(transpose)
    _opt_int(group_size)
    _opt_int(bits)
    _str(mode)
    s = resolve_stream(stream)
    return _quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode, s)


def _quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode, s) -> array:
    M = _M()
    dtype, mode = _mode_with_type("quantized_matmul", scales, biases, None, mode)
    group_size, bits = _params(mode, group_size, bits)
    _, outer = _matmul_dims("quantized_matmul", x, w, scales, biases, transpose, group_size,
                            bits)
    dtype = _dt.promote_types(x.dtype, dtype) if mode == "affine" else x.dtype
    if not _dt.is_floating(dtype):
        raise ValueError(f"[quantized_matmul] Only real floating types are supported but "
                         f"x.dtype() == {x.dtype.name}.")
    if mode == "affine":
        inputs = [M.astype(x, dtype, stream=s), w, M.astype(scales, dtype, stream=s),
                  M.astype(biases, dtype, stream=s)]
    else:
        inputs = [x, w, scales]
    if x.ndim > 2 and w.ndim > 2:
        inputs = _batch_broadcast(inputs, s)
    out_shape = tuple(inputs[0].shape[:-1]) + (outer,)
    prim = Primitive("QuantizedMatmul", s, group_size=group_size, bits=bits, mode=mode,
                     transpose=transpose)
    return array._make1(out_shape, dtype, prim, inputs)


def _batch_broadcast(inputs: list, s) -> list:
    """MLX's ``broadcast_arrays(inputs, {-2, -1})``: the batch shapes broadcast, the last two
    axes kept."""
    M = _M()
    batch = M.broadcast_shapes(*[tuple(a.shape[:-2]) for a in inputs])
    return [a if tuple(a.shape[:-2]) == batch else
            M.broadcast_to(a, batch + tuple(a.shape[-2:]), stream=s) for a in inputs]


def _indices_or_default(tag: str, idx: Optional[array], x: array, s) -> array:
    """MLX's ``indices_or_default``: the given integer indices, or every matrix of the batch."""
    M = _M()
    if idx is not None:
        if not _dt.is_integer(idx.dtype):
            raise ValueError(f"{tag} Got indices with invalid dtype. Indices must be integral.")
        return idx
    shape = tuple(x.shape[:-2])
    total = 1
    for n in shape:
        total *= n
    return M.reshape(M.arange(total, dtype=_dt.uint32, stream=s), shape, stream=s)


@binding(_SIG_GQMM)
def gather_qmm(x: array, w: array, /, scales: array, biases: Optional[array] = None,
               lhs_indices: Optional[array] = None, rhs_indices: Optional[array] = None,
               transpose: bool = True, group_size: Optional[int] = None,
               bits: Optional[int] = None, mode: str = "affine",
               global_scale: Optional[array] = None, *, sorted_indices: bool = False,
               stream: StreamOrDevice = None) -> array:
    """Quantized matmul with matrix-level gather: matrix ``lhs_indices[i]`` of x times matrix
    ``rhs_indices[i]`` of w (the batch axes flattened)."""
    for v in (x, w, scales):
        _arr(v)
    for v in (biases, lhs_indices, rhs_indices, global_scale):
        _arr(v, optional=True)
    _bool(transpose)
    _opt_int(group_size)
    _opt_int(bits)
    _str(mode)
    _bool(sorted_indices)
    s = resolve_stream(stream)
    M = _M()
    if lhs_indices is None and rhs_indices is None:
        if global_scale is not None:
            raise ValueError("[gather_qmm] Global scale is not supported without indices.")
        return _quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode, s)
    out_type, mode = _mode_with_type("gather_qmm", scales, biases, None, mode)
    group_size, bits = _params(mode, group_size, bits)
    _, outer = _matmul_dims("gather_qmm", x, w, scales, biases, transpose, group_size, bits)
    if global_scale is not None:
        # MLX 0.32.4: one float32 scale per expert (w's batch shape), on the GPU only
        if mode != "nvfp4":
            raise ValueError("[gather_qmm] Global scale is only supported for 'nvfp4' "
                             "quantization mode.")
        if global_scale.dtype != _dt.float32:
            raise ValueError(f"[gather_qmm] Global scale must have dtype float32 but got "
                             f"{global_scale.dtype.name}.")
        if tuple(global_scale.shape) != tuple(w.shape[:-2]):
            raise ValueError(f"[gather_qmm] Global scale must have one entry per expert with "
                             f"shape {_fmt_shape(w.shape[:-2])} but got "
                             f"{_fmt_shape(global_scale.shape)}.")
        raise ValueError("[gather_qmm] Global scale is only supported on the GPU.")
    out_type = _dt.promote_types(x.dtype, out_type) if mode == "affine" else x.dtype
    if not _dt.is_floating(out_type):
        raise ValueError(f"[gather_qmm] Only real floating types are supported but "
                         f"x.dtype() == {x.dtype.name}.")
    lhs = _indices_or_default("[gather_qmm]", lhs_indices, x, s)
    rhs = _indices_or_default("[gather_qmm]", rhs_indices, w, s)
    lhs, rhs = M.broadcast_arrays(lhs, rhs, stream=s)
    out_shape = tuple(lhs.shape) + (x.shape[-2], outer)
    if mode == "affine":
        inputs = [M.astype(x, out_type, stream=s), w, M.astype(scales, out_type, stream=s),
                  M.astype(biases, out_type, stream=s), lhs, rhs]
    else:
        inputs = [M.astype(x, out_type, stream=s), w, scales, lhs, rhs]
    prim = Primitive("GatherQMM", s, group_size=group_size, bits=bits, mode=mode,
                     transpose=transpose, left_sorted=sorted_indices and rhs_indices is None,
                     right_sorted=sorted_indices and lhs_indices is None)
    return array._make1(out_shape, out_type, prim, inputs)


# -- qqmm ------------------------------------------------------------------------------------------
def _qq_checks(x: array, w: array, scales: Optional[array], group_size: int, bits: int,
               gx: Optional[array], gw: Optional[array], mode: str) -> None:
    """MLX's ``validate_qqmm_inputs``."""
    if x.ndim > 2 or w.ndim > 2:
        raise ValueError(f"[qqmm] Only 2D inputs are supported but x.ndim() == {x.ndim} and "
                         f"w.ndim() == {w.ndim}.")
    if w.dtype == _dt.uint32:
        if scales is None:
            raise ValueError("[qqmm] Scales must be provided if second argument is quantized.")
        _validate_input("qqmm", w, scales, group_size, bits)
    elif not _dt.is_floating(w.dtype) or w.dtype == _dt.float64:
        raise ValueError(f"[qqmm] Only real floating types except float64 are supported but "
                         f"second argument dtype == {w.dtype.name}.")
    if not _dt.is_floating(x.dtype) or x.dtype == _dt.float64:
        raise ValueError(f"[qqmm] Only real floating types except float64 are supported but "
                         f"first argument dtype == {x.dtype.name}.")
    _global_scale("qqmm", mode, gx)
    _global_scale("qqmm", mode, gw)
    if mode == "nvfp4" and (gx is None) != (gw is None):
        raise ValueError("[qqmm] For nvfp4 mode, either both global_scale_x and "
                         "global_scale_w must be provided, or neither.")


def _qq_dims(x: array, w: array, scales: Optional[array], group_size: int, bits: int) -> tuple:
    """MLX's ``extract_qqmm_dims``."""
    if w.dtype != _dt.uint32:
        if x.shape[-1] != w.shape[-1]:
            raise ValueError(f"[qqmm] Last dimension of first input with shape "
                             f"{_fmt_shape(x.shape)} must match last dimension of second input "
                             f"with shape {_fmt_shape(w.shape)}.")
        return w.shape[-1], w.shape[-2]
    return _matmul_dims("qqmm", x, w, scales, None, True, group_size, bits)


def _qq_inputs(x, w, scales, gx, gw) -> list:
    inputs = [x, w] + ([scales] if scales is not None else [])
    return inputs + ([gx, gw] if gx is not None and gw is not None else [])


@binding(_SIG_QQMM)
def qqmm(x: array, w: array, scales: Optional[array] = None, group_size: Optional[int] = None,
         bits: Optional[int] = None, mode: str = "nvfp4", global_scale_x: Optional[array] = None,
         global_scale_w: Optional[array] = None, *, stream: StreamOrDevice = None) -> array:
    """``x`` quantized on the fly times ``w`` transposed (quantized already, or on the fly)."""
    _arr(x)
    _arr(w)
    for v in (scales, global_scale_x, global_scale_w):
        _arr(v, optional=True)
    _opt_int(group_size)
    _opt_int(bits)
    _str(mode)
    s = resolve_stream(stream)
    M = _M()
    _mode(mode, "qqmm")
    group_size, bits = _params(mode, group_size, bits)
    xin = x
    if x.ndim == 1:
        x = M.expand_dims(x, 0, stream=s)
    elif w.ndim == 2 and x.ndim > 2:
        x = M.flatten(x, 0, -2, stream=s)
    _qq_checks(x, w, scales, group_size, bits, global_scale_x, global_scale_w, mode)
    _, outer = _qq_dims(x, w, scales, group_size, bits)
    prim = Primitive("QQMatmul", s, group_size=group_size, bits=bits, mode=mode)
    out = array._make1(tuple(x.shape[:-1]) + (outer,), x.dtype, prim,
                       _qq_inputs(x, w, scales, global_scale_x, global_scale_w))
    if xin.ndim > 2:
        out = M.unflatten(out, 0, tuple(xin.shape[:-1]), stream=s)
    elif xin.ndim == 1:
        out = M.squeeze(out, 0, stream=s)
    return out


@binding(_SIG_GQQMM)
def gather_qqmm(x: array, w: array, /, scales: Optional[array] = None,
                lhs_indices: Optional[array] = None, rhs_indices: Optional[array] = None,
                group_size: Optional[int] = None, bits: Optional[int] = None,
                mode: str = "nvfp4", global_scale_x: Optional[array] = None,
                global_scale_w: Optional[array] = None, *, sorted_indices: bool = False,
                stream: StreamOrDevice = None) -> array:
    """``qqmm`` with matrix-level gather (as ``gather_qmm``)."""
    _arr(x)
    _arr(w)
    for v in (scales, lhs_indices, rhs_indices, global_scale_x, global_scale_w):
        _arr(v, optional=True)
    _opt_int(group_size)
    _opt_int(bits)
    _str(mode)
    _bool(sorted_indices)
    s = resolve_stream(stream)
    M = _M()
    _mode(mode, "gather_qqmm")
    group_size, bits = _params(mode, group_size, bits)
    lhs = _indices_or_default("[gather_qqmm]", lhs_indices, x, s)
    rhs = _indices_or_default("[gather_qqmm]", rhs_indices, w, s)
    lhs, rhs = M.broadcast_arrays(lhs, rhs, stream=s)
    _, outer = _qq_dims(x, w, scales, group_size, bits)
    inputs = [x, w, lhs, rhs] + _qq_inputs(x, w, scales, global_scale_x, global_scale_w)[2:]
    prim = Primitive("GatherQQMM", s, group_size=group_size, bits=bits, mode=mode)
    return array._make1(tuple(lhs.shape) + (x.shape[-2], outer), x.dtype, prim, inputs)


# -- e4m3 -----------------------------------------------------------------------------------------
@binding(_SIG_TO_FP8)
def to_fp8(x: array, *, stream: StreamOrDevice = None) -> array:
    """Convert to fp8 (e4m3), returned as uint8 bytes."""
    _arr(x)
    s = resolve_stream(stream)
    if not _dt.is_floating(x.dtype):
        raise ValueError(f"[to_fp8] Only real floating types are supported but "
                         f"x.dtype() == {x.dtype.name}.")
    return array._make1(tuple(x.shape), _dt.uint8, Primitive("ToFP8", s), [x])


@binding(_SIG_FROM_FP8)
def from_fp8(x: array, dtype: _dt.Dtype = _dt.bfloat16, *, stream: StreamOrDevice = None) -> array:
    """Convert fp8 (e4m3) bytes (uint8) to ``dtype``."""
    _arr(x)
    if not isinstance(dtype, _dt.Dtype):
        raise BadArgs()
    s = resolve_stream(stream)
    if x.dtype != _dt.uint8:
        raise ValueError(f"[from_fp8] Input must have type uint8 but x.dtype() == "
                         f"{x.dtype.name}.")
    if not _dt.is_floating(dtype):
        raise ValueError(f"[from_fp8] Only real floating types are supported but "
                         f"dtype == {dtype.name}.")
    return array._make1(tuple(x.shape), dtype, Primitive("FromFP8", s, dtype=dtype.name), [x])
