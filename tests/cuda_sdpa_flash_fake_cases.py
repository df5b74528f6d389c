"""Prefill attention on CUDA (``kernels/cuda/attention.py``: ``flash_plan``, the fused kernel's
``KernelPlan``) over the stand-in CuPy and driver (``fake_cupy.py``, ``fake_cuda_driver.py``:
kernels load without NVRTC, launches run nothing; the device says sm_90), collected by
``test_cuda_sdpa_fake.py`` in a fresh process. A call's first run makes the plan (launched
from Python); later calls are launched by the eval loop from C. Each call's packed words
(pointers, integer arguments, the scale's float32 bits) are decoded and given to the fused
kernel's own CUDA text built for the host (``cuda_host.py``, ``cuda_host_shim.h``: the
stand-in's device pointers are host addresses), with the launch's grid and block; its result
in the call's output is checked against float64 numpy: a wrong stride, pointer, grid, scale
or precision in the plan gives a wrong answer."""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cuda_driver
import fake_cupy
import tapescope.core as mx
from cuda_host import CXX, build, launch
from tapescope.kernels.codegen import attention_flash as af
from tapescope.kernels.cuda import attention
from tapescope.kernels.cuda.primitive_plans import KernelPlan
from tapescope.kernels.settings import settings as ts

from sdpa_inputs import MXD, NPD, inputs
from test_sdpa import ref
from test_sdpa_flash_host import TOL
from test_sdpa_kernels import _layout

PRIM = "ScaledDotProductAttention"
fake_cupy.Device.compute_capability = "90"  # (mma.sync: the fused kernel's plans)

pytestmark = [pytest.mark.usefixtures("gpu_default_device"),
              pytest.mark.skipif(CXX is None, reason="no g++ for the kernel's host build")]


@st.composite
def prefill(draw):
    B = draw(st.sampled_from([1, 2]))
    kv = draw(st.sampled_from([1, 2]))
    reps = draw(st.sampled_from([1, 2]))
    L = draw(st.sampled_from([9, 40, 65]))
    kL = draw(st.sampled_from([7, 64, 90]))
    dtype, precision = draw(st.sampled_from(sorted(TOL)))
    with ts(tf32=precision != "f32x3"):
        D = draw(st.sampled_from(attention.flash_heads(dtype)))
    mask = draw(st.sampled_from([None, "causal", "bool", "additive"]))
    if mask == "causal":
        kL = max(kL, L)
    sinks = draw(st.booleans())
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    return B, kv, reps, L, kL, D, mask, sinks, dtype, precision, layout, draw(st.integers(0, 2 ** 16))


def _ptr(a) -> int:
    return int(a._d.data.data.ptr)


def _host(a) -> np.ndarray:
    d = a._d.data
    if a.dtype == mx.bfloat16:
        return np.asarray(d.raw.get()).view(NPD["bfloat16"]).astype(np.float64)
    return np.asarray(d.get()).astype(np.float64)


def _plan_writing(out_ptr: int) -> KernelPlan:
    tid = threading.get_ident()
    for p in attention.RULES[PRIM].plans.values():
        if isinstance(p, KernelPlan) and tid in p.packs and p.packs[tid][0][p.n_out_at] == out_ptr:
            return p
    raise AssertionError("no prefill plan wrote this call's output")


def _decoded(plan, spec) -> list:
    """The launch's last call's arguments in the kernel's order (pointers and integers as
    int64 words, the scale's float32 bits in its word)."""
    vals = plan.packs[threading.get_ident()][0]
    out = []
    for i, (kind, _name) in enumerate(af.params(spec)):
        w = int(vals[plan.offsets[i]])
        out.append(w - (1 << 64) if w >> 63 else w)
    return out


def _check(c, runs: int = 3, clear: bool = True) -> KernelPlan:
    B, kv, reps, L, kL, D, mask, sinks, dtype, precision, layout, seed = c
    q, k, v, m, s = inputs(B, kv, reps, L, kL, D, mask, sinks, dtype, seed)
    qa, ka, va = (_layout(a, layout, MXD[dtype]) for a in (q, k, v))
    mk = "causal" if mask == "causal" else (mx.array(m) if m is not None else None)
    sa = mx.array(s, dtype=MXD[dtype]) if s is not None else None
    mx.eval(qa, ka, va, *[a for a in (mk, sa) if isinstance(a, mx.array)])
    scale = D ** -0.5
    want = ref(q, k, v, scale, m, mask == "causal", s)
    tol = TOL[dtype, precision]
    if clear:
        attention.RULES[PRIM].plans.clear()
    seen = set()
    with ts(tf32=precision != "f32x3"):
        for run in range(runs):
            c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
            out = mx.fast.scaled_dot_product_attention(qa, ka, va, scale=scale, mask=mk, sinks=sa)
            mx.eval(out)
            c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
            plan = _plan_writing(_ptr(out))
            spec = plan.entry.tape
            assert isinstance(spec, af.FlashSpec)
            assert (spec.dtype, spec.head, spec.mask, spec.causal, spec.sinks, spec.precision) == (
                dtype, D, "none" if m is None else ("bool" if m.dtype == np.bool_ else "add"),
                mask == "causal", sinks, precision)
            assert spec.tile == attention.flash_tile(dtype, D)  # (the FLASH table's)
            assert plan.grid == af.grid(B, kv * reps, L, af.rows(spec))
            if run:  # from C: the plan's one launch, none from Python
                assert (c1 - c0, p1 - p0) == (1, 0), (c1 - c0, p1 - p0)
                _, grid, block, _ = fake_cuda_driver.launch(c0)
                assert (grid, block) == (plan.grid, af.threads(spec))
            else:
                assert c1 - c0 + p1 - p0 == 1
            args = _decoded(plan, spec)
            ptrs = dict(zip([n for kind, n in af.params(spec) if kind in ("in", "out")], args))
            want_ptrs = {"q": _ptr(qa), "k": _ptr(ka), "v": _ptr(va), "out": _ptr(out)}
            if isinstance(mk, mx.array):
                want_ptrs["mask"] = _ptr(mk)
            if sa is not None:
                want_ptrs["sinks"] = _ptr(sa)
            assert ptrs == want_ptrs
            launch(build(af.flash_source(spec), [spec.name]), spec.name, plan.grid, af.threads(spec), args)
            np.testing.assert_allclose(_host(out), want, rtol=tol,
                                       atol=tol * max(1.0, np.abs(want).max()), err_msg=str((c, run)))
            seen.add(id(plan))
    assert len(seen) == 1  # one plan for the layout, made once
    return plan


@settings(max_examples=12, deadline=None)
@given(prefill())
def test_prefill_is_one_fused_launch_planned_from_c_and_matches_float64_numpy(c):
    _check(c)


def test_the_float32_plan_follows_the_tf32_setting():
    """A float32 plan is the setting's at plan time; switching ``settings.tf32`` drops it, so
    the next call plans the other precision."""
    c = (1, 1, 1, 20, 30, 64, None, False, "float32", "tf32", "contiguous", 5)
    p1 = _check(c, runs=2)
    assert p1.entry.tape.precision == "tf32"
    p2 = _check(c[:9] + ("f32x3",) + c[10:], runs=2, clear=False)  # (the same layout's key)
    assert p2.entry.tape.precision == "f32x3"


def test_a_head_size_it_does_not_take_has_no_plan():
    """Float32 head sizes ``attention.FLASH`` gives no kernel (8; 128: the kernel's, slower
    there than the composition; 256) run the GEMM composition."""
    rng = np.random.default_rng(0)
    for D in (8, 128, 256):
        q = mx.array(rng.standard_normal((1, 2, 9, D)).astype(np.float32))
        mx.eval(q)
        assert attention.RULES[PRIM].planned(
            (q._d.data, q._d.data, q._d.data),
            dict(scale=0.25, causal=False, has_mask=False, has_sinks=False)) is None
