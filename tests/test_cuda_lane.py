"""The CUDA runtime's eager lane (``kernels/cuda/_lane.c``): ``mx.eval`` of one fused call
run in C gives what the Python path gives — the values, the allocator's counters, the
kernel cache's hits, the node detached, the stream noted finished — and steps aside (the
Python path runs) for what it does not do: a donatable input, several outputs, the timeline
recording. Runs where CuPy reaches a GPU, ``TAPESCOPE_CUDA=1`` and the extension is built
(the H200 machine).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends, timeline

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="the CUDA eager lane needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")


@pytest.fixture(autouse=True)
def _gpu_default(gpu_default_device):
    yield


@pytest.fixture
def lane(monkeypatch):
    """The lane, with a record of its calls: True for each call it ran (from ``mx.eval``'s
    first line, ``eval_one``, or from ``_eval_one``, ``eval_fused``), False for each call
    ``eval_fused`` declined."""
    from tapescope.core import scheduling

    be = backends.backend("gpu")
    real = be.eager_lane
    if real is None:
        pytest.skip("the C extension kernels/cuda/_lane.c is not built here")
    if scheduling._eager_one[0] is None:
        scheduling._enable_eager(be)
    real_one = scheduling._eager_one[0]
    calls = []

    def counted(node, ev):
        ran = real(node, ev)
        calls.append(ran)
        return ran

    def counted_one(desc):
        ran = real_one(desc)
        if ran:
            calls.append(True)
        return ran

    monkeypatch.setattr(be, "eager_lane", counted)
    scheduling._eager_one[0] = counted_one
    yield calls
    scheduling._eager_one[0] = real_one


def _python_path(monkeypatch) -> None:
    """Everything through the Python path (the lane fixture restores the lane after)."""
    from tapescope.core import scheduling

    monkeypatch.setattr(backends.backend("gpu"), "eager_lane", None)
    scheduling._eager_one[0] = None


def _chain(x, y):
    return 2 * x + 3 * y - x * y


def _expected(a, b):
    return (np.float32(2) * a + np.float32(3) * b - a * b).astype(np.float32)


def test_the_lane_runs_a_loaded_fused_call_and_matches_numpy(lane):
    f = mx.compile(_chain)
    a = np.linspace(-3, 3, 1000, dtype=np.float32)
    b = np.cos(a).astype(np.float32)
    x, y = mx.array(a), mx.array(b)
    mx.eval(x, y)
    first = f(x, y)
    mx.eval(first)  # builds the kernel: the Python path
    for _ in range(3):
        r = f(x, y)
        mx.eval(r)
        np.testing.assert_array_equal(np.array(r), _expected(a, b))
        assert r._d.node is None and r._d.buffer is not None
    assert lane.count(True) == 3


def test_memory_counters_and_cache_hits_equal_the_python_path(lane, monkeypatch):
    from tapescope.kernels.cpu import compiler

    f = mx.compile(_chain)
    x = mx.array(np.arange(4096, dtype=np.float32))
    y = mx.array(np.ones(4096, np.float32))
    mx.eval(x, y, f(x, y))
    mx.synchronize()

    lib = f(x, y)._d.node.primitive.kw["tape"].lib_name
    entry = next(e for e in compiler.entries() if e.runtime == "cuda" and e.name.startswith(lib))

    def run_three() -> tuple:
        mx.reset_peak_memory()
        hits0, active0 = entry.hits, mx.get_active_memory()
        held = []
        for _ in range(3):
            held.append(f(x, y))
            mx.eval(held[-1])
        return (entry.hits - hits0, mx.get_active_memory() - active0,
                mx.get_peak_memory() - active0, [np.array(h) for h in held])

    ran = run_three()
    assert lane.count(True) == 3
    _python_path(monkeypatch)
    python = run_three()
    assert ran[:3] == python[:3]
    assert ran[0] == 3 and ran[1] > 0 and ran[2] >= ran[1]
    for a, b in zip(ran[3], python[3]):
        np.testing.assert_array_equal(a, b)


def test_a_freed_result_goes_back_to_the_cache_and_is_reused(lane):
    f = mx.compile(_chain)
    x = mx.array(np.arange(256, dtype=np.float32))
    mx.eval(f(x, x))
    mx.synchronize()
    r = f(x, x)
    mx.eval(r)
    active = mx.get_active_memory()
    del r
    assert mx.get_active_memory() < active  # the stream was noted finished: freed at once
    cache = mx.get_cache_memory()
    r = f(x, x)
    mx.eval(r)
    assert mx.get_cache_memory() < cache  # reused from the cache
    np.testing.assert_array_equal(np.array(r), _expected(np.arange(256, dtype=np.float32),
                                                         np.arange(256, dtype=np.float32)))


def test_a_donatable_input_and_the_timeline_take_the_python_path(lane):
    f = mx.compile(lambda v: mx.exp(v) * 2 + 1)
    h = np.linspace(0, 1, 512, dtype=np.float32)
    x = mx.array(h)
    mx.eval(f(x))  # builds the kernel: the lane declines (no plan yet)
    mx.eval(f(x))
    assert lane[-1] is True
    # an input only the node holds may give its buffer to the output: the Python path decides
    t = mx.array(h) + 0
    mx.eval(t)
    r = f(t)
    del t
    mx.eval(r)
    assert lane[-1] is False
    np.testing.assert_allclose(np.array(r), np.exp(h) * 2 + 1, rtol=1e-6)
    # while the timeline records, the C lane (which has no timeline hook) is not asked: the
    # loop's fused launch runs the kernel, bracketed by timing events (its device time)
    n = len(lane)
    with timeline.record() as rec:
        mx.eval(f(x))
        mx.synchronize()
    assert len(lane) == n
    assert any(r.kind == "primitive" and r.name == "Compiled" for r in rec.records)
    work = [r for r in rec.records if r.kind == "gpu_work" and r.name == "Compiled"]
    assert work and work[-1].detail["device_time_ms"] > 0 and "tape" in work[-1].detail


def test_the_lane_under_a_stream_worker_and_from_another_thread(lane):
    import threading

    f = mx.compile(_chain)
    x = mx.array(np.arange(32, dtype=np.float32))
    y = mx.array(np.ones(32, np.float32))
    mx.eval(x, y, f(x, y))  # several arrays: the general path (may start the stream's worker)
    r = f(x, y)
    mx.eval(r)
    assert lane[-1] is True
    out = {}

    def other():
        s = mx.new_stream(mx.gpu)
        with mx.stream(s):
            g = mx.compile(_chain)
            a = g(x, y)
            mx.eval(a)
            b = g(x, y)
            mx.eval(b)
            out["b"] = np.array(b)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    np.testing.assert_array_equal(out["b"], _expected(np.arange(32, dtype=np.float32),
                                                      np.ones(32, np.float32)))


def test_an_error_in_the_lane_leaves_the_node_unevaluated_and_nothing_allocated(lane, monkeypatch):
    f = mx.compile(_chain)
    x = mx.array(np.arange(64, dtype=np.float32))
    mx.eval(f(x, x))
    mx.synchronize()
    alloc = backends.backend("gpu").allocator
    mx.clear_cache()  # no cached buffer of the size: the lane asks the allocator's malloc
    active = mx.get_active_memory()

    def refuse(size):
        raise RuntimeError(f"[malloc] Unable to allocate {size} bytes.")

    monkeypatch.setattr(alloc, "malloc", refuse)
    r = f(x, x)
    with pytest.raises(RuntimeError, match=r"\[malloc\]"):
        mx.eval(r)
    assert r._d.node is not None and r._d.node.event is None
    monkeypatch.setattr(alloc, "malloc", type(alloc).malloc.__get__(alloc))
    assert mx.get_active_memory() == active
    mx.eval(r)  # evaluates once the memory is there
    assert lane[-1] is True
    np.testing.assert_array_equal(np.array(r), _expected(np.arange(64, dtype=np.float32),
                                                         np.arange(64, dtype=np.float32)))


@pytest.mark.parametrize("n", [16, 1024, 1025, 1 << 16])
def test_the_completion_word_and_the_stream_poll_give_the_same_values(lane, n):
    """A one-block launch (up to 1024 float32 elements: 256 threads x 4) writes the host's
    completion word itself, a larger one has the stream write it; the lane's host wait ends
    on the word either way, and polling the stream instead gives the same values."""
    from tapescope.kernels.cuda import _lane

    f = mx.compile(_chain)
    a = np.linspace(-2, 2, n, dtype=np.float32)
    x = mx.array(a)
    mx.eval(f(x, x))  # builds the kernel (the Python path)
    want = _expected(a, a)
    before = _lane.stats()
    for _ in range(3):
        r = f(x, x)
        mx.eval(r)
        np.testing.assert_array_equal(np.array(r), want)
    after = _lane.stats()
    assert after["completion_word"] == "on"
    assert after["waits_by_word"] - before["waits_by_word"] == 3
    _lane.use_completion_word(False)
    try:
        r = f(x, x)
        mx.eval(r)
        np.testing.assert_array_equal(np.array(r), want)
        assert _lane.stats()["waits_by_query"] == after["waits_by_query"] + 1
    finally:
        _lane.use_completion_word(True)
    assert lane.count(True) == 4


def test_a_late_result_is_waited_for_on_the_word_before_it_is_read(lane):
    """A small call queued behind a long kernel on the same stream is read with its values
    (after both: a word, or a poll, never ends the wait early)."""
    f = mx.compile(_chain)
    big = mx.array(np.ones(1 << 24, np.float32))
    small_h = np.arange(16, dtype=np.float32)
    small = mx.array(small_h)
    mx.eval(big, small, f(small, small), f(big, big))
    for _ in range(3):
        slow = f(big, big)
        mx.async_eval(slow)  # a long kernel queued on the stream first
        r = f(small, small)
        mx.eval(r)
        np.testing.assert_array_equal(np.array(r), _expected(small_h, small_h))
        np.testing.assert_array_equal(np.array(slow[:4]), np.full(4, 4, np.float32))
