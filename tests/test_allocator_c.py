"""The allocator's malloc / free / adopt in C (``kernels/_handle.c`` AllocatorBase) against
its Python steps (``Allocator._malloc`` / ``_free`` / ``_adopt``): random sequences on two
allocators of each policy, one through each, leave the same counters, the same cache (its
sizes, FIFOs and LRU order) and the same timeline records; and the buffer cache's C steps
change a cache as BufferCache's own methods do."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tapescope.kernels import timeline
from tapescope.kernels.allocator import POLICIES, Allocator
from tapescope.kernels.buffer_cache import BufferCache

_handle = pytest.importorskip("tapescope.kernels._handle",
                              reason="the C extension kernels/_handle.c is not built here")


def _state(a: Allocator) -> tuple:
    c = a.cache
    return (a.active, a.peak, c.pool_size, list(c._sizes),
            {k: [b.size for _, b in q] for k, q in c._by_size.items()}, list(c._lru.values()))


def _records(rec) -> list:
    return [(r.kind, r.nbytes, {k: v for k, v in (r.detail or {}).items() if k != "buffer"})
            for r in rec.records]


# an op: ("malloc", size), ("free", k): free the k-th live buffer, ("adopt", n float32s)
ops = st.lists(st.one_of(st.tuples(st.just("malloc"), st.sampled_from([8, 100, 4096, 5000, 9000, 20000])),
                         st.tuples(st.just("free"), st.integers(0, 9)),
                         st.tuples(st.just("adopt"), st.integers(0, 300))), max_size=50)


def _run(a: Allocator, seq, c_path: bool) -> list:
    malloc, free, adopt = (a.malloc, a.free, a.adopt) if c_path else (a._malloc, a._free, a._adopt)
    live, states = [], []
    for op, v in seq:
        if op == "malloc":
            live.append(malloc(v))
        elif op == "adopt":
            live.append(adopt(np.empty(v, np.float32)))
        elif live:
            free(live.pop(v % len(live)))
        states.append(_state(a))
    return states


@settings(max_examples=60, deadline=None)
@given(ops, st.sampled_from(["cpu", "metal", "cuda"]), st.sampled_from([0, 12000, 1 << 20]),
       st.booleans())
def test_the_c_steps_keep_the_allocator_as_its_python_steps_do(seq, policy, cache_limit, record):
    def make():
        a = Allocator("gpu" if policy != "cpu" else "cpu", policy=POLICIES[policy],
                      total_memory=1 << 30)
        a.set_cache_limit(cache_limit)
        return a

    got = []
    for c_path in (True, False):
        a = make()
        if record:
            with timeline.record() as rec:
                states = _run(a, seq, c_path)
            got.append((states, _records(rec)))
        else:
            got.append((_run(a, seq, c_path), None))
    assert got[0] == got[1]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("recycle"), st.sampled_from([8, 64, 256, 4096, 16384])),
                          st.tuples(st.just("take"), st.integers(0, 7)),
                          st.tuples(st.just("reuse"), st.sampled_from([8, 60, 200, 4096, 9000]))),
                max_size=60))
def test_the_c_cache_steps_change_the_cache_as_its_methods_do(seq):
    class Buf:
        def __init__(self, size: int, tag: int):
            self.size, self.tag = size, tag

    def state(c):
        return (list(c._sizes), {k: [(s, b.tag) for s, b in q] for k, q in c._by_size.items()},
                list(c._lru.items()), c.pool_size)

    py, c = (BufferCache(4096, None, lambda b: None) for _ in range(2))
    for tag, (op, v) in enumerate(seq):
        if op == "recycle":
            py.recycle_to_cache(Buf(v, tag))
            _handle.cache_recycle(c, Buf(v, tag), v)
        elif op == "reuse":
            a, b = py.reuse_from_cache(v), _handle.cache_reuse(c, v)
            assert (a and a.tag) == (b and b.tag)
        elif py._sizes:
            size = py._sizes[v % len(py._sizes)]
            assert py._take(size).tag == _handle.cache_take(c, size).tag
        assert state(py) == state(c)
    with pytest.raises(KeyError):
        _handle.cache_take(c, 12345)
