"""``ScaledDotProductAttention``'s generated C kernels (``codegen/attention_kernels.py``, run
by ``cpu/fast_kernels.py``) against float64 numpy over hypothesis shapes: query lengths 1..9
(the vector kernel up to 8) and around the tiled kernel's 32-row query blocks, key lengths
around its 64-key blocks, head sizes 32 / 64 / 80 / 128, grouped-query heads, every mask
kind (a boolean mask's fully masked rows included), sinks, float32 / float16 / bfloat16, and
transposed / strided inputs; each case checks that the kernel ran (a ``kernel_launch`` and no
``kernel_fallback``). MLX's fallback semantics at the edges (a fully masked row, an additive
``-inf`` row) against MLX itself where it is installed; what no kernel takes runs the rule and
says why; the kernels are in ``kernel_cache()`` with their C.

``make test`` runs a sample; ``TAPESCOPE_REDUCTION_SWEEP=1`` more examples.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope
import tapescope.core as mx
from tapescope.kernels.codegen.attention_kernels import SdpaSpec
from tapescope.kernels.cpu import compiler

from conftest import kernel_launches as launched, mlx_ref
from sdpa_inputs import MXD, inputs
from test_sdpa import TOL, host, ref

SWEEP = os.environ.get("TAPESCOPE_REDUCTION_SWEEP") == "1"
EXAMPLES = 200 if SWEEP else 12
needs_cc = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")
PRIM = "ScaledDotProductAttention"


@st.composite
def case(draw):
    B = draw(st.sampled_from([1, 2]))
    kv = draw(st.sampled_from([1, 2]))
    reps = draw(st.sampled_from([1, 2, 4]))
    L = draw(st.sampled_from([1, 2, 3, 5, 8, 9, 31, 32, 33, 65, 129]))
    kL = draw(st.sampled_from([1, 16, 63, 64, 65, 128, 129, 200]))
    D = draw(st.sampled_from([8, 16, 32, 64, 80, 128]))  # groups of lanes, whole warps, a part-filled warp
    mask = draw(st.sampled_from([None, "causal", "bool", "additive", "bool_bcast"]))
    if mask == "causal":
        kL = max(kL, L)
    sinks = draw(st.booleans())
    dtype = draw(st.sampled_from(sorted(MXD)))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    return B, kv, reps, L, kL, D, mask, sinks, dtype, layout, draw(st.integers(0, 2 ** 16))


def _layout(a: np.ndarray, layout: str, t) -> "mx.array":
    """``a`` as an mx array in ``layout``: row-major, a (B, L, H, D) buffer transposed to
    (B, H, L, D), or a slice of a wider buffer (every stride above the head's not packed)."""
    if layout == "transposed":
        return mx.swapaxes(mx.array(np.ascontiguousarray(a.swapaxes(1, 2)), dtype=t), 1, 2)
    if layout == "strided":
        wide = np.zeros(a.shape[:-1] + (a.shape[-1] + 16,), a.dtype)
        wide[..., 8:8 + a.shape[-1]] = a
        return mx.array(wide, dtype=t)[..., 8:8 + a.shape[-1]]
    return mx.array(a, dtype=t)


def _inputs(c):
    B, kv, reps, L, kL, D, mask, sinks, dtype, layout, seed = c
    return inputs(B, kv, reps, L, kL, D, mask, sinks, dtype, seed)


@needs_cc
@settings(max_examples=EXAMPLES, deadline=None)
@given(case())
def test_sdpa_kernels_match_float64_numpy(c):
    B, kv, reps, L, kL, D, mask, sinks, dtype, layout, _ = c
    q, k, v, m, s = _inputs(c)
    t = MXD[dtype]
    mk = "causal" if mask == "causal" else (mx.array(m) if m is not None else None)
    qa, ka, va = (_layout(a, layout, t) for a in (q, k, v))
    mx.eval(qa, ka, va)
    with launched() as rec:
        out = mx.fast.scaled_dot_product_attention(
            qa, ka, va, scale=D ** -0.5, mask=mk, sinks=mx.array(s, dtype=t) if s is not None else None)
        mx.eval(out)
    assert PRIM in rec.primitives and not rec.fallbacks
    assert out.dtype == t and out.shape == (B, kv * reps, L, D)
    want = ref(q, k, v, D ** -0.5, m, mask == "causal", s)
    tol = TOL[dtype]
    np.testing.assert_allclose(host(out), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


@needs_cc
@pytest.mark.parametrize("L", [1, 70])
def test_a_fully_masked_row_averages_the_values_as_mlx_s_fallback(L):
    """A boolean mask's False is float32's lowest score: a row with every key masked weighs
    every key alike (MLX's fallback, which MLX's CPU runs); an additive row of ``-inf`` is
    NaN there too."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, n, 64)).astype(np.float32) for n in (L, 90, 90))
    m = rng.random((1, 2, L, 90)) > 0.5
    m[0, 1, 0] = False
    add = np.where(m, 0.0, -np.inf).astype(np.float32)
    with launched() as rec:
        got = mx.fast.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(v),
                                                   scale=0.125, mask=mx.array(m))
        got_add = mx.fast.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(v),
                                                       scale=0.125, mask=mx.array(add))
        mx.eval(got, got_add)
    assert PRIM in rec.primitives and not rec.fallbacks
    np.testing.assert_allclose(np.array(got)[0, 1, 0], v[0, 1].mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(got), ref(q, k, v, 0.125, m), rtol=2e-5, atol=2e-5)
    assert np.isnan(np.array(got_add)[0, 1, 0]).all()
    np.testing.assert_allclose(np.array(got_add)[0, 0], np.array(got)[0, 0], rtol=1e-5, atol=1e-5)
    if mlx_ref is not None:
        for mk, mine in ((m, got), (add, got_add)):
            theirs = mlx_ref.fast.scaled_dot_product_attention(
                mlx_ref.array(q), mlx_ref.array(k), mlx_ref.array(v), scale=0.125,
                mask=mlx_ref.array(mk))
            np.testing.assert_allclose(np.array(mine), np.array(theirs), rtol=1e-5, atol=1e-5)


@needs_cc
def test_causal_offsets_are_mlx_s_with_more_keys_than_queries():
    """Query ``i`` sees keys ``j <= i + kL - L`` (MLX's causal offsets), across query blocks
    and key blocks (L = 100, kL = 300) and in the vector kernel (L = 5)."""
    rng = np.random.default_rng(4)
    for L in (5, 100):
        q = rng.standard_normal((2, 4, L, 64)).astype(np.float32)
        k, v = (rng.standard_normal((2, 2, 300, 64)).astype(np.float32) for _ in range(2))
        with launched() as rec:
            got = mx.fast.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(v),
                                                       scale=0.125, mask="causal")
            mx.eval(got)
        assert PRIM in rec.primitives and not rec.fallbacks
        np.testing.assert_allclose(host(got), ref(q, k, v, 0.125, causal=True), rtol=2e-5, atol=2e-5)


@needs_cc
def test_what_no_kernel_takes_runs_the_rule_and_says_why():
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((1, 2, n, 16)) for n in (3, 7))  # float64: no kernel
    with launched() as rec:
        got = mx.fast.scaled_dot_product_attention(
            mx.array(q, dtype=mx.float64), mx.array(k, dtype=mx.float64),
            mx.array(k, dtype=mx.float64), scale=0.25, mask="causal")
        mx.eval(got)
    assert PRIM not in rec.primitives
    assert any("float64" in f["reason"] for f in rec.fallbacks)
    np.testing.assert_allclose(np.array(got), ref(q, k, k, 0.25, causal=True), rtol=1e-12, atol=1e-12)


@needs_cc
def test_the_kernels_are_in_the_kernel_cache_with_their_c():
    q = mx.ones((1, 2, 70, 32))
    mx.eval(mx.fast.scaled_dot_product_attention(q, q, q, scale=1.0, mask="causal"),
            mx.fast.scaled_dot_product_attention(q[:, :, :1], q, q, scale=1.0))
    rows = {r["name"]: r for r in tapescope.kernel_cache()}
    full = "sdpa_full_float32_bq32_bk64_bd32_causal"
    assert full in rows and "sdpa_vector_float32_32_32" in rows
    assert rows[full]["variant"] == "full"
    src = rows[full]["tape"].sources()
    assert f"void {full}(void** args)" in src["cpu"] and "#pragma omp parallel for" in src["cpu"]
    assert src["cuda"].startswith("// no CUDA kernel")


def test_spec_names_follow_mlx_s():
    assert SdpaSpec("vector", "float16", 128).name == "sdpa_vector_float16_128_128"
    assert SdpaSpec("full", "bfloat16", 64, "bool", True, True).name == \
        "sdpa_full_bfloat16_bq32_bk64_bd64_boolmask_causal_sinks"
    assert SdpaSpec("full", "float32", 80, "add").name == "sdpa_full_float32_bq32_bk64_bd80_floatmask"
    assert SdpaSpec("vector_2pass_1", "float16", 64, "bool", True).name == \
        "sdpa_vector_2pass_1_float16_64_64_boolmask_causal"
    assert SdpaSpec("vector_2pass_2", "bfloat16", 128).name == "sdpa_vector_2pass_2_bfloat16_128"


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the CUDA sources are rendered only")
def test_the_cuda_decoding_kernels_compile_with_nvcc(tmp_path):
    """MLX's sdpa_vector written out (``attention_cuda.py``): one pass, the split keys' pass
    and their merge, every dtype, head sizes that divide a warp, fill whole warps or part of
    the last lane's elements, each mask kind, causal and sinks across them."""
    from tapescope.kernels.codegen.attention_cuda import PRELUDE, vector_source

    specs, i = [], 0
    for mode in ("vector", "vector_2pass_1", "vector_2pass_2"):
        for dt in ("float32", "float16", "bfloat16"):
            for d in (8, 80, 128, 256):
                i += 1
                specs.append(SdpaSpec(mode, dt, d) if mode == "vector_2pass_2" else SdpaSpec(
                    mode, dt, d, ("none", "bool", "add")[i % 3], i % 2 == 0, i % 4 < 2))
    cu = tmp_path / "sdpa_vector.cu"
    cu.write_text(PRELUDE + "".join(vector_source(s).replace(PRELUDE, "") for s in specs))
    r = subprocess.run([NVCC, "-arch=sm_90", "--cubin", str(cu), "-o", str(tmp_path / "s.cubin")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]


def test_every_attention_kernel_renders_in_c_and_says_why_not_on_a_gpu():
    from tapescope.kernels.codegen.attention_kernels import all_specs
    from tapescope.kernels.codegen.render import renderer

    c = renderer("c")
    for spec in all_specs():
        src = spec.source(c)
        assert f"void {spec.name}(void** args)" in src and "fmaf(" in src
        assert ("mask[" in src) == (spec.mask != "none") and ("sinks[" in src) == spec.sinks
        assert ("lim[i] ?" in src) == spec.causal
        assert spec.sources()["metal"].startswith("// no Metal kernel")


@needs_cc
def test_a_call_is_planned_once_per_layout_and_the_plan_runs_the_kernel(monkeypatch):
    """``ScaledDotProductAttention`` is a ``KernelRule``: the first call of a layout plans it
    (``sdpa_plan``), later calls of that layout run the plan without planning again; inputs
    whose head rows are not unit-stride take no plan (the rule copies them first), with the
    same values."""
    from tapescope.kernels.cpu import fast_kernels as fk

    rule = fk.RULES[PRIM]
    planned = []
    real = rule.plan
    monkeypatch.setattr(rule, "plan", lambda *a, **kw: planned.append(1) or real(*a, **kw))
    rule.plans.clear()
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 4, n, 32)).astype(np.float32) for n in (40, 70, 70))
    m = rng.random((40, 70)) > 0.4
    sk = rng.standard_normal(4).astype(np.float32)
    for step in range(3):
        q2 = q + step
        with launched() as rec:
            got = mx.fast.scaled_dot_product_attention(mx.array(q2), mx.array(k), mx.array(v), scale=0.2,
                                                       mask=mx.array(m), sinks=mx.array(sk))
            mx.eval(got)
        assert PRIM in rec.primitives and not rec.fallbacks
        np.testing.assert_allclose(host(got), ref(q2, k, v, 0.2, m, False, sk), rtol=2e-5, atol=2e-5)
    assert len(planned) == 1 and any(p is not None for p in rule.plans.values())
    wide = np.repeat(q, 2, axis=-1)  # head rows of stride 2: no plan, the rule's copy
    qs = mx.array(wide)[..., ::2]
    with launched() as rec:
        got = mx.fast.scaled_dot_product_attention(qs, mx.array(k), mx.array(v), scale=0.2)
        mx.eval(got)
    assert PRIM in rec.primitives and not rec.fallbacks
    assert None in rule.plans.values()
    np.testing.assert_allclose(host(got), ref(q, k, v, 0.2), rtol=2e-5, atol=2e-5)
