"""The compiled-call fast path (signature-keyed entries, flattened replay plans) and the
cached kernel launch: same graph, same results, same recompilation rules as the full path."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapescope
import tapescope.core as mx
from conftest import requires_mlx
from tapescope.core.compile_trace import ReplayPlan, replay


def _graph(d, seen=None):
    """(primitive name, output shape, dtype, input graphs) of a lazy desc, recursively."""
    if d.node is None:
        return ("leaf", d.shape, d.dtype.name)
    return (d.node.primitive.name, d.shape, d.dtype.name, d.index,
            tuple(_graph(x) for x in d.node.inputs))


PROGRAMS = {
    "fused": lambda x, y: 2 * x + 3 * y - x * y,
    "two outputs": lambda x, y: (mx.exp(x) * y, mx.sum(x * y, axis=-1)),
    "reduction between": lambda x, y: mx.tanh(mx.sum(x * y, axis=0) + 1.0) * 2.0,
    "returns argument": lambda x, y: (x, y * 2.0),
    "returns constant": lambda x, y: (x + y, mx.array(3.0)),
    "dict output": lambda x, y: {"a": x - y, "b": [x * y, 1]},
    "single op": lambda x, y: x + y,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_fast_path_records_the_same_graph_as_replay(name):
    f = PROGRAMS[name]
    g = mx.compile(f)
    rng = np.random.default_rng(0)
    xn, yn = rng.uniform(-1, 1, (3, 4)).astype(np.float32), rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    x, y = mx.array(xn), mx.array(yn)
    first = g(x, y)  # traces (slow path)
    second = g(x, y)  # fast path
    (entry,) = g._fast.values()
    via_replay = replay(entry.program, [x._d, y._d])
    via_plan = ReplayPlan(entry.program).run([x._d, y._d])
    assert [_graph(d) for d in via_plan] == [_graph(d) for d in via_replay]
    flat = lambda t: [a for a in (t if isinstance(t, tuple) else  # noqa: E731
                                  [t["a"], t["b"][0]] if isinstance(t, dict) else [t])]
    ref = f(x, y)
    for a, b, r in zip(flat(first), flat(second), flat(ref)):
        np.testing.assert_array_equal(np.array(b), np.array(a))  # fast path == full path
        np.testing.assert_allclose(np.array(a), np.array(r), rtol=1e-6, atol=1e-7)
    if name == "dict output":
        assert second["b"][1] == 1 and isinstance(second["b"], list)
    if name == "returns argument":
        assert second[0] is not x and second[0]._d is x._d  # a new handle on the same desc


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("name", ["fused", "two outputs", "reduction between", "dict output"])
def test_replay_in_c_records_the_objects_the_python_loop_records(name, traced):
    """core/_call.c's ``replay`` against compile_trace's Python loop over the same plan: per
    node its primitive, inputs (by position in the env) and no event; per output desc its
    shape, dtype, stream, index, no data, the tracer flag (inside a transformation too),
    each weakly listed on its node in order."""
    from tapescope.core import compile_trace

    if compile_trace._replay is compile_trace._replay_py:
        pytest.skip("core/_call.c is not built (or settings.c_call is off)")
    g = mx.compile(PROGRAMS[name])
    x, y = mx.array(np.ones((3, 4), np.float32)), mx.array(np.full((3, 4), 2, np.float32))
    g(x, y)
    (entry,) = g._cache.values()
    plan = entry.plan

    def both(xd, yd):
        envs = []
        for rep in (compile_trace._replay, compile_trace._replay_py):
            env = [xd, yd] + plan.consts
            rep(plan.steps, env)
            envs.append(env)
        return envs

    if traced:
        got = []
        mx.grad(lambda a: (got.append(both(a._d, y._d)), a.sum())[1])(x)
        c, p = got[0]
    else:
        c, p = both(x._d, y._d)
    assert len(c) == len(p) == 2 + len(plan.consts) + sum(len(o) for _, _, o in plan.steps)
    pos_c, pos_p = {id(d): i for i, d in enumerate(c)}, {id(d): i for i, d in enumerate(p)}
    for dc, dp in zip(c, p):
        if dc is dp:  # an argument or a constant
            continue
        assert dc.node is not dp.node and dc.node.primitive is dp.node.primitive
        assert [pos_c[id(i)] for i in dc.node.inputs] == [pos_p[id(i)] for i in dp.node.inputs]
        assert dc.node.event is None and dc.node.keep is False and dc.node.id != dp.node.id
        assert [r() for r in dc.node.outputs].index(dc) == dc.index
        for k in ("shape", "dtype", "stream", "index", "data", "buffer", "tracer", "kept"):
            assert getattr(dc, k) == getattr(dp, k), k
    assert (c[2 + len(plan.consts)].tracer is True) == traced
    np.testing.assert_array_equal(np.array(mx.array._wrap(c[-1])), np.array(mx.array._wrap(p[-1])))


def test_fast_path_skips_tracing_and_keeps_recompile_rules():
    n = {"t": 0}

    def f(x, y):
        n["t"] += 1
        return x * y + 1.0

    g = mx.compile(f)
    a, b = mx.ones((2, 3)), mx.ones((2, 3))
    for _ in range(5):
        mx.eval(g(a, b))
    assert n["t"] == 1 and len(g._fast) == 1
    g(mx.ones((3, 3)), mx.ones((3, 3)))  # new shape: traced
    g(mx.ones((2, 3), dtype=mx.int32), mx.ones((2, 3), dtype=mx.int32))  # new dtype: traced
    g(mx.ones((2, 3)), y=mx.ones((2, 3)))  # keyword: full path, new structure: traced
    assert n["t"] == 4
    g(mx.ones((2, 3)), y=mx.ones((2, 3)))
    assert n["t"] == 4 and len(g._fast) == 3  # keyword calls never enter the fast table


def test_fast_path_not_used_with_captured_state():
    state = [mx.array(1.0)]
    g = mx.compile(lambda x: x + state[0], inputs=state)
    x = mx.ones((3,))
    g(x)
    g(x)
    assert not g._fast
    state[0] = mx.array(5.0)
    np.testing.assert_array_equal(np.array(g(x)), np.full(3, 6.0, np.float32))


def test_a_shapeless_function_is_traced_once_and_fast_per_shape():
    """A shapeless function traces once; each new shape's call is the trace replayed with
    shapes inferred, kept in the fast table as that shape's plan (``_Entry.shaped``), which
    later calls of the shape replay without inferring again."""
    h = mx.compile(lambda x, y: mx.sigmoid(x) * y + 2.0, shapeless=True)
    rng = np.random.default_rng(0)
    for shape in [(3,), (7,), (2, 5), (7,), (3,), (2, 5)]:
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape[-1:]).astype(np.float32)
        got = np.array(h(mx.array(a), mx.array(b)))
        want = 1 / (1 + np.exp(-a.astype(np.float64))) * b + 2.0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert h.traces == 2  # (one per rank: a shapeless trace is keyed by ndim and dtype)
    assert sorted(k[2] for k in h._fast) == [(2, 5), (3,), (7,)]
    assert all(e.program is None for e in h._fast.values())


def test_disable_compile_bypasses_fast_path():
    n = {"t": 0}

    def f(x):
        n["t"] += 1
        return x * 2.0 + 1.0

    g = mx.compile(f)
    x = mx.ones((4,))
    g(x)
    g(x)
    mx.disable_compile()
    try:
        g(x)
        g(x)
    finally:
        mx.enable_compile()
    assert n["t"] == 3  # traced once, then the plain function twice


@requires_mlx
def test_fast_path_results_match_mlx(mlx):
    rng = np.random.default_rng(1)
    xn, yn = rng.uniform(-2, 2, (5, 6)).astype(np.float32), rng.uniform(-2, 2, (6,)).astype(np.float32)
    f = lambda m, x, y: m.exp(-x) * m.sin(y) + 2 * x * y - m.tanh(x)  # noqa: E731
    ours = mx.compile(lambda x, y: f(mx, x, y))
    theirs = mlx.compile(lambda x, y: f(mlx, x, y))
    for _ in range(3):
        a = np.array(ours(mx.array(xn), mx.array(yn)))
        b = np.array(theirs(mlx.array(xn), mlx.array(yn)))
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from([(16,), (3, 5), (2, 3, 4), ()]),
       layout=st.sampled_from(["plain", "transposed", "sliced"]), seed=st.integers(0, 2**16))
def test_cached_launch_plans_follow_input_layouts(shape, layout, seed):
    """One compiled function called on arrays of one shape but different layouts
    (contiguous, transposed, sliced) keeps one launch plan per layout and stays correct."""
    rng = np.random.default_rng(seed)
    g = mx.compile(lambda x, y: x * y - 0.5 * x)
    for lay in ("plain", layout, "plain", layout):
        xn = rng.uniform(-2, 2, shape).astype(np.float32)
        yn = rng.uniform(-2, 2, shape).astype(np.float32)
        x = mx.array(xn)
        if lay == "transposed" and len(shape) >= 2:
            x = mx.transpose(mx.array(np.ascontiguousarray(xn.T)))
        elif lay == "sliced" and len(shape) >= 1:
            x = mx.array(np.repeat(xn, 2, axis=-1))[..., ::2]
        out = np.array(g(x, mx.array(yn)))
        np.testing.assert_array_equal(out, xn * yn - np.float32(0.5) * xn)


def test_kernel_cache_clear_invalidates_launch_plans_and_hits_still_count():
    g = mx.compile(lambda x: mx.sin(x) * 2.0 + 1.0)
    x = mx.array(np.linspace(-1, 1, 10, dtype=np.float32))
    mx.eval(g(x))
    tapescope.clear_kernel_cache()
    for _ in range(3):
        np.testing.assert_allclose(np.array(g(x)), np.sin(np.array(x)) * 2 + 1, rtol=1e-6)
    (e,) = [e for e in tapescope.kernel_cache() if "Sin" in e["name"]]
    assert (e["misses"], e["hits"]) == (1, 2)


def test_concurrent_calls_from_threads_give_right_results():
    """Each thread has its own argument vector; kernels may run without the GIL."""
    g = mx.compile(lambda x, y: x * y + x)
    n = 1 << 17  # above the OpenMP size: the kernel releases the GIL
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            xn = rng.uniform(-1, 1, n).astype(np.float32)
            yn = rng.uniform(-1, 1, n).astype(np.float32)
            out = np.array(g(mx.array(xn), mx.array(yn)))
            if not np.array_equal(out, xn * yn + xn):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
