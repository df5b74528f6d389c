"""Attaches ``array.view(dtype, *, stream=None)`` (MLX's method form of ``mx.view``)."""

from __future__ import annotations

from . import dtypes as _dt
from .array import array
from .device import StreamOrDevice
from .ops.convert import incompatible
from .ops.extras import view as _view


def _array_view(self: array, dtype: _dt.Dtype, *, stream: StreamOrDevice = None) -> array:
    """View the array's bits as ``dtype`` (see ``mx.view``)."""
    if not isinstance(dtype, _dt.Dtype):
        raise incompatible("view", "view(self, dtype: mlx.core.Dtype, *, stream: mlx.core.Stream "
                           "| mlx.core.ThreadLocalStream | mlx.core.Device | mlx.core.DeviceType "
                           "| None = None) -> mlx.core.array", self, dtype)
    return _view(self, dtype, stream=stream)


_array_view.__name__ = "view"
_array_view.__qualname__ = "array.view"
array.view = _array_view
