"""A mutation fuzzer for mx.load's readers (.npy, .npz, .safetensors, .gguf): valid files
written by independent writers (numpy, the ``safetensors`` package) or by mx.save_gguf, then
truncated at any byte, overwritten, given extreme header fields (counts, lengths, offsets,
dimensions) or mutated headers. Each file either loads the same arrays as an independent
reader (numpy; the ``safetensors`` package; the ``gguf`` package) or raises a clear error:
a RuntimeError / ValueError whose message starts with MLX's bracket, never a raw Python error
and never a wrong array.

``make test`` runs a sample; ``make test-fuzz`` sets TAPESCOPE_READER_FUZZ_EXAMPLES (thousands
per format).
"""

from __future__ import annotations

import io
import json
import os
import struct
import tempfile
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapescope.core as mx

EXAMPLES = int(os.environ.get("TAPESCOPE_READER_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
DIR = tempfile.mkdtemp(prefix="tapescope-reader-fuzz-")
# header fields set to these (as 1, 2, 4 or 8 little-endian bytes): zero, small, the int32 /
# uint32 / int64 / uint64 edges, "all ones"
EXTREMES = [0, 1, 2, 3, 7, 8, 9, 31, 32, 33, 255, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1,
            2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def _clear(e: BaseException) -> bool:
    return type(e) in (RuntimeError, ValueError) and str(e).startswith("[")


def _canon(x: np.ndarray) -> tuple:
    """(shape, dtype, bytes) of an array, independent of byte order and of how bfloat16 and
    bool are held (numpy: V2, any nonzero byte)."""
    x = np.ascontiguousarray(x)
    if x.dtype.kind == "b":
        x = x.view(np.uint8) != 0
    elif x.dtype.kind == "V":
        x = x.view(np.uint16)
    elif x.dtype.byteorder == ">":
        x = x.astype(x.dtype.newbyteorder("="))
    return x.shape, x.dtype.str, x.tobytes()


def _ours(a) -> tuple:
    if a.dtype == mx.bfloat16:  # numpy has no bfloat16 buffer format: its raw two bytes
        a = mx.view(a, mx.uint16)
    return _canon(np.array(a))


def _load(data: bytes, fmt: str):
    """mx.load of ``data`` (as a file), evaluated (a path's arrays are read at eval, where a
    short data section raises, as in MLX): (result, None), or (None, the clear error); a
    raw Python error fails the test."""
    path = os.path.join(DIR, "case." + fmt)
    with open(path, "wb") as f:
        f.write(data)
    try:
        got = mx.load(path, format=fmt, return_metadata=fmt in ("safetensors", "gguf"))
        mx.eval(got)
        return got, path
    except Exception as e:  # noqa: BLE001
        assert _clear(e), f"raw error {type(e).__name__}: {e}"
        return None, path


def _mutate(draw, seed: bytes, fields: list) -> bytes:
    """One mutation of ``seed``: a truncation, an overwritten byte run, an extreme value in a
    header field (``fields``: where the format's fields start) or inserted bytes."""
    b = bytearray(seed)
    kind = draw(st.sampled_from(["truncate", "overwrite", "field", "field", "insert"]))
    anywhere = st.integers(0, max(len(b) - 1, 0))
    if kind == "truncate":
        if draw(st.booleans()):  # at a field's start, one byte before or after it
            cut = draw(st.sampled_from(fields + [len(b) - 1])) + draw(st.integers(-1, 1))
        else:
            cut = draw(anywhere)
        return bytes(b[:max(cut, 0)])
    if kind == "overwrite":
        p = draw(anywhere)
        run = draw(st.binary(min_size=1, max_size=8))
        b[p:p + len(run)] = run
        return bytes(b)
    if kind == "insert":
        p = draw(anywhere)
        b[p:p] = draw(st.binary(min_size=1, max_size=16))
        return bytes(b)
    p = draw(st.sampled_from(fields) if fields else anywhere)
    width = draw(st.sampled_from([8, 4, 2, 1]))
    v = draw(st.sampled_from(EXTREMES) | st.integers(0, 2**64 - 1) |
             st.integers(0, len(b) + 64)) % 2**(8 * width)
    if draw(st.booleans()) and width == 8:
        v = (len(b) - p + draw(st.integers(-16, 16))) % 2**64  # lengths near the file's end
    b[p:p + width] = v.to_bytes(width, "little")
    return bytes(b)


# -- npy / npz: numpy writes, numpy reads -----------------------------------------------------
NPY_DTYPES = ["<f4", ">f4", "<f8", ">f8", "<f2", "<i2", ">i8", "<u4", "|u1", "|i1", "|b1",
              "<c8", ">c8", "|V2", "<c16", "<U2", "<i8", ">u2"]


@st.composite
def npy_arrays(draw) -> np.ndarray:
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    dt = np.dtype(draw(st.sampled_from(NPY_DTYPES)))
    raw = draw(st.binary(min_size=int(np.prod(shape)) * dt.itemsize,
                         max_size=int(np.prod(shape)) * dt.itemsize))
    a = np.frombuffer(raw, dt).reshape(shape) if dt.kind != "U" else \
        np.full(shape, "ab", dtype=dt)
    return np.asfortranarray(a) if draw(st.booleans()) else a


def _npy_fields(seed: bytes) -> list:
    n = int.from_bytes(seed[8:10], "little")
    text = seed[10:10 + n]
    starts = [0, 6, 7, 8, 9, 10, 10 + n]
    for word in (b"descr", b"fortran_order", b"shape", b"(", b")"):
        i = text.find(word)
        if i >= 0:
            starts += [10 + i, 10 + i + len(word) + 2]
    return starts


@st.composite
def npy_headers(draw) -> bytes:
    """A file whose header dict is rewritten: an odd shape, descr or fortran_order, the
    header length right or not."""
    shape = draw(st.lists(st.sampled_from([0, 1, 2, 3, -1, -4, 2**31, 2**40, 2**63]) |
                          st.integers(-3, 5), max_size=3))
    descr = draw(st.sampled_from(NPY_DTYPES + ["<f16", "|O", ">V2", "<q", "x", "<f3"]))
    order = draw(st.sampled_from(["False", "True", "0", "'x'"]))
    shape_text = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    if draw(st.booleans()):
        shape_text = draw(st.sampled_from(["[2]", "(2.0,)", "'2'", "(True,)", "None", "((1,),)"]))
    h = f"{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape_text}, }}"
    h += " " * (-(10 + len(h) + 1) % 64) + "\n"
    n = len(h) + draw(st.sampled_from([0, 0, 0, -1, 1, 100]))
    data = draw(st.binary(max_size=64))
    return b"\x93NUMPY\x01\x00" + (n % 2**16).to_bytes(2, "little") + h.encode("latin1") + data


def _check_npy(data: bytes) -> None:
    got, path = _load(data, "npy")
    if got is None:
        return
    want = np.load(path, allow_pickle=False)  # it loaded here: numpy must load it too
    assert _ours(got) == _canon(want)


@FUZZ
@given(st.data())
def test_npy_mutations_load_as_numpy_or_raise_clearly(data):
    a = data.draw(npy_arrays())
    buf = io.BytesIO()
    np.save(buf, a)
    seed = buf.getvalue()
    if data.draw(st.integers(0, 4)) == 0:
        _check_npy(seed)
        return
    mutated = data.draw(npy_headers()) if data.draw(st.integers(0, 3)) == 0 else \
        _mutate(data.draw, seed, _npy_fields(seed))
    _check_npy(mutated)


def _check_npz(data: bytes) -> None:
    got, path = _load(data, "npz")
    if got is None:
        return
    # numpy's NpzFile on the archive (np.load would first sniff the magic: an archive with
    # bytes before it, which zipfile reads, is not "PK" there)
    with open(path, "rb") as f, np.lib.npyio.NpzFile(f, allow_pickle=False) as z:
        want = {k: z[k] for k in z.files}
    assert sorted(got) == sorted(want)
    for k in want:
        assert isinstance(want[k], np.ndarray), f"member {k!r} is not an npy array"
        assert _ours(got[k]) == _canon(want[k])


@FUZZ
@given(st.data())
def test_npz_mutations_load_as_numpy_or_raise_clearly(data):
    arrays = data.draw(st.lists(npy_arrays(), min_size=1, max_size=3))
    buf = io.BytesIO()
    compressed = data.draw(st.booleans())
    (np.savez_compressed if compressed else np.savez)(buf, *arrays)
    seed = buf.getvalue()
    # the local headers ("PK\3\4"), the central directory ("PK\1\2") and its end ("PK\5\6"):
    # their sizes, offsets and counts
    fields = []
    for sig, offs in ((b"PK\x03\x04", (14, 18, 22, 26, 28)),
                      (b"PK\x01\x02", (16, 20, 24, 28, 30, 42)),
                      (b"PK\x05\x06", (8, 10, 12, 16)),
                      (b"PK\x06\x06", (24, 32, 40, 48)), (b"\x01\x00", (4, 12))):
        i = seed.find(sig)
        while i >= 0:
            fields += [i + o for o in offs]
            i = seed.find(sig, i + 1)
    fields += [i for i in range(len(seed)) if seed.startswith(b"\x93NUMPY", i)]
    _check_npz(_mutate(data.draw, seed, fields))


# -- safetensors: the safetensors package writes and reads ------------------------------------
st_np = pytest.importorskip("safetensors.numpy")
ST_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I32": "<i4", "I64": "<i8", "U8": "|u1",
             "I8": "|i1", "U16": "<u2", "BOOL": "|b1", "U32": "<u4", "I16": "<i2", "U64": "<u8"}


@st.composite
def st_files(draw) -> bytes:
    names = draw(st.lists(st.sampled_from(["a", "b", "w.0", "z"]), min_size=0, max_size=3,
                          unique=True))
    arrays = {}
    for n in names:
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        dt = np.dtype(ST_DTYPES[draw(st.sampled_from(sorted(ST_DTYPES)))])
        raw = draw(st.binary(min_size=int(np.prod(shape)) * dt.itemsize,
                             max_size=int(np.prod(shape)) * dt.itemsize))
        arrays[n] = np.frombuffer(raw, dt).reshape(shape).copy() if dt.kind != "b" else \
            np.asarray(np.frombuffer(raw, np.uint8).reshape(shape) % 2, bool)
    meta = draw(st.none() | st.dictionaries(st.sampled_from(["k", "format"]), st.text(max_size=4)))
    return st_np.save(arrays, metadata=meta)


ODD = st.sampled_from([-1, -16, 0, 1, 3, 2**31, 2**32 + 4, 2**63, 2**64 - 8, 2**64, 1.0, 2.5,
                       "4", None, True, [1], {"a": 1}])


@st.composite
def st_headers(draw, seed: bytes) -> bytes:
    """The seed with one JSON field changed: an offset, a shape, a dtype, a missing key,
    odd metadata, or a header length that is off."""
    n = int.from_bytes(seed[:8], "little")
    try:
        header = json.loads(seed[8:8 + n])
    except ValueError:  # safetensors 0.8 writes '{},"__metadata__":{}}' for no tensors
        return seed
    names = sorted(k for k in header if k != "__metadata__")
    what = draw(st.sampled_from(["offset", "shape", "dtype", "drop", "meta", "entry", "length"]))
    if what == "meta" or not names:
        header["__metadata__"] = draw(st.sampled_from([{"k": 5}, ["x"], "s", 3, {"k": None},
                                                        {"k": "v"}, None]))
    elif what == "length":
        body = json.dumps(header).encode()
        return (len(body) + draw(st.integers(-3, 3))).to_bytes(8, "little") + body + \
            seed[8 + n:]
    else:
        info = header[draw(st.sampled_from(names))]
        if what == "offset":
            info["data_offsets"][draw(st.integers(0, 1))] = draw(
                ODD | st.integers(-64, 128) | st.integers(0, 2**66))
            if draw(st.booleans()):
                info["data_offsets"] = draw(st.lists(st.integers(0, 32), max_size=3))
        elif what == "shape":
            info["shape"] = draw(st.lists(ODD | st.integers(-3, 8), max_size=3))
        elif what == "dtype":
            info["dtype"] = draw(st.sampled_from(sorted(ST_DTYPES) + ["F99", "C64", "BF16",
                                                                      "F8_E4M3", 3, None]))
        elif what == "drop":
            del info[draw(st.sampled_from(sorted(info)))]
        else:
            header[draw(st.sampled_from(names))] = draw(ODD)
    body = json.dumps(header).encode()
    return len(body).to_bytes(8, "little") + body + seed[8 + n:]


def _plain_safetensors(data: bytes) -> tuple:
    """A plain decode of the format (a JSON header, then each tensor's bytes at its offsets):
    for files the safetensors package refuses for its stricter layout (overlapping or unused
    bytes), which MLX loads."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        dt = np.dtype({**ST_DTYPES, "BF16": "<V2", "C64": "<c8", "F8_E4M3": "|u1",
                       "F8_E8M0": "|u1"}[info["dtype"]])
        lo, hi = info["data_offsets"]
        assert 0 <= lo <= hi <= len(data) - base
        out[name] = np.frombuffer(data[base + lo:base + hi], dt).reshape(info["shape"])
    return out, meta


def _check_safetensors(data: bytes) -> None:
    got, path = _load(data, "safetensors")
    if got is None:
        return
    arrays, meta = got
    try:
        want = st_np.load(data)
        from safetensors import safe_open

        with safe_open(path, "np") as f:
            want_meta = f.metadata() or {}
    except Exception:  # noqa: BLE001  (its stricter layout rules)
        want, want_meta = _plain_safetensors(data)
    assert sorted(arrays) == sorted(want) and meta == want_meta
    for k in want:
        assert _ours(arrays[k]) == _canon(want[k])


@FUZZ
@given(st.data())
def test_safetensors_mutations_load_as_the_safetensors_package_or_raise_clearly(data):
    seed = data.draw(st_files())
    n = int.from_bytes(seed[:8], "little")
    if data.draw(st.booleans()):
        mutated = data.draw(st_headers(seed))
    else:  # the length field, the header's first and last bytes, the data's start
        mutated = _mutate(data.draw, seed, [0, 4, 8, 9, 8 + n - 1, 8 + n])
    _check_safetensors(mutated)


# -- gguf: mx.save_gguf writes, the gguf package reads ----------------------------------------
GGUF_DTYPES = ["float32", "float16", "int8", "int16", "int32"]


@st.composite
def gguf_files(draw) -> bytes:
    arrays = {}
    for i in range(draw(st.integers(0, 3))):
        shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
        dt = getattr(mx, draw(st.sampled_from(GGUF_DTYPES)))
        arrays[f"t{i}"] = (mx.arange(int(np.prod(shape))) - 2).reshape(shape).astype(dt)
    meta = {}
    for k in draw(st.lists(st.sampled_from(["s", "l", "v", "f", "u"]), unique=True, max_size=3)):
        meta[k] = {"s": "text", "l": ["a", "bc"], "v": mx.array([1, 2, 3], mx.int32),
                   "f": mx.array(1.5), "u": mx.array(7, mx.uint8)}[k]
    if draw(st.booleans()):
        meta["general.alignment"] = mx.array(draw(st.sampled_from([32, 8, 64, 1])), mx.uint32)
    path = os.path.join(DIR, "seed")
    mx.save_gguf(path, arrays, meta)
    with open(path + ".gguf", "rb") as f:
        return f.read()


def _gguf_fields(b: bytes) -> list:
    """Where the seed's fields start: version, counts, each key's length, type and value
    (an array's type and count), each tensor's name length, ndim, dims, type and offset."""
    q = lambda p: struct.unpack_from("<Q", b, p)[0]  # noqa: E731
    i = lambda p: struct.unpack_from("<I", b, p)[0]  # noqa: E731
    fields = [4, 8, 16]
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string(p):  # a string's length field, then past it
        fields.append(p)
        return p + 8 + q(p)

    pos = 24
    for _ in range(q(16)):
        pos = string(pos)
        t = i(pos)
        fields += [pos, pos + 4]
        pos += 4
        if t == 8:
            pos = string(pos)
        elif t == 9:
            et, n = i(pos), q(pos + 4)
            fields.append(pos + 4)
            pos += 12
            for _ in range(n):
                pos = string(pos) if et == 8 else pos + size[et]
        else:
            pos += size[t]
    for _ in range(q(8)):
        pos = string(pos)
        nd = i(pos)
        fields += [pos] + [pos + 4 + 8 * k for k in range(nd)]
        pos += 4 + 8 * nd
        fields += [pos, pos + 4]
        pos += 12
    return fields + [pos]


def _check_gguf(data: bytes) -> None:
    got, path = _load(data, "gguf")
    if got is None:
        return
    from gguf import GGUFReader

    arrays, meta = got
    # it loaded here: every count and length is within the file, so the reference (which
    # loops over counts unchecked) ends
    reader = GGUFReader(path)
    want = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert sorted(arrays) == sorted(want)
    for k in want:
        assert _ours(arrays[k]) == _canon(want[k])
    assert sorted(meta) == sorted(k for k in reader.fields if not k.startswith("GGUF."))


@FUZZ
@given(st.data())
def test_gguf_mutations_load_as_the_gguf_package_or_raise_clearly(data):
    pytest.importorskip("gguf")
    seed = data.draw(gguf_files())
    _check_gguf(_mutate(data.draw, seed, _gguf_fields(seed)))


def test_unmutated_seeds_load_as_the_references():
    """The oracle itself: valid files of each kind load, and as their references read them."""
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    buf = io.BytesIO()
    np.save(buf, a)
    got, _ = _load(buf.getvalue(), "npy")
    assert got is not None and _ours(got) == _canon(a)
    seed = st_np.save({"x": np.arange(4, dtype=np.int32)}, metadata={"k": "v"})
    (arrays, meta), _ = _load(seed, "safetensors")
    assert meta == {"k": "v"} and _ours(arrays["x"]) == _canon(np.arange(4, dtype=np.int32))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        with z.open("y.npy", "w") as m:
            np.lib.format.write_array(m, np.ones(3, np.int16))
    got, _ = _load(buf.getvalue(), "npz")
    assert list(got) == ["y"] and _ours(got["y"]) == _canon(np.ones(3, np.int16))
