"""Reductions against numpy (values, shapes, dtypes) and MLX (dtypes, errors, primitives)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx

from conftest import requires_mlx

SETTINGS = settings(max_examples=40, deadline=None)
DTYPES = ["bool_", "uint8", "int8", "int16", "int32", "int64", "uint32", "float16", "float32"]


@st.composite
def array_and_axes(draw, min_dims=1, max_dims=4):
    shape = draw(st.lists(st.integers(1, 4), min_size=min_dims, max_size=max_dims))
    nd = len(shape)
    axes = draw(st.one_of(st.none(), st.integers(-nd, nd - 1),
                          st.lists(st.integers(0, nd - 1), unique=True, max_size=nd)))
    if isinstance(axes, list):
        axes = [a - nd if draw(st.booleans()) else a for a in axes]
    data = draw(st.lists(st.integers(-5, 5), min_size=int(np.prod(shape)),
                         max_size=int(np.prod(shape))))
    return np.array(data, dtype=np.float32).reshape(shape), axes


def _np_axes(axes):
    return tuple(axes) if isinstance(axes, list) else axes


@SETTINGS
@given(array_and_axes(), st.booleans(), st.sampled_from(["sum", "prod", "max", "min", "mean"]))
def test_float_reductions_match_numpy(case, keepdims, name):
    x, axes = case
    got = getattr(mx, name)(mx.array(x), axes, keepdims)
    want = getattr(np, name)(x, axis=_np_axes(axes), keepdims=keepdims)
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(array_and_axes(), st.booleans(), st.sampled_from(["all", "any"]))
def test_boolean_reductions_match_numpy(case, keepdims, name):
    x, axes = case
    got = getattr(mx, name)(mx.array(x > 0), axes, keepdims)
    want = getattr(np, name)(x > 0, axis=_np_axes(axes), keepdims=keepdims)
    assert got.dtype == mx.bool_ and got.shape == want.shape
    np.testing.assert_array_equal(np.array(got), want)


@SETTINGS
@given(array_and_axes(), st.booleans(), st.sampled_from([0, 1, 2]))
def test_var_std_match_numpy(case, keepdims, ddof):
    x, axes = case
    with np.errstate(all="ignore"):
        want_v = np.var(x, axis=_np_axes(axes), keepdims=keepdims, ddof=ddof)
    got_v = mx.var(mx.array(x), axes, keepdims, ddof)
    got_s = mx.std(mx.array(x), axes, keepdims, ddof)
    assert got_v.shape == want_v.shape
    np.testing.assert_allclose(np.array(got_v), want_v, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(got_s), np.sqrt(want_v), rtol=1e-4, atol=1e-4)


@SETTINGS
@given(array_and_axes(max_dims=3), st.booleans(), st.sampled_from(["argmax", "argmin"]),
       st.booleans())
def test_argreduce_first_index_uint32(case, keepdims, name, use_axis):
    x, axes = case
    axis = (axes if isinstance(axes, int) else 0) if use_axis else None
    got = getattr(mx, name)(mx.array(x), axis, keepdims)
    want = getattr(np, name)(x, axis=axis, keepdims=keepdims)  # numpy also picks the first
    assert got.dtype == mx.uint32 and got.shape == want.shape
    np.testing.assert_array_equal(np.array(got), want)


@requires_mlx
@SETTINGS
@given(st.lists(st.integers(0, 3), min_size=1, max_size=3), st.integers(-4, 3), st.booleans(),
       st.sampled_from(["argmax", "argmin"]))
def test_argreduce_one_int_axis_agrees_with_mlx(shape, axis, keepdims, name):
    """One int axis (lengths 0 and 1, out of range, negative): MLX's values, shape and
    dtype, or its error and message."""
    import mlx.core as mlx_core

    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)[..., ::-1].copy()
    try:
        want = getattr(mlx_core, name)(mlx_core.array(x), axis, keepdims)
        mlx_core.eval(want)
    except (ValueError, IndexError) as e:
        with pytest.raises(type(e)) as info:
            getattr(mx, name)(mx.array(x), axis, keepdims)
        assert str(info.value) == str(e)
        return
    got = getattr(mx, name)(mx.array(x), axis, keepdims)
    assert got.shape == tuple(want.shape) and got.dtype == mx.uint32
    np.testing.assert_array_equal(np.array(got), np.array(want))


@SETTINGS
@given(array_and_axes(), st.booleans())
def test_logsumexp_matches_numpy(case, keepdims):
    x, axes = case
    ax = _np_axes(axes)
    m = np.max(x, axis=ax, keepdims=True)
    want = np.log(np.sum(np.exp(x - m), axis=ax, keepdims=True)) + m
    if not keepdims:
        want = np.squeeze(want, axis=ax if ax is not None else tuple(range(x.ndim)))
    got = mx.logsumexp(mx.array(x), axes, keepdims)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(array_and_axes(), st.booleans())
def test_softmax_matches_numpy(case, precise):
    x, axes = case
    ax = _np_axes(axes)
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    want = e / np.sum(e, axis=ax, keepdims=True)
    got = mx.softmax(mx.array(x), axes, precise=precise)
    assert got.shape == x.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-6)


def test_logsumexp_returns_the_max_where_it_is_infinite():
    x = np.array([[np.inf, 1.0], [-np.inf, -np.inf], [1.0, 2.0]], np.float32)
    np.testing.assert_allclose(np.array(mx.logsumexp(mx.array(x), axis=1)),
                               [np.inf, -np.inf, np.logaddexp(1.0, 2.0)], rtol=1e-6)


def test_argmax_ties_go_to_the_lowest_index():
    assert mx.argmax(mx.array([1, 3, 3, 2])).item() == 1
    assert mx.argmin(mx.array([[1, 0, 0], [2, 2, 2]]), axis=1).tolist() == [1, 0]


def test_empty_reductions_identity_and_nan():
    e = mx.zeros((0, 3))
    assert mx.sum(e).item() == 0.0 and mx.prod(e, axis=0).tolist() == [1.0, 1.0, 1.0]
    assert mx.all(e).item() is True and mx.any(e).item() is False
    assert np.isnan(mx.mean(e).item())
    assert mx.max(e, axis=1).shape == (0,)


def test_reductions_of_a_transposed_view():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = mx.transpose(mx.array(x))
    np.testing.assert_array_equal(np.array(mx.sum(t, axis=0)), x.T.sum(axis=0))
    np.testing.assert_array_equal(np.array(mx.argmax(t, axis=1)), x.T.argmax(axis=1))


@pytest.mark.parametrize("transposed", [False, True])
def test_a_general_sum_folds_each_run_on_its_own(transposed):
    """Axes (1, 3) of a (4, 32, 4, 32) array (MLX's general layout: neither side collapses
    to one stride) with 1.0 first and 1e-8 everywhere else: a sum folding each run of the
    last reduced axis on its own (MLX's GeneralContiguousReduce) keeps the small terms
    (error ~1e-6); one float32 accumulator over all 1024 elements loses every one of them
    (1.0, error 1e-5). Transposed: the runs are strided (not unit-stride loads)."""
    x = np.full((4, 32, 4, 32), 1e-8, np.float32)
    x[:, 0, :, 0] = 1.0
    a = mx.array(x)
    if transposed:
        x = np.ascontiguousarray(np.swapaxes(x, 1, 3))
        a = mx.swapaxes(mx.array(x), 1, 3)
        x = np.swapaxes(x, 1, 3)
    got = np.asarray(mx.sum(a, axis=(1, 3)))
    want = x.astype(np.float64).sum(axis=(1, 3))
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6)


@requires_mlx
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "all", "any", "mean", "argmax",
                                  "logsumexp", "softmax"])
def test_output_dtypes_match_mlx(mlx, name, dtype):
    x = np.array([[1, 0, 1], [1, 1, 0]])
    axis = -1 if name in ("logsumexp", "softmax") else 0  # their own primitive's path
    ref = getattr(mlx, name)(mlx.array(x).astype(getattr(mlx, dtype)), axis=axis)
    got = getattr(mx, name)(mx.array(x).astype(getattr(mx, dtype)), axis=axis)
    assert str(got.dtype) == str(ref.dtype) and got.shape == ref.shape
    np.testing.assert_allclose(np.array(got).astype(np.float64),
                               np.array(ref).astype(np.float64), rtol=1e-3)


@requires_mlx
@pytest.mark.parametrize("dtype", ["int32", "float16", "bool_"])
@pytest.mark.parametrize("name", ["var", "std"])
def test_moment_dtypes_match_mlx(mlx, name, dtype):
    x = np.array([[1, 0, 1], [1, 1, 0]])
    ref = getattr(mlx, name)(mlx.array(x).astype(getattr(mlx, dtype)), axis=1, ddof=1)
    got = getattr(mx, name)(mx.array(x).astype(getattr(mx, dtype)), axis=1, ddof=1)
    assert str(got.dtype) == str(ref.dtype)
    np.testing.assert_allclose(np.array(got).astype(np.float64),
                               np.array(ref).astype(np.float64), rtol=1e-3)


def _graph_names(out):
    """Primitive names recorded for ``out``, inputs before users."""
    names, seen = [], set()

    def visit(desc):
        node = desc.node
        if node is None or id(node) in seen:
            return
        seen.add(id(node))
        for inp in node.inputs:
            visit(inp)
        names.append(node.primitive.name)

    visit(out._d)
    return names


@pytest.mark.parametrize("build, expected", [
    (lambda m, x: m.sum(x, axis=1), ["Sum", "Squeeze"]),
    (lambda m, x: m.max(x, axis=0, keepdims=True), ["Max"]),
    (lambda m, x: m.all(x), ["And", "Squeeze"]),
    (lambda m, x: m.argmax(x, axis=1), ["ArgReduce", "Squeeze"]),
    (lambda m, x: m.logsumexp(x, axis=1), ["LogSumExp", "Squeeze"]),
    (lambda m, x: m.softmax(x, axis=-1), ["Softmax"]),
    (lambda m, x: m.sum(x, axis=[]), []),
])
def test_records_mlx_primitives(build, expected):
    x = mx.array(np.ones((2, 3), np.float32))
    assert _graph_names(build(mx, x)) == expected


ERRORS = [
    (lambda m, x: m.sum(x, axis=3), IndexError, "Invalid axis 3 for array with 2 dimensions."),
    (lambda m, x: m.max(x, axis=-3), IndexError, "Invalid axis -3 for array with 2 dimensions."),
    (lambda m, x: m.sum(x, axis=[1, -1]), ValueError, "Duplicate axes detected in reduction."),
    (lambda m, x: m.mean(x, axis=5), IndexError,
     "[mean] axis 5 is out of bounds for array with 2 dimensions."),
    (lambda m, x: m.max(m.zeros((3, 0))), ValueError,
     "[max] Cannot max reduce over axis 1 with size 0."),
    (lambda m, x: m.min(m.zeros((0, 3)), axis=0), ValueError,
     "[min] Cannot min reduce over axis 0 with size 0."),
    (lambda m, x: m.argmax(m.zeros((0, 3)), axis=1), ValueError,
     "[argmax] Cannot argmax reduce zero size array."),
    (lambda m, x: m.argmin(x, axis=5), IndexError, "Invalid axis 5 for array with 2 dimensions."),
    (lambda m, x: m.logsumexp(m.zeros((0, 3)), axis=1), ValueError,
     "[logsumexp] Received empty array."),
    (lambda m, x: m.logsumexp(m.array(2.0), axis=0), ValueError,
     "[logsumexp] Received non-empty axes for array with 0 dimensions."),
    (lambda m, x: m.softmax(m.array(2.0), axis=-1), ValueError,
     "[softmax] Received non-empty axes for array with 0 dimensions."),
]


@pytest.mark.parametrize("call, exc, msg", ERRORS)
def test_errors_match_mlx_messages(call, exc, msg):
    x = mx.array(np.ones((2, 3), np.float32))
    with pytest.raises(exc) as info:
        call(mx, x)
    assert str(info.value) == msg


@requires_mlx
@pytest.mark.parametrize("call, exc, msg", ERRORS)
def test_error_table_agrees_with_mlx(mlx, call, exc, msg):
    with pytest.raises(exc) as info:
        call(mlx, mlx.ones((2, 3)))
    assert str(info.value) == msg


def test_non_array_input_is_a_type_error():
    with pytest.raises(TypeError):
        mx.sum([1, 2, 3])
    with pytest.raises(TypeError):
        mx.sum(mx.ones((2,)), axis=1.0)


def test_bad_axis_records_nothing():
    x = mx.array(np.ones((2, 3), np.float32))
    with pytest.raises(IndexError):
        mx.sum(x, axis=4)
    assert x._d.node is None and mx.sum(x).item() == 6.0
