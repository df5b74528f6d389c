"""Reverse and forward mode (mx.grad, value_and_grad, vjp, jvp) against JAX, against central
finite differences in float64, and against MLX's own errors and results.

Tolerances: float32 results against jax.vjp / jax.jvp to rtol = atol = 2e-4 (both sides round
each op in float32; a few ops chain ~10 of them). Float64 against central differences with
step h = 1e-6: |AD - FD| <= 1e-6 * (1 + |AD|) (truncation O(h^2) ~ 1e-12, rounding ~ eps/h ~
1e-10). Complex cotangents follow MLX's convention (dL/dRe + i dL/dIm, the conjugate of
JAX's), so complex inputs are compared with MLX itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from autodiff_cases import cases
from conftest import mlx_ref, requires_mlx
from mlx_compare import same_error

jax = pytest.importorskip("jax")
jnp = jax.numpy

CASES = cases()
IDS = [c[0] for c in CASES]
NO_JVP = {"scatter_set", "scatter_add"}  # MLX: "[scatter] JVP not yet implemented"
# Float64 is not what these ops compute in (MLX's FFT is complex64; Hadamard, erfinv run
# in float32), so finite differences at float64 precision do not apply.
NO_F64 = {"fft", "fft2_real", "rfft", "rfft_odd", "irfft", "irfft_odd", "fftn_axes", "fftn_s",
          "ifftn_axes", "rfftn_axes", "rfftn_s", "irfftn_axes", "irfftn_odd_s", "erfinv",
          "astype", "hadamard", "stop_gradient",  # (stop_gradient: zero by design, not by calculus)
          # MLX's fast primitives compute float64 inputs in float32 (mlx/fast.cpp's astype)
          "rms_norm", "layer_norm", "rope_traditional"}
RTOL = ATOL = 2e-4


def _inputs(case, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [gen(rng, shape).astype(dtype) for gen, shape in case[3]]


def _jax_vjp(g, xs, cot):
    def run(xs, cot):
        value, pull = jax.vjp(g, *xs)
        return value, pull(cot)

    return jax.jit(run)(tuple(xs), cot)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vjp_matches_jax_vjp(case):
    name, f, g, _ = case
    xs = _inputs(case)
    out = f(*[mx.array(x) for x in xs])
    cot = np.random.default_rng(1).normal(size=out.shape).astype(np.float32)
    outs, vjps = mx.vjp(f, [mx.array(x) for x in xs], [mx.array(cot)])
    value, want = _jax_vjp(g, xs, cot)  # one jit: a compiled program, not an op at a time
    np.testing.assert_allclose(np.array(outs[0]), np.array(value), rtol=RTOL, atol=ATOL)
    for got, exp in zip(vjps, want):
        assert got.shape == tuple(exp.shape) and got.dtype == mx.float32
        np.testing.assert_allclose(np.array(got), np.array(exp), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jvp_matches_jax_jvp(case):
    name, f, g, _ = case
    xs = _inputs(case)
    ts = [np.random.default_rng(2 + i).normal(size=x.shape).astype(np.float32)
          for i, x in enumerate(xs)]
    if name in NO_JVP:
        with pytest.raises(RuntimeError, match=r"^\[scatter\] JVP not yet implemented$"):
            mx.jvp(f, [mx.array(x) for x in xs], [mx.array(t) for t in ts])
        return
    _, tans = mx.jvp(f, [mx.array(x) for x in xs], [mx.array(t) for t in ts])
    want = jax.jit(lambda xs, ts: jax.jvp(g, xs, ts)[1])(tuple(xs), tuple(ts))
    np.testing.assert_allclose(np.array(tans[0]), np.array(want), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] not in NO_F64],
                         ids=[c[0] for c in CASES if c[0] not in NO_F64])
def test_vjp_and_jvp_match_central_differences_in_float64(case):
    name, f, _, _ = case
    xs = _inputs(case, seed=3, dtype=np.float64)
    rng = np.random.default_rng(4)
    vs = [rng.normal(size=x.shape) for x in xs]
    out = f(*[mx.array(x, mx.float64) for x in xs])
    assert out.dtype == mx.float64, name
    cot = rng.normal(size=out.shape)
    h = 1e-6

    def phi(s):
        y = f(*[mx.array(x + s * v, mx.float64) for x, v in zip(xs, vs)])
        y = np.array(y)  # an exclusive max / logaddexp scan starts at -inf: no derivative there
        return float(np.sum(np.where(np.isfinite(y), y * cot, 0.0)))

    fd = (phi(h) - phi(-h)) / (2 * h)
    _, vjps = mx.vjp(f, [mx.array(x, mx.float64) for x in xs], [mx.array(cot, mx.float64)])
    ad = sum(float(np.sum(np.array(g) * v)) for g, v in zip(vjps, vs))
    assert abs(ad - fd) <= 1e-6 * (1 + abs(ad)), (name, ad, fd)
    if name not in NO_JVP:
        _, tans = mx.jvp(f, [mx.array(x, mx.float64) for x in xs], [mx.array(v, mx.float64) for v in vs])
        fwd = float(np.sum(np.array(tans[0]) * cot))
        assert abs(fwd - fd) <= 1e-6 * (1 + abs(fwd)), (name, fwd, fd)


# -- hypothesis over shapes and axes ----------------------------------------------------

@st.composite
def shape_and_axes(draw):
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd)))
    axes = draw(st.lists(st.integers(0, nd - 1), unique=True, min_size=1, max_size=nd))
    return shape, tuple(sorted(axes))


REDUCTIONS = {
    "sum": (mx.sum, jnp.sum), "prod": (mx.prod, jnp.prod), "max": (mx.max, jnp.max),
    "min": (mx.min, jnp.min), "mean": (mx.mean, jnp.mean), "logsumexp": (mx.logsumexp, jax.nn.logsumexp),
}


@settings(max_examples=10, deadline=None)
@given(shape_and_axes(), st.sampled_from(sorted(REDUCTIONS)), st.booleans())
def test_reduction_gradients_over_shapes_and_axes(sa, op, keepdims):
    shape, axes = sa
    f, g = REDUCTIONS[op]
    n = int(np.prod(shape))
    x = ((np.random.default_rng(n).permutation(n) + 1.0) / n).reshape(shape).astype(np.float32)
    w = np.random.default_rng(5).normal(size=g(x, axis=axes, keepdims=keepdims).shape).astype(np.float32)
    got = mx.grad(lambda a: mx.sum(f(a, axis=axes, keepdims=keepdims) * mx.array(w)))(mx.array(x))
    want = jax.jit(jax.grad(lambda a: jnp.sum(g(a, axis=axes, keepdims=keepdims) * w)))(x)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=RTOL, atol=ATOL)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_broadcast_transpose_and_slice_gradients_over_shapes(shape, data):
    shape = tuple(shape)
    nd = len(shape)
    perm = tuple(data.draw(st.permutations(range(nd))))
    # a broadcast operand: some axes of size 1, and maybe fewer dims
    small = tuple(1 if data.draw(st.booleans()) else s for s in shape)[data.draw(st.integers(0, nd - 1)):]
    start = tuple(data.draw(st.integers(0, s - 1)) for s in shape)
    x = np.random.default_rng(7).normal(size=shape).astype(np.float32)
    y = np.random.default_rng(8).normal(size=small).astype(np.float32)
    sl = tuple(slice(s, None) for s in start)

    def f(M, a, b):
        return M.sum(M.transpose(a * b, perm)[tuple(sl[p] for p in perm)] ** 2)

    got = mx.grad(lambda a, b: f(mx, a, b), argnums=(0, 1))(mx.array(x), mx.array(y))
    want = jax.jit(jax.grad(lambda a, b: f(jnp, a, b), argnums=(0, 1)))(x, y)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=RTOL, atol=ATOL)


# -- complex: MLX's convention ------------------------------------------------------------

COMPLEX = [
    ("fft", lambda M: M.fft.fft, "c"), ("ifft", lambda M: M.fft.ifft, "c"),
    ("rfft", lambda M: M.fft.rfft, "rc"), ("irfft", lambda M: M.fft.irfft, "cr"),
    ("abs", lambda M: M.abs, "cr"), ("exp", lambda M: M.exp, "c"),
    ("imag", lambda M: M.imag, "cr"), ("real", lambda M: M.real, "cr"),
    ("sin", lambda M: M.sin, "c"), ("multiply", lambda M: (lambda a: a * M.array(1 + 2j)), "c"),
    ("divide", lambda M: (lambda a: M.array(1 + 2j) / a), "c"),
]


@requires_mlx
@pytest.mark.parametrize("name,fn,kinds", COMPLEX, ids=[c[0] for c in COMPLEX])
def test_complex_vjps_and_jvps_follow_mlx(name, fn, kinds):
    rng = np.random.default_rng(11)

    def sample(kind, n):
        if kind == "c":
            return (rng.normal(size=n) + 1j * rng.normal(size=n)).astype(np.complex64)
        return rng.normal(size=n).astype(np.float32)

    n_in = 3 if name == "irfft" else (5 if name == "rfft" else 4)
    x = sample(kinds[0], n_in)
    n_out = {"rfft": 3, "irfft": 4}.get(name, n_in)
    ct = sample(kinds[-1] if len(kinds) == 2 else "c", n_out)
    t = sample(kinds[0], n_in)
    want = mlx_ref.vjp(fn(mlx_ref), [mlx_ref.array(x)], [mlx_ref.array(ct)])[1][0]
    got = mx.vjp(fn(mx), [mx.array(x)], [mx.array(ct)])[1][0]
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)
    want = mlx_ref.jvp(fn(mlx_ref), [mlx_ref.array(x)], [mlx_ref.array(t)])[1][0]
    got = mx.jvp(fn(mx), [mx.array(x)], [mx.array(t)])[1][0]
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)


# -- MLX's choices where the derivative is not unique ---------------------------------------

@requires_mlx
@pytest.mark.parametrize("src", [
    "M.grad(lambda x: M.max(M.array([1., 3., 3.]) * x))(M.ones(3))",
    "M.grad(lambda x: M.cummax(x).sum())(M.array([1., 3., 3., 2., 5.]))",
    "M.grad(lambda x: M.cummax(x, reverse=True).sum())(M.array([1., 3., 3., 2., 5.]))",
    "M.grad(lambda x: M.cummin(x, inclusive=False).sum())(M.array([1., 3., 3., 2., 5.]))",
    "M.grad(lambda x: M.cumprod(x).sum())(M.array([1., 0., 3., 2., 5.]))",
    "M.grad(lambda x: M.cumprod(x, reverse=True, inclusive=False).sum())(M.array([1., 0., 3., 0., 5.]))",
    "M.grad(lambda x: M.prod(x))(M.array([1., 0., 3., 2., 5.]))",
    "M.grad(lambda x: M.prod(x))(M.array([1., 0., 3., 0., 5.]))",
    "M.grad(lambda x, y: M.maximum(x, y).sum(), argnums=(0, 1))(M.ones(3), M.ones(3))",
    "M.grad(lambda x, y: M.minimum(x, y).sum(), argnums=(0, 1))(M.ones(3), M.ones(3))",
    "M.grad(lambda x: (x.at[M.array([0, 2])].maximum(M.array([2., 5.]))).sum())(M.array([1., 2., 3.]))",
    "M.grad(lambda x: (x.at[M.array([0, 2])].minimum(M.array([2., 5.]))).sum())(M.array([1., 2., 3.]))",
    "M.grad(lambda x: (M.floor(x) + M.sign(x) + M.round(x)).sum())(M.array([1.5, -2.]))",
    "M.grad(lambda x: (x > 1).astype(M.float32).sum() + M.argmax(x).astype(M.float32))(M.array([1., 2.]))",
    "M.grad(lambda x: M.remainder(x, 3.0).sum())(M.array([4., 5.]))",
    "M.grad(lambda x: (x * 2).sum())(M.array([1, 2]))",
    "M.grad(lambda x, y: (x * y).sum(), argnums=1)(M.array([1., 2.]), M.array([1, 2]))",
    "M.grad(lambda x: M.slice(x, M.array([1]), [0], [1]).sum())(M.array([1., 2.]))",
    "M.grad(lambda x: M.slice_update(x, x[:1] * 3, M.array([1]), [0]).sum())(M.array([1., 2.]))",
    "M.grad(lambda x: M.contiguous(x.T).sum() + M.as_strided(x, (2,), (1,)).sum())(M.ones((2, 2)))",
    "M.grad(lambda x: M.searchsorted(x, x).astype(M.float32).sum())(M.array([1., 2.]))",
    "M.grad(lambda x: M.hadamard_transform(x).sum())(M.array([1., 2.]))",
    "M.grad(lambda x: (M.divmod(x, 3.0)[0] + M.floor_divide(x, 2.0)).sum())(M.array([4., 5.]))",
])
def test_results_match_mlx(src):
    if "hadamard" in src and not hasattr(mx, "hadamard_transform"):
        pytest.skip("mx.hadamard_transform is not in this tree")
    got = eval(src, {"M": mx})
    want = eval(src, {"M": mlx_ref})
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want):
        assert a.dtype.name == str(b.dtype).split(".")[-1]
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)


# -- errors, compared with MLX's whole message ----------------------------------------------

ERRORS = [
    "M.grad(lambda x: x * 2)(M.array([1., 2.]))",
    "M.grad(lambda x: x * 2)(M.array([1.]))",
    "M.grad(lambda x: x.sum(), argnums=1)(M.array([1., 2.]))",
    "M.grad(lambda x: x.sum(), argnums=-1)(M.array([1., 2.]))",
    "M.grad(lambda x, y: x.sum(), argnums=[0, 0])(M.ones(2), M.ones(2))",
    "M.grad(lambda x, y: x.sum(), argnums=[1, 1, 0])(M.ones(2), M.ones(2))",
    "M.grad(lambda x: x.sum(), argnums='a')(M.ones(2))",
    "M.grad(lambda x, y=None: (x * y).sum(), argnames='z')(M.ones(2), y=M.ones(2))",
    "M.grad(lambda: M.array(1.0))()",
    "M.grad(lambda x: x.sum(), argnums=[], argnames=[])(M.ones(2))",
    "M.grad(lambda x: x.sum())(1.0)",
    "M.grad(lambda x: x.sum())([M.ones(2), 3])",
    "M.grad(lambda x: 1.0)(M.ones(2))",
    "M.grad(lambda x: (x.sum(), x))(M.ones(2))",
    "M.value_and_grad(lambda x: [x.sum(), 3])(M.ones(2))",
    "M.value_and_grad(lambda x: {'a': x.sum()})(M.ones(2))",
    "M.value_and_grad(lambda x: ())(M.ones(2))",
    "M.value_and_grad(lambda x: (3, x))(M.ones(2))",
    "M.value_and_grad(lambda x: x)(M.ones(2))",
    "M.vjp(lambda x: x * 2, [M.ones(2)], [M.ones(3)])",
    "M.vjp(lambda x, y: (x, y), [M.ones(2), M.ones(2)], [M.ones(2)])",
    "M.jvp(lambda x: x * 2, [M.ones(2)], [])",
    "M.jvp(lambda x: x * 2, [M.ones(2)], [M.ones(3)])",
    "M.jvp(lambda x: 2, [M.ones(2)], [M.ones(2)])",
    "M.grad(lambda x: M.linalg.inv(x, stream=M.cpu).sum())(M.eye(2))",
    "M.grad(lambda x: M.linalg.cholesky(x, stream=M.cpu).sum())(M.eye(2))",
    "M.grad(lambda x: M.linalg.eigvalsh(x, stream=M.cpu).sum())(M.eye(2))",
    "M.grad(lambda x: M.linalg.svd(x, stream=M.cpu)[1].sum())(M.eye(2))",
    "M.grad(lambda x: M.linalg.qr(x, stream=M.cpu)[0].sum())(M.eye(2))",
    "M.grad(lambda x: M.linalg.lu_factor(x, stream=M.cpu)[0].sum())(M.eye(2))",
    "M.jvp(lambda x: M.linalg.inv(x, stream=M.cpu), [M.eye(2)], [M.eye(2)])",
    "M.grad(lambda x: x.view(M.int32).astype(M.float32).sum())(M.ones(2))",
    "M.jvp(lambda x: x.view(M.int32), [M.ones(2)], [M.ones(2)])",
    "M.grad(lambda x: x.at[M.array([0])].multiply(M.array([2.])).sum())(M.ones(2))",
    "M.jvp(lambda x: x.at[M.array([0])].add(M.array([2.])), [M.ones(2)], [M.ones(2)])",
]


@pytest.mark.parametrize("src", ERRORS)
def test_errors_match_mlx(src):
    same_error(lambda M: eval(src, {"M": M}))


# -- pytrees, argnames, value_and_grad, stop_gradient ----------------------------------------

@requires_mlx
@pytest.mark.parametrize("src", [
    "M.grad(lambda p: (p[0] * p[1]).sum())([M.array([1., 2.]), M.array([3., 4.])])",
    "M.grad(lambda p: (p['a'] * p['b'][0]).sum())({'a': M.array([1., 2.]), 'b': (M.array([3., 4.]),)})",
    "M.grad(lambda x, y=None: (x * y).sum(), argnames='y')(M.array([1., 2.]), y=M.array([3., 5.]))",
    "M.grad(lambda x, y=None: (x * y * x).sum(), argnums=0, argnames=['y'])(M.array([1., 2.]), y=M.array([3., 5.]))",
    "M.value_and_grad(lambda x: (M.sum(x ** 2), {'aux': x * 3, 'n': 4}))(M.array([1., 2.]))",
    "M.value_and_grad(lambda x, y: M.sum(M.exp(x) * y), argnums=(0, 1))(M.array([1., 2.]), M.array([0.5, 0.25]))",
    "M.grad(lambda x: M.sum(M.stop_gradient(x) * x))(M.array([1., 2.]))",
    "M.grad(lambda x, y: M.sum(x * 2), argnums=1)(M.ones(2), M.ones(3))",
    "M.vjp(lambda x, y: (x * y, x + y), [M.array([1., 2.]), M.array([3., 4.])], [M.array([1., 1.]), M.array([2., 0.])])",
    "M.vjp(lambda x: [M.stop_gradient(x), x * 3], [M.array([1., 2.])], [M.array([1., 1.])])",
    "M.jvp(lambda x, y: (x * y, M.sin(x)), [M.array([1., 2.]), M.array([3., 4.])], [M.array([1., 0.]), M.array([0., 2.])])",
    "M.vjp(lambda x: x * 2, [M.array([1, 2])], [M.array([1, 1])])",
    "M.grad(lambda x: M.sum(x * x))(M.array([1., 2.], M.float16))",
])
def test_trees_and_values_match_mlx(src):
    got, want = eval(src, {"M": mx}), eval(src, {"M": mlx_ref})

    def leaves(t, out):
        if isinstance(t, (list, tuple)):
            for x in t:
                leaves(x, out)
        elif isinstance(t, dict):
            for k in t:
                out.append(("key", k))
                leaves(t[k], out)
        else:
            out.append(t)
        return out

    g, w = leaves(got, []), leaves(want, [])
    assert len(g) == len(w)
    for a, b in zip(g, w):
        if isinstance(b, mlx_ref.array):
            assert tuple(a.shape) == tuple(b.shape) and a.dtype.name == str(b.dtype).split(".")[-1]
            np.testing.assert_allclose(np.array(a, np.float64), np.array(b, np.float64), rtol=1e-5)
        else:
            assert a == b


BOOL_INPUT = {  # functions of a bool array; MLX casts no cotangent to its input's type
    "sum": lambda m: lambda x: m.sum(x).astype(m.float32),
    "prod": lambda m: lambda x: m.prod(x).astype(m.float32),
    "max": lambda m: lambda x: m.max(x).astype(m.float32),
    "cumsum": lambda m: lambda x: m.cumsum(x).astype(m.float32).sum(),
    "cumprod": lambda m: lambda x: m.cumprod(x).astype(m.float32).sum(),
    "mean": lambda m: lambda x: m.mean(x),
    "astype": lambda m: lambda x: x.astype(m.float32).sum(),
    "multiply": lambda m: lambda x: (x * 2.0).sum(),
    "square": lambda m: lambda x: m.square(x).astype(m.float32).sum(),
    "where": lambda m: lambda x: m.where(x, 1.0, 2.0).sum(),
    "broadcast": lambda m: lambda x: m.broadcast_to(x, (3, 2)).astype(m.float32).sum(),
}


@requires_mlx
@pytest.mark.parametrize("name", sorted(BOOL_INPUT))
def test_gradient_of_a_bool_input_has_mlx_dtype_and_values(name):
    want = mlx_ref.grad(BOOL_INPUT[name](mlx_ref))(mlx_ref.array([True, False]))
    got = mx.grad(BOOL_INPUT[name](mx))(mx.array([True, False]))
    assert str(got.dtype) == str(want.dtype)
    assert got.tolist() == want.tolist()
