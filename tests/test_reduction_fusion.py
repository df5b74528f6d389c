"""Extended fusion (tapescope.set_fusion("extended")): reductions fused with the elementwise
work around them into one generated kernel. Values against float64 numpy references (within
what the summation order allows), the kernels run as C, MLX's fusion stays the default."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope
import tapescope.core as mx
from tapescope.core import fusion
from tapescope.kernels.codegen import reduction as kred
from tapescope.kernels.cpu.reduction import run_reduction

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(autouse=True)
def _restore_mode():
    before = fusion.fusion_mode()
    yield
    fusion.set_fusion(before)


def _np(a):
    if a.dtype == mx.bfloat16:  # numpy takes no bfloat16 buffer
        return np.array(a.astype(mx.float32)).astype(BF16)
    return np.array(a)


def _extended(f, *args):
    fusion.set_fusion("extended")
    return mx.compile(f)(*args)


def _kernels(f, *args):
    """(the traced graph's non-Compiled op names, its reduction tapes) in extended mode."""
    fusion.set_fusion("extended")
    g = tapescope.trace(f, *args)
    others = [op.primitive for op in g.ops if op.primitive != "Compiled"]
    return others, [k.tape for k in g.kernels if k.tape.reduction is not None]


def _ran_generated(tape) -> bool:
    """The tape ran as a generated kernel of the default device's runtime (the CPU's C, or
    CUDA with the GPU as default: TAPESCOPE_CUDA=1)."""
    from tapescope.kernels.backends import backend

    runtime = backend(mx.default_device()).name
    return any(e["name"].startswith(tape.lib_name) and e["runtime"] == runtime
               and not str(e["origin"]).startswith("fallback") for e in tapescope.kernel_cache())


def softmax(m, x):
    e = m.exp(x - m.max(x, axis=-1, keepdims=True))
    return e / m.sum(e, axis=-1, keepdims=True)


def layernorm(m, x, w, b):
    mu = m.mean(x, axis=-1, keepdims=True)
    v = m.var(x, axis=-1, keepdims=True)
    return (x - mu) / m.sqrt(v + 1e-5) * w + b


def _tol(dtype, cols, scale=1.0):
    eps = {np.dtype(np.float32): 1.2e-7, np.dtype(np.float16): 9.8e-4, BF16: 7.9e-3}[np.dtype(dtype)]
    return 8 * eps * scale * max(1, np.sqrt(cols))


# -- the default is MLX's fusion -----------------------------------------------------------

def test_default_mode_is_mlx_and_its_graph_is_unchanged():
    assert fusion.fusion_mode() == "mlx" or os.environ.get("TAPESCOPE_FUSION") == "extended"
    fusion.set_fusion("mlx")
    x = mx.array(np.ones((8, 16), np.float32))
    g = tapescope.trace(lambda x: softmax(mx, x), x)
    assert [op.primitive for op in g.ops] == ["Max", "Compiled", "Sum", "Compiled"]
    assert all(k.tape.reduction is None and "_R" not in k.tape.lib_name for k in g.kernels)


def test_set_fusion_checks_the_mode_and_the_environment_variable_sets_it():
    with pytest.raises(ValueError, match="Unknown fusion mode 'fast'"):
        tapescope.set_fusion("fast")
    tapescope.set_fusion("extended")
    assert tapescope.fusion_mode() == "extended"
    code = "import tapescope; print(tapescope.fusion_mode())"
    for val, want in (("extended", "extended"), ("", "mlx"), ("mlx", "mlx")):
        env = dict(os.environ, TAPESCOPE_FUSION=val)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == want


def test_the_compile_cache_is_keyed_by_the_mode():
    x = mx.array(np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32))
    f = mx.compile(lambda x: softmax(mx, x))
    fusion.set_fusion("mlx")
    a = np.array(f(x))
    fusion.set_fusion("extended")
    b = np.array(f(x))
    assert f.traces == 2
    progs = f.programs()
    assert sorted(sum(g.prim.name == "Compiled" for g in p.tape) for p in progs) == [1, 2]
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# -- the named workloads fuse into one kernel ----------------------------------------------

def test_softmax_and_layernorm_are_one_kernel_each_and_match_float64():
    rng = np.random.default_rng(1)
    xn = rng.standard_normal((96, 300)).astype(np.float32) * 3
    wn, bn = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    x, w, b = mx.array(xn), mx.array(wn), mx.array(bn)
    x64, w64, b64 = xn.astype(np.float64), wn.astype(np.float64), bn.astype(np.float64)
    for f, args, ref in (
            (lambda x: softmax(mx, x), (x,), softmax(np, x64)),
            (lambda x: mx.softmax(x * 2, axis=-1), (x,), softmax(np, 2 * x64)),
            (lambda x, w, b: layernorm(mx, x, w, b), (x, w, b), layernorm(np, x64, w64, b64))):
        others, tapes = _kernels(f, *args)
        assert others == [] and len(tapes) == 1
        got = np.array(_extended(f, *args), dtype=np.float64)
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
        assert _ran_generated(tapes[0])
    # mx.fast.layer_norm is MLX's LayerNorm primitive: its own kernel, not a fused tape
    f = lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5)  # noqa: E731
    others, tapes = _kernels(f, x, w, b)
    assert others == ["LayerNorm"] and tapes == []
    np.testing.assert_allclose(np.array(_extended(f, x, w, b), dtype=np.float64),
                               layernorm(np, x64, w64, b64), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "var", "logsumexp",
                                  "argmax", "argmin"])
@pytest.mark.parametrize("first", [False, True])
def test_each_reduction_with_work_before_and_after(name, first):
    rng = np.random.default_rng(2)
    xn = rng.uniform(-1.5, 1.5, (40, 24)).astype(np.float32)
    axis = 0 if first else -1
    if name in ("argmax", "argmin"):
        f = lambda m, x: getattr(m, name)(m.abs(x) * 2, axis=axis)  # noqa: E731
    elif name == "prod":
        f = lambda m, x: m.prod(1 + x * 0.1, axis=axis) - 1  # noqa: E731
    else:
        f = lambda m, x: getattr(m, name)(m.sin(x) * 3, axis=axis) * 2 + 1  # noqa: E731
    if name == "logsumexp" and first:
        pytest.skip("MLX's LogSumExp reduces the last axis (a first axis is a transpose first)")
    others, tapes = _kernels(lambda x: f(mx, x), mx.array(xn))
    assert len(tapes) == 1 and tapes[0].reduction.mode == ("first" if first else "last")
    got = np.array(_extended(lambda x: f(mx, x), mx.array(xn)))
    if name in ("argmax", "argmin"):
        np.testing.assert_array_equal(got, f(np, xn.astype(np.float64)))
    elif name == "logsumexp":
        from scipy.special import logsumexp as lse

        np.testing.assert_allclose(got, lse(np.sin(xn.astype(np.float64)) * 3, axis=-1) * 2 + 1,
                                   rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_allclose(got, f(np, xn.astype(np.float64)), rtol=2e-5, atol=2e-5)
    assert _ran_generated(tapes[0])


def test_nan_and_inf_follow_the_unfused_graph():
    xn = np.random.default_rng(3).standard_normal((6, 20)).astype(np.float32)
    xn[1, 4] = np.nan
    xn[2, :] = -np.inf
    xn[3, 7] = np.inf
    xn[4, 3] = xn[4, 9] = np.nan
    x = mx.array(xn)
    for f in (lambda x: mx.max(x * 2, axis=-1), lambda x: mx.min(x + 1, axis=-1),
              lambda x: mx.argmax(x * 1, axis=-1), lambda x: mx.argmin(x * 1, axis=-1),
              lambda x: mx.logsumexp(x * 1, axis=-1), lambda x: softmax(mx, x),
              lambda x: mx.sum(x * 2, axis=-1)):
        fusion.set_fusion("mlx")
        ref = np.array(f(x))
        got = np.array(_extended(f, x))
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_grad_vmap_and_check_of_a_fused_reduction():
    xn = np.random.default_rng(4).standard_normal((8, 16)).astype(np.float32)
    x = mx.array(xn)
    loss = lambda x: mx.logsumexp(softmax(mx, x) * 3, axis=-1).sum()  # noqa: E731
    fusion.set_fusion("mlx")
    ref = np.array(mx.grad(loss)(x))
    fusion.set_fusion("extended")
    got = np.array(mx.grad(mx.compile(loss))(x))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    v = np.array(mx.vmap(mx.compile(lambda r: softmax(mx, r)))(x))
    np.testing.assert_allclose(v, softmax(np, xn.astype(np.float64)), rtol=1e-5, atol=1e-7)
    assert tapescope.check(mx.compile(lambda x: softmax(mx, x * 2)), x).passed


def test_the_kernel_and_its_interpreter_agree_on_strided_inputs():
    rng = np.random.default_rng(5)
    xn = rng.standard_normal((30, 50)).astype(np.float32)
    _, tapes = _kernels(lambda x, w: softmax(mx, x * w), mx.array(xn[:, :20]),
                        mx.array(np.ones(20, np.float32)))
    tape = tapes[0]
    x = xn.T[:20].T  # a non-contiguous view (30, 20)
    w = rng.standard_normal(20).astype(np.float32)
    ins = [x if i == 0 else w for i in range(len(tape.inputs))]
    got = run_reduction(tape, ins, (30, 20))[0]
    ref = kred.interpret(tape, ins, (30, 20))[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


# -- hypothesis: shapes around vector widths and the threading threshold, axes, dtypes -----

_SIZES = st.sampled_from([1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 255, 257])
_DTYPES = st.sampled_from([np.float32, np.float16, BF16, np.int32])


@settings(max_examples=30, deadline=None)
@given(rows=_SIZES, cols=_SIZES, lead=st.sampled_from([(), (2,), (3,)]), first=st.booleans(),
       dtype=_DTYPES, op=st.sampled_from(["sum", "max", "min", "mean", "softmax", "argmax"]),
       seed=st.integers(0, 2**16))
def test_fused_reductions_match_float64(rows, cols, lead, first, dtype, op, seed):
    dtype = np.dtype(dtype)
    if dtype.kind == "i" and op in ("softmax", "mean"):
        op = "sum"
    shape = (cols, *lead, rows) if first else (*lead, rows, cols)
    axes = (0,) if first else (len(shape) - 1,)
    if first and op == "softmax":
        op = "max"
    rng = np.random.default_rng(seed)
    if dtype.kind == "i":
        xn = rng.integers(-50, 50, shape).astype(dtype)
    else:
        xn = rng.uniform(-2, 2, shape).astype(dtype)
    x = mx.array(xn)
    if op == "softmax":
        f = lambda m, x: softmax(m, x)  # noqa: E731
    elif op == "argmax":
        f = lambda m, x: m.argmax(m.abs(x), axis=axes[0])  # noqa: E731
    else:
        f = lambda m, x: getattr(m, op)(x * x - x, axis=axes)  # noqa: E731
    got = _np(_extended(lambda x: f(mx, x), x))
    fusion.set_fusion("mlx")
    unfused = _np(mx.compile(lambda x: f(mx, x))(x))
    if op == "argmax":
        np.testing.assert_array_equal(got, unfused)
        return
    x64 = xn.astype(np.float64)
    if dtype.kind == "f" or dtype == BF16:
        ref = f(np, x64) if op != "mean" else np.mean(x64 * x64 - x64, axis=axes)
        # the pre-op rounds to dtype in both graphs: the reference is the unfused graph's
        # inputs in float64, the tolerance the dtype's rounding over the reduced length
        n = shape[axes[0]]
        scale = np.max(np.abs(x64 * x64 - x64)) if op != "softmax" else 1.0
        tol = _tol(dtype, n, scale) * (n if op == "sum" else 1)
        np.testing.assert_allclose(got.astype(np.float64), ref, atol=tol, rtol=_tol(dtype, n))
        np.testing.assert_allclose(got.astype(np.float64), unfused.astype(np.float64),
                                   atol=tol, rtol=_tol(dtype, n))
    else:
        np.testing.assert_array_equal(got, unfused)
        np.testing.assert_array_equal(got, getattr(np, op)(xn * xn - xn, axis=axes).astype(got.dtype))


def test_threaded_rows_above_the_threshold():
    rng = np.random.default_rng(6)
    xn = rng.standard_normal((512, 300)).astype(np.float32)
    wn = rng.standard_normal(300).astype(np.float32)
    x, w = mx.array(xn), mx.array(wn)
    got = np.array(_extended(lambda x, w: layernorm(mx, x, w, w), x, w), dtype=np.float64)
    ref = layernorm(np, xn.astype(np.float64), wn.astype(np.float64), wn.astype(np.float64))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=2e-5)
    got = np.array(_extended(lambda x: mx.sum(x * 2, axis=0), x), dtype=np.float64)
    np.testing.assert_allclose(got, 2 * xn.astype(np.float64).sum(0), rtol=1e-4, atol=1e-4)


def test_the_picture_draws_fused_reductions_in_their_own_colour():
    from tapescope.viz import style as S

    x = mx.array(np.ones((8, 16), np.float32))
    fusion.set_fusion("extended")
    g = tapescope.trace(lambda x: mx.softmax(x * 2, axis=-1) + mx.exp(x), x)
    dot = g.to_dot()
    assert S.REDUCTION_CLUSTER.border in dot and S.GROUPS["fused reduction"].legend in dot
    assert [k.variant for k in g.kernels] == ["reduce_last"]
    fusion.set_fusion("mlx")
    dot = tapescope.trace(lambda x: mx.softmax(x * 2, axis=-1) + mx.exp(x), x).to_dot()
    assert S.REDUCTION_CLUSTER.border not in dot and "fused reduction" not in dot


def test_one_thread_policy_passive_waiting_unless_the_user_chose():
    code = ("import os, tapescope.core as mx; from tapescope.kernels.cpu.threads import policy; "
            "mx.eval(mx.compile(lambda a: a * 2 + 1)(mx.ones((1 << 17,)))); p = policy(); "
            "print(os.environ['OMP_WAIT_POLICY'], p['chosen_by'], p['gomp_loaded_before'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["PASSIVE", "tapescope", "False"]
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, OMP_WAIT_POLICY="ACTIVE"),
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["ACTIVE", "user", "False"]


def test_a_reduction_read_elsewhere_too_is_an_extra_output_and_no_cycle_is_made():
    xn = np.random.default_rng(7).standard_normal((24, 40)).astype(np.float32)
    x = mx.array(xn)

    def lse(x):  # the max is used inside (x - m) and outside (the Squeeze): one kernel reads x
        m = mx.max(x, axis=-1, keepdims=True)
        return mx.log(mx.sum(mx.exp(x - m), axis=-1)) + mx.squeeze(m, -1)

    others, tapes = _kernels(lse, x)
    assert len(tapes) == 1 and [op.primitive for op in tapes[0].ops][0] == "Max"
    assert len(tapes[0].outputs) == 2
    from scipy.special import logsumexp as ref_lse

    np.testing.assert_allclose(np.array(_extended(lse, x)), ref_lse(xn.astype(np.float64), -1),
                               rtol=1e-6, atol=1e-6)

    def around(x):  # sort(m) leaves the region and comes back: joining it would be a cycle
        m = mx.max(x, axis=-1, keepdims=True)
        z = mx.sort(m * 2, axis=0)
        return mx.sum(mx.exp(x - m) + z, axis=-1)

    fusion.set_fusion("mlx")
    ref = np.array(around(x))
    np.testing.assert_allclose(np.array(_extended(around, x)), ref, rtol=1e-5, atol=1e-5)
    others, tapes = _kernels(around, x)
    assert "Sort" in others and tapes


def test_blas_threads_follow_the_free_cores(monkeypatch):
    from tapescope.kernels.cpu import threads

    a = np.random.default_rng(8).standard_normal((96, 80)).astype(np.float32)
    ref = a.astype(np.float64) @ a.T.astype(np.float64)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert 1 <= threads.free_cores() <= (os.cpu_count() or 1)
    if not threads.blas_threads():
        pytest.skip("no OpenBLAS loaded in this process")
    before = threads.blas_threads()
    try:
        for free in (1, os.cpu_count() or 1):
            monkeypatch.setattr(threads, "free_cores", lambda free=free: free)
            threads.fit_blas_threads(force=True)
            assert set(threads.blas_threads()) == {free}
            got = np.array(mx.array(a) @ mx.array(a.T))  # the Matmul rule calls it too
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # the user's choice is kept
        monkeypatch.setattr(threads, "free_cores", lambda: 2)
        threads.fit_blas_threads(force=True)
        assert set(threads.blas_threads()) == {os.cpu_count() or 1}
    finally:
        for (set_n, _), n in zip(threads._blas["libs"], before):
            set_n(ctypes.c_int(n))
        threads._blas["n"] = None
