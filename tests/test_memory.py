"""The allocator, the buffer cache, donation and MLX's memory API (issue 4)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import tapescope
import tapescope.core as mx
from tapescope.kernels.allocator import Allocator, allocator
from tapescope.kernels.buffer_cache import BufferCache

PAGE = 4096


class Blk:
    def __init__(self, size):
        self.size = size
        self.freed = False


def make_cache():
    return BufferCache(PAGE, lambda b: b.size, lambda b: setattr(b, "freed", True))


# -- BufferCache ----------------------------------------------------------------------------

def test_cache_reuses_smallest_fitting_buffer():
    c = make_cache()
    big, small = Blk(300), Blk(120)
    c.recycle_to_cache(big)
    c.recycle_to_cache(small)
    assert c.reuse_from_cache(100) is small
    assert c.cache_size() == 300


@pytest.mark.parametrize("request_size,cached,reused", [
    (100, 199, True),      # < 2 * size
    (100, 200, False),     # == 2 * size: rejected
    (100, 100, True),      # exact fit
    (100, 99, False),      # too small
    (10 * PAGE, 12 * PAGE - 1, True),   # < size + 2 pages
    (10 * PAGE, 12 * PAGE, False),      # == size + 2 pages: rejected
])
def test_cache_reuse_window_boundaries(request_size, cached, reused):
    c = make_cache()
    b = Blk(cached)
    c.recycle_to_cache(b)
    got = c.reuse_from_cache(request_size)
    assert (got is b) == reused
    assert c.cache_size() == (0 if reused else cached)


def test_cache_evicts_oldest_first():
    c = make_cache()
    blocks = [Blk(100) for _ in range(10)]  # pool 1000
    for b in blocks:
        c.recycle_to_cache(b)
    n = c.release_cached_buffers(250)  # < 90%: oldest three go
    assert n == 3
    assert [b.freed for b in blocks] == [True] * 3 + [False] * 7
    assert c.cache_size() == 700


def test_cache_clears_all_when_asked_for_90_percent():
    c = make_cache()
    blocks = [Blk(100) for _ in range(10)]
    for b in blocks:
        c.recycle_to_cache(b)
    assert c.release_cached_buffers(900) == 10
    assert all(b.freed for b in blocks) and c.cache_size() == 0 and len(c) == 0


def test_cache_equal_sizes_reuse_oldest_and_keep_lru_consistent():
    c = make_cache()
    a, b, d = Blk(64), Blk(64), Blk(64)
    for x in (a, b, d):
        c.recycle_to_cache(x)
    assert c.reuse_from_cache(64) is a
    assert c.release_cached_buffers(10) == 1 and b.freed and not d.freed
    assert c.buffers() == [d]


# -- Allocator policy -----------------------------------------------------------------------

def fresh(total=1 << 30):
    return Allocator("test", page_size=PAGE, total_memory=total)


def test_allocator_rounds_above_one_page_and_counts_real_size():
    a = fresh()
    small = a.malloc(100)
    assert small.size == 100 and a.active == 100
    big = a.malloc(PAGE + 1)
    assert big.size == 2 * PAGE and a.active == 100 + 2 * PAGE
    a.free(big)
    assert a.active == 100 and a.get_cache_memory() == 2 * PAGE
    assert a.malloc(PAGE + 5) is big  # reused from the cache


def test_allocator_memory_limit_evicts_cache_on_miss():
    a = fresh()
    bufs = [a.malloc(PAGE * 4) for _ in range(4)]
    for b in bufs:
        a.free(b)
    assert a.get_cache_memory() == 16 * PAGE
    a.set_memory_limit(20 * PAGE)
    a.malloc(8 * PAGE)  # miss: 0 + 16 + 8 pages >= 20 pages -> evict 4 pages (oldest)
    assert a.get_cache_memory() == 12 * PAGE
    assert bufs[0].raw is None and bufs[1].raw is not None


def test_allocator_cache_limit_trims_after_malloc_and_free_respects_it():
    a = fresh()
    bufs = [a.malloc(PAGE * 2) for _ in range(3)]
    for b in bufs:
        a.free(b)
    assert a.set_cache_limit(PAGE * 3) == a.memory_limit  # returns the previous limit
    assert a.get_cache_memory() == 6 * PAGE  # reclaimed on the next allocation, as MLX
    a.malloc(10)
    assert a.get_cache_memory() <= 3 * PAGE
    a.set_cache_limit(0)
    b = a.malloc(100)
    a.free(b)
    assert a.get_cache_memory() == 0


def test_allocator_impossible_request_raises_and_changes_nothing():
    a = fresh(total=1 << 20)
    keep = a.malloc(1000)
    a.free(a.malloc(2000))
    before = (a.active, a.peak, a.get_cache_memory())
    with pytest.raises(RuntimeError, match=r"^\[malloc\] Unable to allocate 2097152 bytes\."):
        a.malloc(1 << 21)
    assert (a.active, a.peak) == before[:2]
    assert keep.raw is not None


class AllocatorModel(RuleBasedStateMachine):
    """Random malloc / free / limit calls; the counters always equal a plain model."""

    def __init__(self):
        super().__init__()
        self.a = Allocator("model", page_size=PAGE, total_memory=1 << 30)
        self.live = []
        self.m_active = self.m_peak = 0
        self.m_cache = []  # list of sizes, oldest first
        self.m_mem_limit = self.a.memory_limit
        self.m_cache_limit = self.a.cache_limit

    def _m_release(self, nbytes):
        total = sum(self.m_cache)
        if nbytes >= 0.9 * total:
            self.m_cache.clear()
            return
        freed = 0
        while self.m_cache and freed < nbytes:
            freed += self.m_cache.pop(0)

    @rule(size=st.integers(1, 6 * PAGE))
    def malloc(self, size):
        buf = self.a.malloc(size)
        self.live.append(buf)
        real = -(-size // PAGE) * PAGE if size > PAGE else size
        fits = [s for s in self.m_cache if real <= s < min(2 * real, real + 2 * PAGE)]
        if fits:
            best = min(fits)
            self.m_cache.remove(best)
            self.m_active += best
        else:
            need = self.m_active + sum(self.m_cache) + real
            if need >= self.m_mem_limit:
                self._m_release(need - self.m_mem_limit)
            self.m_active += real
        self.m_peak = max(self.m_peak, self.m_active)
        if sum(self.m_cache) > self.m_cache_limit:
            self._m_release(sum(self.m_cache) - self.m_cache_limit)
        assert buf.size >= size

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1000))
    def free(self, i):
        buf = self.live.pop(i % len(self.live))
        self.a.free(buf)
        self.m_active -= buf.size
        if sum(self.m_cache) < self.m_cache_limit:
            self.m_cache.append(buf.size)

    @rule(limit=st.integers(0, 40 * PAGE))
    def cache_limit(self, limit):
        assert self.a.set_cache_limit(limit) == self.m_cache_limit
        self.m_cache_limit = limit

    @rule(limit=st.integers(4 * PAGE, 80 * PAGE))
    def memory_limit(self, limit):
        assert self.a.set_memory_limit(limit) == self.m_mem_limit
        self.m_mem_limit = limit

    @rule()
    def clear(self):
        self.a.clear_cache()
        self.m_cache.clear()

    @rule()
    def reset_peak(self):
        self.a.reset_peak_memory()
        self.m_peak = 0

    @invariant()
    def counters_match(self):
        assert self.a.active == self.m_active
        assert self.a.peak == self.m_peak
        assert self.a.get_cache_memory() == sum(self.m_cache)


TestAllocatorModel = AllocatorModel.TestCase
TestAllocatorModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# -- MLX's memory API on real arrays ------------------------------------------------------------

@pytest.fixture
def clean_memory():
    gc.collect()
    old = mx.set_cache_limit(mx.get_memory_limit())
    mx.clear_cache()
    yield
    mx.set_cache_limit(old)


def f32(n):
    return mx.array(np.arange(n, dtype=np.float32))


def test_active_returns_to_baseline_after_del(clean_memory):
    base = mx.get_active_memory()
    a = f32(1 << 16)
    b = mx.exp(a) * 2.0
    mx.eval(b)
    assert mx.get_active_memory() >= base + 2 * (1 << 18)
    del a, b
    assert mx.get_active_memory() == base


def test_cache_limit_zero_keeps_cache_empty(clean_memory):
    mx.set_cache_limit(0)
    a = f32(1 << 15)
    b = mx.exp(a)
    mx.eval(b)
    del a, b
    assert mx.get_cache_memory() == 0


def test_peak_clear_and_reset(clean_memory):
    mx.reset_peak_memory()
    assert mx.get_peak_memory() == 0
    base = mx.get_active_memory()
    a = f32(1 << 16)
    b = mx.exp(a)
    mx.eval(b)
    live = mx.get_active_memory() - base
    assert mx.get_peak_memory() >= base + live
    del a, b
    assert mx.get_cache_memory() > 0
    mx.clear_cache()
    assert mx.get_cache_memory() == 0


def test_setters_return_previous_values(clean_memory):
    old = mx.get_memory_limit()
    assert mx.set_memory_limit(12345678) == old
    assert mx.set_memory_limit(old) == 12345678
    assert mx.set_wired_limit(0) == 0
    c = mx.set_cache_limit(777)
    assert mx.set_cache_limit(c) == 777
    with pytest.raises(TypeError):
        mx.set_cache_limit(-1)


def test_default_memory_limit_is_80_percent_of_ram():
    import os

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fresh_alloc = Allocator("fresh")  # other tests may have moved the process-wide limits
    assert fresh_alloc.memory_limit == int(0.8 * ram)
    assert fresh_alloc.cache_limit == fresh_alloc.memory_limit
    assert mx.get_memory_limit() == allocator("cpu").memory_limit


def test_chain_reuses_buffers_and_keeps_memory_flat(clean_memory):
    x = f32(1 << 14) / float(1 << 14)
    mx.eval(x)
    base = mx.get_active_memory()
    for _ in range(1000):
        x = mx.exp(-x) * 0.5
    mx.eval(x)
    assert mx.get_active_memory() <= base + 4 * 4  # only the scalar constants differ
    expected = np.arange(1 << 14, dtype=np.float32) / np.float32(1 << 14)
    for _ in range(1000):
        expected = np.exp(-expected) * np.float32(0.5)
    np.testing.assert_allclose(np.array(x), expected, rtol=1e-6)
    # evaluated one step at a time too (each eval may donate its input)
    mx.reset_peak_memory()
    for _ in range(1000):
        x = mx.exp(-x)
        mx.eval(x)
    assert mx.get_peak_memory() <= mx.get_active_memory() + (1 << 16) + 64


def test_donation_never_touches_an_array_still_held(clean_memory):
    x = f32(4096) / 4096.0
    mx.eval(x)
    before = np.array(x)
    y = mx.exp(x)
    mx.eval(y)
    np.testing.assert_array_equal(np.array(x), before)
    assert x._d.buffer is not y._d.buffer
    np.testing.assert_allclose(np.array(y), np.exp(before), rtol=1e-6)


def test_donation_gives_an_unheld_input_buffer_to_the_output(clean_memory):
    x = f32(4096) + 1.0
    mx.eval(x)
    buf = x._d.buffer.buffer
    y = x * 3.0
    del x
    mx.eval(y)
    assert y._d.buffer.buffer is buf


def test_views_share_the_buffer_and_free_it_with_the_last_view(clean_memory):
    base = mx.get_active_memory()
    a = f32(1024)
    v = mx.broadcast_to(a, (4, 1024))
    mx.eval(v)
    assert v._d.buffer is a._d.buffer
    assert np.shares_memory(v._d.data, a._d.data)
    del a
    assert mx.get_active_memory() == base + 4096
    del v
    assert mx.get_active_memory() == base


def test_failed_allocation_raises_and_leaves_the_graph_valid(clean_memory):
    base = mx.get_active_memory()
    huge = mx.broadcast_to(mx.array(1.0), (1 << 24, 1 << 24)) + 1.0
    with pytest.raises(RuntimeError, match=r"\[malloc\] Unable to allocate \d+ bytes"):
        mx.eval(huge)
    assert huge._d.node is not None  # still lazy, still evaluable in principle
    del huge
    gc.collect()
    assert mx.get_active_memory() == base
    small = mx.exp(f32(8))
    np.testing.assert_allclose(np.array(small), np.exp(np.arange(8, dtype=np.float32)), rtol=1e-6)


def test_timeline_records_allocations_reuse_and_frees(clean_memory):
    a = f32(8192)
    mx.eval(a)
    del a
    with tapescope.record() as rec:
        b = f32(8192) * 2.0  # the multiply's output reuses the freed buffer
        mx.eval(b)
        del b
    kinds = [r.kind for r in rec.records]
    assert "cache_reuse" in kinds or "alloc" in kinds
    assert "free_to_cache" in kinds


def test_metal_aliases_warn_once(capsys):
    v1 = mx.metal.get_active_memory()
    mx.metal.get_active_memory()
    err = capsys.readouterr().err
    assert err.count("mx.metal.get_active_memory is deprecated") == 1
    assert isinstance(v1, int)


def test_cpu_allocator_is_the_memory_api_source():
    assert allocator("cpu").active == mx.get_active_memory()


def test_broadcast_views_are_never_donated(clean_memory):
    x = mx.broadcast_to(mx.array(2.0), (1,))  # contiguous-looking but a read-only view
    y = x / 4.0
    del x
    np.testing.assert_array_equal(np.array(y), np.array([0.5], np.float32))
    z = mx.broadcast_to(mx.array(np.float32(3.0)), (1, 1)) * 2.0
    np.testing.assert_array_equal(np.array(z), np.array([[6.0]], np.float32))


def test_a_numpy_view_keeps_its_buffer_from_being_reused(clean_memory):
    x = f32(4096) * 1.0
    v = np.array(x, copy=False)
    expected = np.arange(4096, dtype=np.float32)
    assert not v.flags.writeable
    active = mx.get_active_memory()
    del x
    assert mx.get_active_memory() == active  # the view still holds the memory
    y = f32(4096) * 7.0  # would reuse the freed buffer if the view did not hold it
    mx.eval(y)
    np.testing.assert_array_equal(v, expected)
    before = mx.get_active_memory()
    del v  # the last holder of x's buffer
    assert mx.get_active_memory() == before - 4096 * 4


def test_eager_steps_donate_on_every_path(clean_memory):
    """``x = f(x); mx.eval(x)``: each step's only input is unheld, so the output takes its
    buffer — through the one-node fast path, the inline path and a worker stream alike."""
    s = mx.new_stream(mx.cpu)
    for stream in (None, s):
        x = f32(4096) + 1.0
        mx.eval(x)
        buf = x._d.buffer.buffer
        for _ in range(5):
            x = mx.exp(-x, stream=stream)  # one node over an evaluated input
            mx.async_eval(x) if stream is not None else mx.eval(x)
            mx.synchronize(s)
            assert x._d.buffer.buffer is buf


def test_multi_output_compiled_tape_takes_an_unheld_input_buffer(clean_memory):
    def two(a):
        y = mx.exp(a) * 2.0
        return y, mx.sin(y) + 1.0  # one fused tape with two outputs

    f = mx.compile(two)
    vals = np.linspace(-1, 1, 4096, dtype=np.float32)
    t = mx.array(vals) * 1.0
    mx.eval(t)
    buf = t._d.buffer.buffer
    e, s = f(t)
    del t  # now only the Compiled node holds it
    mx.eval(e, s)
    assert e._d.buffer.buffer is buf  # MLX's rule: the first output takes the donor's buffer
    assert s._d.buffer.buffer is not buf
    want = np.exp(vals) * np.float32(2)
    np.testing.assert_allclose(np.array(e), want, rtol=1e-6)
    np.testing.assert_allclose(np.array(s), np.sin(want) + 1, rtol=1e-5, atol=1e-6)
    held = mx.array(vals) * 1.0
    mx.eval(held)
    e2, _ = f(held)
    mx.eval(e2)
    assert e2._d.buffer is not held._d.buffer  # held elsewhere: never donated
    np.testing.assert_array_equal(np.array(held), vals)
