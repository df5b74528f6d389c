"""A CUDA stream's evals through the one eval loop (core/_loop.c's eager_eval and run_node,
or their Python references): ``mx.eval`` of a loaded fused call launches it through the
backend's C launch and waits through its C wait (``CudaBackend.device_api``, cuda/_driver.c;
else the hook ``CudaBackend.launch_fused`` and the event's wait) and gives numpy's values, the same allocator
counters, kernel-cache hits and dispatch counts whether or not the timeline records (which
adds the call's device time), frees go back to the cache, an error leaves the node lazy.
Runs where CuPy reaches a GPU and ``TAPESCOPE_CUDA=1`` (the H200 machine).
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.core import evaluate
from tapescope.kernels import backends, timeline

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")


@pytest.fixture(autouse=True)
def _gpu_default(gpu_default_device):
    yield


def _device_launches() -> int:
    return evaluate.dispatch_counts()["fused_kernel_device"]


def _chain(x, y):
    return 2 * x + 3 * y - x * y


def _expected(a, b):
    return (np.float32(2) * a + np.float32(3) * b - a * b).astype(np.float32)


def test_a_loaded_fused_call_is_launched_by_the_loop_and_matches_numpy():
    f = mx.compile(_chain)
    a = np.linspace(-3, 3, 1000, dtype=np.float32)
    b = np.cos(a).astype(np.float32)
    x, y = mx.array(a), mx.array(b)
    mx.eval(x, y)
    mx.eval(f(x, y))  # builds the kernel
    n = _device_launches()
    for _ in range(3):
        r = f(x, y)
        mx.eval(r)
        np.testing.assert_array_equal(np.array(r), _expected(a, b))
        assert r._d.node is None and r._d.buffer is not None
    assert _device_launches() - n == 3


def test_recording_changes_nothing_but_the_records():
    """The counters, the cache hits, the dispatch paths and the values are the same with the
    timeline on and off; recording adds the call's device time (gpu_work)."""
    from tapescope.kernels.cpu import compiler

    f = mx.compile(_chain)
    x = mx.array(np.arange(4096, dtype=np.float32))
    y = mx.array(np.ones(4096, np.float32))
    mx.eval(x, y, f(x, y))
    mx.synchronize()
    lib = f(x, y)._d.node.primitive.kw["tape"].lib_name
    entry = next(e for e in compiler.entries() if e.runtime == "cuda" and e.name.startswith(lib))

    def run_three() -> tuple:
        mx.synchronize()
        mx.reset_peak_memory()
        counts0, hits0, active0 = evaluate.dispatch_counts(), entry.hits, mx.get_active_memory()
        held = []
        for _ in range(3):
            held.append(f(x, y))
            mx.eval(held[-1])
        counts = evaluate.dispatch_counts()
        return ({k: counts[k] - counts0[k] for k in counts}, entry.hits - hits0,
                mx.get_active_memory() - active0, [np.array(h) for h in held])

    off = run_three()
    with timeline.record() as rec:
        on = run_three()
        mx.synchronize()
    assert off[:3] == on[:3] and off[0]["fused_kernel_device"] == 3 and off[1] == 3
    for a, b in zip(off[3], on[3]):
        np.testing.assert_array_equal(a, b)
    work = [r for r in rec.records if r.kind == "gpu_work" and r.name == "Compiled"]
    assert len(work) == 3 and work[-1].detail["device_time_ms"] > 0 and "tape" in work[-1].detail


def test_a_freed_result_goes_back_to_the_cache_and_is_reused():
    f = mx.compile(_chain)
    h = np.arange(256, dtype=np.float32)
    x = mx.array(h)
    mx.eval(f(x, x))
    mx.synchronize()
    r = f(x, x)
    mx.eval(r)
    active = mx.get_active_memory()
    del r
    assert mx.get_active_memory() < active  # the eval waited: the stream is finished
    cache = mx.get_cache_memory()
    r = f(x, x)
    mx.eval(r)
    assert mx.get_cache_memory() < cache  # reused from the cache
    np.testing.assert_array_equal(np.array(r), _expected(h, h))


def test_a_donatable_input_gives_its_buffer_as_the_python_path_decides():
    f = mx.compile(lambda v: mx.exp(v) * 2 + 1)
    h = np.linspace(0, 1, 512, dtype=np.float32)
    mx.eval(f(mx.array(h)))  # builds the kernel
    t = mx.array(h) + 0
    mx.eval(t)
    r = f(t)
    del t  # only the node holds it: evaluate._donor may give its buffer to the output
    mx.eval(r)
    np.testing.assert_allclose(np.array(r), np.exp(h) * 2 + 1, rtol=1e-6)


def test_under_a_stream_worker_and_from_another_thread():
    f = mx.compile(_chain)
    a, b = np.arange(32, dtype=np.float32), np.ones(32, np.float32)
    x, y = mx.array(a), mx.array(b)
    mx.eval(x, y, f(x, y))  # several arrays: may start the stream's worker
    r = f(x, y)
    mx.eval(r)
    np.testing.assert_array_equal(np.array(r), _expected(a, b))
    out = {}

    def other():
        s = mx.new_stream(mx.gpu)
        with mx.stream(s):
            g = mx.compile(_chain)
            mx.eval(g(x, y))
            c = g(x, y)
            mx.eval(c)
            out["c"] = np.array(c)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    np.testing.assert_array_equal(out["c"], _expected(a, b))


def test_an_error_leaves_the_node_unevaluated_and_nothing_allocated(monkeypatch):
    f = mx.compile(_chain)
    h = np.arange(64, dtype=np.float32)
    x = mx.array(h)
    mx.eval(f(x, x))
    mx.synchronize()
    alloc = backends.backend("gpu").allocator
    mx.clear_cache()
    active = mx.get_active_memory()

    def refuse(size):
        raise RuntimeError(f"[malloc] Unable to allocate {size} bytes.")

    monkeypatch.setattr(alloc, "malloc", refuse)
    r = f(x, x)
    with pytest.raises(RuntimeError, match=r"\[malloc\]"):
        mx.eval(r)
    assert r._d.node is not None and r._d.node.event is None
    monkeypatch.undo()
    assert mx.get_active_memory() == active
    mx.eval(r)  # evaluates once the memory is there
    np.testing.assert_array_equal(np.array(r), _expected(h, h))


def test_a_late_result_is_waited_for_before_it_is_read():
    """A small call queued behind a long kernel on the same stream is read with its values."""
    f = mx.compile(_chain)
    big = mx.array(np.ones(1 << 24, np.float32))
    small_h = np.arange(16, dtype=np.float32)
    small = mx.array(small_h)
    mx.eval(big, small, f(small, small), f(big, big))
    for _ in range(3):
        slow = f(big, big)
        mx.async_eval(slow)
        r = f(small, small)
        mx.eval(r)
        np.testing.assert_array_equal(np.array(r), _expected(small_h, small_h))
        np.testing.assert_array_equal(np.array(slow[:4]), np.full(4, 4, np.float32))


def _driver_stats():
    """The C launch and wait's counters (kernels/cuda/_driver.c), or None where the
    backend has no C hooks (the extension not built)."""
    if backends.backend("gpu").device_api is None:
        return None
    from tapescope.kernels.cuda import _driver

    return _driver.stats()


@pytest.mark.parametrize("word", [True, False], ids=["completion_word", "stream_query"])
def test_the_loop_launches_and_waits_through_the_backends_c_hooks(word):
    """Each synchronised call is one C launch and one C wait, timeline on and off alike,
    and the values are numpy's whether the wait reads the completion word or polls."""
    if _driver_stats() is None:
        pytest.skip("the CUDA backend's C hooks are not built")
    from tapescope.kernels.cuda import _driver

    f = mx.compile(_chain)
    a = np.linspace(-2, 2, 3000, dtype=np.float32)
    x = mx.array(a)
    mx.eval(x, f(x, x))
    _driver.use_completion_word(word)
    try:
        for recording in (False, True):
            s0 = _driver.stats()
            with (timeline.record() if recording else contextlib.nullcontext()):
                for _ in range(3):
                    r = f(x, x)
                    mx.eval(r)
                    np.testing.assert_array_equal(np.array(r), _expected(a, a))
            s1 = _driver.stats()
            assert s1["launches"] - s0["launches"] == 3
            waits = {k: s1[k] - s0[k] for k in ("waits_by_word", "waits_by_query")}
            assert sum(waits.values()) >= 3
            if not word:
                assert waits["waits_by_word"] == 0
    finally:
        _driver.use_completion_word(True)

