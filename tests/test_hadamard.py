"""``mx.hadamard_transform`` (MLX's ``Hadamard`` primitive), added by the one-definition recipe:
values against Sylvester's matrix built here with numpy and against MLX itself, dtypes, the
recorded graph, errors, and the JAX check."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tapescope
import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import primitive_names, same_error

needs_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")


def sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


@pytest.mark.parametrize("n", [1, 2, 4, 16, 256, 2048])
def test_powers_of_two_are_sylvesters_matrix_scaled_to_orthonormal(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, n)).astype(np.float32)
    want = x.astype(np.float64) @ sylvester(n).T / np.sqrt(n)
    got = np.array(mx.hadamard_transform(mx.array(x)))
    assert got.dtype == np.float32 and got.shape == (3, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_explicit_scale_and_the_transform_twice_is_the_identity():
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    once = mx.hadamard_transform(mx.array(x), scale=1.0)
    np.testing.assert_allclose(np.array(once), x @ sylvester(8).T)
    twice = mx.hadamard_transform(mx.hadamard_transform(mx.array(x)))
    np.testing.assert_allclose(np.array(twice), x, atol=1e-5)


@needs_mlx
@pytest.mark.parametrize("n", [12, 20, 28, 24, 40, 56, 96, 112, 448, 1280])
def test_sizes_m_times_power_of_two_match_mlx(n):
    x = np.random.default_rng(n).standard_normal((2, 3, n)).astype(np.float32)
    want = np.array(mlx_ref.hadamard_transform(mlx_ref.array(x)))
    np.testing.assert_allclose(np.array(mx.hadamard_transform(mx.array(x))), want,
                               rtol=1e-5, atol=1e-5)


@needs_mlx
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "uint8", "bool_",
                                   "complex64"])
def test_dtypes_and_recorded_graph_match_mlx(dtype):
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype.rstrip("_"))
    vals = np.array([[1, 0, 1, 1], [0, 1, 1, 0]]).astype(np_dt)
    want = mlx_ref.hadamard_transform(mlx_ref.array(vals), scale=0.5)
    got = mx.hadamard_transform(mx.array(vals), scale=0.5)
    assert got.dtype.name == str(want.dtype).split(".")[-1]
    cast = dtype not in ("float32", "float16", "bfloat16")
    assert primitive_names(got) == ["Hadamard", "AsType"] if cast else ["Hadamard"]
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)),
                                  np.array(want.astype(mlx_ref.float32)))


@needs_mlx
def test_zero_d_inputs_are_only_scaled_as_in_mlx():
    for v, scale in [(2, None), (2, 2.0), (3.0, None), (3.0, 2.0)]:
        want = mlx_ref.hadamard_transform(mlx_ref.array(v), scale=scale)
        got = mx.hadamard_transform(mx.array(v), scale=scale)
        assert got.dtype.name == str(want.dtype).split(".")[-1]
        assert np.array(got) == np.array(want)


@needs_mlx
@pytest.mark.parametrize("case", [
    lambda M: M.hadamard_transform(M.ones((6,))),
    lambda M: M.hadamard_transform(M.ones((2, 0))),
    lambda M: M.hadamard_transform(M.ones((4,), dtype=M.float64)),
    lambda M: M.hadamard_transform(3.0),
    lambda M: M.hadamard_transform(M.ones((4,)), scale="2"),
    lambda M: M.hadamard_transform(None),
])
def test_errors_match_mlx(case):
    same_error(case)


def test_half_precision_works_in_float32_and_rounds_to_its_dtype():
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)
    for dt, np_dt in [(mx.float16, np.float16), (mx.bfloat16, ml_dtypes.bfloat16)]:
        xin = x.astype(np_dt)
        ref = (xin.astype(np.float64) @ sylvester(16).T / 4).astype(np_dt)
        out = mx.hadamard_transform(mx.array(xin))
        assert out.dtype == dt
        np.testing.assert_allclose(np.array(out.astype(mx.float32)), ref.astype(np.float32),
                                   rtol=1e-2)


def test_checked_against_jax_where_jax_has_a_reference():
    x = mx.array(np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32))
    rep = tapescope.check(lambda a: mx.hadamard_transform(a) * 2.0, x)
    assert rep.passed, rep
    rep = tapescope.check(lambda a: mx.hadamard_transform(a), mx.ones((12,)))
    assert not rep.passed and "no independent reference" in str(rep)


def test_its_definition_is_complete():
    from tapescope.kernels.primitives import REGISTRY

    d = REGISTRY["Hadamard"]
    assert d.family == "fft" and not d.fusable and callable(d.shape) and callable(d.dtype)
    assert d.shape([(2, 3, 8)], scale=1.0) == [(2, 3, 8)]
