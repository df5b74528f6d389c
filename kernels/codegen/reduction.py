"""Fused reductions (tapescope's extended fusion, beyond MLX): a tape whose reductions run in
the same kernel as the elementwise work before and after them.

The kernel sees its full shape as ``rows x cols``: ``cols`` elements are reduced for each of
``rows`` kept indices (the last axes reduced, or the first). Every tape value is either a
*row* value (one per kept index: a reduction's result and what is computed from such values
alone) or a *full* value. Each row is walked in passes: pass ``p`` computes the full values
whose row inputs are ready, accumulates the reductions over them and stores full outputs;
between passes the row values made from the finished reductions are computed. Softmax is
three walks over a row that stays in cache (one read and one write of memory), layernorm
likewise. ``LogSumExp`` and ``Softmax`` expand into their max and sum passes here.

``ReductionSchedule`` writes the loops over a dialect's tables (``render.CFamily``: types,
loads, stores, one expression per op); ``interpret`` is the numpy executor of the same tape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

import ml_dtypes
import numpy as np

from ..primitives import BROADCAST, REDUCE, REGISTRY
from .c_ops import Unsupported, _is_float
from .interpret import bind_inputs
from .lower import parallel_loop
from .tape import Tape, TapeOp

_BF16 = np.dtype(ml_dtypes.bfloat16)
_FOLDS = ("sum", "prod", "max", "min")  # the monoids a fused reduction accumulates
_EXPANDED = ("logsumexp", "softmax")  # kernels expanded into a max pass and a sum pass


def fold_of(prim: str) -> str:
    """What a fusable reduction folds with, from its definition: its monoid (``sum``,
    ``prod``, ``max``, ``min``), ``arg`` for an arg-reduction, ``logsumexp`` / ``softmax``
    for the two expanded into passes; "" when ``prim`` is not a fusable reduction."""
    d = REGISTRY.get(prim)
    if d is None or d.family != REDUCE:
        return ""
    if d.kernel == "arg_reduce":
        return "arg"
    if d.kernel in _EXPANDED:
        return d.kernel
    return d.monoid if d.kernel == "reduce" and d.monoid in _FOLDS else ""


def fusable_reduction(prim: str) -> bool:
    """Whether extended fusion can put reduction ``prim`` in a reduction tape."""
    return bool(fold_of(prim))


def reduced_axes(prim: str, params: dict, ndim: int) -> Optional[tuple]:
    """The axes a fusable reduction reduces (sorted), or None when it is not one."""
    fold = fold_of(prim)
    if fold in _FOLDS:
        return tuple(sorted(int(a) % ndim for a in params["axes"])) if ndim else None
    if fold == "arg":
        return (int(params["axis"]) % ndim,) if ndim else None
    if fold in _EXPANDED:
        return (ndim - 1,) if ndim else None
    return None


def mode_of(axes: tuple, ndim: int) -> Optional[str]:
    """``"last"`` when ``axes`` are the last ones, ``"first"`` when the first, else None."""
    k = len(axes)
    if k == 0 or k > ndim:
        return None
    if axes == tuple(range(ndim - k, ndim)):
        return "last"
    if axes == tuple(range(k)):
        return "first"
    return None


# -- lowering: the tape as row / full items with pass levels -------------------------------

@dataclass
class Item:
    """One value of the lowered tape: a load, an op's expression, or a reduction."""

    name: str
    row: bool
    kind: str  # "in", "op", "red"
    dtype: np.dtype
    args: tuple = ()
    prim: str = ""
    params: dict = field(default_factory=dict)
    expr: Optional[str] = None  # a ready expression (expansions), else the op's spelling
    level: int = 0
    fold: str = ""  # a reduction's: ``fold_of`` its primitive (``sum``, ..., ``arg``)
    # an expansion's sum of exp(v - max) over the values of max ``online`` (its name): a
    # GPU folds the two in one online pass (``fused_reduce.online_pairs``)
    online: str = ""


def lower(tape: Tape, d) -> list:
    """The tape's values in order, ``LogSumExp`` / ``Softmax`` expanded into their passes,
    each with its level (the pass that computes it, or for row values the pass before which
    it is ready)."""
    red = tape.reduction
    items: list = []
    by: dict = {}

    def add(it: Item) -> None:
        if it.kind == "in":
            it.level = 0
        elif it.kind == "red":
            it.level = by[it.args[0]].level + 1
        else:
            it.level = max((by[a].level for a in it.args), default=0)
        items.append(it)
        by[it.name] = it

    for x in tape.inputs:
        add(Item(x.name, x.name in red.rows or x.scalar or x.is_constant, "in", np.dtype(x.dtype)))
    for op in tape.ops:
        dt = np.dtype(op.dtype)
        row = op.name in red.rows
        src = op.inputs[0] if op.inputs else None
        fold = fold_of(op.primitive)
        if fold in _EXPANDED:
            in_dt = by[src].dtype
            if not _is_float(in_dt):
                raise Unsupported(f"{op.primitive} on {in_dt}")
            f32 = np.dtype(np.float32)
            wide = f32 if (in_dt.itemsize < 4 or fold == "logsumexp"
                           or dict(op.params).get("precise")) else in_dt
            ct = d.compute_type(wide)
            m, e, s = f"{op.name}_m", f"{op.name}_e", f"{op.name}_s"
            add(Item(m, True, "red", wide, (src,), fold="max"))
            exp = d.exp_name(wide)
            if fold == "logsumexp":
                z = f"{op.name}_z"
                add(Item(z, True, "op", wide, (m,), expr=f"(isinf(tmp_{m}) ? ({ct})0 : tmp_{m})"))
                add(Item(e, False, "op", wide, (src, z), expr=f"{exp}(({ct})tmp_{src} - tmp_{z})"))
                add(Item(s, True, "red", wide, (e,), fold="sum", online=m))
                log = d._fn_name("log", wide)
                add(Item(op.name, True, "op", dt, (m, z, s), expr=d.round_to(
                    dt, f"(isinf(tmp_{m}) ? tmp_{m} : tmp_{z} + {log}(tmp_{s}))")))
            else:
                add(Item(e, False, "op", wide, (src, m), expr=f"{exp}(({ct})tmp_{src} - tmp_{m})"))
                add(Item(s, True, "red", wide, (e,), fold="sum", online=m))
                add(Item(op.name, False, "op", dt, (e, s),
                         expr=d.round_to(dt, f"tmp_{e} / tmp_{s}")))
            continue
        if fold:
            add(Item(op.name, True, "red", dt, (src,), op.primitive, dict(op.params), fold=fold))
            continue
        add(Item(op.name, row, "op", dt, tuple(op.inputs), op.primitive, dict(op.params)))
    return items


# -- the CPU loops ----------------------------------------------------------------------

def _int_limits(dt: np.dtype) -> tuple:
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    suf = "ULL" if dt.kind == "u" and dt.itemsize == 8 else ("LL" if dt.itemsize == 8 else "")
    lo_t = "(-9223372036854775807LL - 1)" if lo == -(2**63) else f"{lo}{suf}"
    return lo_t, f"{hi}{suf}"


class ReductionSchedule:
    """The CPU's loops for a reduction tape: rows in parallel (OpenMP, ``lower.parallel_loop``:
    a thread per core, guided, no parallel region below ``omp_min_size``), each row in passes,
    ``omp simd`` reductions over the reduced elements. ``void <name>(void** args)``: the
    non-constant inputs' data, the outputs' data, then one int64 array: rows, cols, the full
    outputs' row and column strides, and (row, column) element strides per array input."""

    omp_min_size = 1 << 15  # elements below which the rows run on one thread

    def arguments(self, tape: Tape) -> list:
        return [x for x in tape.non_constant_inputs]

    def render(self, d, tape: Tape, kernel_name: str) -> str:
        items = lower(tape, d)
        by = {it.name: it for it in items}
        ins = tape.non_constant_inputs
        outs = d.outputs(tape)
        out_names = {n for _, n, _ in outs}
        # what the kernel calls: the tape's own ops plus the expansions' exp / log
        extra = []
        for it in items:
            if it.expr is not None and "exp" in it.expr:
                extra.append(TapeOp(f"{it.name}_x", "Exp", it.dtype, ()))
            if it.expr is not None and "log" in it.expr:
                extra.append(TapeOp(f"{it.name}_l", "Log", it.dtype, ()))
        probe = Tape(tape.inputs, tape.ops + tuple(extra), tape.outputs)
        L = [d.preamble(probe) + _SCRATCH + getattr(d, "ir_cpu_threads", ""),
             f"{d.kernel_prefix} {kernel_name}(void** args) {{"]
        k = 0
        for x in ins:
            st = d.storage_type(x.dtype)
            L.append(f"  const {st}* {x.name} = (const {st}*)args[{k}];")
            k += 1
        for oname, _, dt in outs:
            st = d.storage_type(dt)
            L.append(f"  {st}* {oname} = ({st}*)args[{k}];")
            k += 1
        L.append(f"  const int64_t* meta = (const int64_t*)args[{k}];")
        L.append("  const int64_t rows = meta[0], cols = meta[1], o_sr = meta[2], o_sc = meta[3];")
        j = 4
        arrays = [x for x in ins if not x.scalar]
        for x in arrays:
            L.append(f"  const int64_t {x.name}_sr = meta[{j}], {x.name}_sc = meta[{j + 1}];")
            j += 2
        full_in = [x for x in arrays if not by[x.name].row]
        if tape.reduction.mode == "first":
            L += self._first(d, tape, items, by, arrays, outs)
            L.append("}")
            return "\n".join(L) + "\n"
        unit = " && ".join(["o_sc == 1"] + [f"{x.name}_sc == 1" for x in full_in])
        L.append(f"  const int unit = {unit};")
        loop_at = len(L)  # the row loop, from here to its end, spread by parallel_loop
        L.append("  for (int64_t r = 0; r < rows; ++r) {")
        for x in arrays:
            L.append(f"    const {d.storage_type(x.dtype)}* {x.name}_p = {x.name} + r * {x.name}_sr;")
        for oname, n, dt in outs:
            if not by[n].row:
                L.append(f"    {d.storage_type(dt)}* {oname}_p = {oname} + r * o_sr;")
        # row inputs and constants
        for x in tape.inputs:
            it = by[x.name]
            if not it.row:
                continue
            ct = d.compute_type(x.dtype)
            if x.is_constant:
                L.append(f"    const {ct} tmp_{x.name} = {d.literal(x)};")
            elif x.scalar:
                L.append(f"    const {ct} tmp_{x.name} = {d.load(x.dtype, f'{x.name}[0]')};")
            else:
                L.append(f"    const {ct} tmp_{x.name} = {d.load(x.dtype, f'{x.name}_p[0]')};")
        n_pass = 1 + max([it.level for it in items if not it.row] +
                         [it.level - 1 for it in items if it.kind == "red"] + [0])
        plans = self._plan(d, items, by, outs, n_pass)
        cached = sorted({n for pl in plans for n in pl[3]}, key=lambda n: list(by).index(n))
        if cached:  # one row of each cached value, in this thread's workspace
            sizes = " + ".join(f"ts_pad64(cols * sizeof({d.compute_type(by[n].dtype)}))"
                               for n in cached)
            L.append(f"    char* scr = ts_scratch({sizes});")
            off = "0"
            for n in cached:
                ct = d.compute_type(by[n].dtype)
                L.append(f"    {ct}* scr_{n} = scr ? ({ct}*)(scr + {off}) : 0;")
                off += f" + ts_pad64(cols * sizeof({ct}))"
        done: set = {x.name for x in tape.inputs if by[x.name].row}
        for p in range(n_pass + 1):
            L += self._row_ops(d, items, done, p)
            if p == n_pass:
                break
            L += self._pass(d, items, by, p, plans[p])
            done.update(it.name for it in items if it.kind == "red" and it.level - 1 == p)
        for oname, n, dt in outs:
            if by[n].row:
                L.append(f"    {oname}[r] = {d.store(dt, f'tmp_{n}')};")
        L.append("  }")
        L[loop_at:] = parallel_loop(L[loop_at:], "rows", f"rows > 1 && rows * cols >= {self.omp_min_size}",
                               "  ", "r")
        L.append("}")
        return "\n".join(L) + "\n"

    block = 64  # kept indices per block of the first-axes schedule (one vector row each)

    def _first(self, d, tape, items, by, arrays, outs) -> list:
        """The first-axes schedule: blocks of ``block`` kept indices (contiguous in memory)
        in parallel; each pass walks the reduced index ``c`` outside and the block inside
        (``omp simd`` over it), so every load is a unit-stride run; row values are arrays of
        the block."""
        B = self.block
        full_in = [x for x in arrays if not by[x.name].row]
        unit = " && ".join(["o_sr == 1"] + [f"{x.name}_sr == 1" for x in full_in])
        L = [f"  const int unit = {unit};"]
        uniform = set()
        for x in tape.inputs:  # constants and 0-d inputs: one value for the whole kernel
            if x.is_constant or x.scalar:
                ct = d.compute_type(x.dtype)
                val = d.literal(x) if x.is_constant else d.load(x.dtype, f"{x.name}[0]")
                L.append(f"  const {ct} tmp_{x.name} = {val};")
                uniform.add(x.name)
        loop_at = len(L)  # the block loop, from here to its end, spread by parallel_loop
        L.append(f"  for (int64_t rb = 0; rb < rows; rb += {B}) {{")
        L.append(f"    const int64_t nb = rows - rb < {B} ? rows - rb : {B};")
        rowvals = [it for it in items if it.row and it.name not in uniform]
        for it in rowvals:
            L.append(f"    {d.compute_type(it.dtype)} rv_{it.name}[{B}];")
        for x in arrays:
            if by[x.name].row:
                L.append("    for (int64_t k = 0; k < nb; ++k) "
                         f"rv_{x.name}[k] = {d.load(x.dtype, f'{x.name}[(rb + k) * {x.name}_sr]')};")
        n_pass = 1 + max([it.level for it in items if not it.row] +
                         [it.level - 1 for it in items if it.kind == "red"] + [0])
        done = {x.name for x in tape.inputs if by[x.name].row}

        def row_ops(p):
            ready = [it for it in items if it.row and it.kind == "op" and it.name not in done
                     and it.level <= p]
            body, made = [], set()
            for it in ready:
                if all(a in done or a in made for a in it.args):
                    made.add(it.name)
                    body.append(it)
            if not body:
                return []
            out = ["    for (int64_t k = 0; k < nb; ++k) {"]
            used = {a for it in body for a in it.args if a not in made and a not in uniform}
            out += [f"      const {d.compute_type(by[a].dtype)} tmp_{a} = rv_{a}[k];"
                    for a in sorted(used)]
            for it in body:
                out.append(f"      const {d.compute_type(it.dtype)} tmp_{it.name} = "
                           f"{self._expr(d, it, by)};")
                out.append(f"      rv_{it.name}[k] = tmp_{it.name};")
            out.append("    }")
            done.update(made)
            return out

        def idx(line, reds):
            for it in reds:
                line = re.sub(rf"\b(acc|nan|best|idx)_{it.name}\b", rf"\1_{it.name}[k]", line)
            return line

        for p in range(n_pass + 1):
            L += row_ops(p)
            if p == n_pass:
                break
            reds, stores, need, _, _ = self._plan(d, items, by, outs, n_pass, cache=False)[p]
            if not reds and not stores:
                continue
            L.append(f"    /* pass {p} */")
            for it in reds:
                decl = self._acc_decl(d, it, by, [])
                for line in decl:  # "ct acc_X = init;" -> an array of the block
                    m = re.match(r"\s*(.+?) (\w+) = (.+);$", line)
                    L.append(f"    {m.group(1)} {m.group(2)}[{B}];")
                    L.append(f"    for (int64_t k = 0; k < nb; ++k) {m.group(2)}[k] = {m.group(3)};")
            used = sorted({a for n in need for a in by[n].args if by[a].row and a not in uniform})
            for branch, unit_b in (("if (unit) {", True), ("} else {", False)):
                L.append(f"    {branch}")
                L.append("    for (int64_t c = 0; c < cols; ++c) {")
                L.append("      #pragma omp simd")
                L.append("      for (int64_t k = 0; k < nb; ++k) {")
                L += [f"        const {d.compute_type(by[a].dtype)} tmp_{a} = rv_{a}[k];" for a in used]
                for it in items:
                    if it.name not in need:
                        continue
                    ct = d.compute_type(it.dtype)
                    if it.kind == "in":
                        at = (f"rb + k + c * {it.name}_sc" if unit_b
                              else f"(rb + k) * {it.name}_sr + c * {it.name}_sc")
                        L.append(f"        const {ct} tmp_{it.name} = "
                                 f"{d.load(it.dtype, f'{it.name}[{at}]')};")
                    else:
                        L.append(f"        const {ct} tmp_{it.name} = {self._expr(d, it, by)};")
                for it in reds:
                    L += [idx(line, reds) for line in self._acc_step(d, it, by)]
                for o, n, dt in stores:
                    at = "rb + k + c * o_sc" if unit_b else "(rb + k) * o_sr + c * o_sc"
                    L.append(f"        {o}[{at}] = {d.store(dt, f'tmp_{n}')};")
                L.append("      }")
                L.append("    }")
            L.append("    }")
            for it in reds:
                for line in self._acc_final(d, it, by):
                    m = re.match(r"\s*const (.+?) tmp_(\w+) = (.+);$", line)
                    L.append(f"    for (int64_t k = 0; k < nb; ++k) rv_{m.group(2)}[k] = "
                             f"{idx(m.group(3), reds)};")
            done.update(it.name for it in reds)
        for o, n, dt in outs:
            if by[n].row:
                src = f"rv_{n}[k]" if n not in uniform else f"tmp_{n}"
                L.append(f"    for (int64_t k = 0; k < nb; ++k) {o}[rb + k] = {d.store(dt, src)};")
        L.append("  }")
        L[loop_at:] = parallel_loop(L[loop_at:], f"(rows + {B - 1}) / {B}", f"rows * cols >= {self.omp_min_size}",
                               "  ", "rb")
        return L

    def _expr(self, d, it: Item, by: dict) -> str:
        if it.expr is not None:
            return it.expr
        args = [f"tmp_{a}" for a in it.args]
        in_dt = by[it.args[0]].dtype if it.args else it.dtype
        return d.round_to(it.dtype, d.op_expr(it.prim, args, it.dtype, in_dt))

    def _row_ops(self, d, items, done: set, p: int) -> list:
        """Row-valued ops ready before pass ``p`` (all their inputs done)."""
        L = []
        by = {it.name: it for it in items}
        for it in items:
            if it.row and it.kind == "op" and it.name not in done and it.level <= p and all(
                    a in done for a in it.args):
                L.append(f"    const {d.compute_type(it.dtype)} tmp_{it.name} = "
                         f"{self._expr(d, it, by)};")
                done.add(it.name)
        return L

    def _plan(self, d, items, by, outs, n_pass, cache: bool = True) -> list:
        """Per pass: (its reductions, its full-output stores, the full values it computes,
        the values it keeps in the row workspace, the values it reads back from there). A
        value that calls a math function and is needed by a later pass again (softmax's
        ``exp``) is kept, not recomputed."""
        def closure(roots, cut=()) -> list:
            need: set = set()
            loads: set = set()

            def want(name: str) -> None:
                it = by[name]
                if it.row or name in need or name in loads:
                    return
                if name in cut:
                    loads.add(name)
                    return
                need.add(name)
                for a in it.args:
                    want(a)

            for n in roots:
                want(n)
            return [it.name for it in items if it.name in need], loads

        roots = []
        for p in range(n_pass):
            reds = [it for it in items if it.kind == "red" and it.level - 1 == p]
            stores = [(o, n, dt) for o, n, dt in outs if not by[n].row and by[n].level == p]
            roots.append((reds, stores, [it.args[0] for it in reds] + [n for _, n, _ in stores]))
        passes_of: dict = {}
        for p, (_, _, r) in enumerate(roots):
            for n in closure(r)[0]:
                passes_of.setdefault(n, []).append(p)
        costly = {n for n, ps in passes_of.items() if cache and len(ps) > 1 and by[n].kind == "op"
                  and (by[n].prim in d.math_functions
                       or (by[n].expr is not None and "exp" in by[n].expr))}
        plans = []
        for p, (reds, stores, r) in enumerate(roots):
            cut = {n for n in costly if passes_of[n][0] < p}
            need, loads = closure(r, cut)
            keep = [n for n in need if n in costly and passes_of[n][0] == p]
            plans.append((reds, stores, need, keep, sorted(loads)))
        return plans

    def _pass(self, d, items, by, p: int, plan) -> list:
        reds, stores, need, keep, loads = plan
        if not reds and not stores:
            return []
        L = [f"    /* pass {p} */"]
        clauses = []
        arg = any(it.fold == "arg" for it in reds)
        for it in reds:
            L += self._acc_decl(d, it, by, clauses)
        variants = ((True, "if (scr) {"), (False, "} else {")) if keep or loads else ((False, ""),)
        for scratch, head in variants:
            if head:
                L.append(f"    {head}")
            for branch, unit in (("if (unit) {", True), ("} else {", False)):
                L.append(f"    {branch}")
                if not arg:
                    L.append("      #pragma omp simd" + "".join(f" reduction({c})" for c in clauses))
                L.append("      for (int64_t c = 0; c < cols; ++c) {")
                mine = set(need) | (set() if scratch else self._recompute(by, loads))
                for it in items:
                    ct = d.compute_type(it.dtype)
                    if scratch and it.name in loads:
                        L.append(f"        const {ct} tmp_{it.name} = scr_{it.name}[c];")
                        continue
                    if it.name not in mine:
                        continue
                    if it.kind == "in":
                        ref = f"{it.name}_p[c]" if unit else f"{it.name}_p[c * {it.name}_sc]"
                        L.append(f"        const {ct} tmp_{it.name} = {d.load(it.dtype, ref)};")
                    else:
                        L.append(f"        const {ct} tmp_{it.name} = {self._expr(d, it, by)};")
                    if scratch and it.name in keep:
                        L.append(f"        scr_{it.name}[c] = tmp_{it.name};")
                for it in reds:
                    L += self._acc_step(d, it, by)
                for o, n, dt in stores:
                    ref = f"{o}_p[c]" if unit else f"{o}_p[c * o_sc]"
                    L.append(f"        {ref} = {d.store(dt, f'tmp_{n}')};")
                L.append("      }")
            L.append("    }")
        if len(variants) > 1:
            L.append("    }")
        for it in reds:
            L += self._acc_final(d, it, by)
        return L

    @staticmethod
    def _recompute(by, loads) -> set:
        """The full values behind ``loads`` when the workspace is missing (recomputed)."""
        out: set = set()

        def want(n):
            it = by[n]
            if it.row or n in out:
                return
            out.add(n)
            for a in it.args:
                want(a)

        for n in loads:
            want(n)
        return out

    def _acc_decl(self, d, it: Item, by: dict, clauses: list) -> list:
        src_dt = by[it.args[0]].dtype
        n = it.name
        if it.fold == "arg":
            ct = d.compute_type(src_dt)
            return [f"    {ct} best_{n} = 0;", f"    int64_t idx_{n} = 0;"]
        ct = d.compute_type(it.dtype)
        if it.fold in ("sum", "prod"):
            if np.dtype(it.dtype).kind == "c":
                raise Unsupported("complex reductions")
            clauses.append(("+" if it.fold == "sum" else "*") + f":acc_{n}")
            return [f"    {ct} acc_{n} = ({ct}){0 if it.fold == 'sum' else 1};"]
        # max / min
        dt = np.dtype(it.dtype)
        big = it.fold == "min"
        if _is_float(dt):
            init = d.infinity if big else f"(-{d.infinity})"
            clauses += [f"{'min' if big else 'max'}:acc_{n}", f"|:nan_{n}"]
            return [f"    {ct} acc_{n} = {init};", f"    int nan_{n} = 0;"]
        if dt.kind not in "iu":
            raise Unsupported(f"{it.prim or it.fold} reduction on {dt}")
        lo, hi = _int_limits(dt)
        clauses.append(f"{'min' if big else 'max'}:acc_{n}")
        return [f"    {ct} acc_{n} = {hi if big else lo};"]

    def _acc_step(self, d, it: Item, by: dict) -> list:
        n, v = it.name, f"tmp_{it.args[0]}"
        ct = d.compute_type(it.dtype)
        if it.fold == "sum":
            return [f"        acc_{n} += ({ct}){v};"]
        if it.fold == "prod":
            return [f"        acc_{n} *= ({ct}){v};"]
        if it.fold == "arg":
            cmp = ">" if it.params.get("reduce_type") == "argmax" else "<"
            if _is_float(by[it.args[0]].dtype):
                cond = f"c == 0 || (best_{n} == best_{n} && ({v} {cmp} best_{n} || {v} != {v}))"
            else:
                cond = f"c == 0 || {v} {cmp} best_{n}"
            return [f"        if ({cond}) {{ best_{n} = {v}; idx_{n} = c; }}"]
        cmp = "<" if it.fold == "min" else ">"
        lines = [f"        acc_{n} = ({ct}){v} {cmp} acc_{n} ? ({ct}){v} : acc_{n};"]
        if _is_float(np.dtype(it.dtype)):
            lines.append(f"        nan_{n} |= {v} != {v};")
        return lines

    def _acc_final(self, d, it: Item, by: dict) -> list:
        n = it.name
        ct = d.compute_type(it.dtype)
        if it.fold == "arg":
            val = f"({ct})idx_{n}"
        elif it.fold in ("max", "min") and _is_float(np.dtype(it.dtype)):
            val = f"(nan_{n} ? ({ct}){d.nan} : acc_{n})"
        else:
            val = f"acc_{n}"
        return [f"    const {ct} tmp_{n} = {d.round_to(it.dtype, val)};"]


# A per-thread workspace that grows to the largest row it was asked for (kept between calls,
# as a BLAS keeps its buffers); NULL when malloc fails, and the kernel then recomputes.
_SCRATCH = r"""#include <stdlib.h>
static __thread char* ts_scr;
static __thread size_t ts_scr_n;
static inline size_t ts_pad64(size_t n) { return (n + 63) & ~(size_t)63; }
static inline char* ts_scratch(size_t n) {
  if (n > ts_scr_n) {
    free(ts_scr);
    ts_scr = (char*)aligned_alloc(64, ts_pad64(n));
    ts_scr_n = ts_scr ? n : 0;
  }
  return ts_scr;
}
"""

SCHEDULE = ReductionSchedule()


def render(tape: Tape, kernel_name: str, dialect=None) -> str:
    """The C source of a reduction tape's kernel (``dialect``: a CFamily, the C one by default)."""
    from .render import CDialect

    return SCHEDULE.render(dialect or CDialect(), tape, kernel_name)


# -- the numpy executor -----------------------------------------------------------------

def interpret(tape: Tape, inputs: Sequence, shape: Sequence[int], xp=np) -> list:
    """The outputs of a reduction tape computed with the primitives' rules on arrays of their
    real shapes (Broadcast broadcasts, reductions keep their axes); ``shape``: the full shape."""
    red = tape.reduction
    shape = tuple(int(s) for s in shape)
    env = bind_inputs(tape, inputs, xp)
    with np.errstate(all="ignore"):
        for op in tape.ops:
            args = [env[n] for n in op.inputs]
            defn = REGISTRY[op.primitive]
            params = dict(op.params)
            if defn.family == BROADCAST:
                val = xp.broadcast_to(args[0], tuple(params["shape"]))
            else:
                if defn.elementwise:  # bfloat16 math runs in float32
                    args = [a.astype(np.float32) if a.dtype == _BF16 else a for a in args]
                val = defn.rule(xp, *args, **params)
            val = xp.asarray(val)
            if val.dtype != op.dtype:
                val = val.astype(op.dtype)
            env[op.name] = val
    return [xp.ascontiguousarray(xp.broadcast_to(env[n], red.shape_of(n, shape)))
            for n in tape.outputs]
