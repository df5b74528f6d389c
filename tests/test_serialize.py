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
