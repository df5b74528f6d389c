"""The CUDA lane's buffer-cache steps in C (``kernels/cuda/_lane.c`` cache_take and
cache_recycle) against BufferCache's own methods (``_take``, ``recycle_to_cache``): random
sequences of recycles and takes run on two caches, one through each, and every field of
the two caches stays equal. Needs only the built extension (no GPU)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tapescope.kernels.buffer_cache import BufferCache

_lane = pytest.importorskip("tapescope.kernels.cuda._lane",
                            reason="the C extension kernels/cuda/_lane.c is not built here")


class Buf:
    def __init__(self, size: int, tag: int):
        self.size, self.tag = size, tag


def _state(c: BufferCache) -> tuple:
    return (list(c._sizes), {k: (type(q), [(s, b.tag) for s, b in q]) for k, q in c._by_size.items()},
            list(c._lru.items()), c.pool_size, len(c))


def _cache() -> BufferCache:
    return BufferCache(4096, lambda b: b.size, lambda b: None)


# an op: ("recycle", size) or ("take", k): take the k-th size present (mod their number)
ops = st.lists(st.one_of(st.tuples(st.just("recycle"), st.sampled_from([8, 64, 256, 4096, 16384])),
                         st.tuples(st.just("take"), st.integers(0, 7))), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_c_steps_change_the_cache_as_its_methods_do(seq):
    py, c = _cache(), _cache()
    tag = 0
    for op, v in seq:
        if op == "recycle":
            tag += 1
            py.recycle_to_cache(Buf(v, tag))
            _lane.cache_recycle(c, Buf(v, tag), v)
        elif py._sizes:
            size = py._sizes[v % len(py._sizes)]
            a, b = py._take(size), _lane.cache_take(c, size)
            assert (a.tag, a.size) == (b.tag, b.size)
        assert _state(py) == _state(c)


def test_taking_a_size_that_is_not_cached_raises_and_changes_nothing():
    c = _cache()
    _lane.cache_recycle(c, Buf(64, 1), 64)
    before = _state(c)
    with pytest.raises(KeyError):
        _lane.cache_take(c, 128)
    assert _state(c) == before
