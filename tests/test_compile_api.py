"""mx.compile's call semantics and recompilation rules, checked against MLX itself."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tapescope.core as mx
from conftest import requires_mlx


def _count_traces(lib, calls, shapeless=False):
    """Run ``calls`` (list of (args, kwargs) builders) through lib.compile; count traces."""
    n = {"t": 0}

    def f(x, y=None, *, scale=1.0, tag="a"):
        n["t"] += 1
        out = x * scale
        if y is not None:
            out = out + (y if not isinstance(y, (list, tuple)) else y[0])
        return out

    g = lib.compile(f, shapeless=shapeless)
    results = []
    for build in calls:
        args, kwargs = build(lib)
        results.append(np.array(g(*args, **kwargs)))
    return n["t"], results


CALLS = [
    lambda m: ((m.ones((2, 3)),), {}),
    lambda m: ((m.ones((2, 3)),), {}),  # hit
    lambda m: ((m.ones((4, 3)),), {}),  # new shape
    lambda m: ((m.ones((4, 3), dtype=m.int32),), {}),  # new dtype
    lambda m: ((m.ones((4,)),), {}),  # new ndim
    lambda m: ((m.ones((4,)),), {"scale": 2.0}),  # new non-array kwarg
    lambda m: ((m.ones((4,)),), {"scale": 2.0}),  # hit
    lambda m: ((m.ones((4,)), m.ones((4,))), {}),  # pytree structure changes
    lambda m: ((m.ones((4,)), [m.ones((4,))]), {}),  # list instead of array
    lambda m: ((m.ones((4,)), [m.ones((4,))]), {"tag": "b"}),  # string constant
]


@requires_mlx
@pytest.mark.parametrize("shapeless", [False, True])
def test_recompilation_triggers_match_mlx(mlx, shapeless):
    ours, r1 = _count_traces(mx, CALLS, shapeless)
    theirs, r2 = _count_traces(mlx, CALLS, shapeless)
    assert ours == theirs
    for a, b in zip(r1, r2):
        np.testing.assert_allclose(a, b)


@requires_mlx
def test_shapeless_reuses_trace_across_shapes_and_broadcasts_like_mlx(mlx):
    def run(lib):
        n = {"t": 0}

        def f(x, y):
            n["t"] += 1
            return lib.exp(x) * y + 2

        g = lib.compile(f, shapeless=True)
        outs = [np.array(g(lib.array(np.full((2, 3), 0.5, np.float32)), lib.array(np.arange(3, dtype=np.float32)))),
                np.array(g(lib.array(np.full((4, 5), 0.25, np.float32)), lib.array(np.arange(5, dtype=np.float32))))]
        return n["t"], outs

    (n1, o1), (n2, o2) = run(mx), run(mlx)
    assert n1 == n2 == 1
    for a, b in zip(o1, o2):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_wrapper_keeps_name_doc_and_signature():
    def my_fun(x, y=2, *, z=3):
        """Docstring here."""
        return x

    g = mx.compile(my_fun)
    assert g.__name__ == "my_fun" and g.__doc__ == "Docstring here."
    assert str(inspect.signature(g)) == "(x, y=2, *, z=3)"


@requires_mlx
def test_bad_argument_type_raises_mlx_error(mlx):
    for lib in (mx, mlx):
        g = lib.compile(lambda x, o: x + 1)
        with pytest.raises(ValueError) as e:
            g(lib.array(1.0), object())
        msgs = str(e.value)
        if lib is mx:
            ours = msgs
        else:
            theirs = msgs
    assert ours == theirs


def test_compile_of_non_callable_is_type_error():
    with pytest.raises(TypeError):
        mx.compile(3)


def test_eval_inside_trace_raises_mlx_error():
    def f(x):
        mx.eval(x)
        return x

    with pytest.raises(ValueError, match=r"\[eval\] Attempting to eval an array during function"):
        mx.compile(f)(mx.ones((3,)))


def test_pytree_outputs_and_non_array_leaves_round_trip():
    g = mx.compile(lambda d, xs: {"s": d["a"] + xs[0], "pair": (xs[1] * 2, 7)})
    out = g({"a": mx.array([1.0, 2.0])}, [mx.array([3.0, 4.0]), mx.array([5.0, 6.0])])
    np.testing.assert_array_equal(np.array(out["s"]), [4.0, 6.0])
    np.testing.assert_array_equal(np.array(out["pair"][0]), [10.0, 12.0])
    assert out["pair"][1] == 7


def test_disable_and_enable_compile():
    n = {"t": 0}

    def f(x):
        n["t"] += 1
        return x + 1

    g = mx.compile(f)
    try:
        mx.disable_compile()
        g(mx.ones((2,)))
        g(mx.ones((2,)))
        assert n["t"] == 2  # runs as plain Python every call
    finally:
        mx.enable_compile()
    g(mx.ones((2,)))
    g(mx.ones((2,)))
    assert n["t"] == 3


def test_env_var_disables_compile():
    code = ("import tapescope.core as mx\nn=[0]\ndef f(x):\n n[0]+=1\n return x+1\n"
            "g=mx.compile(f); g(mx.ones(2)); g(mx.ones(2)); print(n[0])")
    env = dict(os.environ, MLX_DISABLE_COMPILE="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "2", r.stderr


@requires_mlx
def test_captured_state_inputs_outputs_like_mlx(mlx):
    def run(lib):
        state = [lib.array([1.0, 2.0])]

        def step(x):
            state[0] = state[0] * 2 + x
            return state[0].sum() if hasattr(state[0], "sum") else state[0]

        g = lib.compile(step, inputs=state, outputs=state)
        res = [np.array(g(lib.array([1.0, 1.0]))) for _ in range(3)]
        return res, np.array(state[0])

    (r1, s1), (r2, s2) = run(mx), run(mlx)
    np.testing.assert_allclose(s1, s2)
    for a, b in zip(r1, r2):
        np.testing.assert_allclose(a, b)


def test_random_state_advances_inside_compiled_function():
    mx.random.seed(3)
    g = mx.compile(lambda x: x + mx.random.uniform(shape=(4,)), inputs=mx.random.state,
                   outputs=mx.random.state)
    a = np.array(g(mx.zeros((4,))))
    b = np.array(g(mx.zeros((4,))))
    mx.random.seed(3)
    ref_a = np.array(mx.random.uniform(shape=(4,)))
    ref_b = np.array(mx.random.uniform(shape=(4,)))
    np.testing.assert_array_equal(a, ref_a)
    np.testing.assert_array_equal(b, ref_b)


def test_compiling_a_wraps_wrapper_of_a_compiled_function_traces_the_wrapper():
    """functools.wraps copies the compiled function's ``__dict__`` onto the wrapper; compile
    must not take that as its own state (it then ran the inner function: 2.0, not 3.0)."""
    import functools

    g = mx.compile(lambda x: x * 2)
    g(mx.array(1.0))

    @functools.wraps(g)
    def w(x):
        return g(x) + 1

    assert mx.compile(w)(mx.array(1.0)).item() == 3.0
    assert g(mx.array(1.0)).item() == 2.0
    assert mx.compile(w).__name__ == g.__name__  # still a wrapper: the name is copied


def test_a_trace_is_reused_only_on_the_stream_it_was_made_under():
    """MLX's compile cache matches an entry on the default stream too: a function traced
    under one stream and called under another is traced again, its ops on the new stream."""
    f = mx.compile(lambda a: mx.exp(a) + 1)
    x = mx.array([1.0, 2.0])
    s = mx.new_stream(mx.cpu)
    first = f(x)
    with mx.stream(s):
        second = f(x)
    third = f(x)
    assert first._d.stream == third._d.stream == mx.default_stream(mx.default_device())
    assert second._d.stream == s
    assert np.allclose(np.array(second), np.exp([1.0, 2.0]) + 1)


def _self_calling(module, shapeless=False):
    """MLX's recursive compiled function: each call traces the next smaller shape inside the
    outer trace (the compile lock is re-entered)."""
    box = {}

    def f(x):
        return x if x.shape[0] == 1 else box["cf"](x[1:]) * 2 + x[:1]

    box["cf"] = module.compile(f, shapeless=shapeless)
    return box["cf"]


def test_compiled_function_may_call_itself_as_mlx():
    x = [1.0, 2.0, 3.0, 4.0]
    want = 0.0
    for v in reversed(x):  # f(x) = 2 f(x[1:]) + x[0], f([v]) = v
        want = v if want == 0.0 else want * 2 + v
    cf = _self_calling(mx)
    got = cf(mx.array(x))
    assert got.tolist() == [want] and cf.traces == len(x)
    assert cf(mx.array(x[1:])).tolist() == [(want - 1.0) / 2]  # the inner trace, reused
    assert cf.traces == len(x)
    try:
        import mlx.core as mlx_ref
    except ImportError:
        return
    assert _self_calling(mlx_ref)(mlx_ref.array(x[:3])).tolist() == [17.0]
    assert _self_calling(mlx_ref)(mlx_ref.array(x)).tolist() == got.tolist()


def test_shapeless_self_call_raises_as_mlx():
    from mlx_compare import same_error

    # the slice of a shapeless trace has no output shape, in MLX as here
    same_error(lambda m: _self_calling(m, shapeless=True)(m.array([1.0, 2.0, 3.0])))


def test_unbounded_self_call_raises_recursion_error_and_leaves_no_trace_state():
    from tapescope.core import compile_trace, transform_tracers

    box = {}
    box["g"] = mx.compile(lambda x: box["g"](x) + 1)
    result = {}

    def call():
        try:
            box["g"](mx.array([1.0]))
        except RecursionError as e:
            result["error"] = e

    t = threading.Thread(target=call)
    t.start()
    t.join(60)  # a hang guard, not a timing: the non-reentrant lock blocked here forever
    assert not t.is_alive() and "error" in result
    assert transform_tracers._active == 0 and not compile_trace.in_dynamic_tracing()
    assert box["g"].traces == 0 and not box["g"]._cache
    # the next compiled call traces and runs as usual
    assert mx.compile(lambda x: x * 2)(mx.array([1.5])).tolist() == [3.0]
