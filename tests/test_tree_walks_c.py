"""core/_tree.c's walks against tree.py's Python walks: ``tree_arrays`` (the same arrays,
the same order, strict mode's error) and ``tree_fill`` (the same tree back, lists and dicts
updated in place, tuples rebuilt as their own type) over random pytrees of lists, tuples,
dicts, NamedTuples, a dict subclass that keeps dict's methods (``nn.Module``'s kind), one
that overrides item assignment, a list subclass, ``mx.random.state`` and non-array leaves."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from tapescope.core import tree
from tapescope.core.random_state import set_thread_key, thread_key

_tree = pytest.importorskip("tapescope.core._tree")
pytestmark = pytest.mark.skipif(tree.tree_arrays is tree.tree_arrays_py,
                                reason="the C walks are off (TAPESCOPE_C_CALL=0)")


class Pair(NamedTuple):
    a: object
    b: object


class Vector(tuple):
    pass


class Params(dict):  # nn.Module's kind: dict's own values, items and assignment
    def __getattr__(self, k):
        return self[k]


class Logged(dict):  # its own assignment: the walk must call it
    def __setitem__(self, k, v):
        self.__dict__.setdefault("log", []).append(k)
        dict.__setitem__(self, k, v)


class Items(list):
    def __iter__(self):  # its own iteration: the walk must use it
        return iter(list.__iter__(self))


LEAVES = st.sampled_from(["array", "array", "int", "none", "str", "random"])


def build(shape):
    """A fresh tree from a drawn shape (arrays made anew each time)."""
    kind, kids = shape
    if kind == "array":
        return mx.array(float(len(kids)))
    if kind == "int":
        return 3
    if kind == "none":
        return None
    if kind == "str":
        return "s"
    if kind == "random":
        return mx.random.state
    made = [build(k) for k in kids]
    if kind == "list":
        return made
    if kind == "items":
        return Items(made)
    if kind == "tuple":
        return tuple(made)
    if kind == "vector":
        return Vector(made)
    if kind == "pair":
        return Pair(made[0] if made else None, made[1] if len(made) > 1 else None)
    cls = {"dict": dict, "params": Params, "logged": Logged}[kind]
    return cls({f"k{i}": v for i, v in enumerate(made)})


shapes = st.recursive(
    st.tuples(LEAVES, st.just(())),
    lambda kids: st.tuples(st.sampled_from(["list", "items", "tuple", "vector", "pair", "dict",
                                            "params", "logged"]),
                           st.lists(kids, max_size=4).map(tuple)),
    max_leaves=12)


def describe(t, values=()):
    """The tree's structure, each array as its place in ``values`` (else "kept")."""
    if isinstance(t, mx.array):
        return ("array", next((i for i, v in enumerate(values) if v is t), "kept"))
    if t is mx.random.state:
        return ("random",)
    if isinstance(t, dict):
        return (type(t).__name__, [(k, describe(v, values)) for k, v in t.items()],
                vars(t).get("log") if isinstance(t, Logged) else None)
    if isinstance(t, (list, tuple)):
        return (type(t).__name__, [describe(v, values) for v in t])
    return ("leaf", repr(t))


@settings(max_examples=150, deadline=None)
@given(shapes, st.booleans())
def test_tree_arrays_is_the_python_walk(shape, strict):
    t = build(shape)
    try:
        want = tree.tree_arrays_py(t, None, strict)
    except ValueError as e:
        with pytest.raises(ValueError, match=str(e).replace("[", r"\[").replace("]", r"\]")):
            tree.tree_arrays(t, None, strict)
        return
    got = tree.tree_arrays(t, None, strict)
    assert [id(a) for a in got] == [id(a) for a in want]
    out = [1]
    assert tree.tree_arrays(t, out) is out and out[1:] == want and out[0] == 1


@settings(max_examples=150, deadline=None)
@given(shapes, st.integers(0, 2))
def test_tree_fill_is_the_python_update(shape, short):
    t1, t2 = build(shape), build(shape)
    n = len(tree.tree_arrays_py(t1))
    key = thread_key()
    values = [mx.array(float(100 + i)) for i in range(max(0, n - short))]
    try:
        r1, err = tree.tree_fill_py(t1, values), None
    except StopIteration as e:
        err = e
    py_key = thread_key()
    set_thread_key(key)  # (the calling thread's key, as the Python walk found it)
    if err is not None:
        with pytest.raises(StopIteration):
            tree.tree_fill(t2, values)
        set_thread_key(key)
        return
    r2 = tree.tree_fill(t2, values)
    assert describe(r2, values) == describe(r1, values)
    assert describe(t2, values) == describe(t1, values)  # what was updated in place
    assert thread_key() is py_key
    set_thread_key(key)


def test_the_optimizer_state_round_trips():
    import mlx.nn  # noqa: F401  (an nn.Module is a dict subclass with dict's methods)

    state = [Params(layers=[Params(w=mx.zeros((2, 2)), b=mx.zeros((2,))), Params()]),
             {"step": mx.array(0), "learning_rate": mx.array(0.1),
              "layers": [{"w": {"m": mx.zeros((2, 2)), "v": mx.zeros((2, 2))}}]}]
    flat = tree.tree_arrays(state)
    assert [id(a) for a in flat] == [id(a) for a in tree.tree_arrays_py(state)]
    new = [mx.array(float(i)) for i in range(len(flat))]
    assert tree.tree_fill(state, new) is state
    assert [id(a) for a in tree.tree_arrays(state)] == [id(a) for a in new]
