"""Saving and loading arrays: ``mx.save`` / ``savez`` / ``savez_compressed`` (numpy's .npy and
.npz, written by numpy), ``mx.save_safetensors`` and ``mx.load`` (MLX's mlx/io/load.cpp and
mlx/io/safetensors.cpp; safetensors is a JSON header and raw bytes, written here as MLX does;
GGUF is core/gguf.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import zipfile
from typing import Any, Optional, Union

import numpy as np

from . import dtypes as _dt
from .array import array
from .device import StreamOrDevice, incompatible

FileLike = Union[str, pathlib.Path, Any]

_SAVE_SIG = "save(file: file | str | pathlib.Path, arr: array) -> None"
_LOAD_SIG = ("load(file: file | str | pathlib.Path, /, format: str | None = None, return_metadata: "
             "bool = False, *, stream: StreamOrDevice = None) -> array | dict[str, array] | "
             "tuple[dict[str, array], dict[str, Any]]")
_ST_SIG = ("save_safetensors(file: file | str | pathlib.Path, arrays: dict[str, array], "
           "metadata: dict[str, str] | None = None)")

# safetensors dtype names (mlx/io/safetensors.cpp); MLX writes no float64
_ST_NAMES = {_dt.bool_: "BOOL", _dt.uint8: "U8", _dt.uint16: "U16", _dt.uint32: "U32",
             _dt.uint64: "U64", _dt.int8: "I8", _dt.int16: "I16", _dt.int32: "I32",
             _dt.int64: "I64", _dt.float16: "F16", _dt.bfloat16: "BF16", _dt.float32: "F32",
             _dt.complex64: "C64"}
_ST_DTYPES = {v: k for k, v in _ST_NAMES.items()}


def _path(file: FileLike, ext: str) -> Any:
    """A path with ``ext`` appended when it lacks it (MLX's rule); file objects as they are."""
    if isinstance(file, pathlib.Path):
        file = str(file)
    if isinstance(file, str):
        return file if file.endswith(ext) else file + ext
    return file


def _host(a: array) -> np.ndarray:
    """The array's data for writing: bfloat16 as its raw two bytes (numpy descr ``<V2``)."""
    data = np.asarray(a._numpy())
    if a.dtype == _dt.bfloat16:
        data = data.view(np.dtype("V2"))
    return data


def _from_host(data: np.ndarray) -> array:
    if data.dtype == np.dtype("V2"):  # MLX saves bfloat16 as two raw bytes
        return array(np.array(data, order="C").view(_dt.bfloat16.np), _dt.bfloat16)
    return array(np.array(data, order="C"), _dt.from_numpy(data.dtype))


def save(file: FileLike, arr: array) -> None:
    """Save the array to a binary file in ``.npy`` format."""
    if not isinstance(arr, array):
        raise incompatible("save", _SAVE_SIG, file, arr)
    with _open(_path(file, ".npy"), "wb") as f:
        np.lib.format.write_array(f, _host(arr), allow_pickle=False)


def savez(file: FileLike, *args: array, **kwargs: array) -> None:
    """Save several arrays to a binary file in uncompressed ``.npz`` format."""
    _savez(file, args, kwargs, zipfile.ZIP_STORED)


def savez_compressed(file: FileLike, *args: array, **kwargs: array) -> None:
    """Save several arrays to a binary file in compressed ``.npz`` format."""
    _savez(file, args, kwargs, zipfile.ZIP_DEFLATED)


def _savez(file: FileLike, args: tuple, kwargs: dict, compression: int) -> None:
    named = dict(kwargs)
    for i, a in enumerate(args):
        if f"arr_{i}" in named:
            raise ValueError(f"[savez] Cannot use un-named variables and keyword arr_{i}")
        named[f"arr_{i}"] = a
    with _open(_path(file, ".npz"), "wb") as f, zipfile.ZipFile(f, "w", compression) as z:
        for name, a in named.items():
            if not isinstance(a, array):
                a = array(a)
            with z.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, _host(a), allow_pickle=False)


def save_safetensors(file: FileLike, arrays: dict, metadata: Optional[dict] = None) -> None:
    """Save arrays to a binary file in ``.safetensors`` format."""
    if not isinstance(arrays, dict) or not all(isinstance(v, array) for v in arrays.values()):
        raise incompatible("save_safetensors", _ST_SIG, file, arrays,
                           *(() if metadata is None else (metadata,)))
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise ValueError("[save_safetensors] Metadata must be a dictionary with string keys and values")
    header: dict = {"__metadata__": metadata or None}
    blobs, offset = [], 0
    for name in sorted(arrays):
        a = arrays[name]
        if a.dtype not in _ST_NAMES:
            raise RuntimeError("[save_safetensors] received invalid dtype.")
        blob = np.ascontiguousarray(_host(a)).tobytes()
        header[name] = {"data_offsets": [offset, offset + len(blob)], "dtype": _ST_NAMES[a.dtype],
                        "shape": list(a.shape)}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    with _open(_path(file, ".safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load(file: FileLike, /, format: Optional[str] = None, return_metadata: bool = False, *,
         stream: StreamOrDevice = None) -> Any:
    """Load array(s) from a binary file (``.npy``, ``.npz`` or ``.safetensors``)."""
    if format is None:
        name = str(file) if isinstance(file, (str, pathlib.Path)) else file.name
        base = os.path.basename(name)
        if "." not in base:
            raise ValueError("[load] Could not infer file format from extension")
        format = base.rsplit(".", 1)[1]
    if format not in ("npy", "npz", "safetensors", "gguf"):
        raise ValueError(f"[load] Unknown file format {format}")
    if return_metadata and format in ("npy", "npz"):
        raise ValueError(f"[load] metadata not supported for format {format}")
    if isinstance(file, (str, pathlib.Path)) and not os.path.isfile(file):
        raise RuntimeError(f"[load] Failed to open file {file}")
    with _open(file, "rb") as f:
        if format == "npy":
            return _load_npy(f, file)
        if format == "npz":
            with zipfile.ZipFile(f) as z:
                return {n[:-4] if n.endswith(".npy") else n: _load_npy(z.open(n), file)
                        for n in z.namelist()}
        if format == "gguf":
            from .gguf import load_gguf

            arrays, meta = load_gguf(f, file)
        else:
            arrays, meta = _load_safetensors(f, file)
    return (arrays, meta) if return_metadata else arrays


def _load_npy(f: Any, file: FileLike) -> array:
    try:
        data = np.lib.format.read_array(f, allow_pickle=False)
    except ValueError:
        raise RuntimeError(f"[load] Invalid header in file {file}") from None
    return _from_host(data)


def _load_safetensors(f: Any, file: FileLike) -> tuple[dict, dict]:
    raw = f.read(8)
    n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
    body = f.read(n) if 0 < n < 2**40 else b""
    try:
        header = json.loads(body) if len(body) == n else None
    except (UnicodeDecodeError, ValueError):
        header = None
    if not isinstance(header, dict):
        raise RuntimeError(f"[load_safetensors] Invalid json header length file {file}")
    data = f.read()
    meta = header.pop("__metadata__", None) or {}
    arrays = {}
    for name, info in header.items():
        dt = _ST_DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"[safetensor] Unsupported dtype {info['dtype']}")
        lo, hi = info["data_offsets"]
        host = np.frombuffer(data[lo:hi], dtype=dt.np).reshape(info["shape"])
        arrays[name] = array(host.copy(), dt)
    return arrays, meta


class _open:
    """Open a path, or use a file object as it is (left open)."""

    def __init__(self, file: Any, mode: str):
        self.file, self.mode, self.f = file, mode, None

    def __enter__(self) -> Any:
        if isinstance(self.file, (str, pathlib.Path)):
            self.f = open(self.file, self.mode)
            return self.f
        return self.file

    def __exit__(self, *exc: Any) -> None:
        if self.f is not None:
            self.f.close()
