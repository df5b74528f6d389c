"""Reverse and forward mode over the lazy graph (MLX's ``vjp`` / ``jvp`` in transforms.cpp).

The function runs once on *primal* arrays: evaluated arguments are aliased (a new array over
the same buffer, so the graph can tell them apart from other uses of that data), lazy ones go
through a ``Copy`` node, as MLX copies its primals. The ops it records form the forward graph.
Reverse mode walks that graph (``walk.topological``, stopping at the primals), keeps the nodes
with an input that depends on a primal (the *tape*; ``StopGradient`` nodes end it), then runs
the tape backwards: each node's VJP rule (its definition's ``vjp``) records the ops of its
input cotangents, and cotangents of a value used twice are summed with ``Add``. Forward mode
runs the same tape forwards with the JVP rules. Nothing is evaluated: the result is more lazy
graph, which ``eval`` runs, ``compile`` fuses and ``tapescope.trace`` draws. Nodes recorded by
reverse mode are flagged (``Node.backward``, ``is_backward``) so that pictures can draw them apart.
While ``recording()`` is active (``tapescope.check`` calling a function), every walk also
leaves a ``Transformation`` (its forward outputs, primals, seeds and results), from which
the check builds ``jax.vjp`` / ``jax.jvp`` of the JAX forward graph as the reference.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from .. import dtypes as _dt
from .. import transform_tracers
from ..array import ArrayDesc, array
from ..primitive import Node, Primitive, _node_ids
from ..walk import topological

_ALIASES: "weakref.WeakSet[ArrayDesc]" = weakref.WeakSet()  # primals made over evaluated data
_SEEDS: "weakref.WeakSet[ArrayDesc]" = weakref.WeakSet()  # the cotangents reverse mode starts from


_RECORDING: contextvars.ContextVar = contextvars.ContextVar("autodiff_recording", default=None)


@dataclass
class Transformation:
    """One reverse- or forward-mode walk: ``results[k]`` is the cotangent of
    ``primals[argnums[k]]`` (vjp) or the tangent of ``outputs[k]`` (jvp), given ``seeds``:
    (output, cotangent) pairs (vjp) or one tangent per argnum (jvp). A result that is one of
    the walk's own inputs (the identity function's) is None: nothing to tell apart."""

    api: str  # the API that asked: "grad", "value_and_grad", "vjp", "jvp"
    mode: str  # "vjp" or "jvp"
    outputs: list  # ArrayDescs of the forward function's outputs
    primals: list  # ArrayDescs standing for the differentiated arguments
    argnums: list
    seeds: list
    results: list


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Collect a ``Transformation`` for every vjp / jvp walk in this context (this thread);
    the graphs evaluated tracers keep are kept until it ends."""
    found: list = []
    token = _RECORDING.set(found)
    try:
        with transform_tracers.holding():  # the forward graphs, through evals inside, stay walkable
            yield found
    finally:
        _RECORDING.reset(token)


def _record(api: str, mode: str, outputs: list, primals: list, argnums: Sequence[int],
            seeds: list, results: list) -> None:
    found = _RECORDING.get()
    if found is None:
        return
    seen = {id(d) for d in outputs + primals}
    for s in seeds:
        seen.add(id(s[1] if isinstance(s, tuple) else s))
    results = [None if id(r) in seen else r for r in results]
    found.append(Transformation(api, mode, list(outputs), list(primals), list(argnums),
                                list(seeds), results))


def is_backward(node: Node) -> bool:
    """Whether reverse mode recorded ``node`` (a VJP rule's op, a cotangent sum)."""
    return node.backward


def is_seed(desc: ArrayDesc) -> bool:
    """Whether ``desc`` is a cotangent reverse mode started from (e.g. grad's 1.0)."""
    return desc in _SEEDS


def _wrap(d: ArrayDesc) -> array:
    return array._wrap(d)


def printed_name(prim: Primitive) -> str:
    """The primitive's name as MLX prints it in errors (its definition's ``label``: ``View``
    adds its dtype)."""
    label = prim.defn.label
    return prim.name if label is None else label(prim.name, prim.kw)


def make_primals(arrays: Sequence[array]) -> list[array]:
    """Fresh arrays standing for ``arrays`` in the traced graph: an alias of evaluated data
    (same buffer, a distinct array), or a ``Copy`` node of a lazy array (MLX's ``copy``)
    or of an outer transformation's alias (so that ``grad(grad(f))`` stays connected)."""
    out = []
    for a in arrays:
        d = a._d
        if d.node is None and d.kept is None and d not in _ALIASES:
            alias = ArrayDesc(d.shape, d.dtype, d.stream, data=d.data, buffer=d.buffer)
            _ALIASES.add(alias)
            out.append(_wrap(alias))
        else:
            out.append(array._make1(d.shape, d.dtype, Primitive("Copy", d.stream), [a]))
        out[-1]._d.tracer = True  # MLX's make_tracer
    return out


def _tape(outputs: Sequence[ArrayDesc], primals: Sequence[ArrayDesc], active: set,
          keep: list) -> list[Node]:
    """The nodes between the primals in ``active`` (ids, grown in place) and ``outputs``,
    in topological order (through the graphs evaluated tracers keep); StopGradient ends a
    path. Like MLX, the primals and everything walked stop being tracers."""
    leaves: list = []  # (descs hash by identity: the set's own test is the cut)
    order = topological(outputs, cut=frozenset(primals).__contains__, leaf=leaves.append,
                        kept=True)
    for d in primals:  # (transform_tracers.untrace)
        d.tracer = False
    for d in leaves:
        d.tracer = False
    tape = []
    for node in order:
        refs = node.outputs
        if len(refs) == 1:  # the common case: one output
            o = refs[0]()
            outs = () if o is None else (o,)
        else:
            outs = [o for o in map(_call_ref, refs) if o is not None]
        for o in outs:
            o.tracer = False
        if node.primitive.defn.stops_gradient:
            continue
        for x in node.inputs:
            if id(x) in active:
                tape.append(node)
                for o in outs:
                    active.add(id(o))
                keep.extend(outs)
                break
    return tape


def _call_ref(r):
    return r()


_OPS: list = []  # tapescope.core.ops, once imported (it imports this package)


def _ops():
    if not _OPS:
        from .. import ops

        _OPS.append(ops)
    return _OPS[0]


def _zeros_like(d: ArrayDesc) -> array:
    zeros_like = _ops().zeros_like
    return zeros_like(_wrap(d))


def _check_vjp(node: Node, argnums: list, vjps: list) -> None:
    """MLX's error for a VJP rule that returned the wrong number of cotangents."""
    if len(vjps) != len(argnums):
        raise ValueError(f"[vjp] The VJP of {node.primitive.name} returned {len(vjps)} "
                         f"cotangents for {len(argnums)} inputs.")


def backward(outputs: Sequence[array], primals: Sequence[array], seeds: Sequence[tuple],
             argnums: Sequence[int], api: str = "vjp") -> list[array]:
    """Cotangents of ``primals[argnums]`` given ``seeds`` = (output index, cotangent);
    ``api`` names the caller for ``recording``."""
    astype = _ops().astype
    start = next(_node_ids)  # every node this walk records has a larger id
    pdescs = [p._d for p in primals]
    out_descs = [o._d for o in outputs]
    cmap: dict = {}  # desc -> its cotangent (descs hash by identity)
    seeded: list = []  # (output desc, cotangent desc), for recording
    for i, cot in seeds:
        o = out_descs[i]
        if o not in cmap:  # MLX inserts: a repeated output keeps its first cotangent
            cmap[o] = astype(cot, o.dtype) if cot.dtype != o.dtype else cot
            _SEEDS.add(cmap[o]._d)
            seeded.append((o, cmap[o]._d))
    with transform_tracers.RetainEach() as state:
        _reverse(out_descs, pdescs, [pdescs[i] for i in argnums], cmap, state)
    grads = []
    for i in argnums:
        g = cmap.get(pdescs[i])
        grads.append(g if g is not None else _zeros_like(pdescs[i]))
    _mark(grads, start)
    _record(api, "vjp", out_descs, pdescs, argnums, seeded, [g._d for g in grads])
    return grads


def _reverse_py(outputs: list, primals: list, active: list, cmap: dict, state) -> None:
    """Reverse mode's walk: the tape between ``primals`` (descs; ``active``: the ones
    differentiated) and ``outputs`` (``_tape``), then run backwards from the cotangents in
    ``cmap`` ({desc: array}, grown and emptied in place: ``_walk_back``) under ``state``
    (``transform_tracers.RetainEach``'s). core/_autodiff.c's ``vjp_walk`` is the same walk in C
    where built (``_reverse``)."""
    ids = {id(d) for d in active}
    keep: list = list(primals)  # (the walked descs stay alive: their ids stay theirs)
    tape = _tape(outputs, primals, ids, keep)
    _walk_back(tape, cmap, ids, state)


def _no_vjp(prim: Primitive) -> None:
    """MLX's error for a primitive without a VJP rule."""
    raise ValueError(f"[Primitive::vjp] Not implemented for {printed_name(prim)}.")


def _walk_back(tape: list, cmap: dict, active: set, state) -> None:
    """The tape run backwards: each node's VJP rule under MLX's RetainGraph (``state``'s
    retain count, ``transform_tracers.RetainEach``), its cotangents summed into ``cmap``
    ({desc: array}; ``active``: the ids of the descs that depend on a primal)."""
    ops = _ops()
    add, astype = ops.add, ops.astype
    wrap = array._wrap
    _bool = _dt.bool_
    released = transform_tracers.released
    for node in reversed(tape):
        refs = node.outputs
        if len(refs) == 1:  # the common case: one output
            o = refs[0]()
            if o is None or o not in cmap:
                continue
            outs = [o]
            cots = [cmap.pop(o)]
        else:
            outs = [r() for r in refs]
            for o in outs:
                if o is not None and o in cmap:
                    break
            else:
                continue
            cots = [None if o is None else cmap.pop(o) if o in cmap else _zeros_like(o)
                    for o in outs]
        ins = node.inputs
        if len(ins) == 1:  # (the common arities without a comprehension's frame)
            args = [0] if id(ins[0]) in active else []
        elif len(ins) == 2:
            args = ([0, 1] if id(ins[1]) in active else [0]) if id(ins[0]) in active else \
                   ([1] if id(ins[1]) in active else [])
        else:
            args = [i for i, x in enumerate(ins) if id(x) in active]
        prim = node.primitive
        rule = prim.defn.vjp
        if rule is None:
            _no_vjp(prim)
        state.retain += 1  # MLX's RetainGraph around Primitive::vjp
        try:
            vjps = rule(list(map(wrap, ins)), cots, args,
                        [wrap(o) if o is not None else None for o in outs] if len(outs) != 1
                        else [wrap(outs[0])], **prim.kw)
        finally:
            state.retain -= 1
            if state.kept:  # (RetainGraph's end: the kept graphs go when nothing holds them)
                released(state)
        if vjps.__class__ is not list:
            vjps = list(vjps)
        if len(vjps) != len(args):
            _check_vjp(node, args, vjps)
        for i, g in zip(args, vjps):
            x = ins[i]
            # a bool input keeps the cotangent's own type (MLX casts none: the gradient of
            # a sum of bools is int32)
            if g._d.dtype is not x.dtype and x.dtype is not _bool:
                g = astype(g, x.dtype)
            prev = cmap.get(x)
            cmap[x] = g if prev is None else add(prev, g)


def _mark_py(grads: Sequence[array], start: int) -> None:
    """Flag the nodes above ``grads`` that this walk recorded (``Node.backward``): node ids
    grow, so they are the ones from ``start`` on, and the walk stops at the first older node
    (the forward graph's, and everything below it). A flag on the node, not a table of weak
    references: nothing for the cyclic collector to walk, nothing to sweep."""
    stack = [g._d for g in grads]
    seen: set = set()  # (this walk's: a nested walk flagged some of them already)
    while stack:
        node = stack.pop().node
        if node is None or node.id < start or node.id in seen:
            continue
        seen.add(node.id)
        node.backward = True
        stack.extend(node.inputs)


def forward(outputs: Sequence[array], primals: Sequence[array], tangents: Sequence[array],
            argnums: Optional[Sequence[int]] = None, api: str = "jvp") -> list[array]:
    """Tangents of ``outputs`` given the tangents of ``primals[argnums]`` (all by default;
    the other primals only end the walk); ``api`` names the caller for ``recording``."""
    pdescs = [p._d for p in primals]
    if argnums is None:
        argnums = range(len(pdescs))
    active = {id(pdescs[i]) for i in argnums}
    keep: list = list(pdescs)
    out_descs = [o._d for o in outputs]
    tape = _tape(out_descs, pdescs, active, keep)
    tmap = {id(pdescs[i]): t for i, t in zip(argnums, tangents)}
    for node in tape:
        args = [i for i, x in enumerate(node.inputs) if id(x) in tmap]
        if not args:
            continue
        prim = node.primitive
        rule = prim.defn.jvp
        if rule is None:
            raise ValueError(f"[Primitive::jvp] Not implemented for {printed_name(prim)}.")
        outs = [r() for r in node.outputs]
        tans = rule([_wrap(x) for x in node.inputs], [tmap[id(node.inputs[i])] for i in args],
                    args, [_wrap(o) if o is not None else None for o in outs], **prim.kw)
        for o, t in zip(outs, tans):
            if o is not None and t is not None:  # a tangent keeps its rule's dtype, as in MLX
                tmap[id(o)] = t
    res = []
    for d in out_descs:
        t = tmap.get(id(d))
        res.append(t if t is not None else _zeros_like(d))
    _record(api, "jvp", out_descs, pdescs, argnums, [t._d for t in tangents], [r._d for r in res])
    return res


def _c_walk():
    """(reverse mode's walk, the backward flags): core/_autodiff.c's ``vjp_walk`` /
    ``vjp_mark`` where the extension is built (with the array's fields in C) and
    ``settings.c_call`` is on (the rules stay Python; the walk calls this module's helpers
    for its errors), else ``_reverse_py`` / ``_mark_py``. Chosen at the first walk: the op
    layer imports this package."""
    from tapescope.kernels.primitives import PrimitiveDef
    from tapescope.kernels.settings import settings

    if not settings.c_call:
        return _reverse_py, _mark_py
    try:
        from .. import _call
    except ImportError:
        return _reverse_py, _mark_py
    ops = _ops()
    try:
        _call.configure_autodiff({
            "add": ops.add, "astype": ops.astype, "bool": _dt.bool_,
            "released": transform_tracers.released, "zeros_like": _zeros_like,
            "no_vjp": _no_vjp, "check_vjp": _check_vjp, "array_type": array,
            "primitive_type": Primitive, "definition_type": PrimitiveDef})
    except TypeError:  # (the array's fields are Python's: no handles made in C)
        return _reverse_py, _mark_py
    return _call.vjp_walk, _call.vjp_mark


def _reverse(*args) -> None:
    """The first walk: picks the walk (``_c_walk``), then runs it."""
    global _reverse, _mark
    _reverse, _mark = _c_walk()
    return _reverse(*args)


_mark = _mark_py
