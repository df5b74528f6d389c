"""Rules for random primitives: ``RandomBits`` from a counter-based threefry2x32 hash.

MLX's random numbers are a pure function of a key (two uint32 words) and a counter, so the
same key always gives the same bits and no state lives in the runtime. The hash and the
layout of the counters follow MLX's CPU backend, so keys and bits match MLX bit for bit.
"""

from __future__ import annotations

from ..primitives import RANDOM, define

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def threefry2x32(xp, k0, k1, c0, c1):
    """The threefry2x32 hash (20 rounds) of counters ``(c0, c1)`` under key ``(k0, k1)``.

    All arguments are uint32 arrays (broadcastable); returns the two uint32 output words.
    """
    u32 = xp.uint32
    ks = (k0.astype(u32), k1.astype(u32), (k0 ^ k1 ^ u32(_PARITY)).astype(u32))
    x0 = (c0.astype(u32) + ks[0]).astype(u32)
    x1 = (c1.astype(u32) + ks[1]).astype(u32)
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = (x0 + x1).astype(u32)
            x1 = ((x1 << u32(r)) | (x1 >> u32(32 - r))).astype(u32)
            x1 = x1 ^ x0
        x0 = (x0 + ks[(i + 1) % 3]).astype(u32)
        x1 = (x1 + ks[(i + 2) % 3] + u32(i + 1)).astype(u32)
    return x0, x1


@define("RandomBits", family=RANDOM, kernel="random_bits")
def random_bits(xp, keys, *, shape, width):
    """``shape`` random values of ``width`` bytes each (uint8/16/32), from keys ``(..., 2)``.

    Each key fills its own contiguous chunk of the output. Within a chunk of ``W`` 32-bit
    words (``h = W // 2``), hashing counter ``(j, h + odd + j)`` gives words ``j`` and
    ``h + odd + j``; an odd middle word comes from counter ``(h, 0)``. The chunk's bytes are
    then read as the output dtype (little-endian), exactly as MLX's CPU backend lays them.
    """
    u32 = xp.uint32
    keys = xp.ascontiguousarray(keys, dtype=u32).reshape(-1, 2)
    num_keys = keys.shape[0]
    size = 1
    for s in shape:
        size *= int(s)
    out_dtype = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32}[width]
    if size == 0 or num_keys == 0:
        return xp.zeros(shape, dtype=out_dtype)
    bytes_per_key = width * (size // num_keys)
    words = (bytes_per_key + 3) // 4
    half, odd = words // 2, words % 2
    k0 = keys[:, 0:1]
    k1 = keys[:, 1:2]
    j = xp.arange(half, dtype=u32)[None, :]
    lo, hi = threefry2x32(xp, k0, k1, j, j + u32(half + odd))
    parts = [lo, hi]
    if odd:
        mid, _ = threefry2x32(xp, k0, k1, xp.full((1, 1), half, dtype=u32), xp.zeros((1, 1), dtype=u32))
        parts = [lo, mid, hi]
    chunk = xp.concatenate([xp.broadcast_to(p, (num_keys, p.shape[1])) for p in parts], axis=1)
    chunk = xp.ascontiguousarray(chunk.astype("<u4"))
    raw = chunk.view(xp.uint8)[:, :bytes_per_key]
    return xp.ascontiguousarray(raw).view(out_dtype).reshape(shape)
