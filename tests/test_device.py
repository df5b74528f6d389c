"""Devices and streams against MLX (CPU-only machine): reprs, equality, defaults, errors, contexts."""

from __future__ import annotations

import threading

import pytest

import tapescope.core as mx
from tapescope.core import device as _device

from conftest import requires_mlx

NO_GPU = not mx.is_available(mx.gpu)
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="these are the errors of a machine without a GPU backend")


@pytest.fixture(autouse=True)
def _restore_defaults():
    """Each test leaves the default device and this thread's default CPU stream as found."""
    dev = mx.default_device()
    s = mx.default_stream(mx.cpu)
    yield
    mx.set_default_device(dev)
    mx.set_default_stream(s)


def _err(fn, *args, **kwargs):
    """The (type, message) an call raises."""
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return type(info.value), str(info.value)


def test_device_type_members_repr_and_values(mlx):
    assert [m.name for m in mx.DeviceType] == list(mlx.DeviceType.__members__)
    for name in ("cpu", "gpu"):
        ours, ref = getattr(mx, name), getattr(mlx, name)
        assert repr(ours) == repr(ref) and str(ours) == str(ref)
        assert ours.value == ref.value and ours.name == ref.name
        assert getattr(mx.DeviceType, name) is ours
    assert mx.DeviceType(0) is mx.cpu and mx.DeviceType(1) is mx.gpu
    assert (mx.cpu == 0) == (mlx.cpu == 0) is False


@pytest.mark.parametrize("args", [(0,), (1,), (0, 3), (1, 2), (0, -1)])
def test_device_repr_and_type(mlx, args):
    ours = mx.Device(*[mx.DeviceType(args[0]), *args[1:]])
    ref = mlx.Device(*[mlx.DeviceType(args[0]), *args[1:]])
    assert repr(ours) == repr(ref) and str(ours) == str(ref)
    assert ours.type.name == ref.type.name


def test_device_keywords_and_int_type(mlx):
    assert repr(mx.Device(type=mx.gpu, index=2)) == repr(mlx.Device(type=mlx.gpu, index=2))
    assert repr(mx.Device(0)) == repr(mlx.Device(0))
    assert repr(mx.Device(mx.cpu, True)) == repr(mlx.Device(mlx.cpu, True))


def test_device_equality(mlx):
    cases = [((0,), (0,)), ((0,), (1,)), ((0, 1), (0,)), ((1, 2), (1, 2)), ((0, 0), (0, 1))]
    for a, b in cases:
        ours = mx.Device(mx.DeviceType(a[0]), *a[1:]) == mx.Device(mx.DeviceType(b[0]), *b[1:])
        ref = mlx.Device(mlx.DeviceType(a[0]), *a[1:]) == mlx.Device(mlx.DeviceType(b[0]), *b[1:])
        assert ours == ref
    assert (mx.Device(mx.cpu) == mx.cpu) == (mlx.Device(mlx.cpu) == mlx.cpu) is True
    assert (mx.cpu == mx.Device(mx.cpu)) == (mlx.cpu == mlx.Device(mlx.cpu)) is True
    assert (mx.Device(mx.cpu, 1) == mx.cpu) == (mlx.Device(mlx.cpu, 1) == mlx.cpu) is False
    assert (mx.Device(mx.cpu) != mx.Device(mx.gpu)) is True


def test_equal_devices_hash_equal():
    # MLX hashes devices by identity (so equal devices miss each other in a dict); we keep
    # Python's contract that equal objects hash equal.
    assert hash(mx.Device(mx.gpu, 3)) == hash(mx.Device(mx.gpu, 3))
    assert {mx.Device(mx.cpu): 1}[mx.Device(mx.cpu)] == 1


@pytest.mark.parametrize("bad", [("cpu",), (0.0,), (mx.cpu, 1.0), (None,)])
def test_device_constructor_errors(mlx, bad):
    ref_args = tuple(mlx.cpu if a is mx.cpu else a for a in bad)
    assert _err(mx.Device, *bad) == _err(mlx.Device, *ref_args)


def test_device_from_device_is_an_error(mlx):
    assert _err(mx.Device, mx.Device(mx.cpu)) == _err(mlx.Device, mlx.Device(mlx.cpu))


def test_default_device_and_stream(mlx):
    assert repr(mx.default_device()) == repr(mlx.default_device())
    s = mx.default_stream(mx.cpu)
    assert isinstance(s, mx.Stream)
    assert repr(s.device) == "Device(cpu, 0)"
    assert repr(s) == f"Stream(Device(cpu, 0), {s.index})"
    assert mx.default_stream(mx.cpu) is s
    assert mx.default_stream(mx.Device(mx.cpu)) is s
    assert mx.default_stream(mx.default_device()) is s
    assert s == mx.default_stream(mx.cpu) and hash(s) == hash(mx.default_stream(mx.cpu))


def test_stream_repr_format_matches_mlx(mlx):
    ref = mlx.new_stream(mlx.cpu)
    ours = mx.new_stream(mx.cpu)
    ref_index = int(repr(ref).rsplit(", ", 1)[1].rstrip(")"))
    assert repr(ref) == f"Stream(Device(cpu, 0), {ref_index})"
    assert repr(ours) == f"Stream(Device(cpu, 0), {ours.index})"
    assert str(ours) == repr(ours)


def test_new_streams_are_distinct_and_numbered_upwards():
    a, b = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
    assert a != b and b.index > a.index
    assert (a == mx.cpu) is False and (a == 0) is False
    assert {a: 1, b: 2}[a] == 1


def test_new_stream_on_missing_cpu_index_is_allowed(mlx):
    # MLX makes the stream without checking the index (only default_stream checks).
    ref = mlx.new_stream(mlx.Device(mlx.cpu, 1))
    ours = mx.new_stream(mx.Device(mx.cpu, 1))
    assert repr(ref.device) == repr(ours.device) == "Device(cpu, 1)"


def test_stream_has_no_constructor(mlx):
    assert _err(mx.Stream, mx.Device(mx.cpu), 0) == _err(mlx.Stream, mlx.Device(mlx.cpu), 0)


@needs_no_gpu
@pytest.mark.parametrize("call", [
    lambda m: m.default_stream(m.gpu),
    lambda m: m.default_stream(m.Device(m.gpu, 1)),
    lambda m: m.new_stream(m.gpu),
    lambda m: m.new_stream(m.Device(m.gpu, 1)),
    lambda m: m.set_default_device(m.gpu),
    lambda m: m.set_default_device(m.Device(m.gpu, 3)),
    lambda m: m.add(m.array(1), m.array(2), stream=m.gpu),
    lambda m: m.add(m.array(1), m.array(2), stream=m.Device(m.gpu)),
    lambda m: m.add(m.array(1), m.array(2), stream=1),
    lambda m: m.default_stream(m.Device(m.cpu, 1)),
    lambda m: m.default_stream(m.Device(m.cpu, -1)),
    lambda m: m.add(m.array(1), m.array(2), stream=m.Device(m.cpu, 1)),
    lambda m: m.set_default_stream(m.new_stream(m.Device(m.cpu, 1))),
])
def test_device_errors_without_gpu_backend(mlx, call):
    assert _err(call, mx) == _err(call, mlx)


@pytest.mark.parametrize("call", [
    lambda m: m.set_default_device("cpu"),
    lambda m: m.set_default_stream(m.cpu),
    lambda m: m.device_count(m.Device(m.cpu)),
    lambda m: m.is_available("cpu"),
    lambda m: m.default_stream("cpu"),
    lambda m: m.new_stream(None),
    lambda m: m.stream("cpu"),
])
def test_argument_type_errors(mlx, call):
    assert _err(call, mx) == _err(call, mlx)


def test_is_available_and_device_count(mlx):
    for make in (lambda m: m.cpu, lambda m: m.gpu, lambda m: m.Device(m.cpu, 1),
                 lambda m: m.Device(m.cpu, -1), lambda m: m.Device(m.gpu, 0), lambda m: 0):
        assert mx.is_available(make(mx)) == mlx.is_available(make(mlx))
    assert mx.device_count(mx.cpu) == mlx.device_count(mlx.cpu) == 1
    if NO_GPU:
        assert mx.device_count(mx.gpu) == mlx.device_count(mlx.gpu) == 0


def test_set_default_device_is_global_and_accepts_any_cpu_index(mlx):
    seen = {}
    t = threading.Thread(target=lambda: (mx.set_default_device(mx.Device(mx.cpu, 1)),
                                         seen.setdefault("t", mx.default_device())))
    t.start()
    t.join()
    assert repr(seen["t"]) == repr(mx.default_device()) == "Device(cpu, 1)"
    mx.set_default_device(mx.cpu)
    assert mx.default_device() == mx.Device(mx.cpu, 0)


def test_set_default_stream_changes_stream_not_device():
    s = mx.new_stream(mx.cpu)
    dev = mx.default_device()
    mx.set_default_stream(s)
    assert mx.default_stream(mx.cpu) is s and mx.default_device() == dev
    assert mx.add(mx.array(1), mx.array(2))._d.stream is s


def test_default_streams_are_per_thread():
    s = mx.new_stream(mx.cpu)
    mx.set_default_stream(s)
    seen = {}

    def other():
        seen["first"] = mx.default_stream(mx.cpu)
        seen["again"] = mx.default_stream(mx.cpu)
        mx.set_default_stream(s)
        seen["set"] = mx.default_stream(mx.cpu)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["first"] != s and seen["first"] is seen["again"]
    assert seen["first"].index not in (x.index for x in _device.streams() if x is not seen["first"])
    assert seen["set"] is s
    s2 = mx.new_stream(mx.cpu)
    t = threading.Thread(target=lambda: mx.set_default_stream(s2))
    t.start()
    t.join()
    assert mx.default_stream(mx.cpu) is s  # another thread's choice does not leak here


def test_stream_context_sets_and_restores():
    before = mx.default_stream(mx.cpu)
    s = mx.new_stream(mx.cpu)
    with mx.stream(s) as value:
        assert value is None
        assert mx.default_stream(mx.cpu) is s
        assert mx.add(mx.array(1), mx.array(2))._d.stream is s
        assert mx.add(mx.array(1), mx.array(2), stream=mx.cpu)._d.stream is s
    assert mx.default_stream(mx.cpu) is before


def test_stream_context_restores_the_stream_saved_on_entry_even_if_changed_inside():
    s0 = mx.default_stream(mx.cpu)
    s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
    mx.set_default_stream(s1)
    with mx.stream(s2):
        mx.set_default_stream(s0)
        assert mx.default_stream(mx.cpu) is s0
    assert mx.default_stream(mx.cpu) is s1  # as MLX: the stream default at entry


def test_stream_context_nested_and_reentered():
    s0 = mx.default_stream(mx.cpu)
    s1 = mx.new_stream(mx.cpu)
    ctx = mx.stream(s1)
    with ctx:
        with ctx:
            assert mx.default_stream(mx.cpu) is s1
        assert mx.default_stream(mx.cpu) is s1
    assert mx.default_stream(mx.cpu) is s0


def test_stream_context_restores_on_exception():
    s0 = mx.default_stream(mx.cpu)
    with pytest.raises(KeyError):
        with mx.stream(mx.new_stream(mx.cpu)):
            raise KeyError("x")
    assert mx.default_stream(mx.cpu) is s0


def test_stream_context_with_device_types(mlx):
    s0 = mx.default_stream(mx.cpu)
    for target in (mx.cpu, mx.Device(mx.cpu), 0):
        with mx.stream(target):
            assert mx.default_stream(mx.cpu) is s0
            assert mx.default_device() == mx.Device(mx.cpu)
    assert type(mx.stream(mx.cpu)).__name__ == type(mlx.stream(mlx.cpu)).__name__ == "StreamContext"


@needs_no_gpu
def test_stream_context_gpu_fails_on_entry_not_creation(mlx):
    for m in (mx, mlx):
        ctx = m.stream(m.gpu)  # creating the context is fine
        with pytest.raises(ValueError) as info:
            ctx.__enter__()
        assert str(info.value) == "[default_stream] Cannot get gpu stream without gpu backend."
    assert mx.default_stream(mx.cpu) is mx.default_stream(mx.cpu)


@pytest.mark.parametrize("kind", ["stream", "device", "type", "int"])
def test_stream_keyword_accepts_stream_device_and_type(kind):
    s = mx.new_stream(mx.cpu)
    arg = {"stream": s, "device": mx.Device(mx.cpu), "type": mx.cpu, "int": 0}[kind]
    y = mx.add(mx.array([1, 2]), mx.array([3, 4]), stream=arg)
    want = s if kind == "stream" else mx.default_stream(mx.cpu)
    assert y._d.stream is want
    assert y.tolist() == [4, 6]


def test_stream_keyword_rejects_other_types():
    with pytest.raises(TypeError):
        mx.add(mx.array(1), mx.array(2), stream="cpu")


@requires_mlx
def test_public_names_exist_in_mlx():
    import mlx.core as ref

    for name in ("Device", "DeviceType", "Stream", "cpu", "gpu", "default_device", "default_stream",
                 "set_default_device", "set_default_stream", "new_stream", "stream", "is_available",
                 "device_count"):
        assert hasattr(mx, name) and hasattr(ref, name)


def test_cuda_namespace_answers_is_available_like_mlx(mlx):
    """MLX programs ask ``mx.cuda.is_available()`` at import time: the name must exist, take no
    arguments and return a bool; without a CUDA runtime the answer is False, as MLX's CPU build."""
    import inspect

    assert [n for n in dir(mx.cuda) if not n.startswith("_")] == \
        [n for n in dir(mlx.cuda) if not n.startswith("_")]
    assert inspect.signature(mx.cuda.is_available).parameters == {}
    assert mx.cuda.is_available() is False
    assert mx.cuda.is_available() == mlx.cuda.is_available()
