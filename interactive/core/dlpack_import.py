"""Host data read from a DLPack capsule, for values numpy cannot take (``mx.array`` of a
PyTorch or MLX bfloat16 tensor: numpy has no bfloat16, so ``np.asarray`` of them fails).

MLX builds an array from any DLPack producer (python/src/convert.cpp reads the capsule
through nanobind's ndarray); tapescope asks numpy first and reads the capsule itself only
where numpy refuses. The capsule is DLPack's legacy ``"dltensor"`` (what ``__dlpack__()``
gives without ``max_version``): its DLTensor (data, device, ndim, dtype, shape, strides,
byte_offset) is read through ctypes, the elements copied out, and the capsule left
unconsumed so that its own destructor releases the producer's memory (DLPack's rule for a
capsule that was not renamed ``"used_dltensor"``). Only host memory (kDLCPU) is read.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional

import ml_dtypes
import numpy as np

_KDLCPU = 1
# DLDataTypeCode -> numpy kind, by bits (dlpack.h: kDLInt 0, kDLUInt 1, kDLFloat 2,
# kDLBfloat 4, kDLComplex 5, kDLBool 6)
_DTYPES = {
    (0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64,
    (1, 8): np.uint8, (1, 16): np.uint16, (1, 32): np.uint32, (1, 64): np.uint64,
    (2, 16): np.float16, (2, 32): np.float32, (2, 64): np.float64,
    (4, 16): ml_dtypes.bfloat16, (5, 64): np.complex64, (5, 128): np.complex128,
    (6, 8): np.bool_,
}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def host_copy(value: Any) -> Optional[np.ndarray]:
    """A numpy copy of ``value``'s elements read through its ``__dlpack__`` capsule, or None
    where it has none, its data is not in host memory or its dtype is not one of MLX's."""
    export = getattr(value, "__dlpack__", None)
    if export is None:
        return None
    if hasattr(value, "__dlpack_device__") and tuple(value.__dlpack_device__())[0] != _KDLCPU:
        return None
    capsule = export()
    if not _api.PyCapsule_IsValid(capsule, b"dltensor"):
        return None
    t = _Tensor.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor"))
    dt = _DTYPES.get((t.dtype.code, t.dtype.bits))
    if t.device.device_type != _KDLCPU or t.dtype.lanes != 1 or dt is None:
        return None
    dt = np.dtype(dt)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] * dt.itemsize for i in range(t.ndim))  # elements -> bytes
    else:  # NULL: row-major contiguous
        strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dt.itemsize
                        for i in range(t.ndim))
    if any(n == 0 for n in shape):
        return np.empty(shape, dtype=dt)
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + dt.itemsize
    base = t.data + t.byte_offset + lo
    raw = np.frombuffer((ctypes.c_char * (hi - lo)).from_address(base), dtype=np.uint8)
    first = raw[-lo:-lo + dt.itemsize].view(dt)  # the element at index 0, strides from it
    return np.array(np.lib.stride_tricks.as_strided(first, shape=shape, strides=strides), copy=True)
