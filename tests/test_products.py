"""matmul, addmm, inner, outer, tensordot against numpy and MLX."""

from __future__ import annotations

import io
import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from mlx_compare import primitive_names, raises_exactly

from conftest import mlx_ref, requires_mlx

SETTINGS = settings(max_examples=40, deadline=None)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@SETTINGS
@given(st.lists(st.integers(1, 3), max_size=2), st.lists(st.integers(1, 3), max_size=2),
       st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.booleans(), st.booleans(),
       st.integers(0, 2**16))
def test_matmul_broadcasts_batches_like_numpy(ba, bb, m, k, n, a1d, b1d, seed):
    # batch dims broadcast: make them compatible by taking 1 where they differ
    nd = max(len(ba), len(bb))
    ba, bb = [1] * (nd - len(ba)) + ba, [1] * (nd - len(bb)) + bb
    bb = [y if x == y else 1 for x, y in zip(ba, bb)]
    sa = (k,) if a1d else tuple(ba) + (m, k)
    sb = (k,) if b1d else tuple(bb) + (k, n)
    a, b = _rand(sa, seed), _rand(sb, seed + 1)
    got = mx.matmul(mx.array(a), mx.array(b))
    want = np.matmul(a, b)
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4),
       st.sampled_from([(), (1,), "n", "mn"]), st.floats(-2, 2), st.floats(-2, 2),
       st.integers(0, 2**16))
def test_addmm_matches_numpy(m, k, n, cshape, alpha, beta, seed):
    cs = {"n": (n,), "mn": (m, n)}.get(cshape, cshape)
    a, b, c = _rand((m, k), seed), _rand((k, n), seed + 1), _rand(cs, seed + 2)
    got = mx.addmm(mx.array(c), mx.array(a), mx.array(b), alpha=alpha, beta=beta)
    want = np.float32(alpha) * (a @ b) + np.float32(beta) * c
    assert got.shape == want.shape
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3),
       st.lists(st.integers(1, 3), min_size=0, max_size=2), st.integers(0, 2**16))
def test_inner_outer_tensordot_match_numpy(sa, sb, seed):
    a = _rand(tuple(sa), seed)
    b = _rand(tuple(sb) + (sa[-1],), seed + 1)
    np.testing.assert_allclose(np.array(mx.inner(mx.array(a), mx.array(b))), np.inner(a, b),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(mx.outer(mx.array(a), mx.array(b))), np.outer(a, b),
                               rtol=1e-4, atol=1e-4)
    c = _rand((sa[-1],) + tuple(sb), seed + 2)
    np.testing.assert_allclose(np.array(mx.tensordot(mx.array(a), mx.array(c), axes=1)),
                               np.tensordot(a, c, axes=1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        np.array(mx.tensordot(mx.array(a), mx.array(c), axes=[[-1], [0]])),
        np.tensordot(a, c, axes=([-1], [0])), rtol=1e-4, atol=1e-4)


def test_matmul_of_transposed_view_and_empty_k():
    a = _rand((3, 2), 0)
    got = mx.matmul(mx.transpose(mx.array(a)), mx.array(a))
    np.testing.assert_allclose(np.array(got), a.T @ a, rtol=1e-5)
    assert mx.matmul(mx.ones((2, 0)), mx.ones((0, 3))).tolist() == [[0.0] * 3] * 2


@requires_mlx
@pytest.mark.parametrize("da, db", [("float16", "float32"), ("int32", "float32"),
                                    ("bool_", "float32"), ("bfloat16", "bfloat16")])
def test_matmul_dtypes_match_mlx(mlx, da, db):
    ref = mlx.matmul(mlx.ones((2, 3), getattr(mlx, da)), mlx.ones((3, 2), getattr(mlx, db)))
    got = mx.matmul(mx.ones((2, 3), getattr(mx, da)), mx.ones((3, 2), getattr(mx, db)))
    assert str(got.dtype) == str(ref.dtype)
    np.testing.assert_allclose(np.array(got.astype(mx.float32)),
                               np.array(ref.astype(mlx.float32)))


def _mlx_graph(*outs) -> Counter:
    """Primitive names in MLX's own graph of ``outs`` (from ``export_to_dot``)."""
    f = io.StringIO()
    mlx_ref.export_to_dot(f, *outs)
    return Counter(re.findall(r'label ="([A-Za-z]+)"', f.getvalue()))


@requires_mlx
@SETTINGS
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.integers(1, 5), st.integers(1, 5),
       st.sampled_from(["float32", "float16"]), st.booleans(), st.integers(0, 2**16))
def test_a_linear_layers_product_records_mlxs_graph_and_numpys_values(lead, k, n, dtype,
                                                                      transposed, seed):
    """``x @ w.T`` with ``x`` of shape (..., K) (an ``nn.Linear``): MLX's Flatten, Matmul,
    Unflatten (its Transpose too), and numpy's product."""
    a = _rand(tuple(lead) + (k,), seed)
    w = _rand((n, k) if transposed else (k, n), seed + 1)
    got = mx.array(a, getattr(mx, dtype)) @ (mx.array(w, getattr(mx, dtype)).T if transposed
                                             else mx.array(w, getattr(mx, dtype)))
    ref = mlx_ref.array(a, getattr(mlx_ref, dtype)) @ (
        mlx_ref.array(w, getattr(mlx_ref, dtype)).T if transposed
        else mlx_ref.array(w, getattr(mlx_ref, dtype)))
    assert Counter(primitive_names(got)) == _mlx_graph(ref)
    assert got.shape == ref.shape and str(got.dtype) == str(ref.dtype)
    a64 = a.astype(getattr(np, dtype)).astype(np.float64)
    w64 = w.astype(getattr(np, dtype)).astype(np.float64)
    want = a64 @ (w64.T if transposed else w64)
    tol = 1e-4 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), want, rtol=tol, atol=tol)


ERRORS = [
    (lambda m: m.matmul(m.array(2.0), m.ones((2, 3))), ValueError,
     "[matmul] Got 0 dimension input. Inputs must have at least one dimension."),
    (lambda m: m.matmul(m.ones((2, 3)), m.ones((2, 3))), ValueError,
     "[matmul] Last dimension of first input with shape (2,3) must match second to last "
     "dimension of second input with shape (2,3)."),
    (lambda m: m.matmul(m.ones((2,)), m.ones((3, 2))), ValueError,
     "[matmul] Last dimension of first input with shape (1,2) must match second to last "
     "dimension of second input with shape (3,2)."),
    (lambda m: m.matmul(m.ones((2, 2, 3)), m.ones((3, 3, 2))), ValueError,
     "[broadcast_shapes] Shapes (2) and (3) cannot be broadcast."),
    (lambda m: m.matmul(m.array([[1]]), m.array([[2]])), ValueError,
     "[matmul] Only inexact types are supported but int32 and int32 were provided which "
     "results in int32, which is not a floating point type."),
    (lambda m: m.addmm(m.array([[1]]), m.array([[1]]), m.array([[1]])), ValueError,
     "[addmm] Only real floating point types are supported but int32, int32 and int32 were "
     "provided which results in int32, which is not a real floating point type."),
    (lambda m: m.inner(m.ones((2, 3)), m.ones((2, 2))), ValueError,
     "[inner] a and b must have the same last dimension."),
    (lambda m: m.tensordot(m.ones((2, 3)), m.ones((2, 3)), axes=1), ValueError,
     "[tensordot] a and b must have the same shape on the contracted axes."),
    (lambda m: m.tensordot(m.ones((2, 3)), m.ones((2, 3)), axes=-1), ValueError,
     "[tensordot] axis must be greater or equal to 0."),
    (lambda m: m.tensordot(m.ones((2, 3)), m.ones((2, 3)), axes=3), ValueError,
     "[tensordot] axis must be less than the number of dimensions of a and b."),
    (lambda m: m.tensordot(m.ones((2, 3)), m.ones((2, 3)), axes=[[0, 1], [0]]), ValueError,
     "[tensordot] axes must have the same size."),
]


@pytest.mark.parametrize("call, exc, msg", ERRORS)
def test_errors(call, exc, msg):
    raises_exactly(call, mx, exc, msg)


@requires_mlx
@pytest.mark.parametrize("call, exc, msg", ERRORS)
def test_error_table_agrees_with_mlx(mlx, call, exc, msg):
    raises_exactly(call, mlx, exc, msg)


def test_non_array_operands_are_type_errors():
    with pytest.raises(TypeError):
        mx.matmul(2.0, mx.ones((2, 2)))
    with pytest.raises(TypeError):
        mx.tensordot(mx.ones((2, 3)), mx.ones((2, 3)), axes=[0, 0])


def test_addmm_bad_c_shape_is_a_value_error():
    with pytest.raises(ValueError):
        mx.addmm(mx.ones((3, 3)), mx.ones((2, 3)), mx.ones((3, 2)))
