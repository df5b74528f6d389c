"""Decoding's fast primitives on CUDA: bfloat16 ``RMSNorm`` and ``RoPE``
(``kernels/cuda/fast_kernels.py``: the plans take ``BF16Array`` storage as float32 arrays are
taken), and RoPE's growing offset (``core/fast.py``: a view of one table of offsets per
stream, no upload per token), over the stand-in CuPy and driver
(``fake_cupy.py``, ``fake_cuda_driver.py``: kernels load without NVRTC, launches run
nothing), collected by ``test_cuda_sdpa_fake.py`` in a fresh process. A layout's first call
makes the plan (the rule, a launch from Python); later calls are one launch from C, no
float32 copies and no rounding kernel. The values: the launch's packed words after each
call are decoded by the spec's parameters (the same for the CPU and GPU schedules) and given
to the CPU's build of the same spec, whose bfloat16 result at the output pointer is checked
against float64 numpy (MLX's roundings: within bfloat16's tolerance)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cuda_driver
import tapescope.core as mx
from tapescope.kernels.common.reductions import arguments
from tapescope.kernels.cpu import fast_kernels
from tapescope.kernels.cuda import fast_kernels as cuda_fast
from tapescope.kernels.cuda.primitive_plans import KernelPlan

from sdpa_inputs import NPD

TOL = 1.6e-2
pytestmark = pytest.mark.usefixtures("gpu_default_device")  # (conftest.py's)


def _rounded(a):
    return a.astype(NPD["bfloat16"]).astype(np.float64)


def _ptr(a) -> int:
    return int(a._d.data.data.ptr)


def _host(a) -> np.ndarray:
    return np.asarray(a._d.data.raw.get()).view(NPD["bfloat16"]).astype(np.float64)


def _plan_writing(prim: str, out_ptr: int) -> KernelPlan:
    tid = threading.get_ident()
    for p in cuda_fast.RULES[prim].plans.values():
        if isinstance(p, KernelPlan) and tid in p.packs and p.packs[tid][0][p.n_out_at] == out_ptr:
            return p
    raise AssertionError(f"no {prim} plan wrote this call's output")


def _run_on_cpu(plan, prim: str) -> None:
    """The CPU's build of the plan's spec over its packed words: pointers (the stand-in's
    device pointers are host addresses) and integers, by the spec's parameters."""
    spec = plan.entry.tape
    vals = plan.packs[threading.get_ident()][0]
    ptrs, ints = {}, {}
    for i, p in enumerate(spec.kernel_params()):
        w = int(vals[plan.offsets[i]])
        if p.kind == "int":
            ints[p.name] = w - (1 << 64) if w >> 63 else w
        else:
            ptrs[p.name] = w
    args = arguments(spec.kernel_params(), ptrs, ints, {})
    fast_kernels.call_recorded(fast_kernels._entry(spec), spec, prim, args, True)


def _three_calls(prim: str, f, want):
    cuda_fast.RULES[prim].plans.clear()  # (an earlier example's plan may own this output's memory)
    seen = set()
    for run in range(3):  # the first makes the plan (the rule: a Python launch), then C
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = f()
        mx.eval(out)
        assert out.dtype == mx.bfloat16 and out.shape == want.shape
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        assert (c1 - c0 + p1 - p0) == 1  # the kernel alone: no float32 copies, no rounding
        if run:
            assert (c1 - c0, p1 - p0) == (1, 0)
        plan = _plan_writing(prim, _ptr(out))
        assert plan.entry.tape.dtype == "bfloat16"
        _run_on_cpu(plan, prim)
        np.testing.assert_allclose(_host(out), want, rtol=TOL,
                                   atol=TOL * max(1.0, np.abs(want).max()), err_msg=str(run))
        seen.add(id(plan))
    assert len(seen) == 1  # one plan for the layout, made once


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([(1, 1, 64), (3, 40), (2, 5, 130)]), st.integers(0, 2 ** 16))
def test_bfloat16_rms_norm_is_one_planned_launch_from_c(shape, seed):
    rng = np.random.default_rng(seed)
    x, w = _rounded(rng.standard_normal(shape)), _rounded(rng.standard_normal(shape[-1]))
    xa, wa = mx.array(x, dtype=mx.bfloat16), mx.array(w, dtype=mx.bfloat16)
    mx.eval(xa, wa)
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w
    _three_calls("RMSNorm", lambda: mx.fast.rms_norm(xa, wa, 1e-5), want)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([(1, 4, 1, 16), (1, 2, 3, 32), (2, 4, 1, 64)]), st.integers(0, 300),
       st.integers(0, 2 ** 16))
def test_bfloat16_rope_with_an_offset_is_one_planned_launch_from_c(shape, offset, seed):
    rng = np.random.default_rng(seed)
    x = _rounded(rng.standard_normal(shape))
    xa = mx.array(x, dtype=mx.bfloat16)
    mx.eval(xa)
    D = shape[-1]
    half = D // 2
    inv = 10000.0 ** (-np.arange(half) / half)
    theta = (offset + np.arange(shape[2]))[:, None] * inv[None, :]
    cos, sin = np.cos(theta), np.sin(theta)
    x1, x2 = x[..., :half], x[..., half:]
    want = np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    _three_calls("RoPE", lambda: mx.fast.rope(xa, D, traditional=False, base=10000.0, scale=1.0,
                                              offset=offset), want)


def _rope_want(x, offset):
    half = x.shape[-1] // 2
    inv = 10000.0 ** (-np.arange(half) / half)
    theta = (offset + np.arange(x.shape[2]))[:, None] * inv[None, :]
    cos, sin = np.cos(theta), np.sin(theta)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def test_a_decoding_loops_offsets_are_one_plan_from_c_and_no_upload_each(monkeypatch):
    """Each token's new offset (a Python int, as ``nn.RoPE`` passes the cache's) is a view
    of the stream's table of offsets: no host-to-device copy per token, one plan (the offset
    read through its pointer), launched from C, the right rotation at every offset (the CPU
    build over the decoded words); an offset past the table is its own upload."""
    from tapescope.core import fast as core_fast
    from tapescope.kernels.cuda import memory

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 1, 32)).astype(np.float32).astype(np.float64)
    xa = mx.array(x, dtype=mx.float32)
    mx.eval(xa)
    uploads = []
    real = memory.CudaAllocator.import_host

    def counted(self, *a, **k):
        uploads.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(memory.CudaAllocator, "import_host", counted)
    core_fast._OFFSETS.clear()
    cuda_fast.RULES["RoPE"].plans.clear()
    mx.eval(mx.fast.rope(xa, 32, traditional=False, base=10000.0, scale=1.0, offset=7))
    seen = set()
    for offset in (8, 9, 10, 300, core_fast._TABLE - 1, core_fast._TABLE + 5):
        del uploads[:]
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = mx.fast.rope(xa, 32, traditional=False, base=10000.0, scale=1.0, offset=offset)
        mx.eval(out)
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        assert (c1 - c0, p1 - p0) == (1, 0), offset
        assert len(uploads) == (offset >= core_fast._TABLE), offset
        plan = _plan_writing("RoPE", _ptr(out))
        _run_on_cpu(plan, "RoPE")
        # (float32 angles: MLX's, off by about offset * 2^-24 radians)
        tol = 2e-5 + 1.2e-7 * offset * np.abs(x).max()
        np.testing.assert_allclose(np.asarray(out._d.data.get()).astype(np.float64),
                                   _rope_want(x, offset), rtol=2e-5, atol=tol, err_msg=str(offset))
        seen.add(id(plan))
    assert len(seen) == 1
