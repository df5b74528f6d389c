"""mx.load is lazy as MLX's (mlx/io/load.cpp, python/src/load.cpp): a path's .npy /
.safetensors arrays are ``Load`` nodes read at eval, on the stream given; a short data
section raises at eval; the Load's buffer is donated to its consumer; the file is closed
with the last of its arrays; a file object's arrays are read before load returns."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import outcome


def _unevaluated(a) -> bool:
    return a._d.node is not None


def _truncated_npy(tmp_path, name="t.npy"):
    path = str(tmp_path / name)
    want = np.arange(16, dtype=np.float32)
    np.save(path, want)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - want.nbytes)
    return path


def _open_fds(path: str) -> int:
    """This process's descriptors open on ``path`` (other tests' files, closed by the
    garbage collector meanwhile, do not count)."""
    real, n = os.path.realpath(path), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == real
        except OSError:  # closed while listed
            pass
    return n


@pytest.mark.parametrize("descr", ["<f4", ">f4", "<i8", ">u2", ">c8", "<f2", "|b1"])
@pytest.mark.parametrize("fortran", [False, True])
def test_a_path_loads_unevaluated_and_reads_numpys_values_at_eval(tmp_path, descr, fortran):
    host = (np.arange(12).reshape(3, 4) % 5).astype(descr)
    host = np.asfortranarray(host) if fortran else host
    path = str(tmp_path / "x.npy")
    np.save(path, host)
    a = mx.load(path)
    assert a.shape == (3, 4)
    node = a._d.node if not fortran else a._d.node.inputs[0].node  # a transpose of the Load
    assert node.primitive.name == "Load"
    np.testing.assert_array_equal(np.array(a), np.load(path))
    assert not _unevaluated(a)


def test_a_short_data_section_raises_at_eval_not_at_load(tmp_path):
    path = _truncated_npy(tmp_path)
    out = mx.load(path, stream=mx.cpu)
    assert _unevaluated(out)
    with pytest.raises(RuntimeError, match=r"^\[read\] Unable to read from file\.$"):
        mx.eval(out)
    if mlx_ref is not None:  # MLX: the same type and message, at eval
        assert outcome(mx, "M.load(p)", p=lambda m: path) == \
            outcome(mlx_ref, "M.load(p)", p=lambda m: path)


def test_the_load_runs_on_the_stream_given_and_the_error_reaches_the_consumer(tmp_path):
    path = _truncated_npy(tmp_path)
    producer, consumer = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
    loaded = mx.load(path, stream=producer)
    assert loaded._d.node.primitive.stream == producer
    out = mx.add(loaded, 1.0, stream=consumer)
    with pytest.raises(RuntimeError, match=r"^\[read\] Unable to read from file\.$"):
        mx.eval(out)
    mx.synchronize(producer)  # the streams stay usable
    mx.synchronize(consumer)
    ok = mx.multiply(mx.add(mx.arange(3), 1, stream=producer), 2, stream=consumer)
    assert ok.tolist() == [2, 4, 6]


@pytest.mark.skipif(mx.cuda.is_available(), reason="with CUDA, the default stream (MLX's)")
def test_without_a_stream_the_load_runs_on_the_cpu(tmp_path):
    path = str(tmp_path / "x.npy")
    np.save(path, np.ones(3, np.float32))
    a = mx.load(path)
    assert a._d.node.primitive.stream == mx.default_stream(mx.cpu)


def _peaks(module, path) -> tuple:
    module.reset_peak_memory()
    scale = module.array(2.0)
    y = module.load(path)
    module.eval(y)
    module.synchronize()
    alone = module.get_peak_memory()
    y = module.load(path) * scale
    module.eval(y)
    module.synchronize()
    return alone, module.get_peak_memory(), y


def test_the_loads_buffer_is_donated_to_its_consumer(tmp_path):
    host = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)
    path = str(tmp_path / "x.npy")
    np.save(path, host)
    mx.synchronize()
    alone, with_multiply, y = _peaks(mx, path)
    assert alone == with_multiply  # one buffer: the multiply wrote into the Load's
    np.testing.assert_array_equal(np.array(y), host * np.float32(2))
    if mlx_ref is not None:
        ref_alone, ref_with, _ = _peaks(mlx_ref, path)
        assert ref_alone == ref_with


def test_the_file_is_closed_with_the_last_of_its_arrays(tmp_path):
    path = str(tmp_path / "x.safetensors")
    mx.save_safetensors(path, {"a": mx.ones((2, 2)), "b": mx.arange(3)})
    got = mx.load(path)
    assert all(_unevaluated(v) for v in got.values())
    assert _open_fds(path) == 1  # one descriptor, shared by the two arrays
    mx.eval(got["a"])
    assert _open_fds(path) == 1  # "b" still reads through it
    assert got["b"].tolist() == [0, 1, 2]
    assert _open_fds(path) == 0
    got = mx.load(path)
    assert _open_fds(path) == 1
    del got  # freed unread
    assert _open_fds(path) == 0


def test_safetensors_from_a_path_is_lazy_and_matches_mlx(tmp_path):
    path = str(tmp_path / "x.safetensors")
    host = {"w": np.arange(6, dtype=np.float16).reshape(2, 3), "i": np.array([1, -2], np.int64)}
    mx.save_safetensors(path, {k: mx.array(v) for k, v in host.items()})
    got = mx.load(path)
    assert all(_unevaluated(v) for v in got.values())
    for k, v in host.items():
        np.testing.assert_array_equal(np.array(got[k]), v)
    if mlx_ref is not None:
        ref = mlx_ref.load(path)
        for k in host:
            np.testing.assert_array_equal(np.array(got[k]), np.array(ref[k]))


def test_a_file_objects_arrays_are_read_before_load_returns(tmp_path):
    host = np.arange(5, dtype=np.int32)
    buf = io.BytesIO()
    np.save(buf, host)
    buf.seek(0)
    a = mx.load(buf, format="npy")
    assert not _unevaluated(a)
    np.testing.assert_array_equal(np.array(a), host)
    buf = io.BytesIO(buf.getvalue()[:-8])  # short: the read error comes from load itself
    with pytest.raises(RuntimeError, match=r"^\[load\] Failed to read from python stream$"):
        mx.load(buf, format="npy")


@pytest.mark.parametrize("save", ["savez", "savez_compressed"])
def test_an_npz_paths_members_are_read_at_eval(tmp_path, save):
    path = str(tmp_path / "x.npz")
    getattr(mx, save)(path, a=mx.arange(6).reshape(2, 3), b=mx.ones((4,), mx.float16))
    got = mx.load(path)
    assert all(_unevaluated(v) for v in got.values())
    want = np.load(path)
    for k in ("a", "b"):
        np.testing.assert_array_equal(np.array(got[k]), want[k])
    if mlx_ref is not None:
        ref = mlx_ref.load(path)
        for k in ("a", "b"):
            np.testing.assert_array_equal(np.array(got[k]), np.array(ref[k]))


def test_an_npz_member_whose_crc_is_wrong_raises_at_eval(tmp_path):
    path = str(tmp_path / "x.npz")
    # larger than zipfile's 4 KiB read-ahead: the header's read does not reach the CRC check
    mx.savez(path, a=mx.arange(4096, dtype=mx.int32))
    raw = bytearray(open(path, "rb").read())
    at = raw.index(np.arange(4096, dtype=np.int32).tobytes())
    raw[at + 10000] ^= 0xFF  # a data byte: the header still parses, the CRC no longer matches
    with open(path, "wb") as f:
        f.write(raw)
    got = mx.load(path)
    assert _unevaluated(got["a"])
    with pytest.raises(RuntimeError, match=r"^\[load_npz\] Corrupt member 'a.npy' in file "):
        mx.eval(got["a"])


@pytest.mark.parametrize("descr", ["<f4", ">f4", ">i2"])
def test_check_reads_the_file_on_its_own_as_the_reference(tmp_path, descr):
    pytest.importorskip("jax")
    import tapescope

    path = str(tmp_path / "x.npy")
    np.save(path, (np.arange(6) - 2).astype(descr))
    report = tapescope.check(lambda: mx.load(path) * 3)
    assert report.passed, report
