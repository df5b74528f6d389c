"""Window functions bartlett / blackman / hamming / hanning against MLX (values, dtype, the
ops MLX composes them from, argument errors) and against numpy's definitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import primitive_names, same_error

needs_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")
NAMES = ["bartlett", "blackman", "hamming", "hanning"]


@needs_mlx
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(NAMES), st.integers(-3, 300))
def test_windows_match_mlx(name, M):
    got, want = getattr(mx, name)(M), getattr(mlx_ref, name)(M)
    assert got.dtype == mx.float32 and got.shape == tuple(want.shape)
    # sin / cos of float32 arguments: libm and MLX's kernels differ by an ulp of 1
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=2 ** -23)


@pytest.mark.parametrize("M", [2, 5, 16, 51])
def test_windows_are_numpys_definitions(M):
    np.testing.assert_allclose(np.array(mx.hanning(M)), np.hanning(M), atol=1e-6)
    np.testing.assert_allclose(np.array(mx.hamming(M)), np.hamming(M), atol=1e-6)
    np.testing.assert_allclose(np.array(mx.bartlett(M)), np.bartlett(M), atol=1e-6)
    np.testing.assert_allclose(np.array(mx.blackman(M)), np.blackman(M), atol=1e-6)


def _mlx_names(out) -> list:
    """Primitive names of MLX's recorded graph, read from its DOT export."""
    import io
    import re

    buf = io.StringIO()
    mlx_ref.export_to_dot(buf, out)
    return sorted(re.findall(r'label ="(\w+)", shape=rectangle', buf.getvalue()))


@needs_mlx
@pytest.mark.parametrize("name", NAMES)
def test_recorded_ops_match_mlx(name):
    assert sorted(primitive_names(getattr(mx, name)(6))) == _mlx_names(getattr(mlx_ref, name)(6))


@needs_mlx
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arg", [1.0, "3", None, 2 ** 40])
def test_argument_errors_match_mlx(name, arg):
    same_error(lambda M: getattr(M, name)(arg))
