"""A GemmPlan launched from C (``kernels/cuda/_driver.c``: cublasSetStream_v2 and
cublasGemmStridedBatchedEx of the libcublas loaded, CuPy's handle; AddMM's ``c`` copied into
the output by its copy kernel's plan first) over the stand-in stack: ``fake_cupy.py``,
``fake_cublas.py`` (its ``fake_libcublas.c``: each C call's arguments computed in float64 by
the same code as the Python binding's) and ``fake_cuda_driver.py`` (the copy kernel's launch
interpreted: ``run_fused_tapes``). Collected by ``test_cuda_sdpa_fake.py`` in a fresh
process. Checked against float64 numpy over shapes, transposes, batches, dtypes, alpha /
beta and ``c``'s broadcasts; which path each call took (the stand-in library's count, the
Python binding's); the compute type by the TF32 switch; and that the MLP Adam step's GEMMs
enter no Python frame once planned."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cublas
import fake_cuda_driver
import tapescope
import tapescope.core as mx
from tapescope.kernels.cuda import _driver

from conftest import sweep
from cuda_gemm_fake_cases import DT, _operand, host  # (one stand-in operand maker)

fake_cuda_driver.run_fused_tapes()  # (AddMM's copy kernel computes: the GEMM adds beta c)

COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77

pytestmark = pytest.mark.usefixtures("gpu_default_device")  # (conftest.py's)


@st.composite
def products(draw):
    batch = draw(st.sampled_from([(), (1,), (3,)]))
    m, k, n = (draw(st.sampled_from([1, 2, 5, 16])) for _ in range(3))
    dtype = draw(st.sampled_from(list(DT)))
    layouts = [draw(st.sampled_from(["contiguous", "transposed", "sliced", "broadcast"]))
               for _ in range(2)]
    c = draw(st.sampled_from([None, "full", "row", "column"]))
    alpha = draw(st.sampled_from([1.0, 0.5]))
    beta = draw(st.sampled_from([0.0, 1.0, -2.0]))
    return batch, m, k, n, dtype, layouts, c, alpha, beta, draw(st.integers(0, 2 ** 16))


def _counts():
    return fake_cublas.c_gemms(), fake_cublas.PY_CALLS[0]


@settings(max_examples=sweep(60, 30), deadline=None)
@given(products())
def test_a_planned_gemm_is_one_c_call_matching_float64_numpy(case):
    batch, m, k, n, dtype, layouts, c, alpha, beta, seed = case
    rng = np.random.default_rng(seed)
    x, a = _operand(rng, batch + (m, k), dtype, layouts[0])
    y, b = _operand(rng, batch + (k, n), dtype, layouts[1])
    want = x @ y
    if c is not None:  # c broadcast as AddMM takes it: the output's shape, a row, a column
        shape = {"full": batch + (m, n), "row": (n,), "column": (m, 1)}[c]
        z, cc = _operand(rng, shape, dtype, "contiguous")
        want = alpha * want + beta * z
    elif alpha != 1.0:
        want = alpha * want
    tol = DT[dtype][1]
    in_place = "sliced" not in layouts
    for call in range(3):  # the first call plans; later ones take the plan
        before = _counts()
        if c is not None:
            out = mx.addmm(cc, a, b, alpha=alpha, beta=beta)
        else:
            out = a @ b if alpha == 1.0 else mx.multiply(a @ b, alpha)
        mx.eval(out)
        assert out.dtype == DT[dtype][0] and out.shape == want.shape
        c_calls, py_calls = (now - was for now, was in zip(_counts(), before))
        # one GEMM a call; none for a one-row product the gemv kernel takes (cuda/gemm.py:
        # its launch computes nothing over the stand-in, cuda_gemv_fake_cases.py checks it)
        assert c_calls + py_calls == 1 or (m == 1 and c is None and c_calls + py_calls == 0)
        if c_calls + py_calls:
            np.testing.assert_allclose(host(out), want, rtol=tol,
                                       atol=tol * max(1.0, k, np.abs(want).max(initial=0)))
        if call and in_place and dtype != "complex64" and c_calls + py_calls:
            assert (c_calls, py_calls) == (1, 0), "a planned GEMM went through Python"


def test_one_row_products_take_the_gemv_or_the_c_gemm():
    """A one-row product times a transposed weight is the gemv kernel (a C launch, no
    GEMM); times a row-major weight, a GEMM launched from C once planned."""
    rng = np.random.default_rng(1)
    x = mx.array(rng.standard_normal((1, 32)).astype(np.float32))
    w = mx.array(rng.standard_normal((24, 32)).astype(np.float32))
    v = mx.array(rng.standard_normal((32, 24)).astype(np.float32))
    want = host(x) @ host(v)
    for call in range(3):
        before = _counts()
        got = x @ w.T
        mx.eval(got)
        assert _counts() == before  # the gemv: no cuBLAS call (its values: the gemv cases)
        before = _counts()
        got = x @ v
        mx.eval(got)
        c_calls, py_calls = (now - was for now, was in zip(_counts(), before))
        assert (c_calls, py_calls) == ((1, 0) if call else (0, 1))
        np.testing.assert_allclose(host(got), want, rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_compute_type_follows_the_tf32_switch(dtype):
    """TF32 only for float32 and only while ``settings.tf32`` is on (read per call, as the
    Python path reads it); float16 / bfloat16 at float32 accumulation either way."""
    rng = np.random.default_rng(2)
    t = DT[dtype][0]
    a = mx.array(rng.standard_normal((6, 8)).astype(np.float32), dtype=t)
    b = mx.array(rng.standard_normal((8, 4)).astype(np.float32), dtype=t)
    seen = {}
    for on in (False, True, False):
        with tapescope.settings(tf32=on):
            for _ in range(2):
                before = _counts()
                mx.eval(a @ b)
            assert _counts()[0] - before[0] == 1
            seen.setdefault(on, set()).add(fake_cublas.LAST[0][21])
    assert seen[False] == {COMPUTE_32F}
    assert seen[True] == {COMPUTE_32F_FAST_TF32 if dtype == "float32" else COMPUTE_32F}


def test_declined_c_launch_runs_the_python_path_with_the_same_values():
    rng = np.random.default_rng(3)
    a = mx.array(rng.standard_normal((7, 5)).astype(np.float32))
    b = mx.array(rng.standard_normal((9, 5)).astype(np.float32))
    c = mx.array(rng.standard_normal((9,)).astype(np.float32))
    want = 0.5 * host(a) @ host(b).T + 3 * host(c)
    got = []
    for use in (True, False, True):
        _driver.use_cublas(use)
        try:
            before = _counts()
            out = mx.addmm(c, a, b.T, alpha=0.5, beta=3.0)
            mx.eval(out)
        finally:
            _driver.use_cublas(True)
        got.append(host(out))
        c_calls, py_calls = (now - was for now, was in zip(_counts(), before))
        if len(got) > 1:  # (the first planned)
            assert (c_calls, py_calls) == ((1, 0) if use else (0, 1))
    for g in got:
        np.testing.assert_allclose(g, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_the_c_launch_records_its_launch_while_the_timeline_records():
    from tapescope.kernels import timeline

    rng = np.random.default_rng(4)
    a = mx.array(rng.standard_normal((6, 8)).astype(np.float32))
    b = mx.array(rng.standard_normal((8, 4)).astype(np.float32))
    mx.eval(a @ b)
    timeline.set_recording(True)
    seq = timeline.next_seq()
    before = _counts()
    try:
        out = a @ b
        mx.eval(out)
    finally:
        recs = timeline.records_since(seq)
        timeline.set_recording(False)
    assert _counts()[0] - before[0] == 1
    np.testing.assert_allclose(host(out), host(a) @ host(b), rtol=2e-5,
                               atol=1e-4)
    launches = [r for r in recs if r.kind == "kernel_launch"
                and r.name == "cublas_gemm_strided_batched"]
    assert len(launches) == 1 and launches[0].detail["m"] == 6


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_mlp_steps_gemms_enter_no_python_frame(dtype, compiled):
    """The MLP Adam step (``benchmarks/cuda_eager.py``'s, batch 8): its 8 GEMMs a step
    launched from C, and no frame of ``cuda/gemm.py`` nor ``launch_fused`` entered."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent.parent / "benchmarks"))
    import cuda_eager as ce

    tapescope.as_mlx()
    import mlx.core as mlx_mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    # (the values are the GPU's to check: GEMMs counted only, fused launches run nothing)
    fake_cublas.compute(False)
    runner = fake_cuda_driver._RUNNER[0]
    fake_cuda_driver._lib[0].fake_set_runner(None)
    fake_cuda_driver._RUNNER[0] = None
    try:
        fns = ce.mlp_steps(mlx_mx, nn, optim, dtype, 8)
        f = next(v for k, v in fns.items() if ("compiled" in k) == compiled)
        for _ in range(3):
            f()
        entered = []

        def prof(frame, event, arg):
            if event == "call":
                code = frame.f_code
                if code.co_filename.endswith("cuda/gemm.py") or code.co_name == "launch_fused":
                    entered.append(code.co_name)

        before = _counts()
        sys.setprofile(prof)
        try:
            for _ in range(2):
                f()
        finally:
            sys.setprofile(None)
        c_calls, py_calls = (now - was for now, was in zip(_counts(), before))
    finally:
        fake_cublas.compute(True)
        fake_cuda_driver._RUNNER[0] = runner
        fake_cuda_driver._lib[0].fake_set_runner(ctypes.cast(runner, ctypes.c_void_p))
    assert (c_calls, py_calls) == (16, 0)
    assert not entered, entered
