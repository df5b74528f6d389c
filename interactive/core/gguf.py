"""GGUF files: ``mx.save_gguf`` and ``mx.load(..., format="gguf")`` for MLX's unquantized tensor
types (F32, F16, I8, I16, I32) and metadata (strings, lists of strings, scalar or 1-D arrays),
written by hand after the GGUF specification (ggml/docs/gguf.md) as MLX's mlx/io/gguf.cpp
does through gguflib: version 3, tensors aligned to 32 bytes, dimensions innermost first.
Quantized tensors are read as MLX reads them (core/gguf_quants.py). The file is read
whole, as MLX reads it (not lazily: mlx/io/gguf.cpp copies each tensor at load)."""

from __future__ import annotations

import struct
from typing import Any, Optional

import numpy as np

from . import dtypes as _dt
from . import gguf_quants as quants
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


def save_gguf(file: Any, arrays: dict, metadata: Optional[dict] = None) -> None:
    """Save array(s) to a binary file in ``.gguf`` format (``metadata`` may be left out, as
    in MLX)."""
    from .serialize import _open, _path

    metadata = {} if metadata is None else metadata

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


_FIXED = {_U8: 1, _I8: 1, _U16: 2, _I16: 2, _U32: 4, _I32: 4, _F32: 4, _BOOL: 1, _U64: 8,
          _I64: 8, _F64: 8}
_MAX_DIMS = 8  # gguflib's GGUF_TENSOR_MAX_DIM (an assert there: MLX aborts past it)
_PAST = " extends past the end of the file. Perhaps an incomplete download or corrupt file?"


class _Reader:
    """Reads a GGUF file's fields, each checked to lie in the file first (gguflib reads
    through pointers unchecked: MLX segfaults on a truncated key, a huge count or string)."""

    def __init__(self, data: bytes, where: str):
        self.data, self.pos, self.where = data, 0, where

    def need(self, n: int, what: str) -> None:
        if n > len(self.data) - self.pos:
            raise RuntimeError(f"[load_gguf] {what}{_PAST}")

    def take(self, fmt: str, what: str) -> Any:
        n = struct.calcsize("<" + fmt)
        self.need(n, what)
        vals = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += n
        return vals[0] if len(vals) == 1 else vals

    def string(self, what: str) -> str:
        n = self.take("Q", what)
        self.need(n, what)
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode()
        except UnicodeDecodeError:  # MLX: a raw UnicodeDecodeError from nanobind
            raise RuntimeError(f"[load_gguf] {what} is not valid UTF-8 in {self.where}") from None

    def scalars(self, t: int, n: int, what: str) -> np.ndarray:
        """``n`` values of fixed-size type ``t`` as MLX keeps them: float64 as float32, a
        bool as whether its byte is nonzero."""
        size = _FIXED[t]
        if n > (len(self.data) - self.pos) // size:
            raise RuntimeError(f"[load_gguf] {what}{_PAST}")
        if t == _BOOL:
            host = np.frombuffer(self.data, np.uint8, n, self.pos) != 0
        else:
            host = np.frombuffer(self.data, _VALUE_DTYPES[t].np, n, self.pos)
            host = host.astype(np.float32) if t == _F64 else host.copy()
        self.pos += n * size
        return host

    def value(self, t: int) -> Any:
        """One metadata value of type ``t`` (mlx/io/gguf.cpp set_mx_value_from_gguf)."""
        if t in _FIXED:
            return array(self.scalars(t, 1, "Metadata value").reshape(()), _metadata_dtype(t))
        if t == _STR:
            return self.string("String metadata value")
        if t != _ARR:
            raise RuntimeError("[load_gguf] Received unexpected type.")
        et, n = self.take("IQ", "Metadata value")
        if et == _ARR:
            raise ValueError("[load_gguf] Only supports loading 1-layer of nested arrays.")
        if et == _STR:
            return [self.string("Array metadata value") for _ in range(n)]
        if et not in _FIXED:
            raise RuntimeError("[load_gguf] Multiple levels of nested arrays are not supported.")
        return array(self.scalars(et, n, "Array metadata value"), _metadata_dtype(et))


def _metadata_dtype(t: int) -> Any:
    return _dt.float32 if t == _F64 else _VALUE_DTYPES[t]


def _tensor_error(name: str, what: str) -> RuntimeError:
    return RuntimeError(f"[load_gguf] Tensor '{name}' {what}. Perhaps an incomplete download or "
                        "corrupt file?")


def load_gguf(f: Any, file: Any) -> tuple[dict, dict]:
    """(arrays, metadata) of an open GGUF file; MLX's messages where MLX checks, bracketed
    ones naming the file and the field where it reads past the file or crashes."""
    from .serialize import label

    where = label(file)
    r = _Reader(f.read(), where)
    if len(r.data) < 24 or r.data[:4] != b"GGUF":  # gguflib's gguf_init
        raise RuntimeError("[load_gguf] gguf_init failed")
    r.pos = 4
    version, n_tensors, n_kv = r.take("IQQ", "The header")
    if version not in (2, 3):  # gguflib reads any version as 3; version 1's fields are 32-bit
        raise RuntimeError(f"[load_gguf] Unsupported GGUF version {version} in {where}")
    # a huge count is not checked up front: every entry takes at least 13 bytes, so the
    # loops end at the file's end with the field's error
    meta: dict = {}
    alignment = _ALIGN
    for _ in range(n_kv):
        key = r.string("Metadata key")
        t = r.take("I", "Metadata value")
        meta[key] = r.value(t)
        if key == "general.alignment":
            # a uint32 power of two, as ggml's gguf.cpp and gguf-py require (gguflib reads any
            # uint32, and divides by zero on 0)
            alignment = int(np.asarray(meta[key]._numpy())) if t == _U32 else 0
            if alignment <= 0 or alignment & (alignment - 1):
                raise RuntimeError("[load_gguf] general.alignment must be a uint32 power of two "
                                   f"in {where}")
    infos = []
    for _ in range(n_tensors):
        name = r.string("Tensor name")
        what = f"Tensor '{name}' info"
        nd = r.take("I", what)
        if nd > _MAX_DIMS:
            raise RuntimeError(f"[load_gguf] Tensor '{name}' has {nd} dimensions, more than "
                               f"{_MAX_DIMS}, in {where}")
        dims = r.take(f"{nd}Q", what) if nd else ()
        dims = (dims,) if nd == 1 else tuple(dims)
        t, off = r.take("IQ", what)
        infos.append((name, tuple(reversed(dims)), t, off))
    base = r.pos + (-r.pos % alignment)
    arrays: dict = {}

    def insert(key: str, value: Any) -> None:
        if key in arrays:  # MLX prints the first array where the name belongs
            raise RuntimeError(f"[load_gguf] Duplicate parameter name {key} this can happend "
                               "when loading quantized tensors.")
        arrays[key] = value

    for name, shape, t, off in infos:
        if t not in quants.BLOCKS:
            raise ValueError(f"[load_gguf] Unsupported tensor type {t}.")
        n = int(np.prod(shape, dtype=object))
        start, nbytes = base + off, quants.nbytes(t, n)
        # mlx/io/gguf.cpp check_tensor_in_file
        if start >= 2**64:
            raise _tensor_error(name, "has a data offset that overflows the data section")
        if start > len(r.data):
            raise _tensor_error(name, "has a data offset past the end of the file")
        if nbytes > len(r.data) - start:
            raise _tensor_error(name, "extends past the end of the file")
        if any(d >= 2**31 for d in shape):  # MLX's Shape is int32
            raise RuntimeError(f"[load_gguf] Tensor '{name}' dimensions {list(reversed(shape))} "
                               f"are outside the int32 range in {where}")
        dt = _TENSOR_DTYPES.get(t)
        if dt is not None:
            host = np.frombuffer(r.data, dt.np, n, start)
            insert(name, array(host.reshape(shape).copy(), dt))
        elif t in quants.AFFINE:  # mlx/io/gguf_quants.cpp gguf_load_quantized
            if not shape or shape[-1] % 32:
                raise RuntimeError(f"[load_gguf] tensor {name}has incompatible last dim shape: "
                                   f"{shape[-1] if shape else 1}")
            weight, scales, biases = quants.affine(r.data, start, t, shape)
            # the prefix drops ".weight" (MLX drops any 7 characters; a shorter name is kept)
            prefix = name[:-7] if len(name) >= 7 else name
            insert(name, array(weight, _dt.uint32))
            insert(prefix + ".scales", array(scales, _dt.float16))
            insert(prefix + ".biases", array(biases, _dt.float16))
        else:
            insert(name, array(quants.to_f16(r.data, start, t, n).reshape(shape), _dt.float16))
    return arrays, meta
