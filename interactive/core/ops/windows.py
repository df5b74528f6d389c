"""Window functions: bartlett, blackman, hamming, hanning (float32, composed of Arange and
elementwise ops as ``mlx/ops.cpp`` composes them; no primitive of their own)."""

from __future__ import annotations

import math

from .. import dtypes as _dt
from ..array import array
from ..device import BadArgs, StreamOrDevice, binding, resolve_stream
from .binary import add, multiply, subtract
from .creation import arange, ones
from .elementwise import abs, cos, sin, square  # noqa: A004 - MLX's names

__all__ = ["bartlett", "blackman", "hamming", "hanning"]

_LONG = ("{}(M: int, *, stream: mlx.core.Stream | mlx.core.ThreadLocalStream | mlx.core.Device "
         "| mlx.core.DeviceType | None = None) -> mlx.core.array")
_SHORT = "{}(M: int, *, stream: StreamOrDevice = None) -> array"


def _n(M, stream):
    """(n = arange(M) as float32, stream), or the whole window when M < 2 (MLX's early
    returns: an empty float32 array, or [1])."""
    if isinstance(M, (float, bool)) or not hasattr(M, "__index__"):
        raise BadArgs("M")
    M = M.__index__()
    if not -2 ** 31 <= M < 2 ** 31:  # nanobind's int caster refuses what int32 cannot hold
        raise BadArgs("M")
    s = resolve_stream(stream)
    if M < 1:
        return None, array([], _dt.float32), s
    if M == 1:
        return None, ones((1,), _dt.float32, stream=s), s
    return M, arange(0, M, dtype=_dt.float32, stream=s), s


def _f(v: float) -> array:
    return array(v, _dt.float32)


@binding(_LONG.format("bartlett"))
def bartlett(M: int, *, stream: StreamOrDevice = None) -> array:
    """The Bartlett (triangular) window: ``1 - |2n / (M - 1) - 1|``."""
    M, n, s = _n(M, stream)
    if M is None:
        return n
    term = subtract(multiply(_f(2.0 / (M - 1)), n, stream=s), _f(1.0), stream=s)
    return subtract(_f(1.0), abs(term, stream=s), stream=s)


@binding(_LONG.format("hanning"))
def hanning(M: int, *, stream: StreamOrDevice = None) -> array:
    """The Hanning window: ``sin(pi n / (M - 1))^2``."""
    M, n, s = _n(M, stream)
    if M is None:
        return n
    return square(sin(multiply(_f(math.pi / (M - 1)), n, stream=s), stream=s), stream=s)


@binding(_SHORT.format("hamming"))
def hamming(M: int, *, stream: StreamOrDevice = None) -> array:
    """The Hamming window: ``0.54 - 0.46 cos(2 pi n / (M - 1))``."""
    M, n, s = _n(M, stream)
    if M is None:
        return n
    c = cos(multiply(_f(2.0 * math.pi / (M - 1)), n, stream=s), stream=s)
    return subtract(_f(0.54), multiply(_f(0.46), c, stream=s), stream=s)


@binding(_SHORT.format("blackman"))
def blackman(M: int, *, stream: StreamOrDevice = None) -> array:
    """The Blackman window, as MLX writes it: ``0.34 - 0.5 cos(x) + 0.16 cos(x)^2`` with
    ``x = 2 pi n / (M - 1)``."""
    M, n, s = _n(M, stream)
    if M is None:
        return n
    c = cos(multiply(_f(2.0 * math.pi / (M - 1)), n, stream=s), stream=s)
    t1 = multiply(_f(0.5), c, stream=s)
    t2 = multiply(_f(0.16), square(c, stream=s), stream=s)
    return add(subtract(_f(0.34), t1, stream=s), t2, stream=s)
