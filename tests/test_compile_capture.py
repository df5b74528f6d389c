"""What a compiled function's trace captures, as MLX's compile does (python/src/transforms.cpp,
mlx/compile.cpp ``compile_dfs``): captured outputs read before the captured inputs' originals
go back, an in-place operator on a captured placeholder, MLX's error for a graph that uses an
argument other than through its placeholder (but a function called with a transformation's
tracers runs uncompiled, as MLX's does), and ``mx.random.state`` per thread. Each case is
checked on MLX too where it is installed."""

from __future__ import annotations

import threading
from functools import partial

import numpy as np
import pytest

import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import same_error

MODULES = [mx] + ([mlx_ref] if mlx_ref is not None else [])
IDS = ["tapescope", "mlx"][:len(MODULES)]


@pytest.mark.parametrize("M", MODULES, ids=IDS)
def test_an_in_place_update_of_captured_state_is_the_new_state(M):
    state = [M.array(1.0)]

    @partial(M.compile, inputs=state, outputs=state)
    def fun(y):
        x = state[0]
        state[0] *= 2  # rebinds the placeholder's value: x sees it too
        return x + y

    assert fun(M.array(1)).item() == 3.0 and state[0].item() == 2.0
    assert fun(M.array(1)).item() == 5.0 and state[0].item() == 4.0


@pytest.mark.parametrize("M", MODULES, ids=IDS)
def test_captured_outputs_follow_each_trace(M):
    state = [M.array(1.0)]

    @partial(M.compile, inputs=state, outputs=state)
    def fun(y):
        x = state[0]
        if y.dtype == M.float32:
            state[0] = 2 * y
            return [x, y, x + y]
        state[0] *= 2
        return x + y

    seen = []
    for _ in range(3):
        fun(M.array(1.0))
        seen.append(state[0].item())
        fun(M.array(1))
        seen.append(state[0].item())
    assert seen == [2.0, 4.0] * 3


def test_a_graph_using_an_argument_directly_raises_mlx_error():
    def case(M):
        x = M.array([1, 2, 3]) + 2
        return M.compile(lambda a: a + (x + 1))(x)

    same_error(case)
    x = mx.array([1, 2, 3]) + 2
    with pytest.raises(ValueError, match=r"^\[compile\] Attempting to compile a function with "
                                         r"uncaptured inputs is not allowed\.$"):
        mx.compile(lambda a: a + (x + 1))(x)
    # the same function on another array is fine, and so is a closure over a non-argument
    np.testing.assert_array_equal(np.array(mx.compile(lambda a: a + (x + 1))(mx.array(1))),
                                  [5, 6, 7])


@pytest.mark.parametrize("M", MODULES, ids=IDS)
def test_a_compiled_function_of_vmap_tracers_may_close_over_its_argument(M):
    x = M.array([[1.0, -2.0], [2.0, 3.0]])

    def outer(x):
        x = M.abs(x)
        return M.compile(lambda z: -M.exp(x))(x)

    np.testing.assert_allclose(np.array(M.vmap(outer)(x)), -np.exp(np.abs(np.array(x))),
                               rtol=1e-6)


@pytest.mark.parametrize("M", MODULES, ids=IDS)
def test_random_state_is_one_object_and_each_thread_has_its_own_key(M):
    M.random.seed(7)
    main_key = np.array(M.random.state[0]).tolist()
    got = {}

    def worker():
        got["state"] = M.random.state
        got["key"] = np.array(M.random.state[0]).tolist()
        M.random.seed(1)
        got["seeded"] = np.array(M.random.state[0]).tolist()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert got["state"] is M.random.state and len(M.random.state) == 1
    assert got["seeded"] == [0, 1]
    assert np.array(M.random.state[0]).tolist() == main_key == [0, 7]  # untouched by the thread
    assert got["key"] != main_key  # a thread's first key is the time seed's, not the main's
    with pytest.raises(IndexError, match="random state index out of range"):
        M.random.state[1]
    with pytest.raises(TypeError):
        M.random.state[0] = M.random.key(0)


@pytest.mark.parametrize("M", MODULES, ids=IDS)
def test_compile_capturing_random_state_uses_the_calling_threads_key(M):
    fun = partial(M.compile, inputs=[{"n": M.array(0.0)}, M.random.state],
                  outputs=[M.random.state])(lambda: M.random.uniform(shape=(8,)))
    out = {}

    def worker():
        with M.stream(M.cpu):
            M.random.seed(42)
            a, b = np.array(fun()), np.array(fun())
            M.random.seed(42)
            c = np.array(fun())
            M.random.seed(42)
            ref = np.array(M.random.uniform(shape=(8,)))
        M.clear_streams()
        out.update(a=a, b=b, c=c, ref=ref)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not np.array_equal(out["a"], out["b"])  # the thread's key advanced
    np.testing.assert_array_equal(out["a"], out["c"])
    np.testing.assert_array_equal(out["a"], out["ref"])
    M.random.seed(5)  # the main thread's key still works with the same compiled function
    first = np.array(fun())
    M.random.seed(5)
    np.testing.assert_array_equal(first, np.array(M.random.uniform(shape=(8,))))
