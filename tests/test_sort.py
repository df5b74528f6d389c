"""sort, argsort, partition, argpartition, topk against numpy and MLX."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from mlx_compare import raises_exactly

from conftest import requires_mlx

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def array_axis(draw):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    nd = len(shape)
    axis = draw(st.one_of(st.none(), st.integers(-nd, nd - 1)))
    vals = draw(st.lists(st.integers(-3, 3), min_size=int(np.prod(shape)),
                         max_size=int(np.prod(shape))))
    return np.array(vals, np.float32).reshape(shape), axis


@SETTINGS
@given(array_axis())
def test_sort_and_stable_argsort_match_numpy(case):
    x, axis = case
    got = mx.sort(mx.array(x), axis)
    want = np.sort(x, axis=axis)
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_array_equal(np.array(got), want)
    idx = mx.argsort(mx.array(x), axis)
    assert idx.dtype == mx.uint32
    np.testing.assert_array_equal(np.array(idx), np.argsort(x, axis=axis, kind="stable"))


@SETTINGS
@given(array_axis(), st.data())
def test_partition_puts_kth_in_place(case, data):
    x, axis = case
    flat = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else axis % x.ndim
    n = flat.shape[ax]
    kth = data.draw(st.integers(-n, n - 1))
    k = kth % n
    got = np.array(mx.partition(mx.array(x), kth, axis))
    srt = np.sort(flat, axis=ax)
    kv = np.take(srt, [k], axis=ax)
    np.testing.assert_array_equal(np.take(got, [k], axis=ax), kv)
    assert np.all(np.take(got, range(k), axis=ax) <= kv)
    assert np.all(np.take(got, range(k + 1, n), axis=ax) >= kv)
    idx = np.array(mx.argpartition(mx.array(x), kth, axis)).astype(np.int64)
    np.testing.assert_array_equal(np.take_along_axis(flat, idx, axis=ax), got)


@SETTINGS
@given(array_axis(), st.data())
def test_topk_gives_the_k_largest(case, data):
    x, axis = case
    flat = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else axis % x.ndim
    k = data.draw(st.integers(0, flat.shape[ax]))
    got = np.array(mx.topk(mx.array(x), k, axis))
    want = np.take(np.sort(flat, axis=ax), range(flat.shape[ax] - k, flat.shape[ax]), axis=ax)
    np.testing.assert_array_equal(np.sort(got, axis=ax), want)


def test_nans_sort_last_and_views_sort():
    assert np.isnan(mx.sort(mx.array([3.0, float("nan"), 1.0])).tolist()[-1])
    x = np.array([[3, 1], [0, 2]], np.float32)
    np.testing.assert_array_equal(np.array(mx.sort(mx.transpose(mx.array(x)), axis=1)),
                                  np.sort(x.T, axis=1))


@requires_mlx
@pytest.mark.parametrize("dtype", ["bool_", "int8", "uint32", "float16", "bfloat16", "float32"])
def test_dtypes_match_mlx(mlx, dtype):
    x = np.array([[3, 1, 2], [0, 5, 4]])
    for name in ("sort", "argsort"):
        ref = getattr(mlx, name)(mlx.array(x).astype(getattr(mlx, dtype)))
        got = getattr(mx, name)(mx.array(x).astype(getattr(mx, dtype)))
        assert str(got.dtype) == str(ref.dtype)
        assert got.astype(mx.float32).tolist() == ref.astype(mlx.float32).tolist()


ERRORS = [
    (lambda m: m.sort(m.ones((2, 3)), axis=5), IndexError,
     "[sort] Axis 5 is out of bounds for array with 2 dimensions."),
    (lambda m: m.argsort(m.array(2.0)), IndexError,
     "[argsort] Axis -1 is out of bounds for array with 0 dimensions."),
    (lambda m: m.partition(m.ones((2, 3)), 3, axis=1), ValueError,
     "[partition] Received invalid kth 3along axis 1 for array with shape: (2,3)"),
    (lambda m: m.argpartition(m.ones((2, 3)), -4, axis=1), ValueError,
     "[argpartition] Received invalid kth -4 along axis 1 for array with shape: (2,3)"),
    (lambda m: m.topk(m.ones((2, 3)), 4, axis=1), ValueError,
     "[topk] Received invalid k=4 along axis 1 for array with shape: (2,3)"),
    (lambda m: m.topk(m.ones((2, 3)), -1), ValueError,
     "[topk] Received invalid k=-1 along axis -1 for array with shape: (2,3)"),
    (lambda m: m.topk(m.array(1.0), 1), IndexError,
     "[topk] Axis -1 is out of bounds for array with 0 dimensions."),
]


@pytest.mark.parametrize("call, exc, msg", ERRORS)
def test_errors(call, exc, msg):
    raises_exactly(call, mx, exc, msg)


@requires_mlx
@pytest.mark.parametrize("call, exc, msg", ERRORS)
def test_error_table_agrees_with_mlx(mlx, call, exc, msg):
    raises_exactly(call, mlx, exc, msg)


def test_non_array_is_a_type_error():
    with pytest.raises(TypeError):
        mx.sort([3, 1, 2])
