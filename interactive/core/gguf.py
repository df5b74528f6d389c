"""GGUF files: ``mx.save_gguf`` and ``mx.load(..., format="gguf")`` for MLX's unquantized tensor
types (F32, F16, I8, I16, I32) and metadata (strings, lists of strings, scalar or 1-D arrays),
written by hand after the GGUF specification (ggml/docs/gguf.md) as MLX's mlx/io/gguf.cpp
does through gguflib: version 3, tensors aligned to 32 bytes, dimensions innermost first.
Quantized tensor types are not read (MLX dequantizes some of them)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from . import dtypes as _dt
from .array import array

_ALIGN = 32
# GGML tensor types MLX writes (and reads without quantization)
_TENSOR_TYPES = {_dt.float32: 0, _dt.float16: 1, _dt.int8: 24, _dt.int16: 25, _dt.int32: 26}
_TENSOR_DTYPES = {v: k for k, v in _TENSOR_TYPES.items()}
# GGUF metadata value types
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_VALUE_TYPES = {_dt.uint8: _U8, _dt.int8: _I8, _dt.uint16: _U16, _dt.int16: _I16,
                _dt.uint32: _U32, _dt.int32: _I32, _dt.float32: _F32, _dt.bool_: _BOOL,
                _dt.uint64: _U64, _dt.int64: _I64}
_VALUE_DTYPES = {v: k for k, v in _VALUE_TYPES.items()}
_VALUE_DTYPES[_F64] = _dt.float64


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _metadata_value(key: str, v: Any) -> bytes:
    if isinstance(v, str):
        return struct.pack("<I", _STR) + _str(v)
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return struct.pack("<IIQ", _ARR, _STR, len(v)) + b"".join(_str(x) for x in v)
    if not isinstance(v, array):
        raise RuntimeError("std::bad_cast")
    if v.ndim > 1:
        raise RuntimeError("[save_gguf] Cannot save arrays with more than one dimension.")
    if v.size == 0:
        raise RuntimeError("[save_gguf] Cannot save empty arrays.")
    t = _VALUE_TYPES.get(v.dtype)
    if t is None:
        raise ValueError(f"[save_gguf] array type {v.dtype.name} not support for metadata.")
    data = np.ascontiguousarray(np.asarray(v._numpy())).tobytes()
    if v.ndim == 0:
        return struct.pack("<I", t) + data
    return struct.pack("<IIQ", _ARR, t, v.size) + data


def save_gguf(file: Any, arrays: dict, metadata: dict) -> None:
    """Save array(s) to a binary file in ``.gguf`` format."""
    from .serialize import _open, _path

    for a in arrays.values():
        if a.dtype not in _TENSOR_TYPES:
            raise RuntimeError(f"[save_gguf] dtype {a.dtype.name} is not supported")
    kv = b"".join(_str(k) + _metadata_value(k, v) for k, v in metadata.items())
    infos, blobs, offset = [], [], 0
    for name, a in arrays.items():
        blob = np.ascontiguousarray(np.asarray(a._numpy())).tobytes()
        dims = list(reversed(a.shape))
        infos.append(_str(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) +
                     struct.pack("<IQ", _TENSOR_TYPES[a.dtype], offset))
        pad = -len(blob) % _ALIGN
        blobs.append(blob + b"\0" * pad)
        offset += len(blob) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(arrays), len(metadata)) + kv + b"".join(infos)
    with _open(_path(file, ".gguf"), "wb") as f:
        f.write(head + b"\0" * (-len(head) % _ALIGN))
        for b in blobs:
            f.write(b)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> Any:
        vals = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return vals[0] if len(vals) == 1 else vals

    def string(self) -> str:
        n = self.take("Q")
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def values(self, t: int, n: int) -> Any:
        if t == _STR:
            return [self.string() for _ in range(n)]
        dt = _VALUE_DTYPES.get(t)
        if dt is None:
            raise ValueError(f"[load_gguf] Unsupported metadata type {t}.")
        host = np.frombuffer(self.data, dt.np, n, self.pos).copy()
        self.pos += host.nbytes
        return host


def load_gguf(f: Any, file: Any) -> tuple[dict, dict]:
    """(arrays, metadata) of an open GGUF file."""
    r = _Reader(f.read())
    if r.data[:4] != b"GGUF":
        raise ValueError(f"[load_gguf] Failed to read gguf file {file}")
    r.pos = 4
    version, n_tensors, n_kv = r.take("IQQ")
    meta: dict = {}
    alignment = _ALIGN
    for _ in range(n_kv):
        key, t = r.string(), r.take("I")
        if t == _ARR:
            et, n = r.take("IQ")
            vals = r.values(et, n)
            meta[key] = vals if et == _STR else array(vals, _VALUE_DTYPES[et])
        else:
            v = r.values(t, 1)
            meta[key] = v[0] if t == _STR else array(v.reshape(()), _VALUE_DTYPES[t])
        if key == "general.alignment":
            alignment = int(np.asarray(meta[key]._numpy()))
    infos = []
    for _ in range(n_tensors):
        name, nd = r.string(), r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        t, off = r.take("IQ")
        if t not in _TENSOR_DTYPES:
            raise ValueError(f"[load_gguf] Unsupported tensor type {t} (quantized GGUF is not "
                             "read here).")
        infos.append((name, tuple(reversed(dims)), _TENSOR_DTYPES[t], off))
    base = r.pos + (-r.pos % alignment)
    arrays = {}
    for name, shape, dt, off in infos:
        n = int(np.prod(shape))
        host = np.frombuffer(r.data, dt.np, n, base + off).reshape(shape).copy()
        arrays[name] = array(host, dt)
    return arrays, meta
