"""``mx.pad`` modes "reflect" and "symmetric" against MLX and numpy over hypothesis shapes
and widths (widths past one period included), and MLX's error for an empty axis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import same_error

needs_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")


@st.composite
def cases(draw):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    widths = [(draw(st.integers(0, 9)), draw(st.integers(0, 9))) for _ in shape]
    return shape, widths, draw(st.sampled_from(["reflect", "symmetric"]))


@settings(max_examples=60, deadline=None)
@given(cases())
def test_reflect_and_symmetric_match_mlx_and_numpy(case):
    shape, widths, mode = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * 1.5 - 2
    got = np.array(mx.pad(mx.array(x), widths, mode))
    if mlx_ref is not None:
        np.testing.assert_array_equal(got, np.array(mlx_ref.pad(mlx_ref.array(x), widths, mode)))
    # numpy agrees except reflect of a length-1 axis (numpy repeats it; MLX does too, as
    # symmetric) -- both give the edge value there
    np.testing.assert_array_equal(got, np.pad(x, widths, mode))


@needs_mlx
@pytest.mark.parametrize("case", [
    lambda M: M.pad(M.zeros((2, 0)), [(0, 0), (1, 1)], "reflect"),
    lambda M: M.pad(M.zeros((0, 2)), 1, "symmetric"),
    lambda M: M.pad(M.zeros((3,)), -1, "reflect"),
    lambda M: M.pad(M.zeros((3,)), 1, "wrap"),
])
def test_errors_match_mlx(case):
    same_error(case)


def test_integer_dtypes_keep_their_dtype():
    x = mx.array(np.array([[1, 2, 3]], np.int16))
    out = mx.pad(x, [(0, 0), (2, 4)], "reflect")
    assert out.dtype == mx.int16
    np.testing.assert_array_equal(np.array(out), np.pad(np.array([[1, 2, 3]], np.int16),
                                                        [(0, 0), (2, 4)], "reflect"))
