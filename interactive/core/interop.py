"""Exchanging arrays with other libraries: DLPack both ways (``mx.from_dlpack``,
``x.__dlpack__``, ``x.__dlpack_device__``), ``x.__array_namespace__``, ``bytes(x)``, and
``mx.get_array_buffer_size`` (MLX's python/src/array.cpp and python/src/memory.cpp)."""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from tapescope.kernels.backends import stream_backend

from . import dtypes as _dt
from .array import array
from .device import incompatible
from .tree import tree_arrays

_FROM_DLPACK_SIG = "from_dlpack(x: DLPackCompatible, /, *, copy: bool | None = None) -> array"


def from_dlpack(x: Any, /, *, copy: Optional[bool] = None) -> array:
    """Create an array from an object that supports DLPack.

    The data is always copied into tapescope's allocator (the runtime recycles its buffers,
    so it cannot hold memory it does not own): ``copy=False``, which must never copy, raises
    MLX's error for a buffer it cannot adopt (python/src/convert.cpp)."""
    if isinstance(x, np.generic):  # numpy scalars: MLX's binding takes them too
        x = np.asarray(x)
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")) or not (
            copy is None or isinstance(copy, bool)):
        raise incompatible("from_dlpack", _FROM_DLPACK_SIG, x,
                           **({} if copy is None else {"copy": copy}))
    if copy is False:
        raise ValueError("[convert] Cannot import a CPU array without a copy.")
    if isinstance(x, array):
        return array(x._numpy().copy(), x.dtype)
    src = np.from_dlpack(x)
    if any(st < 0 for st in src.strides):
        return array(src)  # MLX's error for negative strides
    if src.dtype in (np.float64, np.complex128) or src.flags.c_contiguous or src.size == 0:
        return array(np.array(src, copy=True))  # float64 -> float32, as MLX
    return _strided_copy(src)


def _strided_copy(src: np.ndarray) -> array:
    """A copy of a strided source laid out as MLX's adopted array is (the source's strides:
    ``memoryview(y).strides`` match): the bytes its view spans, copied into a new buffer."""
    from numpy.lib.stride_tricks import as_strided

    from .array import ArrayDesc, adopt, check_dimensions
    from .device import resolve_stream

    check_dimensions(src.shape)
    span = sum((n - 1) * st for n, st in zip(src.shape, src.strides)) + src.itemsize
    raw = np.empty(-(-span // src.itemsize), dtype=src.dtype)
    view = as_strided(raw, src.shape, src.strides)
    view[...] = src
    view.flags.writeable = False  # as a broadcast view: never donated, never written into
    dt = _dt.from_numpy(src.dtype)
    return array._wrap(ArrayDesc(src.shape, dt, resolve_stream(None), data=view,
                                 buffer=adopt(raw)))


def get_array_buffer_size(*args: Any) -> int:
    """The size in bytes of the unique buffers backing the arrays (trees of arrays; other
    leaves are ignored); the arrays must be evaluated."""
    seen, total = set(), 0
    for a in tree_arrays(list(args)):
        d = a._d
        if d.node is not None:
            raise ValueError("[get_array_buffer_size] Arrays must be evaluated before querying "
                             "buffer size.")
        if d.buffer is not None:
            key, size = id(d.buffer.buffer), d.buffer.buffer.size
        else:
            key, size = id(d.data.base if d.data.base is not None else d.data), d.data.nbytes
        if key not in seen:
            seen.add(key)
            total += size
    return total


_KDLCPU = 1  # DLPack's device type of the host


def dlpack(self: array, *, stream: Any = None, max_version: Any = None,
            dl_device: Optional[tuple] = None, copy: Optional[bool] = None) -> Any:
    """The array as a DLPack capsule (read-only; a copy for consumers older than DLPack 1.0,
    which cannot be told that it is read-only). A GPU array's capsule is its device memory,
    unless the consumer asks for the CPU (``dl_device=(1, 0)``, as numpy's ``from_dlpack``
    of MLX's test_array does): then, as MLX's CUDA arrays export host memory
    (python/src/convert.cpp ``mlx_to_nd_array``), its host copy."""
    from .array import _export_view

    if self.dtype == _dt.bfloat16:
        raise RuntimeError("Unsupported dtype in DLTensor.")
    to_host = dl_device is not None and tuple(dl_device)[0] == _KDLCPU
    dev = None if to_host else _device_view(self)
    if dev is not None:
        kw = {} if max_version is None else {"max_version": max_version}
        return dev.__dlpack__(stream=stream, **kw)  # the consumer reads the device memory
    data = self._numpy()  # (a GPU array's: a fresh host copy)
    if copy or max_version is None or tuple(max_version) < (1, 0):
        return np.array(data, copy=True).__dlpack__(stream=stream)
    view = _export_view(data, self._d.buffer)
    return view.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)


def dlpack_device(self: array) -> tuple:
    """``(device type, device id)`` in DLPack's numbering: (1, 0) is the CPU, (2, n) a CUDA
    GPU (where the array's data is)."""
    dev = _device_view(self)
    return (1, 0) if dev is None else tuple(dev.__dlpack_device__())


def _device_view(self: array) -> Any:
    """The evaluated array's device memory as the backend exports it, or None on the host."""
    if self._d.node is not None:
        from .eval_api import eval as _eval

        _eval(self)
    data = self._d.data
    if type(data) is np.ndarray:
        return None
    return stream_backend(self._d.stream).allocator.export(data, self._d.buffer)


def cuda_array_interface(self: array) -> dict:
    """``__cuda_array_interface__`` (version 3) of an array in CUDA memory; an AttributeError
    for one on the host, so that consumers fall back to DLPack or the buffer protocol."""
    dev = _device_view(self)
    if dev is None:
        raise AttributeError("'array' object on the host has no attribute '__cuda_array_interface__'")
    cai = dict(dev.__cuda_array_interface__)
    # not flagged read-only: PyTorch refuses a read-only interface ("the read only flag is not
    # supported"), so torch.tensor(x) of a GPU array would fail where MLX's succeeds; like
    # MLX's own exports the memory is the array's, which a consumer must not write
    cai["data"] = (cai["data"][0], False)
    return cai  # consumers keep this array (and so its buffer) alive, as the protocol says


def array_namespace(self: array, api_version: Optional[str] = None) -> Any:
    """The array API namespace: ``tapescope.core``."""
    return sys.modules["tapescope.core"]


def as_bytes(self: array) -> bytes:
    """The array's bytes in row-major order."""
    return np.ascontiguousarray(self._numpy()).tobytes()


dlpack.__name__, dlpack_device.__name__ = "__dlpack__", "__dlpack_device__"
array_namespace.__name__, as_bytes.__name__ = "__array_namespace__", "__bytes__"
# (array_methods.py attaches them to ``array``)
