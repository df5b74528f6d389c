"""mx.save / savez / savez_compressed / save_safetensors / load: files written by tapescope load
in MLX and the other way round, every dtype, with MLX's names, extensions and errors."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from conftest import mlx_ref, requires_mlx
from mlx_compare import outcome

NAMES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
         "float16", "bfloat16", "float32", "float64", "complex64"]
shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3)


def _make(m, name, shape, transpose=False):
    n = int(np.prod(shape))
    x = m.reshape(m.arange(n) * 3 - 4, shape).astype(getattr(m, name))
    return m.transpose(x) if transpose else x


def _same(a, b):
    assert str(a.dtype) == str(b.dtype) and a.shape == b.shape
    np.testing.assert_array_equal(_host(a), _host(b))


def _host(x):
    """numpy data of a tapescope or MLX array (bfloat16 through float32, which numpy lacks)."""
    if "bfloat16" in str(x.dtype):
        x = x.astype(mx.float32 if isinstance(x, mx.array) else mlx_ref.float32)
    return np.array(x)


@requires_mlx
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(NAMES), shape=shapes, transpose=st.booleans(),
       ours_write=st.booleans())
def test_npy_written_by_one_loads_in_the_other(tmp_path, name, shape, transpose, ours_write):
    w, r = (mx, mlx_ref) if ours_write else (mlx_ref, mx)
    path = str(tmp_path / f"x_{name}")
    w.save(path, _make(w, name, shape, transpose))
    assert os.path.exists(path + ".npy")
    _same(r.load(path + ".npy"), _make(r, name, shape, transpose))


@requires_mlx
@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(NAMES), min_size=1, max_size=4), shape=shapes,
       compressed=st.booleans(), ours_write=st.booleans())
def test_npz_written_by_one_loads_in_the_other(tmp_path, names, shape, compressed, ours_write):
    w, r = (mx, mlx_ref) if ours_write else (mlx_ref, mx)
    path = str(tmp_path / "z")
    save = w.savez_compressed if compressed else w.savez
    save(path, _make(w, names[0], shape), **{f"k{i}": _make(w, n, shape) for i, n in enumerate(names)})
    got = r.load(path + ".npz")
    assert sorted(got) == sorted(["arr_0"] + [f"k{i}" for i in range(len(names))])
    _same(got["arr_0"], _make(r, names[0], shape))
    for i, n in enumerate(names):
        _same(got[f"k{i}"], _make(r, n, shape))


@requires_mlx
@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from([n for n in NAMES if n != "float64"]), min_size=1,
                      max_size=4), shape=shapes, meta=st.booleans(), ours_write=st.booleans())
def test_safetensors_written_by_one_loads_in_the_other(tmp_path, names, shape, meta, ours_write):
    w, r = (mx, mlx_ref) if ours_write else (mlx_ref, mx)
    path = str(tmp_path / "w")
    metadata = {"who": "test", "k": "v"} if meta else None
    w.save_safetensors(path, {f"t{i}": _make(w, n, shape, True) for i, n in enumerate(names)}, metadata)
    arrays, got_meta = r.load(path + ".safetensors", return_metadata=True)
    assert got_meta == (metadata or {})
    for i, n in enumerate(names):
        _same(arrays[f"t{i}"], _make(r, n, shape, True))


@requires_mlx
def test_safetensors_bytes_equal_mlx(tmp_path):
    arrays = lambda m: {"z": _make(m, "int32", [2, 3]), "a": _make(m, "bfloat16", [3])}  # noqa: E731
    mx.save_safetensors(str(tmp_path / "ours"), arrays(mx), {"k": "v"})
    mlx_ref.save_safetensors(str(tmp_path / "theirs"), arrays(mlx_ref), {"k": "v"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()


def test_file_objects_round_trip():
    buf = io.BytesIO()
    mx.save(buf, mx.array([1, 2, 3]))
    buf.seek(0)
    assert mx.load(buf, format="npy").tolist() == [1, 2, 3]
    assert np.load(io.BytesIO(buf.getvalue())).tolist() == [1, 2, 3]


@requires_mlx
@pytest.mark.parametrize("src", [
    "M.load(d + '/nonexist.npy')", "M.load(d + '/x.foo')", "M.load(d + '/x')",
    "M.load(d + '/x.npy', return_metadata=True)", "M.load(d + '/y.npz', format='npy')",
    "M.load(d + '/x.npy', format='safetensors')", "M.save(d + '/s', 3)",
    "M.save_safetensors(d + '/q', {'a': M.array([1.0], M.float64)})",
    "M.save_safetensors(d + '/q', {'a': M.array([1])}, {'k': 1})",
    "M.savez(d + '/q', M.array(1), arr_0=M.array(2))",
    "M.load(d + '/y.npz', return_metadata=True)",
])
def test_errors_match_mlx(tmp_path, src):
    d = str(tmp_path)
    mlx_ref.save(d + "/x.npy", mlx_ref.array([1, 2]))
    mlx_ref.savez(d + "/y.npz", mlx_ref.array([1, 2]))
    assert outcome(mx, src, d=lambda m: d) == outcome(mlx_ref, src, d=lambda m: d)


@requires_mlx
def test_extensions_appended_as_mlx(tmp_path):
    for m, sub in ((mx, "ours"), (mlx_ref, "theirs")):
        d = tmp_path / sub
        d.mkdir()
        m.save(str(d / "a.txt"), m.array([1]))
        m.savez(str(d / "b.bin"), m.array([1]))
        m.savez_compressed(str(d / "c.npz"), m.array([1]))
        m.save_safetensors(str(d / "e"), {"x": m.array([1])})
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs"))


# -- GGUF -----------------------------------------------------------------------------------
GGUF_NAMES = ["float32", "float16", "int8", "int16", "int32"]
META = {
    "s": lambda m: "text", "l": lambda m: ["a", "bc", ""], "f": lambda m: m.array(1.5),
    "v": lambda m: m.array([1, 2, 3], m.int32), "u": lambda m: m.array(3, m.uint8),
    "b": lambda m: m.array(True), "i": lambda m: m.array(-5, m.int64),
    "w": lambda m: m.array([7, 8], m.uint16),
}


@requires_mlx
@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(GGUF_NAMES), min_size=0, max_size=4),
       shape=st.lists(st.integers(1, 3), min_size=0, max_size=3),
       meta=st.lists(st.sampled_from(sorted(META)), unique=True, max_size=4),
       ours_write=st.booleans())
def test_gguf_written_by_one_loads_in_the_other(tmp_path, names, shape, meta, ours_write):
    w, r = (mx, mlx_ref) if ours_write else (mlx_ref, mx)
    path = str(tmp_path / "g")
    w.save_gguf(path, {f"t{i}": _make(w, n, shape, True) for i, n in enumerate(names)},
                {k: META[k](w) for k in meta})
    arrays, got_meta = r.load(path + ".gguf", return_metadata=True)
    assert sorted(arrays) == [f"t{i}" for i in range(len(names))]
    for i, n in enumerate(names):
        _same(arrays[f"t{i}"], _make(r, n, shape, True))
    assert sorted(got_meta) == sorted(meta)
    for k in meta:
        want = META[k](r)
        if isinstance(want, (str, list)):
            assert got_meta[k] == want
        else:
            _same(got_meta[k], want)


@requires_mlx
@pytest.mark.parametrize("src", [
    "M.save_gguf(d + '/q', {'a': M.ones((2,), M.bfloat16)}, {})",
    "M.save_gguf(d + '/q', {'a': M.ones((2,), M.uint8)}, {})",
    "M.save_gguf(d + '/q', {}, {'x': M.ones((2, 2))})",
    "M.save_gguf(d + '/q', {}, {'x': M.array([], M.int32)})",
    "M.save_gguf(d + '/q', {}, {'x': M.array(1.0, M.float64)})",
    "M.save_gguf(d + '/q', {}, {'x': M.array(1.0, M.bfloat16)})",
    "M.save_gguf(d + '/q', {}, {'x': 3})",
])
def test_gguf_errors_match_mlx(tmp_path, src):
    d = str(tmp_path)
    assert outcome(mx, src, d=lambda m: d) == outcome(mlx_ref, src, d=lambda m: d)


# -- malformed files: MLX's error where MLX checks, a clear one where it does not ------------
def _st(header, data=b"", raw=None):
    body = raw if raw is not None else __import__("json").dumps(header).encode()
    return len(body).to_bytes(8, "little") + body + data


_F4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
_D16 = bytes(range(16))
SAFETENSORS_BAD = {  # MLX raises a bracketed error for each
    "negative end": _st({"a": {**_F4, "shape": [3], "data_offsets": [0, -4]}}, _D16),
    "negative start": _st({"a": {**_F4, "data_offsets": [-16, 16]}}, _D16),
    "past the file": _st({"a": {**_F4, "shape": [250], "data_offsets": [0, 1000]}}, _D16),
    "negative shape": _st({"a": {**_F4, "shape": [-1]}}, _D16),
    "short shape": _st({"a": {**_F4, "shape": [3]}}, _D16),
    "reversed": _st({"a": {**_F4, "shape": [0], "data_offsets": [16, 0]}}, _D16),
    "huge dims": _st({"a": {**_F4, "shape": [2**40, 2**40]}}, _D16),
    "int32 overflow": _st({"a": {**_F4, "shape": [2**31]}}, _D16),
    "three offsets": _st({"a": {**_F4, "data_offsets": [0, 16, 3]}}, _D16),
    "unknown dtype": _st({"a": {**_F4, "dtype": "F99"}}, _D16),
    "float64": _st({"a": {**_F4, "dtype": "F64", "shape": [2]}}, _D16),
    "not an object": _st([1, 2]),
    "header past the file": (100).to_bytes(8, "little") + b"{}",
    "zero header": (0).to_bytes(8, "little"),
    "huge header": (2**62).to_bytes(8, "little") + b"{}",
    "short length": b"\1\0\0\0",
    "empty": b"",
}
SAFETENSORS_RAW_IN_MLX = {  # MLX: nlohmann's json exceptions ("[json.exception..."), or a
    # UnicodeDecodeError
    "metadata number": (_st({"__metadata__": {"k": 5}, "a": _F4}, _D16), "__metadata__"),
    "no data_offsets": (_st({"a": {"dtype": "F32", "shape": [4]}}, _D16), "'data_offsets'"),
    "no dtype": (_st({"a": {"shape": [4], "data_offsets": [0, 16]}}, _D16), "'dtype'"),
    "dtype number": (_st({"a": {**_F4, "dtype": 3}}, _D16), "dtype"),
    "shape string": (_st({"a": {**_F4, "shape": "4"}}, _D16), "shape"),
    "entry a list": (_st({"a": [1]}, _D16), "Tensor 'a'"),
    "truncated json": (_st(None, raw=b'{"a":'), "json header"),
    "trailing garbage": (_st(None, _D16, raw=b'{"a":{"dtype":"F32","shape":[4],"data_offsets":'
                                              b'[0,16]}}xx'), "json header"),
    "bad utf-8": (_st(None, raw=b'{"\xff":1}'), "json header"),
}


def _write(tmp_path, name, data):
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(data)
    return path


@requires_mlx
@pytest.mark.parametrize("case", sorted(SAFETENSORS_RAW_IN_MLX))
def test_malformed_safetensors_give_a_clear_error_where_mlx_gives_a_raw_one(tmp_path, case):
    data, field = SAFETENSORS_RAW_IN_MLX[case]
    path = _write(tmp_path, "x.safetensors", data)
    want = outcome(mlx_ref, "M.load(p)", p=lambda m: path)
    assert want is not None and not want[1].startswith(("[load", "[safetensor"))
    typ, msg = outcome(mx, "M.load(p)", p=lambda m: path)
    assert typ is RuntimeError and msg.startswith("[load_safetensors] ")
    assert field in msg and path in msg


def test_safetensors_metadata_must_be_strings_and_fp8_loads_as_bytes(tmp_path):
    # MLX keys a list's items "0", "1", ...: refused here
    path = _write(tmp_path, "x.safetensors", _st({"__metadata__": ["x"], "a": _F4}, _D16))
    with pytest.raises(RuntimeError, match=r"^\[load_safetensors\] __metadata__ must map"):
        mx.load(path)
    head = {"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]},
            "b": {"dtype": "F8_E8M0", "shape": [2], "data_offsets": [2, 4]}}
    path = _write(tmp_path, "f8.safetensors", _st(head, b"\1\2\3\4"))
    got = mx.load(path)
    assert got["a"].dtype == mx.uint8 and got["a"].tolist() == [1, 2]
    assert got["b"].tolist() == [3, 4]
    if mlx_ref is not None:
        assert {k: v.tolist() for k, v in mlx_ref.load(path).items()} == {"a": [1, 2], "b": [3, 4]}


def _npy(descr, shape, data=b"", fortran=False, version=1):
    h = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}"
    h += " " * (-(10 + len(h) + 1) % 64) + "\n"
    return b"\x93NUMPY" + bytes([version, 0]) + len(h).to_bytes(2, "little") + h.encode() + data


NPY_BAD = {
    "truncated data": _npy("<f4", "(2, 3)", b"\0" * 20),
    "truncated header": _npy("<f4", "(2, 3)")[:40],
    "five bytes": b"\x93NUMP",
    "empty": b"",
    "version 3": _npy("<f4", "(2,)", b"\0" * 8, version=3),
    "negative shape": _npy("<f4", "(-4,)", b"\0" * 16),
    "complex128": _npy("<c16", "(1,)", b"\0" * 16),
    "float128": _npy("<f16", "(1,)", b"\0" * 16),
    "object": _npy("|O", "(1,)", b"\0" * 8),
    "datetime": _npy("<M8[s]", "(1,)", b"\0" * 8),
    "bad magic": b"\x93NUMPX\x01\x00" + _npy("<f4", "()")[8:],
}


def test_npy_with_a_dimension_past_int32_is_a_clear_error(tmp_path):
    # MLX: std::stoi's out_of_range escapes as IndexError('stoi')
    path = _write(tmp_path, "x.npy", _npy("<f4", "(100000000000,)", b"\0" * 16))
    with pytest.raises(RuntimeError, match=r"^\[load\] Dimension outside the int32 range"):
        mx.load(path)


@pytest.mark.parametrize("descr", [">f4", ">i2", ">f8", ">u8", ">c8", "<f4"])
@pytest.mark.parametrize("fortran", [False, True])
def test_big_endian_npy_loads_as_numpy_reads_it(tmp_path, descr, fortran):
    a = (np.arange(6).reshape(2, 3) * 1.5 - 2).astype(descr)
    a = a + 1j * a if a.dtype.kind == "c" else a
    a = np.asfortranarray(a) if fortran else a
    np.save(str(tmp_path / "x.npy"), a.astype(descr))
    got = mx.load(str(tmp_path / "x.npy"))
    want = np.load(str(tmp_path / "x.npy"))
    assert got.shape == want.shape and str(got.dtype) == {"f": "mlx.core.float", "i":
                                                        "mlx.core.int", "u": "mlx.core.uint",
                                                        "c": "mlx.core.complex"}[want.dtype.kind] \
        + str(8 * want.dtype.itemsize)
    np.testing.assert_array_equal(np.array(got), want)
    if mlx_ref is not None and want.dtype.kind != "c":  # MLX swaps a complex64 as one 8-byte word
        np.testing.assert_array_equal(np.array(mlx_ref.load(str(tmp_path / "x.npy"))), want)


@requires_mlx
@pytest.mark.parametrize("src", [
    "M.load(d + '/c.npz')", "M.load(d + '/junk.npz')", "M.load(d + '/trunc.npz')",
    "M.load(d + '/c.npy')",
])
def test_npz_errors_match_mlx(tmp_path, src):
    d = str(tmp_path)
    np.savez(d + "/c.npz", x=np.ones(2, np.complex128))  # MLX refuses complex128
    np.save(d + "/c.npy", np.ones(2, np.complex128))
    _write(tmp_path, "junk.npz", b"PK\3\4garbage")
    np.savez(d + "/full.npz", x=np.arange(100))
    _write(tmp_path, "trunc.npz", (tmp_path / "full.npz").read_bytes()[:-30])
    want = outcome(mlx_ref, src, d=lambda m: d)
    assert want is not None and want[1].startswith("[")
    assert outcome(mx, src, d=lambda m: d) == want


def test_npz_member_with_a_bad_crc_is_a_clear_error(tmp_path):
    np.savez(str(tmp_path / "z.npz"), x=np.arange(8, dtype=np.int32))  # stored, not deflated
    raw = bytearray((tmp_path / "z.npz").read_bytes())
    raw[raw.find(b"\x93NUMPY") + 128 + 4] ^= 0xFF  # a data byte (the npy header is 128 bytes)
    (tmp_path / "bad.npz").write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match=r"^\[load_npz\] Corrupt member 'x.npy' .*CRC"):
        mx.load(str(tmp_path / "bad.npz"))


def _gs(b):
    return len(b).to_bytes(8, "little") + b


def _kv(key, t, payload):
    return _gs(key) + t.to_bytes(4, "little") + payload


def _tinfo(name, dims, typ=0, off=0):
    import struct

    return (_gs(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", typ, off))


def _gguf(kvs=(), infos=(), data=b"", ntens=None, nkv=None, version=3, align=32):
    import struct

    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if ntens is None else ntens,
                                 len(kvs) if nkv is None else nkv) + b"".join(kvs) + b"".join(infos)
    return head + b"\0" * (-len(head) % align) + data


_G_DATA = np.arange(4, dtype=np.float32).tobytes() + b"\0" * 16
_G_NAME = _kv(b"general.name", 8, _gs(b"x"))
_G_GOOD = _gguf([_G_NAME], [_tinfo(b"a", [4])], _G_DATA)
GGUF_BAD = {  # MLX raises these bracketed errors (it crashes on the ones further down)
    "bad magic": b"GGUX" + _G_GOOD[4:],
    "only the magic": b"GGUF",
    "truncated counts": _G_GOOD[:12],
    "truncated data": _G_GOOD[:-20],
    "string past the file": _gguf([_kv(b"k", 8, (2**62).to_bytes(8, "little"))]),
    "array past the file": _gguf([_kv(b"k", 9, (4).to_bytes(4, "little") +
                                     (2**61).to_bytes(8, "little"))]),
    "unknown value type": _gguf([_kv(b"k", 99, b"\0" * 8)]),
    "nested array": _gguf([_kv(b"k", 9, (9).to_bytes(4, "little") + (1).to_bytes(8, "little") +
                              (4).to_bytes(4, "little") + (1).to_bytes(8, "little") + b"\0" * 4)]),
    "offset past the file": _gguf([], [_tinfo(b"a", [4], 0, 10**6)], _G_DATA),
    "tensor past the file": _gguf([], [_tinfo(b"a", [2**40])], _G_DATA),
}
GGUF_CLEAR = {  # MLX segfaults, aborts, divides by zero, or reads garbage: (file, message)
    "huge tensor count": (_gguf([_G_NAME], [_tinfo(b"a", [4])], _G_DATA, ntens=2**40),
                          "Tensor '' info extends past the end of the file"),
    "huge metadata count": (_gguf([_G_NAME], [_tinfo(b"a", [4])], _G_DATA, nkv=2**40),
                            "Metadata key extends past the end of the file"),
    "truncated key": (_G_GOOD[:30], "Metadata key extends past the end of the file"),
    "truncated tensor info": (_G_GOOD[:60], "Tensor name extends past the end of the file"),
    "huge key length": (_gguf([(2**62).to_bytes(8, "little") + b"k"]),
                        "Metadata key extends past the end of the file"),
    "alignment 0": (_gguf([_kv(b"general.alignment", 4, (0).to_bytes(4, "little"))],
                          [_tinfo(b"a", [4])], _G_DATA),
                    "general.alignment must be a uint32 power of two in file"),
    "alignment a string": (_gguf([_kv(b"general.alignment", 8, _gs(b"32"))], [_tinfo(b"a", [4])],
                                 _G_DATA), "general.alignment must be a uint32 power of two"),
    "alignment 3": (_gguf([_kv(b"general.alignment", 4, (3).to_bytes(4, "little"))],
                          [_tinfo(b"a", [4])], _G_DATA, align=3),
                    "general.alignment must be a uint32 power of two in file"),
    "1000 dimensions": (_gguf([], [_gs(b"a") + (1000).to_bytes(4, "little")], _G_DATA),
                        "Tensor 'a' has 1000 dimensions, more than 8, in file"),
    "version 1": (_gguf([], [_tinfo(b"a", [4])], _G_DATA, version=1),
                  "Unsupported GGUF version 1 in file"),
    "bad utf-8 key": (_gguf([_kv(b"\xff", 8, _gs(b"x"))]), "Metadata key is not valid UTF-8"),
    "bad utf-8 value": (_gguf([_kv(b"k", 8, _gs(b"\xff"))]),
                        "String metadata value is not valid UTF-8"),
    "bad utf-8 name": (_gguf([], [_tinfo(b"\xfe", [4])], _G_DATA),
                       "Tensor name is not valid UTF-8"),
    "duplicate names": (_gguf([], [_tinfo(b"a", [4]), _tinfo(b"a", [4])], _G_DATA),
                        "Duplicate parameter name a this can happend"),
    "unknown tensor type": (_gguf([], [_tinfo(b"a", [4], 4161536)], _G_DATA),
                            "Unsupported tensor type 4161536"),
}


@pytest.mark.parametrize("case", sorted(GGUF_CLEAR))
def test_malformed_gguf_give_clear_errors_where_mlx_crashes(tmp_path, case):
    data, msg = GGUF_CLEAR[case]
    path = _write(tmp_path, "x.gguf", data)
    with pytest.raises((RuntimeError, ValueError)) as info:
        mx.load(path)
    assert type(info.value) in (RuntimeError, ValueError)
    assert str(info.value).startswith("[load_gguf] ") and msg in str(info.value)


@requires_mlx
@pytest.mark.parametrize("keys", [["f64"], ["v64"], ["b", "vb", "f64"]])
def test_gguf_metadata_types_as_mlx_reads_them(tmp_path, keys):
    import struct

    kvs = {"f64": _kv(b"f64", 12, struct.pack("<d", 1.5)), "b": _kv(b"b", 7, b"\2"),
           "v64": _kv(b"v64", 9, struct.pack("<IQ", 12, 2) + struct.pack("<2d", 0.25, -3.0)),
           "vb": _kv(b"vb", 9, struct.pack("<IQ", 7, 3) + b"\0\1\5")}
    # float64 comes back as float32, as MLX makes it; MLX then steps past the value by the
    # float32's size and misreads (or crashes on) any key after it: float64 goes last
    path = _write(tmp_path, "m.gguf", _gguf([kvs[k] for k in keys]))
    _, want = mlx_ref.load(path, return_metadata=True)
    _, got = mx.load(path, return_metadata=True)
    assert sorted(got) == sorted(want) == sorted(keys)
    for k in want:
        _same(got[k], want[k])


@requires_mlx
def test_save_gguf_without_metadata_as_mlx(tmp_path):
    for m, name in ((mx, "ours"), (mlx_ref, "theirs")):
        m.save_gguf(str(tmp_path / name), {"a": m.array([1.0, 2.0]), "b": m.ones((2, 3), m.int8)})
    for r in (mx, mlx_ref):
        for name in ("ours", "theirs"):
            arrays, meta = r.load(str(tmp_path / f"{name}.gguf"), return_metadata=True)
            assert meta == {} and sorted(arrays) == ["a", "b"]
            assert arrays["a"].tolist() == [1.0, 2.0] and arrays["b"].tolist() == [[1] * 3] * 2


MLX_CHECKED = [(f"x.{ext}", case, table[case]) for ext, table in (
    ("safetensors", SAFETENSORS_BAD), ("npy", NPY_BAD), ("gguf", GGUF_BAD)) for case in table]


@requires_mlx
@pytest.mark.parametrize("name, case, data", MLX_CHECKED,
                         ids=[f"{n}-{c}" for n, c, _ in MLX_CHECKED])
def test_malformed_files_raise_mlx_errors(tmp_path, name, case, data):
    """Files MLX refuses with a bracketed error: the same type and message here."""
    path = _write(tmp_path, name, data)
    want = outcome(mlx_ref, "M.load(p)", p=lambda m: path)
    assert want is not None and want[1].startswith("[")
    assert outcome(mx, "M.load(p)", p=lambda m: path) == want
