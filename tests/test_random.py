"""mx.random: keys, split, the global key, and each sampler's distribution and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from mlx_compare import outcome
from conftest import mlx_ref, requires_mlx

N = 20000  # samples for the statistical checks (fixed keys: the tests are deterministic)


def _np(x) -> np.ndarray:
    return np.array(x)


def _ks_uniform(u: np.ndarray) -> float:
    """Kolmogorov-Smirnov distance of samples from U[0, 1)."""
    u = np.sort(u.ravel())
    n = u.size
    return float(max(np.max(np.arange(1, n + 1) / n - u), np.max(u - np.arange(n) / n)))


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


# -- keys ------------------------------------------------------------------------------------

@requires_mlx
@given(seed=st.integers(0, 2**64 - 1))
@settings(max_examples=40, deadline=None)
def test_key_and_split_match_mlx_bit_for_bit(seed):
    mlx = mlx_ref
    k = mx.random.key(seed)
    assert k.dtype == mx.uint32 and k.shape == (2,)
    assert _np(k).tolist() == _np(mlx.random.key(seed)).tolist()
    for num in (1, 2, 5):
        assert _np(mx.random.split(k, num)).tolist() == _np(mlx.random.split(mlx.random.key(seed), num)).tolist()


@requires_mlx
@pytest.mark.parametrize("shape", [(), (1,), (3,), (4,), (7,), (2, 3), (5, 1, 3)])
def test_uniform_bits_match_mlx(mlx, shape):
    a = mx.random.uniform(shape=shape, key=mx.random.key(11))
    b = mlx.random.uniform(shape=shape, key=mlx.random.key(11))
    np.testing.assert_array_equal(_np(a), _np(b))


def test_same_key_same_numbers_and_split_streams_differ():
    k = mx.random.key(3)
    a, b = _np(mx.random.uniform(shape=(100,), key=k)), _np(mx.random.uniform(shape=(100,), key=k))
    np.testing.assert_array_equal(a, b)
    k1, k2 = mx.random.split(k)
    c, d = _np(mx.random.uniform(shape=(N,), key=k1)), _np(mx.random.uniform(shape=(N,), key=k2))
    assert not np.array_equal(c, d)
    assert abs(np.corrcoef(c, d)[0, 1]) < 0.03


@requires_mlx
def test_global_key_advances_like_mlx(mlx):
    mx.random.seed(3)
    mlx.random.seed(3)
    assert type(mx.random.state).__name__ == type(mlx.random.state).__name__ == "_RandomState"
    assert len(mx.random.state) == 1
    assert _np(mx.random.state[0]).tolist() == _np(mlx.random.state[0]).tolist()
    a, b = mx.random.uniform(shape=(4,)), mlx.random.uniform(shape=(4,))
    np.testing.assert_array_equal(_np(a), _np(b))
    assert _np(mx.random.state[0]).tolist() == _np(mlx.random.state[0]).tolist()
    c = mx.random.uniform(shape=(4,))
    assert not np.array_equal(_np(a), _np(c))


def test_seed_reproduces():
    mx.random.seed(42)
    a = _np(mx.random.normal((50,)))
    mx.random.seed(42)
    np.testing.assert_array_equal(a, _np(mx.random.normal((50,))))


def test_graph_records_randombits():
    u = mx.random.uniform(shape=(3,), key=mx.random.key(0))
    seen, stack = set(), [u._d.node]
    while stack:
        n = stack.pop()
        seen.add(n.primitive.name)
        stack.extend(i.node for i in n.inputs if i.node is not None)
    assert "RandomBits" in seen


# -- distributions ---------------------------------------------------------------------------

def test_uniform_distribution_and_bounds():
    u = _np(mx.random.uniform(shape=(N,), key=mx.random.key(1)))
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    assert _ks_uniform(u) < 1.63 / math.sqrt(N)  # KS 1% critical value
    v = _np(mx.random.uniform(-2, 3, (N,), key=mx.random.key(2)))
    assert v.min() >= -2 and v.max() < 3 and abs(v.mean() - 0.5) < 0.05


@given(shape=st.lists(st.integers(0, 4), max_size=3).map(tuple),
       dtype=st.sampled_from([mx.float32, mx.float16, mx.bfloat16]))
@settings(max_examples=30, deadline=None)
def test_uniform_shapes_and_dtypes(shape, dtype):
    u = mx.random.uniform(shape=shape, dtype=dtype, key=mx.random.key(5))
    assert u.shape == shape and u.dtype == dtype
    d = _np(u.astype(mx.float32))
    assert d.size == 0 or (d.min() >= 0 and d.max() < 1)


def test_normal_moments_and_ks():
    z = _np(mx.random.normal((N,), key=mx.random.key(7)))
    assert abs(z.mean()) < 0.03 and abs(z.var() - 1) < 0.04
    zs = np.sort(z)
    ks = np.max(np.abs(_normal_cdf(zs) - np.arange(1, N + 1) / N))
    assert ks < 1.63 / math.sqrt(N)
    w = _np(mx.random.normal((N,), loc=3.0, scale=2.0, key=mx.random.key(8)))
    assert abs(w.mean() - 3) < 0.06 and abs(w.std() - 2) < 0.06


def test_normal_dtypes():
    assert mx.random.normal((3,), dtype=mx.float16, key=mx.random.key(0)).dtype == mx.float16
    c = _np(mx.random.normal((N,), dtype=mx.complex64, key=mx.random.key(9)))
    assert c.dtype == np.complex64
    assert abs(c.real.var() - 0.5) < 0.03 and abs(c.imag.var() - 0.5) < 0.03
    assert mx.random.normal(scale=mx.array([[1.0, 2.0]]), key=mx.random.key(0)).shape == (1, 2)


def test_randint_uniform_over_range():
    r = _np(mx.random.randint(-3, 7, (N,), key=mx.random.key(4)))
    assert r.dtype == np.int32 and r.min() == -3 and r.max() == 6
    counts = np.bincount(r + 3, minlength=10)
    expected = N / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 21.67  # chi-square, 9 dof, 1%
    assert mx.random.randint(0, 5, (3,), dtype=mx.uint8, key=mx.random.key(0)).dtype == mx.uint8


def test_bernoulli_rate():
    b = _np(mx.random.bernoulli(0.3, (N,), key=mx.random.key(5)))
    assert b.dtype == np.bool_ and abs(b.mean() - 0.3) < 0.015
    p = mx.array([0.0, 1.0])
    assert _np(mx.random.bernoulli(p, key=mx.random.key(1))).tolist() == [False, True]


def test_truncated_normal_in_bounds_and_mean():
    t = _np(mx.random.truncated_normal(-1.0, 2.0, (N,), key=mx.random.key(6)))
    assert t.min() >= -1 and t.max() <= 2
    # Mean of N(0,1) truncated to [a, b]: (phi(a) - phi(b)) / (Phi(b) - Phi(a)).
    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    Phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    mean = (phi(-1) - phi(2)) / (Phi(2) - Phi(-1))
    assert abs(t.mean() - mean) < 0.03


def test_gumbel_and_laplace_moments():
    g = _np(mx.random.gumbel((N,), key=mx.random.key(10)))
    assert abs(g.mean() - 0.5772) < 0.04 and abs(g.var() - math.pi**2 / 6) < 0.1
    lap = _np(mx.random.laplace((N,), loc=1.0, scale=2.0, key=mx.random.key(11)))
    assert abs(lap.mean() - 1) < 0.08 and abs(lap.var() - 8) < 0.5


def test_categorical_frequencies_and_shapes():
    logits = mx.array(np.log(np.array([0.1, 0.2, 0.7], dtype=np.float32)))
    c = _np(mx.random.categorical(logits, num_samples=N, key=mx.random.key(12)))
    assert c.dtype == np.uint32 and c.shape == (N,)
    np.testing.assert_allclose(np.bincount(c, minlength=3) / N, [0.1, 0.2, 0.7], atol=0.015)
    z = mx.zeros((3, 4))
    assert mx.random.categorical(z, key=mx.random.key(0)).shape == (3,)
    assert mx.random.categorical(z, axis=0, key=mx.random.key(0)).shape == (4,)
    assert mx.random.categorical(z, shape=(2, 3), key=mx.random.key(0)).shape == (2, 3)


def test_permutation_is_a_permutation():
    p = _np(mx.random.permutation(50, key=mx.random.key(13)))
    assert p.dtype == np.uint32 and sorted(p.tolist()) == list(range(50))
    x = mx.array(np.arange(12).reshape(3, 4))
    q = _np(mx.random.permutation(x, axis=1, key=mx.random.key(14)))
    assert sorted(q[0].tolist()) == [0, 1, 2, 3] and (q - q[0] == np.array([[0], [4], [8]])).all()


def test_multivariate_normal_covariance():
    cov = np.array([[2.0, 0.6], [0.6, 1.0]], dtype=np.float32)
    x = _np(mx.random.multivariate_normal(mx.array([1.0, -1.0]), mx.array(cov), (N,),
                                          key=mx.random.key(15)))
    assert x.shape == (N, 2)
    np.testing.assert_allclose(x.mean(0), [1, -1], atol=0.05)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.08)


# -- errors (same type and message as MLX) ---------------------------------------------------

ERRORS = [
    "uniform(dtype=M.int32)",
    "uniform(M.zeros((3,)), 1)",
    "uniform(0, 1, (2,), key=M.array([1, 2]))",
    "uniform(0, 1, (2,), key=M.array([1, 2, 3], M.uint32))",
    "uniform(shape=(2,), dtype=M.float64)",
    "normal((2,), dtype=M.int32)",
    "randint(0, 10, (3,), dtype=M.float32)",
    "bernoulli(1)",
    "bernoulli(M.array([0.1, 0.5]), (3,))",
    "truncated_normal(-1, 1, (3,), dtype=M.int32)",
    "categorical(M.zeros((3, 4)), shape=(2, 3), num_samples=2)",
    "categorical(M.zeros((3, 4)), axis=2)",
    "gumbel((2,), dtype=M.int32)",
    "laplace((2,), dtype=M.int32)",
    "multivariate_normal(M.zeros((2,)), M.eye(2), dtype=M.float16)",
    "multivariate_normal(M.zeros(()), M.eye(2))",
    "multivariate_normal(M.zeros((2,)), M.zeros((2,)))",
    "multivariate_normal(M.zeros((2,)), M.zeros((2, 3)))",
    "multivariate_normal(M.zeros((3,)), M.eye(2))",
    "split(M.array([1, 2]))",
    "key(-1)",
]


def _outcome(mod, expr):
    return outcome(mod, "M.random." + expr)


@requires_mlx
@pytest.mark.parametrize("expr", ERRORS)
def test_errors_match_mlx(mlx, expr):
    want = _outcome(mlx, expr)
    assert want is not None
    assert _outcome(mx, expr) == want


@requires_mlx
@pytest.mark.parametrize("src", [
    "M.random.normal((-1,))", "M.random.normal((2, -3))", "M.random.uniform(shape=(-1,))",
    "M.random.randint(0, 3, (-1,))", "M.random.bernoulli(0.5, (-1,))",
    "M.random.truncated_normal(0, 1, (-1,))", "M.random.gumbel((-1,))",
    "M.random.laplace((-1,))", "M.random.permutation(-1)",
    "M.random.categorical(M.zeros((3,)), shape=(-1,))",
    "M.random.multivariate_normal(M.zeros((2,)), M.eye(2), shape=(-1,))",
])
def test_negative_dimensions_raise_as_mlx_and_leave_the_global_key(src):
    before = np.array(mx.random.state[0])
    assert outcome(mx, src) == outcome(mlx_ref, src)
    assert outcome(mx, src)[1] == "[bits] Negative dimensions not allowed."
    # the check comes before the global key is drawn: a failed call leaves the state as it
    # was (MLX's Python bindings draw the key first for some samplers and advance it)
    np.testing.assert_array_equal(np.array(mx.random.state[0]), before)
