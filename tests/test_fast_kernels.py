"""MLX's fast primitives as generated kernels (codegen/norm_kernels.py through
cpu/fast_kernels.py): RMSNorm, LayerNorm, RoPE and the norms' VJP primitives against float64
numpy over hypothesis shapes (row lengths around the SIMD widths, 1, odd sizes), dtypes,
weight / bias given or not, strided and transposed inputs, RoPE's offsets (int, per batch),
``traditional``, ``dims`` below the head size and ``freqs``; every case checks that the
kernel ran (a ``kernel_launch`` on the timeline). The VJPs and JVPs against JAX, vmap against
the unbatched calls, values and dtypes against MLX where it is installed, the CUDA and MSL
renders of every kernel (nvcc where present, the MSL on the Metal shim).

``make test`` runs a sample; ``TAPESCOPE_REDUCTION_SWEEP=1`` more examples.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope
import tapescope.core as mx
from tapescope.kernels.codegen.c_ops import Unsupported
from tapescope.kernels.codegen.lower import render_module
from tapescope.kernels.codegen.norm_kernels import NormSpec, all_specs
from tapescope.kernels.codegen.render import renderer
from tapescope.kernels.common import norms as plan
from tapescope.kernels.cpu import compiler
from tapescope.kernels.metal import shim

from conftest import kernel_launches as launched, mlx_ref

SWEEP = os.environ.get("TAPESCOPE_REDUCTION_SWEEP") == "1"
EXAMPLES = 200 if SWEEP else 20
needs_cc = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")

BF16 = np.dtype(ml_dtypes.bfloat16)
MXD = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
TOL = {"float32": 3e-5, "float16": 3e-3, "bfloat16": 2.4e-2}
COLS = [1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000, 1024, 1025]
EPS = 1e-5


def np_dtype(name: str) -> np.dtype:
    return BF16 if name == "bfloat16" else np.dtype(name)


def host(a) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        a = a.astype(mx.float32)
    return np.asarray(a).astype(np.float64)


def values(rng, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np_dtype(dtype))


def as_layout(x: np.ndarray, kind: str, dtype: str):
    """A tapescope array of ``x``'s values in another layout: the transpose of a transposed
    copy (column-strided rows), a slice of a wider array (strided rows), a swap of the
    leading axes (leading axes that do not collapse: the kernel copies)."""
    t = MXD[dtype]
    if kind == "transposed" and x.ndim >= 2:
        return mx.swapaxes(mx.array(np.ascontiguousarray(np.swapaxes(x, -1, -2)), dtype=t), -1, -2)
    if kind == "sliced":
        return mx.array(np.concatenate([x, x], axis=-1), dtype=t)[..., : x.shape[-1]]
    if kind == "leading" and x.ndim >= 3:
        return mx.swapaxes(mx.array(np.ascontiguousarray(np.swapaxes(x, 0, 1)), dtype=t), 0, 1)
    return mx.array(x, dtype=t)


def check(got, want: np.ndarray, dtype: str, rel: float = 1.0) -> None:
    g = host(got)
    assert g.shape == want.shape
    tol = TOL[dtype] * rel
    np.testing.assert_allclose(g, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max(initial=0)))


def rms_ref(x, w):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPS)
    return y * w.astype(np.float64) if w is not None else y


def layer_ref(x, w, b):
    x = x.astype(np.float64)
    xc = x - x.mean(-1, keepdims=True)
    y = xc / np.sqrt(np.mean(xc * xc, -1, keepdims=True) + EPS)
    if w is not None:
        y = y * w.astype(np.float64)
    if b is not None:
        y = y + b.astype(np.float64)
    return y


@st.composite
def norm_case(draw):
    lead = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 5]), min_size=0, max_size=3)))
    return lead + (draw(st.sampled_from(COLS)),)


# -- RMSNorm / LayerNorm --------------------------------------------------------------------

@needs_cc
@settings(max_examples=EXAMPLES, deadline=None)
@given(norm_case(), st.sampled_from(sorted(MXD)), st.booleans(), st.booleans(),
       st.sampled_from(["contiguous", "transposed", "sliced", "leading"]),
       st.sampled_from(["rms", "layer"]), st.integers(0, 2**31))
def test_norms_match_float64_numpy(shape, dtype, has_w, has_b, kind, op, seed):
    rng = np.random.default_rng(seed)
    x = values(rng, shape, dtype, 2.0) + np.asarray(0.5, np_dtype(dtype))
    w = values(rng, shape[-1:], dtype) if has_w else None
    b = values(rng, shape[-1:], dtype) if has_b else None
    a = as_layout(x, kind, dtype)
    wa = mx.array(w, dtype=MXD[dtype]) if has_w else None
    ba = mx.array(b, dtype=MXD[dtype]) if has_b else None
    with launched() as rec:
        if op == "rms":
            got = mx.fast.rms_norm(a, wa, EPS)
            want = rms_ref(x, w)
        else:
            got = mx.fast.layer_norm(a, wa, ba, EPS)
            want = layer_ref(x, w, b)
        mx.eval(got)
    assert got.dtype == MXD[dtype]
    # a row of one element has no spread: LayerNorm's is 0 + b, RMSNorm's sign(x) * w
    check(got, want, dtype, rel=2.0 if has_w else 1.0)
    assert ("RMSNorm" if op == "rms" else "LayerNorm") in rec.primitives, rec.fallbacks


@needs_cc
@pytest.mark.parametrize("op", ["rms", "layer"])
def test_norm_kernels_match_the_array_module_rule(op):
    """The kernel and the numpy rule (the fallback) round the same steps: float32 agrees to
    a few ulps, the half types to one rounding of the output."""
    from tapescope.kernels.rules import fast as rules

    rng = np.random.default_rng(3)
    for dtype in ("float32", "float16", "bfloat16"):
        x = values(rng, (37, 129), dtype, 3.0)
        w, b = values(rng, (129,), dtype), values(rng, (129,), dtype)
        kernel = tapescope.kernels.backends.backend("cpu").kernel_rules[
            "RMSNorm" if op == "rms" else "LayerNorm"]
        args = (x, w) if op == "rms" else (x, w, b)
        fn = rules.rms_norm if op == "rms" else rules.layer_norm
        got = kernel(np, *args, eps=EPS).astype(np.float64)
        want = fn(np, *args, eps=EPS).astype(np.float64)
        tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@needs_cc
def test_norms_of_a_large_row_count_run_on_the_kernel_and_match():
    """Past the parallel threshold (rows on OpenMP threads), float64 inputs (MLX computes
    them in float32 too), a broadcast weight."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 515))
    w = mx.broadcast_to(mx.array(1.5, dtype=mx.float64), (515,))
    with launched() as rec:
        got = mx.fast.rms_norm(mx.array(x, dtype=mx.float64), w, EPS)
        mx.eval(got)
    assert got.dtype == mx.float64 and "RMSNorm" in rec.primitives
    np.testing.assert_allclose(np.array(got), rms_ref(x, None) * 1.5, rtol=2e-6, atol=2e-6)


@needs_cc
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op", ["rms", "layer"])
def test_norms_of_a_large_output_stream_their_rows_and_match(dtype, op):
    """From 8 MiB of output the CPU's row write goes around the caches (``Range.stream``:
    each row's elements up to the 32-byte boundary, staged blocks of 512 streamed out, the
    tail): rows of 2053 elements start at every alignment, a row of 1023 (below two blocks)
    and a sliced input; every element against float64 numpy."""
    from tapescope.kernels.codegen.norm_kernels import STREAM_MIN

    rng = np.random.default_rng(7)
    isz = np_dtype(dtype).itemsize
    for cols in (2053, 1023):
        rows = -(-STREAM_MIN // (isz * cols)) + 3  # just past the threshold
        x = values(rng, (rows, cols), dtype, 2.0)
        w, b = values(rng, (cols,), dtype), values(rng, (cols,), dtype)
        for sliced in (False, True):
            a = mx.array(np.concatenate([x, x], -1), dtype=MXD[dtype])[:, :cols] if sliced \
                else mx.array(x, dtype=MXD[dtype])
            with launched() as rec:
                if op == "rms":
                    got, want = mx.fast.rms_norm(a, mx.array(w, dtype=MXD[dtype]), EPS), rms_ref(x, w)
                else:
                    got = mx.fast.layer_norm(a, mx.array(w, dtype=MXD[dtype]), mx.array(b, dtype=MXD[dtype]), EPS)
                    want = layer_ref(x, w, b)
                mx.eval(got)
            assert ("RMSNorm" if op == "rms" else "LayerNorm") in rec.primitives, rec.fallbacks
            check(got, want, dtype, rel=2.0)


# -- the VJPs and JVPs against JAX ----------------------------------------------------------

def _jax_norm(op, has_w, has_b):
    import jax.numpy as jnp

    def f(x, w, b):
        if op == "rms":
            y = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + EPS)
        else:
            xc = x - jnp.mean(x, -1, keepdims=True)
            y = xc / jnp.sqrt(jnp.mean(xc * xc, -1, keepdims=True) + EPS)
        if has_w:
            y = y * w
        if has_b and op == "layer":
            y = y + b
        return y
    return f


@needs_cc
@settings(max_examples=max(6, EXAMPLES // 2), deadline=None)
@given(norm_case(), st.booleans(), st.booleans(), st.sampled_from(["rms", "layer"]),
       st.sampled_from(["float32", "bfloat16"]), st.integers(0, 2**31))
def test_norm_vjps_match_jax(shape, has_w, has_b, op, dtype, seed):
    import jax

    rng = np.random.default_rng(seed)
    x, w, b, g = (values(rng, s, dtype) for s in (shape, shape[-1:], shape[-1:], shape))
    x64, w64, b64, g64 = (v.astype(np.float64) for v in (x, w, b, g))
    with jax.enable_x64(True):
        _, back = jax.vjp(_jax_norm(op, has_w, has_b), x64, w64, b64)
        want = [np.asarray(v) for v in back(g64)]
    t = MXD[dtype]
    xa, wa, ba, ga = (mx.array(v, dtype=t) for v in (x, w, b, g))

    def f(x, w, b):
        if op == "rms":
            return mx.fast.rms_norm(x, w if has_w else None, EPS)
        return mx.fast.layer_norm(x, w if has_w else None, b if has_b else None, EPS)

    with launched() as rec:
        _, grads = mx.vjp(f, [xa, wa, ba], [ga])
        mx.eval(grads)
    assert ("RMSNormVJP" if op == "rms" else "LayerNormVJP") in rec.primitives, rec.fallbacks
    rows = max(1, int(np.prod(shape[:-1])))
    check(grads[0], want[0], dtype, rel=4.0)
    if has_w:
        check(grads[1], want[1], dtype, rel=4.0 * rows)
    if has_b and op == "layer":
        check(grads[2], want[2], dtype, rel=4.0 * rows)
    for i, used in ((1, has_w), (2, has_b and op == "layer")):
        if not used:
            assert not np.any(host(grads[i]))


@needs_cc
@pytest.mark.parametrize("op", ["rms", "layer"])
def test_norm_jvps_and_second_derivatives_match_jax(op):
    import jax

    rng = np.random.default_rng(7)
    x, w, b, t = (rng.standard_normal(s) for s in ((3, 33), (33,), (33,), (3, 33)))
    jf = _jax_norm(op, True, True)
    with jax.enable_x64(True):
        jt = jax.jvp(jf, (x, w, b), (t, t[0], t[1]))[1]
        jh = jax.grad(lambda x: (jax.grad(lambda x: (jf(x, w, b) ** 3).sum())(x) ** 2).sum())(x)

    def f(x, w, b):
        return (mx.fast.rms_norm(x, w, EPS) if op == "rms" else mx.fast.layer_norm(x, w, b, EPS))

    xa, wa, ba, ta = (mx.array(v.astype(np.float32)) for v in (x, w, b, t))
    _, got = mx.jvp(f, [xa, wa, ba], [ta, ta[0], ta[1]])
    np.testing.assert_allclose(np.array(got[0]), np.asarray(jt), rtol=1e-4, atol=1e-4)
    h = mx.grad(lambda x: (mx.grad(lambda x: (f(x, wa, ba) ** 3).sum())(x) ** 2).sum())(xa)
    np.testing.assert_allclose(np.array(h), np.asarray(jh), rtol=2e-4, atol=2e-4 * np.abs(jh).max())


@needs_cc
def test_norms_under_vmap_match_the_unbatched_calls():
    rng = np.random.default_rng(9)
    x, w, b = (mx.array(rng.standard_normal(s).astype(np.float32)) for s in ((4, 3, 17), (17,), (17,)))
    ws = mx.array(rng.standard_normal((4, 17)).astype(np.float32))
    for f in (lambda x: mx.fast.rms_norm(x, w, EPS), lambda x: mx.fast.layer_norm(x, w, b, EPS)):
        got = mx.vmap(f, in_axes=1)(x)
        want = mx.stack([f(x[:, i]) for i in range(3)])
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, atol=1e-6)
    got = mx.vmap(lambda x, w: mx.fast.layer_norm(x, w, b, EPS))(x, ws)  # a mapped weight
    want = mx.stack([mx.fast.layer_norm(x[i], ws[i], b, EPS) for i in range(4)])
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, atol=1e-6)
    g = mx.vmap(mx.grad(lambda x: (mx.fast.rms_norm(x, w, EPS) ** 2).sum()))(x)
    want = mx.stack([mx.grad(lambda x: (mx.fast.rms_norm(x, w, EPS) ** 2).sum())(x[i]) for i in range(4)])
    np.testing.assert_allclose(np.array(g), np.array(want), rtol=1e-5, atol=1e-5)


# -- RoPE -----------------------------------------------------------------------------------

def rope_ref(x, dims, traditional, base, scale, offset, freqs=None, forward=True):
    """float64 RoPE over MLX's (B, H, L, D) view."""
    shape = x.shape
    B, L, D = shape[0], shape[-2], shape[-1]
    v = x.astype(np.float64).reshape(B, -1, L, D)
    half = dims // 2
    inv = 1 / freqs.astype(np.float64) if freqs is not None else base ** (-np.arange(half) / half)
    off = np.asarray(offset, dtype=np.float64).reshape(-1, 1, 1, 1)
    th = (np.arange(L)[None, None, :, None] + off) * scale * inv
    c, s = np.cos(th), np.sin(th) * (1 if forward else -1)
    out = v.copy()
    i1 = np.arange(0, dims, 2) if traditional else np.arange(half)
    i2 = i1 + 1 if traditional else i1 + half
    x1, x2 = v[..., i1], v[..., i2]
    out[..., i1], out[..., i2] = x1 * c - x2 * s, x1 * s + x2 * c
    return out.reshape(shape)


@st.composite
def rope_case(draw):
    nd = draw(st.sampled_from([3, 4, 5]))
    B = draw(st.integers(1, 3))
    mid = tuple(draw(st.lists(st.integers(1, 3), min_size=nd - 3, max_size=nd - 3)))
    L = draw(st.sampled_from([1, 2, 5, 16, 33]))
    D = draw(st.sampled_from([2, 4, 8, 18, 64, 66, 128]))
    dims = draw(st.integers(1, D // 2)) * 2
    return (B, *mid, L, D), dims


@needs_cc
@settings(max_examples=EXAMPLES, deadline=None)
@given(rope_case(), st.sampled_from(sorted(MXD)), st.booleans(), st.sampled_from([1.0, 0.5]),
       st.sampled_from(["int", "array", "vector"]), st.booleans(),
       st.sampled_from(["contiguous", "transposed"]), st.integers(0, 2**31))
def test_rope_matches_float64_numpy(case, dtype, traditional, scale, offset_kind, with_freqs,
                                    kind, seed):
    shape, dims = case
    rng = np.random.default_rng(seed)
    x = values(rng, shape, dtype)
    offset = {"int": 7, "array": np.int32(3), "vector": rng.integers(0, 50, shape[0]).astype(np.int32)}[
        offset_kind]
    freqs = np.linspace(1.0, 60.0, dims // 2).astype(np.float32) if with_freqs else None
    if kind == "transposed" and len(shape) == 4:  # (B, L, H, D) in memory, seen as (B, H, L, D)
        a = mx.swapaxes(mx.array(np.ascontiguousarray(np.swapaxes(x, 1, 2)), dtype=MXD[dtype]), 1, 2)
    else:
        a = mx.array(x, dtype=MXD[dtype])
    off = offset if offset_kind == "int" else mx.array(offset)
    kw = dict(freqs=mx.array(freqs), base=None) if with_freqs else dict(base=10000.0)
    with launched() as rec:
        got = mx.fast.rope(a, dims, traditional=traditional, scale=scale, offset=off, **kw)
        mx.eval(got)
    assert got.dtype == MXD[dtype] and got.shape == shape
    want = rope_ref(x, dims, traditional, 10000.0, scale, offset, freqs)
    check(got, want, dtype, rel=4.0)
    assert "RoPE" in rec.primitives, rec.fallbacks


@needs_cc
@pytest.mark.parametrize("traditional", [False, True])
def test_rope_vjp_and_jvp_are_the_rotations(traditional):
    import jax

    rng = np.random.default_rng(11)
    x, g = rng.standard_normal((2, 3, 5, 10)), rng.standard_normal((2, 3, 5, 10))
    off = np.array([2, 9], np.int32)

    def jf(v):
        import jax.numpy as jnp

        half = 4
        inv = 10000.0 ** (-jnp.arange(half) / half)
        th = (jnp.arange(5)[None, None, :, None] + off.reshape(-1, 1, 1, 1)) * 0.5 * inv
        c, s = jnp.cos(th), jnp.sin(th)
        i1 = jnp.arange(0, 8, 2) if traditional else jnp.arange(4)
        i2 = i1 + 1 if traditional else i1 + 4
        x1, x2 = v[..., i1], v[..., i2]
        return v.at[..., i1].set(x1 * c - x2 * s).at[..., i2].set(x1 * s + x2 * c)

    with jax.enable_x64(True):
        want = np.asarray(jax.vjp(jf, x)[1](g)[0])
        want_t = np.asarray(jf(jax.numpy.asarray(g)))
    f = lambda v: mx.fast.rope(v, 8, traditional=traditional, base=10000.0, scale=0.5,  # noqa: E731
                               offset=mx.array(off))
    xa, ga = mx.array(x.astype(np.float32)), mx.array(g.astype(np.float32))
    with launched() as rec:
        _, (got,) = mx.vjp(f, [xa], [ga])
        mx.eval(got)
    assert "RoPE" in rec.primitives
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)
    _, (t,) = mx.jvp(f, [xa], [ga])
    np.testing.assert_allclose(np.array(t), want_t, rtol=1e-5, atol=1e-5)
    v = mx.vmap(f, in_axes=2)(xa)  # a mapped axis: more heads, the offsets still per batch
    want_v = mx.stack([f(xa[:, :, i]) for i in range(5)])  # each slice a (B, L, D) input
    assert v.shape == (5, 2, 3, 10)
    np.testing.assert_allclose(np.array(v), np.array(want_v), rtol=1e-6, atol=1e-6)


@needs_cc
def test_what_no_kernel_takes_runs_the_rule_and_says_why():
    x = mx.array(np.random.default_rng(2).standard_normal((1, 1, 2, 4100)).astype(np.float32))
    with launched() as rec:
        got = mx.fast.rope(x, 4100, traditional=False, base=10000.0, scale=1.0, offset=0)
        mx.eval(got)
    assert "RoPE" not in rec.primitives
    assert any("2048 rotated features" in f["reason"] for f in rec.fallbacks)
    np.testing.assert_allclose(np.array(got), rope_ref(np.array(x), 4100, False, 1e4, 1.0, 0),
                               rtol=1e-4, atol=1e-4)


@needs_cc
def test_the_kernels_are_in_the_kernel_cache_with_their_three_sources():
    x = mx.array(np.ones((4, 40), np.float32))
    mx.eval(mx.fast.rms_norm(x, mx.ones((40,)), EPS))
    rows = {r["name"]: r for r in tapescope.kernel_cache()}
    assert "rms_w_float32" in rows
    spec = rows["rms_w_float32"]["tape"]
    src = spec.sources()
    assert "void rms_w_float32(" in src["cpu"] and "__global__" in src["cuda"]
    assert "[[kernel]] void rms_w_float32(" in src["metal"]


# -- MLX ------------------------------------------------------------------------------------

@pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_values_and_dtypes_match_mlx(dtype):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 4, 6, 40)).astype(np.float32)
    w, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    tol = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
    calls = [lambda M, x, w, b: M.fast.rms_norm(x, w, EPS),
             lambda M, x, w, b: M.fast.rms_norm(x, None, EPS),
             lambda M, x, w, b: M.fast.layer_norm(x, w, b, EPS),
             lambda M, x, w, b: M.fast.layer_norm(x, None, b, EPS),
             lambda M, x, w, b: M.fast.layer_norm(x, w.astype(M.float32), None, EPS),
             lambda M, x, w, b: M.fast.rope(x, 24, traditional=False, base=1e4, scale=1.0,
                                            offset=M.array([1, 4, 9])),
             lambda M, x, w, b: M.fast.rope(x, 40, traditional=True, base=1e4, scale=0.25, offset=5)]
    for f in calls:
        outs = []
        for M in (mx, mlx_ref):
            t = getattr(M, dtype)
            o = f(M, *(M.array(v).astype(t) for v in (x, w, b)))
            outs.append((str(o.dtype).split(".")[-1], np.array(o.astype(M.float32))))
        assert outs[0][0] == outs[1][0]
        np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=tol, atol=tol * 4)


# -- the GPU dialects -----------------------------------------------------------------------

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def test_every_kernel_renders_in_cuda_and_msl():
    cu, metal = renderer("cuda"), renderer("metal")
    refused = []
    for s in all_specs():
        assert f"{s.name}(" in s.source(cu)
        try:
            assert f"[[kernel]] void {s.name}(" in s.source(metal)
        except Unsupported as e:
            refused.append((s.name, str(e)))
    assert refused and all("float64" in n for n, _ in refused)  # Metal has no double


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the CUDA sources are rendered only")
def test_every_cuda_kernel_compiles_with_nvcc(tmp_path):
    specs = [s for s in all_specs() if SWEEP or s.dtype in ("float32", "float16")]
    cu = tmp_path / "fast.cu"
    cu.write_text(render_module([s.kernel(gpu=True) for s in specs], renderer("cuda")))
    r = subprocess.run([NVCC, "--ptx", str(cu), "-o", str(tmp_path / "f.ptx")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]


_LIBS: dict = {}


def run_msl(spec, ints: dict, buffers: dict) -> None:
    k = spec.kernel(gpu=True)
    lib = _LIBS.get(spec.name)
    if lib is None:
        lib = _LIBS[spec.name] = shim.Library([spec.source(renderer("metal"))],
                                              [shim.Entry(0, spec.name)])
    bound = {i: (np.array([ints[p.name]], np.int64) if p.kind == "int" else buffers[p.name])
             for i, p in enumerate(k.params)}
    groups, threads = k.launch(ints)
    lib.run(0, bound, (groups * threads, 1, 1), (threads, 1, 1))


needs_shim = pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler")


@needs_shim
@pytest.mark.parametrize("shape", [(3, 100), (2, 1), (5, 1025)])
@pytest.mark.parametrize("op", ["rms", "layer"])
def test_msl_norms_on_the_shim_match_float64(shape, op):
    rng = np.random.default_rng(17)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (shape, shape[-1:], shape[-1:]))
    name = "RMSNorm" if op == "rms" else "LayerNorm"
    call = plan.norm_call(name, x.dtype, x.shape, (shape[1], 1), (1, 1))
    out = np.zeros(shape, np.float32)
    run_msl(call.spec, call.ints, {"x": x.reshape(-1), "w": w, "b": b,
                                   "fp": np.array([EPS], np.float32), "out": out.reshape(-1)})
    want = rms_ref(x, w) if op == "rms" else layer_ref(x, w, b)
    np.testing.assert_allclose(out, want, rtol=3e-5, atol=3e-5 * np.abs(want).max())


@needs_shim
@pytest.mark.parametrize("op", ["rms", "layer"])
def test_msl_norm_vjps_on_the_shim_match_the_rule(op):
    from tapescope.kernels.rules import fast as rules

    rng = np.random.default_rng(19)
    x, g = (rng.standard_normal((9, 70)).astype(np.float32) for _ in range(2))
    w, b = (rng.standard_normal(70).astype(np.float32) for _ in range(2))
    name = "RMSNormVJP" if op == "rms" else "LayerNormVJP"
    call = plan.vjp_call(name, x.dtype, x.shape, (1, 1), groups=4)
    groups = call.ints["groups"]
    gx = np.zeros_like(x)
    part, partb = np.zeros((groups, 70), np.float32), np.zeros((groups, 70), np.float32)
    run_msl(call.spec, call.ints, {"x": x.reshape(-1), "w": w, "g": g.reshape(-1),
                                   "fp": np.array([EPS], np.float32), "gx": gx.reshape(-1),
                                   "part": part.reshape(-1), "partb": partb.reshape(-1)})
    want = rules.rms_norm_vjp(np, x, w, g, eps=EPS) if op == "rms" else \
        rules.layer_norm_vjp(np, x, w, b, g, eps=EPS)
    np.testing.assert_allclose(gx, want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(part.sum(0), want[1], rtol=1e-4, atol=1e-4)
    if op == "layer":
        np.testing.assert_allclose(partb.sum(0), want[2], rtol=1e-4, atol=1e-4)


@needs_shim
@pytest.mark.parametrize("traditional", [False, True])
def test_msl_rope_on_the_shim_matches_float64(traditional):
    from tapescope.kernels.rules.fast import inv_freqs

    rng = np.random.default_rng(23)
    x = rng.standard_normal((2, 3, 7, 20)).astype(np.float32)
    off = np.array([4, 11], np.int32)
    call = plan.rope_call(x.dtype, x.shape, (420, 140, 20, 1), 2, 1, dims=12,
                          traditional=traditional, forward=True)
    out = np.zeros_like(x)
    run_msl(call.spec, call.ints, {"x": x.reshape(-1), "off": off, "inv": inv_freqs(np, 12, 1e4),
                                   "fp": np.array([0.5], np.float32), "out": out.reshape(-1)})
    want = rope_ref(x, 12, traditional, 1e4, 0.5, off)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_spec_names_follow_mlx_stems():
    assert NormSpec("rms", "float16", "row", True).name == "rms_w_float16"
    assert NormSpec("vjp_rms", "float32", "row", False).name == "vjp_rms_now_float32"
    assert NormSpec("layer_norm", "bfloat16", "strided", True, False).name == \
        "layer_norm_strided_w_nob_bfloat16"
    assert NormSpec("rope", "float32", "strided", traditional=True, forward=False).name == \
        "rope_traditional_vjp_float32"


def test_trace_names_each_fast_op_s_kernel():
    x, w = mx.ones((4, 8)), mx.ones((8,))

    def f(x):
        y = mx.fast.layer_norm(x, w, None, EPS)
        return mx.grad(lambda v: mx.fast.rms_norm(v, None, EPS).sum())(y) + mx.reshape(
            mx.fast.rope(mx.reshape(y, (1, 2, 2, 8)), 4, traditional=True, base=1e4, scale=1.0,
                         offset=1), (4, 8))

    g = tapescope.trace(f, x)
    names = {op.primitive: s.name for op, s in g.generated_kernels}
    assert names == {"LayerNorm": "layer_norm_w_nob_float32", "RMSNormVJP": "vjp_rms_now_float32",
                     "RoPE": "rope_traditional_float32"}
