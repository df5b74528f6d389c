"""Lowering the loop IR (``loop_ir``) to source, one renderer for C, CUDA and MSL.

The structure is written here once: parameters, declarations, loops, loads and stores in
each buffer's type, accumulator folds, cross-thread merges, barriers. What differs between
dialects is read from their tables (``render.CFamily`` and its subclasses): types, loads /
stores / literals / math names, and the parallel ones, ``ir_param`` (how a parameter is
declared), ``ir_threads`` (the group / thread / lane ids), ``ir_shared`` (group memory),
``ir_barrier``, ``ir_shuffle`` (a lane exchange) and ``ir_simd`` (one-call group reductions,
Metal's ``simd_sum``). A dialect without threads (``ir_threads`` None: C) runs ``blocks``
ranges on OpenMP threads and folds a ``Reduce`` into ``lanes`` accumulators under ``omp
simd`` (the independent accumulators a vector unit needs; MLX's CPU ``simd::Simd``).
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Optional

import numpy as np

from .c_ops import Unsupported
from .loop_ir import (INDEX, Assign, Barrier, Cast, First, Fmt, Fold, If, Kernel, Let, Lit,
                      Load, Local, Math, Merge, Range, Reduce, Round, Store, ThreadId, Vec,
                      state_vars)

WARP = 32  # lanes per warp / simdgroup (CUDA and Apple GPUs)

# An element's offset from its row-major index over a shape and strides (MLX's elem_to_loc)
LOC = """{fn}int64_t ts_loc(int64_t i, {cs} int64_t* shape, {cs} int64_t* strides, int64_t nd) {{
  int64_t loc = 0;
  for (int64_t d = nd - 1; d >= 0; --d) {{
    loc += (i % shape[d]) * strides[d];
    i /= shape[d];
  }}
  return loc;
}}
"""

# A wide kernel's attribute (``Kernel.wide``): gcc's -march=native on AVX-512 machines prefers
# 256-bit vectors; a register tile of one 512-bit vector per row runs ~2x faster in 512
WIDE = """#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define TS_WIDE __attribute__((target("prefer-vector-width=512")))
#elif defined(__AVX512F__) && defined(__clang__)
#define TS_WIDE __attribute__((min_vector_width(512)))
#else
#define TS_WIDE
#endif
"""


def parallel_loop(loop: list, n: str, cond: Optional[str], ind: str, tag: str,
                  simd: bool = False) -> list:
    """A C loop (``loop``: its lines, ``for`` to ``}``, at indent ``ind``) of ``n``
    iterations over OpenMP threads, one per core (``ts_cores``); where ``cond`` is false the
    loop runs with no parallel region at all (a one-thread region costs ~0.5 us a call in
    libgomp, and an ``if`` clause on ``parallel for simd`` turns the simd off too). The
    iterations go out ``guided``: a thread that starts late (a busy core) takes fewer, in
    chunks of an eighth of a thread's share at least (``static`` waited for it; dynamic
    chunks of that size measured 5-25% slower kernel alone at 1024 x 1000, the chunks'
    handout between the threads, and no faster at 4096 x 1000).

    Not the free cores (``ts_threads``, the elementwise kernels' count): a process that has
    just run its own threaded work (jax.jit's pool, spinning for up to ~1 ms after each
    call) reads as load, and the kernel then ran on one thread beside an idle core."""
    nt, ch = f"ts_nt{tag}", f"ts_ch{tag}"
    i2 = ind + "  "
    pick = f"({cond}) ? ts_cores() : 1" if cond else "ts_cores()"
    inner = [f"    {line}" for line in loop]
    return ([f"{ind}{{", f"{i2}const int {nt} = {pick};", f"{i2}if ({nt} == 1) {{"]
            + ([f"{i2}  #pragma omp simd"] if simd else []) + inner
            + [f"{i2}}} else {{",
               f"{i2}  const int64_t {ch} = ({n} + 8 * {nt} - 1) / (8 * {nt});",
               f"{i2}  #pragma omp parallel for{' simd' if simd else ''} schedule(guided, "
               f"{ch} > 0 ? {ch} : 1) num_threads({nt})"]
            + inner + [f"{i2}}}", f"{ind}}}"])


def _stores(stmts) -> list:
    """The ``Store`` statements of ``stmts``, nested ones included."""
    out = []
    for st in stmts:
        if isinstance(st, Store):
            out.append(st)
        for f in ("body", "then", "orelse"):
            out += _stores(getattr(st, f, None) or [])
    return out


class Lowering:
    """Renders one kernel in one dialect (a ``render.CFamily``)."""

    def __init__(self, d):
        self.d = d.loop_dialect() if hasattr(d, "loop_dialect") else d  # (the C one's halves)
        self.gpu = getattr(d, "ir_threads", None) is not None
        self.used: set = set()  # math functions called (the C preamble declares them)
        self.n_tmp = 0
        self.shared: list = []  # group-memory declarations, hoisted to the kernel's top
        self.uses_loc = False
        self.caches: dict = {}  # a Vec's register cache -> its "fits" flag (declared once)
        self.uses_wide = False
        self.uses_threads = False  # a CPU range over OpenMP threads (ts_threads) was rendered
        self.uses_stream = False  # a CPU range streamed its stores (``Range.stream``)
        self.staged: dict = {}  # buf -> (index its stores write, staging buffer, first index)
        # (variable, dtype) -> its narrowed spelling inside a CPU lane loop (reduce_lanes)
        self.narrow: dict = {}

    # -- types and expressions -----------------------------------------------------------
    def ctype(self, dt) -> str:
        if dt == INDEX:
            return "int64_t"
        return self.d.compute_type(np.dtype(dt))

    def expr(self, e) -> str:
        d = self.d
        if isinstance(e, str):
            return e
        if isinstance(e, (int, np.integer)):
            return str(int(e))
        if isinstance(e, Load):
            return d.load(e.dtype, f"{e.buf}[{self.expr(e.index)}]")
        if isinstance(e, Lit):
            if e.dtype == INDEX:
                return str(int(e.value))
            dt = np.dtype(e.dtype)
            if dt.kind == "b":
                return "true" if bool(e.value) else "false"
            return d.literal(SimpleNamespace(dtype=d.compute_dtype(dt), constant=e.value))
        if isinstance(e, Math):
            fn = d._fn_name(e.stem, np.dtype(e.dtype))
            if e.domain and d.compute_dtype(np.dtype(e.dtype)) == np.float32:
                fn = getattr(d, "own_math_domain", {}).get((e.stem, e.domain), fn)
            self.used.add(fn)
            return f"{fn}({', '.join(self.expr(a) for a in e.args)})"
        if isinstance(e, Cast):
            narrow = self.narrow.get((e.arg, np.dtype(e.dtype))) if isinstance(e.arg, str) else None
            return narrow or f"(({self.ctype(e.dtype)})({self.expr(e.arg)}))"
        if isinstance(e, Round):
            return self.d.round_to(np.dtype(e.dtype), self.expr(e.arg))
        if isinstance(e, Fmt):
            return e.text.format(*[self.expr(a) for a in e.args])
        if isinstance(e, ThreadId):
            if not self.gpu:
                raise Unsupported(f"{d.name} has no thread {e.which}")
            return f"((int64_t){d.ir_threads[e.which]})"
        raise TypeError(f"not an IR expression: {e!r}")

    # -- the kernel ----------------------------------------------------------------------
    def kernel(self, k: Kernel) -> str:
        d = self.d
        self.shared = []
        self.caches = {}
        body = self.block(k.body, "  ")
        self.uses_loc = self.uses_loc or any("ts_loc(" in line for line in body)
        body = [f"  {line}" for line in self.shared] + body
        for word in getattr(d, "lacks", ()):
            if re.search(rf"\b{word}\b", "\n".join(body)):
                raise Unsupported(f"{d.name} has no {word}")
        if self.gpu:
            params = [d.ir_param[p.kind].format(t=self.storage(p), n=p.name, k=i)
                      for i, p in enumerate(k.params)] + list(d.ir_thread_params)
            head = [f"{d.kernel_prefix.format(block=k.block)} {k.name}(",
                    ",\n".join(f"    {p}" for p in params) + ") {"]
            head += [f"  {line}" for line in d.ir_thread_setup]
        else:
            self.uses_wide = self.uses_wide or k.wide
            head = [f"{'TS_WIDE ' if k.wide else ''}{d.kernel_prefix} {k.name}(void** args) {{"]
            for i, p in enumerate(k.params):
                if p.kind == "in":
                    t = self.storage(p)
                    head.append(f"  const {t}* {p.name} = (const {t}*)args[{i}];")
                elif p.kind == "out":
                    t = self.storage(p)
                    head.append(f"  {t}* {p.name} = ({t}*)args[{i}];")
                elif p.kind == "int":
                    head.append(f"  const int64_t {p.name} = (int64_t)(intptr_t)args[{i}];")
                else:
                    head.append(f"  const int64_t* {p.name} = (const int64_t*)args[{i}];")
        return "\n".join(head + body + ["}"]) + "\n"

    def storage(self, p) -> str:
        return self.d.storage_type(np.dtype(p.dtype)) if p.dtype is not None else "int64_t"

    def preamble(self) -> str:
        """What the rendered kernels call (after ``kernel()``: the math it used)."""
        d = self.d
        own = "".join(d.own_source[f] for f in sorted(self.used) if f in d.own_source)
        loc = LOC.format(fn=d.function_prefix, cs=getattr(d, "ir_const_space", "const")) \
            if self.uses_loc else ""
        wide = WIDE if self.uses_wide else ""
        threads = getattr(d, "ir_cpu_threads", "") if self.uses_threads else ""
        stream = getattr(d, "ir_cpu_stream", "") if self.uses_stream else ""
        return (d.prelude + own + d.math_decls(self.used) + getattr(d, "ir_prelude", "") + loc
                + wide + threads + stream)

    # -- statements ----------------------------------------------------------------------
    def block(self, stmts, ind: str) -> list:
        out = []
        for s in stmts:
            out += self.stmt(s, ind)
        return out

    def stmt(self, s, ind: str) -> list:
        if isinstance(s, Let):
            const = "" if s.mutable else "const "
            return [f"{ind}{const}{self.ctype(s.dtype)} {s.name} = {self.expr(s.value)};"]
        if isinstance(s, Assign):
            return [f"{ind}{s.name} = {self.expr(s.value)};"]
        if isinstance(s, Store):
            dt = np.dtype(s.dtype)
            buf, index = s.buf, self.expr(s.index)
            if buf in self.staged:  # a streamed range's block: its stage, from the block's start
                want, buf, first = self.staged[s.buf]
                if index != want:
                    raise Unsupported(f"a streamed range stores {s.buf}[{index}], not [{want}]")
                index = first
            return [f"{ind}{buf}[{index}] = {self.d.store(dt, self.expr(s.value))};"]
        if isinstance(s, If):
            out = [f"{ind}if ({self.expr(s.cond)}) {{"] + self.block(s.then, ind + "  ")
            if s.orelse:
                out += [f"{ind}}} else {{"] + self.block(s.orelse, ind + "  ")
            return out + [f"{ind}}}"]
        if isinstance(s, Local):
            if s.shared and self.gpu:
                self.shared.append(self.d.ir_shared.format(t=self.ctype(s.dtype), n=s.name, size=s.size))
                return []
            return [f"{ind}{self.ctype(s.dtype)} {s.name}[{s.size}];"]
        if isinstance(s, Fold):
            return self.fold(s.acc, s.state, s.elem, ind)
        if isinstance(s, Merge):
            return self.merge_into(s.acc, s.state, s.other, ind)
        if isinstance(s, First):
            if not self.gpu:
                return self.block(s.body, ind)
            return ([f"{ind}if ({self.d.ir_threads['thread']} == 0) {{"]
                    + self.block(s.body, ind + "  ") + [f"{ind}}}"])
        if isinstance(s, Barrier):
            return [f"{ind}{self.d.ir_barrier}"] if self.gpu else []
        if isinstance(s, Range):
            return self.range(s, ind)
        if isinstance(s, Reduce):
            return self.reduce_gpu(s, ind) if self.gpu else self.reduce_lanes(s, ind)
        raise TypeError(f"not an IR statement: {s!r}")

    def fold(self, acc, state: dict, elem: dict, ind: str) -> list:
        if acc.step is not None:
            return self.assign_state(acc, state, acc.step(state, elem), ind)
        return self.merge_into(acc, state, acc.lift(elem), ind)

    def merge_into(self, acc, state: dict, other: dict, ind: str) -> list:
        """``state = merge(state, other)``, every field computed before any is assigned."""
        return self.assign_state(acc, state, acc.merge(state, other), ind)

    def assign_state(self, acc, state: dict, new: dict, ind: str) -> list:
        if len(acc.fields) == 1:
            (f, _), = acc.fields
            return [f"{ind}{state[f]} = {self.expr(new[f])};"]
        out, tmps = [], {}
        for f, dt in acc.fields:
            self.n_tmp += 1
            tmps[f] = f"t{self.n_tmp}_{f}"
            out.append(f"{ind}const {self.ctype(dt)} {tmps[f]} = {self.expr(new[f])};")
        return out + [f"{ind}{state[f]} = {tmps[f]};" for f, _ in acc.fields]

    def range(self, s: Range, ind: str) -> list:
        v, a, b = s.var, self.expr(s.start), self.expr(s.stop)
        body = self.block(s.body, ind + "  ")
        if self.gpu and s.vec is not None and s.kind == "threads" and a == "0" and self.vector_type(s.vec):
            return self.vector_loop(s.var, b, s.vec, lambda st: st, s.unroll, ind)
        if self.gpu:
            t = self.d.ir_threads
            first, step = {"blocks": (t["group"], t["groups"]),
                           "threads": (t["thread"], t["group_size"]),
                           "global": (f"{t['group']} * {t['group_size']} + {t['thread']}",
                                      f"{t['groups']} * {t['group_size']}"),
                           "serial": ("0", self.expr(s.step))}[s.kind]
            start = first if a == "0" else f"{a} + {first}"
            unroll = getattr(self.d, "ir_unroll", None)
            pragma = [f"{ind}{unroll.format(s.unroll)}"] if unroll and s.unroll > 1 else []
            return pragma + [f"{ind}for (int64_t {v} = {start}; {v} < {b}; {v} += {step}) {{"] + body + [
                f"{ind}}}"]
        step = self.expr(s.step)
        head = f"{ind}for (int64_t {v} = {a}; {v} < {b}; {'++' + v if step == '1' else f'{v} += {step}'}) {{"
        if s.kind in ("blocks", "global"):
            return self.parallel(s, head, body, ind)
        pragma = "#pragma omp simd" if s.kind == "threads" else None
        plain = ([f"{ind}{pragma}"] if pragma else []) + [head] + body + [f"{ind}}}"]
        if s.stream is not None and s.kind == "threads" and getattr(self.d, "ir_cpu_stream", ""):
            return self.streamed(s, plain, ind)
        return plain

    STREAM_BLOCK = 512  # elements a streamed range stages per block (the elementwise kernels')

    def streamed(self, s: Range, plain: list, ind: str) -> list:
        """A CPU ``threads`` range whose stores to ``buf[base + var]`` go around the caches
        (``Range.stream``): the elements up to ``buf``'s vector alignment as the plain loop,
        then blocks of ``STREAM_BLOCK`` computed into an aligned stack buffer and streamed
        out (``ts_stream``: the elementwise kernels' non-temporal stores), then the tail; the
        plain loop where ``cond`` is false or ``buf + base`` is not aligned to its element.
        Values are the plain loop's: only the store instructions differ."""
        buf, base, cond = s.stream
        dt = next((st.dtype for st in _stores(s.body) if st.buf == buf), None)
        if dt is None:
            raise Unsupported(f"a streamed range stores nothing to {buf}")
        self.uses_stream = True
        self.n_tmp += 1
        v, a, b, blk, k = s.var, self.expr(s.start), self.expr(s.stop), self.STREAM_BLOCK, self.n_tmp
        isz = np.dtype(dt).itemsize
        dst, h, nb, c0, st = f"({buf} + {self.expr(base)})", f"ts_h{k}", f"ts_nb{k}", f"ts_c{k}", f"ts_st{k}"

        def part(lo, hi, i):
            r = Range(v, Fmt(lo), Fmt(hi), s.body, "threads", vec=s.vec)
            return self.range(r, i)

        i2, i4 = ind + "  ", ind + "    "
        self.staged[buf] = (f"{self.expr(base)} + {v}", st, f"{v} - {c0}")
        try:
            block = part(c0, f"{c0} + {blk}", i4)
        finally:
            del self.staged[buf]
        return (["#if TS_STREAM",
                 f"{ind}if (({cond}) && {b} - {a} >= {2 * blk} && ((uintptr_t){dst} % {isz}) == 0) {{",
                 f"{i2}const int64_t {h} = (int64_t)(((TS_VW - (uintptr_t)({dst} + {a}) % TS_VW) % TS_VW) / {isz});",
                 f"{i2}const int64_t {nb} = ({b} - {a} - {h}) / {blk};"]
                + part(a, f"{a} + {h}", i2)
                + [f"{i2}for (int64_t ts_k{k} = 0; ts_k{k} < {nb}; ++ts_k{k}) {{",
                   f"{i4}const int64_t {c0} = {a} + {h} + ts_k{k} * {blk};",
                   f"{i4}{self.d.storage_type(np.dtype(dt))} {st}[{blk}] __attribute__((aligned(64)));"]
                + block
                + [f"{i4}ts_stream({dst} + {c0}, {st}, sizeof({st}));", f"{i2}}}"]
                + part(f"{a} + {h} + {nb} * {blk}", b, i2)
                + [f"{i2}ts_sfence();  /* this thread's streaming stores ordered */",
                   f"{ind}}} else", "#endif", f"{ind}{{"] + plain + [f"{ind}}}"])

    def parallel(self, s: Range, head: str, body: list, ind: str) -> list:
        """A ``blocks`` / ``global`` range on the CPU: ``parallel_loop``."""
        self.uses_threads = True
        self.n_tmp += 1
        a, b, step = self.expr(s.start), self.expr(s.stop), self.expr(s.step)
        n = b if a == "0" else f"({b} - {a})"
        if step != "1":
            n = f"({n} + {step} - 1) / {step}"
        return parallel_loop([head] + body + [f"{ind}}}"], n, s.parallel_if, ind, str(self.n_tmp),
                             simd=s.kind == "global")

    # -- Reduce on the CPU: lanes under omp simd -----------------------------------------
    def lanes(self, acc) -> int:
        """One 64-byte vector of the widest field (more lanes measured slower: the exp of
        softmax spilled with two AVX-512 vectors per lane block)."""
        widest = max(np.dtype(dt).itemsize if dt != INDEX else 8 for _, dt in acc.fields)
        return max(4, 64 // widest)

    def reduce_omp(self, s: Reduce, ind: str) -> list:
        """A monoid whose fields OpenMP can merge: ``omp simd reduction(op:field)``; with
        ``tiles``, one state per tile row, each row's body in its own block."""
        acc = s.acc
        tiles = s.tiles or (None,)
        states = [state_vars(s.acc_name if t is None else f"{s.acc_name}{j}", acc)
                  for j, t in enumerate(tiles)]
        out = [f"{ind}{self.ctype(dt)} {names[f]} = {self.expr(ident)};"
               for names in states for (f, dt), ident in zip(acc.fields, acc.identity)]
        clauses = " ".join(f"reduction({op}:{', '.join(names[f] for names in states)})"
                           for (f, _), op in zip(acc.fields, acc.omp))
        out += [f"{ind}#pragma omp simd {clauses}",
                f"{ind}for (int64_t {s.var} = {self.expr(s.start)}; {s.var} < {self.expr(s.stop)}; "
                f"++{s.var}) {{"]
        for t, names in zip(tiles, states):
            if t is None:
                out += self.block(s.body, ind + "  ")
                out += self.fold(acc, names, s.elem, ind + "  ")
                continue
            out += [f"{ind}  {{", f"{ind}    const int64_t {s.tile_var} = {self.expr(t)};"]
            out += self.block(s.body, ind + "    ")
            out += self.fold(acc, names, s.elem, ind + "    ")
            out.append(f"{ind}  }}")
        return out + [f"{ind}}}"]

    def reduce_lanes(self, s: Reduce, ind: str) -> list:
        if s.acc.omp:
            return self.reduce_omp(s, ind)
        acc, W = s.acc, self.lanes(s.acc)
        names = state_vars(s.acc_name, acc)
        lane = {f: f"{n}_l[l]" for f, n in names.items()}
        first = {f: f"{n}_l[0]" for f, n in names.items()}
        i2 = ind + "  "
        out = [f"{ind}{self.ctype(dt)} {names[f]};" for f, dt in acc.fields]
        out.append(f"{ind}{{")
        for (f, dt), ident in zip(acc.fields, acc.identity):
            out.append(f"{i2}{self.ctype(dt)} {names[f]}_l[{W}];")
            out.append(f"{i2}for (int l = 0; l < {W}; ++l) {names[f]}_l[l] = {self.expr(ident)};")
        vb = f"{s.var}_b"
        out.append(f"{i2}int64_t {vb} = {self.expr(s.start)};")
        stop = self.expr(s.stop)
        out.append(f"{i2}for (; {vb} + {W} <= {stop}; {vb} += {W}) {{")
        out.append(f"{i2}  #pragma omp simd")
        out.append(f"{i2}  for (int l = 0; l < {W}; ++l) {{")
        out.append(f"{i2}    const int64_t {s.var} = {vb} + l;")
        # the index as a 32-bit value (ArgReduce's): the block's base narrowed plus the lane,
        # one 32-bit vector add (narrowing the 64-bit index vector cost four shuffles)
        u32 = np.dtype(np.uint32)
        self.narrow = {(s.var, u32): f"((uint32_t){vb} + (uint32_t)l)"}
        out += self.block(s.body, i2 + "    ")
        out += self.fold(acc, lane, s.elem, i2 + "    ")
        self.narrow = {}
        out += [f"{i2}  }}", f"{i2}}}"]
        out.append(f"{i2}for (; {vb} < {stop}; ++{vb}) {{")
        out.append(f"{i2}  const int64_t {s.var} = {vb};")
        out += self.block(s.body, i2 + "  ")
        out += self.fold(acc, first, s.elem, i2 + "  ")
        out.append(f"{i2}}}")
        # the lanes merge as a tree, each level one vector step (a serial merge of 32
        # lanes cost more than a 128-element row's own work)
        upper = {f: f"{n}_l[l + h]" for f, n in names.items()}
        out.append(f"{i2}for (int h = {W // 2}; h > 0; h >>= 1) {{")
        out.append(f"{i2}  #pragma omp simd")
        out.append(f"{i2}  for (int l = 0; l < h; ++l) {{")
        out += self.merge_into(acc, lane, upper, i2 + "    ")
        out.append(f"{i2}  }}")
        out.append(f"{i2}}}")
        for f, _ in acc.fields:
            out.append(f"{i2}{names[f]} = {names[f]}_l[0];")
        out.append(f"{ind}}}")
        return out

    # -- Reduce on a GPU: strided threads, then lanes and groups merge -------------------
    def reduce_gpu(self, s: Reduce, ind: str) -> list:
        d, acc = self.d, s.acc
        t = d.ir_threads
        names = state_vars(s.acc_name, acc)
        out = [f"{ind}{self.ctype(dt)} {names[f]} = {self.expr(ident)};"
               for (f, dt), ident in zip(acc.fields, acc.identity)]
        if s.vec is not None and self.expr(s.start) == "0" and self.vector_type(s.vec):
            many = (lambda elems, at: self.chunk_fold(acc, names, elems, at)) if acc.chunk else None
            out += self.vector_loop(s.var, self.expr(s.stop), s.vec,
                                    lambda got: got[0] + [Fold(acc, names, got[1])], s.unroll, ind,
                                    many=(acc.elem_fields, many) if many else None)
        else:
            out += self.range(Range(s.var, s.start, s.stop, list(s.body) + [
                Fold(acc, names, s.elem)], "threads", unroll=s.unroll), ind)
        out += self.group_merge(acc, names, ind, t)
        return out

    def chunk_fold(self, acc, names: dict, elems: list, ind: str) -> list:
        """``acc.chunk``: one vector's lanes (``elems``, variables) folded into ``names``."""
        self.n_tmp += 1
        lets, new = acc.chunk(names, elems, f"k{self.n_tmp}_")
        return self.block(lets, ind) + self.assign_state(acc, names, new, ind)

    def vector_type(self, v: Vec) -> Optional[str]:
        """The dialect's 16-byte vector type of the elements (float4, 8 halves), None
        without one."""
        table = getattr(self.d, "ir_vector", None)
        return table["types"].get(np.dtype(v.dtype).name) if table else None

    def vec_lanes(self, dt) -> int:
        return 16 // np.dtype(dt).itemsize

    def lane(self, vt: str, var: str, j: int) -> str:
        """Lane ``j`` of vector ``var``: the dialect's spelling (``.x`` .. ``.w`` of float4)."""
        return self.d.ir_vector["lane"](vt, var, j)

    def vector_loop(self, var: str, stop: str, v: Vec, body, unroll: int, ind: str,
                    many=None) -> list:
        """The group's threads over ``buf[base + var]``, ``var`` in [0, stop): a scalar head
        up to the row's first 16-byte boundary, 16-byte vector loads (16 / itemsize
        elements each) over the aligned body, a scalar tail; ``body(v.make(value, index))``
        is one element's statements. With ``v.cache`` the row's vectors are kept in
        registers when they fit (``v.slots`` a thread, the row aligned); with ``v.store``
        each element's value is stored, a vector at once where the output is aligned.
        ``many``: ((field, dtype) of an element, ``fn(elems, indent) -> lines``): a vector's
        lanes are made into variables first and folded at once by ``fn`` (a monoid's
        ``chunk``); the scalar head and tail still take ``body`` per element."""
        t, vt, tab = self.d.ir_threads, self.vector_type(v), self.d.ir_vector
        n_l = self.vec_lanes(v.dtype)
        self.n_tmp += 1
        n = self.n_tmp
        p, h, nv, q, vv = f"vp{n}", f"vh{n}", f"vn{n}", f"vq{n}", f"vv{n}"
        ct = self.d.storage_type(np.dtype(v.dtype))
        i2 = ind + "  "
        base = self.expr(v.base)

        def stored(got, index) -> list:
            if v.store is None:
                return got
            buf, obase, odt, val = v.store
            return got + [Store(buf, Fmt(f"{self.expr(obase)} + {index}"), val, odt)]

        def make(value, index, aux=None):
            return v.make(value, index, aux) if v.aux else v.make(value, index)

        def elem(value, index, at) -> list:
            return [f"{at}{{"] + self.block(stored(body(make(value, index)), index), at + "  ") + [f"{at}}}"]

        def chunked(items: list, at: str) -> list:
            """A vector's lanes ((value, index, aux) each) as variables, then ``many``'s fold."""
            fields, fold = many
            out, elems = [], []
            for j, (value, index, aux) in enumerate(items):
                stmts, el = make(value, index, aux)
                vars_ = {f: f"ck{n}_{j}_{f}" for f, _ in fields}
                out += [f"{at}{self.ctype(dt)} {vars_[f]};" for f, dt in fields]
                out += [f"{at}{{"] + self.block(list(stmts) + [Assign(vars_[f], el[f]) for f, _ in fields],
                                               at + "  ") + [f"{at}}}"]
                elems.append(vars_)
            return out + fold(elems, at)

        def lanes(src: str, at: str, q_: str) -> list:
            """One vector's elements from vector ``src``, stored as one vector when ``ov``."""
            out = []
            vst = self._vstore(v, n_l)
            if vst:
                out.append(f"{at}{vst[0]} ov{n};")
            auxv = {}
            for buf, stride in v.aux:  # the weight's vector beside the row's
                a = f"{buf}_a{n}"
                auxv[buf] = a
                hb = "" if h == "0" else f" + {h}"
                out += [f"{at}{vt} {a};",
                        f"{at}if ({stride} == 1 && d_aligned({buf}{hb}, 16)) {{",
                        f"{at}  {a} = *reinterpret_cast<const {vt}*>({buf}{hb} + {n_l} * {q_});",
                        f"{at}}} else {{"]
                out += [f"{at}  {self.lane(vt, a, j)} = {buf}[({n_l} * {q_} + {j}{hb}) * {stride}];"
                        for j in range(n_l)]
                out.append(f"{at}}}")
            if many is not None and v.store is None:
                return out + chunked([(self.d.load(v.dtype, self.lane(vt, src, j)),
                                       f"({n_l} * {q_} + {j})" if h == "0" else f"({h} + {n_l} * {q_} + {j})",
                                       {b: self.d.load(v.dtype, self.lane(vt, a, j)) for b, a in auxv.items()}
                                       or None) for j in range(n_l)], at)
            for j in range(n_l):
                idx = f"({n_l} * {q_} + {j})" if h == "0" else f"({h} + {n_l} * {q_} + {j})"
                value = self.d.load(v.dtype, self.lane(vt, src, j))
                aux = {b: self.d.load(v.dtype, self.lane(vt, a, j)) for b, a in auxv.items()} or None
                if vst:
                    buf, obase, odt, val = v.store
                    got = make(value, idx, aux)
                    out += [f"{at}{{"] + self.block(got, at + "  ") + [
                        f"{at}  {self.lane(vst[0], f'ov{n}', j)} = {self.d.store(np.dtype(odt), val)};",
                        f"{at}}}"]
                else:
                    out += [f"{at}{{"] + self.block(stored(body(make(value, idx, aux)), idx), at + "  ") + [f"{at}}}"]
            if vst:
                hb = "" if h == "0" else f" + {h}"
                out.append(f"{at}*reinterpret_cast<{vst[0]}*>({vst[1]}{hb} + {n_l} * {q_}) = ov{n};")
            return out

        out = []
        cached = v.cache is not None and self.d.ir_vector.get("cache")
        if cached and v.cache not in self.caches:
            # the first loop over the row: each thread's vectors into registers, from the
            # row's first 16-byte boundary (``_h`` elements of scalar head before it; a
            # row of odd length or start is cached too, its head and tail read as scalars)
            ok, ch, cp = f"{v.cache}_ok", f"{v.cache}_h", f"{v.cache}_p"
            self.caches[v.cache] = ok
            out += [f"{ind}{vt} {v.cache}[{v.slots}];",
                    f"{ind}{tab['ptr'].format(t=ct, n=cp, buf=v.buf, base=base)}",
                    f"{ind}int64_t {ch} = {tab['head'].format(p=cp, size=np.dtype(v.dtype).itemsize)};",
                    f"{ind}if ({ch} > {stop}) {ch} = {stop};",
                    f"{ind}const bool {ok} = ({stop} - {ch}) / {n_l} <= {v.slots} * {t['group_size']};",
                    f"{ind}if ({ok}) {{",
                    f"{i2}{self.d.ir_unroll.format(v.slots)}",
                    f"{i2}for (int {v.cache}_s = 0; {v.cache}_s < {v.slots}; ++{v.cache}_s) {{",
                    f"{i2}  const int64_t {v.cache}_q = {t['thread']} + {v.cache}_s * {t['group_size']};",
                    f"{i2}  if ({v.cache}_q < ({stop} - {ch}) / {n_l}) {v.cache}[{v.cache}_s] = "
                    f"*reinterpret_cast<const {vt}*>({cp} + {ch} + {n_l} * {v.cache}_q);",
                    f"{i2}}}",
                    f"{ind}}}"]
        if cached:
            ok = self.caches[v.cache]
            vst = self._vstore(v, n_l)
            h_save, h = h, f"{v.cache}_h"
            # a vector store where the output row is aligned as the input's (its head as long)
            cond = ok + (f" && d_aligned({vst[1]} + {h}, 16)" if vst else "")
            out += [f"{ind}if ({cond}) {{",
                    f"{i2}const int64_t {nv} = ({stop} - {h}) / {n_l};",
                    f"{i2}for (int64_t {var} = {t['thread']}; {var} < {h}; {var} += {t['group_size']}) {{"]
            out += elem(Load(v.buf, Fmt(f"{base} + {var}"), v.dtype), var, i2 + "  ")
            out += [f"{i2}}}",
                    f"{i2}{self.d.ir_unroll.format(v.slots)}",
                    f"{i2}for (int vs{n} = 0; vs{n} < {v.slots}; ++vs{n}) {{",
                    f"{i2}  const int64_t {q} = {t['thread']} + vs{n} * {t['group_size']};",
                    f"{i2}  if ({q} < {nv}) {{"]
            out += lanes(f"{v.cache}[vs{n}]", i2 + "    ", q)
            out += [f"{i2}  }}", f"{i2}}}",
                    f"{i2}for (int64_t {var} = {h} + {n_l} * {nv} + {t['thread']}; {var} < {stop}; "
                    f"{var} += {t['group_size']}) {{"]
            out += elem(Load(v.buf, Fmt(f"{base} + {var}"), v.dtype), var, i2 + "  ")
            out += [f"{i2}}}", f"{ind}}} else {{"]
            h = h_save
        out += [f"{ind}{{",
                f"{i2}{tab['ptr'].format(t=ct, n=p, buf=v.buf, base=base)}",
                f"{i2}int64_t {h} = {tab['head'].format(p=p, size=np.dtype(v.dtype).itemsize)};",
                f"{i2}if ({h} > {stop}) {h} = {stop};",
                f"{i2}for (int64_t {var} = {t['thread']}; {var} < {h}; {var} += {t['group_size']}) {{"]
        out += elem(Load(v.buf, Fmt(f"{base} + {var}"), v.dtype), var, i2 + "  ")
        out += [f"{i2}}}", f"{i2}const int64_t {nv} = ({stop} - {h}) / {n_l};"]
        pragma = [f"{i2}{self.d.ir_unroll.format(unroll)}"] if unroll > 1 and not cached else []
        # (a cached row's fallback is kept small: its registers)
        vst = self._vstore(v, n_l)
        if vst:  # an output row aligned as the input's (its head as long): 16-byte stores
            out += [f"{i2}if (d_aligned({vst[1]} + {h}, 16)) {{"] + [f"  {x}" for x in pragma]
            out.append(f"{i2}  for (int64_t {q} = {t['thread']}; {q} < {nv}; {q} += {t['group_size']}) {{")
            out.append(f"{i2}    {tab['load'].format(vt=vt, n=vv, p=p, i=f'{h} + {n_l} * {q}')}")
            out += lanes(vv, i2 + "    ", q)
            out += [f"{i2}  }}", f"{i2}}} else {{"]
        out += pragma
        out.append(f"{i2}for (int64_t {q} = {t['thread']}; {q} < {nv}; {q} += {t['group_size']}) {{")
        out.append(f"{i2}  {tab['load'].format(vt=vt, n=vv, p=p, i=f'{h} + {n_l} * {q}')}")
        # otherwise element by element (the output's alignment differs from the row's)
        if many is not None and v.store is None:
            out += chunked([(self.d.load(v.dtype, self.lane(vt, vv, j)), f"({h} + {n_l} * {q} + {j})", None)
                            for j in range(n_l)], i2 + "  ")
        else:
            for j in range(n_l):
                out += elem(self.d.load(v.dtype, self.lane(vt, vv, j)), f"({h} + {n_l} * {q} + {j})", i2 + "  ")
        out.append(f"{i2}}}")
        if vst:
            out.append(f"{i2}}}")
        out += [f"{i2}for (int64_t {var} = {h} + {n_l} * {nv} + {t['thread']}; {var} < {stop}; "
                f"{var} += {t['group_size']}) {{"]
        out += elem(Load(v.buf, Fmt(f"{base} + {var}"), v.dtype), var, i2 + "  ")
        out += [f"{i2}}}", f"{ind}}}"]
        if cached:
            out.append(f"{ind}}}")
        return out

    def _vstore(self, v: Vec, n_l: int):
        """(vector type, row pointer) of a vector store of ``v.store``'s buffer, or None
        (no store, or another lane count)."""
        if v.store is None:
            return None
        buf, obase, odt, _ = v.store
        vt = getattr(self.d, "ir_vector", {}).get("types", {}).get(np.dtype(odt).name)
        if vt is None or self.vec_lanes(odt) != n_l:
            return None
        return vt, f"({buf} + ({self.expr(obase)}))"

    def group_merge(self, acc, names: dict, ind: str, t: dict) -> list:
        """Every thread of the group ends with the whole group's state: the lanes of each
        warp merge by butterfly exchanges (or the dialect's one-call simd reduction), lane 0
        of each warp leaves its state in group memory, and every warp merges those."""
        d = self.d
        simd = getattr(d, "ir_simd", {}).get(acc.simd) if acc.simd else None
        fdt = acc.fields[0][1]
        one = len(acc.fields) == 1 and simd and np.dtype(fdt) in d.ir_simd_types

        def warp(state: dict) -> list:
            if one:
                (f, _), = acc.fields
                return [f"{ind}{state[f]} = {simd.format(state[f])};"]
            self.n_tmp += 1
            o = f"o{self.n_tmp}"
            body = [f"{ind}for (int {o} = {WARP // 2}; {o} > 0; {o} >>= 1) {{"]
            other = {}
            for f, dt in acc.fields:
                other[f] = f"{state[f]}_x"
                body.append(f"{ind}  const {self.ctype(dt)} {other[f]} = "
                            f"{d.ir_shuffle.format(state[f], o)};")
            body += self.merge_into(acc, state, other, ind + "  ")
            return body + [f"{ind}}}"]

        out = warp(names)
        shared = {f: f"{names[f]}_g" for f in names}
        for f, dt in acc.fields:
            self.shared.append(d.ir_shared.format(t=self.ctype(dt), n=shared[f], size=WARP))
        # a group of one warp has its state now: the group-memory step only past one (the
        # condition is the same in every thread, so its barriers are met by all)
        i2 = ind + "  "
        out.append(f"{ind}if ({t['group_size']} > {WARP}) {{")
        out.append(f"{i2}if ({t['lane']} == 0) {{")
        out += [f"{i2}  {shared[f]}[{t['warp']}] = {names[f]};" for f in names]
        out.append(f"{i2}}}")
        out.append(f"{i2}{d.ir_barrier}")
        n_warps = f"(({t['group_size']} + {WARP - 1}) / {WARP})"
        for (f, dt), ident in zip(acc.fields, acc.identity):
            out.append(f"{i2}{names[f]} = {t['lane']} < {n_warps} ? {shared[f]}[{t['lane']}] : "
                       f"{self.expr(ident)};")
        out += [f"  {line}" for line in warp(names)]
        out.append(f"{i2}{d.ir_barrier}  // the group memory is free for the next merge")
        out.append(f"{ind}}}")
        return out


def render_kernel(k: Kernel, d) -> str:
    """The full source of kernel ``k`` in dialect ``d`` (preamble included)."""
    lw = Lowering(d)
    body = lw.kernel(k)
    return lw.preamble() + body


def render_module(kernels, d) -> str:
    """Several kernels in one source, the preamble once (a GPU runtime's module)."""
    lw = Lowering(d)
    bodies = [lw.kernel(k) for k in kernels]
    return lw.preamble() + "".join(bodies)

