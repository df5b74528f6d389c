"""GGUF's quantized tensor types as MLX reads them: Q4_0, Q4_1 and Q8_0 unpacked into MLX's
affine quantized form (``weight`` uint32, ``scales`` / ``biases`` float16, groups of 32;
mlx/io/gguf_quants.cpp), Q2_K, Q4_K, Q6_K and BF16 dequantized to float16 (mlx/io/gguf.cpp
through gguflib's ``gguf_tensor_to_f16``: float32 math, rounded to nearest even); every
other type is refused with MLX's error. The block sizes are gguflib's (gguf-tools 8fa6eb6,
the commit MLX builds), which MLX checks the tensor's bytes against."""

from __future__ import annotations

import numpy as np

# GGML tensor type -> (weights per block, bytes per block), gguflib's table; 4 and 5 are
# removed types (gguflib divides by their zero block). Q2_K's is ggml's 84: gguflib's table
# says 82 but its dequantizer steps 84 bytes a block (MLX's check lets it read past the file)
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
          8: (32, 34), 9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144),
          13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
          18: (256, 98), 19: (256, 110), 20: (256, 50), 21: (256, 110), 22: (256, 82),
          23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
          29: (256, 56), 30: (1, 2)}
Q4_0, Q4_1, Q8_0, Q2_K, Q4_K, Q6_K, BF16 = 2, 3, 8, 10, 12, 14, 30
AFFINE = (Q4_0, Q4_1, Q8_0)
_F16 = np.float16


def nbytes(t: int, n: int) -> int:
    """The bytes ``n`` weights of type ``t`` take (whole blocks, as gguflib's ``bsize``)."""
    per, size = BLOCKS[t]
    return -(-n // per) * size


def _blocks(data: bytes, start: int, t: int, n: int) -> np.ndarray:
    per, size = BLOCKS[t]
    count = -(-n // per)
    return np.frombuffer(data, np.uint8, count * size, start).reshape(count, size)


def affine(data: bytes, start: int, t: int, shape: tuple) -> tuple:
    """(weight, scales, biases) host arrays of a Q4_0 / Q4_1 / Q8_0 tensor of ``shape``
    (its last dimension a multiple of 32, checked by the caller)."""
    n = int(np.prod(shape, dtype=np.int64))
    b = _blocks(data, start, t, n)
    scales = b[:, 0:2].copy().view(_F16)[:, 0]
    if t == Q8_0:  # int8 weights as uint8 with a bias of -128 (the sign bit flipped)
        packed = b[:, 2:34] ^ np.uint8(0x80)
        biases = (scales * _F16(-128)).astype(_F16)
        per_word = 4
    else:
        if t == Q4_0:
            biases, q = (scales * _F16(-8)).astype(_F16), b[:, 2:18]
        else:
            biases, q = b[:, 2:4].copy().view(_F16)[:, 0], b[:, 4:20]
        # GGML's order: element j is byte j's low nibble, element 16 + j its high one;
        # MLX's: element 2k in byte k's low nibble, 2k + 1 in its high one
        e = np.concatenate([q & 0xF, q >> 4], axis=1)
        packed = (e[:, 0::2] | (e[:, 1::2] << 4)).astype(np.uint8)
        per_word = 8
    lead, last = tuple(shape[:-1]), shape[-1]
    weight = np.ascontiguousarray(packed).reshape(-1).view(np.uint32).reshape(
        lead + (last // per_word,))
    groups = lead + (last // 32,)
    return weight, scales.reshape(groups), biases.reshape(groups)


def _scale_min_k4(sc: np.ndarray) -> tuple:
    """Q4_K's 8 six-bit (scale, min) pairs per block from its 12 bytes (ggml's
    get_scale_min_k4)."""
    d = np.empty(sc.shape[:1] + (8,), np.uint8)
    m = np.empty_like(d)
    d[:, :4], m[:, :4] = sc[:, 0:4] & 63, sc[:, 4:8] & 63
    d[:, 4:] = (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)
    m[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return d.astype(np.float32), m.astype(np.float32)


def _half(b: np.ndarray, at: int) -> np.ndarray:
    return b[:, at:at + 2].copy().view(_F16)[:, 0].astype(np.float32)[:, None]


def to_f16(data: bytes, start: int, t: int, n: int) -> np.ndarray:
    """``n`` weights of a Q2_K / Q4_K / Q6_K / BF16 tensor as float16 (computed in float32
    as ggml's dequantize_row_*)."""
    if t == BF16:
        raw = np.frombuffer(data, np.uint16, n, start).astype(np.uint32) << 16
        return raw.view(np.float32).astype(_F16)
    b = _blocks(data, start, t, n)
    if t == Q4_K:  # |d|dmin|12 bytes of scales, mins|128 bytes: 4-bit weights|
        d, dmin = _half(b, 0), _half(b, 2)
        sc, mn = _scale_min_k4(b[:, 4:16])
        scale, minimum = (d * sc)[:, :, None], (dmin * mn)[:, :, None]  # (blocks, 8, 1)
        q = b[:, 16:144].reshape(-1, 4, 32)  # 32 bytes hold sub-blocks 2i (low), 2i + 1 (high)
        w = np.stack([q & 0xF, q >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
        out = w * scale - minimum
    elif t == Q6_K:  # |128 bytes: low 4 bits|64 bytes: high 2 bits|16 int8 scales|d|
        d = _half(b, 208)
        ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
        sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 2, 8)
        j = np.arange(128)
        low = (ql[:, :, j % 64] >> (j // 64 * 4).astype(np.uint8)) & 0xF
        high = (qh[:, :, j % 32] >> (j // 32 * 2).astype(np.uint8)) & 3
        q = (low | (high << 4)).astype(np.int8).astype(np.float32) - 32
        out = (d[:, :, None] * sc[:, :, j // 16]) * q
    elif t == Q2_K:  # |16 bytes: 4-bit scale, min pairs|64 bytes: 2-bit weights|d|dmin|
        d, dmin = _half(b, 80), _half(b, 82)
        pairs = b[:, 0:16]
        scale = d * (pairs & 0xF).astype(np.float32)  # (blocks, 16)
        minimum = dmin * (pairs >> 4).astype(np.float32)
        qs = b[:, 16:80].reshape(-1, 2, 32)
        j = np.arange(128)
        q = ((qs[:, :, j % 32] >> (j // 32 * 2).astype(np.uint8)) & 3).astype(np.float32)
        q = q.reshape(-1, 16, 16)
        out = q * scale[:, :, None] - minimum[:, :, None]
    else:
        raise RuntimeError("[load_gguf] gguf_tensor_to_f16 failed")
    return out.reshape(-1)[:n].astype(_F16)
