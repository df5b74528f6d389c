"""MLX's ``Hadamard`` primitive: the Walsh-Hadamard transform along the last axis, scaled.

Sizes ``n = m * 2^k`` with ``m`` in (1, 12, 20, 28): the matrix is ``kron(H_m, H_{2^k})``,
``H_{2^k}`` Sylvester's and ``H_12``, ``H_20``, ``H_28`` MLX's own (the rows below, as in
``mlx/backend/common/hadamard.h``). The ``2^k`` part runs as ``k`` butterfly passes, the
``m`` part as one small matrix product; float16 / bfloat16 work in float32, as MLX's CPU
backend does.
"""

from __future__ import annotations

from ..primitives import FFT, define

# MLX's H_m, one string of +/- per row
H_ROWS = {
    12: (
        "+-++++++++++", "--+-+-+-+-+-",
        "+++-++----++", "+---+--+-++-",
        "+++++-++----", "+-+---+--+-+",
        "++--+++-++--", "+--++---+--+",
        "++----+++-++", "+--+-++---+-",
        "++++----+++-", "+-+--+-++---",
    ),
    20: (
        "+----+----++--++-++-", "-+----+---+++---+-++", "--+----+---+++-+-+-+",
        "---+----+---+++++-+-", "----+----++--++-++-+", "-+++++-----+--+++--+",
        "+-+++-+---+-+--+++--", "++-++--+---+-+--+++-", "+++-+---+---+-+--+++",
        "++++-----++--+-+--++", "--++-+-++-+-----++++", "---++-+-++-+---+-+++",
        "+---++-+-+--+--++-++", "++---++-+----+-+++-+", "-++---++-+----+++++-",
        "-+--+--++-+----+----", "+-+-----++-+----+---", "-+-+-+---+--+----+--",
        "--+-+++------+----+-", "+--+--++------+----+",
    ),
    28: (
        "+------++----++-+--+-+--++--", "-+-----+++-----+-+--+-+--++-",
        "--+-----+++---+-+-+----+--++", "---+-----+++---+-+-+-+--+--+",
        "----+-----+++---+-+-+++--+--", "-----+-----++++--+-+--++--+-",
        "------++----++-+--+-+--++--+", "--++++-+-------++--+++-+--+-",
        "---++++-+-----+-++--+-+-+--+", "+---+++--+----++-++--+-+-+--",
        "++---++---+----++-++--+-+-+-", "+++---+----+----++-++--+-+-+",
        "++++--------+-+--++-++--+-+-", "-++++--------+++--++--+--+-+",
        "-+-++-++--++--+--------++++-", "+-+-++--+--++--+--------++++",
        "-+-+-++--+--++--+----+---+++", "+-+-+-++--+--+---+---++---++",
        "++-+-+-++--+------+--+++---+", "-++-+-+-++--+------+-++++---",
        "+-++-+---++--+------+-++++--", "-++--++-+-++-+++----++------",
        "+-++--++-+-++-+++-----+-----", "++-++---+-+-++-+++-----+----",
        "-++-++-+-+-+-+--+++-----+---", "--++-++++-+-+----+++-----+--",
        "+--++-+-++-+-+----+++-----+-", "++--++-+-++-+-+----++------+",
    ),
}


def matrix_m(xp, m: int):
    """H_m as a float32 array (m in 1, 12, 20, 28)."""
    if m == 1:
        return xp.ones((1, 1), dtype=xp.float32)
    rows = H_ROWS[m]
    return xp.asarray([[1.0 if c == "+" else -1.0 for c in r] for r in rows], dtype=xp.float32)


def decompose(n: int):
    """(m, 2^k) with n = m * 2^k, m in (1, 12, 20, 28); None when n has no such form."""
    for m in (1, 12, 20, 28):
        if n % m == 0:
            p = n // m
            if p & (p - 1) == 0:
                return m, p
    return None


def _out_dtype(dtypes: list, **_) -> list:
    """The input's (a float type: the op casts integers, bools and complex to float32)."""
    return [dtypes[0]]


def _same_shape(shapes: list, **_) -> list:
    return [tuple(shapes[0])]


@define("Hadamard", family=FFT, shape=_same_shape, dtype=_out_dtype)
def hadamard(xp, a, *, scale):
    """``(kron(H_m, H_2^k) @ x) * scale`` along the last axis of ``a``."""
    if a.dtype.name not in ("float32", "float16", "bfloat16"):
        raise ValueError("[hadamard] Unsupported type.")
    n = a.shape[-1]
    mp = decompose(n)
    if mp is None:
        raise ValueError("[hadamard] Only supports n = m*2^k where m in (1, 12, 20, 28).")
    m, p = mp
    x = a.astype(xp.float32).reshape(-1, n)
    h = 1
    while h < p:  # Sylvester's H_2^k on the low index bits, one pair of halves per pass
        y = x.reshape(x.shape[0], n // (2 * h), 2, h)
        x = xp.stack([y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]], axis=2).reshape(-1, n)
        h *= 2
    if m > 1:  # H_m on the high part: (m, m) @ (rows, m, p)
        x = xp.matmul(matrix_m(xp, m), x.reshape(-1, m, p)).reshape(-1, n)
    x = x * xp.float32(scale)
    return x.reshape(a.shape).astype(a.dtype)
