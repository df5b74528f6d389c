"""The array-API spellings MLX binds to its own ops: the same function objects, as in MLX
(``mx.acos is mx.arccos``), plus ``positive``, ``permute_dims`` and ``matrix_transpose``.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..array import array
from ..device import StreamOrDevice
from .binary import arctan2, left_shift, power, right_shift
from .convert import incompatible
from .creation import zeros, zeros_like
from .elementwise import arccos, arccosh, arcsin, arcsinh, arctan, arctanh
from .scan import cumprod, cumsum
from .shape import transpose

__all__ = [
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "pow", "bitwise_left_shift",
    "bitwise_right_shift", "cumulative_sum", "cumulative_prod", "empty", "empty_like",
    "permute_dims", "matrix_transpose", "positive",
]

acos = arccos
acosh = arccosh
asin = arcsin
asinh = arcsinh
atan = arctan
atan2 = arctan2
atanh = arctanh
pow = power
bitwise_left_shift = left_shift
bitwise_right_shift = right_shift
cumulative_sum = cumsum
cumulative_prod = cumprod
empty = zeros
empty_like = zeros_like


def permute_dims(a: array, /, axes: Optional[Sequence[int]] = None, *,
                 stream: StreamOrDevice = None) -> array:
    """Permute the axes of ``a`` (see ``transpose``)."""
    return transpose(a, axes, stream=stream)


def matrix_transpose(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Swap the last two axes of ``a`` (a Transpose)."""
    if not isinstance(a, array):
        raise incompatible("matrix_transpose", "matrix_transpose(a: array, /, *, stream: "
                           "StreamOrDevice = None) -> array", a)
    if a.ndim < 2:
        raise ValueError("[matrix_transpose] Input array must have at least 2 dimensions.")
    perm = list(range(a.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return transpose(a, perm, stream=stream)


def positive(a: array, /, *, stream: StreamOrDevice = None) -> array:
    """Element-wise unary plus: a new handle on ``a``'s data, recording nothing (as MLX)."""
    if not isinstance(a, array):
        raise incompatible("positive", "positive(a: array, /, *, stream: StreamOrDevice = None) "
                           "-> array", a)
    return array._wrap(a._d)
