"""The Graph model: trace / graph_of against MLX's graphs, fused kernels, boundary reasons, variants."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope
import tapescope.core as mx
from conftest import mlx_ref, requires_mlx
from mlx_compare import host


def gelu_of(lib):
    def gelu(x):
        return x * (1 + lib.erf(x / lib.sqrt(lib.array(2.0)))) / 2
    return gelu


def chain_of(lib, n):
    def chain(x):
        for _ in range(n):
            x = lib.sin(x)
        return x
    return chain


def mlx_labels(fn, *arrays) -> list:
    """Primitive labels of MLX's own graph of ``fn`` (compiled or not), in its DFS order."""
    f = io.StringIO()
    out = fn(*arrays)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    mlx_ref.export_to_dot(f, *outs)
    return re.findall(r'label ="(\w+)"', f.getvalue())


def test_compiled_gelu_is_one_kernel_with_the_gelu_tape():
    g = tapescope.trace(gelu_of(mx), mx.ones((4, 8)))
    assert [op.primitive for op in g.ops] == ["Compiled"]
    (k,) = g.kernels
    # x * (1 + erf(x / sqrt(2))) / 2, scalars broadcast to (4, 8): MLX's primitive order
    assert [s[1] for s in k.steps] == ["Sqrt", "Broadcast", "Divide", "Erf", "Broadcast", "Add",
                                       "Multiply", "Broadcast", "Divide"]
    assert k.shape == (4, 8) and k.variant == "contiguous"
    assert k.symbol == k.name + "_contiguous"
    assert g.inputs == [v.id for v in g.values if v.role == "input"]
    assert g.values[g.inputs[0]].name == "x"


@requires_mlx
def test_compiled_gelu_tape_matches_mlx():
    xs = np.ones((4, 8), np.float32)
    (label,) = mlx_labels(mlx_ref.compile(gelu_of(mlx_ref)), mlx_ref.array(xs))
    (k,) = tapescope.trace(gelu_of(mx), mx.array(xs)).kernels
    assert "Compiled" + "".join(s[1] for s in k.steps) == label


@requires_mlx
@pytest.mark.parametrize("n", [3, 11, 12, 15, 26])
def test_depth_limit_splits_like_mlx(n):
    xs = np.ones((3,), np.float32)
    theirs = mlx_labels(mlx_ref.compile(chain_of(mlx_ref, n)), mlx_ref.array(xs))
    g = tapescope.trace(chain_of(mx, n), mx.array(xs))
    mine = ["Compiled" + "".join(s[1] for s in g.kernels[op.kernel].steps) if op.kernel is not None
            else op.primitive for op in g.ops]
    assert mine == theirs


def test_depth_limit_boundary_reason():
    g = tapescope.trace(chain_of(mx, 15), mx.ones((3,)))
    assert len(g.kernels) == 2
    first, second = g.kernels
    assert [i.reason for i in first.inputs] == ["argument"]
    assert [i.reason for i in second.inputs] == ["depth limit"]
    assert second.inputs[0].value == g.ops[first.op].outputs[0]


def test_reduction_boundary_reason():
    def f(x, y):
        s = mx.sum(x * y, axis=1, keepdims=True)
        return mx.exp(x - s), s

    g = tapescope.trace(f, mx.ones((4, 8)), mx.ones((8,)))
    assert [op.primitive for op in g.ops] == ["Compiled", "Sum", "Compiled"]
    last = g.kernels[1]
    reasons = {g.values[i.value].name or g.ops[g.values[i.value].producer].primitive: i.reason
               for i in last.inputs}
    assert reasons == {"x": "argument", "out[1]": "reduction"}
    assert ("reduction" in [b[3] for b in g.boundaries])


def test_non_fusable_boundary_reason():
    def f(x):
        return mx.exp(mx.transpose(mx.exp(x) + 1)) * 2

    g = tapescope.trace(f, mx.ones((2, 3)))
    last = g.kernels[-1]
    prods = {i.producer: i.reason for i in last.inputs if i.constant is None}
    assert prods == {"Transpose": "non-fusable primitive"}


def test_trace_without_compile_matches_eager_mlx_graph():
    if mlx_ref is None:
        pytest.skip("mlx is not installed")
    xs = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    g = tapescope.trace(gelu_of(mx), mx.array(xs), compile=False)
    theirs = mlx_labels(gelu_of(mlx_ref), mlx_ref.array(xs))
    assert sorted(op.primitive for op in g.ops) == sorted(theirs)
    assert not g.kernels and not g.compiled


@requires_mlx
@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.sampled_from(["exp", "add", "mul", "sum", "div"]), min_size=1, max_size=5),
       bshape=st.sampled_from([(3,), (2, 1), ()]))
def test_graph_of_ops_and_shapes_match_mlx(ops, bshape):
    xa = np.linspace(0.1, 0.9, 6, dtype=np.float32).reshape(2, 3)
    ba = np.full(bshape, 0.5, dtype=np.float32)

    def run(lib):
        x, b = lib.array(xa), lib.array(ba)
        for op in ops:
            x = {"exp": lambda: lib.exp(x), "add": lambda: x + b, "mul": lambda: x * b,
                 "sum": lambda: lib.sum(x, axis=-1, keepdims=True), "div": lambda: lib.divide(x, b)}[op]()
        return x

    out = run(mx)
    g = tapescope.graph_of(out)
    assert [op.primitive for op in g.ops] == mlx_labels(lambda: run(mlx_ref))
    ref = run(mlx_ref)
    assert g.values[g.outputs[0]].shape == tuple(ref.shape)
    assert g.values[g.outputs[0]].dtype == str(ref.dtype).split(".")[-1]


def test_graph_of_evaluated_and_lazy():
    a = mx.array([1.0, 2.0])
    b = mx.exp(a) * 2
    g = tapescope.graph_of(b)
    (inp,) = [g.values[i] for i in g.inputs]
    assert inp.evaluated and inp.data is not None and np.array_equal(host(inp.data), [1.0, 2.0])
    out = g.values[g.outputs[0]]
    assert not out.evaluated and out.producer is not None
    (c,) = [g.values[i] for i in g.constants]
    assert c.data.item() == 2.0
    mx.eval(b)
    g2 = tapescope.graph_of(b)
    assert g2.ops == [] and g2.values[g2.outputs[0]].evaluated


def test_graph_of_multi_output_and_edges():
    q, r = mx.divmod(mx.array([7.0, 5.0]), mx.array([2.0, 3.0]))
    g = tapescope.graph_of(q, r)
    (op,) = g.ops
    assert op.primitive == "DivMod" and op.family == "multi_output"
    assert g.outputs == op.outputs
    assert [g.values[v].index for v in g.outputs] == [0, 1]
    assert [(e[1], e[2]) for e in g.edges] == [(None, 0), (None, 0), (0, None), (0, None)]


def test_graph_of_compiled_call_has_its_kernel():
    fn = mx.compile(lambda x: mx.exp(x) * 2 + 1)
    g = tapescope.graph_of(fn(mx.array(np.ones(5, np.float32))))
    assert [op.primitive for op in g.ops] == ["Compiled"]
    assert [s[1] for s in g.kernels[0].steps] == ["Exp", "Broadcast", "Multiply", "Broadcast", "Add"]


@pytest.mark.parametrize("xshape,yshape,layout,variant", [
    ((4, 8), (4, 8), "row", "contiguous"),
    ((4, 8), (8,), "row", "strided_2"),
    ((4, 8), (1, 8), "row", "strided_2"),
    ((4, 8), (), "row", "contiguous"),
    ((8, 4), (4, 8), "transposed", "strided_2"),
    ((3, 4, 5), (3, 4, 5), "row", "contiguous"),
])
def test_predicted_variant_is_the_variant_that_runs(xshape, yshape, layout, variant):
    x = mx.array(np.arange(int(np.prod(xshape)), dtype=np.float32).reshape(xshape))
    if layout == "transposed":
        x = mx.transpose(x)
    y = mx.array(np.full(yshape, 0.5, np.float32))
    mx.eval(x, y)

    def f(x, y):
        return mx.exp(x) * y + 1

    (k,) = tapescope.trace(f, x, y).kernels
    assert k.variant == variant  # MLX's rule, worked out by hand for each case
    tapescope.clear_kernel_cache()
    out = mx.compile(f)(x, y)
    mx.eval(out)
    ran = [e["variant"] for e in tapescope.kernel_cache() if e["name"].startswith(k.name + "_")]
    assert ran == [variant]


def test_kernel_sources_name_the_variant_symbol():
    (k,) = tapescope.trace(lambda x: mx.exp(x) + 1, mx.ones((6,))).kernels
    src = k.sources["cpu"]
    assert f"void {k.symbol}(void** args)" in src


def test_trace_pytrees_kwargs_and_names():
    def f(pair, scale=None, *, d):
        a, b = pair
        return {"sum": a + b * scale, "d": d["w"] * 2}

    g = tapescope.trace(f, (mx.ones((2,)), mx.ones((2,))), scale=mx.array(3.0), d={"w": mx.ones((2,))},
                        compile=False)
    assert [g.values[i].name for i in g.inputs] == ["pair[0]", "pair[1]", "scale", "d['w']"]
    assert sorted(g.values[i].name for i in g.outputs) == ["out['d']", "out['sum']"]


def test_trace_errors():
    with pytest.raises(TypeError, match=r"\[trace\]"):
        tapescope.trace(3, mx.ones((2,)))
    with pytest.raises(ValueError, match=r"\[trace\] The function must return at least one array"):
        tapescope.trace(lambda x: 3, mx.ones((2,)))
    with pytest.raises(TypeError, match=r"\[graph_of\]"):
        tapescope.graph_of(np.ones(2))


def test_trace_does_not_evaluate_or_change_its_arguments():
    x = mx.exp(mx.ones((3,)))
    g = tapescope.trace(lambda v: v * 2, x)
    assert x._d.node is not None  # still lazy
    assert not g.values[g.inputs[0]].evaluated
    np.testing.assert_allclose(np.array(x), np.exp(np.ones(3)), rtol=1e-6)


def test_summary_and_repr():
    g = tapescope.trace(chain_of(mx, 15), mx.ones((3,)))
    assert repr(g) == "<Graph chain: 1 input, 2 ops, 2 fused kernels, 1 output>"
    assert "depth limit" in g.summary()


def test_a_compiled_functions_own_tapes_say_why_fusion_stopped():
    """Tracing a function that is already ``mx.compile``d draws its own fused tapes; their
    input edges still say why fusion stopped (a reduction, an argument, ...), not 'unknown'."""
    import tapescope

    f = mx.compile(lambda a: mx.exp(mx.sum(a, axis=0, keepdims=True)) + 1)
    tr = tapescope.trace(f, mx.ones((3, 4)))
    reasons = {(i.producer, i.reason) for k in tr.kernels for i in k.inputs}
    assert ("Sum", "reduction") in reasons, reasons
    assert all(r is not None for _, r in reasons), reasons
