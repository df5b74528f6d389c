"""``mx.fast.scaled_dot_product_attention`` as MLX's ``ScaledDotProductAttention`` primitive
(interactive/core/fast.py, kernels/rules/fast.py) against float64 numpy over hypothesis
shapes: batch, heads, kv heads dividing them, query / key lengths (1, non-multiples; the
rule's query blocks split by a monkeypatched block size), head sizes 64 / 80 / 128 (and a
small one), every mask kind, sinks, float32 / float16 / bfloat16. The primitive is recorded where a kernel takes the
inputs, the composition elsewhere; the VJP against JAX (float64), vmap against the
unbatched calls, values against MLX where it is installed.

``make test`` runs a sample; ``TAPESCOPE_REDUCTION_SWEEP=1`` more examples.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx

from conftest import mlx_ref
from sdpa_inputs import BF16, MXD, inputs

SWEEP = os.environ.get("TAPESCOPE_REDUCTION_SWEEP") == "1"
EXAMPLES = 150 if SWEEP else 15
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
LOW = np.finfo(np.float32).min


def ref(q, k, v, scale, mask=None, causal=False, sinks=None):
    """softmax(q kᵀ scale + mask) v in float64 (MLX's fallback's semantics)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, H, L, D = q.shape
    reps = H // k.shape[1]
    k, v = np.repeat(k, reps, 1), np.repeat(v, reps, 1)
    kL = k.shape[2]
    s = np.einsum("bhld,bhkd->bhlk", q, k) * scale
    if causal:
        s = np.where(np.arange(L)[:, None] + kL - L >= np.arange(kL)[None], s, LOW)
    if mask is not None:
        s = np.where(mask, s, LOW) if mask.dtype == np.bool_ else s + mask.astype(np.float64)
    if sinks is not None:
        sk = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None], (B, H, L, 1))
        s = np.concatenate([sk, s], -1)
    s = np.exp(s - s.max(-1, keepdims=True))
    p = s / s.sum(-1, keepdims=True)
    if sinks is not None:
        p = p[..., 1:]
    return np.einsum("bhlk,bhkd->bhld", p, v)


def host(a) -> np.ndarray:
    """``a``'s values in float64. bfloat16 is read as its bits (``view``, no kernel): an
    ``astype`` would launch one, and the stand-in driver's launches run nothing."""
    if a.dtype == mx.bfloat16:
        return np.asarray(a.view(mx.uint16)).view(BF16).astype(np.float64)
    return np.asarray(a).astype(np.float64)


def prim_of(a) -> str:
    node = a._d.node
    return node.primitive.name if node is not None else ""


@st.composite
def case(draw):
    B = draw(st.sampled_from([1, 2]))
    kv = draw(st.sampled_from([1, 2]))
    reps = draw(st.sampled_from([1, 2, 4]))
    L = draw(st.sampled_from([1, 2, 5, 8, 9, 31, 257]))
    kL = draw(st.sampled_from([1, 7, 32, 33, 300]))
    D = draw(st.sampled_from([8, 64, 80, 128]))
    mask = draw(st.sampled_from([None, "causal", "bool", "additive", "bool_bcast"]))
    if mask == "causal":
        kL = max(kL, L)
    sinks = draw(st.booleans())
    dtype = draw(st.sampled_from(sorted(MXD)))
    return B, kv, reps, L, kL, D, mask, sinks, dtype, draw(st.integers(0, 2 ** 16))


def _inputs(c):
    B, kv, reps, L, kL, D, mask, sinks, dtype, seed = c
    return inputs(B, kv, reps, L, kL, D, mask, sinks, dtype, seed)


@settings(max_examples=EXAMPLES, deadline=None)
@given(case())
def test_sdpa_against_float64(c):
    B, kv, reps, L, kL, D, mask, sinks, dtype, _ = c
    q, k, v, m, s = _inputs(c)
    scale = D ** -0.5
    mk = "causal" if mask == "causal" else (mx.array(m) if m is not None else None)
    out = mx.fast.scaled_dot_product_attention(
        mx.array(q, dtype=MXD[dtype]), mx.array(k, dtype=MXD[dtype]), mx.array(v, dtype=MXD[dtype]),
        scale=scale, mask=mk, sinks=mx.array(s, dtype=MXD[dtype]) if s is not None else None)
    assert prim_of(out) == "ScaledDotProductAttention"
    assert out.dtype == MXD[dtype] and out.shape == (B, kv * reps, L, D)
    want = ref(q, k, v, scale, m, mask == "causal", s)
    tol = TOL[dtype]
    np.testing.assert_allclose(host(out), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


def test_sdpa_records_the_composition_where_no_kernel_takes_it():
    q = mx.ones((1, 2, 4, 300))
    assert prim_of(mx.fast.scaled_dot_product_attention(q, q, q, scale=1.0)) != \
        "ScaledDotProductAttention"
    q, k = mx.ones((1, 2, 6, 8)), mx.ones((1, 2, 3, 8))  # causal with L > kL
    assert prim_of(mx.fast.scaled_dot_product_attention(q, k, k, scale=1.0, mask="causal")) != \
        "ScaledDotProductAttention"
    v = mx.ones((1, 2, 3, 16))  # value head size other than the query's
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert prim_of(out) != "ScaledDotProductAttention" and out.shape == (1, 2, 6, 16)


def test_sdpa_mixed_dtypes_promote():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 3, 64)).astype(np.float16)
    k = rng.standard_normal((1, 2, 5, 64)).astype(np.float32)
    out = mx.fast.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(k), scale=0.1)
    assert out.dtype == mx.float32
    np.testing.assert_allclose(host(out), ref(q, k, k, 0.1), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mask", [None, "causal", "additive", "bool"])
@pytest.mark.parametrize("sinks", [False, True])
def test_sdpa_vjp_against_jax(mask, sinks):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 5, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, 7, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, 7, 16)).astype(np.float32)
    g = rng.standard_normal((2, 4, 5, 16)).astype(np.float32)
    m = rng.standard_normal((5, 7)).astype(np.float32) if mask == "additive" else \
        (rng.random((5, 7)) > 0.3 if mask == "bool" else None)
    sk = rng.standard_normal(4).astype(np.float32)

    def jref(q, k, v, sk):
        kk, vv = jnp.repeat(k, 2, 1), jnp.repeat(v, 2, 1)
        s = jnp.einsum("bhld,bhkd->bhlk", q, kk) * 0.3
        if mask == "causal":
            s = jnp.where(jnp.arange(5)[:, None] + 2 >= jnp.arange(7)[None], s, LOW)
        elif m is not None:
            s = jnp.where(m, s, LOW) if m.dtype == np.bool_ else s + m
        if sinks:
            s = jnp.concatenate([jnp.broadcast_to(sk[None, :, None, None], (2, 4, 5, 1)), s], -1)
        p = jax.nn.softmax(s, -1)
        return jnp.einsum("bhlk,bhkd->bhld", p[..., 1:] if sinks else p, vv)

    args64 = [a.astype(np.float64) for a in (q, k, v, sk)]
    _, back = jax.vjp(jref, *args64)
    want = back(g.astype(np.float64))
    mk = "causal" if mask == "causal" else (mx.array(m) if m is not None else None)

    def f(q, k, v, sk):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=mk,
                                                    sinks=sk if sinks else None)

    _, got = mx.vjp(f, [mx.array(a) for a in (q, k, v, sk)], [mx.array(g)])
    for gi, wi in zip(got[:3] + (got[3:] if sinks else []), want[:3] + (want[3:] if sinks else ())):
        np.testing.assert_allclose(host(gi), np.asarray(wi), rtol=1e-4, atol=1e-4)


def test_sdpa_vmap_matches_unbatched():
    rng = np.random.default_rng(2)
    q, k, v = (mx.array(rng.standard_normal((3, 1, 2, 4, 64)).astype(np.float32)) for _ in range(3))
    f = lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    got = mx.vmap(f, in_axes=(0, 0, 0))(q, k, v)
    for i in range(3):
        np.testing.assert_allclose(host(got[i]), host(f(q[i], k[i], v[i])), rtol=1e-6, atol=1e-6)
    got = mx.vmap(f, in_axes=(0, None, None))(q, k[0], v[0])  # the composition, batched
    for i in range(3):
        np.testing.assert_allclose(host(got[i]), host(f(q[i], k[0], v[0])), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")
@settings(max_examples=EXAMPLES, deadline=None)
@given(case())
def test_sdpa_against_mlx(c):
    B, kv, reps, L, kL, D, mask, sinks, dtype, _ = c
    q, k, v, m, s = _inputs(c)
    outs = []
    for M in (mx, mlx_ref):
        d = getattr(M, dtype)
        mk = "causal" if mask == "causal" else (M.array(m) if m is not None else None)
        o = M.fast.scaled_dot_product_attention(
            M.array(q.astype(np.float32)).astype(d), M.array(k.astype(np.float32)).astype(d),
            M.array(v.astype(np.float32)).astype(d), scale=D ** -0.5, mask=mk,
            sinks=M.array(s.astype(np.float32)).astype(d) if s is not None else None)
        assert str(o.dtype).split(".")[-1] == dtype
        outs.append(np.asarray(o.astype(M.float32)).astype(np.float64))
    tol = 4 * TOL[dtype]
    np.testing.assert_allclose(outs[0], outs[1], rtol=tol, atol=tol * max(1.0, np.abs(outs[1]).max()))


@pytest.mark.parametrize("mask", [None, "causal", "bool", "additive"])
def test_sdpa_query_blocks(monkeypatch, mask):
    """The array-module rule's query blocks (16 rows at the smallest) split a 37-row query:
    each block's causal offset and mask rows (the rule itself, over numpy: the CPU runs the
    generated kernels, tests/test_sdpa_kernels.py)."""
    from tapescope.kernels.rules import fast as rules

    monkeypatch.setattr(rules, "SDPA_SCORES", 1)
    c = (2, 2, 2, 37, 40, 64, mask, True, "float32", 5)
    q, k, v, m, s = _inputs(c)
    rest = ([np.broadcast_to(m, (2, 4, 37, 40))] if m is not None else []) + [s]
    out = rules.scaled_dot_product_attention(np, q, k, v, *rest, scale=0.125,
                                             causal=mask == "causal", has_mask=m is not None,
                                             has_sinks=True)
    want = ref(q, k, v, 0.125, m, mask == "causal", s)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-5, atol=2e-5)
