"""mx.eval, .item() and printing inside a function being differentiated: MLX keeps a
tracer's graph (mlx/transforms.cpp eval_impl, mlx/array.cpp is_tracer), so the gradient
flows through an evaluated intermediate. Compared with MLX itself, including MLX's own
quirk: an inner gradient evaluated inside an outer grad is cut where its forward was
evaluated (the inner walk clears the tracer flags, so the outer eval detaches them)."""

from __future__ import annotations

import numpy as np
import pytest

import tapescope.core as mx
from conftest import mlx_ref, requires_mlx


def _eval_then_sum(M, x):
    y = x * x
    M.eval(y)
    return y.sum()


def _item(M, x):
    y = M.exp(x)
    v = y.sum().item()  # a Python float: a constant to the gradient
    return (y * v).sum()


def _printed(M, x):
    y = M.sin(x)
    repr(y)  # printing evaluates
    return (y * y).sum()


def _eval_twice_used(M, x):
    y = x * x
    z = y + 1
    M.eval(z)
    return (M.log(z) * y).sum()


def _vector(M, x):
    y = M.sin(x) * x
    M.eval(y)
    return M.exp(y)


def _custom_vjp_evals(M):
    @M.custom_function
    def c(x):
        return M.sin(x)

    @c.vjp
    def c_vjp(x, ct, out):
        g = M.cos(x)
        M.eval(g)
        return ct * g

    return c


def _inner_grad(M, x):
    return M.grad(lambda y: _eval_then_sum(M, y))(x)


def _inner_grad_evaluated(M, x):  # MLX: the outer gradient stops at the inner primal
    gx = _inner_grad(M, x)
    M.eval(gx)
    return (gx * x).sum()


C = np.array([0.3, 1.0, 2.0], np.float32)
EXPRESSIONS = [
    "M.grad(lambda x: _eval_then_sum(M, x))(x)",
    "M.grad(lambda x: _item(M, x))(x)",
    "M.grad(lambda x: _printed(M, x))(x)",
    "M.value_and_grad(lambda x: _eval_twice_used(M, x))(x)",
    "M.vjp(lambda x: _vector(M, x), [x], [M.ones_like(x)])",
    "M.jvp(lambda x: _vector(M, x), [x], [M.ones_like(x)])",
    "M.grad(lambda x: (_custom_vjp_evals(M)(x) * x).sum())(x)",
    "M.grad(lambda x: M.grad(lambda y: _vector(M, y).sum())(x).sum())(x)",
    "M.grad(lambda x: (_inner_grad(M, x) * x).sum())(x)",
    "M.grad(lambda x: _inner_grad_evaluated(M, x))(x)",
    "M.grad(lambda x: (x * (lambda z: (M.eval(z), z)[1])(M.exp(M.array(C)) * 2)).sum())(x)",
]


def _flat(t):
    if isinstance(t, (list, tuple)):
        return [y for x in t for y in _flat(x)]
    return [t]


@requires_mlx
@pytest.mark.parametrize("src", EXPRESSIONS)
def test_eval_inside_a_transformation_matches_mlx(src):
    env = {k: v for k, v in globals().items() if k.startswith("_") or k == "C"}
    got = eval(src, {"M": mx, "x": mx.array(C), **env})
    want = eval(src, {"M": mlx_ref, "x": mlx_ref.array(C), **env})
    for a, b in zip(_flat(got), _flat(want), strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)


def test_eval_inside_grad_gives_the_full_gradient():
    # independent of MLX: d/dx sum(exp(sin(x) x)) with the intermediate evaluated
    g = mx.grad(lambda x: _vector(mx, x).sum())(mx.array(C))
    want = np.exp(np.sin(C) * C) * (np.cos(C) * C + np.sin(C))
    np.testing.assert_allclose(np.array(g), want, rtol=1e-5)


@requires_mlx
def test_async_eval_of_a_tracer_is_mlx_error():
    def f(M):
        return M.grad(lambda x: (M.async_eval(y := x * x), y.sum())[1])(M.array(C))

    with pytest.raises(ValueError) as want:
        f(mlx_ref)
    with pytest.raises(ValueError) as got:
        f(mx)
    assert str(got.value) == str(want.value) == \
        "[async_eval] Not allowed inside a graph transformation."
    # an array that does not depend on the primals is no tracer: async_eval is fine
    g = mx.grad(lambda x: (mx.async_eval(y := mx.array(C) * 2), (x * y).sum())[1])(mx.array(C))
    np.testing.assert_allclose(np.array(g), 2 * C)


def test_kept_graphs_are_dropped_when_the_transformation_ends():
    held = []

    def f(x):
        y = mx.exp(x)
        mx.eval(y)
        assert y._d.kept is not None  # kept for the backward pass
        held.append(y)
        return y.sum()

    mx.grad(f)(mx.array(C))
    assert held[0]._d.kept is None  # the graph above it is freed once grad returns
    # outside a transformation an eval keeps nothing
    z = mx.exp(mx.array(C))
    mx.eval(z)
    assert z._d.kept is None and z._d.node is None


def test_a_tracer_node_does_not_donate_its_inputs():
    # y = x * 2 is held only by the Square node: evaluated outside a transformation, Square
    # would write into y's buffer; inside grad it may not (the VJP of Square reads y)
    def f(x):
        z = mx.square(x * 2.0)
        mx.eval(z)
        return z.sum()

    x = np.array([0.5, 1.5, -1.0], np.float32)
    np.testing.assert_allclose(np.array(mx.grad(f)(mx.array(x))), 8 * x, rtol=1e-6)
