"""One-row products ``x @ w.T`` on CUDA (``kernels/cuda/gemm.py``: the gemv's ``KernelPlan``,
``codegen/gemv_cuda.py``) over the stand-in CuPy, cuBLAS and driver (``fake_cupy.py``,
``fake_cublas.py``, ``fake_cuda_driver.py``: kernels load without NVRTC, launches run
nothing), collected by ``test_cuda_sdpa_fake.py`` in a fresh process. A layout's first call
makes the plan (the rule, a launch from Python); later calls are launched by the eval loop
from C, with no cuBLAS call. The values: the launch's packed words (pointers, N, K, the
weight's row stride, the batch strides) after each call are decoded and given to the C
build of the same kernel text, whose result at the output pointer is checked against
float64 numpy: a wrong pointer, stride or length in the words gives a wrong answer. Other
layouts (M > 1, a weight read row-major, AddMM) keep the cuBLAS GEMM."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cublas
import fake_cuda_driver
import tapescope.core as mx
from tapescope.kernels.codegen import gemv_cuda
from tapescope.kernels.cpu import compiler
from tapescope.kernels.cuda import gemm
from tapescope.kernels.cuda.primitive_plans import KernelPlan

from conftest import sweep
from sdpa_inputs import NPD

MXD = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}

pytestmark = pytest.mark.usefixtures("gpu_default_device")  # (conftest.py's)


@st.composite
def rows(draw):
    dtype = draw(st.sampled_from(list(MXD)))
    K = draw(st.sampled_from([1, 3, 8, 64, 200]))
    N = draw(st.sampled_from([1, 5, 8, 64, 130]))
    batch = draw(st.sampled_from(["one", "w_broadcast", "both_batched", "x_sliced"]))
    return dtype, K, N, batch, draw(st.integers(0, 2 ** 16))


def _rounded(a, dtype):
    """``a`` as the dtype stores it, in float64 (the reference's operands)."""
    return a.astype(NPD[dtype]).astype(np.float64)


def _ptr(a) -> int:
    return int(a._d.data.data.ptr)


def _host(a) -> np.ndarray:
    d = a._d.data
    if a.dtype == mx.bfloat16:
        return np.asarray(d.raw.get()).view(NPD["bfloat16"]).astype(np.float64)
    return np.asarray(d.get()).astype(np.float64)


def _plan_writing(out_ptr: int) -> KernelPlan:
    tid = threading.get_ident()
    for p in gemm.RULES["Matmul"].plans.values():
        if isinstance(p, KernelPlan) and tid in p.packs and p.packs[tid][0][p.n_out_at] == out_ptr:
            return p
    raise AssertionError("no gemv plan wrote this call's output")


def _run_on_cpu(plan) -> None:
    """The C build of the plan's kernel over its packed words as they are (the stand-in's
    device pointers are host addresses)."""
    spec = plan.entry.tape
    vals = plan.packs[threading.get_ident()][0]
    args = [int(vals[plan.offsets[i]]) for i in range(len(spec.params()))]
    entry = compiler.get_kernel(spec.name, spec.layout, lambda tc: gemv_cuda.c_source(spec),
                                key="gemv_c:" + spec.name)
    argv = (ctypes.c_void_p * len(args))(*args)
    entry.fast_fn(gil=True)(argv)


def _operands(c):
    dtype, K, N, batch, seed = c
    rng = np.random.default_rng(seed)
    t = MXD[dtype]
    nb = 3 if batch in ("w_broadcast", "both_batched") else 1
    x = _rounded(rng.standard_normal((nb, 1, K)), dtype)
    w = _rounded(rng.standard_normal((nb if batch == "both_batched" else 1, N, K)), dtype)
    if batch == "x_sliced":  # a row of a wider buffer, 8 bytes in: no 16-byte vectors
        wide = np.zeros((nb, 1, K + 5))
        wide[..., 2:2 + K] = x
        xa = mx.array(wide, dtype=t)[..., 2:2 + K]
    else:
        xa = mx.array(x, dtype=t)
    wa = mx.array(w if batch == "both_batched" else w[0], dtype=t)
    mx.eval(xa, wa)
    w_t = mx.swapaxes(wa, -1, -2)  # nn.Linear's w.T: the weight's rows unit-stride along K
    if batch == "w_broadcast":  # one weight for every batch entry (batch stride 0)
        w_t = mx.broadcast_to(w_t, (nb, K, N))
    want = x @ np.swapaxes(w, -1, -2)
    return xa, w_t, want


@settings(max_examples=sweep(30, 20), deadline=None)
@given(rows())
def test_one_row_times_a_transposed_weight_is_the_gemv_launched_from_c(c):
    dtype = c[0]
    xa, w_t, want = _operands(c)
    gemm.RULES["Matmul"].plans.clear()  # (an earlier example's plan may own this output's memory)
    g0 = fake_cublas.CALLS[0]
    seen = set()
    for run in range(3):  # the first makes the plan (the rule: a Python launch), then C
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = xa @ w_t
        mx.eval(out)
        assert out.dtype == MXD[dtype] and out.shape == want.shape
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        assert (c1 - c0 + p1 - p0) == 1
        if run:
            assert (c1 - c0, p1 - p0) == (1, 0)
        plan = _plan_writing(_ptr(out))
        assert plan.entry.tape == gemv_cuda.GemvSpec(dtype)
        _run_on_cpu(plan)
        tol = TOL[dtype]
        np.testing.assert_allclose(_host(out), want, rtol=tol,
                                   atol=tol * max(1.0, np.abs(want).max()), err_msg=str((c, run)))
        seen.add(id(plan))
    assert len(seen) == 1  # one plan for the layout, made once
    assert fake_cublas.CALLS[0] == g0  # no GEMM


def test_more_rows_a_row_major_weight_and_addmm_keep_the_gemm():
    fake_cuda_driver.run_fused_tapes()  # (AddMM's c is copied by its kernel, from C, first)
    rng = np.random.default_rng(0)
    x2 = mx.array(rng.standard_normal((2, 16)).astype(np.float32))
    x1 = mx.array(rng.standard_normal((1, 16)).astype(np.float32))
    w = mx.array(rng.standard_normal((8, 16)).astype(np.float32))
    wr = mx.array(rng.standard_normal((16, 8)).astype(np.float32))
    c = mx.array(rng.standard_normal((8,)).astype(np.float32))
    mx.eval(x2, x1, w, wr, c)
    for f, want in [(lambda: x2 @ w.T, np.asarray(x2) @ np.asarray(w).T),
                    (lambda: x1 @ wr, np.asarray(x1) @ np.asarray(wr)),
                    (lambda: mx.addmm(c, x1, w.T), np.asarray(c) + np.asarray(x1) @ np.asarray(w).T)]:
        g0 = fake_cublas.CALLS[0]
        for _ in range(2):
            out = f()
            mx.eval(out)
        assert fake_cublas.CALLS[0] - g0 == 2  # (cuBLAS computes in the stand-in: values)
        np.testing.assert_allclose(_host(out), want, rtol=2e-5, atol=2e-5)


def test_the_kernels_tab_shows_the_gemv_kernel_in_cuda_and_c():
    spec = gemv_cuda.GemvSpec("bfloat16")
    src = spec.sources({})
    assert "__shfl_xor_sync" in src["cuda"] and "__nv_bfloat16" in src["cuda"]
    assert "void gemv_t_bfloat16(void** args)" in src["cpu"]
