"""The score softmax of the CUDA attention prefill (``codegen/attention_softmax.py``) against
float64 numpy: its CPU schedule (the C render, run in place over the scores and into a
separate buffer) and its GPU schedule on the Metal shim (a group per row, the merge across
the group), over row lengths around the vector widths and group sizes, every mask kind
(boolean, additive in each dtype, broadcast strides, a block's first row past 0), causal
with key lengths above and below the query length (rows that see no key), sinks and ``p``
in float32 / float16 / bfloat16; the CUDA of every spec compiles with nvcc where present.
"""

from __future__ import annotations

import subprocess

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tapescope.kernels.codegen.attention_softmax import LOWEST, ScoresSoftmaxSpec, all_specs
from tapescope.kernels.codegen.lower import render_module
from tapescope.kernels.codegen.render import renderer
from tapescope.kernels.cpu import compiler

from test_fast_kernels import NVCC, needs_shim, run_msl

needs_cc = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")
BF16 = np.dtype(ml_dtypes.bfloat16)
NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16}
TOL = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}


def case(draw):
    B = draw(st.sampled_from([1, 2]))
    H = draw(st.sampled_from([1, 3]))
    L = draw(st.sampled_from([1, 5, 9]))
    i0 = draw(st.integers(0, L - 1))
    bl = draw(st.integers(1, L - i0))
    kL = draw(st.sampled_from([1, 3, 4, 5, 8, 31, 33, 100, 257, 1030]))
    mask = draw(st.sampled_from(["none", "bool", "add"]))
    mdt = draw(st.sampled_from(["float16", "bfloat16", "float32"])) if mask == "add" else ""
    spec = ScoresSoftmaxSpec(draw(st.sampled_from(sorted(NP))), mask, mdt, draw(st.booleans()),
                             draw(st.booleans()))
    bcast = draw(st.booleans())
    return spec, B, H, L, i0, bl, kL, bcast, draw(st.integers(0, 2 ** 16))


def inputs(c):
    spec, B, H, L, i0, bl, kL, bcast, seed = c
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((B * H * bl, kL)) * 3).astype(np.float32)
    ints = {"rows": B * H * bl, "cols": kL, "bl": bl, "heads": H, "qoff": i0 + kL - L}
    bufs = {"x": x}
    mask = None
    if spec.mask != "none":
        shape = (L, kL) if bcast else (B, H, L, kL)
        mask = rng.random(shape) > 0.4 if spec.mask == "bool" else \
            rng.standard_normal(shape).astype(NP[spec.mask_dtype])
        full = np.broadcast_to(mask, (B, H, L, kL))
        st_ = tuple(s // full.itemsize for s in full.strides)
        ints.update(m0=i0 * st_[2], msb=st_[0], msh=st_[1], msl=st_[2], msk=st_[3])
        bufs["mask"] = np.ascontiguousarray(mask)
        mask = full
    sinks = None
    if spec.sinks:
        sinks = rng.standard_normal(H).astype(np.float32)
        bufs["sinks"] = sinks
    return bufs, ints, mask, sinks


def ref(c, x, mask, sinks) -> np.ndarray:
    """MLX's fallback's softmax of each row in float64: causal and boolean masks give
    float32's lowest, an additive mask is added, a sink joins the max and the sum."""
    spec, B, H, L, i0, bl, kL, _, _ = c
    s = x.astype(np.float64).reshape(B, H, bl, kL)
    q = np.arange(i0, i0 + bl)[:, None] + kL - L
    if spec.causal:
        s = np.where(q >= np.arange(kL)[None], s, LOWEST)
    if mask is not None:
        m = mask[:, :, i0:i0 + bl]
        s = np.where(m, s, LOWEST) if m.dtype == np.bool_ else s + m.astype(np.float64)
    if sinks is not None:
        sk = np.broadcast_to(sinks.astype(np.float64)[None, :, None, None], (B, H, bl, 1))
        s = np.concatenate([sk, s], -1)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return (p[..., 1:] if sinks is not None else p).reshape(B * H * bl, kL)


def check(c, got, want):
    tol = TOL[c[0].dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@needs_cc
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_cpu_schedule_matches_float64_numpy(data):
    from tapescope.kernels.cpu.fast_kernels import _run

    c = case(data.draw)
    spec = c[0]
    bufs, ints, mask, sinks = inputs(c)
    want = ref(c, bufs["x"], mask, sinks)
    in_place = spec.dtype == "float32" and data.draw(st.booleans())
    bufs["out"] = bufs["x"] if in_place else np.full(bufs["x"].shape, np.nan, NP[spec.dtype])
    _run(spec, "ScaledDotProductAttention", bufs, ints, bufs["x"].size)
    check(c, bufs["out"].astype(np.float64), want)


@needs_shim
@settings(max_examples=12, deadline=None)
@given(st.data())
def test_gpu_schedule_on_the_metal_shim_matches_float64_numpy(data):
    c = case(data.draw)
    spec = c[0]
    if spec.dtype == "bfloat16" or spec.mask_dtype == "bfloat16":
        spec = ScoresSoftmaxSpec("float16" if spec.dtype == "bfloat16" else spec.dtype,
                                 spec.mask, "float16" if spec.mask == "add" else "",
                                 spec.causal, spec.sinks)
        c = (spec,) + c[1:]
    bufs, ints, mask, sinks = inputs(c)
    want = ref(c, bufs["x"], mask, sinks)
    bufs["out"] = np.full(bufs["x"].shape, np.nan, NP[spec.dtype])
    run_msl(spec, ints, bufs)
    check(c, bufs["out"].astype(np.float64), want)


def test_every_spec_renders_in_cuda_with_its_register_cache():
    cu = renderer("cuda")
    for s in all_specs():
        src = s.source(cu)
        assert f"{s.name}(" in src and "xs_ok" in src  # the row kept in registers


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the CUDA sources are rendered only")
def test_every_spec_compiles_with_nvcc(tmp_path):
    cu = tmp_path / "sdpa_softmax.cu"
    cu.write_text(render_module([s.kernel(gpu=True) for s in all_specs()], renderer("cuda")))
    r = subprocess.run([NVCC, "-arch=sm_90", "-c", str(cu), "-o", str(tmp_path / "s.o")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
