"""The eval loop's fast lane for a fused call whose kernel is loaded (``Launch.call``
straight into the output buffer) keeps MLX's semantics: the call's outputs stay lazy until
``eval`` (the graph says so), memory counters move only at ``eval``, the kernel runs inside
the eval on the timeline, errors raised at run time appear at ``eval``, donation still
hands an input's buffer to the output, and the values are numpy's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope
import tapescope.core as mx
from tapescope.kernels import timeline
from tapescope.kernels.cpu import compiler

pytestmark = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")


def _warm(f, *xs):
    """Call once so that the kernel for these layouts is built and its launch plan made."""
    mx.eval(f(*xs))


def test_outputs_stay_lazy_and_memory_moves_only_at_eval():
    f = mx.compile(lambda x, y: 2 * x + 3 * y - x * y)
    xn = np.linspace(-1, 1, 4096, dtype=np.float32)
    x, y = mx.array(xn), mx.array(xn[::-1].copy())
    _warm(f, x, y)
    mx.eval(x, y)
    before = mx.get_active_memory()
    out = f(x, y)
    assert out._d.node is not None and out._d.node.primitive.name == "Compiled"
    g = tapescope.graph_of(out)
    assert not next(v for v in g.values if v.id in g.outputs).evaluated
    assert mx.get_active_memory() == before
    mx.eval(out)
    assert out._d.node is None
    assert mx.get_active_memory() == before + 4096 * 4
    np.testing.assert_array_equal(np.array(out), 2 * xn + 3 * xn[::-1] - xn * xn[::-1])


def test_the_kernel_runs_inside_the_eval_on_the_timeline():
    f = mx.compile(lambda x: mx.exp(x) * 2 + 1)
    x = mx.array(np.linspace(-1, 1, 64, dtype=np.float32))
    _warm(f, x)
    with tapescope.record():
        seq = timeline.next_seq()
        out = f(x)
        calls = timeline.records_since(seq)
        mx.eval(out)
        recs = timeline.records_since(seq)
    assert not [r for r in calls if r.kind.startswith(("kernel", "eval", "primitive"))]
    kinds = [r.kind for r in recs]
    begin, end = kinds.index("eval_begin"), kinds.index("eval_end")
    launch = kinds.index("kernel_launch")
    assert begin < launch < end
    assert [r.detail["tier"] for r in recs if r.kind == "kernel_launch"] == ["kernel"]
    assert "Compiled" in [r.name for r in recs if r.kind == "primitive"]


def test_run_time_errors_appear_at_eval(monkeypatch):
    """An allocation that fails (simulated: the device's memory made smaller than the
    output) fails at ``eval``, not at the call, and the array stays lazy for a later eval."""
    from tapescope.kernels.allocator import allocator

    f = mx.compile(lambda x: x * 2 + 1)
    x = mx.array(np.ones(1 << 16, np.float32))
    _warm(f, x)
    mx.eval(x)
    out = f(x)  # recording the call allocates nothing, so it cannot fail
    mx.clear_cache()
    monkeypatch.setattr(allocator("cpu"), "total_memory", 1024)
    with pytest.raises(RuntimeError, match=r"\[malloc\] Unable to allocate"):
        mx.eval(out)
    monkeypatch.undo()
    assert out._d.node is not None
    mx.eval(out)
    np.testing.assert_array_equal(np.array(out), np.full(1 << 16, 3, np.float32))


def test_a_donated_input_buffer_becomes_the_output():
    f = mx.compile(lambda x: mx.exp(x) - 1)
    _warm(f, mx.array(np.zeros(1024, np.float32)))
    x = mx.array(np.linspace(0, 1, 1024, dtype=np.float32)) + 0  # a temporary nobody holds
    mx.eval(x)
    buf = x._d.buffer.buffer
    out = f(x)
    del x
    mx.eval(out)
    assert out._d.buffer.buffer is buf
    np.testing.assert_allclose(np.array(out), np.expm1(np.linspace(0, 1, 1024, dtype=np.float32)),
                               rtol=2e-6, atol=1e-7)


@settings(max_examples=20, deadline=None)
@given(n=st.sampled_from([1, 3, 16, 1000]), seed=st.integers(0, 2 ** 16), transpose=st.booleans())
def test_repeated_calls_equal_numpy(n, seed, transpose):
    """Calls after the first (the fast lane) give numpy's values, contiguous or not."""
    rng = np.random.default_rng(seed)
    f = _F
    for _ in range(3):
        xn = rng.uniform(-2, 2, (n, 4)).astype(np.float32)
        yn = rng.uniform(-2, 2, (4, n) if transpose else (n, 4)).astype(np.float32)
        y = mx.array(yn)
        if transpose:
            y = mx.transpose(y)
            yn = yn.T
        out = f(mx.array(xn), y)
        np.testing.assert_allclose(np.array(out), xn * yn - np.maximum(xn, yn) + 0.5,
                                   rtol=1e-6, atol=1e-6)


_F = mx.compile(lambda x, y: x * y - mx.maximum(x, y) + 0.5)
