"""Tracing a function into a graph of values and ops, simplifying it, and replaying it.

``trace`` calls the function on placeholder arrays (each a node with the ``Placeholder``
primitive, so evaluating one raises MLX's error) and copies the graph it built into plain
``Val`` / ``GOp`` records: the program no longer depends on the live graph, which evaluation
detaches. ``simplify`` merges equal scalar constants and removes common subexpressions;
``replay`` records the program's ops on real input arrays (the call of a compiled function).
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Optional, Sequence

from . import dtypes as _dt
from .array import ArrayDesc, array
from .device import resolve_stream
from .primitive import ASTYPE, BINARY, BROADCAST, COMPILED, PLACEHOLDER, TERNARY, UNARY, Node, Primitive
from .walk import topological


_ELEMENTWISE = (UNARY, BINARY, TERNARY, ASTYPE)


class Val:
    """One array of the program: an argument (``arg`` = its flat index), a constant
    (``desc`` holds its data) or the ``index``-th output of ``op``."""

    __slots__ = ("shape", "dtype", "op", "index", "arg", "desc", "__weakref__")

    def __init__(self, shape: tuple, dtype: _dt.Dtype, op: Optional["GOp"] = None, index: int = 0,
                 arg: Optional[int] = None, desc: Optional[ArrayDesc] = None):
        self.shape, self.dtype, self.op, self.index, self.arg, self.desc = shape, dtype, op, index, arg, desc

    @property
    def is_constant(self) -> bool:
        return self.desc is not None

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __repr__(self) -> str:
        what = f"arg{self.arg}" if self.arg is not None else ("const" if self.desc is not None else self.op.prim.name)
        return f"Val({what}, {self.shape}, {self.dtype.name})"


class GOp:
    """A primitive applied to values, producing ``outputs`` (one Val per sibling)."""

    __slots__ = ("prim", "inputs", "outputs", "__weakref__")

    def __init__(self, prim: Primitive, inputs: list, outputs: Optional[list] = None):
        self.prim, self.inputs, self.outputs = prim, inputs, outputs or []

    def __repr__(self) -> str:
        return f"GOp({self.prim.name})"


class Program:
    """A traced function: argument values, output values, ops in topological order."""

    def __init__(self, inputs: list, outputs: list, tape: list):
        self.inputs, self.outputs, self.tape = inputs, outputs, tape
        self.boundaries: list = []  # fusion.Boundary records, filled by fusion.fuse
        self._broadcast_partners: Optional[dict] = None
        # id(Broadcast GOp) -> (partner Vals, trailing axes kept): see ``note_partners``
        self.partners: dict = {}


def make_tracers(avals: Sequence[tuple]) -> list:
    """Placeholder arrays of the given (shape, dtype)s."""
    s = resolve_stream(None)
    out = []
    for i, (shape, dtype) in enumerate(avals):
        node = Node(Primitive("Placeholder", s, index=i), [])
        d = ArrayDesc(tuple(shape), dtype, s, node=node, index=0)
        node.outputs.append(weakref.ref(d))
        out.append(array._wrap(d))
    return out


class UncapturedInputs(ValueError):
    """A compiled function's graph uses an argument other than through its placeholder."""

    def __init__(self) -> None:
        super().__init__("[compile] Attempting to compile a function with uncaptured inputs "
                         "is not allowed.")


def made_from_tracers(arrays: Sequence[array]) -> bool:
    """Whether one of ``arrays`` is a transformation's tracer in MLX's sense: grad's flag, or
    made from a placeholder (vmap's or an enclosing compile's), where MLX's compile calls
    the function itself instead of compiling it (mlx/compile.cpp)."""
    from .transform_tracers import is_tracer

    found = []

    def cut(d: ArrayDesc) -> bool:
        if d.node.primitive.kind == PLACEHOLDER:
            found.append(d)
        return bool(found)

    descs = [a._d for a in arrays]
    if any(is_tracer(d) for d in descs):
        return True
    topological(descs, cut)
    return bool(found)


def capture(tracers: Sequence[array], outputs: Sequence[ArrayDesc],
            originals: Sequence[array] = ()) -> Program:
    """Copy the graph from ``outputs`` down to the tracers and constants into a Program;
    the graph reaching one of ``originals`` (the arrays the tracers stand for) raises, as
    MLX's ``compile_dfs`` does."""
    arg_of = {id(t._d.node): i for i, t in enumerate(tracers)}
    original = {id(a._d) for a in originals}
    inputs = [Val(t.shape, t.dtype, arg=i) for i, t in enumerate(tracers)]
    vals: dict = {}  # id(desc) -> Val
    ops: dict = {}  # id(node) -> GOp
    keep: list = []  # descs seen (keeps ids stable during the walk)
    tape: list = []

    def val_of(d: ArrayDesc) -> Optional[Val]:
        v = vals.get(id(d))
        if v is not None:
            return v
        if id(d) in original:
            raise UncapturedInputs()
        if d.node is None:
            v = Val(d.shape, d.dtype, desc=d)
        elif id(d.node) in arg_of:
            v = inputs[arg_of[id(d.node)]]
        else:
            g = ops.get(id(d.node))
            if g is None:
                return None
            v = g.outputs[d.index]
        vals[id(d)] = v
        keep.append(d)
        return v

    def make_op(node: Node) -> GOp:
        g = GOp(node.primitive, [])
        alive = [r() for r in node.outputs]
        ref = next(d for d in alive if d is not None)
        for i, d in enumerate(alive):
            src = d if d is not None else ref
            g.outputs.append(Val(src.shape, src.dtype, op=g, index=i))
        ops[id(node)] = g
        keep.append(node)
        return g

    def is_tracer(d: ArrayDesc) -> bool:  # an argument: a value of the program, not an op
        return id(d.node) in arg_of

    for node in topological(outputs, is_tracer):
        g = make_op(node)
        g.inputs = [val_of(x) for x in node.inputs]
        tape.append(g)
    outs = [val_of(d) for d in outputs]
    prog = Program(inputs, outs, tape)
    table = _dynamic.partners
    if table:
        prog.partners = _capture_partners(table, ops, val_of, make_op, is_tracer)
    return prog


def _capture_partners(table: dict, ops: dict, val_of, make_op, is_tracer) -> dict:
    """The partners noted for the captured Broadcasts, as Vals. A partner the outputs do not
    need gets GOps outside the tape (their shapes are inferred on replay, nothing runs); a
    partner that reaches an original argument is dropped."""
    part: dict = {}
    queue = [k for k in table if k in ops]
    done: set = set()

    def known(d: ArrayDesc) -> bool:
        return is_tracer(d) or id(d.node) in ops

    while queue:
        key = queue.pop()
        if key in done:
            continue
        done.add(key)
        _, descs, keep = table[key]
        try:
            for n in topological(descs, known):
                if id(n) not in ops:
                    g = make_op(n)
                    g.inputs = [val_of(x) for x in n.inputs]
                    if id(n) in table:
                        queue.append(id(n))
            vals = [val_of(d) for d in descs]
        except UncapturedInputs:
            continue
        if all(v is not None for v in vals):
            part[id(ops[key])] = (vals, keep)
    return part


def _replace_inputs(tape: list, outputs: list, repl: dict) -> list:
    for g in tape:
        g.inputs = [repl.get(id(v), v) for v in g.inputs]
    return [repl.get(id(v), v) for v in outputs]


def merge_scalar_constants(prog: Program) -> int:
    """MLX's first simplification: equal 0-d constants (same dtype, same bits) become one."""
    first: dict = {}
    repl: dict = {}
    for g in prog.tape:
        for v in g.inputs:
            if v.is_constant and len(v.shape) == 0 and id(v) not in repl:
                key = (v.dtype.name, v.desc.data.tobytes())
                rep = first.setdefault(key, v)
                if rep is not v:
                    repl[id(v)] = rep
    prog.outputs = _replace_inputs(prog.tape, prog.outputs, repl)
    return len(repl)


def eliminate_common_subexpressions(prog: Program) -> int:
    """Ops with an equivalent primitive and the same inputs compute the same values: keep
    the first (an op whose outputs the function returns is never merged away)."""
    out_ids = {id(v) for v in prog.outputs}
    seen: dict = {}
    repl: dict = {}
    new_tape = []
    merged = 0
    for g in prog.tape:
        g.inputs = [repl.get(id(v), v) for v in g.inputs]
        key = (g.prim.name, g.prim.stream, tuple(id(v) for v in g.inputs))
        cands = seen.setdefault(key, [])
        match = None
        if not any(id(o) in out_ids for o in g.outputs):
            for c in cands:
                try:
                    same = c.prim.is_equivalent(g.prim)
                except Exception:  # parameters that do not compare (e.g. arrays)
                    same = False
                if same and len(c.outputs) == len(g.outputs):
                    match = c
                    break
        if match is None:
            cands.append(g)
            new_tape.append(g)
        else:
            for a, b in zip(g.outputs, match.outputs):
                repl[id(a)] = b
            merged += 1
    prog.tape = new_tape
    prog.outputs = [repl.get(id(v), v) for v in prog.outputs]
    return merged


def simplify(prog: Program) -> Program:
    """Merge scalar constants, then eliminate common subexpressions."""
    merge_scalar_constants(prog)
    eliminate_common_subexpressions(prog)
    return prog


class _Dynamic(threading.local):
    """``.on`` while a shapeless compile traces on this thread (MLX's in_dynamic_tracing),
    ``.partners`` its table: class defaults, so reading them raises nothing."""

    on = False
    partners = None


_dynamic = _Dynamic()


def in_dynamic_tracing() -> bool:
    """Whether a ``compile(shapeless=True)`` is tracing on this thread: ops whose constants
    depend on shapes (mean's 1/n) record them as primitives instead (mlx/ops.cpp)."""
    return _dynamic.on


class dynamic_tracing:
    """``with dynamic_tracing(shapeless):`` marks a trace as shapeless on this thread (and
    keeps the trace's ``note_partners`` table)."""

    def __init__(self, on: bool):
        self.on, self.saved, self.saved_table = on, False, None

    def __enter__(self) -> None:
        self.saved = in_dynamic_tracing()
        self.saved_table = _dynamic.partners
        _dynamic.on = self.on or self.saved
        if _dynamic.on and self.saved_table is None:
            _dynamic.partners = {}

    def __exit__(self, *exc) -> None:
        _dynamic.on = self.saved
        _dynamic.partners = self.saved_table


def note_partners(out: array, partners: Sequence, keep: int = 0) -> None:
    """While a shapeless trace runs: the Broadcast that made ``out`` takes its shape on
    replay from broadcasting its input with ``partners`` (arrays), the last ``keep`` axes
    left as its input's. MLX records the partners as stop-gradient inputs of the Broadcast
    (``broadcast_arrays`` under ``in_dynamic_tracing``; ``BroadcastAxes`` for matmul's batch
    axes, mlx/ops.cpp); here they stay beside the graph, in the trace's table."""
    table = _dynamic.partners
    node = out._d.node
    if table is None or node is None or node.primitive.kind != BROADCAST:
        return
    table[id(node)] = (node, [p._d for p in partners], keep)


def noted_partners(node) -> Optional[tuple]:
    """(partner descs, trailing axes kept) that ``note_partners`` noted for the Broadcast
    ``node`` in the shapeless trace running now, or None (not noted, or no such trace)."""
    table = _dynamic.partners
    hit = table.get(id(node)) if table else None
    return None if hit is None or hit[0] is not node else (hit[1], hit[2])


def trace(fun: Callable[[list], list], avals: Sequence[tuple],
          originals: Sequence[array] = ()) -> tuple:
    """Run ``fun`` (flat arrays in, flat arrays out) on placeholders; returns (program, extra)
    where ``extra`` is whatever ``fun`` returned besides its array list. A graph that uses
    one of ``originals`` (the arrays the placeholders stand for) other than through its
    placeholder raises."""
    tracers = make_tracers(avals)
    inputs = [array._wrap(t._d) for t in tracers]  # ``t *= 2`` in fun rebinds t's desc
    from .transform_tracers import placeholders

    with placeholders():
        outs, extra = fun(tracers)
    prog = capture(inputs, [o._d for o in outs], originals)
    return prog, extra


# -- replay ------------------------------------------------------------------------------

_broadcast_shape_of: list = []  # ops.convert's, once imported (ops imports this module)


def _broadcast_shapes(*shapes) -> tuple:
    if not _broadcast_shape_of:
        from .ops.convert import broadcast_shape_of

        _broadcast_shape_of.append(broadcast_shape_of)
    return _broadcast_shape_of[0](shapes)


def _partners(prog: Program) -> dict:
    """For each Broadcast op, what its first elementwise consumer broadcasts it against."""
    if prog._broadcast_partners is None:
        users: dict = {}
        for g in prog.tape:
            for v in g.inputs:
                users.setdefault(id(v), []).append(g)
        part = {}
        for g in prog.tape:
            if g.prim.kind == BROADCAST:
                out = g.outputs[0]
                consumers = users.get(id(out), [])
                if len(consumers) == 1 and consumers[0].prim.defn.fill:  # full_like
                    out = consumers[0].outputs[0]
                    consumers = users.get(id(out), [])
                for u in consumers:
                    if u.prim.kind in _ELEMENTWISE:
                        part[id(g)] = [g.inputs[0] if x is out else x.op.inputs[0]
                                       if x.op is not None and x.op.prim.kind == BROADCAST else x
                                       for x in u.inputs]
                        break
        prog._broadcast_partners = part
    return prog._broadcast_partners


class _Shape:
    """A value's shape alone: a partner that nothing computes (``_shape_of``)."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple):
        self.shape = shape


def _shape_of(prog: Program, v: Val, env: dict) -> tuple:
    """``v``'s shape on this replay: from ``env``, else inferred through the ops outside the
    tape that make it (a noted partner's graph), remembered in ``env``."""
    stack = [v]
    while stack:
        x = stack[-1]
        if id(x) in env or x.op is None:
            stack.pop()
            continue
        missing = [i for i in x.op.inputs if id(i) not in env and i.op is not None]
        if missing:
            stack.extend(missing)
            continue
        ins = [env.get(id(i)) or _Shape(i.shape) for i in x.op.inputs]
        shapes, _ = _infer_shapes(prog, x.op, ins, env)
        for o, sh in zip(x.op.outputs, shapes):
            env[id(o)] = _Shape(tuple(sh))
        stack.pop()
    return env[id(v)].shape if id(v) in env else v.shape


def _noted_shape(prog: Program, g: GOp, ins: list, env: dict) -> Optional[tuple]:
    """A Broadcast's shape from its noted partners (``note_partners``), or None without
    them (or when a partner's shape cannot be inferred)."""
    rec = prog.partners.get(id(g))
    if rec is None:
        return None
    vals, keep = rec
    try:
        shapes = [ins[0].shape] + [_shape_of(prog, v, env) for v in vals]
    except Exception:  # noqa: BLE001 - a partner's op without a shape rule: not noted
        return None
    if keep:  # the batch axes broadcast; the trailing ones stay the input's
        return _broadcast_shapes(*[sh[:-keep] for sh in shapes]) + tuple(ins[0].shape[-keep:])
    return _broadcast_shapes(*shapes)


def _infer_shapes(prog: Program, g: GOp, ins: list, env: dict) -> tuple:
    """(output shapes, primitive to record) of ``g`` on inputs of new shapes (shapeless
    compile): elementwise ops broadcast, Broadcast follows its consumer, fused tapes take the
    broadcast of their inputs, every other primitive its definition's shape rule (core/shapeless.py)."""
    kind = g.prim.kind
    if g.prim.kind == COMPILED:  # a fused elementwise tape: its inputs must broadcast
        shape = _broadcast_shapes(*[d.shape for d in ins])
        kw = g.prim.kwargs()
        kw["shape"] = tuple(shape)
        return [tuple(shape)] * len(g.outputs), Primitive("Compiled", g.prim.stream, **kw)
    if kind in _ELEMENTWISE:
        return [_broadcast_shapes(*[d.shape for d in ins])] * len(g.outputs), g.prim
    if kind == BROADCAST:
        shape = _noted_shape(prog, g, ins, env) if prog.partners else None
        if shape is None:
            part = _partners(prog).get(id(g))
            if part:
                shape = _broadcast_shapes(*[env[id(v)].shape if id(v) in env else v.shape
                                            for v in part])
            elif tuple(g.prim.kw["shape"]) == tuple(g.inputs[0].shape):
                # a Broadcast that changed nothing when traced (a shapeless trace's matmul
                # operand, its partners not at hand: an imported function) keeps its input's
                shape = tuple(ins[0].shape)
            else:
                shape = _broadcast_shapes(ins[0].shape, g.outputs[0].shape)
        if shape == tuple(g.prim.kw["shape"]):
            return [shape], g.prim
        return [shape], Primitive("Broadcast", g.prim.stream, **{**g.prim.kw, "shape": shape})
    from .shapeless import infer

    return infer(g.prim, [d.shape for d in ins])


class ReplayPlan:
    """A program flattened for fast replay on inputs of the traced shapes.

    Values live in slots of a list: the arguments, then the constants, then each op's
    outputs in tape order; a step is (primitive, input slots, output (shape, dtype)s).
    ``run`` records exactly the nodes ``replay`` records, without its dictionary work.
    """

    __slots__ = ("steps", "consts", "outs", "single")

    def __init__(self, prog: Program):
        slot: dict = {id(v): i for i, v in enumerate(prog.inputs)}
        consts: list = []

        def const_slot(v: Val) -> int:
            slot[id(v)] = len(prog.inputs) + len(consts)
            consts.append(v.desc)
            return slot[id(v)]

        for g in prog.tape:
            for v in g.inputs:
                if id(v) not in slot and v.op is None:
                    const_slot(v)
        for v in prog.outputs:  # constants the function returns as they are
            if id(v) not in slot and v.op is None:
                const_slot(v)
        n = len(prog.inputs) + len(consts)
        steps = []
        for g in prog.tape:
            ins = tuple(slot[id(v)] for v in g.inputs)
            outs = tuple((o.shape, o.dtype) for o in g.outputs)
            for o in g.outputs:
                slot[id(o)] = n
                n += 1
            steps.append((g.prim, ins, outs))
        self.outs = tuple(slot[id(v)] for v in prog.outputs)
        self.steps, self.consts = tuple(steps), consts
        # the common shape: one single-output op whose output is the only result
        self.single = (len(steps) == 1 and len(steps[0][2]) == 1
                       and self.outs == (len(prog.inputs) + len(consts),))

    @classmethod
    def shaped(cls, prog: Program, real: Sequence[ArrayDesc]) -> "ReplayPlan":
        """A shapeless program's plan for arguments of ``real``'s shapes: the nodes
        ``replay(prog, real, True)`` records (its primitives and inferred shapes, made once),
        as a plan of the traced shapes is, so a call of those shapes replays it (in C)."""
        plan = cls.__new__(cls)
        slot: dict = {id(v): i for i, v in enumerate(prog.inputs)}
        consts: list = []
        for v in [v for g in prog.tape for v in g.inputs] + list(prog.outputs):
            if id(v) not in slot and v.op is None:  # (ReplayPlan's slots, in its order)
                slot[id(v)] = len(prog.inputs) + len(consts)
                consts.append(v.desc)
        env: dict = {id(v): d for v, d in zip(prog.inputs, real)}
        n = len(prog.inputs) + len(consts)
        steps = []
        for g in prog.tape:
            ins = [env.get(id(v)) or v.desc for v in g.inputs]
            shapes, prim = _infer_shapes(prog, g, ins, env)
            for o, sh in zip(g.outputs, shapes):
                env[id(o)] = _Shape(tuple(sh))
            steps.append((prim, tuple(slot[id(v)] for v in g.inputs),
                          tuple((tuple(sh), o.dtype) for sh, o in zip(shapes, g.outputs))))
            for o in g.outputs:
                slot[id(o)] = n
                n += 1
        plan.outs = tuple(slot[id(v)] for v in prog.outputs)
        plan.steps, plan.consts = tuple(steps), consts
        plan.single = (len(steps) == 1 and len(steps[0][2]) == 1
                       and plan.outs == (len(prog.inputs) + len(consts),))
        return plan

    def run(self, real: list) -> list:
        """Record the program's ops on ``real`` (argument descs); returns the output descs."""
        if self.single:
            prim, ins, ((shape, dtype),) = self.steps[0]
            env = real + self.consts if self.consts else real
            node = Node(prim, [env[i] for i in ins])
            d = ArrayDesc(shape, dtype, prim.stream, node=node)
            node.outputs.append(weakref.ref(d))
            return [d]
        env = real + self.consts
        _replay(self.steps, env)
        return [env[i] for i in self.outs]


def _replay_py(steps: tuple, env: list) -> None:
    """``ReplayPlan.run``'s loop: each step's node over ``env``'s descs at its input slots,
    its output descs appended to ``env`` (core/_call.c ``replay`` is the same in C)."""
    for prim, ins, outs in steps:
        node = Node(prim, [env[i] for i in ins])
        stream = prim.stream
        for i, (shape, dtype) in enumerate(outs):
            d = ArrayDesc(shape, dtype, stream, node=node, index=i)
            node.outputs.append(weakref.ref(d))
            env.append(d)


def _c_replay():
    """core/_call.c's ``replay`` where array._make1 records in C (the same switch)."""
    if getattr(array, "_make1_py", None) is None:
        return _replay_py
    from . import _call

    return _call.replay


_replay = _c_replay()


def replay(prog: Program, real: Sequence[ArrayDesc], shapeless: bool = False) -> list:
    """Record the program's ops on the real input descs; returns the output descs."""
    env: dict = {}
    for v, d in zip(prog.inputs, real):
        env[id(v)] = d
    for g in prog.tape:
        ins = []
        for v in g.inputs:
            d = env.get(id(v))
            if d is None:  # a constant (or closed-over array): itself
                d = env[id(v)] = v.desc
            ins.append(d)
        shapes, prim = _infer_shapes(prog, g, ins, env) if shapeless else (None, g.prim)
        node = Node(prim, ins)
        for i, o in enumerate(g.outputs):
            d = ArrayDesc(shapes[i] if shapes else o.shape, o.dtype, prim.stream, node=node, index=i)
            node.outputs.append(weakref.ref(d))
            env[id(o)] = d
    out = []
    for v in prog.outputs:
        d = env.get(id(v))
        out.append(d if d is not None else v.desc)
    return out
