"""Decoding attention on CUDA (``kernels/cuda/attention.py``: ``vector_plan``, the vector
kernel's ``KernelPlan``) over the stand-in CuPy and driver (``fake_cupy.py``,
``fake_cuda_driver.py``: kernels load without NVRTC, launches run nothing), collected by
``test_cuda_sdpa_fake.py`` in a fresh process. A call's first run makes the plan (the
rule, a launch from Python); later calls are launched by the eval loop from C, no rule
run. The values: the plan's packed launch words (pointers, integer arguments, the scale's
float32 bits) after each call are decoded and given to the CPU's build of the same
``SdpaSpec`` (the kernel the CUDA one renders from the same layout), whose result at the
launch's output pointer is checked against float64 numpy: a wrong stride, pointer or
scale in the packed words gives a wrong answer."""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cuda_driver
import tapescope.core as mx
from tapescope.kernels.codegen.attention_cuda import params
from tapescope.kernels.common.reductions import arguments
from tapescope.kernels.cpu import fast_kernels
from tapescope.kernels.cuda import attention
from tapescope.kernels.cuda.primitive_plans import KernelPlan

from test_sdpa import NPD, TOL, ref
from test_sdpa_kernels import _inputs, _layout

PRIM = "ScaledDotProductAttention"
MXD = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@pytest.fixture(autouse=True)
def on_gpu():
    old = mx.default_device()
    mx.set_default_device(mx.gpu)
    yield
    mx.set_default_device(old)


@st.composite
def decode(draw):
    B = draw(st.sampled_from([1, 2]))
    kv = draw(st.sampled_from([1, 2]))
    reps = draw(st.sampled_from([1, 2, 4]))
    L = draw(st.sampled_from([1, 2, 8]))
    kL = draw(st.sampled_from([1, 7, 40, 300]))
    D = draw(st.sampled_from([8, 16, 64, 80, 128]))
    mask = draw(st.sampled_from([None, "causal", "bool", "additive", "bool_bcast"]))
    if mask == "causal":
        kL = max(kL, L)
    sinks = draw(st.booleans())
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    return B, kv, reps, L, kL, D, mask, sinks, dtype, layout, draw(st.integers(0, 2 ** 16))


def _ptr(a) -> int:
    return int(a._d.data.data.ptr)


def _plan_writing(out_ptr: int) -> KernelPlan:
    """The vector plan whose last launch wrote ``out_ptr``."""
    tid = threading.get_ident()
    for p in attention.RULES[PRIM].plans.values():
        if isinstance(p, KernelPlan) and tid in p.packs and p.n_out_at >= 0 \
                and p.packs[tid][0][p.n_out_at] == out_ptr:
            return p
    raise AssertionError("no vector plan wrote this call's output")


def _decoded(plan, spec) -> tuple:
    """(buffer pointers, integer arguments, scale) of the plan's last launch."""
    vals = plan.packs[threading.get_ident()][0]
    ptrs, ints, scale = {}, {}, None
    for i, (kind, name) in enumerate(params(spec)):
        w = int(vals[plan.offsets[i]])
        if kind in ("in", "out"):
            ptrs[name] = w
        elif kind == "int":
            ints[name] = w - (1 << 64) if w >> 63 else w
        else:
            scale = struct.unpack("<f", struct.pack("<I", w & 0xFFFFFFFF))[0]
    return ptrs, ints, scale


def _run_on_cpu(spec, ptrs: dict, ints: dict, scale: float) -> None:
    """The CPU's build of ``spec`` over the launch's pointers (the stand-in's device
    pointers are host addresses) and integer arguments."""
    fp = np.array([scale], np.float32)
    bufs = dict(ptrs, fp=fp.ctypes.data)
    args = arguments(spec.kernel_params(), bufs, ints, {})
    fast_kernels.call_recorded(fast_kernels._entry(spec), spec, PRIM, args, True)


def _host(a) -> np.ndarray:
    """The result's own memory (a bfloat16 ``astype`` would launch, and the stand-in runs
    no launch)."""
    d = a._d.data
    if a.dtype == mx.bfloat16:
        return np.asarray(d.raw.get()).view(NPD["bfloat16"]).astype(np.float64)
    return np.asarray(d.get()).astype(np.float64)


def _call(qa, ka, va, mk, sa, scale):
    out = mx.fast.scaled_dot_product_attention(qa, ka, va, scale=scale, mask=mk, sinks=sa)
    mx.eval(out)
    return out


@settings(max_examples=25, deadline=None)
@given(decode())
def test_decoding_is_one_planned_launch_from_c_and_matches_float64_numpy(c):
    B, kv, reps, L, kL, D, mask, sinks, dtype, layout, _ = c
    q, k, v, m, s = _inputs(c)
    t = MXD[dtype]
    qa, ka, va = (_layout(a, layout, t) for a in (q, k, v))
    mk = "causal" if mask == "causal" else (mx.array(m) if m is not None else None)
    sa = mx.array(s, dtype=t) if s is not None else None
    mx.eval(qa, ka, va, *[a for a in (mk, sa) if isinstance(a, mx.array)])
    scale = D ** -0.5
    want = ref(q, k, v, scale, m, mask == "causal", s)
    tol = TOL[dtype]
    attention.RULES[PRIM].plans.clear()  # (an earlier example's plan may own this output's memory)
    seen = set()
    for run in range(3):  # the first makes the plan (Python), the others from C
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = _call(qa, ka, va, mk, sa, scale)
        assert out.dtype == t and out.shape == (B, kv * reps, L, D)
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        if run:
            assert (c1 - c0, p1 - p0) == (1, 0), (c1 - c0, p1 - p0)
            _, grid, block, _ = fake_cuda_driver.launch(c1 - 1)
            assert (grid, block) == (B * kv * reps * L, attention.THREADS)
        else:
            assert c1 - c0 + p1 - p0 == 1
        plan = _plan_writing(_ptr(out))
        spec = plan.entry.tape  # the kernel it launches, as this call asks for it
        assert (spec.mode, spec.dtype, spec.head, spec.mask, spec.causal, spec.sinks) == (
            "vector", dtype, D, "none" if m is None else ("bool" if m.dtype == np.bool_ else "add"),
            mask == "causal", sinks)
        ptrs, ints, got_scale = _decoded(plan, spec)
        want_ptrs = {"q": _ptr(qa), "k": _ptr(ka), "v": _ptr(va), "out": _ptr(out)}
        if isinstance(mk, mx.array):
            want_ptrs["mask"] = _ptr(mk)
        if sa is not None:
            want_ptrs["sinks"] = _ptr(sa)
        assert ptrs == want_ptrs
        _run_on_cpu(spec, ptrs, ints, got_scale)
        np.testing.assert_allclose(_host(out), want, rtol=tol,
                                   atol=tol * max(1.0, np.abs(want).max()), err_msg=str((c, run)))
        seen.add(id(plan))
    assert len(seen) == 1  # one plan for the layout, made once


def test_prefill_and_a_copy_first_have_no_plan():
    """Query lengths past 8 run the prefill (its own plans, no vector plan); head rows that
    are not unit-stride are copied by the rule first (no plan)."""
    rng = np.random.default_rng(0)
    q = mx.array(rng.standard_normal((1, 2, 9, 16)).astype(np.float32))
    k = mx.array(rng.standard_normal((1, 2, 20, 16)).astype(np.float32))
    mx.eval(q, k)
    rule = attention.RULES[PRIM]
    assert rule.planned((q._d.data, k._d.data, k._d.data),
                        dict(scale=0.25, causal=False, has_mask=False, has_sinks=False)) is None
    kd = mx.swapaxes(mx.array(rng.standard_normal((1, 2, 16, 20)).astype(np.float32)), -1, -2)
    q1 = q[:, :, :1]
    mx.eval(kd, q1)
    assert kd._d.data.strides[-1] != kd.itemsize
    assert rule.planned((q1._d.data, kd._d.data, kd._d.data),
                        dict(scale=0.25, causal=False, has_mask=False, has_sinks=False)) is None
