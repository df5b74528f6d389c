"""Pytrees through the transformations as MLX walks them (python/src/trees.cpp): a NamedTuple
or tuple subclass comes back as its own type, a dict subclass (an ``nn.Module``) is walked
as a dict, and grad fills the arguments' lists and dicts in place, putting the originals
back after the call except where the function assigned. Each case runs on tapescope and on
MLX (when installed); the structures (type names, keys) and values must agree, and the
expected types are asserted on tapescope alone too."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

import tapescope.core as mx
from conftest import mlx_ref


def _types(M):
    class State(NamedTuple):
        a: object
        b: object

    class Vector(tuple):
        pass

    class Params(dict):  # what nn.Module is: a dict subclass with attribute access
        def __getattr__(self, k):
            return self[k]

    return State, Vector, Params


def grad_namedtuple(M):
    State, _, _ = _types(M)
    return M.grad(lambda s: (s.a * 10 + s.b * s.b).sum())(State(M.array([1.0, 2.0]),
                                                            M.array([3.0, 4.0])))


def grad_tuple_subclass(M):
    _, Vector, _ = _types(M)
    return M.grad(lambda v: (v[0] * v[1]).sum())(Vector([M.array([1.0, 2.0]), M.array([3.0, 5.0])]))


def grad_dict_subclass_keeps_the_object(M):
    _, _, Params = _types(M)
    p = Params(w=M.array([1.0, 2.0]), b=M.array(0.5))
    seen = []

    def loss(q):
        seen.append(q is p and type(q).__name__)
        return (q.w * 3 + q.b).sum()

    g = M.grad(loss)(p)
    return g, seen, type(g).__name__, p["w"] is not None


def value_and_grad_value_tree(M):
    State, _, _ = _types(M)
    return M.value_and_grad(lambda x: (M.sum(x * x), State(x + 1, x * 2)))(M.array([1.0, 2.0]))


def vmap_namedtuple(M):
    State, _, _ = _types(M)
    out = M.vmap(lambda s: State(s.a + s.b, s.a * s.b))(State(M.array([1.0, 2.0]),
                                                              M.array([3.0, 4.0])))
    return out, type(out).__name__


def compile_namedtuple(M):
    State, Vector, _ = _types(M)
    f = M.compile(lambda s, v: (State(s.a * 2, s.b + 1), Vector([v[0] - v[1]])))
    out = f(State(M.array([1.0]), M.array([2.0])), Vector([M.array([5.0]), M.array([3.0])]))
    return out, [type(o).__name__ for o in out]


def grad_restores_the_list(M):
    arrs = [M.array(1.0), M.array(2.0), M.array(3.0)]
    first, second, third = arrs

    def fun(xs):
        xs[1] = xs[0] * xs[2]
        return xs[1]

    g = M.grad(fun)(arrs)
    return g, [arrs[0] is first, arrs[1] is second, arrs[2] is third], arrs[1]


CASES = [grad_namedtuple, grad_tuple_subclass, grad_dict_subclass_keeps_the_object,
         value_and_grad_value_tree, vmap_namedtuple, compile_namedtuple, grad_restores_the_list]


def _flat(t, out):
    """Structure and leaves: a container's type name (and keys), numbers as float64."""
    if isinstance(t, (list, tuple)):
        out.append(type(t).__name__)
        for x in t:
            _flat(x, out)
    elif isinstance(t, dict):
        out.append("dict")
        for k in t:
            out.append(k)
            _flat(t[k], out)
    elif hasattr(t, "shape") and hasattr(t, "dtype"):
        out.append((tuple(t.shape), np.array(t, np.float64)))
    else:
        out.append(t)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_trees_through_transformations_match_mlx(case):
    got = _flat(case(mx), [])
    if mlx_ref is None:
        pytest.skip("mlx is not installed")
    want = _flat(case(mlx_ref), [])
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, tuple) and len(b) == 2 and isinstance(b[1], np.ndarray):
            assert a[0] == b[0]
            np.testing.assert_allclose(a[1], b[1], rtol=1e-6)
        else:
            assert a == b


def test_tuple_subclasses_keep_their_type_and_dict_subclasses_stay_the_argument():
    State, Vector, Params = _types(mx)
    g = grad_namedtuple(mx)
    assert type(g).__name__ == "State"
    np.testing.assert_allclose(np.array(g.a), [10.0, 10.0])
    np.testing.assert_allclose(np.array(g.b), [6.0, 8.0])
    assert type(grad_tuple_subclass(mx)).__name__ == "Vector"
    g, seen, name, _ = grad_dict_subclass_keeps_the_object(mx)
    assert seen == ["Params"] and name == "dict"
    np.testing.assert_allclose(np.array(g["w"]), [3.0, 3.0])
    assert compile_namedtuple(mx)[1] == ["State", "Vector"]


def test_grad_puts_back_the_originals_the_function_did_not_assign():
    g, same, new = grad_restores_the_list(mx)
    assert same == [True, False, True]
    assert new.item() == 3.0
    assert g[0].item() == 3.0 and g[2].item() == 1.0


def test_grad_puts_back_the_originals_when_the_function_raises():
    arrs = [mx.array(1.0)]
    first = arrs[0]

    def fun(xs):
        raise KeyError("boom")

    with pytest.raises(KeyError):
        mx.grad(fun)(arrs)
    assert arrs[0] is first
