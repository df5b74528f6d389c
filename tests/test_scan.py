"""Scans against numpy (values, shapes, dtypes) and MLX (dtypes, errors)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from mlx_compare import raises_exactly

from conftest import requires_mlx

SETTINGS = settings(max_examples=40, deadline=None)
IDENT = {"cumsum": 0.0, "cumprod": 1.0, "cummax": -np.inf, "cummin": np.inf,
         "logcumsumexp": -np.inf}
NP = {"cumsum": np.cumsum, "cumprod": np.cumprod, "cummax": np.maximum.accumulate,
      "cummin": np.minimum.accumulate, "logcumsumexp": np.logaddexp.accumulate}


def reference(name, x, axis, reverse, inclusive):
    """The scan computed with numpy: flip, accumulate, shift for exclusive, flip back."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    y = np.flip(x, axis) if reverse else x
    out = NP[name](y, axis=axis)
    if not inclusive:
        pad = np.full_like(np.take(out, [0], axis=axis), IDENT[name])
        out = np.concatenate([pad, np.take(out, range(out.shape[axis] - 1), axis=axis)], axis)
    return np.flip(out, axis) if reverse else out


@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data(),
       st.sampled_from(sorted(NP)), st.booleans(), st.booleans())
def test_scans_match_numpy(shape, data, name, reverse, inclusive):
    nd = len(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-nd, nd - 1)))
    x = np.array(data.draw(st.lists(st.integers(-3, 3), min_size=int(np.prod(shape)),
                                    max_size=int(np.prod(shape)))), np.float32).reshape(shape)
    got = getattr(mx, name)(mx.array(x), axis, reverse=reverse, inclusive=inclusive)
    want = reference(name, x, axis, reverse, inclusive)
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


def test_scan_of_a_transposed_view():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = mx.cumsum(mx.transpose(mx.array(x)), axis=1)
    np.testing.assert_array_equal(np.array(got), np.cumsum(x.T, axis=1))


def test_integer_scans_exclusive_identity():
    x = mx.array([1, 2], mx.int8)
    assert mx.cummax(x, inclusive=False).tolist() == [-128, 1]
    assert mx.cummin(mx.array([True, False]), inclusive=False).tolist() == [True, True]


@requires_mlx
@pytest.mark.parametrize("dtype", ["bool_", "int8", "uint8", "int32", "float16", "float32"])
@pytest.mark.parametrize("name", sorted(NP))
def test_dtypes_and_values_match_mlx(mlx, name, dtype):
    x = np.array([[1, 0, 1], [1, 1, 0]])
    ref = getattr(mlx, name)(mlx.array(x).astype(getattr(mlx, dtype)), axis=1, reverse=True)
    got = getattr(mx, name)(mx.array(x).astype(getattr(mx, dtype)), axis=1, reverse=True)
    assert str(got.dtype) == str(ref.dtype) and got.shape == ref.shape
    np.testing.assert_allclose(np.array(got).astype(np.float64),
                               np.array(ref).astype(np.float64), rtol=1e-3)


@requires_mlx
@pytest.mark.parametrize("src, dtype", [("bool_", None), ("bool_", "bool_"), ("float32", "int32"),
                                        ("int8", "int16"), ("bool_", "float32")])
def test_cumsum_dtype_argument_matches_mlx(mlx, src, dtype):
    x = np.array([1, 0, 1, 1])
    ref = mlx.cumsum(mlx.array(x).astype(getattr(mlx, src)),
                     dtype=getattr(mlx, dtype) if dtype else None)
    got = mx.cumsum(mx.array(x).astype(getattr(mx, src)),
                    dtype=getattr(mx, dtype) if dtype else None)
    assert str(got.dtype) == str(ref.dtype) and got.tolist() == ref.tolist()


def test_axis_none_flattens_and_0d_becomes_1d():
    assert mx.cumsum(mx.array(2.0)).shape == (1,)
    assert mx.cumprod(mx.zeros((0, 3))).shape == (0,)


ERRORS = [
    (lambda m: m.cumsum(m.ones((2, 3)), axis=5), IndexError,
     "[cumsum] Axis 5 is out of bounds for array with 2 dimensions."),
    (lambda m: m.cummax(m.ones((2, 3)), axis=-3), IndexError,
     "[cummax] Axis -3 is out of bounds for array with 2 dimensions."),
    (lambda m: m.logcumsumexp(m.array(2.0), axis=0), IndexError,
     "[logcumsumexp] Axis 0 is out of bounds for array with 0 dimensions."),
]


@pytest.mark.parametrize("call, exc, msg", ERRORS)
def test_errors(call, exc, msg):
    raises_exactly(call, mx, exc, msg)


@requires_mlx
@pytest.mark.parametrize("call, exc, msg", ERRORS)
def test_error_table_agrees_with_mlx(mlx, call, exc, msg):
    raises_exactly(call, mlx, exc, msg)


def test_bad_dtype_and_non_array_are_type_errors():
    with pytest.raises(TypeError):
        mx.cumsum(mx.ones((2,)), dtype="int32")
    with pytest.raises(TypeError):
        mx.cumsum([1, 2])
