"""The reference of a transformed function: JAX's transformation of the JAX forward graph.

When ``tapescope.check`` calls a function, reverse and forward mode leave a
``Transformation`` per walk (``tapescope.core.autodiff.engine.recording``). An array that is
a walk's result (a gradient, a tangent) is not computed from the backward graph tapescope
recorded; its reference is ``jax.vjp`` (or ``jax.jvp``) of the *forward* graph, evaluated
with the table in ``jax_rules`` as a JAX function of the primals. So the VJP / JVP rules
are checked by JAX's own differentiation, not replayed. Nested transformations (``grad`` of
``grad``) nest the same way: a forward graph that holds an inner walk's result computes it
with ``jax.vjp`` of the inner forward graph, on the outer tracers.

Conventions: a custom function (``CustomTransforms``, ``checkpoint``) is differentiated
through its body, so a user's ``vjp`` / ``jvp`` is checked against the true derivative;
complex cotangents follow MLX (dL/dRe + i dL/dIm), the conjugate of JAX's, so the reference
of a VJP is ``conj(jax_vjp(conj(cotangent)))``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tapescope.kernels.backends import host_array
from tapescope.kernels.primitives import CUSTOM_FUNCTION

from .jax_rules import NoReference, rule_for

# Transformation.api -> how the report names the reference
DESCRIBE = {
    "grad": "jax.grad", "value_and_grad": "jax.value_and_grad", "vjp": "jax.vjp",
    "jvp": "jax.jvp",
}


def describe(apis: set) -> str:
    """The report's sentence for an output whose reference went through ``apis``."""
    names = ", ".join(sorted(DESCRIBE.get(a, a) for a in apis))
    return f"{names} of the JAX forward graph"


class Env:
    """JAX values of descs (by id) in one context: the root, or inside a transformation,
    where ``pinned`` holds the tracers standing for the primals of every enclosing walk."""

    def __init__(self, results: dict, pinned: Optional[dict] = None):
        self.results = results  # id(result desc) -> Transformation
        self.pinned = dict(pinned or {})
        self.vals: dict = dict(self.pinned)
        self.apis: dict = {}  # id(desc) -> the walks its value went through


def _live(node) -> list:
    return [r() for r in node.outputs]


def _inexact(dtype) -> bool:
    import ml_dtypes

    dt = np.dtype(dtype)
    return dt == np.dtype(ml_dtypes.bfloat16) or dt.kind in "fc"


def _run(node, ins: list) -> list:
    """JAX values of ``node``'s outputs (None where JAX has no unique one)."""
    import jax.numpy as jnp

    name = node.primitive.name
    outs = _live(node)
    rule = rule_for(name)
    if rule is None:
        raise NoReference(f"no JAX rule for {name}")
    try:
        res = rule(*ins, **node.primitive.kw)
    except NoReference:
        raise
    except Exception as e:  # noqa: BLE001 - no reference, never a pass
        raise NoReference(f"JAX rule for {name} raised {type(e).__name__}: {e}") from None
    if not isinstance(res, (tuple, list)):
        res = (res,)
    vals = []
    for i, d in enumerate(outs):
        v = res[i] if i < len(res) else None
        if v is not None:
            v = jnp.asarray(v)
            if d is not None:
                v = v.astype(d.dtype.np)
        vals.append(v)
    return vals


def evaluate(targets: list, env: Env) -> list:
    """JAX values of ``targets`` (descs): the JAX rules over the graph, a walk's results by
    ``jax.vjp`` / ``jax.jvp`` of its forward graph (raises ``NoReference``)."""
    import jax

    from tapescope.core.walk import topological

    hits: list = []

    def known(d) -> bool:
        return id(d) in env.vals

    def cut(d) -> bool:
        outs = [o for o in _live(d.node or d.kept) if o is not None]
        if all(known(o) for o in outs):
            return True
        res = [o for o in outs if id(o) in env.results and not known(o)]
        hits.extend(res)
        return len(res) == len([o for o in outs if not known(o)])

    def leaf(d) -> None:
        if known(d):
            return
        if id(d) in env.results:
            hits.append(d)
        else:
            env.vals[id(d)] = jax.numpy.asarray(host_array(d.data))

    order = topological(targets, cut, leaf, kept=True)  # through eval inside the function
    for d in hits:
        if not known(d):
            _transform(env.results[id(d)], env)
    for node in order:
        outs = _live(node)
        if all(o is None or known(o) for o in outs):
            continue
        ins = [_value(x, env) for x in node.inputs]
        if node.primitive.kind == CUSTOM_FUNCTION:
            ins = _custom_body(node, env, ins)
        apis = set().union(*[env.apis.get(id(x), ()) for x in node.inputs])
        for o, v in zip(outs, _run(node, ins)):
            if o is not None and not known(o):
                env.vals[id(o)] = v
                if apis:
                    env.apis[id(o)] = apis
    return [_value(t, env) for t in targets]


def _value(d, env: Env):
    v = env.vals.get(id(d), None)
    if v is None:
        name = d.node.primitive.name if d.node is not None else "a leaf"
        raise NoReference(f"JAX gives no unique value for an output of {name}")
    return v


def _custom_body(node, env: Env, ins: list) -> list:
    """A custom function's outputs come in through ``StopGradient``: take the body's values
    before it, so that JAX differentiates the body (not the user's vjp / jvp)."""
    n = node.primitive.kw["num_outputs"]
    out = list(ins)
    for k, x in enumerate(node.inputs[len(ins) - n:], start=len(ins) - n):
        sg = x.node or x.kept
        if sg is not None and sg.primitive.defn.stops_gradient:
            out[k] = evaluate([sg.inputs[0]], env)[0]
    return out


def _transform(t, env: Env) -> None:
    """Fill ``env`` with the reference of every result of walk ``t``."""
    import jax
    import jax.numpy as jnp

    primal_vals = evaluate(list(t.primals), env)
    # differentiate the inexact primals; an integer one has a zero cotangent / no tangent
    active = [a for a in t.argnums if _inexact(t.primals[a].dtype.np)]

    def forward(outputs: list):
        def f(*xs):
            pinned = dict(env.pinned)
            for a, x in zip(active, xs):
                pinned[id(t.primals[a])] = x
            return tuple(evaluate(outputs, Env(env.results, pinned)))

        return f

    xs = [primal_vals[a] for a in active]
    if t.mode == "vjp":
        seeded = [(o, c) for o, c in t.seeds if _inexact(o.dtype.np)]
        cots = evaluate([c for _, c in seeded], env)
        cots = [jnp.conj(c) if jnp.iscomplexobj(c) else c for c in cots]
        outputs = [o for o, _ in seeded]
        if outputs and xs:
            _, pull = jax.vjp(forward(outputs), *xs)
            grads = dict(zip(active, pull(tuple(c.astype(o.dtype.np) for o, c in
                                                zip(outputs, cots)))))
        else:
            grads = {}
        vals = []
        for a in t.argnums:
            g = grads.get(a)
            p = t.primals[a]
            if g is None:
                g = jnp.zeros(p.shape, p.dtype.np)
            vals.append(jnp.conj(g) if jnp.iscomplexobj(g) else g)
        inputs = list(t.primals) + [c for _, c in t.seeds]
    else:
        tans = evaluate(list(t.seeds), env)
        tans = dict(zip(t.argnums, tans))
        outputs = list(t.outputs)
        if xs:
            _, out_t = jax.jvp(forward(outputs), tuple(xs),
                               tuple(tans[a].astype(t.primals[a].dtype.np) for a in active))
        else:
            out_t = [None] * len(outputs)
        vals = []
        for o, v in zip(outputs, out_t):
            if v is None or v.dtype == jax.dtypes.float0:
                v = jnp.zeros(o.shape, o.dtype.np)
            vals.append(v)
        inputs = list(t.primals) + list(t.seeds)
    apis = {t.api}.union(*[env.apis.get(id(x), ()) for x in inputs])
    for r, v in zip(t.results, vals):
        if r is not None and id(r) not in env.vals:
            env.vals[id(r)] = jnp.asarray(v).astype(r.dtype.np)
            env.apis[id(r)] = apis
