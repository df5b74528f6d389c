"""Compositions of the transformations (grad of grad, compile of grad, grad of compile,
compiled functions with captured state, threads), custom_function / checkpoint against MLX,
and a small MLP trained with value_and_grad + SGD following JAX's loss curve."""

from __future__ import annotations

import functools
import threading

from collections import Counter

import numpy as np
import pytest

import tapescope
import tapescope.core as mx
from conftest import mlx_ref, requires_mlx

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _f(M, x):
    return M.sum(M.tanh(x) ** 3 * M.sin(x) + M.exp(-x * x))


X = np.linspace(-1.5, 1.3, 7).astype(np.float32)


def test_grad_of_grad_matches_jax():
    got = mx.grad(lambda x: mx.sum(mx.grad(lambda y: _f(mx, y))(x) * mx.cos(x)))(mx.array(X))
    want = jax.grad(lambda x: jnp.sum(jax.grad(lambda y: _f(jnp, y))(x) * jnp.cos(x)))(X)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)


def test_third_derivative_and_jvp_of_grad_match_jax():
    g3 = mx.grad(mx.grad(mx.grad(lambda x: mx.sin(x) * x ** 3)))(mx.array(0.7))
    w3 = jax.grad(jax.grad(jax.grad(lambda x: jnp.sin(x) * x ** 3)))(0.7)
    np.testing.assert_allclose(float(g3.item()), float(w3), rtol=1e-4)
    t = np.ones_like(X)
    _, hvp = mx.jvp(mx.grad(lambda y: _f(mx, y)), [mx.array(X)], [mx.array(t)])
    _, want = jax.jvp(jax.grad(lambda y: _f(jnp, y)), (X,), (t,))
    np.testing.assert_allclose(np.array(hvp[0]), np.array(want), rtol=1e-4, atol=1e-5)


def test_compile_of_grad_fuses_the_backward_tape_and_agrees():
    g = mx.grad(lambda x: _f(mx, x))
    cg = mx.compile(g)
    np.testing.assert_allclose(np.array(cg(mx.array(X))), np.array(g(mx.array(X))), rtol=1e-6, atol=1e-7)
    prog = cg.programs()[0]
    kernels = [op for op in prog.tape if op.prim.name == "Compiled"]
    assert kernels, "the backward elementwise chains fuse into Compiled kernels"
    # the backward ops are inside the kernels: no lone elementwise op of the backward remains
    assert sum(len(k.prim.kw["tape"].ops) for k in kernels) >= 10
    assert cg.traces == 1
    cg(mx.array(X + 1))  # same signature: no retrace
    assert cg.traces == 1


def test_grad_of_compile_differentiates_the_fused_tape():
    cf = mx.compile(lambda x: _f(mx, x))
    got = mx.grad(cf)(mx.array(X))
    want = jax.grad(lambda x: _f(jnp, x))(X)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)
    _, tan = mx.jvp(cf, [mx.array(X)], [mx.array(np.ones_like(X))])
    _, wt = jax.jvp(lambda x: _f(jnp, x), (X,), (np.ones_like(X),))
    np.testing.assert_allclose(float(tan[0].item()), float(wt), rtol=1e-4)
    # and compiling the gradient of a compiled function
    got2 = mx.compile(mx.grad(cf))(mx.array(X))
    np.testing.assert_allclose(np.array(got2), np.array(want), rtol=1e-4, atol=1e-5)


def test_compiled_gradient_step_with_captured_state():
    state = [mx.array(1.0)]

    @functools.partial(mx.compile, inputs=state, outputs=state)
    def step(x):
        g = mx.grad(lambda y: mx.sum(mx.sin(y) * state[0]))(x)
        state[0] = state[0] * 2.0
        return g

    for k in range(3):
        got = step(mx.array(X))
        np.testing.assert_allclose(np.array(got), np.cos(X) * 2.0 ** k, rtol=1e-6)
    assert state[0].item() == 8.0


def test_gradients_from_several_threads_agree():
    results: dict = {}
    errors: list = []

    def work(k: int) -> None:
        try:
            out = []
            for i in range(10):
                x = mx.array(X * (k + 1))
                out.append(np.array(mx.grad(lambda y: _f(mx, y) * (i + 1))(x)))
            results[k] = out
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in range(4):
        want = np.array(jax.grad(lambda y: _f(jnp, y))(X * (k + 1)))
        for i, got in enumerate(results[k]):
            np.testing.assert_allclose(got, want * (i + 1), rtol=1e-4, atol=1e-5)


def test_nothing_is_evaluated_while_the_gradient_graph_is_built():
    x = mx.exp(mx.array(X))  # lazy input
    g = mx.grad(lambda y: _f(mx, y))(x)
    assert g._d.node is not None and x._d.node is not None
    mx.eval(g)
    np.testing.assert_allclose(np.array(g), np.array(jax.grad(lambda y: _f(jnp, y))(np.exp(X))),
                               rtol=1e-4, atol=1e-5)


# -- custom_function, checkpoint -----------------------------------------------------------

def _custom(M):
    @M.custom_function
    def f(x, y):
        return M.sin(x) * y

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, y = primals
        return cotangent * M.cos(x) * y * 10, cotangent * M.sin(x)

    @f.jvp
    def f_jvp(primals, tangents):
        x, y = primals
        dx, dy = tangents
        return dx * M.cos(x) * y * 100 + dy * M.sin(x)

    return f


def _custom_multi(M):
    @M.custom_function
    def g(x):
        return M.sin(x), {"c": M.cos(x)}

    @g.vjp
    def g_vjp(primals, cot, out):
        return cot[0] * 3 + cot[1]["c"] * 5

    return g


@requires_mlx
@pytest.mark.parametrize("src", [
    "M.grad(lambda x, y: _custom(M)(x, y).sum(), argnums=(0, 1))(M.array([1., 2.]), M.array([3., 4.]))",
    "M.jvp(_custom(M), [M.array([1., 2.]), M.array([3., 4.])], [M.array([1., 1.]), M.array([0., 1.])])",
    "_custom(M)(M.array([1., 2.]), M.array([3., 4.]))",
    "M.grad(lambda x: _custom_multi(M)(x)[0].sum() + _custom_multi(M)(x)[1]['c'].sum() * 2)(M.array([1., 2.]))",
    "M.grad(lambda x: _custom_multi(M)(x)[1]['c'].sum())(M.array([1., 2.]))",
    "M.jvp(lambda x: _custom_multi(M)(x)[0], [M.array([1., 2.])], [M.array([1., 1.])])",
    "M.grad(M.checkpoint(lambda x, y: M.sum(M.exp(x) * y)), argnums=(0, 1))(M.array([1., 2.]), M.array([3., 4.]))",
    "M.value_and_grad(M.checkpoint(lambda x: M.sum(M.tanh(x) ** 2)))(M.array([0.5, -1.]))",
    "M.grad(lambda x: M.sum(M.checkpoint(lambda a: M.sin(a) * a)(x) ** 2))(M.array([0.5, -1.]))",
])
def test_custom_function_and_checkpoint_match_mlx(src):
    env = {"_custom": _custom, "_custom_multi": _custom_multi}
    got, want = eval(src, {"M": mx, **env}), eval(src, {"M": mlx_ref, **env})

    def flat(t):
        if isinstance(t, (list, tuple)):
            return [y for x in t for y in flat(x)]
        return [t]

    for a, b in zip(flat(got), flat(want), strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)


def test_custom_function_records_custom_transforms_and_hides_its_body():
    f = _custom(mx)
    g = mx.grad(lambda x: f(x, mx.array(2.0)).sum())(mx.array([0.5]))
    from mlx_compare import primitive_names

    names = primitive_names(g)
    assert "CustomTransforms" not in names  # the VJP is the user's function, not the node
    out = f(mx.array([0.5]), mx.array(2.0))
    assert out._d.node.primitive.name == "CustomTransforms"
    np.testing.assert_allclose(np.array(g), 10 * 2 * np.cos([0.5]), rtol=1e-6)


def test_checkpoint_recomputes_the_forward_in_the_backward_pass():
    calls = []

    def body(x):
        calls.append(1)
        return mx.sum(mx.exp(mx.sin(x)))

    g = mx.grad(mx.checkpoint(body))(mx.array(X))
    assert len(calls) == 2  # once forward, once more inside the VJP
    np.testing.assert_allclose(np.array(g), np.cos(X) * np.exp(np.sin(X)), rtol=1e-5)


# -- a two-layer MLP, 20 SGD steps, against the same model in JAX ----------------------------

def _mlp_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (np.sin(x @ np.array([1.0, -2.0, 0.5, 1.5], np.float32)))[:, None].astype(np.float32)
    params = {"w1": (rng.normal(size=(4, 16)) * 0.5).astype(np.float32),
              "b1": np.zeros(16, np.float32),
              "w2": (rng.normal(size=(16, 1)) * 0.5).astype(np.float32),
              "b2": np.zeros(1, np.float32)}
    return x, y, params


def mlp_loss(M, p, x, y):
    h = M.maximum(x @ p["w1"] + p["b1"], 0.0)
    out = h @ p["w2"] + p["b2"]
    return M.mean((out - y) ** 2)


def train(M, params, x, y, vg, steps=20, lr=0.1):
    losses = []
    for _ in range(steps):
        loss, grads = vg(params, x, y)
        params = {k: params[k] - lr * grads[k] for k in params}
        losses.append(float(loss))
    return losses


def test_mlp_trained_with_value_and_grad_follows_jax_loss_curve():
    x, y, p = _mlp_data()
    ours = train(mx, {k: mx.array(v) for k, v in p.items()}, mx.array(x), mx.array(y),
                 mx.value_and_grad(lambda p, x, y: mlp_loss(mx, p, x, y)))
    ref = train(jnp, {k: jnp.asarray(v) for k, v in p.items()}, jnp.asarray(x), jnp.asarray(y),
                jax.jit(jax.value_and_grad(lambda p, x, y: mlp_loss(jnp, p, x, y))))
    assert ours[-1] < 0.8 * ours[0]  # it learns
    np.testing.assert_allclose(ours, ref, rtol=1e-5)
    # the same with the step compiled
    comp = train(mx, {k: mx.array(v) for k, v in p.items()}, mx.array(x), mx.array(y),
                 mx.compile(mx.value_and_grad(lambda p, x, y: mlp_loss(mx, p, x, y))))
    np.testing.assert_allclose(comp, ref, rtol=1e-5)


# -- the picture: backward nodes are marked ----------------------------------------------------

def test_trace_of_grad_marks_the_backward_ops():
    x, y, p = _mlp_data()
    args = ({k: mx.array(v) for k, v in p.items()}, mx.array(x), mx.array(y))
    loss_grad = mx.grad(lambda p, x, y: mlp_loss(mx, p, x, y))
    g = tapescope.trace(loss_grad, *args, compile=False)
    fwd = {op.primitive for op in g.ops if not op.backward}
    bwd = {op.primitive for op in g.ops if op.backward}
    assert {"Matmul", "Maximum", "Add", "Subtract"} <= fwd
    assert {"Matmul", "Transpose", "Greater", "Sum"} <= bwd  # transposed products, relu mask
    # every output (a gradient) is made by a backward op
    assert all(g.ops[g.values[v].producer].backward for v in g.outputs)
    dot = g.to_dot()
    assert "&#8711; Matmul" in dot and "backward (reverse mode)" in dot
    # compiled: the kernels that read a cotangent are backward, the first layer's is not
    gc = tapescope.trace(loss_grad, *args, compile=True)
    kernels = [op for op in gc.ops if op.kernel is not None]
    assert any(op.backward for op in kernels) and any(not op.backward for op in kernels)
    # the live graph above a gradient
    lazy = tapescope.graph_of(mx.grad(lambda a: mx.sum(mx.exp(a) * a))(mx.array(X)))
    assert any(op.backward for op in lazy.ops) and any(not op.backward for op in lazy.ops)


def test_a_nested_walk_marks_only_the_ops_reverse_mode_recorded():
    """A compiled function's VJP walks its replayed tape inside the outer walk (mlx.nn's
    compiled activations): the forward ops above it (the loss's) stay forward ops, and
    every op the walks recorded is marked. The reference: the ops that exist before the
    gradient call are exactly the loss graph's."""
    relu = mx.compile(lambda v: mx.maximum(v, 0.0), shapeless=True)
    rng = np.random.default_rng(0)
    w = mx.array(rng.standard_normal((4, 3)).astype(np.float32))
    x = mx.array(rng.standard_normal((5, 4)).astype(np.float32))

    def loss_fn(w):
        h = relu(x @ w)
        return mx.logsumexp(h, axis=-1).sum()

    loss, grad = mx.value_and_grad(loss_fn)(w)
    lg = tapescope.graph_of(loss)
    assert lg.ops and not any(op.backward for op in lg.ops)
    gg = tapescope.graph_of(grad)
    fwd = [op.primitive for op in gg.ops if not op.backward]
    bwd = [op.primitive for op in gg.ops if op.backward]
    assert "Compiled" in fwd and "LogSumExp" in fwd and "Matmul" in bwd
    # the forward ops the gradient reads are loss-graph ops (the old marking called the
    # LogSumExp and the Compiled above the inner walk backward)
    assert not Counter(fwd) - Counter(op.primitive for op in lg.ops)
    np.testing.assert_allclose(np.array(grad), np.array(mx.grad(lambda w: mx.logsumexp(
        mx.maximum(x @ w, 0.0), axis=-1).sum())(w)), rtol=1e-6)


def test_the_backward_picture_starts_at_the_seed_and_marks_cotangents_inside_kernels():
    x, y, p = _mlp_data()
    args = ({k: mx.array(v) for k, v in p.items()}, mx.array(x), mx.array(y))
    loss_grad = mx.grad(lambda p, x, y: mlp_loss(mx, p, x, y))
    for compiled in (False, True):
        g = tapescope.trace(loss_grad, *args, compile=compiled)
        seeds = [v for v in g.values if v.seed]
        assert len(seeds) == 1 and seeds[0].name == "seed" and float(seeds[0].data) == 1.0
        assert 'label=<<B>seed</B> = 1.0' in g.to_dot()
    # a kernel that fuses the forward (out - y) with the cotangent's product: only the ops
    # reached from a cotangent input are drawn as backward inside it
    dot = g.to_dot()
    inner = [line for line in dot.splitlines() if line.strip().startswith("k") and "label=" in line]
    marked = [line for line in inner if "&#8711; " in line]
    assert marked and len(marked) < len([x for x in inner if "<B>" in x])
    assert any("&#8711; Multiply" in line for line in marked)
    assert not any("&#8711; Add" in line for line in marked)  # out - y: the forward's
    lazy = tapescope.graph_of(loss_grad(*args)["w1"])
    assert [v.name for v in lazy.values if v.seed] == ["seed"]


def test_check_compares_the_gradient_graph_with_jax():
    f = lambda x: mx.sum(mx.tanh(x) ** 2 * mx.exp(x))  # noqa: E731
    for fun in (mx.grad(f), mx.grad(mx.compile(f)), mx.compile(mx.grad(f))):
        report = tapescope.check(fun, mx.array(X))
        assert report.passed, report


@pytest.mark.parametrize("transform", ["grad", "vmap", "compile", "export"])
def test_async_eval_inside_a_transformation_raises_mlx_error(transform, tmp_path):
    """MLX's async_eval refuses a tracer of any transformation: grad's primals, vmap's
    tracers, compile's and export's placeholders, and what is made from them."""
    def fun(x):
        y = x + 1.0
        mx.async_eval(y)
        return mx.exp(y).sum()

    call = {"grad": lambda: mx.grad(fun)(mx.array(1.0)),
            "vmap": lambda: mx.vmap(fun)(mx.ones((2, 2))),
            "compile": lambda: mx.compile(fun)(mx.ones(2)),
            "export": lambda: mx.export_function(str(tmp_path / "f.mlxfn"), fun, mx.ones(2))}
    with pytest.raises(ValueError, match=r"^\[async_eval\] Not allowed inside a graph "
                                         r"transformation\.$"):
        call[transform]()
    x = mx.ones(2) + 1  # outside one it runs, and inside one on an array made of no tracer
    mx.async_eval(x)
    assert x.tolist() == [2.0, 2.0]
    out = mx.vmap(lambda v: (mx.async_eval(z := mx.ones(2) * 3), v * z)[1])(mx.ones((2, 2)))
    assert out.tolist() == [[3.0, 3.0], [3.0, 3.0]]
    out = mx.compile(lambda v: (mx.async_eval(z := mx.ones(2) * 3), v * z)[1])(mx.ones(2))
    assert out.tolist() == [3.0, 3.0]
