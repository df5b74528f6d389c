"""Saving and loading arrays: ``mx.save`` / ``savez`` / ``savez_compressed`` (numpy's .npy and
.npz, written by numpy), ``mx.save_safetensors`` and ``mx.load`` (MLX's mlx/io/load.cpp and
mlx/io/safetensors.cpp; safetensors is a JSON header and raw bytes, written here as MLX does;
GGUF is core/gguf.py).
"""

from __future__ import annotations

import io
import json
import math
import os
import pathlib
import struct
import zipfile
import zlib
from typing import Any, Optional, Union

import numpy as np

from . import dtypes as _dt
from .array import array
from .device import Stream, StreamOrDevice, cpu, incompatible, resolve_stream
from .file_reader import FileReader, PyFileReader, ZipMemberReader
from .primitive import Primitive

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
# read, never written: MLX loads the fp8 types as their raw bytes
_ST_LOAD_ONLY = {"F8_E4M3": _dt.uint8, "F8_E8M0": _dt.uint8}


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
    """Load array(s) from a binary file (``.npy``, ``.npz``, ``.safetensors`` or ``.gguf``).
    Every reader checks the file's lengths, counts, shapes and offsets before it allocates or
    slices: a malformed file raises a bracketed error, never loads. As in MLX
    (mlx/io/load.cpp, python/src/load.cpp), a ``.npy``, ``.npz`` or ``.safetensors`` path
    gives arrays not yet read: each is a ``Load`` of its bytes, run at eval on ``stream``
    (the CPU's unless CUDA is available), where a short read raises; a file object's arrays
    are read before this returns. GGUF is read whole, as MLX reads it (core/gguf.py)."""
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
    s = _load_stream(stream)
    with _open(file, "rb") as f:
        if format == "npy":
            return _owned(_load_npy(f, file, _size(f), _reader(file, f), s), file)
        if format == "npz":
            return _load_npz(f, file, s)
        if format == "gguf":
            from .gguf import load_gguf

            arrays, meta = load_gguf(f, file)
        else:
            arrays, meta = _load_safetensors(f, file, s)
            arrays = _owned(arrays, file)
    return (arrays, meta) if return_metadata else arrays


def _load_stream(stream: StreamOrDevice) -> Stream:
    """Where a Load runs: ``stream``, else the CPU's unless CUDA is available (MLX's
    ``cu::is_available() ? to_stream(s) : to_stream(s, Device::cpu)``)."""
    from .cuda import is_available

    return resolve_stream(stream if stream is not None or is_available() else cpu)


def _reader(file: FileLike, f: Any) -> Any:
    """The reader a load's arrays read through: the path's own descriptor (kept open by
    the arrays until they are read), or the file object."""
    if isinstance(file, (str, pathlib.Path)):
        return FileReader(str(file))
    return PyFileReader(f)


def _owned(arrays: Any, file: FileLike) -> Any:
    """A file object is not ours to keep: its arrays are read now (MLX: "If we don't own
    the stream and it was passed to us, eval immediately")."""
    if not isinstance(file, (str, pathlib.Path)):
        from .eval_api import eval as _eval

        _eval(arrays)
    return arrays


def _lazy(reader: Any, offset: int, shape: tuple, dt: _dt.Dtype, swap: bool,
          stream: Stream) -> array:
    """An array whose ``shape`` x ``dt`` bytes ``reader`` gives at ``offset``, when evaluated
    (MLX's ``Load``; its rule in kernels/rules/load.py)."""
    shape = tuple(int(d) for d in shape)
    prim = Primitive("Load", stream, reader=reader, offset=offset, shape=shape, dtype=dt.np,
                     swap=swap)
    return array._make1(shape, dt, prim, [])


# -- reading: sizes, short reads, labels -----------------------------------------------------
def label(file: FileLike) -> str:
    """How MLX's readers name the source in errors (``io::Reader::label``)."""
    return f"file {file}" if isinstance(file, (str, pathlib.Path)) else "python file object"


def _size(f: Any) -> Optional[int]:
    """Bytes left from the current position, or None for a stream that cannot seek."""
    try:
        if not f.seekable():
            return None
        pos = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(pos)
        return end - pos
    except (AttributeError, OSError, ValueError):
        return None


def _short(file: FileLike, missing: Optional[int] = None) -> RuntimeError:
    """MLX's error for a read past the end (``ParallelFileReader`` / ``PyFileReader``)."""
    if not isinstance(file, (str, pathlib.Path)):
        return RuntimeError("[load] Failed to read from python stream")
    if missing is None:
        return RuntimeError("[read] Unable to read from file.")
    return RuntimeError(f"[read] Unable to read {missing} bytes from file.")


_CHUNK = 1 << 24


def _read(f: Any, n: int, left: Optional[int]) -> bytes:
    """Up to ``n`` bytes; with ``left`` unknown (a stream, a zip member whose sizes may lie)
    in chunks, so a claimed length never allocates more than the data there is."""
    if left is not None:
        return f.read(min(n, left))
    parts, got = [], 0
    while got < n:
        part = f.read(min(_CHUNK, n - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


# -- .npy / .npz --------------------------------------------------------------------------
_NPY_MAGIC = b"\x93NUMPY"
# numpy kinds and item sizes MLX reads (mlx/io/load.cpp dtype_from_array_protocol); V2 is
# its bfloat16
_NPY_KINDS = {("b", 1), ("i", 1), ("i", 2), ("i", 4), ("i", 8), ("u", 1), ("u", 2), ("u", 4),
              ("u", 8), ("f", 2), ("f", 4), ("f", 8), ("c", 8), ("V", 2)}


def _load_npy(f: Any, file: FileLike, left: Optional[int], reader: Any,
              stream: Stream) -> array:
    """One ``.npy`` array: its header parsed by numpy and checked; its data a ``Load`` at
    the header's end through ``reader`` (a data section shorter than the shape says raises
    when the array is evaluated, as in MLX)."""
    start = 0 if isinstance(reader, FileReader) else f.tell()
    where = label(file)
    head = _read(f, 8, left)
    if len(head) < 8:
        raise _short(file, 8 - len(head))
    if head[:6] != _NPY_MAGIC:
        raise RuntimeError(f"[load] Invalid header in {where}")
    version = head[6]
    if version not in (1, 2) or head[7] != 0:  # MLX reads any minor version; numpy none but 0
        raise RuntimeError(f"[load] Unsupported npy format version in {where}")
    width = 2 if version == 1 else 4
    raw = _read(f, width, None if left is None else left - 8)
    if len(raw) < width:
        raise _short(file, width - len(raw))
    n = int.from_bytes(raw, "little")
    used = 8 + width
    text = _read(f, n, None if left is None else left - used)
    if len(text) < n:
        raise _short(file, n - len(text))
    used += n
    try:  # numpy's own parser: a literal dict with descr, fortran_order and shape
        hdr = np.lib.format.read_array_header_1_0 if version == 1 else \
            np.lib.format.read_array_header_2_0
        shape, fortran, dtype = hdr(io.BytesIO(raw + text), max_header_size=n + 1)
    except Exception:  # noqa: BLE001  numpy's parse of untrusted text raises many kinds
        # (ValueError, SyntaxError, tokenize.TokenError, RecursionError, ...)
        raise RuntimeError(f"[load] Invalid header in {where}") from None
    if (dtype.kind, dtype.itemsize) not in _NPY_KINDS or dtype.fields is not None or \
            dtype.subdtype is not None:
        # MLX reads three characters of the descr (``header.substr(11, 3)``): '<c16' -> '<c1'
        descr = np.lib.format.dtype_to_descr(dtype)
        raise ValueError("[from_str] Unsupported array protocol type-string: "
                         f"{(str(descr) + chr(39))[:3]}")
    if any(isinstance(d, bool) for d in shape):  # numpy's parser takes True as 1; MLX's stoi fails
        raise RuntimeError(f"[load] Invalid header in {where}")
    if any(d < 0 for d in shape):
        raise RuntimeError(f"[load] Negative dimension in shape in {where}")
    if any(d >= 2**31 for d in shape):  # MLX: std::stoi's out_of_range escapes as IndexError
        raise RuntimeError(f"[load] Dimension outside the int32 range in shape {shape} in {where}")
    if dtype.kind == "V":  # MLX saves bfloat16 as two raw bytes
        dt = _dt.bfloat16
    else:
        dt = _dt.from_numpy(dtype.newbyteorder("="))
    swap = dtype.byteorder == ">"  # MLX swaps big-endian data at eval
    if fortran:  # MLX reads the reversed shape and transposes it
        a = _lazy(reader, start + used, tuple(reversed(shape)), dt, swap, stream)
        from .ops.shape import transpose

        return transpose(a, stream=stream)
    return _lazy(reader, start + used, shape, dt, swap, stream)


# what zipfile raises on a damaged archive or member (a lying size, a bad CRC, a broken
# deflate stream, an odd header field)
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, struct.error,
               OverflowError, NotImplementedError, UnicodeDecodeError, IndexError, KeyError)


def _load_npz(f: Any, file: FileLike, stream: Stream) -> dict:
    """Every member of an ``.npz`` archive as an ``.npy`` array (named without ``.npy``):
    its header read now, its data a ``Load`` through the open member (python/src/load.cpp
    mlx_load_npz_helper); a file object's arrays are read before this returns. zipfile
    checks a member's CRC once it is read to its end: a damaged member raises at eval."""
    from .eval_api import eval as _eval

    own = isinstance(file, (str, pathlib.Path))
    try:  # a path: the archive's own descriptor, kept open by the members until they are read
        z = zipfile.ZipFile(str(file) if own else f)
        infos = z.infolist()
    except _ZIP_ERRORS:
        raise ValueError("[load_npz] Input must be a zip file or a file-like object that can be "
                         "opened with zipfile.ZipFile") from None
    out = {}
    where = label(file)
    with z:
        for info in infos:
            name = info.filename
            try:
                member = z.open(info)
                reader = ZipMemberReader(member, name, where, _ZIP_ERRORS)
                # a member's sizes come from the archive (which may lie): read in chunks
                arr = _load_npy(member, member, None, reader, stream)
                if not own:
                    _eval(arr)
            except _ZIP_ERRORS as e:
                if type(e) in (RuntimeError, ValueError) and str(e).startswith("["):
                    raise  # the member's own npy error
                raise RuntimeError(f"[load_npz] Corrupt member '{name}' in {where}: {e}") \
                    from None
            out[name[:-4] if name.endswith(".npy") else name] = arr
    return out


# -- .safetensors -------------------------------------------------------------------------
_ST_MAX_HEADER = 100_000_000  # the Rust safetensors limit (mlx/io/safetensors.cpp)
_U64 = 2**64


def _int32(d: int) -> int:
    """``d`` as MLX's ``Shape`` (int32) holds it after nlohmann's conversion."""
    return (d + 2**31) % 2**32 - 2**31


def _st_ints(value: Any, name: str, field: str, where: str) -> list:
    """A header list of integers (integral floats pass, as nlohmann converts them)."""
    if isinstance(value, list) and all(
            (isinstance(v, int) and not isinstance(v, bool)) or
            (isinstance(v, float) and v.is_integer()) for v in value):
        return [int(v) for v in value]
    # MLX: nlohmann's ``type must be array`` / ``number`` (a raw json exception)
    raise RuntimeError(f"[load_safetensors] Tensor '{name}' {field} must be a list of integers "
                       f"in {where}, got {json.dumps(value)[:80]}")


def _load_safetensors(f: Any, file: FileLike, stream: Stream) -> tuple[dict, dict]:
    """(arrays, metadata): the header parsed and every tensor's offsets checked against the
    file; each tensor a ``Load`` of its bytes."""
    where = label(file)
    start = 0 if isinstance(file, (str, pathlib.Path)) else f.tell()
    left = _size(f)
    raw = f.read(8)
    if len(raw) < 8:
        raise _short(file, 8 - len(raw))
    n = int.from_bytes(raw, "little")
    if n == 0 or n >= _ST_MAX_HEADER:
        raise RuntimeError(f"[load_safetensors] Invalid json header length {where}")
    body = f.read(n) if left is not None and left >= n + 8 else b""
    if len(body) < n:
        size = left if left is not None else 8 + len(body) + len(f.read())
        raise RuntimeError(f"[load_safetensors] The JSON header is {n} bytes long but the file "
                           f"is only {size} bytes. Perhaps an incomplete download or corrupt file?")
    try:
        header = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        # MLX: nlohmann's parse_error, or a UnicodeDecodeError from the keys
        raise RuntimeError(f"[load_safetensors] Invalid json header in {where}: {e}") from None
    if not isinstance(header, dict):
        raise RuntimeError(f"[load_safetensors] Invalid json metadata {where}")
    data = None
    if left is None:  # a stream that cannot seek: its data is read to know its size
        data = f.read()
        left = 8 + n + len(data)
    meta: dict = {}
    tensors = []
    # nlohmann's object is a std::map: MLX checks the entries in key order
    for name in sorted(header):
        info = header[name]
        if name == "__metadata__":
            if info is None:
                continue
            # MLX: a list comes back keyed "0", "1", ...; a number, a raw json exception
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise RuntimeError("[load_safetensors] __metadata__ must map strings to strings "
                                   f"in {where}")
            meta = dict(info)
            continue
        if not isinstance(info, dict):
            raise RuntimeError(f"[load_safetensors] Tensor '{name}' is not a json object in "
                               f"{where}")
        for field in ("dtype", "shape", "data_offsets"):
            if field not in info:
                raise RuntimeError(f"[load_safetensors] Tensor '{name}' has no '{field}' in "
                                   f"{where}")
        if not isinstance(info["dtype"], str):
            raise RuntimeError(f"[load_safetensors] Tensor '{name}' dtype must be a string in "
                               f"{where}")
        shape = _st_ints(info["shape"], name, "shape", where)
        offsets = _st_ints(info["data_offsets"], name, "data_offsets", where)
        dt = _ST_DTYPES.get(info["dtype"]) or _ST_LOAD_ONLY.get(info["dtype"])
        if dt is None:
            raise RuntimeError(f"[safetensor] unsupported dtype {info['dtype']}")
        if len(offsets) != 2:
            raise RuntimeError(f"[load_safetensors] Tensor '{name}' data_offsets must have exactly "
                               f"2 entries but has {len(offsets)}")
        lo, hi = offsets
        itemsize = dt.np.itemsize
        # MLX's checks, in its C++ types (size_t offsets, int32 dimensions), then the same
        # checks on the true values, which its 64-bit wrap-around can let through
        want = itemsize
        for d in shape:
            want = want * (_int32(d) % _U64) % _U64
        if hi % _U64 < lo % _U64 or hi % _U64 - lo % _U64 != want:
            raise _st_offsets(name, lo % _U64, hi % _U64, want)
        if (8 + n + hi % _U64) % _U64 > left:
            raise _st_past(name, lo % _U64, hi % _U64)
        if any(not 0 <= d < 2**31 for d in shape):
            raise RuntimeError(f"[load_safetensors] Tensor '{name}' shape {shape} has a dimension "
                               f"outside [0, 2147483647] in {where}")
        if lo < 0 or hi - lo != itemsize * math.prod(shape):
            raise _st_offsets(name, lo, hi, itemsize * math.prod(shape))
        if 8 + n + hi > left:
            raise _st_past(name, lo, hi)
        tensors.append((name, dt, shape, lo))
    if data is not None:  # a stream that cannot seek: its data, read above
        reader, base = PyFileReader(io.BytesIO(data)), 0
    else:
        reader, base = _reader(file, f), start + 8 + n
    arrays = {name: _lazy(reader, base + lo, shape, dt, False, stream)
              for name, dt, shape, lo in tensors}
    return arrays, meta


def _st_offsets(name: str, lo: int, hi: int, want: int) -> RuntimeError:
    return RuntimeError(f"[load_safetensors] Tensor '{name}' invalid data offsets ({lo}, {hi}). "
                        f"Expecting {want} bytes.")


def _st_past(name: str, lo: int, hi: int) -> RuntimeError:
    return RuntimeError(f"[load_safetensors] Tensor '{name}' invalid data offsets ({lo}, {hi}) "
                        "exceeding the size of the file. Perhaps an incomplete download or "
                        "corrupt file?")


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
