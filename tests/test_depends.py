"""mx.depends: the outputs are the inputs (shared buffers, MLX's values and structure), and
the dependencies run first (the timeline's order, across streams too); VJP as MLX's
Depends::vjp, MLX's errors for JVP / vmap and for non-arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tapescope
import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import primitive_names, same_error

needs_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")


def _ran(rec) -> list:
    return [r for r in rec.records if r.kind == "primitive"]


def test_dependencies_run_before_the_output():
    x = mx.array([1.0, 2.0]) * 2
    dep = mx.exp(mx.array([0.0, 1.0]))  # nothing else needs it
    out = mx.depends(x, dep)
    assert primitive_names(out).count("Depends") == 1
    with tapescope.record() as rec:
        mx.eval(out)
    names = [r.name for r in _ran(rec)]
    assert names.index("Exp") < names.index("Depends") and names.index("Multiply") < names.index("Depends")
    assert dep._d.node is None  # the dependency was evaluated although only ``out`` was asked
    np.testing.assert_allclose(np.array(dep), np.exp([0.0, 1.0]), rtol=1e-6)
    assert out.tolist() == [2.0, 4.0]
    assert out._d.buffer is x._d.buffer  # a view: Depends copies nothing


def test_a_dependency_on_another_stream_finishes_first():
    s2 = mx.new_stream(mx.cpu)
    big = mx.random.normal((256, 256), key=mx.random.key(0), stream=s2)
    dep = mx.matmul(big, big, stream=s2)
    x = mx.arange(4.0) + 1
    out = mx.depends([x], [dep])
    assert isinstance(out, list) and len(out) == 1
    with tapescope.record() as rec:
        mx.eval(out)
    recs = {r.name: r for r in _ran(rec)}
    assert recs["Matmul"].end_ns <= recs["Depends"].start_ns
    assert dep._d.node is None


@needs_mlx
@settings(max_examples=25)
@given(st.lists(hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                           elements=st.floats(-4, 4, width=32)), min_size=1, max_size=3),
       st.integers(0, 2), st.booleans())
def test_values_and_structure_match_mlx(values, n_deps, as_list):
    def run(M):
        ins = [M.array(v) * 2 for v in values]
        deps = [M.sum(M.array(v)) for v in values[:n_deps]]
        return M.depends(ins if as_list else ins[0], deps)

    ours, ref = run(mx), run(mlx_ref)
    assert isinstance(ours, list) == isinstance(ref, list)
    ours, ref = (ours, ref) if isinstance(ref, list) else ([ours], [ref])
    assert len(ours) == len(ref)
    for o, r in zip(ours, ref):
        assert o.shape == tuple(r.shape) and o.dtype.name == "float32"
        np.testing.assert_array_equal(np.array(o), np.array(r))


@needs_mlx
def test_grad_through_depends_matches_mlx():
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0], np.float32)

    def grads(M):
        f = lambda x, y: M.sum(M.depends(x * 2, y * 3) * x)  # noqa: E731
        return M.grad(f, argnums=(0, 1))(M.array(a), M.array(b))

    for o, r in zip(grads(mx), grads(mlx_ref)):
        np.testing.assert_array_equal(np.array(o), np.array(r))
    # a list of inputs: each output's cotangent reaches its own input
    g = mx.grad(lambda x: sum(mx.sum(o * (i + 1)) for i, o in enumerate(mx.depends([x, x * 2], [x]))))
    np.testing.assert_array_equal(np.array(g(mx.array(a))), [5.0, 5.0])


def test_check_and_compile_agree():
    a, b = mx.array([1.0, -2.0]), mx.array([3.0])
    assert tapescope.check(lambda x, y: mx.depends(x * 2, y * 3), a, b).passed
    f = mx.compile(lambda x, y: mx.depends([x * 2, y + 1], [y * 3]))
    assert [o.tolist() for o in f(a, b)] == [[2.0, -4.0], [4.0]]


@needs_mlx
@pytest.mark.parametrize("call", [
    "M.jvp(lambda x: M.depends(x * 2, x * 3), [M.array([1.0])], [M.array([1.0])])",
    "M.vmap(lambda x: M.depends(x * 2, x * 3))(M.array([1.0, 2.0]))",
    "M.depends(1.0, M.array(1.0))",
    "M.depends(M.array(1.0), 1.0)",
    "M.depends([M.array(1.0), 1.0], M.array(1.0))",
])
def test_errors_match_mlx(call):
    same_error(lambda M: eval(call, {"M": M}))


def test_no_inputs_is_an_error():  # MLX reads inputs[0] and crashes the process
    with pytest.raises(ValueError, match=r"\[depends\] Expected at least one input."):
        mx.depends([], [mx.array(1.0)])
