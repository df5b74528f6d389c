"""Fusion: chains of elementwise ops become ``Compiled`` ops over a tape (MLX's compile_fuse).

Walking the program from its last op backwards, each op not yet fused is the root of a
candidate: its inputs join while they are fusable (unary, binary, ternary, Broadcast,
AsType) and the kernel runtime can render them with their dtypes (``cannot_render``: an op
without a C spelling, such as ErfInv, is a boundary that runs on its own), on the same
stream, within the depth limit (11) and the array limit (24 inputs and outputs per kernel),
every user of theirs is already inside, and — for values the
function returns — they have the root's shape. Such values become extra outputs of the
tape. A candidate of one op is left alone. Every input of a tape records *why* fusion
stopped there (``Boundary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tapescope.kernels.backends import stream_backend
from tapescope.kernels.codegen.render import cannot_render
from tapescope.kernels.codegen.tape import (
    MAX_COMPILE_ARRAYS, MAX_COMPILE_DEPTH, Reduction, TapeInput, TapeOp, make_tape, node_name,
)

from tapescope.kernels.settings import setting, settings
from tapescope.kernels.primitives import COMPILED

from .primitive import BROADCAST, Primitive
from .compile_trace import GOp, Program, Val


# Why fusion stopped at a value (the graph picture shows these on a tape's input edges).
ARGUMENT = "argument"
CONSTANT = "constant"
DEPTH_LIMIT = "depth limit"
ARRAY_LIMIT = "array limit"
REDUCTION = "reduction"
NON_FUSABLE = "non-fusable primitive"
COLLECTIVE = "collective (communication between processes)"
SHAPE_CHANGE = "shape change"
NEEDED_ELSEWHERE = "output needed elsewhere"
STREAM_MISMATCH = "stream mismatch"
ALREADY_FUSED = "output of another fused kernel"
# a shapeless trace's Broadcast of matmul's batch axes, whose shape follows its partners and
# keeps its trailing axes (MLX's BroadcastAxes, which MLX does not fuse): a fused tape's shape
# on replay is its inputs' broadcast, which would lose the partners' axes
BROADCAST_AXES = "broadcast of batch axes (follows the other operand)"


_NOT_FUSED = {"reduce": REDUCTION, "distributed": COLLECTIVE}  # family -> the reason shown

# The fusion mode: "mlx" (MLX's rules, the default) or "extended" (reductions fuse with their
# elementwise neighbours too: fusion_reduce.py): ``settings.fusion`` (TAPESCOPE_FUSION gives
# its initial value). _MODE is the copy the compile cache's key reads (also in core/_call.c).
MODES = setting("fusion").choices
_MODE = ["mlx"]
settings.watch("fusion", lambda mode: _MODE.__setitem__(0, mode))


def set_fusion(mode: str) -> None:
    """Choose how ``mx.compile`` fuses: ``"mlx"`` (MLX's rules: only elementwise chains; the
    default) or ``"extended"`` (tapescope's extension: reductions over the last or first
    axes fuse with the elementwise work before and after them). Functions compiled before
    keep their programs per mode (the compile cache is keyed by the mode)."""
    if mode not in MODES:
        raise ValueError(f"[set_fusion] Unknown fusion mode {mode!r}: expected one of "
                         f"{', '.join(map(repr, MODES))}.")
    settings.fusion = mode


def fusion_mode() -> str:
    """The current fusion mode (``settings.fusion``): ``"mlx"`` or ``"extended"``."""
    return settings.fusion


@dataclass(frozen=True)
class Boundary:
    """One input edge of a fused tape and why the tape did not reach past it."""

    kernel: str  # the tape's kernel library name
    input: str  # the input's letter in the tape
    producer: str  # the primitive that made the value ("argument" / "constant" for leaves)
    reason: str


def boundary_reason(prim: Primitive) -> Optional[str]:
    """Why fusion cannot reach past a value ``prim`` made, known from the primitive alone
    (a live graph's fused kernels, whose fusion decisions were not recorded): another fused
    kernel, a reduction, a collective, another non-fusable primitive; None when it depends on
    the rest of the graph."""
    if prim.kind == COMPILED:
        return ALREADY_FUSED
    if not prim.fusable:
        return _NOT_FUSED.get(prim.kind, NON_FUSABLE)
    return None


def _fusable(g: GOp) -> bool:
    return g.prim.fusable and len(g.outputs) == 1


def _unrenderable(g: GOp):
    """Why the kernel runtime of ``g``'s stream cannot compute ``g`` (None when it can): the
    stream's backend names its dialect (C on the CPU, CUDA, MSL)."""
    try:
        dialect = stream_backend(g.prim.stream).dialect
    except (AttributeError, RuntimeError):  # no stream, or no backend for its device
        dialect = "c"
    return cannot_render(g.prim.name, [v.dtype.np for v in g.inputs], g.outputs[0].dtype.np,
                         dialect)


def _constant_value(v: Val):
    x = v.desc.data.reshape(())
    val = x.item()
    if v.dtype.name == "bfloat16":
        val = float(x.astype("float32"))
    return val


def _split(v: Val, parents: dict, cache: set) -> Val:
    """A copy of ``v``'s Broadcast for its users inside the candidate (``cache``); the other
    users keep ``v`` (MLX's ``split_one``, mlx/compile.cpp: a broadcast needed elsewhere is
    recomputed inside the kernel rather than stopping the fusion)."""
    op = v.op
    g = GOp(op.prim, list(op.inputs))
    g.outputs = [Val(v.shape, v.dtype, op=g, index=0)]
    nv = g.outputs[0]
    inside = [p for p in parents.get(id(v), ()) if id(p) in cache]
    for p in inside:
        p.inputs = [nv if x is v else x for x in p.inputs]
    parents[id(v)] = [p for p in parents.get(id(v), ()) if id(p) not in cache]
    parents[id(nv)] = inside
    for x in set(map(id, op.inputs)):
        parents.setdefault(x, []).append(g)
    return nv


def build_tape(inputs: list, fused: list, outputs: list, reduction: Optional[tuple] = None):
    """The kernels-layer tape for fused ops ``fused`` (topological) with boundary ``inputs``;
    ``reduction``: (mode, number of reduced axes, the row-valued Vals) of a reduction tape."""
    names: dict = {}
    for v in inputs:
        names[id(v)] = node_name(len(names))
    for g in fused:
        names[id(g.outputs[0])] = node_name(len(names))
    tin = []
    for v in inputs:
        const = v.is_constant and v.arg is None and v.size == 1
        tin.append(TapeInput(names[id(v)], v.dtype.np, scalar=len(v.shape) == 0,
                             constant=_constant_value(v) if const else None))
    tops = [TapeOp(names[id(g.outputs[0])], g.prim.name, g.outputs[0].dtype.np,
                   tuple(names[id(x)] for x in g.inputs), g.prim.params) for g in fused]
    red = None
    if reduction is not None:
        mode, naxes, rows = reduction
        red = Reduction(mode, naxes, frozenset(names[id(v)] for v in rows))
    return make_tape(tin, tops, [names[id(o)] for o in outputs], red), names


def fuse(prog: Program, reductions: Optional[bool] = None) -> Program:
    """Replace fusable chains of ``prog`` by Compiled ops (in place); returns ``prog``.
    ``reductions``: fuse reductions too (tapescope's extension; default: the fusion mode
    is ``"extended"``)."""
    pre: list = []
    if reductions if reductions is not None else _MODE[0] == "extended":
        from .fusion_reduce import fuse_reductions

        pre = fuse_reductions(prog, build_tape, _unrenderable, _input_reason)
    output_ids = {id(v) for v in prog.outputs}
    axes_only = {k for k, (_, keep) in prog.partners.items() if keep} if prog.partners else ()
    parents: dict = {}
    for g in prog.tape:
        for v in g.inputs:
            parents.setdefault(id(v), []).append(g)
    repl: dict = {}
    global_cache: set = set()
    new_tape: list = []
    boundaries: list = []
    dropped: list = []  # the ops fused away

    for g in reversed(prog.tape):
        if id(g) in global_cache:
            continue
        root = g.outputs[0]
        cache: set = set()
        reasons: dict = {}
        bound = [1]  # |rejected| + pending slots: an upper bound on the tape's inputs
        extra_outs = [0]

        def _fits(op: GOp, out: int) -> bool:  # within the array limit with op's inputs
            n_children = len({id(x) for x in op.inputs})
            return bound[0] - 1 + n_children + 1 + extra_outs[0] + out <= MAX_COMPILE_ARRAYS

        def recurse(v: Val, depth: int, stream, shape) -> None:
            op = v.op
            if op is not None and id(op) in cache:
                bound[0] -= 1
                return
            reason = None
            if op is None:
                reason = ARGUMENT if v.arg is not None else CONSTANT
            elif id(op) in global_cache or op.prim.kind == COMPILED:
                reason = ALREADY_FUSED
            elif depth >= MAX_COMPILE_DEPTH:
                reason = DEPTH_LIMIT
            elif op.prim.stream != stream:
                reason = STREAM_MISMATCH
            elif not _fusable(op):
                reason = _NOT_FUSED.get(op.prim.kind, NON_FUSABLE)
            elif id(op) in axes_only:
                reason = BROADCAST_AXES
            elif (why := _unrenderable(op)) is not None:
                reason = why  # e.g. "no C spelling for ErfInv": the runtime could not run it
            elif id(v) in output_ids and v.shape != shape:
                reason = SHAPE_CHANGE
            elif depth > 0 and any(id(p) not in cache for p in parents.get(id(v), ())):
                if op.prim.kind == BROADCAST and _fits(op, 0):
                    recurse(_split(v, parents, cache), depth, stream, shape)
                    return
                reason = NEEDED_ELSEWHERE
            elif not _fits(op, 1 if depth > 0 and id(v) in output_ids else 0):
                reason = ARRAY_LIMIT
            if reason is not None:
                reasons[id(v)] = reason
                return
            cache.add(id(op))
            if depth > 0 and id(v) in output_ids:
                extra_outs[0] += 1
            bound[0] += len({id(x) for x in op.inputs}) - 1
            for x in op.inputs:
                recurse(x, depth + 1, stream, shape)

        if _fusable(g) and _unrenderable(g) is None and id(g) not in axes_only:
            recurse(root, 0, g.prim.stream, root.shape)
        if len(cache) <= 1:
            new_tape.append(g)
            continue

        inputs: list = []
        seen_in: set = set()
        fused: list = []
        seen_op: set = set()

        def recurse_tape(v: Val) -> None:
            op = v.op
            if op is None or id(op) not in cache:
                if id(v) not in seen_in:
                    seen_in.add(id(v))
                    inputs.append(v)
                return
            if id(op) in seen_op:
                return
            seen_op.add(id(op))
            for x in op.inputs:
                recurse_tape(x)
            fused.append(op)

        recurse_tape(root)
        old_outputs = [f.outputs[0] for f in fused[:-1] if id(f.outputs[0]) in output_ids]
        old_outputs.append(root)
        for f in fused:
            global_cache.add(id(f))
        dropped += fused
        tape, names = build_tape(inputs, fused, old_outputs)
        prim = Primitive("Compiled", g.prim.stream, tape=tape, shape=root.shape)
        cg = GOp(prim, list(inputs))
        cg.outputs = [Val(o.shape, o.dtype, op=cg, index=i) for i, o in enumerate(old_outputs)]
        for v in inputs:
            producer = v.op.prim.name if v.op is not None else reasons.get(id(v), ARGUMENT)
            boundaries.append(Boundary(tape.lib_name, names[id(v)], producer,
                                       reasons.get(id(v), NON_FUSABLE)))
            ps = [p for p in parents.get(id(v), ()) if id(p) not in cache]
            parents[id(v)] = ps + [cg]
        for o, n in zip(old_outputs, cg.outputs):
            parents[id(n)] = [p for p in parents.get(id(o), ()) if id(p) not in cache]
            repl[id(o)] = n
        new_tape.append(cg)

    # the recursive closures reach themselves through their cells: emptied, what they hold
    # (the traced graph, a constant's array among it) goes by reference counting
    recurse = recurse_tape = None  # noqa: F841
    for f in dropped:  # (an op and its values refer to each other: cut the same way)
        f.outputs = []
    new_tape.reverse()
    for g in new_tape:
        g.inputs = [repl.get(id(v), v) for v in g.inputs]
    prog.outputs = [repl.get(id(v), v) for v in prog.outputs]
    prog.tape = new_tape
    prog.boundaries = pre + boundaries
    return prog


def _input_reason(v: Val) -> str:
    """Why a reduction tape stopped at input ``v`` (the region's growth is not recorded)."""
    if v.op is None:
        return ARGUMENT if v.arg is not None else CONSTANT
    return boundary_reason(v.op.prim) or NEEDED_ELSEWHERE


def tapes(prog: Program) -> list:
    """The kernel tapes of a fused program, in execution order."""
    return [g.prim.kwargs()["tape"] for g in prog.tape if g.prim.kind == COMPILED]
