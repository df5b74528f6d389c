"""Extended fusion's reduction tapes (``codegen/reduction.py``: a reduction and the
elementwise work around it) as loop-IR kernels for the GPU dialects: one kernel per tape.

The tape is lowered as on the CPU (``reduction.lower``: row / full values, softmax and
logsumexp expanded, each value's pass), then each pass becomes IR:

- reductions over the last axes (``mode="last"``): a group per row (``blocks``); each pass
  is one ``Reduce`` over the row whose accumulator is every reduction of the pass at once
  (a product of their monoids), its body the full values the pass needs and the full
  outputs it stores; the row values between passes are ``Let``s every thread computes;
- over the first axes (``"first"``): a thread per kept element (``global``), each pass a
  serial loop over the reduced elements.

Arguments follow the CPU kernel's: the non-constant inputs, the outputs, then the integers
``rows``, ``cols``, ``o_sr``, ``o_sc`` and ``<input>_sr`` / ``<input>_sc`` per array input
(element strides of each input seen as rows x cols).

A ``unit`` variant (over the last axes) is for calls whose input ``unit`` walks its rows
with unit stride: each pass reads it as MLX's row kernels do (``Vec``: 16-byte loads, a
scalar head and tail), and the passes share one register cache of the row where it fits,
so a softmax written out reads its row from memory once, as ``mx.softmax``'s kernel does.
"""

from __future__ import annotations

import numpy as np

from ..primitives import BROADCAST, REGISTRY
from .c_ops import Unsupported, _is_float
from dataclasses import replace

from .loop_ir import (INDEX, First, Fmt, Fold, Kernel, Let, Lit, Monoid, Param, Range, Reduce,
                      Store, Vec, row_threads, state_vars)
from .reduce_kernels import UNROLL, monoid, online_softmax
from .reduction import SCHEDULE, lower
from .tape import Tape



def product(parts: list) -> Monoid:
    """One accumulator holding several (prefix, Monoid): fields ``<prefix>_<field>``; an
    element gives each part its own value (``<prefix>`` -> value, ``i`` -> the index). Each
    part folds an element with its own ``step`` where it has one, and a vector's lanes with
    its own ``chunk`` (the others fold the lanes one after another), so online softmax's
    one-exp fold and its per-vector fold hold inside a product too."""
    fields, identity = [], []
    for pre, m in parts:
        fields += [(f"{pre}_{f}", dt) for f, dt in m.fields]
        identity += list(m.identity)

    def sub(st: dict, pre: str, m: Monoid) -> dict:
        return {f: st[f"{pre}_{f}"] for f, _ in m.fields}

    def ev(e: dict, pre: str) -> dict:
        return {"v": e[pre], "i": e.get("i")}

    def lift(e: dict) -> dict:
        out = {}
        for pre, m in parts:
            out.update({f"{pre}_{f}": v for f, v in m.lift(ev(e, pre)).items()})
        return out

    def merge(a: dict, b: dict) -> dict:
        out = {}
        for pre, m in parts:
            out.update({f"{pre}_{f}": v for f, v in m.merge(sub(a, pre, m), sub(b, pre, m)).items()})
        return out

    def fold1(m: Monoid, st: dict, e: dict) -> dict:
        return m.step(st, e) if m.step is not None else m.merge(st, m.lift(e))

    def step(st: dict, e: dict) -> dict:
        out = {}
        for pre, m in parts:
            out.update({f"{pre}_{f}": v for f, v in fold1(m, sub(st, pre, m), ev(e, pre)).items()})
        return out

    def chunk(st: dict, elems: list, t: str) -> tuple:
        lets, out = [], {}
        for pre, m in parts:
            cur = sub(st, pre, m)
            if m.chunk is not None:
                more, cur = m.chunk(cur, [ev(e, pre) for e in elems], f"{t}{pre}")
                lets += more
            else:  # the lanes in order, each state a named value
                for j, e in enumerate(elems):
                    new = fold1(m, cur, ev(e, pre))
                    cur = {}
                    for f, dt in m.fields:
                        lets.append(Let(f"{t}{pre}_{j}_{f}", dt, new[f]))
                        cur[f] = f"{t}{pre}_{j}_{f}"
            out.update({f"{pre}_{f}": v for f, v in cur.items()})
        return lets, out

    one = parts[0][1] if len(parts) == 1 else None
    chunked = any(m.chunk is not None for _, m in parts)
    elem_fields = tuple((pre, m.elem_fields[0][1] if m.elem_fields else m.fields[0][1])
                        for pre, m in parts)
    if any(m.name in ("argmax", "argmin") for _, m in parts):
        elem_fields += (("i", INDEX),)
    return Monoid("+".join(m.name for _, m in parts), tuple(fields), tuple(identity), lift, merge,
                  simd=one.simd if one else None,
                  step=step if any(m.step is not None for _, m in parts) else None,
                  chunk=chunk if chunked else None, elem_fields=elem_fields if chunked else ())


def _computes(it, c_text: str, n_args: int) -> bool:
    """Whether op item ``it`` computes ``c_text`` of its arguments ``a`` (and ``b``), as its
    definition spells it in C (``exp(a)``, ``(a - b)``)."""
    if it.kind != "op" or not it.prim or len(it.args) != n_args:
        return False
    sp = REGISTRY[it.prim].spellings.get("c")
    if isinstance(sp, str):
        return f"{sp}(a)" == c_text
    try:
        return callable(sp) and sp(None, ["a", "b"][:n_args], it.dtype, it.dtype) == c_text
    except Exception:  # a spelling that needs a dialect or refuses these types
        return False


def online_pairs(items: list, by: dict) -> dict:
    """Sums that fold with their max in one online pass: sum name -> max name, for every
    float32 ``sum(exp(v - m))`` whose ``m`` is the max of the same ``v`` over the row (a
    softmax or a logsumexp written out, and the two kernels' expansions, ``Item.online``):
    the pair becomes online softmax's (running max, rescaled sum), so the row is walked
    once for both, as ``mx.softmax``'s kernel does (MLX's CUDA softmax / logsumexp). No
    value in the chain is rounded (float32 throughout): the fold's sum is the tape's up to
    the order of its additions."""
    f32 = np.dtype(np.float32)

    def alias(n: str) -> str:
        it = by[n]
        while it.kind == "op" and it.prim and REGISTRY[it.prim].family == BROADCAST and \
                len(it.args) == 1 and it.dtype == by[it.args[0]].dtype:
            it = by[it.args[0]]
        return it.name

    out = {}
    for it in items:
        if it.kind != "red" or it.fold != "sum" or it.dtype != f32:
            continue
        if it.online:
            out[it.name] = it.online
            continue
        e = by[it.args[0]]
        if not _computes(e, "exp(a)", 1) or e.dtype != f32:
            continue
        dd = by[e.args[0]]
        if not _computes(dd, "(a - b)", 2) or dd.dtype != f32:
            continue
        m = by[alias(dd.args[1])]
        if m.kind == "red" and m.fold == "max" and m.dtype == f32 and m.args[0] == dd.args[0] \
                and by[m.args[0]].dtype == f32:
            out[it.name] = m.name
    return out


def _online_final(m: str, s: str) -> Fmt:
    """The tape's sum of exp(v - max) from the online state: NaN where the max is not
    finite (an exp of inf - inf, -inf - -inf or NaN is NaN), else the rescaled sum."""
    return Fmt(f"((isinf({m}) || {m} != {m}) ? {{0}} : {s})", (Lit(float("nan"), np.dtype(np.float32)),))


def _acc_monoid(it, by, d) -> Monoid:
    src_dt = d.compute_dtype(by[it.args[0]].dtype)
    if it.fold == "arg":
        return monoid(it.params.get("reduce_type", "argmax"), src_dt)
    if it.fold not in ("sum", "prod", "max", "min"):
        raise Unsupported(f"{it.prim or it.fold} in a fused reduction")
    if np.dtype(it.dtype).kind == "c":
        raise Unsupported("complex reductions")
    return monoid(it.fold, d.compute_dtype(it.dtype))


def _final(it, m: Monoid, st: dict, d) -> str:
    ct = d.compute_type(it.dtype)
    val = st["i"] if it.fold == "arg" else m.value(st)
    return Fmt(f"(({ct})({{0}}))", (val,)) if it.fold == "arg" else val


VEC_SLOTS = 4  # 16-byte vectors of the row a thread keeps in registers between passes


def unit_input(tape: Tape) -> "str | None":
    """The input a ``unit`` variant reads 16 bytes at a time: the first array input with
    full values (not a row value, a scalar or a constant) of a tape over the last axes."""
    red = tape.reduction
    if red.mode != "last":
        return None
    for x in tape.non_constant_inputs:
        if not x.scalar and x.name not in red.rows:
            return x.name
    return None


def fused_reduction_kernel(tape: Tape, name: str, d, unit: "str | None" = None) -> Kernel:
    """The GPU kernel of reduction tape ``tape`` in dialect ``d`` (its expressions are the
    dialect's spellings); ``unit``: the input (``unit_input``) whose ``_sc`` is 1 in every
    call of this variant, read by vectors (a dialect without them reads it as before)."""
    red = tape.reduction
    items = lower(tape, d)
    by = {it.name: it for it in items}
    pairs = online_pairs(items, by) if red.mode == "last" else {}
    if pairs:  # each paired sum folds in its max's pass, over the max's own values
        items = [replace(it, level=by[pairs[it.name]].level, args=by[pairs[it.name]].args)
                 if it.name in pairs else it for it in items]
        by = {it.name: it for it in items}
    ins = tape.non_constant_inputs
    outs = d.outputs(tape)
    arrays = [x for x in ins if not x.scalar]
    params = [Param("in", x.name, x.dtype) for x in ins] + [Param("out", o, dt) for o, _, dt in outs]
    params += [Param("int", n) for n in ("rows", "cols", "o_sr", "o_sc")]
    for x in arrays:
        params += [Param("int", f"{x.name}_sr"), Param("int", f"{x.name}_sc")]
    n_pass = 1 + max([it.level for it in items if not it.row] +
                     [it.level - 1 for it in items if it.kind == "red"] + [0])
    plans = SCHEDULE._plan(d, items, by, outs, n_pass, cache=False)
    first = red.mode == "first"

    def load(x, full: bool):
        at = f"r * {x.name}_sr + c * {x.name}_sc" if full else f"r * {x.name}_sr"
        return Fmt(d.load(x.dtype, f"{x.name}[{at}]"))

    ux = next((x for x in tape.inputs if x.name == unit), None) if not first else None

    def vec(elems: list, elem) -> "Vec | None":
        """The pass's elements as ``Vec`` rows of ``unit`` (its load the vector's lane,
        ``c`` bound to the element's index), or None where the pass does not read it."""
        if ux is None or not any(isinstance(e, Let) and e.name == f"tmp_{ux.name}" for e in elems):
            return None
        rest = [e for e in elems if not (isinstance(e, Let) and e.name == f"tmp_{ux.name}")]
        uct = d.compute_dtype(ux.dtype)
        stores = [e for e in rest if isinstance(e, Store)]
        store = None
        if elem is None and len(stores) == 1:  # the row's output, 16 bytes at a time (o_sc is 1)
            st = stores[0]
            rest.remove(st)
            store = (st.buf, "r * o_sr", st.dtype, st.value)

        def make(value, index):
            stmts = ([] if index == "c" else [Let("c", INDEX, index)]) + [
                Let(f"tmp_{ux.name}", uct, value)] + rest
            return stmts if elem is None else (stmts, elem)

        return Vec(ux.name, f"r * {ux.name}_sr", ux.dtype, make, cache=f"{ux.name}_rc",
                   slots=VEC_SLOTS, store=store)

    body: list = []
    done: set = set()
    for x in tape.inputs:
        it = by[x.name]
        if not it.row:
            continue
        ct = d.compute_dtype(x.dtype)
        val = (Fmt(d.literal(x)) if x.is_constant else Fmt(d.load(x.dtype, f"{x.name}[0]"))
               if x.scalar else load(x, False))
        body.append(Let(f"tmp_{x.name}", ct, val))
        done.add(x.name)

    def row_ops(p):
        out = []
        for it in items:
            if it.row and it.kind == "op" and it.name not in done and it.level <= p and all(
                    a in done for a in it.args):
                out.append(Let(f"tmp_{it.name}", d.compute_dtype(it.dtype), SCHEDULE._expr(d, it, by)))
                done.add(it.name)
        return out

    for p in range(n_pass + 1):
        body += row_ops(p)
        if p == n_pass:
            break
        reds, stores, need, _, _ = plans[p]
        if not reds and not stores:
            continue
        elems = []
        for it in items:
            if it.name not in need:
                continue
            ct = d.compute_dtype(it.dtype)
            if it.kind == "in":
                x = next(x for x in tape.inputs if x.name == it.name)
                elems.append(Let(f"tmp_{it.name}", ct, load(x, True)))
            else:
                elems.append(Let(f"tmp_{it.name}", ct, SCHEDULE._expr(d, it, by)))
        elems += [Store(o, "r * o_sr + c * o_sc", f"tmp_{n}", dt) for o, n, dt in stores]
        if not reds:
            body.append(Range("c", 0, "cols", elems, "serial" if first else "threads", unroll=UNROLL,
                              vec=vec(elems, None)))
            continue
        mine = {m: n for n, m in pairs.items() if any(it.name == n for it in reds)}
        folded = [it for it in reds if it.name not in pairs]  # a paired sum rides on its max
        parts = [(f"p{j}", online_softmax(np.dtype(np.float32)) if it.name in mine
                  else _acc_monoid(it, by, d)) for j, it in enumerate(folded)]
        acc = product(parts)
        elem = {pre: f"tmp_{it.args[0]}" for (pre, _), it in zip(parts, folded)}
        elem["i"] = "c"
        name_p = f"r{p}"
        st = state_vars(name_p, acc)
        if first:  # one thread's serial loop
            body += [Let(st[f], dt, ident, mutable=True) for (f, dt), ident in zip(acc.fields, acc.identity)]
            body.append(Range("c", 0, "cols", elems + [Fold(acc, st, elem)], unroll=UNROLL))
        else:
            body.append(Reduce("c", 0, "cols", elems, acc, name_p, elem, unroll=UNROLL,
                               vec=vec(elems, elem)))
        for (pre, m), it in zip(parts, folded):
            sub = {f: st[f"{pre}_{f}"] for f, _ in m.fields}
            if it.name in mine:  # online softmax's state: the max, then the paired sum
                body.append(Let(f"tmp_{it.name}", d.compute_dtype(it.dtype), sub["m"]))
                body.append(Let(f"tmp_{mine[it.name]}", d.compute_dtype(np.float32),
                                _online_final(f"tmp_{it.name}", sub["s"])))
                done.update((it.name, mine[it.name]))
                continue
            body.append(Let(f"tmp_{it.name}", d.compute_dtype(it.dtype),
                            Fmt(d.round_to(it.dtype, "{0}"), (_final(it, m, sub, d),))))
            done.add(it.name)
    row_stores = [Store(o, "r", f"tmp_{n}", dt) for o, n, dt in outs if by[n].row]
    body += row_stores if first else [First(row_stores)] if row_stores else []
    if first:
        return Kernel(name, params, [Range("r", 0, "rows", body, "global")],
                      groups=lambda v: -(-v["rows"] // 256))
    return Kernel(name, params, [Range("r", 0, "rows", body, "blocks")], block=1024,
                  groups=lambda v: min(v["rows"], 1 << 30), threads=lambda v: row_threads(v["cols"]))


def fused_reduction_source(tape: Tape, name: str, d, unit: "str | None" = None) -> str:
    from .lower import Lowering

    lw = Lowering(d)
    text = lw.kernel(fused_reduction_kernel(tape, name, d, unit))
    # the ops' helper functions and math (the C-family preamble of the tape's own ops)
    probe_helpers = d.preamble(tape)[len(d.prelude):] if hasattr(d, "preamble") else ""
    return lw.preamble() + probe_helpers + text
