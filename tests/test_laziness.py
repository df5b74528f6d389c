"""Lazy evaluation: nothing runs before it is needed, eval realises and detaches, work is shared."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tapescope
import tapescope.core as mx


def ran(rec) -> list[str]:
    """The names of the primitives that ran inside a ``tapescope.record()`` region."""
    return [r.name for r in rec.records if r.kind == "primitive"]


def lazy(x: mx.array) -> bool:
    return x._d.node is not None


F32 = hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                 elements=st.floats(-4, 4, width=32))

# A small expression language: (name, tapescope op, numpy reference).
UNARY = [("exp", mx.exp, np.exp), ("negative", mx.negative, np.negative)]
BINARY = [("add", mx.add, np.add), ("multiply", mx.multiply, np.multiply),
          ("subtract", mx.subtract, np.subtract)]


@settings(max_examples=40, deadline=None)
@given(x=F32, steps=st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.floats(-2, 2, width=32)),
                             min_size=1, max_size=6))
def test_nothing_runs_until_eval(x, steps):
    with tapescope.record() as building, np.errstate(all="ignore"):
        a = mx.array(x)
        ref = x.copy()
        for is_unary, k, c in steps:
            if is_unary:
                _, op, npop = UNARY[k % len(UNARY)]
                a, ref = op(a), npop(ref)
            else:
                _, op, npop = BINARY[k]
                a, ref = op(a, c), npop(ref, np.float32(c))
        assert lazy(a)
    assert ran(building) == []
    with tapescope.record() as evaluating:
        mx.eval(a)
    assert len(ran(evaluating)) >= len(steps)
    assert not lazy(a)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(np.array(a), ref.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_primitive_records_carry_mlx_names():
    with tapescope.record() as rec:
        y = mx.exp(mx.array([1.0, 2.0])) + mx.array([1.0, 1.0])
        assert ran(rec) == []
        mx.eval(y)
    names = ran(rec)
    assert "Exp" in names and names[-1] == "Add"


def _tree_cases():
    a, b, c = mx.array([1.0]) + 1, mx.array([2.0]) * 3, mx.exp(mx.array([0.0]))
    want = {"a": [2.0], "b": [6.0], "c": [1.0]}
    return (a, b, c), want


@pytest.mark.parametrize("shape", ["list", "tuple", "dict", "nested", "varargs"])
def test_eval_of_pytrees(shape):
    (a, b, c), want = _tree_cases()
    tree = {"list": lambda: ([a, b, c],), "tuple": lambda: ((a, b, c),),
            "dict": lambda: ({"x": a, "y": b, "z": c},),
            "nested": lambda: ([a, {"k": (b, [c])}],), "varargs": lambda: (a, b, c)}[shape]()
    assert all(lazy(t) for t in (a, b, c))
    mx.eval(*tree)
    assert not any(lazy(t) for t in (a, b, c))
    assert {"a": a.tolist(), "b": b.tolist(), "c": c.tolist()} == want


@pytest.mark.parametrize("leaf", [1, 2.5, "text", None, object(), {1, 2}])
def test_eval_ignores_non_array_leaves_as_mlx(mlx, leaf):
    x = mx.array([1.0]) + 1
    mx.eval([x, leaf], {"k": leaf})
    mlx.eval([mlx.array([1.0]) + 1, leaf], {"k": leaf})  # MLX accepts these too
    mx.eval(leaf)
    mlx.eval(leaf)
    assert not lazy(x) and x.tolist() == [2.0]


def test_eval_with_nothing_and_evaluated_arrays_runs_nothing():
    x = mx.array([1.0]) + 1
    mx.eval(x)
    with tapescope.record() as rec:
        mx.eval()
        mx.eval(x, [x])
        mx.async_eval(x)
        x.tolist()
    assert ran(rec) == []


def test_eval_detaches_and_frees_the_graph(young_heap):
    x = mx.array(np.arange(6, dtype=np.float32))
    h = mx.exp(x)
    y = h * 2
    x_ref, h_ref = weakref.ref(x._d), weakref.ref(h._d)
    del x, h
    gc.collect()
    assert x_ref() is not None and h_ref() is not None  # the graph keeps its inputs alive
    mx.eval(y)
    assert y._d.node is None
    gc.collect()
    assert x_ref() is None and h_ref() is None  # evaluated: the graph above y is gone
    np.testing.assert_allclose(y.tolist(), np.exp(np.arange(6, dtype=np.float32)) * 2, rtol=1e-6)


def test_evaluated_array_used_again_is_not_recomputed():
    x = mx.array([1.0, 2.0])
    h = mx.exp(x)
    mx.eval(h)
    with tapescope.record() as rec:
        y = h + 1
        mx.eval(y)
    assert ran(rec).count("Exp") == 0
    np.testing.assert_allclose(y.tolist(), np.exp([1.0, 2.0]) + 1, rtol=1e-6)


def test_siblings_are_realised_together():
    if not hasattr(mx, "divmod"):
        pytest.skip("divmod (a two-output primitive) is not implemented yet")
    a, b = mx.array([7, -7, 9]), mx.array([2, 2, -4])
    q, r = mx.divmod(a, b)
    assert lazy(q) and lazy(r) and q._d.node is r._d.node
    with tapescope.record() as rec:
        mx.eval(q)
    assert not lazy(r)
    assert ran(rec).count("DivMod") == 1
    with tapescope.record() as rec:
        got = (q.tolist(), r.tolist())
    assert ran(rec) == []
    want = np.divmod(np.array([7, -7, 9]), np.array([2, 2, -4]))
    assert got == (want[0].tolist(), want[1].tolist())


def test_sibling_kept_alone_still_realises(young_heap):
    if not hasattr(mx, "divmod"):
        pytest.skip("divmod (a two-output primitive) is not implemented yet")
    q, r = mx.divmod(mx.array([7, 8]), mx.array([3, 3]))
    del q
    gc.collect()
    assert r.tolist() == [1, 2]


REALISERS = {
    "item": lambda y: y.sum().item() if hasattr(y, "sum") else float(y[0]),
    "tolist": lambda y: y.tolist(),
    "np.array": lambda y: np.array(y),
    "np.asarray": lambda y: np.asarray(y),
    "repr": repr,
    "str": str,
    "print": print,
    "format": lambda y: f"{y}",
    "iter": lambda y: [v.item() for v in y],
    "float": lambda y: float(y[0]),
    "pickle": lambda y: __import__("pickle").dumps(y),
}


@pytest.mark.parametrize("how", sorted(REALISERS))
def test_reading_a_lazy_array_evaluates_it(how, capsys):
    y = mx.exp(mx.array([0.0, 1.0])) * 2
    assert lazy(y)
    with tapescope.record() as rec:
        REALISERS[how](y)
    assert not lazy(y)
    assert "Exp" in ran(rec)
    np.testing.assert_allclose(y.tolist(), np.exp([0.0, 1.0]) * 2, rtol=1e-6)


def test_scalar_conversions_evaluate():
    for conv in (bool, int, float, complex):
        y = mx.array(1.5) * 2
        with tapescope.record() as rec:
            v = conv(y)
        assert v == conv(3.0) and "Multiply" in ran(rec)


def test_shared_subexpression_is_computed_once():
    x = mx.array([0.5, 1.5])
    h = mx.exp(x)
    y = h + h * 2
    z = h - 1
    with tapescope.record() as rec:
        mx.eval(y, z)
    assert ran(rec).count("Exp") == 1
    e = np.exp(np.array([0.5, 1.5], dtype=np.float32))
    np.testing.assert_allclose(y.tolist(), e + e * 2, rtol=1e-6)
    np.testing.assert_allclose(z.tolist(), e - 1, rtol=1e-6)


def test_shared_subexpression_across_two_evals():
    h = mx.exp(mx.array([1.0]))
    y, z = h + 1, h + 2
    with tapescope.record() as rec:
        mx.eval(y)
        mx.eval(z)
    assert ran(rec).count("Exp") == 1
