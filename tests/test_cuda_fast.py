"""MLX's fast primitives as generated CUDA on an NVIDIA GPU (kernels/cuda/fast_kernels.py):
RMSNorm, LayerNorm, their VJPs and RoPE on ``mx.gpu`` against float64 numpy on the host,
over row lengths around warps and blocks, weight / bias given or not, strided inputs and
RoPE's offsets; each case checks that a CUDA kernel ran. Skips unless ``TAPESCOPE_CUDA=1``
with CuPy and a GPU (``tests/run_gpu_suites.sh`` part ``cuda_runtime``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends

from conftest import kernel_launches
from test_fast_kernels import layer_ref, rms_ref, rope_ref

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="the CUDA runtime needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")

EPS = 1e-5


def on_gpu(x: np.ndarray):
    return mx.add(mx.array(x), 0, stream=mx.gpu)


def close(got, want, tol=3e-5):
    g = np.asarray(got.astype(mx.float32)).astype(np.float64)
    np.testing.assert_allclose(g, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max(initial=0)))


@pytest.mark.parametrize("cols", [1, 31, 32, 33, 255, 1000, 1025, 4096, 8193])
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_norms_and_their_vjps_match_numpy(rows, cols, dtype):
    rng = np.random.default_rng(rows * cols)
    x, w, b, g = (rng.standard_normal(s).astype(dtype) for s in
                  ((rows, cols), (cols,), (cols,), (rows, cols)))
    tol = 3e-5 if dtype == "float32" else 4e-3
    a, wa, ba, ga = (on_gpu(v) for v in (x, w, b, g))
    with kernel_launches("cuda") as rec:
        outs = [mx.fast.rms_norm(a, wa, EPS), mx.fast.layer_norm(a, wa, ba, EPS),
                mx.fast.rms_norm(a.T.T[:, ::1], None, EPS), mx.fast.layer_norm(a, None, ba, EPS)]
        _, grads = mx.vjp(lambda x, w, b: mx.fast.layer_norm(x, w, b, EPS), [a, wa, ba], [ga])
        _, rgrads = mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, EPS), [a, wa], [ga])
        mx.eval(*outs, *grads, *rgrads)
    close(outs[0], rms_ref(x, w), tol)
    close(outs[1], layer_ref(x, w, b), tol)
    close(outs[2], rms_ref(x, None), tol)
    close(outs[3], layer_ref(x, None, b), tol)
    from tapescope.kernels.rules import fast as rules

    x32, w32, b32, g32 = (v.astype(np.float32) for v in (x, w, b, g))
    want = rules.layer_norm_vjp(np, x32, w32, b32, g32, eps=EPS)
    for got, wv in zip(grads, want):
        close(got, wv.astype(np.float64), tol * max(1.0, rows / 8))
    want = rules.rms_norm_vjp(np, x32, w32, g32, eps=EPS)
    for got, wv in zip(rgrads, want):
        close(got, wv.astype(np.float64), tol * max(1.0, rows / 8))
    assert {"RMSNorm", "LayerNorm", "LayerNormVJP", "RMSNormVJP"} <= rec.primitives, rec.fallbacks


@pytest.mark.parametrize("shape,dims", [((2, 4, 33, 64), 64), ((1, 3, 5, 128), 96), ((3, 7, 18), 8)])
@pytest.mark.parametrize("traditional", [False, True])
def test_rope_matches_numpy(shape, dims, traditional):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    off = rng.integers(0, 100, shape[0]).astype(np.int32)
    a = on_gpu(x)
    with kernel_launches("cuda") as rec:
        y = mx.fast.rope(a, dims, traditional=traditional, base=1e4, scale=0.5, offset=mx.array(off))
        z = mx.fast.rope(mx.swapaxes(a, -2, -3) if len(shape) == 4 else a, dims,
                         traditional=traditional, base=1e4, scale=1.0, offset=3)
        mx.eval(y, z)
    close(y, rope_ref(x, dims, traditional, 1e4, 0.5, off), 1e-4)
    xz = np.swapaxes(x, -2, -3) if len(shape) == 4 else x
    close(z, rope_ref(np.ascontiguousarray(xz), dims, traditional, 1e4, 1.0, 3), 1e-4)
    assert "RoPE" in rec.primitives, rec.fallbacks


# -- every dtype, layout and row length (hypothesis) ----------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from test_fast_kernels import MXD, check, np_dtype, values  # noqa: E402

# row lengths around the 16-byte vectors (4 float32, 8 halves), the warps and the register
# cache's reach (16384 float32 / 32768 halves a row at 1024 threads: longer rows re-read)
GPU_COLS = [1, 3, 7, 8, 9, 31, 33, 100, 1000, 1023, 1024, 1029, 4096, 4100, 8200, 16384, 16388,
            33000]


def gpu_layout(x: np.ndarray, kind: str, dtype: str):
    """``x``'s values on the GPU: contiguous, the transpose of a transposed copy, a slice of
    a wider array (aligned row starts), or one starting an element in (row starts not on
    16 bytes: the kernel's scalar path)."""
    t = MXD[dtype]

    def dev(v):
        return mx.add(mx.array(v, dtype=t), mx.array(0, dtype=t), stream=mx.gpu)

    if kind == "transposed":
        return mx.swapaxes(dev(np.ascontiguousarray(np.swapaxes(x, -1, -2))), -1, -2)
    if kind == "sliced":
        return dev(np.concatenate([x, x], axis=-1))[..., : x.shape[-1]]
    if kind == "unaligned":
        return dev(np.concatenate([x[..., :1], x, x], axis=-1))[..., 1: x.shape[-1] + 1]
    return dev(x)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 5, 37]), st.sampled_from(GPU_COLS), st.sampled_from(sorted(MXD)),
       st.booleans(), st.booleans(), st.sampled_from(["contiguous", "transposed", "sliced", "unaligned"]),
       st.sampled_from(["rms", "layer"]), st.integers(0, 2**31))
def test_gpu_norms_match_float64_numpy_for_every_dtype_and_layout(rows, cols, dtype, has_w, has_b,
                                                                  kind, op, seed):
    rng = np.random.default_rng(seed)
    x = values(rng, (rows, cols), dtype, 2.0) + np.asarray(0.5, np_dtype(dtype))
    w = values(rng, (cols,), dtype) if has_w else None
    b = values(rng, (cols,), dtype) if has_b else None
    a = gpu_layout(x, kind, dtype)
    wa = mx.array(w, dtype=MXD[dtype]) if has_w else None
    ba = mx.array(b, dtype=MXD[dtype]) if has_b else None
    with kernel_launches("cuda") as rec:
        if op == "rms":
            got, want = mx.fast.rms_norm(a, wa, EPS, stream=mx.gpu), rms_ref(x, w)
        else:
            got, want = mx.fast.layer_norm(a, wa, ba, EPS, stream=mx.gpu), layer_ref(x, w, b)
        mx.eval(got)
    assert got.dtype == MXD[dtype] and got.shape == (rows, cols)
    check(got, want, dtype, rel=2.0 if has_w else 1.0)
    assert ("RMSNorm" if op == "rms" else "LayerNorm") in rec.primitives, rec.fallbacks


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 3, 16, 33]), st.sampled_from([1, 5, 64]),
       st.sampled_from([2, 8, 18, 64, 66, 128, 256]), st.data(), st.sampled_from(sorted(MXD)),
       st.booleans(), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_gpu_rope_matches_float64_numpy_for_every_dtype_and_layout(B, H, L, D, data, dtype,
                                                                   traditional, transposed,
                                                                   per_batch, seed):
    from test_fast_kernels import rope_ref

    dims = data.draw(st.integers(1, D // 2)) * 2
    rng = np.random.default_rng(seed)
    x = values(rng, (B, H, L, D), dtype)
    t = MXD[dtype]

    def dev(v):
        return mx.add(mx.array(v, dtype=t), mx.array(0, dtype=t), stream=mx.gpu)

    a = mx.swapaxes(dev(np.ascontiguousarray(np.swapaxes(x, 1, 2))), 1, 2) if transposed else dev(x)
    offset = rng.integers(0, 50, B).astype(np.int32) if per_batch else 7
    off = mx.array(offset) if per_batch else offset
    with kernel_launches("cuda") as rec:
        got = mx.fast.rope(a, dims, traditional=traditional, base=10000.0, scale=0.5, offset=off,
                           stream=mx.gpu)
        mx.eval(got)
    assert got.dtype == t and got.shape == x.shape
    check(got, rope_ref(x, dims, traditional, 10000.0, 0.5, offset), dtype, rel=4.0)
    assert "RoPE" in rec.primitives, rec.fallbacks


# -- attention: MLX's sdpa_vector for decoding, the fused prefill kernel above ---------------

from sdpa_inputs import MXD as SDPA_MXD, NPD as SDPA_NPD  # noqa: E402
from test_sdpa import TOL as SDPA_TOL, host as sdpa_host, ref as sdpa_ref  # noqa: E402
from test_sdpa_kernels import _inputs as sdpa_inputs, _layout as sdpa_layout, case as sdpa_case  # noqa: E402


def _gpu_args(q, k, v, m, s, mask, dtype: str, layout: str) -> tuple:
    """A case's numpy inputs as the op takes them on the GPU: (q, k, v in ``layout``,
    evaluated; the mask, ``causal`` or its array; the sinks in ``dtype``)."""
    t = SDPA_MXD[dtype]
    mk = "causal" if mask == "causal" else (mx.array(m) if m is not None else None)
    sa = mx.array(s, dtype=t) if s is not None else None
    qa, ka, va = (sdpa_layout(a, layout, t) for a in (q, k, v))
    mx.eval(qa, ka, va)
    return qa, ka, va, mk, sa


def _each_call_matches(args: tuple, D: int, want, tol: float, c, calls: int = 3) -> None:
    """``calls`` calls of the op on ``args`` (``_gpu_args``' tuple), scale D^-0.5: none falls
    back to an array-module rule, each within ``tol`` of ``want``."""
    qa, ka, va, mk, sa = args
    for _ in range(calls):
        with kernel_launches("cuda") as rec:
            out = mx.fast.scaled_dot_product_attention(qa, ka, va, scale=D ** -0.5, mask=mk,
                                                       sinks=sa)
            mx.eval(out)
        assert not rec.fallbacks, rec.fallbacks
        np.testing.assert_allclose(sdpa_host(out), want, rtol=tol,
                                   atol=tol * max(1.0, np.abs(want).max()), err_msg=str(c))


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=40, deadline=None)
@given(sdpa_case())
def test_gpu_sdpa_matches_float64_numpy(c):
    """``mx.fast.scaled_dot_product_attention`` on the GPU: query lengths up to 8 run the CUDA
    vector kernel (head sizes that divide a warp, fill whole warps or part of the last lane's
    elements; every mask kind, sinks, grouped heads,
    transposed and strided inputs, float32 / float16, bfloat16 through float32), the rest
    the fused prefill kernel (the composition in large blocks for head sizes it does not
    take); both against float64 numpy."""
    B, kv, reps, L, kL, D, mask, sinks, dtype, layout, _ = c
    q, k, v, m, s = sdpa_inputs(c)
    t = SDPA_MXD[dtype]
    # (an additive mask of the inputs' dtype: another dtype's runs the composition)
    mk = "causal" if mask == "causal" else (
        None if m is None else mx.array(m) if m.dtype == np.bool_ else mx.array(m, dtype=t))
    qa, ka, va = (sdpa_layout(a, layout, t) for a in (q, k, v))
    mx.eval(qa, ka, va)
    with kernel_launches("cuda") as rec:
        out = mx.fast.scaled_dot_product_attention(
            qa, ka, va, scale=D ** -0.5, mask=mk,
            sinks=mx.array(s, dtype=t) if s is not None else None)
        mx.eval(out)
    assert out.dtype == t and out.shape == (B, kv * reps, L, D)
    want = sdpa_ref(q, k, v, D ** -0.5, m, mask == "causal", s)
    tol = SDPA_TOL[dtype]
    np.testing.assert_allclose(sdpa_host(out), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    assert "ScaledDotProductAttention" in rec.primitives, rec.fallbacks
    assert not rec.fallbacks, rec.fallbacks


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=30, deadline=None)
@given(sdpa_case())
def test_gpu_sdpa_decoding_planned_calls_match_float64_numpy(c):
    """Decoding's later calls of a layout (the vector kernel's plan, launched by the eval
    loop from C; bfloat16 in its own bits) give the first call's answer: float64 numpy's."""
    from tapescope.kernels.cuda import attention

    B, kv, reps, L, kL, D, mask, sinks, dtype, layout, _ = c
    L = min(L, 8)
    c = (B, kv, reps, L, max(kL, L) if mask == "causal" else kL, D, mask, sinks, dtype,
         layout, c[-1])
    q, k, v, m, s = sdpa_inputs(c)
    qa, ka, va, mk, sa = _gpu_args(q, k, v, m, s, mask, dtype, layout)
    want = sdpa_ref(q, k, v, D ** -0.5, m, mask == "causal", s)
    tol = SDPA_TOL[dtype]
    rule = attention.RULES["ScaledDotProductAttention"]
    for _ in range(3):
        out = mx.fast.scaled_dot_product_attention(qa, ka, va, scale=D ** -0.5, mask=mk,
                                                   sinks=sa)
        mx.eval(out)
        np.testing.assert_allclose(sdpa_host(out), want, rtol=tol,
                                   atol=tol * max(1.0, np.abs(want).max()))
    assert any(p is not None for p in rule.plans.values())  # (unit-stride head rows: planned)


@st.composite
def sdpa_long_case(draw):
    """Decoding over long caches: key lengths around the split (one pass at ``SPLIT_KEYS``,
    runs of a few steps past it, the last one short, many runs further on)."""
    from tapescope.kernels.codegen.attention_cuda import SPLIT_KEYS

    c = list(draw(sdpa_case()))
    c[3] = draw(st.sampled_from([1, 2, 8]))
    c[4] = draw(st.sampled_from([SPLIT_KEYS, SPLIT_KEYS + 1, SPLIT_KEYS + 100, 2 * SPLIT_KEYS + 3,
                                 4 * SPLIT_KEYS, 9000]))
    c[5] = draw(st.sampled_from([8, 64, 80, 128, 256]))
    return tuple(c)


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=30, deadline=None)
@given(sdpa_long_case())
def test_gpu_sdpa_decoding_over_long_caches_splits_the_keys_and_matches_float64_numpy(c):
    """Past ``SPLIT_KEYS`` keys decoding is two launches (the split keys' pass and their
    merge: a ``PlanSequence``, launched from C after the first call), at ``SPLIT_KEYS`` one;
    every call against float64 numpy (every mask kind, causal, sinks, grouped heads, every
    dtype in its own bits, transposed and strided inputs)."""
    from tapescope.kernels.codegen.attention_cuda import SPLIT_KEYS
    from tapescope.kernels.cuda import attention
    from tapescope.kernels.cuda.primitive_plans import PlanSequence

    B, kv, reps, L, kL, D, mask, sinks, dtype, layout, _ = c
    q, k, v, m, s = sdpa_inputs(c)
    args = _gpu_args(q, k, v, m, s, mask, dtype, layout)
    want = sdpa_ref(q, k, v, D ** -0.5, m, mask == "causal", s)
    rule = attention.RULES["ScaledDotProductAttention"]
    rule.plans.clear()
    _each_call_matches(args, D, want, SDPA_TOL[dtype], c)
    split = [p for p in rule.plans.values() if isinstance(p, PlanSequence)]
    assert bool(split) == (kL > SPLIT_KEYS), c  # (rows this few never fill the device alone)


@pytest.mark.usefixtures("gpu_default_device")
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_sdpa_decoding_at_the_benchmark_shape_is_two_launches(D, dtype):
    """benchmarks/fast_ops.py's decoding rows, (4, 16, 1, 4096, D): the split keys' pass over
    many blocks (64 rows alone would leave most SMs idle), then the merge."""
    from tapescope.kernels.cuda import attention
    from tapescope.kernels.cuda.primitive_plans import PlanSequence

    rng = np.random.default_rng(D)
    q, k, v = (rng.standard_normal(sh).astype(SDPA_NPD[dtype])
               for sh in ((4, 16, 1, D), (4, 16, 4096, D), (4, 16, 4096, D)))
    t = SDPA_MXD[dtype]
    qa, ka, va = (mx.array(a, dtype=t) for a in (q, k, v))
    mx.eval(qa, ka, va)
    rule = attention.RULES["ScaledDotProductAttention"]
    rule.plans.clear()
    for _ in range(3):
        out = mx.fast.scaled_dot_product_attention(qa, ka, va, scale=D ** -0.5)
        mx.eval(out)
        want = sdpa_ref(q, k, v, D ** -0.5)
        np.testing.assert_allclose(sdpa_host(out), want, rtol=SDPA_TOL[dtype],
                                   atol=SDPA_TOL[dtype] * max(1.0, np.abs(want).max()))
    (plan,) = [p for p in rule.plans.values() if p is not None]
    assert isinstance(plan, PlanSequence) and plan.grid >= 4 * 16 * 2 and plan.then[0].grid == 64


@pytest.mark.usefixtures("gpu_default_device")
@pytest.mark.parametrize("B,H,Hk,L,kL,D,mask,dtype", [
    (2, 8, 2, 300, 300, 64, "causal", "float32"),
    (1, 4, 4, 129, 1000, 128, None, "float32"),
    (2, 4, 1, 65, 33, 80, "additive", "float16"),
    (1, 6, 3, 200, 77, 64, "bool", "bfloat16"),
    (1, 2, 2, 40, 45, 32, "causal", "float16"),
])
@pytest.mark.parametrize("blocks", [1, 3])
def test_gpu_sdpa_prefill_in_query_blocks_matches_float64_numpy(monkeypatch, B, H, Hk, L, kL,
                                                                D, mask, dtype, blocks):
    """The prefill's cuBLAS GEMMs and score softmax kernel (one block of query rows, or
    several: a small ``SCORES``) against float64 numpy, sinks on, grouped heads."""
    from tapescope.kernels.cuda import attention

    if blocks > 1:
        monkeypatch.setattr(attention, "SCORES", B * H * kL * -(-L // blocks))
    monkeypatch.setattr(attention, "flash_plan", lambda *a, **kw: None)  # (the GEMMs' path)
    attention.RULES["ScaledDotProductAttention"].plans.clear()
    rng = np.random.default_rng(L * kL)
    t = SDPA_NPD[dtype]
    q = rng.standard_normal((B, H, L, D)).astype(t)
    k = rng.standard_normal((B, Hk, kL, D)).astype(t)
    v = rng.standard_normal((B, Hk, kL, D)).astype(t)
    s = rng.standard_normal(H).astype(t)
    m = None
    if mask == "bool":
        m = rng.random((L, kL)) > 0.3
    elif mask == "additive":
        m = rng.standard_normal((1, H, L, kL)).astype(t)
    mk = "causal" if mask == "causal" else (mx.array(m) if m is not None else None)
    qa, ka, va = (mx.array(a, dtype=SDPA_MXD[dtype]) for a in (q, k, v))
    mx.eval(qa, ka, va)
    with kernel_launches("cuda") as rec:
        out = mx.fast.scaled_dot_product_attention(qa, ka, va, scale=D ** -0.5, mask=mk,
                                                   sinks=mx.array(s, dtype=SDPA_MXD[dtype]))
        mx.eval(out)
    want = sdpa_ref(q, k, v, D ** -0.5, m, mask == "causal", s)
    tol = SDPA_TOL[dtype] * 2
    np.testing.assert_allclose(sdpa_host(out), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    assert not rec.fallbacks, rec.fallbacks
    assert "ScaledDotProductAttention" in rec.primitives
    attention.RULES["ScaledDotProductAttention"].plans.clear()  # (no GEMM-path plans kept)


from test_sdpa_flash_host import TOL as FLASH_TOL, _inputs as flash_inputs, case as flash_case  # noqa: E402


def _flash_plans():
    from tapescope.kernels.cuda import attention

    return [p for p in attention.RULES["ScaledDotProductAttention"].plans.values() if p is not None]


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=60, deadline=None)
@given(flash_case())
def test_gpu_sdpa_prefill_is_the_fused_kernel_and_matches_float64_numpy(c):
    """Prefill (query lengths past 8) runs the fused kernel (``attention_flash.py``: one
    launch, its plan launched by the eval loop from C on the later calls) for the host
    test's cases: lengths off the tiles, head sizes 16..128, grouped heads, every mask kind,
    causal with more keys than queries, sinks, transposed and strided inputs, float32 at TF32
    and at full accuracy (3xTF32: ``settings.tf32`` off), float16, bfloat16 in its own bits;
    every call against float64 numpy."""
    from tapescope.kernels.cuda import attention
    from tapescope.kernels.settings import settings as ts

    dtype, precision, B, kv, reps, L, kL, D, mask, sinks, layout, _ = c
    layout = "contiguous" if layout == "offset" else layout
    q, k, v, m, s = flash_inputs(c)
    args = _gpu_args(q, k, v, m, s, mask, dtype, layout)
    want = sdpa_ref(q, k, v, D ** -0.5, m, mask == "causal", s)
    attention.RULES["ScaledDotProductAttention"].plans.clear()
    with ts(tf32=precision != "f32x3"):
        _each_call_matches(args, D, want, FLASH_TOL[dtype, precision], c)
        # (the GEMM composition: no fused plan; causal with fewer keys than queries is the
        # op's composition, as MLX's mlx/fast.cpp, no ScaledDotProductAttention node at all)
        if attention.flash_tile(dtype, D) is None or (mask == "causal" and kL < L):
            assert not _flash_plans()
            return
        (plan,) = _flash_plans()
        assert plan.name.startswith(f"sdpa_flash_{dtype}{'_' + precision if precision else ''}_"), plan.name


@pytest.mark.usefixtures("gpu_default_device")
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype, tf32", [("float32", True), ("float32", False),
                                         ("float16", True), ("bfloat16", True)])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_sdpa_prefill_at_the_benchmark_shape_is_one_fused_launch(D, dtype, tf32, causal):
    """benchmarks/fast_ops.py's prefill rows, (4, 16, 2048, 2048, D): one launch of the fused
    kernel (TF32 or 3xTF32 for float32 as ``settings.tf32``), two heads of it against float64
    numpy."""
    from tapescope.kernels.codegen import attention_flash as af
    from tapescope.kernels.settings import settings as ts
    from tapescope.kernels.cuda import attention

    rng = np.random.default_rng(D)
    q, k, v = (rng.standard_normal((4, 16, 2048, D)).astype(SDPA_NPD[dtype]) for _ in range(3))
    t = SDPA_MXD[dtype]
    qa, ka, va = (mx.array(a, dtype=t) for a in (q, k, v))
    mx.eval(qa, ka, va)
    attention.RULES["ScaledDotProductAttention"].plans.clear()
    tol = FLASH_TOL[dtype, ("tf32" if tf32 else "f32x3") if dtype == "float32" else ""]
    with ts(tf32=tf32):
        for _ in range(2):
            with kernel_launches("cuda") as rec:
                out = mx.fast.scaled_dot_product_attention(qa, ka, va, scale=D ** -0.5,
                                                           mask="causal" if causal else None)
                mx.eval(out)
            assert not rec.fallbacks, rec.fallbacks
            got = sdpa_host(out)
            for b, h in ((0, 0), (3, 15)):
                want = sdpa_ref(q[b:b + 1, h:h + 1], k[b:b + 1, h:h + 1], v[b:b + 1, h:h + 1],
                                D ** -0.5, None, causal)
                np.testing.assert_allclose(got[b:b + 1, h:h + 1], want, rtol=tol,
                                           atol=tol * max(1.0, np.abs(want).max()))
        if attention.flash_tile(dtype, D) is None:  # (the GEMM composition: no fused plan)
            assert not _flash_plans()
            return
        (plan,) = _flash_plans()
        assert plan.name.startswith("sdpa_flash_")
        assert plan.grid == af.grid(4, 16, 2048, af.rows(plan.entry.tape))


@pytest.fixture(scope="module")
def qmv_cases():
    """The stand-in cases' module, imported outside any test's @given (its own tests are
    decorated at import: under a running @given that is a nested one)."""
    import cuda_qmv_fake_cases

    return cuda_qmv_fake_cases


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_gpu_qmv_planned_calls_match_float64_numpy(qmv_cases, data):
    """``quantized_matmul`` of a few rows for every quantization MLX's CUDA backend takes
    (the qmv kernel's plan, ``kernels/cuda/quantized.py``, launched by the eval loop from C
    after the first call; float16 / bfloat16 in their own bits), of many rows and
    untransposed (``QmmPlan``), and ``gather_qmm`` (the gather form) against float64 numpy
    over the dequantized weight and MLX's CPU, for the stand-in cases' shapes, batches and
    layouts (``cuda_qmv_fake_cases.py``)."""
    from tapescope.kernels.cuda import quantized

    qc = qmv_cases
    kind = data.draw(st.sampled_from(["decode", "prefill", "gather"]))
    if kind == "gather":
        c = data.draw(qc.gathered())
        got, want, ref, dtype = qc.gather_case(c)
        qc._check(got, want, dtype, ref, str(c))
        assert any(p is not None for p in quantized.RULES["GatherQMM"].plans.values())
        return
    if kind == "decode":
        c, transpose = data.draw(qc.decode()), True
    else:
        c, transpose = data.draw(qc.prefill())
    dtype, mode, bits, gs, K, N, M, batch, _ = c
    x, w, s, b, want = qc._inputs(c, transpose)
    ops = qc._operands(x, w, s, b, dtype, strided=batch == "strided")
    kw = dict(transpose=transpose, group_size=gs, bits=bits, mode=mode)
    ref = qc._mlx_result(qc.mlx.quantized_matmul, x, w, s, b, **kw) if qc.mlx else None
    rule = quantized.RULES[qc.PRIM]
    rule.plans.clear()
    for _ in range(3):
        out = mx.quantized_matmul(*ops, **kw)
        mx.eval(out)
        assert out.dtype == qc.MXD[dtype]
        qc._check(qc._host(out), want, dtype, ref, str(c))
    assert any(p is not None for p in rule.plans.values())  # (one stride a batch: planned)


@pytest.mark.usefixtures("gpu_default_device")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 512])
def test_gpu_quantized_matmul_of_the_benchmark_shape_matches_mlx_quantize(dtype, bits, m):
    """The benchmark's 4096 x 4096 weight (group size 64), quantized by ``mx.quantize`` on
    the GPU, for one row (qmv, from C after the first call) and 512 rows (``QmmPlan``: the
    dequant kernel's tile and one cuBLAS GEMM) against float64 numpy of ``mx.dequantize``."""
    rng = np.random.default_rng(m + bits)
    t = MXD[dtype]
    wf = mx.array(rng.standard_normal((4096, 4096)).astype(np.float32) * 0.02, dtype=t)
    x = mx.array(rng.standard_normal((m, 4096)).astype(np.float32), dtype=t)
    wq, sc, bi = mx.quantize(wf, group_size=64, bits=bits)
    wd = mx.dequantize(wq, sc, bi, group_size=64, bits=bits)
    mx.eval(x, wq, sc, bi, wd)
    want = np.asarray(x.astype(mx.float32)).astype(np.float64) @ \
        np.asarray(wd.astype(mx.float32)).astype(np.float64).T
    tol = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 2e-2}[dtype]
    from tapescope.kernels.cuda import quantized

    rule = quantized.RULES["QuantizedMatmul"]
    rule.plans.clear()
    for _ in range(2):
        out = mx.quantized_matmul(x, wq, sc, bi, transpose=True, group_size=64, bits=bits)
        got = np.asarray(out.astype(mx.float32)).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    kind = quantized.QmmPlan if m > 8 else quantized.KernelPlan
    assert [type(p) for p in rule.plans.values() if p is not None] == [kind]
