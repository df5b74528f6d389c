"""``tapescope.check``: run a function in tapescope and, node by node, in JAX; compare.

The function is called on its arguments, which builds tapescope's lazy graph without
running it. The graph is walked in topological order and evaluated in JAX with the table in
``jax_rules`` (leaves — inputs and constants — are tapescope's data, converted through
numpy), before tapescope evaluates it normally; then every output is compared. With
``every_node=True`` every intermediate array is kept and evaluated too, each node is also
run in JAX on tapescope's own input values (so a node is judged on its own, free of the
rounding that came before it), and the first node in topological order that disagrees is
named, with its inputs. A primitive without a JAX rule makes everything that depends on it
"no reference" — never a pass.

Compiled functions need nothing special: calling one records ``Compiled`` nodes whose
fused tapes the JAX table runs op by op.

Transformed functions (``mx.grad``, ``value_and_grad``, ``vjp``, ``jvp``, also inside the
function): an output that is a gradient or a tangent is compared with ``jax.vjp`` /
``jax.jvp`` of the JAX forward graph (``transforms``), not with the backward graph replayed,
and the report names that reference. (``every_node`` still runs each recorded node.) For
``mx.compile(mx.grad(f))`` that graph comes from the compiled function's own function,
called uncompiled (without captured state only).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from tapescope.kernels.backends import host_array

from . import transforms
from .jax_rules import NoReference, rule_for
from .compare import compare, preview

if TYPE_CHECKING:  # the report's record is viz's (imported where used: importing tapescope imports no viz)
    from tapescope.viz.check import CheckReport


def _flatten(tree: Any, label: str, out: list) -> list:
    """(label, array) for every tapescope array in a pytree of outputs."""
    from tapescope.core.array import array

    if isinstance(tree, array):
        out.append((label, tree))
    elif isinstance(tree, (list, tuple)):
        for i, x in enumerate(tree):
            _flatten(x, f"{label}[{i}]", out)
    elif isinstance(tree, dict):
        for k, x in tree.items():
            _flatten(x, f"{label}[{k!r}]", out)
    return out


def _jax_device(device: Any):
    """The JAX device to run on: the one named, else the kind of tapescope's default device.

    JAX's own default is a GPU whenever it has one; a check of arrays computed on the CPU
    runs JAX on its CPU, so a machine with a GPU compares like with like (and the reference
    does not take GPU memory that tapescope's GPU runtime owns).
    """
    import jax

    if device is None:
        from tapescope.core import default_device

        device = default_device()
    if isinstance(device, jax.Device):
        return device
    name = getattr(getattr(device, "type", device), "name", device)  # mx.Device / DeviceType
    name = str(name).lower()
    platform = {"gpu": "gpu", "cuda": "gpu", "cpu": "cpu"}.get(name)
    if platform is None:
        raise ValueError(f"[check] Unknown device {device!r}; use 'cpu', 'gpu' or a jax.Device.")
    try:
        return jax.devices(platform)[0]
    except RuntimeError:
        raise ValueError(f"[check] JAX has no {name} device here "
                         f"(it has: {', '.join(str(d) for d in jax.devices())}).") from None


def _label(node) -> str:
    return f"{node.primitive.name}#{node.id}"


def _walk(descs: list) -> tuple[list, list, list]:
    """(nodes in topological order, leaf descs with data, descs scheduled by another eval)."""
    from tapescope.core.walk import topological

    leaves, busy = [], []
    leaf_ids: set = set()

    def leaf(d) -> None:
        if id(d) not in leaf_ids:
            leaf_ids.add(id(d))
            leaves.append(d)

    def running(d) -> bool:  # an async eval is running it: wait for that first
        if d.node.event is not None:
            busy.append(d)
            return True
        return False

    return topological(descs, running, leaf), leaves, busy


def _outputs_of(node) -> list:
    return [r() for r in node.outputs]


def _run_rule(node, ins: list) -> tuple[list, list]:
    """JAX values (or None) for each output of ``node``, and why each is missing."""
    import jax.numpy as jnp

    name = node.primitive.name
    outs = _outputs_of(node)
    rule = rule_for(name)
    if rule is None:
        return [None] * len(outs), [f"no JAX rule for {name}"] * len(outs)
    try:
        res = rule(*ins, **node.primitive.kw)
    except NoReference as e:
        return [None] * len(outs), [str(e)] * len(outs)
    except Exception as e:  # noqa: BLE001 - reported, never a pass
        msg = f"JAX rule for {name} raised {type(e).__name__}: {e}"
        return [None] * len(outs), [msg] * len(outs)
    if not isinstance(res, (tuple, list)):
        res = (res,)
    vals, why = [], []
    for i, d in enumerate(outs):
        v = res[i] if i < len(res) else None
        if v is None:
            vals.append(None)
            why.append(f"JAX gives no unique value for output {i} of {name}")
        else:
            v = jnp.asarray(v)
            if d is not None:
                v = v.astype(d.dtype.np)
            vals.append(v)
            why.append("")
    return vals, why


def _transformed_references(descs: list, walks: list, out_ref: list) -> dict:
    """Replace, in ``out_ref``, the reference of every output that depends on a vjp / jvp
    walk's result by JAX's transformation of the forward graph; output index -> its name."""
    from tapescope.core.walk import topological

    results = {id(r): t for t in walks for r in t.results if r is not None}
    if not results:
        return {}
    env = transforms.Env(results)
    names: dict = {}
    for k, d in enumerate(descs):
        hit: list = []

        def note(x, hit=hit) -> bool:
            if id(x) in results:
                hit.append(results[id(x)].api)
            return False

        def cut(x, note=note) -> bool:
            node = x.node or x.kept
            return any(note(o) for o in [r() for r in node.outputs] if o is not None)

        topological([d], cut, note, kept=True)
        if not hit:
            continue
        producer = out_ref[k][2]
        names[k] = transforms.describe(set(hit))
        try:
            out_ref[k] = (transforms.evaluate([d], env)[0], "", producer)
            names[k] = transforms.describe(env.apis.get(id(d), set(hit)))
        except NoReference as e:
            out_ref[k] = (None, f"{names[k]}: {e}", producer)
        except Exception as e:  # noqa: BLE001 - JAX refused: no reference, never a pass
            out_ref[k] = (None, f"{names[k]}: {type(e).__name__}: {e}", producer)
    return names


def check(fun: Callable, *args: Any, rtol: Optional[float] = None, atol: Optional[float] = None,
          every_node: bool = False, device: Any = None) -> CheckReport:
    """Compare ``fun(*args)`` computed by tapescope against JAX; returns a ``CheckReport``."""
    from tapescope.core.autodiff.engine import recording

    jdev = _jax_device(device)
    with contextlib.ExitStack() as held:  # the walks and the graphs they went through
        walks = held.enter_context(recording())
        flat = _flatten(fun(*args), "out", [])
        # a compiled function's program has no forward graph left to differentiate: the
        # reference of its transformed outputs comes from the same function uncompiled
        ref = _uncompiled(fun, args, len(flat))
        return _check(flat, ref, walks, held, rtol, atol, every_node, jdev)


def _uncompiled(fun: Callable, args: tuple, n: int) -> Optional[list]:
    """The outputs of ``mx.compile``'s function called as it is (a compiled function without
    captured state only), or None."""
    from tapescope.core.ops.compile_api import CompiledFunction

    if not isinstance(fun, CompiledFunction) or not fun._direct:
        return None
    out = [a for _, a in _flatten(fun._fun(*args), "out", [])]
    return out if len(out) == n else None


def _check(flat: list, ref: Optional[list], walks: list, held, rtol, atol, every_node: bool,
           jdev) -> CheckReport:
    import jax

    from tapescope.viz.check import FAIL, CheckReport

    from tapescope.core.array import array
    from tapescope.core.eval_api import eval as mx_eval

    if not flat:
        raise ValueError("[check] The function returned no arrays to check.")
    descs = [a._d for _, a in flat]
    order, leaves, busy = _walk(descs)
    if busy:  # finish what an async eval is already running, then look again
        mx_eval([array._wrap(d) for d in busy])
        order, leaves, busy = _walk(descs)

    # -- JAX, end to end, while the graph is intact ------------------------------------------
    chain: dict = {}  # id(desc) -> jax value or None
    why: dict = {}  # id(desc) -> why there is no value
    labels: dict = {}  # id(desc) -> producer label
    no_rule: list = []
    with jax.enable_x64(True), jax.default_device(jdev):
        for d in leaves:
            chain[id(d)] = jax.device_put(host_array(d.data), jdev)
            labels[id(d)] = "leaf"
        for node in order:
            outs = _outputs_of(node)
            name = node.primitive.name
            lacking = [x for x in node.inputs if chain.get(id(x)) is None]
            if rule_for(name) is None:
                if name not in no_rule:
                    no_rule.append(name)
                vals, reasons = _run_rule(node, [])
            elif lacking:
                r = why.get(id(lacking[0]), "no value")
                r = r if r.startswith("depends on") else f"depends on {labels.get(id(lacking[0]))} ({r})"
                vals, reasons = [None] * len(outs), [r] * len(outs)
            else:
                vals, reasons = _run_rule(node, [chain[id(x)] for x in node.inputs])
            for i, d in enumerate(outs):
                if d is not None:
                    chain[id(d)] = vals[i]
                    why[id(d)] = reasons[i]
                    labels[id(d)] = _label(node) + (f"[{i}]" if len(outs) > 1 else "")
        out_ref = [(chain.get(id(d)), why.get(id(d), ""), labels.get(id(d), "leaf"))
                   for d in descs]
        ref_descs = descs if ref is None else [a._d for a in ref]
        references = _transformed_references(ref_descs, walks, out_ref)
        if ref is not None:
            references = {k: r + " (mx.compile's function, uncompiled)"
                          for k, r in references.items()}
    walks.clear()  # the forward graphs go (they held arrays, which would stop donation)
    held.close()

    # -- tapescope --------------------------------------------------------------------------
    keep: list = []
    recs: list = []
    if every_node:
        for node in order:
            outs = _outputs_of(node)
            keep.extend(d for d in outs if d is not None)
            recs.append((node, _label(node), list(node.inputs), outs))
        chain_np = {k: (None if v is None else np.asarray(v)) for k, v in chain.items()}
    n_nodes = len(order)
    del order, leaves, chain
    mx_eval([a for _, a in flat] + [array._wrap(d) for d in keep])

    outputs = []
    for (label, a), (ref, reason, producer) in zip(flat, out_ref):
        prim = producer.split("#")[0] if producer != "leaf" else ""
        outputs.append(compare(label, prim, a._d.data, None if ref is None else np.asarray(ref),
                               rtol, atol, reason))
        outputs[-1].reference = references.get(len(outputs) - 1, "")

    nodes: list = []
    first = None
    if every_node:
        with jax.enable_x64(True), jax.default_device(jdev):
            for node, label, inputs, outs in recs:
                ins = [jax.device_put(host_array(x.data), jdev) for x in inputs]
                vals, reasons = _run_rule(node, ins)
                for i, d in enumerate(outs):
                    if d is None:
                        continue
                    lbl = label + (f"[{i}]" if len(outs) > 1 else "")
                    c = compare(lbl, node.primitive.name, d.data,
                                None if vals[i] is None else np.asarray(vals[i]), rtol, atol,
                                reasons[i])
                    ref = chain_np.get(id(d))
                    if ref is not None and ref.shape == d.data.shape:
                        c.chain_max_abs = compare(lbl, "", d.data, ref, rtol, atol).max_abs
                    if c.status == FAIL and first is None:
                        first = c
                        c.inputs = [(labels.get(id(x), "leaf"), tuple(x.shape), x.dtype.name,
                                     preview(x.data), preview(chain_np.get(id(x))))
                                    for x in inputs]
                    nodes.append(c)
    return CheckReport(outputs, nodes, first, no_rule, str(jdev), n_nodes, every_node)
