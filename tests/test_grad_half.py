"""Reverse and forward mode in float16 and bfloat16 against JAX: the common elementwise,
reduction and product rules (the shared cases of tests/autodiff_cases.py).

The inputs and the cotangent / tangent are rounded to the half type; tapescope computes in
that type (as MLX does: its results are float16 / bfloat16), JAX computes the same function
in float32 on the rounded values. Tolerance, normwise: |got - want| <= 4 eps (b + |want| +
max b), eps the half type's (float16: 2^-10, bfloat16: 2^-7), b the magnitude of the sum
behind each value (|cotangent| |J| for a VJP, |J| |tangent| for a JVP, J from jax.jacrev):
a derivative is rounded on the scale of its terms (a softmax VJP subtracts numbers of size
|cotangent|), and a rule that reads the rounded forward output (tanh's 1 - y^2) is off by
eps relative to the largest values of the array. Measured over 6 seeds: at most 1.1 eps.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import tapescope.core as mx
from autodiff_cases import cases

jax = pytest.importorskip("jax")

# the elementwise rules (but remainder: rounding can cross its floor; erfinv: MLX computes
# it in float32 whatever the input), one of each reduction, the products
FAMILIES = {"exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "arcsin",
            "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "sqrt",
            "rsqrt", "square", "abs", "negative", "sigmoid", "erf", "floor", "sign",
            "stop_gradient", "reciprocal", "add", "subtract", "multiply", "divide", "power",
            "logaddexp", "arctan2", "maximum", "minimum", "broadcast_add", "where",
            "sumNone", "sum1", "prod1", "max0", "minNone", "mean(0, 1)", "logsumexp",
            "softmax", "var", "cumsum_fwd_inc", "matmul", "matvec", "addmm"}
HALF = [c for c in cases() if c[0] in FAMILIES]
K = 4  # epsilons of the half type (see the module)
DTYPES = {"float16": (mx.float16, np.float16, 2.0 ** -10),
          "bfloat16": (mx.bfloat16, ml_dtypes.bfloat16, 2.0 ** -7)}


def _round(x: np.ndarray, np_dtype) -> np.ndarray:
    return x.astype(np_dtype).astype(np.float32)


def _tie(name: str, xs: list) -> bool:
    """Whether rounding made two compared values equal (no unique derivative there)."""
    if name in ("maximum", "minimum"):
        return bool((xs[0] == xs[1]).any())
    if name[:3] in ("max", "min"):
        return len(np.unique(xs[0])) < xs[0].size
    return False


def _close(got, want, bound, eps: float, what: str) -> None:
    """|got - want| <= K eps (bound + |want| + max bound) (see the module)."""
    got = np.array(got.astype(mx.float32))  # (numpy has no bfloat16 buffer format)
    want, bound = np.asarray(want, np.float64), np.asarray(bound, np.float64)
    err = np.abs(got - want)
    limit = K * eps * (bound + np.abs(want) + (bound.max() if bound.size else 0.0)) + 1e-30
    worst = float((err / limit).max()) if err.size else 0.0
    assert worst <= 1, f"{what}: error {worst:.2f} x the limit\n{got}\n{want}"


def _check(case, dtype: str, seed: int) -> bool:
    """Compare; False (nothing compared) when rounding made a tie of max / min."""
    name, f, g, gens = case
    mdt, ndt, eps = DTYPES[dtype]
    rng = np.random.default_rng(seed)
    xs = [_round(gen(rng, shape).astype(np.float32), ndt) for gen, shape in gens]
    if _tie(name, xs):
        return False
    out_shape = f(*[mx.array(x) for x in xs]).shape
    cot = _round(rng.normal(size=out_shape).astype(np.float32), ndt)
    ts = [_round(rng.normal(size=x.shape).astype(np.float32), ndt) for x in xs]
    jac = [np.abs(np.asarray(j, np.float64)) for j in
           jax.jacrev(g, argnums=tuple(range(len(xs))))(*xs)]
    k = len(out_shape)

    outs, vjps = mx.vjp(f, [mx.array(x, mdt) for x in xs], [mx.array(cot, mdt)])
    assert outs[0].dtype == mdt and all(v.dtype == mdt for v in vjps), name
    _, pull = jax.vjp(g, *xs)
    for i, (got, want) in enumerate(zip(vjps, pull(cot))):
        bound = np.tensordot(np.abs(cot), jac[i], axes=k)
        _close(got, want, bound, eps, f"{name} {dtype} vjp[{i}]")

    _, tans = mx.jvp(f, [mx.array(x, mdt) for x in xs], [mx.array(t, mdt) for t in ts])
    assert tans[0].dtype == mdt, name
    bound = sum(np.tensordot(j, np.abs(t), axes=t.ndim) for j, t in zip(jac, ts))
    _close(tans[0], jax.jvp(g, tuple(xs), tuple(ts))[1], bound, eps, f"{name} {dtype} jvp")
    return True


# every rule once, float16 and bfloat16 in turn (hypothesis draws the other pairings)
PAIRS = [(c, "float16" if i % 2 == 0 else "bfloat16") for i, c in enumerate(HALF)]


@pytest.mark.parametrize("case,dtype", PAIRS, ids=[f"{c[0]}-{d}" for c, d in PAIRS])
def test_half_precision_vjp_and_jvp_match_jax(case, dtype):
    assert _check(case, dtype, seed=0)


@settings(max_examples=12, deadline=None)
@given(case=st.sampled_from(HALF), dtype=st.sampled_from(list(DTYPES)),
       seed=st.integers(1, 2 ** 16))
def test_half_precision_rules_hold_for_other_inputs(case, dtype, seed):
    assume(_check(case, dtype, seed))
