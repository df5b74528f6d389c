"""mx.linalg: factorizations and solvers against numpy.linalg; dtypes and errors against MLX."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from mlx_compare import outcome
from conftest import requires_mlx

L = mx.linalg


def _rand(shape, seed=0, spd=False):
    r = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if spd:
        r = r @ np.swapaxes(r, -1, -2) + shape[-1] * np.eye(shape[-1], dtype=np.float32)
    return r


batch = st.lists(st.integers(1, 3), max_size=2).map(tuple)
dim = st.integers(1, 5)


@given(b=batch, n=dim, seed=st.integers(0, 99))
@settings(max_examples=30, deadline=None)
def test_inv_cholesky_eigh_match_numpy(b, n, seed):
    a = _rand(b + (n, n), seed, spd=True)
    np.testing.assert_allclose(np.array(L.inv(mx.array(a))), np.linalg.inv(a), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.array(L.cholesky(mx.array(a))), np.linalg.cholesky(a), rtol=1e-3, atol=1e-4)
    up = np.array(L.cholesky(mx.array(a), upper=True))
    np.testing.assert_allclose(np.swapaxes(up, -1, -2) @ up, a, rtol=1e-3, atol=1e-3)
    w, v = L.eigh(mx.array(a))
    np.testing.assert_allclose(np.array(w), np.linalg.eigvalsh(a), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(np.array(L.eigvalsh(mx.array(a), "U")), np.linalg.eigvalsh(a, "U"), rtol=1e-3, atol=1e-3)
    v = np.array(v)
    np.testing.assert_allclose(a @ v, v * np.array(w)[..., None, :], rtol=1e-3, atol=1e-3)


@given(b=batch, m=dim, n=dim, seed=st.integers(0, 99))
@settings(max_examples=30, deadline=None)
def test_qr_svd_lu_factor_shapes_and_reconstruction(b, m, n, seed):
    a = _rand(b + (m, n), seed)
    q, r = L.qr(mx.array(a))
    k = min(m, n)
    assert q.shape == b + (m, k) and r.shape == b + (k, n)
    np.testing.assert_allclose(np.array(q) @ np.array(r), a, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.abs(np.array(r)), np.abs(np.linalg.qr(a)[1]), rtol=1e-3, atol=1e-4)
    u, s, vt = L.svd(mx.array(a))
    assert u.shape == b + (m, m) and s.shape == b + (k,) and vt.shape == b + (n, n)
    np.testing.assert_allclose(np.array(s), np.linalg.svd(a, compute_uv=False), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.array(L.svd(mx.array(a), compute_uv=False)), np.array(s), rtol=1e-5)
    us = np.array(u)[..., :, :k] * np.array(s)[..., None, :]
    np.testing.assert_allclose(us @ np.array(vt)[..., :k, :], a, rtol=1e-3, atol=1e-4)
    lu, piv = L.lu_factor(mx.array(a))
    assert lu.shape == a.shape and piv.shape == b + (k,) and piv.dtype == mx.uint32
    lu, piv = np.array(lu), np.array(piv)
    low = np.tril(lu, -1)[..., :, :k] + np.eye(m, k, dtype=np.float32)
    up = np.triu(lu)[..., :k, :]
    perm_a = a.copy().reshape((-1, m, n))
    for bi, p in enumerate(piv.reshape(-1, k)):  # apply getrf's row swaps in order
        for j, pj in enumerate(p):
            perm_a[bi, [j, pj]] = perm_a[bi, [pj, j]]
    np.testing.assert_allclose(low @ up, perm_a.reshape(a.shape), rtol=1e-3, atol=1e-4)


def test_eig_matches_numpy():
    a = _rand((4, 4), 3)
    w, v = L.eig(mx.array(a))
    assert w.dtype == mx.complex64 and v.dtype == mx.complex64
    np.testing.assert_allclose(np.sort_complex(np.array(w)), np.sort_complex(np.linalg.eigvals(a)), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(a @ np.array(v), np.array(v) * np.array(w)[None, :], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(np.sort_complex(np.array(L.eigvals(mx.array(a)))), np.sort_complex(np.linalg.eigvals(a)), rtol=1e-3, atol=1e-4)


def test_tri_inv_reads_one_triangle():
    a = _rand((4, 4), 5) + 4 * np.eye(4, dtype=np.float32)
    np.testing.assert_allclose(np.array(L.tri_inv(mx.array(a))), np.linalg.inv(np.tril(a)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(L.tri_inv(mx.array(a), upper=True)), np.linalg.inv(np.triu(a)), rtol=1e-4, atol=1e-5)


def test_float64_supported():
    a = _rand((3, 3), 1, spd=True).astype(np.float64)
    out = L.inv(mx.array(a, mx.float64))
    assert out.dtype == mx.float64
    np.testing.assert_allclose(np.array(out), np.linalg.inv(a), rtol=1e-10)


def test_singular_inverse_raises_at_eval():
    with pytest.raises(RuntimeError, match=r"\[Inverse::eval_cpu\] LU factorization failed"):
        mx.eval(L.inv(mx.zeros((2, 2))))


@pytest.mark.skipif(not all(hasattr(mx, n) for n in ("matmul", "swapaxes", "tril", "take_along_axis", "sum", "sqrt")),
                    reason="needs matmul / shape / reduction ops")
def test_composites_match_numpy():
    a = _rand((2, 4, 4), 7, spd=True)
    bb = _rand((2, 4, 3), 8)
    np.testing.assert_allclose(np.array(L.solve(mx.array(a), mx.array(bb))), np.linalg.solve(a, bb), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.array(L.solve_triangular(mx.array(a[0]), mx.array(bb[0]))),
                               np.linalg.solve(np.tril(a[0]), bb[0]), rtol=1e-3, atol=1e-4)
    g = _rand((3, 5), 9)
    np.testing.assert_allclose(np.array(L.pinv(mx.array(g))), np.linalg.pinv(g), rtol=1e-3, atol=1e-4)
    c = np.linalg.cholesky(a[0])
    np.testing.assert_allclose(np.array(L.cholesky_inv(mx.array(c))), np.linalg.inv(a[0]), rtol=1e-3, atol=1e-4)
    p, lo, up = L.lu(mx.array(a[0]))
    np.testing.assert_allclose(np.array(lo)[np.array(p)] @ np.array(up), a[0], rtol=1e-3, atol=1e-4)
    x, y = _rand((5, 3), 1), _rand((5, 3), 2)
    np.testing.assert_allclose(np.array(L.cross(mx.array(x), mx.array(y))), np.cross(x, y), rtol=1e-4, atol=1e-5)
    for ord_, axis in [(None, None), (1, None), (2, None), (np.inf, None), ("fro", None), ("nuc", None),
                       (-1, None), (-np.inf, None), (-2, None), (3, 0), (0, 1), (np.inf, 1)]:
        np.testing.assert_allclose(np.array(L.norm(mx.array(g), ord_, axis)), np.linalg.norm(g, ord_, axis),
                                   rtol=1e-3, atol=1e-4, err_msg=str((ord_, axis)))


ERRORS = [
    "inv(M.zeros((2, 3)))", "inv(M.zeros((3,)))", "inv(M.array([[1, 2], [3, 4]]))",
    "inv(M.zeros((2, 2), M.float16))", "tri_inv(M.zeros((2, 3)))",
    "cholesky(M.zeros((2, 3)))", "cholesky(M.zeros((3,)))", "cholesky(M.zeros((2, 2), M.complex64))",
    "cholesky_inv(M.zeros((2, 3)))", "qr(M.zeros((3,)))", "qr(M.array([[1, 2], [3, 4]]))",
    "svd(M.zeros((3,)))", "svd(M.array([[1, 2], [3, 4]]))", "eigh(M.zeros((2, 3)))",
    "eigvalsh(M.zeros((3,)))", "eig(M.zeros((2, 3)))", "eigvals(M.zeros((2, 2), M.int32))",
    "pinv(M.zeros((3,)))", "lu(M.zeros((2, 2), M.float16))", "lu_factor(M.zeros((3,)))",
    "solve(M.zeros((2, 3)), M.zeros((2,)))", "solve(M.zeros((3, 3)), M.zeros((2,)))",
    "solve(M.array([[1, 2], [3, 4]]), M.array([1, 2]))", "solve(M.zeros((3,)), M.zeros((3,)))",
    "solve_triangular(M.zeros((3, 3)), M.array(1.0))",
    "cross(M.ones((3,)), M.ones((3,)), axis=1)", "cross(M.ones((3,)), M.ones((4,)))",
    "norm(M.zeros((2, 3)), 'x')", "norm(M.zeros((2, 3)), 3)", "norm(M.zeros((2, 3)), 'fro', axis=1)",
    "norm(M.zeros((2, 2, 2)), 2)", "norm(M.zeros((2, 3)), axis=2)",
]


def _outcome(mod, expr):
    return outcome(mod, "M.linalg." + expr)


@requires_mlx
@pytest.mark.parametrize("expr", ERRORS)
def test_errors_match_mlx(mlx, expr):
    want = _outcome(mlx, expr)
    assert want is not None
    assert _outcome(mx, expr) == want


@requires_mlx
@pytest.mark.parametrize("fn", ["inv", "cholesky", "qr", "svd", "eigh", "eigvalsh", "eig", "eigvals", "lu_factor"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
def test_output_dtypes_match_mlx(mlx, fn, dtype):
    a = _rand((3, 3), 2, spd=True)
    def run(mod):
        try:
            out = getattr(mod.linalg, fn)(mod.array(a).astype(getattr(mod, dtype)), stream=mod.cpu)
        except ValueError as e:
            return str(e)
        outs = out if isinstance(out, tuple) else (out,)
        return [(tuple(o.shape), str(o.dtype).split(".")[-1]) for o in outs]
    assert run(mx) == run(mlx)


def test_cholesky_of_a_stack_fails_only_for_the_matrices_that_are_not_positive_definite():
    """numpy raises for the whole stack; each factorable matrix keeps its factor and the
    others are NaN (MLX leaves LAPACK's partial factor there: see PARITY.md)."""
    rng = np.random.default_rng(3)
    m = rng.normal(size=(3, 3))
    good = (m @ m.T + 3 * np.eye(3)).astype(np.float32)
    bad = np.diag([1.0, -1.0, 2.0]).astype(np.float32)
    out = np.array(mx.linalg.cholesky(mx.array(np.stack([good, bad, good])), stream=mx.cpu))
    np.testing.assert_allclose(out[0], np.linalg.cholesky(good), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[2], out[0])
    assert np.isnan(out[1]).all()


@pytest.mark.parametrize("ord", [1, -1, float("inf"), -float("inf")])
@pytest.mark.parametrize("axis", [[-1, -2], [-2, -1], [0, -1], [1, -2]])
def test_matrix_norm_takes_negative_axes(ord, axis):
    x = np.arange(1, 19, dtype=np.float32).reshape(2, 3, 3)
    if axis in ([0, -1], [1, -2]):
        x = x[0]
    got = np.array(mx.linalg.norm(mx.array(x), ord=ord, axis=axis))
    np.testing.assert_allclose(got, np.linalg.norm(x, ord=ord, axis=tuple(axis)), rtol=1e-6)
