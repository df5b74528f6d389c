"""Affine ``quantized_matmul`` decoding on CUDA (``kernels/cuda/quantized.py``: ``qmv_plan``,
the qmv kernel's ``KernelPlan``) over the stand-in CuPy and driver (``fake_cupy.py``,
``fake_cuda_driver.py``: kernels load without NVRTC, launches run nothing), collected by
``test_cuda_sdpa_fake.py`` in a fresh process. A call's first run makes the plan (the rule,
a launch from Python); later calls are launched by the eval loop from C, no rule run. The
values: the plan's packed launch words (pointers, integer arguments) after each call are
given to the C build of the same ``QmvSpec`` (``codegen/qmv_cuda.py``: the CUDA kernel's
text with its blocks, warps and lanes walked in order), whose result at the launch's output
pointer is checked against float64 numpy over the dequantized weight: a wrong stride,
pointer or fold of the batch in the packed words gives a wrong answer."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cuda_driver
import tapescope.core as mx
from tapescope.kernels.codegen import qmv_cuda
from tapescope.kernels.cpu import compiler
from tapescope.kernels.cuda import quantized
from tapescope.kernels.cuda.primitive_plans import KernelPlan

from test_sdpa import NPD

PRIM = "QuantizedMatmul"
MXD = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
TOL = {"float32": 2e-5, "float16": 3e-3, "bfloat16": 2e-2}


pytestmark = pytest.mark.usefixtures("gpu_default_device")  # (conftest.py's)


@st.composite
def decode(draw):
    dtype = draw(st.sampled_from(list(qmv_cuda.TYPES)))
    bits = draw(st.sampled_from(qmv_cuda.BITS))
    gs = draw(st.sampled_from(qmv_cuda.GROUP_SIZES))
    K = gs * draw(st.sampled_from([1, 3, 8]))
    N = draw(st.sampled_from([1, 8, 20]))
    M = draw(st.integers(1, 4))
    # x's batch: none; x batched over one weight (rows folded); both batched; a weight
    # broadcast over x's batch; x a column slice (unaligned rows: element loads); x 1-D
    batch = draw(st.sampled_from(["none", "x", "both", "w_bcast", "strided", "vector"]))
    return dtype, bits, gs, K, N, M, batch, draw(st.integers(0, 2 ** 16))


def _packed(rng, bits, shape):
    """Random codes of ``shape`` (.., K) and their uint32 packing (code j of a word at bits
    ``j * bits``)."""
    codes = rng.integers(0, 2 ** bits, shape).astype(np.uint64)
    pf = 32 // bits
    w = np.zeros(shape[:-1] + (shape[-1] // pf,), np.uint64)
    for j in range(pf):
        w |= codes[..., j::pf] << np.uint64(bits * j)
    return codes, w.astype(np.uint32)


def _inputs(c):
    dtype, bits, gs, K, N, M, batch, seed = c
    rng = np.random.default_rng(seed)
    t = NPD[dtype]
    wb = (2,) if batch in ("both", "w_bcast") else ()
    xb = (2,) if batch in ("x", "both", "w_bcast") else ()
    if batch == "w_bcast":
        wb = (1,)
    codes, w = _packed(rng, bits, wb + (N, K))
    s = (rng.standard_normal(wb + (N, K // gs)) * 0.1).astype(t)
    b = (rng.standard_normal(wb + (N, K // gs)) * 0.1).astype(t)
    xs = xb + ((M, K) if batch != "vector" else (K,))
    x = rng.standard_normal(xs).astype(t)
    wd = (codes * np.repeat(s.astype(np.float64), gs, -1)
          + np.repeat(b.astype(np.float64), gs, -1))
    want = np.matmul(x.astype(np.float64), np.swapaxes(wd, -1, -2))
    return x, w, s, b, want


def _gpu(a, t, strided=False):
    if strided:  # a slice of a wider buffer: rows start 3 elements in (no 16-byte alignment)
        wide = np.zeros(a.shape[:-1] + (a.shape[-1] + 5,), a.dtype)
        wide[..., 3:3 + a.shape[-1]] = a
        return mx.array(wide, dtype=t)[..., 3:3 + a.shape[-1]]
    return mx.array(a, dtype=t)


def _ptr(a) -> int:
    return int(a._d.data.data.ptr)


def _plan_writing(out_ptr: int) -> KernelPlan:
    tid = threading.get_ident()
    for p in quantized.RULES[PRIM].plans.values():
        if isinstance(p, KernelPlan) and tid in p.packs and p.n_out_at >= 0 \
                and p.packs[tid][0][p.n_out_at] == out_ptr:
            return p
    raise AssertionError("no qmv plan wrote this call's output")


def _decoded(plan, spec) -> tuple:
    vals = plan.packs[threading.get_ident()][0]
    ptrs, words = {}, []
    for i, (kind, name) in enumerate(spec.params()):
        w = int(vals[plan.offsets[i]])
        if kind == "int":
            words.append(w)
        else:
            ptrs[name] = w
    return ptrs, words


def _run_on_cpu(spec, ptrs: dict, words: list) -> None:
    """The C build of ``spec`` over the launch's pointers (the stand-in's device pointers are
    host addresses) and its integer words, as packed."""
    entry = compiler.get_kernel(spec.name, spec.layout, lambda tc: qmv_cuda.c_source(spec),
                                key="qmv_c:" + spec.name)
    args = [ptrs[n] for k, n in spec.params() if k != "int"] + words
    argv = (ctypes.c_void_p * len(args))(*args)
    entry.fast_fn(gil=True)(argv)


def _host(a) -> np.ndarray:
    d = a._d.data
    if a.dtype == mx.bfloat16:
        return np.asarray(d.raw.get()).view(NPD["bfloat16"]).astype(np.float64)
    return np.asarray(d.get()).astype(np.float64)


@settings(max_examples=20, deadline=None)
@given(decode())
def test_qmv_is_one_planned_launch_from_c_and_matches_float64_numpy(c):
    dtype, bits, gs, K, N, M, batch, _ = c
    x, w, s, b, want = _inputs(c)
    t = MXD[dtype]
    xa = _gpu(x, t, strided=batch == "strided")
    wa, sa, ba = mx.array(w), _gpu(s, t), _gpu(b, t)
    mx.eval(xa, wa, sa, ba)
    tol = TOL[dtype]
    quantized.RULES[PRIM].plans.clear()  # (an earlier example's plan may own this output's memory)
    seen = set()
    for run in range(3):  # the first makes the plan (Python), the others from C
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = mx.quantized_matmul(xa, wa, sa, ba, transpose=True, group_size=gs, bits=bits)
        mx.eval(out)
        assert out.dtype == t and out.shape == want.shape
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        if run:
            assert (c1 - c0, p1 - p0) == (1, 0), (c1 - c0, p1 - p0)
        else:
            assert c1 - c0 + p1 - p0 == 1
        plan = _plan_writing(_ptr(out))
        spec = plan.entry.tape
        rows = 1 if batch == "vector" else M * (2 if batch in ("x", "w_bcast") else 1)
        assert (spec.dtype, spec.bits, spec.group_size, spec.rows) == (dtype, bits, gs, rows)
        ptrs, words = _decoded(plan, spec)
        assert ptrs == {"x": _ptr(xa), "w": _ptr(wa), "scales": _ptr(sa), "biases": _ptr(ba),
                        "out": _ptr(out)}
        _run_on_cpu(spec, ptrs, words)
        np.testing.assert_allclose(_host(out), want, rtol=tol,
                                   atol=tol * max(1.0, np.abs(want).max()), err_msg=str((c, run)))
        seen.add(id(plan))
    assert len(seen) == 1  # one plan for the layout, made once


@st.composite
def prefill(draw):
    dtype, bits, gs, K, N, _, batch, seed = draw(decode())
    M = draw(st.sampled_from([qmv_cuda.MAX_ROWS + 1, 20]))
    return dtype, bits, gs, K, N, M, "strided" if batch == "vector" else batch, seed


@settings(max_examples=12, deadline=None)
@given(prefill())
def test_qmm_is_a_dequant_launch_and_one_gemm_and_matches_float64_numpy(c):
    """More rows (``QmmPlan``): the dequant kernel's launch (its words given to its C build,
    which fills the tile the plan keeps for the stream) and one cuBLAS GEMM (the stand-in's,
    in float64 from the pointers, leading dimensions and strides it is given) a call; the
    calls after the first launched by the eval loop (``launch_fused``), no rule run."""
    import fake_cublas

    dtype, bits, gs, K, N, M, batch, _ = c
    x, w, s, b, want = _inputs(c)
    t = MXD[dtype]
    xa = _gpu(x, t, strided=batch == "strided")
    wa, sa, ba = mx.array(w), _gpu(s, t), _gpu(b, t)
    mx.eval(xa, wa, sa, ba)
    tol = TOL[dtype]
    rule = quantized.RULES[PRIM]
    rule.plans.clear()
    for run in range(3):
        c0, p0, g0 = (fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0],
                      fake_cublas.CALLS[0])
        out = mx.quantized_matmul(xa, wa, sa, ba, transpose=True, group_size=gs, bits=bits)
        mx.eval(out)
        assert out.dtype == t and out.shape == want.shape
        kernels = fake_cuda_driver.launches() - c0 + fake_cuda_driver.PY_LAUNCHES[0] - p0
        assert (kernels, fake_cublas.CALLS[0] - g0) == (1, 1)
        plans = [p for p in rule.plans.values() if isinstance(p, quantized.QmmPlan)]
        assert len(plans) == 1
        dq = plans[0].dequant
        spec = dq.entry.tape
        assert (spec.form, spec.dtype, spec.bits, spec.group_size) == ("dequant", dtype, bits, gs)
        ptrs, words = _decoded(dq, spec)
        assert {k: v for k, v in ptrs.items() if k != "out"} == {
            "w": _ptr(wa), "scales": _ptr(sa), "biases": _ptr(ba)}
        _run_on_cpu(spec, ptrs, words)  # the tile the next call's GEMM reads
        if run:
            np.testing.assert_allclose(_host(out), want, rtol=tol,
                                       atol=tol * max(1.0, np.abs(want).max()),
                                       err_msg=str((c, run)))


def test_untransposed_other_modes_and_no_biases_have_no_plan():
    """An untransposed weight and the fp modes run the rule (no plan); more rows than qmv
    takes are a ``QmmPlan``."""
    rng = np.random.default_rng(0)
    _, w = _packed(rng, 4, (16, 64))
    s = mx.array(rng.standard_normal((16, 1)).astype(np.float32))
    b = mx.array(rng.standard_normal((16, 1)).astype(np.float32))
    wa = mx.array(w)
    rule = quantized.RULES[PRIM]
    kw = dict(group_size=64, bits=4, mode="affine", transpose=True)
    for extra in ({"transpose": False}, {"mode": "mxfp4"}):
        x = mx.array(rng.standard_normal((1, 64)).astype(np.float32))
        mx.eval(x, wa, s, b)
        assert rule.planned((x._d.data, wa._d.data, s._d.data, b._d.data),
                            dict(kw, **extra)) is None
    for m, kind in ((1, KernelPlan), (qmv_cuda.MAX_ROWS + 1, quantized.QmmPlan)):
        x = mx.array(rng.standard_normal((m, 64)).astype(np.float32))
        mx.eval(x)
        p = rule.planned((x._d.data, wa._d.data, s._d.data, b._d.data), kw)
        assert type(p) is kind


def test_the_kernels_tab_shows_the_qmv_kernel_in_cuda_and_c():
    """The qmv kernel's cache entry renders its CUDA (the source built), its C build and a
    Metal line saying why there is none (``kernel_cache()``, ``entry_sources``)."""
    import tapescope
    from tapescope.kernels.cache_entries import entry_sources

    c = ("bfloat16", 4, 64, 128, 8, 1, "none", 1)
    x, w, s, b, _ = _inputs(c)
    xa, wa, sa, ba = _gpu(x, mx.bfloat16), mx.array(w), _gpu(s, mx.bfloat16), _gpu(b, mx.bfloat16)
    mx.eval(mx.quantized_matmul(xa, wa, sa, ba, transpose=True, group_size=64, bits=4))
    name = qmv_cuda.QmvSpec("bfloat16", 4, 64, 1).name
    entry = next(e for e in tapescope.kernel_cache() if e["name"] == name)
    src = entry_sources(entry)
    assert f"void __launch_bounds__(256, 4) {name}(" in src["cuda"]
    assert f"void {name}(void** args)" in src["cpu"]
    assert "no MSL" in src["metal"]
