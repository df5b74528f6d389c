"""kernels/cpu/views.py: the CPU's own Broadcast view is numpy's ``broadcast_to`` (values,
shape, strides, read-only), for 0-d, contiguous and strided inputs of any dtype; _views.c's
reshape and transpose are the definitions' rules' (numpy's views, or copies where numpy
copies)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tapescope.kernels.cpu import views


@st.composite
def broadcasts(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    target = lead + tuple(d if d != 1 else draw(st.integers(1, 3)) for d in shape)
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int64, np.bool_]))
    a = (np.arange(max(1, int(np.prod(shape, dtype=np.int64))) * 2) % 7).astype(dtype)
    if draw(st.booleans()) and ndim:  # a strided input: every other element
        a = a[::2][:int(np.prod(shape))].reshape(shape)
    else:
        a = a[:int(np.prod(shape, dtype=np.int64))].reshape(shape).copy()
    return a, target


@settings(max_examples=60, deadline=None)
@given(broadcasts())
def test_the_broadcast_view_is_numpys_broadcast_to(case):
    a, shape = case
    want = np.broadcast_to(a, shape)
    for rule in {views.broadcast, views.RULES["Broadcast"]}:  # Python's and _views.c's
        _same_broadcast(rule(np, a, shape=shape), want, shape)


def _same_broadcast(got, want, shape):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    # (a size-1 dimension's stride is never used: numpy's may differ there)
    assert [st for st, n in zip(got.strides, shape) if n > 1] == \
        [st for st, n in zip(want.strides, shape) if n > 1]
    assert not got.flags.writeable


@st.composite
def reshapes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    a = np.arange(int(np.prod(shape)) * 2, dtype=np.float32)
    a = (a[::2] if draw(st.booleans()) else a[:a.size // 2].copy()).reshape(shape)
    if draw(st.booleans()):
        a = a.T  # a column-major input: reshape copies, as np.reshape does
    perm = tuple(draw(st.permutations(range(a.ndim))))
    target = tuple(draw(st.permutations(list(a.shape)))) + (1,) * draw(st.integers(0, 2))
    return a, perm, target


@settings(max_examples=60, deadline=None)
@given(reshapes())
def test_the_reshape_and_transpose_views_are_numpys(case):
    from tapescope.kernels.rules import shape

    a, perm, target = case
    pytest.importorskip("tapescope.kernels.cpu._views")
    reshape, transpose = views.RULES["Reshape"], views.RULES["Transpose"]  # _views.c's
    for got, want in [(shape.reshape(np, a, shape=target), np.reshape(a, target)),
                      (reshape(np, a, shape=target, axes=(0,)), np.reshape(a, target)),
                      (shape.transpose(np, a, axes=perm), np.transpose(a, perm)),
                      (transpose(np, a, axes=perm), np.transpose(a, perm))]:
        assert got.shape == want.shape and got.strides == want.strides
        assert np.shares_memory(got, a) == np.shares_memory(want, a)
        np.testing.assert_array_equal(got, want)


def test_the_cpu_takes_the_reshape_family_and_transpose_by_their_rule():
    from tapescope.kernels.primitives import REGISTRY
    from tapescope.kernels.rules import shape

    pytest.importorskip("tapescope.kernels.cpu._views")

    c_reshape, c_transpose = views.RULES["Reshape"], views.RULES["Transpose"]
    got = {n for n, r in views.RULES.items() if r in (c_reshape, c_transpose)}
    assert got == {n for n, d in REGISTRY.items() if d.rule in (shape.reshape, shape.transpose)}
    assert {"Reshape", "Squeeze", "ExpandDims", "Transpose"} <= got
