"""Extended fusion (tapescope's, beyond MLX; ``tapescope.set_fusion("extended")``): a
reduction over the last or the first axes joins the elementwise work before and after it
in one ``Compiled`` kernel whose tape carries a ``Reduction`` (kernels/codegen/reduction.py).

From each reduction not yet taken (last op first), a region grows over the program: up to
producers (one with users outside becomes an extra output), down to consumers, both while
the op is elementwise
and renderable (or another reduction over the same axes of the same shape), runs on the
same stream, makes a value of the full shape or of the reduced ("row") shape, and joining
makes no cycle (no input of the op depends on the region through an op outside it). A
region of one op stays as it is; so do regions with too few rows to share among the CPU's
threads (a whole-array sum keeps MLX's split, whose elementwise kernel runs threaded), and
those on a stream whose runtime runs no reduction tapes (``Backend.reduction_tapes``: the
CPU's C and CUDA do, Metal not yet).
MLX's fusion then runs on what is left (``fusion.fuse``).
"""

from __future__ import annotations

import heapq
import os
from typing import Optional

from tapescope.kernels.backends import stream_backend
from tapescope.kernels.codegen import reduction as kred
from tapescope.kernels.codegen.c_ops import Unsupported
from tapescope.kernels.codegen.tape import MAX_COMPILE_ARRAYS, Reduction

from .primitive import Primitive
from .compile_trace import GOp, Program, Val

ELEMENTWISE = ("unary", "binary", "ternary", "broadcast", "astype")
MIN_ROWS_PER_THREAD = 2  # rows per CPU thread below which a large reduction is not fused
SMALL = 1 << 15  # elements below which a reduction is fused whatever its rows


def _spec(g: GOp) -> Optional[tuple]:
    """(full shape, reduced axes, mode) of a fusable reduction op, else None."""
    if not kred.fusable_reduction(g.prim.name) or len(g.outputs) != 1 or len(g.inputs) != 1:
        return None
    full = tuple(g.inputs[0].shape)
    axes = kred.reduced_axes(g.prim.name, g.prim.kw, len(full))
    if axes is None:
        return None
    mode = kred.mode_of(axes, len(full))
    if mode is None:
        return None
    red = Reduction(mode, len(axes), frozenset())
    rows, cols = red.split(full)
    if cols < 2 or rows * cols == 0:
        return None
    try:
        be = stream_backend(g.prim.stream)
    except (AttributeError, RuntimeError):  # no stream, or no backend for its device
        return None
    if not be.reduction_tapes:  # its runtime cannot run a reduction tape as one kernel
        return None
    cpu = be.device_type == "cpu"
    if cpu and rows * cols >= SMALL and rows < MIN_ROWS_PER_THREAD * (os.cpu_count() or 1):
        return None
    return full, axes, mode


class _Region:
    def __init__(self, prog: Program, g: GOp, spec: tuple, parents: dict, taken: set,
                 renderable, pos: dict):
        self.full, self.axes, self.mode = spec
        self.rowshape = Reduction(self.mode, len(self.axes), frozenset(["x"])).shape_of(
            "x", self.full)
        self.stream = g.prim.stream
        self.parents, self.taken, self.renderable = parents, taken, renderable
        self.ops = {id(g): g}
        self.pos = pos  # id(op) -> its place in program order (a fused region's: its last op's)
        self.first = self.last = pos[id(g)]  # the region's span in program order

    def is_row_input(self, v: Val) -> bool:
        """An input constant along the reduced axes (it broadcasts to the row shape)."""
        shape = (1,) * (len(self.full) - len(v.shape)) + tuple(v.shape)
        return len(shape) == len(self.full) and all(shape[i] == 1 for i in self.axes)

    def shape_ok(self, v: Val) -> bool:
        return tuple(v.shape) in (self.full, self.rowshape)

    def member_ok(self, op: GOp) -> bool:
        if id(op) in self.taken or op.prim.stream != self.stream or len(op.outputs) != 1:
            return False
        if not self.shape_ok(op.outputs[0]):
            return False
        if op.prim.kind in ELEMENTWISE and op.prim.fusable:
            return self.renderable(op) is None
        spec = _spec(op)
        return spec is not None and spec == (self.full, self.axes, self.mode)

    def depends(self, v: Val) -> bool:
        """Does ``v`` depend on a region op through ops outside the region? (Ops before the
        region's first in program order cannot: the walk stops there.)"""
        first = self.first
        seen: set = set()
        stack = [v]
        while stack:
            x = stack.pop()
            op = x.op
            if op is None or id(op) in seen or self.pos.get(id(op), -1) < first:
                continue
            seen.add(id(op))
            if id(op) in self.ops:
                return True
            stack.extend(op.inputs)
        return False

    def reaches(self, op: GOp) -> bool:
        """Does a value ``op`` makes reach a region op through ops outside the region? (The
        walk stops past the region's last op in program order.)"""
        last = self.last
        seen: set = set()
        stack = [u for o in op.outputs for u in self.parents.get(id(o), ())
                 if id(u) not in self.ops]
        while stack:
            u = stack.pop()
            if id(u) in seen or self.pos.get(id(u), last + 1) > last:
                continue
            seen.add(id(u))
            for o in u.outputs:
                for w in self.parents.get(id(o), ()):
                    if id(w) in self.ops:
                        return True
                    stack.append(w)
        return False

    def join(self, op: GOp) -> bool:
        """Take ``op`` in when it may join and the region stays free of cycles: a new cycle
        passes through ``op``, so it is one of its inputs depending on the region, or one of
        its values reaching the region, through ops outside."""
        if id(op) in self.ops or not self.member_ok(op):
            return False
        self.ops[id(op)] = op
        span = self.first, self.last
        p = self.pos[id(op)]
        self.first, self.last = min(self.first, p), max(self.last, p)
        if not self.reaches(op) and not any(
                x.op is not None and id(x.op) not in self.ops and self.depends(x)
                for x in op.inputs):
            return True
        del self.ops[id(op)]
        self.first, self.last = span
        return False

    def grow(self) -> None:
        """Up to producers (a producer with users outside becomes an extra output of the
        kernel: a reduction's input read once, not once more by a separate op), down to
        consumers, until nothing more joins (a rejected op is tried again when a later
        member makes it a neighbour again)."""
        work = list(self.ops.values())
        while work:
            m = work.pop()
            for x in m.inputs:
                if x.op is not None and self.join(x.op):
                    work.append(x.op)
            for u in self.parents.get(id(m.outputs[0]), ()):
                if self.join(u):
                    work.append(u)


def _toposort(tape: list) -> list:
    """``tape`` in an order where every op follows its inputs' producers, closest to the
    given order."""
    pos = {id(g): i for i, g in enumerate(tape)}
    prod = {id(o): g for g in tape for o in g.outputs}
    users: dict = {}
    need = {}
    for g in tape:
        deps = {id(prod[id(x)]) for x in g.inputs if id(x) in prod}
        need[id(g)] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(g)
    heap = [(pos[id(g)], id(g), g) for g in tape if need[id(g)] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, _, g = heapq.heappop(heap)
        out.append(g)
        for u in users.get(id(g), ()):
            need[id(u)] -= 1
            if need[id(u)] == 0:
                heapq.heappush(heap, (pos[id(u)], id(u), u))
    return out


def fuse_reductions(prog: Program, build_tape, renderable, reason_of) -> list:
    """Replace fusable reduction regions of ``prog`` by Compiled ops (in place); returns
    their boundary records (``fusion.Boundary``)."""
    from .fusion import Boundary

    output_ids = {id(v) for v in prog.outputs}
    parents: dict = {}
    for g in prog.tape:
        for v in g.inputs:
            parents.setdefault(id(v), []).append(g)
    taken: set = set()
    repl: dict = {}
    boundaries: list = []
    tape = list(prog.tape)
    pos = {id(op): i for i, op in enumerate(prog.tape)}
    changed = False
    for g in reversed(list(prog.tape)):
        if id(g) in taken:
            continue
        spec = _spec(g)
        if spec is None:
            continue
        region = _Region(prog, g, spec, parents, taken, renderable, pos)
        region.grow()
        if len(region.ops) < 2 and not g.prim.defn.fused_alone:
            continue  # a lone Sum / Max / ... stays MLX's; a lone softmax gets a C kernel
        fused = [op for op in prog.tape if id(op) in region.ops]  # topological
        inputs: list = []
        seen: set = set()
        for op in fused:
            for x in op.inputs:
                if (x.op is None or id(x.op) not in region.ops) and id(x) not in seen:
                    seen.add(id(x))
                    inputs.append(x)
        outputs = [op.outputs[0] for op in fused
                   if id(op.outputs[0]) in output_ids
                   or any(id(u) not in region.ops for u in parents.get(id(op.outputs[0]), ()))]
        if len(inputs) + len(outputs) > MAX_COMPILE_ARRAYS or not outputs:
            continue
        rows_vals = [v for v in inputs if region.is_row_input(v)] + [
            op.outputs[0] for op in fused if tuple(op.outputs[0].shape) == region.rowshape]
        try:
            t, names = build_tape(inputs, fused, outputs, reduction=(
                spec[2], len(spec[1]), rows_vals))
            kred.render(t, "probe")
        except Unsupported:
            continue
        for op in fused:
            taken.add(id(op))
        prim = Primitive("Compiled", g.prim.stream, tape=t, shape=region.full)
        cg = GOp(prim, list(inputs))
        pos[id(cg)] = max(pos[id(op)] for op in fused)
        cg.outputs = [Val(o.shape, o.dtype, op=cg, index=i) for i, o in enumerate(outputs)]
        for v in inputs:
            producer = v.op.prim.name if v.op is not None else (
                "argument" if v.arg is not None else "constant")
            boundaries.append(Boundary(t.lib_name, names[id(v)], producer, reason_of(v)))
            ps = [p for p in parents.get(id(v), ()) if id(p) not in region.ops]
            parents[id(v)] = ps + [cg]
        for o, n in zip(outputs, cg.outputs):
            parents[id(n)] = [p for p in parents.get(id(o), ()) if id(p) not in region.ops]
            repl[id(o)] = n
        tape = [op for op in tape if id(op) not in region.ops] + [cg]
        changed = True
    if not changed:
        return []
    for g in tape:
        g.inputs = [repl.get(id(v), v) for v in g.inputs]
    prog.outputs = [repl.get(id(v), v) for v in prog.outputs]
    prog.tape = _toposort(tape)
    return boundaries
