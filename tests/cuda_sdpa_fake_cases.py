"""The attention prefill of ``kernels/cuda/attention.py`` run over the stand-in CuPy and
cuBLAS (``fake_cupy.py``, ``fake_cublas.py``), collected by ``test_cuda_sdpa_fake.py`` in a
fresh process: the host path (query blocks, the GEMMs' pointers, leading dimensions, batch
strides and grouped heads, the softmax kernel's integer arguments) against float64 numpy.
The score softmax kernel runs as its CPU schedule (the same loop-IR kernel rendered in C),
launched where the CUDA launch would be; the GEMMs in float64 from their arguments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cublas
import tapescope.core as mx
from tapescope.kernels import timeline
from tapescope.kernels.cuda import attention, compiled

from conftest import sweep
from sdpa_inputs import MXD, NPD
from test_sdpa import TOL, host, ref
from test_sdpa_kernels import _inputs, _layout

PRIM = "ScaledDotProductAttention"


class _CpuEntry:
    """A loaded 'CUDA' kernel that runs the spec's CPU build over the numpy buffers."""

    def __init__(self, spec):
        self.spec, self.hits = spec, 0

    def fn(self, grid, block, args):
        from tapescope.kernels.cpu import fast_kernels

        bufs, ints = {}, {}
        for p, a in zip(self.spec.kernel_params(), args):
            if p.kind in ("in", "out"):
                bufs[p.name] = a
            else:
                ints[p.name] = int(a)
        fast_kernels._run(self.spec, PRIM, bufs, ints, 1 << 20)


@pytest.fixture(autouse=True)
def cpu_softmax(monkeypatch):
    entries = {}
    real = compiled.get_kernel

    def get_kernel(name, variant, source_fn, key, tape=None):
        if name.startswith("sdpa_softmax_"):
            source_fn()  # the CUDA source renders
            return entries.setdefault(name, _CpuEntry(tape))
        return real(name, variant, source_fn, key, tape=tape)

    monkeypatch.setattr(compiled, "get_kernel", get_kernel)
    old = mx.default_device()
    mx.set_default_device(mx.gpu)
    yield
    mx.set_default_device(old)


@st.composite
def prefill(draw):
    B = draw(st.sampled_from([1, 2]))
    kv = draw(st.sampled_from([1, 2]))
    reps = draw(st.sampled_from([1, 2, 3]))
    L = draw(st.sampled_from([9, 16, 33]))
    kL = draw(st.sampled_from([1, 7, 16, 40]))
    D = draw(st.sampled_from([8, 16, 24]))
    mask = draw(st.sampled_from([None, "causal", "bool", "additive", "bool_bcast"]))
    if mask == "causal":  # (L > kL: MLX's composition, recorded as such at the front end)
        kL = max(kL, L + draw(st.sampled_from([0, 5])))
    sinks = draw(st.booleans())
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    return B, kv, reps, L, kL, D, mask, sinks, dtype, layout, draw(st.integers(0, 2 ** 16))


def _run(c, block_rows=None, monkeypatch=None):
    B, kv, reps, L, kL, D, mask, sinks, dtype, layout, _ = c
    q, k, v, m, s = _inputs(c)
    t = MXD[dtype]
    mk = "causal" if mask == "causal" else (mx.array(m) if m is not None else None)
    qa, ka, va = (_layout(a, layout, t) for a in (q, k, v))
    mx.eval(qa, ka, va)
    if block_rows is not None:  # scores of a few query rows a block: several blocks
        monkeypatch.setattr(attention, "SCORES", B * kv * reps * kL * block_rows)
    timeline.set_recording(True)
    seq = timeline.next_seq()
    calls = fake_cublas.CALLS[0]
    try:
        out = mx.fast.scaled_dot_product_attention(
            qa, ka, va, scale=D ** -0.5, mask=mk,
            sinks=mx.array(s, dtype=t) if s is not None else None)
        mx.eval(out)
    finally:
        recs = timeline.records_since(seq)
        timeline.set_recording(False)
    assert out.dtype == t and out.shape == (B, kv * reps, L, D)
    want = ref(q, k, v, D ** -0.5, m, mask == "causal", s)
    tol = TOL[dtype]
    np.testing.assert_allclose(host(out), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    fallbacks = [r.detail for r in recs if r.kind == "kernel_fallback"]
    launches = [r for r in recs if r.kind == "kernel_launch" and r.name.startswith("sdpa_softmax_")
                and r.detail.get("runtime") == "cuda"]
    assert not fallbacks, fallbacks
    # bfloat16 in its own bits (no float32 copies: bfloat16.rule's "fallback" record)
    assert not [r for r in recs if r.kind == "fallback" and r.detail.get("primitive") == PRIM]
    return launches, fake_cublas.CALLS[0] - calls


@settings(max_examples=sweep(60, 24), deadline=None)
@given(prefill())
def test_prefill_matches_float64_numpy(c):
    launches, gemms = _run(c)
    assert len(launches) == 1  # one block: one softmax launch
    assert gemms >= 2


@settings(max_examples=25, deadline=None)
@given(prefill(), st.sampled_from([1, 4, 7]))
def test_prefill_in_several_query_blocks_matches_float64_numpy(c, rows):
    import _pytest.monkeypatch

    mp = _pytest.monkeypatch.MonkeyPatch()
    try:
        launches, _ = _run(c, rows, mp)
    finally:
        mp.undo()
    L = c[3]
    assert len(launches) == -(-L // rows)


def test_grouped_heads_take_one_gemm_each_and_one_launch():
    """4 x 16 heads over 4 key heads, one block: two GEMMs and one softmax launch a call (the
    query heads of a key head stacked as one matrix, the (batch, key head) pairs as the
    batch)."""
    c = (2, 4, 4, 33, 40, 16, None, False, "float32", "contiguous", 0)
    launches, gemms = _run(c)
    assert (len(launches), gemms) == (1, 2)


def test_an_int_rope_offset_is_one_element_kept_on_the_device():
    """``mx.fast.rope(..., offset=3)`` on a GPU stream reads its offset from device memory
    (so the eval loop launches the call's plan, no upload a call), the same array for the
    same value, with the values of float64 numpy."""
    import cupy

    from test_fast_kernels import rope_ref

    x = np.random.default_rng(0).standard_normal((2, 3, 17, 8)).astype(np.float32)
    a = mx.add(mx.array(x), 0, stream=mx.gpu)
    y1 = mx.fast.rope(a, 8, traditional=False, base=1e4, scale=1.0, offset=3, stream=mx.gpu)
    y2 = mx.fast.rope(a, 8, traditional=False, base=1e4, scale=1.0, offset=3, stream=mx.gpu)
    off1, off2 = (y._d.node.inputs[1] for y in (y1, y2))
    assert off1 is off2 and off1.shape == (1,)
    # (a one-element view of the stream's table of offsets, on the device already)
    table = off1.node.inputs[0] if off1.data is None else off1
    assert type(table.data) is cupy.ndarray and table.node is None
    mx.eval(y1, y2)
    assert type(off1.data) is cupy.ndarray and int(off1.data.get()[0]) == 3
    np.testing.assert_allclose(np.asarray(y1), rope_ref(x, 8, False, 1e4, 1.0, 3), rtol=1e-5, atol=1e-5)


def test_bfloat16_prefill_runs_in_its_own_bits():
    """bfloat16 q / k / v / additive mask (the GEMMs on the storage as CUDA_R_16BF, p rounded
    to bfloat16) with sinks and transposed inputs, against float64 numpy."""
    from tapescope.kernels.cuda import bfloat16 as bf16

    seen = []
    real = attention._Prefill.__call__

    def spy(self, q, k, v, bufs, entry):
        seen.append(type(q))
        return real(self, q, k, v, bufs, entry)

    attention._Prefill.__call__ = spy
    try:
        launches, gemms = _run((2, 2, 2, 33, 40, 16, "additive", True, "bfloat16", "transposed", 1))
    finally:
        attention._Prefill.__call__ = real
    assert seen == [bf16.BF16Array] and len(launches) == 1 and gemms >= 2
