"""The allocator's C state and steps (``kernels/_handle.c``: AllocatorBase, BufferCache, Lock)
against the Python allocator (``allocator.PyAllocator`` over ``buffer_cache.PyBufferCache``,
the whole allocator where the extension is not built): random sequences of malloc / free /
adopt / limits / clear_cache / reset_peak on one allocator of each, under each MLX policy,
leave the same counters, the same cache (its buffers oldest first), hand out the same
buffers and make the same timeline records; the two caches on their own change alike and
free in the same order; the lock is reentrant and waits for another thread's hold."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tapescope.kernels import timeline
from tapescope.kernels.allocator import POLICIES, Allocator, PyAllocator
from tapescope.kernels.buffer_cache import PyBufferCache

_handle = pytest.importorskip("tapescope.kernels._handle",
                              reason="the C extension kernels/_handle.c is not built here")


def test_the_allocator_is_the_c_state_over_the_python_class():
    a = Allocator("cpu", total_memory=1 << 30)
    assert isinstance(a, _handle.AllocatorBase) and isinstance(a, PyAllocator)
    assert type(a.cache) is _handle.BufferCache and type(a._lock) is _handle.Lock
    p = PyAllocator("cpu", total_memory=1 << 30)
    assert type(p.cache) is PyBufferCache and not isinstance(p, _handle.AllocatorBase)
    with pytest.raises(TypeError):
        a.cache = PyBufferCache(4096, None, lambda b: None)  # the C steps need the C cache


def _state(a) -> tuple:
    return (a.active, a.peak, a.get_cache_memory(), len(a.cache), a.cache_limit,
            a.memory_limit, [b.size for b in a.cache.buffers()])


def _records(rec) -> list:
    return [(r.kind, r.nbytes, {k: v for k, v in (r.detail or {}).items() if k != "buffer"})
            for r in rec.records]


# an op: ("malloc", size), ("free", k): the k-th live buffer, ("adopt", n float32s),
# ("cache_limit", n), ("memory_limit", n), ("clear", 0), ("reset_peak", 0)
sizes = st.sampled_from([1, 8, 100, 4096, 5000, 9000, 16384, 20000, 70000])
ops = st.lists(st.one_of(
    st.tuples(st.just("malloc"), sizes), st.tuples(st.just("malloc"), sizes),
    st.tuples(st.just("free"), st.integers(0, 9)), st.tuples(st.just("free"), st.integers(0, 9)),
    st.tuples(st.just("adopt"), st.integers(0, 300)),
    st.tuples(st.just("cache_limit"), st.sampled_from([0, 9000, 40000, 1 << 20])),
    st.tuples(st.just("memory_limit"), st.sampled_from([30000, 100000, 1 << 30])),
    st.tuples(st.just("clear"), st.just(0)), st.tuples(st.just("reset_peak"), st.just(0))),
    max_size=60)


def _run(a, seq) -> list:
    """Each step's state, and which buffer each malloc returned (by the order buffers were
    first handed out: a reuse names the buffer it reused)."""
    live, states, handed = [], [], []  # (handed: kept, so no two buffers share an id())
    for op, v in seq:
        if op == "malloc":
            buf = a.malloc(v)
            first = next((i for i, b in enumerate(handed) if b is buf), None)
            states.append(("got", len(handed) if first is None else first, buf.size))
            if first is None:
                handed.append(buf)
            live.append(buf)
        elif op == "adopt":
            live.append(a.adopt(np.empty(v, np.float32)))
        elif op == "free":
            if live:
                a.free(live.pop(v % len(live)))
        elif op == "cache_limit":
            states.append(("old", a.set_cache_limit(v)))
        elif op == "memory_limit":
            states.append(("old", a.set_memory_limit(v)))
        elif op == "clear":
            a.clear_cache()
        else:
            a.reset_peak_memory()
        states.append(_state(a))
    for buf in live:  # everything back: the counters return to zero
        a.free(buf)
    states.append(_state(a))
    return states


@settings(max_examples=80, deadline=None)
@given(ops, st.sampled_from(["cpu", "metal", "cuda"]), st.booleans())
def test_the_c_allocator_keeps_the_state_the_python_allocator_does(seq, policy, record):
    got = []
    for cls in (Allocator, PyAllocator):
        a = cls("gpu" if policy != "cpu" else "cpu", policy=POLICIES[policy],
                total_memory=1 << 30)
        if record:
            with timeline.record() as rec:
                states = _run(a, seq)
            got.append((states, _records(rec)))
        else:
            got.append((_run(a, seq), None))
    assert got[0] == got[1]
    assert got[0][0][-1][0] == 0  # nothing active after every buffer is back


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("recycle"), st.sampled_from([8, 64, 256, 4096, 16384])),
                          st.tuples(st.just("recycle"), st.sampled_from([100, 8000, 9000])),
                          st.tuples(st.just("reuse"), st.sampled_from([8, 60, 200, 4096, 9000])),
                          st.tuples(st.just("release"), st.sampled_from([0, 1, 100, 5000, 30000])),
                          st.tuples(st.just("clear"), st.just(0))),
                max_size=60))
def test_the_c_cache_changes_and_frees_as_the_python_cache(seq):
    class Buf:
        def __init__(self, size: int, tag: int):
            self.size, self.tag = size, tag

    results = []
    for cls in (_handle.BufferCache, PyBufferCache):
        freed: list = []
        c = cls(4096, None, lambda b, freed=freed: freed.append(b.tag))
        out = []
        for tag, (op, v) in enumerate(seq):
            if op == "recycle":
                c.recycle_to_cache(Buf(v, tag))
            elif op == "reuse":
                b = c.reuse_from_cache(v)
                out.append(b and b.tag)
            elif op == "release":
                out.append(c.release_cached_buffers(v))
            else:
                out.append(c.clear())
            out.append(([b.tag for b in c.buffers()], c.pool_size, c.cache_size(), len(c),
                        list(freed)))
        results.append(out)
    assert results[0] == results[1]


def test_a_get_size_counts_the_buffer_at_its_size_and_a_failing_free_leaves_the_cache_empty():
    class Buf:
        def __init__(self, n):
            self.n = self.size = n

    for cls in (_handle.BufferCache, PyBufferCache):
        c = cls(4096, lambda b: b.n, lambda b: None)
        c.recycle_to_cache(Buf(300))
        assert c.cache_size() == 300 and c.reuse_from_cache(299).n == 300

        def refuse(b):
            raise ValueError("no")

        c = cls(4096, None, refuse)
        for n in (10, 20):
            c.recycle_to_cache(Buf(n))
        with pytest.raises(ValueError):
            c.clear()
        assert c.cache_size() == 0 and len(c) == 0 and c.buffers() == []


def test_the_lock_is_reentrant_and_holds_another_thread_off():
    lock = _handle.Lock()
    with lock:
        with lock:
            assert lock._is_owned()
        assert lock._is_owned()
    assert not lock._is_owned()
    with pytest.raises(RuntimeError):
        lock.release()
    assert lock.acquire() is True and lock.acquire(blocking=False) is True
    lock.release()
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False)))
    t.start()
    t.join()
    assert got == [False]  # held by this thread
    lock.release()
    t = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False)) or lock.release())
    t.start()
    t.join()
    assert got == [False, True]


def test_threads_mallocing_and_freeing_one_allocator_leave_exact_counters():
    a = Allocator("cpu", total_memory=1 << 30)
    a.set_cache_limit(64 * 1024)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        live = []
        try:
            for _ in range(3000):
                if live and rng.random() < 0.5:
                    a.free(live.pop(int(rng.integers(len(live)))))
                elif rng.random() < 0.05:
                    with a._lock:  # the Python steps' hold, as set_cache_limit takes it
                        a.set_cache_limit(int(rng.choice([0, 16 * 1024, 64 * 1024])))
                else:
                    live.append(a.malloc(int(rng.choice([64, 100, 4096, 9000]))))
            for b in live:
                a.free(b)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert a.active == 0
    assert a.get_cache_memory() == sum(b.size for b in a.cache.buffers()) <= a.cache_limit
    assert a.peak > 0
