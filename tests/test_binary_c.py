"""Binary ops recorded in C (core/_binary.c) against their Python reference
(ops/elementwise.py ``binary_py``) and MLX: weak typing of Python scalar operands (every dtype
x float / int / bool, both sides, the operator and the function forms), promotion, casts,
broadcasts and the graph recorded; a scalar's 0-d array (convert.py ``_scalar``); the
allocator's Buffers and handles outside the cyclic collector."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import tapescope.core as mx
from tapescope.core import _call
from tapescope.core.array import array
from tapescope.core.ops import convert, elementwise

from elementwise_util import NAMES

pytestmark = pytest.mark.skipif(elementwise.binary is elementwise.binary_py,
                                reason="the C extension is not built (or c_call is off)")

OPS = ["add", "subtract", "multiply", "maximum", "minimum", "less", "greater_equal",
       "not_equal", "power", "floor_divide", "divide"]
OPERATORS = {"add": "__add__", "subtract": "__sub__", "multiply": "__mul__",
             "less": "__lt__", "floor_divide": "__floordiv__", "power": "__pow__",
             "divide": "__truediv__"}
REFLECTED = {"add": "__radd__", "subtract": "__rsub__", "multiply": "__rmul__",
             "floor_divide": "__rfloordiv__", "power": "__rpow__", "divide": "__rtruediv__"}

SCALARS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.5, -0.0, 1e-30, 65504.0, 65520.0, 3.4e38, 3.5e38, 1e308]),
    st.integers(-3, 300), st.sampled_from([2**31, -(2**31) - 1, 2**40, 255, 256, -1, 70000]),
    st.booleans())


def _pair(mod, dtype_name, data):
    if dtype_name == "bfloat16":
        return mod.array(data.astype(np.float32), dtype=mod.bfloat16)
    return mod.array(data, dtype=getattr(mod, dtype_name))


def _outcome(fn):
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return ("error", type(e).__name__, str(e))
    return ("ok", out)


def _host(x, mod):
    """``x`` as numpy (bfloat16 through float32)."""
    return np.array(x.astype(mod.float32)) if "bfloat16" in repr(x.dtype) else np.array(x)


def _same(got, ref, mlx):
    assert got[0] == ref[0], (got, ref)
    if got[0] == "error":
        assert got[1:] == ref[1:]
        return
    g, r = got[1], ref[1]
    assert repr(g.dtype) == repr(r.dtype)
    assert g.shape == tuple(r.shape)
    gn, rn = _host(g, mx), _host(r, mlx)
    if gn.dtype.kind in "biu":
        assert np.array_equal(gn, rn)
    else:
        np.testing.assert_allclose(gn, rn, rtol=2e-2, atol=0, equal_nan=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(NAMES), v=SCALARS, op=st.sampled_from(OPS), left=st.booleans(),
       form=st.sampled_from(["function", "operator"]))
def test_python_scalar_operands_are_typed_as_mlx_types_them(mlx, dtype, v, op, left, form):
    data = np.array([1, 2, 3]).astype(np.float64 if dtype not in ("bool_",) else bool)
    if dtype.startswith("u") or dtype.startswith("int") or dtype == "bool_":
        data = data.astype(bool if dtype == "bool_" else np.dtype(dtype))
    a, r = _pair(mx, dtype, data), _pair(mlx, dtype, data)

    def run(mod, x):
        if form == "operator":
            name = OPERATORS.get(op) if not left else REFLECTED.get(op)
            if name is not None:
                return lambda: getattr(x, name)(v)
        fn = getattr(mod, op)
        return (lambda: fn(v, x)) if left else (lambda: fn(x, v))

    with np.errstate(all="ignore"):
        got = _outcome(run(mx, a))
        ref = _outcome(run(mlx, r))
        _same(got, ref, mlx)


def _graph(out):
    """Every node above ``out`` as (primitive, params, input shapes / dtypes, output)."""
    rows, seen, stack = [], set(), [out._d]
    while stack:
        d = stack.pop()
        n = d.node
        if n is None:
            rows.append(("data", d.shape, d.dtype.name, np.asarray(d.data).tolist(),
                         d.stream is not None, d.tracer, d.index))
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        rows.append((n.primitive.name, n.primitive.params, n.primitive.stream,
                     tuple((x.shape, x.dtype.name) for x in n.inputs), d.shape, d.dtype.name,
                     d.tracer, d.index, n.event, n.keep, n.backward, d.data, d.buffer, d.kept))
        stack.extend(n.inputs)
    return rows


SHAPE_DTYPES = ["float32", "float16", "int32", "int8", "uint16", "bool_", "float64", "complex64"]


@settings(max_examples=80, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
       da=st.sampled_from(SHAPE_DTYPES), db=st.sampled_from(SHAPE_DTYPES),
       op=st.sampled_from(["Add", "Multiply", "Maximum", "Less"]),
       scalar=st.sampled_from([None, "a", "b"]),
       force=st.sampled_from([None, "float32", "int32"]))
def test_recorded_graph_is_the_python_references(shapes, da, db, op, scalar, force):
    (sa, sb), _ = shapes
    rng = np.random.default_rng(0)
    a = mx.array(rng.integers(0, 3, sa).astype(np.dtype(da.rstrip("_"))))
    b = mx.array(rng.integers(0, 3, sb).astype(np.dtype(db.rstrip("_"))))
    x = 0.75 if scalar == "a" else a
    y = 0.75 if scalar == "b" else b
    kw = {"dtype": getattr(mx, force)} if force else {}
    out_c = _outcome(lambda: elementwise.binary(op, x, y, None, **kw))
    out_py = _outcome(lambda: elementwise.binary_py(op, x, y, None, **kw))
    assert out_c[0] == out_py[0]
    if out_c[0] == "error":
        assert out_c[1:] == out_py[1:]
        return
    assert _graph(out_c[1]) == _graph(out_py[1])
    assert np.array_equal(np.array(out_c[1]), np.array(out_py[1]))


def test_shapes_that_do_not_broadcast_raise_mlx_error_before_any_node(mlx):
    a, b = mx.zeros((2, 3)), mx.zeros((4,))
    with pytest.raises(ValueError) as got:
        a + b
    with pytest.raises(ValueError) as ref:
        mlx.zeros((2, 3)) + mlx.zeros((4,))
    assert str(got.value) == str(ref.value)


def test_none_operand_and_bad_arguments():
    with pytest.raises(TypeError):
        mx.add(mx.zeros((2,)), None)
    with pytest.raises(TypeError):
        _call.binary("Add", mx.zeros((2,)))
    with pytest.raises(TypeError):
        _call.binary("Add", mx.zeros((2,)), 1.0, None, colour=1)
    with pytest.raises(KeyError):
        _call.binary("NoSuchPrimitive", mx.zeros((2,)), 1.0, None)
    with pytest.raises(TypeError):
        _call.scalar(1.0, np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "complex64", "int32"])
def test_scalar_is_the_python_scalar(dtype):
    dt = getattr(mx, dtype)
    v = 3 if dtype == "int32" else 0.1
    got = _call.scalar(v, dt)
    ref = array._wrap(convert.ArrayDesc((), dt, convert.resolve_stream(None),
                                        data=np.array(v, dtype=dt.np)))
    for slot in ("shape", "dtype", "stream", "node", "index", "tracer", "kept"):
        assert getattr(got._d, slot) == getattr(ref._d, slot), slot
    assert got._d.data.dtype == ref._d.data.dtype and got._d.data.tolist() == ref._d.data.tolist()
    assert got._d.data.base is None and got._d.buffer.buffer.size == ref._d.buffer.buffer.size
    assert not gc.is_tracked(got._d)
    assert convert._scalar(v, dt).item() == ref.item()


def test_mean_normalizer_is_mlx(mlx):
    for dtype in ("float32", "float16", "int32", "bfloat16"):
        data = np.arange(7).astype(np.float32)
        got = mx.mean(_pair(mx, dtype, data.astype(np.int32) if dtype == "int32" else data))
        ref = mlx.mean(_pair(mlx, dtype, data.astype(np.int32) if dtype == "int32" else data))
        assert repr(got.dtype) == repr(ref.dtype)
        assert math.isclose(got.astype(mx.float32).item(), ref.astype(mlx.float32).item(),
                            rel_tol=1e-3)


def test_allocator_buffers_and_handles_leave_the_collector():
    from tapescope.kernels.allocator import Buffer, allocator

    alloc = allocator("cpu")
    data = np.ones(16, np.float32)
    buf = alloc.adopt(data)
    assert type(buf) is Buffer and not gc.is_tracked(buf)
    h = type(mx.array(1.0)._d.buffer)(buf, alloc)
    assert not gc.is_tracked(h)
    x = mx.exp(mx.ones((1000,)))
    mx.eval(x)
    assert not gc.is_tracked(x._d.buffer.buffer) and not gc.is_tracked(x._d.buffer)

    class Sub(Buffer):  # a subclass may hold more: it stays tracked, and so does its handle
        __slots__ = ("extra",)

    sub = Sub(np.ones(4, np.uint8), 4)
    assert gc.is_tracked(sub)
    assert gc.is_tracked(type(h)(sub, alloc))
    del h  # the adopted buffer goes back to the allocator (its accounting unchanged)


# values a double rounds to differently than its float32 does: halfway in the 16-bit type
# once rounded to float32, just above halfway as a double
_TWICE_ROUNDED = [1 + 2**-11 + 2**-30, 1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-29),
                  2.0**-14 * (1 + 2**-11 + 2**-40), 65519.99, 3.3895313892515355e38]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(v=st.one_of(st.floats(allow_nan=False, allow_infinity=True, width=64),
                   st.sampled_from(_TWICE_ROUNDED)),
       dtype=st.sampled_from(["float16", "bfloat16"]))
def test_a_python_float_rounds_to_16_bits_through_float32_as_mlx(mlx, v, dtype):
    """MLX makes the float a float32, then the 16-bit type: the result's bits, each path."""
    a, r = _pair(mx, dtype, np.ones(2)), _pair(mlx, dtype, np.ones(2))

    def bits(mod, x):
        return np.array(x.view(mod.uint16)).tolist()

    with np.errstate(all="ignore"):
        ref = [bits(mlx, r * v), bits(mlx, v - r)]
        assert [bits(mx, a * v), bits(mx, v - a)] == ref
        py = convert._scalar.__wrapped__  # the GPU streams' version
        if math.isfinite(v) and abs(v) <= (65504 if dtype == "float16" else 3.3895313892515355e38):
            dt = getattr(mx, dtype)
            assert bits(mx, py(v, dt) * a) == ref[0]
            assert bits(mx, _call.scalar(v, dt) * a) == ref[0]


C_OPERATORS = ["__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
               "__truediv__", "__rtruediv__"]


@settings(max_examples=120, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
       da=st.sampled_from(SHAPE_DTYPES), db=st.sampled_from(SHAPE_DTYPES),
       name=st.sampled_from(C_OPERATORS),
       other=st.sampled_from(["array", "float", "int", "numpy", "list", "none", "str"]))
def test_operators_in_c_record_the_python_operators_graph(shapes, da, db, name, other):
    """``a + b`` etc. through core/_binary.c's operators: the same nodes, values and errors as
    array_methods.py's Python ops (which they call for any operand but an array or a float)."""
    from tapescope.core import array_methods

    if name not in array_methods.PY_OPERATORS:
        pytest.skip("the C operators are not installed")
    (sa, sb), _ = shapes
    rng = np.random.default_rng(1)
    a = mx.array(rng.integers(1, 4, sa).astype(np.dtype(da.rstrip("_"))))
    b_np = rng.integers(1, 4, sb).astype(np.dtype(db.rstrip("_")))
    y = {"array": mx.array(b_np), "float": 0.75, "int": 3, "numpy": b_np, "list": [1.5, 2.0],
         "none": None, "str": "x"}[other]
    c_op, py_op = getattr(array, name), array_methods.PY_OPERATORS[name]
    assert c_op is not py_op
    with np.errstate(all="ignore"):
        out_c = _outcome(lambda: c_op(a, y))
        out_py = _outcome(lambda: py_op(a, y))
    assert out_c[0] == out_py[0], (out_c, out_py)
    if out_c[0] == "error":
        assert out_c[1:] == out_py[1:]
        return
    assert _graph(out_c[1]) == _graph(out_py[1])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.array(out_c[1]), np.array(out_py[1]))
