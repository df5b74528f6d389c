"""Decoding attention on CUDA (``kernels/cuda/attention.py``: ``vector_plan``, the vector
kernel's ``KernelPlan``, or past ``SPLIT_KEYS`` keys the split keys' pass and their merge, a
``PlanSequence``) over the stand-in CuPy and driver (``fake_cupy.py``,
``fake_cuda_driver.py``: kernels load without NVRTC, launches run nothing; the device has
132 SMs and no occupancy call), collected by ``test_cuda_sdpa_fake.py`` in a fresh process.
A call's first run makes the plan (the rule, launches from Python); later calls are
launched by the eval loop from C, no rule run. The values: each launch's packed words
(pointers, integer arguments, the scale's float32 bits) after each call are decoded and
given, in the plan's order, to the CPU's build of the same ``SdpaSpec`` (the kernel the CUDA
one renders from the same layout; the two passes' partial states in the plan's scratch
buffer, host memory here), whose result at the last launch's output pointer is checked
against float64 numpy: a wrong stride, pointer, run length or scale in the packed words
gives a wrong answer."""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cuda_driver
import tapescope.core as mx
from tapescope.kernels.codegen.attention_cuda import (BLOCKS_PER_SM, SPLIT_KEYS, block_threads, params,
                                                      split_step)
from tapescope.kernels.common.reductions import arguments
from tapescope.kernels.cpu import fast_kernels
from tapescope.kernels.cuda import attention
from tapescope.kernels.cuda.primitive_plans import KernelPlan, PlanSequence

from sdpa_inputs import NPD
from test_sdpa import TOL, host, ref
from test_sdpa_kernels import _inputs, _layout

PRIM = "ScaledDotProductAttention"
SLOTS = 132 * BLOCKS_PER_SM  # the stand-in's SMs, the blocks an SM holds with no occupancy call
MXD = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


pytestmark = pytest.mark.usefixtures("gpu_default_device")  # (conftest.py's)


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


@st.composite
def long_decode(draw):
    """Key lengths around the split: one pass at ``SPLIT_KEYS``, runs of a few steps past
    it (the last one short), many runs further on."""
    c = list(draw(decode()))
    c[4] = draw(st.sampled_from([SPLIT_KEYS, SPLIT_KEYS + 1, SPLIT_KEYS + 100, 2 * SPLIT_KEYS + 3,
                                 4 * SPLIT_KEYS]))
    c[2] = draw(st.sampled_from([1, 4]))
    return tuple(c)


def _ptr(a) -> int:
    return int(a._d.data.data.ptr)


def _launches(p) -> tuple:
    return (p, *p.then) if isinstance(p, PlanSequence) else (p,)


def _plan_writing(out_ptr: int) -> KernelPlan:
    """The decoding plan whose last launch wrote ``out_ptr``."""
    tid = threading.get_ident()
    for p in attention.RULES[PRIM].plans.values():
        if isinstance(p, KernelPlan):
            last = _launches(p)[-1]
            if tid in last.packs and last.n_out_at >= 0 and last.packs[tid][0][last.n_out_at] == out_ptr:
                return p
    raise AssertionError("no decoding plan wrote this call's output")


def _decoded(plan, spec) -> tuple:
    """(buffer pointers, integer arguments, scale) of the launch's last call."""
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


def _run_on_cpu(spec, ptrs: dict, ints: dict, scale) -> None:
    """The CPU's build of ``spec`` over the launch's pointers (the stand-in's device
    pointers are host addresses) and integer arguments."""
    fp = np.array([scale or 0.0], np.float32)
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


def _check(c, runs: int = 3) -> KernelPlan:
    """Three calls of case ``c``: the first makes the plan (Python), the others launch it from
    C; each call's launches decoded and run as their CPU builds against float64 numpy."""
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
    kind = "none" if m is None else ("bool" if m.dtype == np.bool_ else "add")
    rows = B * kv * reps * L
    attention.RULES[PRIM].plans.clear()  # (an earlier example's plan may own this output's memory)
    seen = set()
    for run in range(runs):
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = _call(qa, ka, va, mk, sa, scale)
        assert out.dtype == t and out.shape == (B, kv * reps, L, D)
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        plan = _plan_writing(_ptr(out))
        steps = _launches(plan)
        n = len(steps)
        if run:  # from C: every launch of the plan, none from Python
            assert (c1 - c0, p1 - p0) == (n, 0), (c1 - c0, p1 - p0)
            for i, p in enumerate(steps):
                _, grid, block, _ = fake_cuda_driver.launch(c0 + i)
                assert (grid, block) == (p.grid, block_threads(p.entry.tape))
        else:
            assert c1 - c0 + p1 - p0 == n
        specs = [p.entry.tape for p in steps]  # the kernels it launches, as this call asks
        want_ptrs = {"q": _ptr(qa), "k": _ptr(ka), "v": _ptr(va)}
        if isinstance(mk, mx.array):
            want_ptrs["mask"] = _ptr(mk)
        if sa is not None:
            want_ptrs["sinks"] = _ptr(sa)
        decoded = [_decoded(p, sp) for p, sp in zip(steps, specs)]
        if n == 1:
            assert kL <= SPLIT_KEYS or 2 * rows > SLOTS  # (rows that fill the device alone)
            assert (specs[0].mode, specs[0].dtype, specs[0].head, specs[0].mask, specs[0].causal,
                    specs[0].sinks) == ("vector", dtype, D, kind, mask == "causal", sinks)
            assert decoded[0][0] == dict(want_ptrs, out=_ptr(out))
            assert steps[0].grid == rows
        else:  # the split keys' pass into the scratch, then the merge into the output
            assert n == 2 and kL > SPLIT_KEYS
            assert (specs[0].mode, specs[0].dtype, specs[0].head, specs[0].mask, specs[0].causal,
                    specs[0].sinks) == ("vector_2pass_1", dtype, D, kind, mask == "causal", sinks)
            assert (specs[1].mode, specs[1].dtype, specs[1].head) == ("vector_2pass_2", dtype, D)
            (p1_, i1, _), (p2_, i2, _) = decoded
            scratch = next(iter(plan.scratches.values()))
            assert len(plan.scratches) == 1 and plan.scratch_dtype == np.float32
            nb, chunk = i1["NB"], i1["chunk"]
            assert (i2["rows"], i2["NB"]) == (rows, nb) and scratch.size == rows * nb * (D + 2)
            assert p1_ == dict(want_ptrs, part=_ptr_of(scratch)) and p2_ == {
                "part": _ptr_of(scratch), "out": _ptr(out)}
            # runs of whole steps cover the keys, none empty; one wave of the device's slots
            assert chunk % split_step(D) == 0 and (nb - 1) * chunk < kL <= nb * chunk
            assert 2 <= nb and steps[0].grid == rows * nb <= SLOTS and steps[1].grid == rows
        for sp, (ptrs, ints, got_scale) in zip(specs, decoded):
            _run_on_cpu(sp, ptrs, ints, got_scale)
        np.testing.assert_allclose(_host(out), want, rtol=tol,
                                   atol=tol * max(1.0, np.abs(want).max()), err_msg=str((c, run)))
        seen.add(id(plan))
    assert len(seen) == 1  # one plan for the layout, made once
    return plan


def _ptr_of(a) -> int:
    return int(a.__array_interface__["data"][0])


@settings(max_examples=25, deadline=None)
@given(decode())
def test_decoding_is_one_planned_launch_from_c_and_matches_float64_numpy(c):
    _check(c)


@settings(max_examples=8, deadline=None)
@given(long_decode())
def test_long_caches_are_two_planned_launches_from_c_and_match_float64_numpy(c):
    """Past ``SPLIT_KEYS`` keys: the split keys' pass (runs of keys a block, each one's
    partial state to the scratch) and the merge, both launched from C, every mask kind,
    causal, sinks (the first run's), grouped heads, every dtype and layout."""
    _check(c, runs=2)


@pytest.mark.parametrize("B,H,kL,D,dtype,nb", [
    (4, 16, 4096, 64, "float16", 16),  # the benchmark's shape: 64 rows x 16 runs = 1024 slots
    (2, 16, 4096, 128, "float32", 32),  # 32 rows: runs of 128 keys
    (1, 2, 4096, 64, "float32", 64),  # few rows: runs of RUN_MIN keys
    (4, 16, SPLIT_KEYS, 64, "float32", 1),  # one pass at the threshold
    (9, 64, 2048, 8, "float16", 1),  # rows that fill the device alone: one pass
])
def test_the_runs_a_row_follow_the_keys_and_the_device(B, H, kL, D, dtype, nb):
    """MLX's choice: one pass up to ``SPLIT_KEYS`` keys; above it as many runs as fill the
    device's first-pass slots once (132 SMs here), at least ``RUN_MIN`` keys a run."""
    c = (B, H, 1, 1, kL, D, None, False, dtype, "contiguous", 3)
    plan = _check(c, runs=2)
    steps = _launches(plan)
    assert (len(steps) == 1) == (nb == 1)
    if nb > 1:
        assert steps[0].grid == B * H * nb


def test_mlx_sdpa_blocks_sets_the_runs_a_row(monkeypatch):
    monkeypatch.setenv("MLX_SDPA_BLOCKS", "5")
    plan = _check((1, 2, 1, 1, 3000, 16, "bool", True, "float16", "contiguous", 1), runs=2)
    assert _launches(plan)[0].grid == 2 * 5


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


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(["float32", "bfloat16"]), st.sampled_from([1, 2]),
       st.sampled_from([16, 64]), st.integers(0, 2 ** 16))
def test_a_growing_cache_is_one_plan_launched_from_c_at_every_length(dtype, kv, D, seed):
    """mlx_lm's KV cache: keys and values preallocated (256 positions), each token's call
    reading a longer slice of them. One plan takes every length up to ``SPLIT_KEYS``
    (``KernelRule.free``, the plan's ``dims``: the length written into its ``kL`` word per
    call): after the first call, every length is one launch from C, the word the call's
    length (the CPU build over the decoded words against float64 numpy)."""
    rng = np.random.default_rng(seed)
    t = MXD[dtype]
    H = 2 * kv
    cache = [host(mx.array(rng.standard_normal((1, kv, 256, D)), dtype=t)) for _ in "kv"]
    q = host(mx.array(rng.standard_normal((1, H, 1, D)), dtype=t))
    qa, ka, va = (mx.array(a, dtype=t) for a in (q, *cache))
    mx.eval(qa, ka, va)
    scale = D ** -0.5
    attention.RULES[PRIM].plans.clear()
    seen = set()
    for run, kL in enumerate((5, 6, 7, 40, 41, SPLIT_KEYS // 8)):
        kL = min(kL, 256)
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = _call(qa, ka[:, :, :kL, :], va[:, :, :kL, :], None, None, scale)
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        assert (c1 - c0, p1 - p0) == ((1, 0) if run else (0, 1)), (run, c1 - c0, p1 - p0)
        plan = _plan_writing(_ptr(out))
        ptrs, ints, got_scale = _decoded(plan, plan.entry.tape)
        assert ints["kL"] == kL and ptrs == {"q": _ptr(qa), "k": _ptr(ka), "v": _ptr(va),
                                             "out": _ptr(out)}
        _run_on_cpu(plan.entry.tape, ptrs, ints, got_scale)
        want = ref(q, cache[0][:, :, :kL], cache[1][:, :, :kL], scale)
        tol = TOL[dtype]
        np.testing.assert_allclose(_host(out), want, rtol=tol,
                                   atol=tol * max(1.0, np.abs(want).max()), err_msg=str((kL, run)))
        seen.add(id(plan))
    assert len(seen) == 1  # one plan for every length
