"""The reduction primitives as generated CUDA on an NVIDIA GPU (kernels/cuda/reductions.py):
Reduce, ArgReduce, Softmax, LogSumExp and the scans on ``mx.gpu`` against float64 numpy on
the host, over shapes around the kernels' thresholds (warps of 32, blocks of 256, 2^16 + 3,
rows of 1 and of 2^20), dtypes and layouts; each case checks that a CUDA kernel ran. Skips
unless ``TAPESCOPE_CUDA=1`` with CuPy and a GPU (``tests/run_gpu_suites.sh`` part
``cuda_runtime``).
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import given, settings, strategies as st
import pytest

import tapescope.core as mx
from tapescope.kernels import backends

from conftest import kernel_launches

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="the CUDA runtime needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")

SIZES = [1, 31, 32, 33, 255, 256, 257, 1000, (1 << 16) + 3]


def on_gpu(x: np.ndarray):
    return mx.add(mx.array(x), 0, stream=mx.gpu)


def close(got, want, tol=2e-5, n=1):
    g = np.asarray(got.astype(mx.float32) if got.dtype == mx.float16 else got).astype(np.float64)
    t = tol * max(1.0, n / 64)
    np.testing.assert_allclose(g, want, rtol=t, atol=t * max(1.0, np.abs(want).max(initial=0)),
                               equal_nan=True)


@pytest.mark.parametrize("cols", SIZES)
@pytest.mark.parametrize("rows", [1, 3, 257])
def test_row_and_column_reductions_match_numpy(rows, cols):
    x = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32)
    x64 = x.astype(np.float64)
    a = on_gpu(x)
    with kernel_launches("cuda") as rec:
        outs = [mx.sum(a, axis=-1), mx.max(a, axis=-1), mx.sum(a, axis=0), mx.min(a, axis=0),
                mx.argmax(a, axis=-1), mx.argmin(a, axis=0), mx.sum(a), mx.prod(a[:, :8], axis=-1)]
        mx.eval(*outs)
    close(outs[0], x64.sum(-1), n=cols)
    close(outs[1], x64.max(-1))
    close(outs[2], x64.sum(0), n=rows)
    close(outs[3], x64.min(0))
    np.testing.assert_array_equal(np.asarray(outs[4]), x.argmax(-1))
    np.testing.assert_array_equal(np.asarray(outs[5]), x.argmin(0))
    close(outs[6], x64.sum(), n=rows * cols)
    close(outs[7], x64[:, :8].prod(-1))
    # a reduction over axes of size 1 is a copy in MLX (ops.cpp, compute_reduce_shape's
    # is_noop: an astype, no Reduce primitive, so no kernel): Max over cols == 1, Min over
    # rows == 1; argmax / argmin likewise
    want = ({"Sum"} if rows * cols > 1 else set()) | ({"Max"} if cols > 1 else set()) | (
        {"Min"} if rows > 1 else set()) | ({"ArgReduce"} if max(rows, cols) > 1 else set())
    assert want <= rec.primitives, rec.fallbacks
    no_op = {"Max"} if cols == 1 else {"Min"} if rows == 1 else set()
    assert not no_op & rec.primitives, rec.primitives


@pytest.mark.parametrize("dtype", ["float16", "int32", "int8", "uint8", "bool", "int64", "float64"])
def test_reduce_dtypes_match_numpy(dtype):
    rng = np.random.default_rng(0)
    x = (rng.random((33, 300)) < 0.5) if dtype == "bool" else (
        rng.integers(-3, 4, (33, 300)).astype(dtype) if "int" in dtype
        else rng.standard_normal((33, 300)).astype(dtype))
    a = on_gpu(x)
    x64 = x.astype(np.float64)
    with kernel_launches("cuda") as rec:
        s, m, al, an = mx.sum(a, axis=-1), mx.max(a, axis=0), mx.all(a, axis=-1), mx.any(a, axis=0)
        mx.eval(s, m, al, an)
    close(s, x64.sum(-1), tol=2e-3 if dtype == "float16" else 1e-6)
    close(m, x64.max(0))
    np.testing.assert_array_equal(np.asarray(al), x64.all(-1))
    np.testing.assert_array_equal(np.asarray(an), x64.any(0))
    assert {"Sum", "Max", "And", "Or"} <= rec.primitives, rec.fallbacks


def test_general_and_strided_layouts_match_numpy():
    x = np.random.default_rng(3).standard_normal((4, 5, 6, 7)).astype(np.float32)
    a = on_gpu(x)
    x64 = x.astype(np.float64)
    t = mx.transpose(a, (2, 0, 3, 1))
    with kernel_launches("cuda") as rec:
        outs = [mx.sum(a, axis=(0, 2)), mx.max(t, axis=(1, 3)), mx.sum(a[:, ::2], axis=-1),
                mx.argmax(t, axis=1)]
        mx.eval(*outs)
    close(outs[0], x64.sum((0, 2)))
    close(outs[1], np.transpose(x64, (2, 0, 3, 1)).max((1, 3)))
    close(outs[2], x64[:, ::2].sum(-1))
    np.testing.assert_array_equal(np.asarray(outs[3]), np.transpose(x, (2, 0, 3, 1)).argmax(1))
    assert {"Sum", "Max", "ArgReduce"} <= rec.primitives, rec.fallbacks


@pytest.mark.parametrize("cols", SIZES + [1 << 20])
def test_softmax_and_logsumexp_match_float64(cols):
    rows = 1 if cols >= 1 << 16 else 5
    x = np.random.default_rng(cols).standard_normal((rows, cols)).astype(np.float32)
    x64 = x.astype(np.float64)
    m = x64.max(-1, keepdims=True)
    e = np.exp(x64 - m)
    a = on_gpu(x)
    with kernel_launches("cuda") as rec:
        sm, lse = mx.softmax(a, axis=-1), mx.logsumexp(a, axis=-1)
        pr = mx.softmax(a.astype(mx.float16), axis=-1, precise=True)
        mx.eval(sm, lse, pr)
    close(sm, e / e.sum(-1, keepdims=True), n=cols / 16)
    close(lse, (m + np.log(e.sum(-1, keepdims=True)))[:, 0], n=cols / 16)
    xh = x.astype(np.float16).astype(np.float64)
    eh = np.exp(xh - xh.max(-1, keepdims=True))
    close(pr, eh / eh.sum(-1, keepdims=True), tol=2e-3)
    assert {"Softmax", "LogSumExp"} <= rec.primitives, rec.fallbacks


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse,inclusive", [(False, True), (True, False)])
def test_scans_match_numpy(axis, reverse, inclusive):
    x = np.random.default_rng(4).standard_normal((33, 257)).astype(np.float32)
    a = on_gpu(x)
    x64 = np.flip(x.astype(np.float64), axis) if reverse else x.astype(np.float64)
    with kernel_launches("cuda") as rec:
        s = mx.cumsum(a, axis=axis, reverse=reverse, inclusive=inclusive)
        m = mx.cummax(a, axis=axis, reverse=reverse, inclusive=True)
        mx.eval(s, m)
    want = np.cumsum(x64, axis)
    if not inclusive:
        want = np.concatenate([np.zeros_like(np.take(want, [0], axis)),
                               np.take(want, np.arange(x.shape[axis] - 1), axis)], axis)
    want_m = np.maximum.accumulate(x64, axis)
    if reverse:
        want, want_m = np.flip(want, axis), np.flip(want_m, axis)
    close(s, want, tol=1e-4, n=x.shape[axis])
    close(m, want_m)
    assert {"CumSum", "CumMax"} <= rec.primitives, rec.fallbacks


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "cummax", "cummin"])
@pytest.mark.parametrize("shape,axis", [((2,), None), ((3, 65), 1), ((65, 3), 0)])
def test_exclusive_scans_of_a_donated_input_match_numpy(name, shape, axis):
    """The input is a temporary the evaluator may give the scan as its output (donation):
    an exclusive scan stores out[c] before it folds x[c], so the kernel must not write into
    its input's memory (its buffers are __restrict__)."""
    x = np.random.default_rng(7).integers(-3, 4, size=shape).astype(np.float32)
    for reverse in (False, True):
        with kernel_launches("cuda") as rec:
            got = getattr(mx, name)(on_gpu(x), axis, reverse=reverse, inclusive=False)
            mx.eval(got)
        v = x.reshape(-1) if axis is None else x
        ax = 0 if axis is None else axis
        f = {"cumsum": np.add, "cumprod": np.multiply, "cummax": np.maximum,
             "cummin": np.minimum}[name]
        ident = {"cumsum": 0.0, "cumprod": 1.0, "cummax": -np.inf, "cummin": np.inf}[name]
        w = np.flip(v, ax) if reverse else v
        acc = f.accumulate(w.astype(np.float64), ax)
        want = np.concatenate([np.full_like(np.take(acc, [0], ax), ident),
                               np.take(acc, np.arange(w.shape[ax] - 1), ax)], ax)
        want = np.flip(want, ax) if reverse else want
        np.testing.assert_array_equal(np.asarray(got), want)
        assert {"CumSum", "CumProd", "CumMax", "CumMin"} & rec.primitives, rec.fallbacks


def test_extended_fusion_runs_a_reduction_tape_as_one_cuda_kernel():
    import tapescope

    def softmax(x):
        e = mx.exp(x - mx.max(x, axis=-1, keepdims=True))
        return e / mx.sum(e, axis=-1, keepdims=True)

    def var_first(x):
        mu = mx.mean(x, axis=0, keepdims=True)
        return mx.mean(mx.square(x - mu), axis=0)

    x = np.random.default_rng(6).standard_normal((300, 1000)).astype(np.float32)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    old = tapescope.fusion_mode()
    tapescope.set_fusion("extended")
    try:
        a = on_gpu(x)
        from tapescope.kernels import timeline

        timeline.set_recording(True)
        seq = timeline.next_seq()
        try:
            s, v = mx.compile(softmax)(a), mx.compile(var_first)(a)
            mx.eval(s, v)
        finally:
            recs = timeline.records_since(seq)
            timeline.set_recording(False)
    finally:
        tapescope.set_fusion(old)
    close(s, e / e.sum(-1, keepdims=True))
    close(v, x64.var(0), tol=1e-4)
    fused = [r for r in recs if r.kind == "kernel_launch" and r.detail.get("runtime") == "cuda"
             and str(r.detail.get("variant", "")).startswith("reduce_")]
    assert len(fused) == 2, [(r.kind, r.name, r.detail) for r in recs][-10:]


def test_a_planned_call_is_launched_by_the_loop_in_c(monkeypatch):
    """A reduction's or fast primitive's second call of a layout runs from the plan its
    first call made (``cuda/primitive_plans.py``), launched by the eval loop in C: no
    Python rule runs, the results equal the first call's and float64 numpy's, the timeline
    records the same kernel launches, and a cleared kernel cache drops the plans."""
    from tapescope.core import evaluate
    from tapescope.kernels import backends as bk, kernel_call, timeline

    be = bk.backend("gpu")
    if be.device_api is None:
        pytest.skip("no C launch here (the CUDA driver is not loaded)")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((37, 301)).astype(np.float32)
    w = rng.standard_normal(301).astype(np.float32)
    r4 = rng.standard_normal((2, 3, 9, 64)).astype(np.float32)
    off = np.array([5, 2], np.int32)
    a, wd, r, od = on_gpu(x), on_gpu(w), on_gpu(r4), mx.add(mx.array(off), 0, stream=mx.gpu)
    at = mx.transpose(a)

    def calls():
        return [mx.sum(a, axis=-1), mx.max(at, axis=0), mx.softmax(a, axis=-1),
                mx.logsumexp(a, axis=-1), mx.argmax(a, axis=-1), mx.cumsum(a, axis=-1),
                mx.fast.rms_norm(a, wd, 1e-5), mx.fast.layer_norm(a, wd, wd, 1e-5),
                mx.fast.rope(r, 64, traditional=False, base=1e4, scale=1.0, offset=od)]

    first = calls()
    mx.eval(*first)
    first = [np.asarray(v) for v in first]
    ran_python = []
    real_call = kernel_call.KernelRule.__call__

    def python_call(self, *args, **kw):
        ran_python.append(self.name)
        return real_call(self, *args, **kw)

    monkeypatch.setattr(kernel_call.KernelRule, "__call__", python_call)
    evaluate.reset_dispatch_counts()
    with kernel_launches("cuda") as rec:
        again = calls()
        mx.eval(*again)
    assert ran_python == [], ran_python  # every call from its plan, in C
    assert evaluate.dispatch_counts()["rule_out"] >= 9
    for got, want in zip(again, first):
        np.testing.assert_array_equal(np.asarray(got), want)
    x64 = x.astype(np.float64)
    close(again[0], x64.sum(-1), n=301)
    close(again[1], x64.max(-1))
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    close(again[2], e / e.sum(-1, keepdims=True))
    np.testing.assert_array_equal(np.asarray(again[4]), x.argmax(-1))
    close(again[5], np.cumsum(x64, -1), n=301)
    assert {"Sum", "Max", "Softmax", "LogSumExp", "ArgReduce", "CumSum", "RMSNorm", "LayerNorm",
            "RoPE"} <= rec.primitives, rec.fallbacks
    # the same path while recording: each plan's device time is on the timeline
    work = {r.name for r in timeline.records_since(rec.seq) if r.kind == "gpu_work"}
    assert {"Sum", "RMSNorm", "RoPE"} <= work, work
    tapescope_clear()
    mx.eval(mx.sum(a, axis=-1))
    assert "Sum" in ran_python  # the plans went with the kernels: the rule ran again


def tapescope_clear():
    import tapescope

    tapescope.clear_kernel_cache()


def test_two_pass_reductions_are_one_planned_sequence_launched_from_c(monkeypatch):
    """A column reduction split over the grid (its splits, then their merge: MLX's
    col_reduce_two_pass) and an ``all`` reduction (its parts, then their merge) are planned
    at their first call as one sequence of launches (``primitive_plans.PlanSequence``);
    later calls of those layouts are issued by the eval loop in C, every launch of the
    sequence on the node's stream, no Python rule running, the results float64 numpy's on a
    second stream as on the first (each stream its own scratch buffer)."""
    from tapescope.kernels import backends as bk, kernel_call
    from tapescope.kernels.common import reductions as plan

    be = bk.backend("gpu")
    if be.device_api is None:
        pytest.skip("no C launch here (the CUDA driver is not loaded)")
    from tapescope.kernels.cuda import _driver

    x = np.random.default_rng(12).standard_normal((4096, 130)).astype(np.float32)
    x64 = x.astype(np.float64)
    assert plan.col_splits(130, 4096) > 1  # the first axis is reduced in splits
    a = on_gpu(x)
    s2 = mx.new_stream(mx.gpu)

    def calls():
        return [mx.sum(a, axis=0), mx.max(a, axis=0), mx.sum(a), mx.min(a),
                mx.sum(a, axis=0, stream=s2), mx.sum(a, stream=s2)]

    def check(outs):
        close(outs[0], x64.sum(0), n=4096)
        close(outs[1], x64.max(0))
        close(outs[2], x64.sum(), n=x.size)
        close(outs[3], x64.min())
        close(outs[4], x64.sum(0), n=4096)
        close(outs[5], x64.sum(), n=x.size)

    first = calls()
    mx.eval(*first)
    check(first)
    ran_python = []
    real_call = kernel_call.KernelRule.__call__

    def python_call(self, *args, **kw):
        ran_python.append(self.name)
        return real_call(self, *args, **kw)

    monkeypatch.setattr(kernel_call.KernelRule, "__call__", python_call)
    for _ in range(2):
        n0 = _driver.stats()["launches"]
        again = calls()
        mx.eval(*again)
        assert ran_python == [], ran_python
        assert _driver.stats()["launches"] - n0 == 2 * len(again)  # two launches a call
        check(again)


def test_an_extended_fusion_reduction_tape_is_launched_from_its_plan_in_c(monkeypatch):
    """Extended fusion's softmax and cross-entropy (one reduction-tape kernel each): the
    first call of a layout leaves its launch plan on the tape; later calls are launched by
    the eval loop in C (``run_reduction`` does not run), their results float64 numpy's."""
    import tapescope
    from tapescope.kernels import backends as bk
    from tapescope.kernels.cuda import fused_reduction

    if bk.backend("gpu").device_api is None:
        pytest.skip("no C launch here (the CUDA driver is not loaded)")

    def softmax(v):
        e = mx.exp(v - mx.max(v, axis=-1, keepdims=True))
        return e / mx.sum(e, axis=-1, keepdims=True)

    def xent(v, w):
        m = mx.max(v, axis=-1, keepdims=True)
        lse = mx.log(mx.sum(mx.exp(v - m), axis=-1, keepdims=True)) + m
        return mx.sum(w * (lse - v), axis=-1)

    rng = np.random.default_rng(13)
    x = rng.standard_normal((300, 1000)).astype(np.float32)
    t = rng.random((300, 1000)).astype(np.float32)
    x64, t64 = x.astype(np.float64), t.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    lse = np.log(e.sum(-1, keepdims=True)) + x64.max(-1, keepdims=True)
    old = tapescope.fusion_mode()
    tapescope.set_fusion("extended")
    try:
        a, b = on_gpu(x), on_gpu(t)
        sm, xe = mx.compile(softmax), mx.compile(xent)
        got = [sm(a), xe(a, b)]
        mx.eval(*got)
        ran = []
        real = fused_reduction.run_reduction
        monkeypatch.setattr(fused_reduction, "run_reduction",
                            lambda *args, **kw: ran.append(1) or real(*args, **kw))
        for _ in range(2):
            again = [sm(a), xe(a, b)]
            mx.eval(*again)
            assert ran == []
            close(again[0], e / e.sum(-1, keepdims=True))
            close(again[1], (t64 * (lse - x64)).sum(-1), tol=1e-4, n=1000)
    finally:
        tapescope.set_fusion(old)
    close(got[0], e / e.sum(-1, keepdims=True))


def _bf16_within(got, want, scale, n):
    """Within one rounding to bfloat16 of the float64 result (2^-8 relative) plus float32
    accumulation (2^-22 x n of the terms' magnitude ``scale``)."""
    g = np.asarray(got.astype(mx.float32)).astype(np.float64)
    bound = 2.0 ** -8 * np.abs(want) + 2.0 ** -22 * max(n, 1) * np.asarray(scale)
    bad = ~(np.abs(g - want) <= bound)
    assert not bad.any(), (g[bad][:5], np.broadcast_to(want, g.shape)[bad][:5])


def _bf16_grid_ops(x, off):
    """benchmarks/reductions.py's six ops of bfloat16 rows (sliced ``off`` elements in: a
    row starting off a 16-byte boundary) on the GPU against float64 numpy."""
    import ml_dtypes

    v = x[:, off:]
    w = v.astype(np.float64)
    rows, cols = v.shape
    a = on_gpu(x)
    assert a.dtype == mx.bfloat16
    s = a[:, off:]
    with kernel_launches("cuda") as rec:
        outs = [mx.sum(s, axis=-1), mx.max(s, axis=-1), mx.sum(s, axis=0), mx.argmax(s, axis=-1),
                mx.logsumexp(s, axis=-1), mx.softmax(s, axis=-1)]
        mx.eval(*outs)
    assert all(o.dtype == mx.bfloat16 for i, o in enumerate(outs) if i != 3)
    _bf16_within(outs[0], w.sum(-1), np.abs(w).sum(-1), cols)
    np.testing.assert_array_equal(np.asarray(outs[1].astype(mx.float32)), w.max(-1))
    _bf16_within(outs[2], w.sum(0), np.abs(w).sum(0), rows)
    np.testing.assert_array_equal(np.asarray(outs[3]), w.argmax(-1))
    m = w.max(-1, keepdims=True)
    e = np.exp(w - m)
    lse = (m + np.log(e.sum(-1, keepdims=True)))[:, 0]
    _bf16_within(outs[4], lse, np.maximum(np.abs(lse), 1.0), cols)
    _bf16_within(outs[5], e / e.sum(-1, keepdims=True), 1.0, cols)
    assert {"Sum", "Max", "ArgReduce", "LogSumExp", "Softmax"} <= rec.primitives, rec.fallbacks
    assert x.dtype == np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("cols", [1, 8, 9, 128, 1000, 4096, 8193, 32768])
@pytest.mark.parametrize("off", [0, 3])
def test_bfloat16_grid_ops_match_float64(cols, off):
    import ml_dtypes

    rows = 3 if cols > 8193 else 37
    x = (np.random.default_rng(cols + off).standard_normal((rows, cols + off)) * 3).astype(
        ml_dtypes.bfloat16)
    _bf16_grid_ops(x, off)


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 70), cols=st.integers(1, 9000), off=st.integers(0, 7),
       seed=st.integers(0, 2 ** 16))
def test_bfloat16_grid_ops_of_random_shapes_match_float64(rows, cols, off, seed):
    import ml_dtypes

    x = np.random.default_rng(seed).standard_normal((rows, cols + off)).astype(ml_dtypes.bfloat16)
    _bf16_grid_ops(x, off)
