"""Reverse mode's walk in C (``interactive/core/_autodiff.c``: ``vjp_walk`` / ``vjp_mark``)
against its Python reference (``autodiff/engine.py``'s ``_reverse_py`` / ``_mark_py``): the
same gradient graph node for node (primitives, parameters, inputs, ``Node.backward``
flags), the same values bit for bit, the same errors; and gradients against numpy float64
worked by hand (an independent reference). Skips where the extension is not built or the
C call is off (``TAPESCOPE_C_CALL=0``)."""

from __future__ import annotations

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.core.autodiff import engine
from tapescope.core.walk import topological

_call = pytest.importorskip("tapescope.core._call", reason="interactive/core/_call.c is not built")


def _c_walk_on() -> bool:
    mx.eval(mx.grad(lambda x: mx.sum(x * x))(mx.array([1.0])))  # (the first walk picks it)
    return engine._reverse is _call.vjp_walk


pytestmark = pytest.mark.skipif(not _c_walk_on(), reason="the C walk is off (TAPESCOPE_C_CALL=0)")


def _python_walk(monkeypatch) -> None:
    monkeypatch.setattr(engine, "_reverse", engine._reverse_py)
    monkeypatch.setattr(engine, "_mark", engine._mark_py)


def _signature(arrays) -> list:
    """The graph above ``arrays`` as data: per node in topological order its primitive,
    parameters, backward flag, output shapes / dtypes and each input as (earlier node's
    position, output index) or a leaf's number (leaves numbered as first reached)."""
    descs = [a._d for a in arrays]
    order = topological(descs, kept=True)
    pos = {id(n): k for k, n in enumerate(order)}
    leaves: dict = {}
    sig = []
    for n in order:
        ins = []
        for x in n.inputs:
            node = x.node if x.node is not None else x.kept
            if node is None or id(node) not in pos:
                ins.append(("leaf", leaves.setdefault(id(x), len(leaves))))
            else:
                ins.append((pos[id(node)], x.index))
        outs = [(tuple(o.shape), o.dtype.name) for o in (r() for r in n.outputs) if o is not None]
        sig.append((n.primitive.name, repr(n.primitive.params), n.backward, outs, ins))
    sig.append([("out", pos.get(id(d.node)) if d.node is not None else "data",
                 tuple(d.shape), d.dtype.name) for d in descs])
    return sig


def _both(monkeypatch, make):
    """``make()`` (a list of gradient arrays) under the C walk, then the Python walk: their
    graphs' signatures and evaluated values."""
    out = []
    for python in (False, True):
        if python:
            _python_walk(monkeypatch)
        grads = make()
        sig = _signature(grads)
        mx.eval(*grads)
        out.append((sig, [np.array(g) for g in grads]))
    monkeypatch.undo()
    return out


rng = np.random.default_rng(0)
X = rng.standard_normal((6, 5)).astype(np.float32)
W1 = (rng.standard_normal((5, 8)) * 0.4).astype(np.float32)
B1 = rng.standard_normal(8).astype(np.float32)
W2 = (rng.standard_normal((8, 3)) * 0.4).astype(np.float32)
B2 = rng.standard_normal(3).astype(np.float32)
Y = np.array([0, 2, 1, 1, 0, 2], np.int32)


def _mlp_loss(w1, b1, w2, b2, x, y):
    relu = mx.compile(lambda v: mx.maximum(v, 0.0), shapeless=True)  # (mlx.nn's: a Compiled)
    h = relu(mx.addmm(b1, x, w1))
    logits = mx.addmm(b2, h, w2)
    lse = mx.logsumexp(logits, axis=-1)
    picked = mx.take_along_axis(logits, mx.expand_dims(y, -1), axis=-1).squeeze(-1)
    return mx.mean(lse - picked)


def _mlp_grads():
    args = [mx.array(v) for v in (W1, B1, W2, B2, X)] + [mx.array(Y)]
    return list(mx.grad(_mlp_loss, argnums=[0, 1, 2, 3])(*args))


def _mlp_reference():
    """The MLP's gradients in float64 by hand: softmax minus one-hot, back through the
    layers."""
    x, w1, b1, w2, b2 = (v.astype(np.float64) for v in (X, W1, B1, W2, B2))
    z1 = x @ w1 + b1
    h = np.maximum(z1, 0)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dlogits = (p - np.eye(3)[Y]) / len(Y)
    dw2, db2 = h.T @ dlogits, dlogits.sum(0)
    dz1 = (dlogits @ w2.T) * (z1 > 0)
    return [x.T @ dz1, dz1.sum(0), dw2, db2]


def test_the_mlp_gradients_match_float64_by_hand():
    for g, ref in zip(_mlp_grads(), _mlp_reference()):
        np.testing.assert_allclose(np.array(g), ref, rtol=2e-5, atol=2e-6)


def _split_unused(x):
    a, b, c = mx.split(x, 3, axis=1)  # one node, three outputs: c dies unused
    del c
    return mx.sum(a * b) + mx.sum(mx.exp(b))


def _stopped(x):
    return mx.sum(x * mx.stop_gradient(x * 3.0) + mx.sin(x))


def _bools(x):
    # Greater's output is bool: the int32 cotangent of a bool sum reaches it uncast
    return mx.sum(x > 0.5).astype(mx.float32) + mx.sum(mx.where(x > 0.0, x, -x))


def _half(x):
    return mx.sum(x.astype(mx.float16) * mx.array(1.5, mx.float16)).astype(mx.float32) + mx.sum(x)


def _used_twice(x):
    y = mx.exp(x)
    return mx.sum(y * y + y) + mx.sum(mx.tanh(x) * x)


def _eval_inside(x):
    y = mx.exp(x) * 2.0
    mx.eval(y)  # a tracer evaluated inside the transformation keeps its graph
    return mx.sum(y * x)


@mx.custom_function
def _triple_grad(x):
    return x * 2.0


@_triple_grad.vjp
def _triple_grad_vjp(primal, cotangent, output):
    return cotangent.astype(mx.float32) * 3.0  # float32 for a float16 input: the walk casts


def _custom_dtype(x):
    return mx.sum(_triple_grad(x.astype(mx.float16))).astype(mx.float32)


CASES = {"custom_dtype": _custom_dtype, "split_unused": _split_unused, "stop_gradient": _stopped, "bools": _bools,
         "float16": _half, "used_twice": _used_twice, "eval_inside": _eval_inside}
V = mx.array(np.linspace(-1.0, 1.2, 12, dtype=np.float32).reshape(2, 6))


@pytest.mark.parametrize("name", sorted(CASES) + ["mlp", "grad_of_grad", "value_and_grad_aux",
                                                  "vjp_two_outputs", "vjp_bool_primal"])
def test_the_c_walk_records_the_python_walks_graph(monkeypatch, name):
    def make():
        if name == "mlp":
            return _mlp_grads()
        if name == "grad_of_grad":
            return [mx.grad(lambda x: mx.sum(mx.grad(lambda y: mx.sum(mx.sin(y) * y))(x) ** 2))(V)]
        if name == "value_and_grad_aux":
            (v, aux), g = mx.value_and_grad(lambda x: (mx.sum(x * x), mx.exp(x)))(V)
            return [v, aux, g]
        if name == "vjp_two_outputs":
            outs, g = mx.vjp(lambda x, y: [x * y, mx.exp(x) + y], [V, V * 2.0],
                             [mx.ones_like(V), V])
            return outs + g
        if name == "vjp_bool_primal":  # a bool input keeps its cotangent's int32
            outs, g = mx.vjp(lambda b: [mx.sum(b, axis=1)], [V > 0.0], [mx.array([2, 5])])
            return outs + g
        return [mx.grad(CASES[name])(V)]

    (c_sig, c_vals), (py_sig, py_vals) = _both(monkeypatch, make)
    assert c_sig == py_sig
    for a, b in zip(c_vals, py_vals):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_gradients_of_the_cases_match_float64_by_hand():
    v = np.array(V).astype(np.float64)
    a, b = v[:, 0:2], v[:, 2:4]
    split = np.concatenate([b, a + np.exp(b), np.zeros_like(a)], axis=1)
    want = {"split_unused": split, "stop_gradient": 3 * v + np.cos(v),
            "bools": np.where(v > 0, 1.0, -1.0), "custom_dtype": np.full_like(v, 3.0), "float16": np.full_like(v, 2.5),
            "used_twice": 2 * np.exp(2 * v) + np.exp(v) + np.tanh(v) + v / np.cosh(v) ** 2,
            "eval_inside": 2 * np.exp(v) * (1 + v)}
    for name, ref in want.items():
        np.testing.assert_allclose(np.array(mx.grad(CASES[name])(V)), ref, rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def test_a_bool_primals_cotangent_keeps_its_dtype():
    _, (g,) = mx.vjp(lambda b: [mx.sum(b, axis=1)], [V > 0.0], [mx.array([2, 5])])
    assert g.dtype == mx.int32 and np.array(g).tolist() == [[2] * 6, [5] * 6]


def test_the_backward_flags_are_the_walks_nodes_only():
    x = mx.array(X)
    h = mx.exp(x)  # forward, recorded before the walk
    loss, g = mx.value_and_grad(lambda w: mx.sum(mx.tanh(h @ w) * h[:, :1]))(mx.array(W1))
    forward = {id(n) for n in topological([loss._d])}
    order = topological([g._d])
    assert len(order) > len(forward) // 2 and any(id(n) in forward for n in order)
    for n in order:
        assert n.backward == (id(n) not in forward), n


def test_a_primitive_without_a_vjp_raises_mlx_error(monkeypatch):
    a = mx.array(np.array([[2.0, 1.0], [1.0, 3.0]], np.float32))
    for python in (False, True):
        if python:
            _python_walk(monkeypatch)
        with pytest.raises(ValueError, match=r"^\[Primitive::vjp\] Not implemented for Inverse\.$"):
            mx.grad(lambda m: mx.sum(mx.linalg.inv(m, stream=mx.cpu)))(a)


def test_a_rule_returning_the_wrong_count_raises_and_the_retain_count_is_restored(monkeypatch):
    from tapescope.core import transform_tracers
    from tapescope.kernels.primitives import REGISTRY

    monkeypatch.setattr(REGISTRY["Exp"], "vjp", lambda p, c, argnums, o: [])
    for python in (False, True):
        if python:
            monkeypatch.setattr(engine, "_reverse", engine._reverse_py)
        with pytest.raises(ValueError, match=r"^\[vjp\] The VJP of Exp returned 0 cotangents for "
                                             r"1 inputs\.$"):
            mx.grad(lambda x: mx.sum(mx.exp(x)))(V)
        assert transform_tracers._state().retain == 0

    def boom(p, c, argnums, o):
        assert transform_tracers._state().retain == 1  # (RetainGraph around the rule)
        raise RuntimeError("the rule's own error")

    monkeypatch.setattr(REGISTRY["Exp"], "vjp", boom)
    monkeypatch.setattr(engine, "_reverse", _call.vjp_walk)
    with pytest.raises(RuntimeError, match="the rule's own error"):
        mx.grad(lambda x: mx.sum(mx.exp(x)))(V)
    assert transform_tracers._state().retain == 0


def test_the_walk_clears_the_tracer_flags(monkeypatch):
    seen = []
    for python in (False, True):
        if python:
            _python_walk(monkeypatch)
        box = {}

        def f(x):
            box["y"] = y = mx.exp(x) + 1.0
            return mx.sum(y * x)

        x = mx.array(X)
        mx.grad(f)(x)
        d = box["y"]._d
        seen.append((d.tracer, d.node.inputs[0].tracer, x._d.tracer))
    assert seen[0] == seen[1] == (False, False, False)


def _containers_after(M):
    """What grad leaves in its arguments' lists and dicts (MLX's tree_fill and restore):
    per case, the identity of each slot's value with the original, and the values."""
    out = []
    a0, b0, c0 = M.array([1.0, 2.0]), M.array([3.0, 4.0]), M.array([0.5, 0.25])

    def assigns(p, q):
        p["a"] = p["a"] * 2.0  # the function's own value stays in the slot
        q[1] = q[1] + 1.0
        return M.sum(p["a"] * p["b"][0]) + M.sum(q[0] * q[1])

    p, q = {"a": a0, "b": [b0]}, [c0, b0]
    g = M.grad(assigns, argnums=[0, 1])(p, q)
    out.append([p["a"] is a0, p["b"][0] is b0, q[0] is c0, q[1] is b0])
    out.append([np.array(v).tolist() for v in (p["a"], q[-1], g[0]["a"], g[0]["b"][0], g[1][0],
                                               g[1][1])])

    def kw(x, *, y=None, z=None):
        return M.sum(x * y["w"] * z[0])

    y, z = {"w": b0}, (c0,)
    g = M.grad(kw, argnums=0, argnames=["y", "z"])(a0, y=y, z=z)
    out.append([y["w"] is b0, z[0] is c0])
    out.append([np.array(v).tolist() for v in (g[0], g[1]["y"]["w"], g[1]["z"][0])])
    return out


def test_grad_leaves_the_argument_containers_as_mlx_does(monkeypatch):
    from conftest import mlx_ref

    got = _containers_after(mx)
    _python_walk(monkeypatch)
    assert _containers_after(mx) == got
    if mlx_ref is None:
        pytest.skip("mlx is not installed")
    assert got == _containers_after(mlx_ref)
