"""Dispatch by device: a test-only second backend ("testgpu", numpy underneath) registered as
the GPU, so evaluation, allocation accounting, events between the two devices and compiled
kernels are exercised through a backend that is not the CPU's, without a GPU.

A wrong choice of backend fails here: the test backend's array module, allocator, events and
compiled runtime each count what went through them, and the CPU's must see none of it.
"""

from __future__ import annotations

import collections
import gc

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends
from tapescope.kernels.allocator import POLICIES, Allocator, allocator
from tapescope.kernels.codegen.interpret import interpret
from tapescope.kernels.stream_workers import Event
from conftest import registered_as_gpu


class CountingNumpy:
    """numpy, counting every function a rule takes from it."""

    def __init__(self):
        self.calls: collections.Counter = collections.Counter()

    def __getattr__(self, name):
        self.calls[name] += 1
        return getattr(np, name)


class ProbeEvent(Event):
    """An event of the test device: counts records (signal) and waits, by who waits."""

    log: list = []
    __slots__ = ()

    def signal(self, value: int = 1) -> None:
        ProbeEvent.log.append(("record", self.stream, value))
        super().signal(value)

    def wait(self, value: int = 1, stream=None) -> None:
        ProbeEvent.log.append(("wait_host" if stream is None else "wait_stream", self.stream, value))
        super().wait(value, stream)


class NumpyGpu(backends.Backend):
    """The test backend: numpy underneath, its own allocator (MLX's CUDA policy, 1 GiB),
    its own events, and a compiled runtime that interprets the tape with its array module."""

    name = "testgpu"
    device_type = "gpu"
    dialect = "cuda"
    event_type = ProbeEvent

    def __init__(self):
        super().__init__(CountingNumpy(), Allocator("testgpu", policy=POLICIES["cuda"],
                                                    total_memory=1 << 30, page_size=4096))
        self.launches: list = []

    def run_compiled(self, tape, inputs, shape, out=None, donatable=None):
        self.launches.append((tape, tuple(shape)))
        return interpret(tape, inputs, shape, self.xp)


@pytest.fixture
def testgpu():
    ProbeEvent.log.clear()
    yield from registered_as_gpu(NumpyGpu())


@pytest.mark.skipif(backends.gpu_available(), reason="a GPU runtime is registered here")
def test_without_a_gpu_backend_the_cpu_is_the_only_device():
    assert "gpu" not in backends.registered()
    assert not mx.is_available(mx.gpu)
    assert mx.default_device() == mx.Device(mx.cpu)
    with pytest.raises(RuntimeError, match="no tapescope backend"):
        backends.backend("gpu")
    assert backends.backend(mx.cpu).xp is np


def test_a_registered_gpu_backend_makes_mx_gpu_available(testgpu):
    assert mx.is_available(mx.gpu) and mx.device_count(mx.gpu) == 1
    assert backends.backend(mx.default_stream(mx.gpu)) is testgpu
    assert backends.backend(mx.Device(mx.cpu)) is not testgpu


def test_disable_gpu_hides_the_gpu_backend(testgpu, monkeypatch):
    monkeypatch.setenv("TAPESCOPE_DISABLE_GPU", "1")
    assert not mx.is_available(mx.gpu)


def test_ops_on_a_gpu_stream_run_with_the_gpu_backends_array_module(testgpu):
    a = mx.array(np.arange(8, dtype=np.float32))
    b = mx.array(np.full(8, 2.0, dtype=np.float32))
    mx.eval(a, b)
    c = mx.exp(mx.multiply(a, b, stream=mx.gpu), stream=mx.gpu)
    mx.eval(c)
    np.testing.assert_allclose(np.array(c), np.exp(np.arange(8) * 2.0), rtol=1e-6)
    assert testgpu.xp.calls["multiply"] == 1 and testgpu.xp.calls["exp"] == 1
    d = mx.exp(mx.multiply(a, b, stream=mx.cpu), stream=mx.cpu)
    mx.eval(d)
    assert testgpu.xp.calls["multiply"] == 1 and testgpu.xp.calls["exp"] == 1  # not the GPU's
    assert np.array_equal(np.array(c), np.array(d))


def test_outputs_are_accounted_by_the_devices_allocator(testgpu, young_heap):
    cpu = allocator("cpu")
    a = mx.array(np.ones((256, 256), dtype=np.float32))
    mx.eval(a)
    cpu_before, gpu_before = cpu.active, testgpu.allocator.active
    c = mx.add(a, a, stream=mx.gpu)
    mx.eval(c)
    assert testgpu.allocator.active - gpu_before == 256 * 256 * 4
    assert cpu.active == cpu_before
    del c
    gc.collect()
    assert testgpu.allocator.active == gpu_before
    assert testgpu.allocator.get_cache_memory() >= 256 * 256 * 4  # recycled in its own cache
    # the memory API follows the default device's backend
    mx.set_default_device(mx.gpu)
    try:
        assert mx.get_active_memory() == testgpu.allocator.active
        assert mx.get_memory_limit() == testgpu.allocator.memory_limit == int(0.8 * (1 << 30)) or \
            mx.get_memory_limit() == testgpu.allocator.memory_limit
    finally:
        mx.set_default_device(mx.cpu)
    assert mx.get_active_memory() == cpu.active


def test_a_result_the_gpu_rule_allocated_is_adopted_by_the_gpu_allocator(testgpu):
    a = mx.array(np.arange(12, dtype=np.int32).reshape(3, 4))
    mx.eval(a)
    cpu_before, gpu_before = allocator("cpu").active, testgpu.allocator.active
    s = mx.sum(a, axis=0, stream=mx.gpu)  # a reduction: the rule allocates its result
    mx.eval(s)
    assert s.tolist() == [12, 15, 18, 21]
    assert testgpu.allocator.active > gpu_before
    assert allocator("cpu").active == cpu_before


def test_events_between_the_two_devices(testgpu):
    x = mx.array(np.arange(6, dtype=np.float32))
    mx.eval(x)
    y = mx.multiply(x, x, stream=mx.gpu)  # GPU stream
    z = mx.add(y, x, stream=mx.cpu)  # CPU stream, waits on the GPU's work
    mx.eval(z)
    assert z.tolist() == [v * v + v for v in range(6)]
    gpu_index = mx.default_stream(mx.gpu).index
    cpu_index = mx.default_stream(mx.cpu).index
    # the GPU stream's event and its fence towards the CPU are the GPU backend's events
    assert ("record", gpu_index, 1) in ProbeEvent.log
    assert any(k == "wait_host" and s == gpu_index for k, s, _ in ProbeEvent.log) or \
        any(k == "record" and s == gpu_index for k, s, _ in ProbeEvent.log)
    assert all(s == gpu_index for _, s, _ in ProbeEvent.log)  # the CPU's are not test events
    assert cpu_index != gpu_index


def test_the_host_waits_on_a_gpu_event(testgpu):
    x = mx.array(np.arange(4, dtype=np.float32))
    mx.eval(x)
    y = mx.square(x, stream=mx.gpu)
    mx.async_eval(y)
    mx.eval(y)  # the host waits on the GPU stream's event
    assert y.tolist() == [0.0, 1.0, 4.0, 9.0]
    gpu_index = mx.default_stream(mx.gpu).index
    assert ("record", gpu_index, 1) in ProbeEvent.log
    assert ("wait_host", gpu_index, 1) in ProbeEvent.log


def test_compiled_kernels_run_with_the_devices_runtime(testgpu, monkeypatch):
    def f(x, y):
        return mx.exp(-x) * mx.sin(y) + 2 * x * y

    cf = mx.compile(f)
    x = mx.array(np.linspace(-1, 1, 64, dtype=np.float32))
    y = mx.array(np.linspace(0, 2, 64, dtype=np.float32))
    mx.eval(x, y)
    expect = np.array(f(x, y))
    with mx.stream(mx.gpu):
        out = cf(x, y)
        from tapescope.kernels.cpu import compiled as cpu_compiled

        def no_cpu(*a, **k):
            raise AssertionError("the CPU's compiled runtime ran a GPU tape")

        monkeypatch.setattr(cpu_compiled, "run_compiled", no_cpu)
        mx.eval(out)
    np.testing.assert_allclose(np.array(out), expect, rtol=1e-6, atol=1e-6)
    assert testgpu.launches
    tape, shape = testgpu.launches[-1]
    assert shape == (64,) and {op.primitive for op in tape.ops} >= {"Exp", "Sin", "Multiply"}
    monkeypatch.undo()
    n = len(testgpu.launches)
    mx.eval(mx.compile(f)(x, y))  # on the CPU: the C runtime, not the test one
    assert len(testgpu.launches) == n


def test_a_backend_that_cannot_compute_fails_only_its_device(testgpu):
    class Broken:
        def __getattr__(self, name):
            raise RuntimeError(f"broken backend asked for {name}")

    testgpu.xp = Broken()
    a = mx.array(np.ones(4, dtype=np.float32))
    mx.eval(a)
    with pytest.raises(RuntimeError, match="broken backend"):
        mx.eval(mx.add(a, a, stream=mx.gpu))
    assert mx.add(a, a, stream=mx.cpu).tolist() == [2.0] * 4
