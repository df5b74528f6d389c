"""``hadamard_transform``: the Walsh-Hadamard transform along the last axis (MLX's ``Hadamard``).

Integer, bool and complex inputs are cast to float32 first (an AsType node, as MLX records);
float64 is refused when the node runs, as MLX's CPU backend refuses it, and so is a last
axis that is not ``m * 2^k`` with ``m`` in (1, 12, 20, 28). A 0-d input is only scaled.
"""

from __future__ import annotations

import math
from typing import Optional

from .. import dtypes as _dt
from ..array import array
from ..device import BadArgs, StreamOrDevice, binding, resolve_stream
from ..primitive import Primitive
from .convert import cast

__all__ = ["hadamard_transform"]

_SIG = ("hadamard_transform(a: array, scale: float | None = None, "
        "stream: StreamOrDevice = None) -> array")


@binding(_SIG)
def hadamard_transform(a: array, scale: Optional[float] = None,
                       stream: StreamOrDevice = None) -> array:
    """Perform the Walsh-Hadamard transform along the final axis, times ``scale``
    (default ``1/sqrt(a.shape[-1])``, which makes the transform orthonormal)."""
    if not isinstance(a, array):
        raise BadArgs("a")
    if scale is not None:
        if not isinstance(scale, (int, float)) and not hasattr(scale, "__float__"):
            raise BadArgs("scale")
        scale = float(scale)
    s = resolve_stream(stream)
    if a.size == 0:
        raise ValueError("[hadamard_transform] Does not support empty arrays.")
    if a.ndim == 0:
        if scale is None:
            return a
        from .binary import multiply

        return multiply(a, array(scale, _dt.float32), stream=s)
    n = a.shape[-1]
    scale = 1.0 / math.sqrt(n) if scale is None else scale
    dtype = a.dtype if _dt.is_floating(a.dtype) else _dt.float32
    if a.dtype is not dtype:
        a = cast(a, dtype, s)
    return array._make1(a.shape, dtype, Primitive("Hadamard", s, scale=scale), [a])


