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


# -- MLX's roundings in C, around the size classes' boundaries ------------------------------

def _mlx_round(policy: str, size: int, page: int) -> int:
    """mlx/backend/cuda/allocator.cpp (8 bytes at most from the scalar pool; under a page the
    next power of two, mlx/utils.h next_power_of_2; else whole pages) and
    mlx/backend/metal/allocator.cpp (whole pages above one page), written out here."""
    if policy == "cuda":
        if size <= 8:
            return 8
        if size < page:
            p = 1
            while p < size:
                p *= 2
            return p
    elif size <= page:
        return size
    return (size + page - 1) // page * page


# sizes at and next to the powers of two and the page multiples (16 KiB: CUDA's page)
boundary = st.builds(lambda base, d: max(1, base + d),
                     st.one_of(st.sampled_from([1 << k for k in range(0, 23)]),
                               st.integers(1, 64).map(lambda m: m * 16384),
                               st.integers(1, 64).map(lambda m: m * 4096)),
                     st.integers(-2, 2))


@settings(max_examples=300, deadline=None)
@given(st.lists(boundary, min_size=1, max_size=8), st.sampled_from(["metal", "cuda"]))
def test_the_c_malloc_rounds_as_mlx_around_the_size_classes(sizes, policy):
    p = POLICIES[policy]
    c, py = (cls("gpu", policy=p, total_memory=1 << 33, page_size=16384)
             for cls in (Allocator, PyAllocator))
    called = Allocator("gpu", policy=p, total_memory=1 << 33, page_size=16384)
    called._round_kind = 0  # the policy's Python function, called from C
    assert c._round_kind == (3 if policy == "cuda" else 2)
    for n in sizes:
        want = _mlx_round(policy, n, 16384)
        got = [a.malloc(n).size for a in (c, py, called)]
        assert got == [want] * 3, (n, got, want)
        assert p.round_size(n, 16384) == want
    assert c.active == py.active == called.active == sum(_mlx_round(policy, n, 16384) for n in sizes)


# -- stream-ordered frees: the C seal against the Python one --------------------------------

class _Event:
    def __init__(self):
        self.done = False


def _deferring(cls):
    """``cls`` as a device's allocator: frees are held while ``streams`` is not empty, and a
    seal's events are one new event while a stream runs (as ``_unfinished_events`` makes
    one per unfinished stream), kept in ``events`` in the order made."""

    class Deferring(cls):
        def __init__(self):
            super().__init__("gpu", policy=POLICIES["cuda"], total_memory=1 << 30)
            self._defer = set()
            self._batch, self._batch_bytes = 3, 1 << 16
            self.events: list = []

        def _seal_events(self):
            if not self._defer:
                return []
            ev = _Event()
            self.events.append(ev)
            return [ev]

    return Deferring


def _seal_state(a) -> tuple:
    return (a.active, a.peak, a.get_cache_memory(), [b.size for b in a.cache.buffers()],
            [b.size for b in a._held], a._held_bytes, a._held_batches,
            [([e.done for e in evs], [b.size for b in bufs]) for evs, bufs in a._pending],
            len(a.events))


# ("malloc", size), ("free", k), ("run", 0): a stream has work, ("idle", 0): every stream
# seen finished, ("finish", k): the k-th event made completes, ("seal", 0), ("clear", 0)
seal_ops = st.lists(st.one_of(
    st.tuples(st.just("malloc"), st.sampled_from([8, 100, 4096, 5000, 16384, 20000])),
    st.tuples(st.just("malloc"), st.sampled_from([8, 100, 4096])),
    st.tuples(st.just("free"), st.integers(0, 9)), st.tuples(st.just("free"), st.integers(0, 9)),
    st.tuples(st.just("run"), st.just(0)), st.tuples(st.just("idle"), st.just(0)),
    st.tuples(st.just("finish"), st.integers(0, 12)), st.tuples(st.just("seal"), st.just(0)),
    st.tuples(st.just("clear"), st.just(0)),
    st.tuples(st.just("cache_limit"), st.sampled_from([0, 20000, 1 << 20]))), max_size=80)


@settings(max_examples=150, deadline=None)
@given(seal_ops, st.booleans())
def test_the_c_seal_holds_and_gives_back_as_the_python_seal(seq, record):
    """Held frees, their batches' events, the cache and the counters, step by step, and the
    buffers handed out: equal under the C steps (AllocatorBase's free / malloc / _seal) and
    the Python reference; a buffer in a batch whose event has not completed is never
    handed out again."""
    got = []
    for cls in (_deferring(Allocator), _deferring(PyAllocator)):
        a = cls()
        live, handed, states = [], [], []
        ctx = timeline.record() if record else None
        rec = ctx.__enter__() if ctx else None
        for op, v in seq:
            if op == "malloc":
                buf = a.malloc(v)
                busy = [b for evs, bufs in a._pending for b in bufs] + list(a._held)
                assert all(buf is not b for b in busy)
                first = next((i for i, b in enumerate(handed) if b is buf), None)
                states.append(("got", len(handed) if first is None else first))
                if first is None:
                    handed.append(buf)
                live.append(buf)
            elif op == "free" and live:
                a.free(live.pop(v % len(live)))
            elif op == "run":
                a._defer.add(0)
            elif op == "idle":
                a._defer.clear()
                for ev in a.events:  # all the work is done
                    ev.done = True
            elif op == "finish" and a.events:
                a.events[v % len(a.events)].done = True
            elif op == "seal":
                a._seal()
            elif op == "clear":
                a.clear_cache()
            elif op == "cache_limit":
                a.set_cache_limit(v)
            states.append(_seal_state(a))
        a._defer.clear()
        for ev in a.events:
            ev.done = True
        for buf in live:
            a.free(buf)
        a._seal()
        states.append(_seal_state(a))
        if ctx:
            ctx.__exit__(None, None, None)
        got.append((states, _records(rec) if rec else None))
    assert got[0] == got[1]
    assert got[0][0][-1][0] == 0 and got[0][0][-1][4] == [] and got[0][0][-1][7] == []


# -- out of memory: the cache emptied and the allocation tried again ------------------------

def _bounded(cls, budget: int):
    """``cls`` over a device of ``budget`` bytes: ``_raw_alloc`` raises MemoryError (as the
    CUDA allocator's does after cudaMalloc fails) when the memory alive would pass it."""

    class Bounded(cls):
        def __init__(self):
            super().__init__("gpu", policy=POLICIES["cuda"], total_memory=1 << 30)
            self.alive = 0
            self.failures = 0

        def _raw_alloc(self, size):
            if self.alive + size > budget:
                self.failures += 1
                raise MemoryError("out of device memory")
            self.alive += size
            return np.empty(size, np.uint8)

        def _release(self, buf):
            self.alive -= buf.size
            super()._release(buf)

    return Bounded


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("malloc"), st.sampled_from([100, 4096, 20000, 40000, 70000])),
                          st.tuples(st.just("free"), st.integers(0, 9))), max_size=50))
def test_out_of_memory_frees_the_cache_and_retries_as_the_python_allocator(seq):
    """A failed allocation empties the cache and tries once more; one that still fails
    raises MLX's ``[malloc] Unable to allocate`` and changes no counter: the same under the
    C steps and the Python ones."""
    got = []
    for cls in (_bounded(Allocator, 100_000), _bounded(PyAllocator, 100_000)):
        a = cls()
        live, states = [], []
        for op, v in seq:
            if op == "malloc":
                before = (a.active, a.peak)
                try:
                    live.append(a.malloc(v))
                    states.append(("ok", live[-1].size))
                except RuntimeError as e:
                    assert str(e).startswith(f"[malloc] Unable to allocate {_mlx_round('cuda', v, 16384)} bytes")
                    assert (a.active, a.peak) == before
                    states.append(("raised",))
            elif live:
                a.free(live.pop(v % len(live)))
            states.append((a.active, a.peak, a.get_cache_memory(), a.alive, a.failures))
        got.append(states)
    assert got[0] == got[1]


# -- a buffer's view in C --------------------------------------------------------------------

def test_a_registered_buffer_types_view_in_c_is_its_view_method():
    """view_c makes what the Python ``view`` makes (type, dtype, shape, memory), keeps the
    last view where the type has that slot, and declines what it does not know."""
    from tapescope.kernels.allocator import Buffer

    class Dev(np.ndarray):
        pass

    class Wrapped:
        __slots__ = ("raw", "shape", "strides", "data")

        def __init__(self, raw):
            self.raw = raw
            self.shape, self.strides, self.data = raw.shape, raw.strides, raw.data

    class Sliced(Buffer):
        __slots__ = ()

        def view(self, nbytes, dtype, shape):
            if dtype == np.dtype(np.float16):
                return Wrapped(self.raw[:nbytes].view(np.uint16).reshape(shape))
            return self.raw[:nbytes].view(dtype).reshape(shape)

    class Kept(Sliced):
        __slots__ = ("last",)

        def __init__(self, raw, size):
            super().__init__(raw, size)
            self.last = None

    wraps = {np.dtype(np.float16): (np.dtype(np.uint16), Wrapped)}
    for t in (Sliced, Kept):
        _handle.view_form(t, "slice", Dev, wraps, np.dtype(np.uint8))
    raw = np.arange(4096, dtype=np.uint8).view(Dev)
    for t in (Sliced, Kept):
        b = t(raw, 4096)
        for dtype, shape in ((np.float32, (4, 8)), (np.int16, (3,)), (np.float16, (2, 5)), (np.uint8, ())):
            dt = np.dtype(dtype)
            n = dt.itemsize * int(np.prod(shape))
            made, ref = _handle.view(b, n, dt, shape), b.view(n, dt, shape)
            assert type(made) is type(ref)
            v = made
            if type(v) is Wrapped:
                assert (v.shape, v.strides, v.data) == (ref.shape, ref.strides, ref.data)
                v, ref = v.raw, ref.raw
            assert type(v) is Dev and v.dtype == ref.dtype and v.shape == ref.shape
            assert v.ctypes.data == ref.ctypes.data and np.array_equal(v, ref)
            again = _handle.view(b, n, dt, shape)  # the same object only where it is kept
            assert (again is made) == (t is Kept)
            if t is Kept:
                assert b.last == (shape, dt, made)
    assert _handle.view(Buffer(raw, 4096), 16, np.dtype(np.float32), (4,)) is None  # no form
    flat_not = Sliced(np.zeros((4, 4), np.uint8).view(Dev), 16)
    assert _handle.view(flat_not, 16, np.dtype(np.float32), (4,)) is None  # the method's case
