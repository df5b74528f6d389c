"""A compiled function's call in C (``interactive/core/_call.c``, CompiledFunction's base):
for a signature traced before it records exactly what the Python path records — the same
Node and ArrayDesc, slot by slot — and it leaves every other call to the Python path
(keyword arguments, non-array arguments, a transformation running, several outputs, a new
stream or signature, compile disabled). Skips where the extension is not built."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from tapescope.core.array import ArrayDesc
from tapescope.core.ops import compile_api
from tapescope.core.primitive import Node

_call = pytest.importorskip("tapescope.core._call", reason="interactive/core/_call.c is not built")
pytestmark = pytest.mark.skipif(compile_api._CallBase is object,
                                 reason="the C call is off (TAPESCOPE_C_CALL=0)")


def _slots(cls) -> list:
    return [s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if s != "__weakref__"]


@pytest.fixture
def python_calls(monkeypatch):
    """How many calls the Python path (CompiledFunction._call) ran, per function."""
    seen = []
    real = compile_api.CompiledFunction._call

    def counted(self, *args, **kwargs):
        seen.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(compile_api.CompiledFunction, "_call", counted)
    return seen


def test_the_c_call_records_the_node_and_desc_the_python_path_records(python_calls):
    f = mx.compile(lambda a, b: 2 * a + 3 * b - a * b)
    x = mx.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    y = mx.array(np.ones((2, 3), np.float32))
    py = f(x, y)  # traced: the Python path
    assert len(python_calls) == 1
    c = f(x, y)  # the C path
    assert len(python_calls) == 1
    via_python = f._call(x, y)  # the Python fast path, for comparison
    for h in (c, via_python):
        assert type(h) is mx.array and type(h._d) is ArrayDesc and type(h._d.node) is Node
    d, e = c._d, via_python._d
    for s in _slots(ArrayDesc):
        if s != "node":
            assert getattr(d, s) == getattr(e, s) and type(getattr(d, s)) is type(getattr(e, s)), s
    n, m = d.node, e.node
    for s in _slots(Node):
        if s == "id":
            assert n.id < m.id
        elif s == "outputs":
            assert [r() for r in n.outputs] == [d] and [r() for r in m.outputs] == [e]
        elif s == "inputs":
            assert [i is j for i, j in zip(n.inputs, m.inputs)] == [True] * len(m.inputs)
        else:
            assert getattr(n, s) is getattr(m, s), s
    want = 2 * np.arange(6, dtype=np.float32).reshape(2, 3) + 3 - np.arange(6, dtype=np.float32).reshape(2, 3)
    for h in (py, c, via_python):
        np.testing.assert_array_equal(np.array(h), want)


def test_a_captured_constant_is_an_input_of_the_recorded_node(python_calls):
    k = mx.array(np.array([1.0, -2.0, 0.5], np.float32))
    f = mx.compile(lambda a: a * k + 1)
    x = mx.array(np.array([3.0, 4.0, 5.0], np.float32))
    f(x)
    r = f(x)
    assert len(python_calls) == 1
    np.testing.assert_array_equal(np.array(r), np.array([4.0, -7.0, 3.5], np.float32))


def test_every_other_call_goes_to_the_python_path(python_calls):
    f = mx.compile(lambda a, b=1.0: a * b + 1)
    x = mx.array(np.arange(4, dtype=np.float32))
    f(x)
    f(x)
    assert len(python_calls) == 1
    np.testing.assert_array_equal(np.array(f(x, b=2.0)), np.arange(4, dtype=np.float32) * 2 + 1)
    assert len(python_calls) == 2  # keyword arguments
    np.testing.assert_array_equal(np.array(f(x, 3.0)), np.arange(4, dtype=np.float32) * 3 + 1)
    assert len(python_calls) == 3  # a non-array argument
    f(mx.array(np.arange(5, dtype=np.float32)))
    assert len(python_calls) == 4  # a new signature: traced
    with mx.stream(mx.new_stream(mx.default_device())):
        f(x)
        assert len(python_calls) == 5  # another stream: another entry
        f(x)
        assert len(python_calls) == 5  # ... then found in C
    g = mx.compile(lambda a: (a + 1, a * 2))
    g(x)
    g(x)
    assert len(python_calls) == 7  # two outputs: the Python path each time
    mx.disable_compile()
    try:
        np.testing.assert_array_equal(np.array(f(x)), np.arange(4, dtype=np.float32) + 1)
        assert len(python_calls) == 8
    finally:
        mx.enable_compile()


def test_inside_a_transformation_the_python_path_flags_the_tracers(python_calls):
    f = mx.compile(lambda a: mx.sin(a) * a)
    x = mx.array(np.linspace(-1, 1, 5, dtype=np.float32))
    f(x)
    n = len(python_calls)
    g = mx.grad(lambda a: f(a).sum())(x)
    assert len(python_calls) > n
    h = np.linspace(-1, 1, 5, dtype=np.float32)
    np.testing.assert_allclose(np.array(g), np.cos(h) * h + np.sin(h), rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=0, max_size=3),
       dtype=st.sampled_from([np.float32, np.float16, np.int32]))
def test_the_c_call_matches_numpy_over_shapes_and_dtypes(shape, dtype):
    f = mx.compile(lambda a, b: a * b + a)
    ah = (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) % 7).astype(dtype)
    bh = (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) % 3 + 1).astype(dtype)
    a, b = mx.array(ah), mx.array(bh)
    first, second = f(a, b), f(a, b)
    want = ah * bh + ah
    np.testing.assert_array_equal(np.array(first), want)
    np.testing.assert_array_equal(np.array(second), want)


def test_mx_eval_of_one_array_runs_each_node_once_in_the_loop():
    """mx.eval of one array (core/_call.c's eval, then the loop's C part, _loop.c
    eager_eval, or the Python eval where that declines, inside a transformation here): each
    node runs once, counted by the loop, and a second eval runs nothing."""
    from tapescope.core import evaluate

    def ran() -> int:
        return sum(evaluate.dispatch_counts().values())

    x = mx.array(np.arange(4, dtype=np.float32))
    mx.eval(x)
    n = ran()
    y = x * x + x
    mx.eval(y)
    assert ran() - n == 2 and y._d.node is None
    mx.eval(y)
    assert ran() - n == 2
    h = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.array(y), h * h + h)
    seen = []

    def inside(v):  # a transformation runs: the C part declines, the Python eval runs it
        z = v * 3
        mx.eval(z)
        seen.append(z._d.node is None)
        return z.sum()

    mx.grad(inside)(x)
    assert seen == [True]
