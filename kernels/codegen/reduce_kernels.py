"""MLX's reduction primitives as loop-IR kernels: ``Reduce`` (sum, prod, max, min, and, or),
``ArgReduce``, ``Softmax``, ``LogSumExp`` and the ``Scan`` family, one builder each.

A ``KernelSpec`` names one kernel (MLX's names where MLX has them: ``row_reduce_sum_float32``,
``block_softmax_float32``, ``contig_scan_inclusive_sum_float32``) and builds its IR for a
CPU or a GPU schedule; ``source(dialect)`` renders it. The layouts follow MLX's dispatch
(``mlx/backend/common/reduce.h``'s plans, ``kernels/common/reductions.py`` picks one):

- ``row``: the reduced elements of an output are contiguous (``x[r * sr + c]``): each row is
  one group's ``Reduce`` (CPU: a row per OpenMP thread, lanes under ``omp simd``; GPU: a block
  per row, warp shuffles and shared memory);
- ``col``: the kept index is contiguous and the reduced one strided (``x[r + c * sc]``):
  the CPU walks blocks of ``COL_BLOCK`` kept elements, the reduced index outside and the
  block inside under ``omp simd``; a GPU gives each thread one kept element;
- ``strided``: both strides arbitrary (a row kernel with strided loads);
- ``all``: one output: parallel parts, then their merge (CPU: one kernel; a GPU: the part
  kernel, then the row kernel over the parts);
- ``general``: neither side collapses to one stride: each element's offset from its index
  over shapes and strides (MLX's ``elem_to_loc``).

Accumulation follows MLX: float16 / bfloat16 in float32, integers in the output type (MLX
sums small integers into int32, the output type the op gives), Max / Min propagate NaN,
ArgReduce takes the first extreme (NaN counts as one), And / Or test ``!= 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .c_ops import Unsupported, _is_float, _is_half
from .ir_spec import IRKernelSpec
from .loop_ir import (INDEX, Assign, Barrier, Cast, First, Fmt, Fold, If, Kernel, Let, Lit, Load,
                      Local, Math, Merge, Monoid, Param, Range, Reduce, Store, ThreadId, Vec,
                      row_threads, state_vars)

_BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
COL_BLOCK = 1024  # kept elements per block of the CPU's column kernel (its accumulators)
COL_REG = 64  # a column block this long keeps its accumulators in registers (4 x 512 bits)
SCAN_BLOCK = 256  # inner elements per block of the CPU's strided scan
PAR_MIN = 1 << 18  # elements below which a CPU kernel runs on one thread (a wake-up of the
# other threads costs more than the work below this on a shared machine)
PAR_MIN_EXP = 1 << 15  # the same for kernels that call exp per element
UNROLL = 4  # a GPU thread's loads in flight along a row (a GPU's unrolled loop)
ROW_TILE = 4  # rows a CPU row kernel folds in one loop (4096 x 4096 max: 3.9 -> 2.9 ms on
# 2 cores, its memory streams in flight; 1 and 2 rows left the memory idle)


def acc_dtype(dt) -> np.dtype:
    """The type an accumulator of values of ``dt`` holds: float32 for the half types."""
    dt = np.dtype(dt)
    return F32 if _is_half(dt) else dt


def _limit(dt: np.dtype, high: bool):
    if dt.kind == "b":
        return bool(high)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return int(info.max if high else info.min)
    return float("inf") if high else float("-inf")


def monoid(op: str, dt, nan_flag: bool = True, ordered: bool = False) -> Monoid:
    """The accumulator of reduction ``op`` over values of dtype ``dt`` (its state type).
    Float max / min keep a NaN flag beside the extreme (two fields OpenMP merges itself);
    ``nan_flag=False``: one field that propagates NaN (a scan's running value).
    ``ordered`` (ArgReduce): each state is folded its elements in increasing index order
    (the CPU's lanes and column blocks, a GPU thread's strided share), so one element
    replaces the state only when it is strictly better, and the index is 32-bit (MLX's
    uint32 result)."""
    dt = np.dtype(dt)
    if dt.kind == "c":
        raise Unsupported("complex reductions")
    flt = _is_float(dt)
    if op in ("sum", "prod"):
        sym, ident = ("+", 0) if op == "sum" else ("*", 1)
        return Monoid(op, (("s", dt),), (Lit(ident, dt),), lambda e: {"s": e["v"]},
                      lambda a, b: {"s": f"({a['s']} {sym} {b['s']})"},
                      simd="sum" if op == "sum" else None, omp=(sym,))
    if op in ("max", "min"):
        cmp = ">" if op == "max" else "<"
        pick = (lambda a, b: {"m": f"({b['m']} {cmp} {a['m']} ? {b['m']} : {a['m']})"})
        if not flt:
            return Monoid(op, (("m", dt),), (Lit(_limit(dt, op == "min"), dt),),
                          lambda e: {"m": e["v"]}, pick, omp=(op,))
        if not nan_flag:
            return Monoid(op, (("m", dt),), (Lit(_limit(dt, op == "min"), dt),),
                          lambda e: {"m": e["v"]},
                          lambda a, b: {"m": f"(({b['m']} {cmp} {a['m']} || {b['m']} != {b['m']}) ? "
                                             f"{b['m']} : {a['m']})"})
        # floats: the extreme of the numbers and a flag of NaN seen (the result is NaN then),
        # two fields OpenMP merges itself (max / min, |)
        i32 = np.dtype(np.int32)
        return Monoid(op, (("m", dt), ("n", i32)), (Lit(_limit(dt, op == "min"), dt), Lit(0, i32)),
                      lambda e: {"m": e["v"], "n": f"({e['v']} != {e['v']})"},
                      lambda a, b: {**pick(a, b), "n": f"({a['n']} | {b['n']})"}, omp=(op, "|"),
                      final=lambda st: Fmt(f"({st['n']} ? {{0}} : {st['m']})", (Lit(float("nan"), dt),)))
    if op in ("and", "or"):
        b_ = np.dtype(np.bool_)
        sym = "&&" if op == "and" else "||"
        return Monoid(op, (("b", b_),), (Lit(op == "and", b_),),
                      lambda e: {"b": f"({e['v']} != 0)"},
                      lambda a, b: {"b": f"({a['b']} {sym} {b['b']})"}, omp=(sym,))
    if op in ("argmax", "argmin"):
        cmp = ">" if op == "argmax" else "<"

        def merge(a, b):
            av, ai, bv, bi = a["v"], a["i"], b["v"], b["i"]
            better = f"({bv} {cmp} {av} || ({bv} == {av} && {bi} < {ai})"
            better += f" || ({bv} != {bv} && ({av} == {av} || {bi} < {ai})))" if flt else ")"
            return {"v": f"({better} ? {bv} : {av})", "i": f"({better} ? {bi} : {ai})"}

        if not ordered:
            return Monoid(op, (("v", dt), ("i", INDEX)),
                          (Lit(_limit(dt, op == "argmin"), dt), Lit(2**63 - 1, INDEX)),
                          lambda e: {"v": e["v"], "i": e["i"]}, merge)
        # in order, an element replaces the state when it is strictly better (a NaN when the
        # state is not NaN: the first NaN stays): ``!(v <= m)`` is v > m or v NaN, one
        # compare. An element equal to the identity (-inf for argmax) never replaces it, so
        # a state still at the identity keeps the index NONE, which loses every merge; a
        # row whose states all kept it holds only that value, and its first index is 0.
        u32 = np.dtype(np.uint32)
        none = 2**32 - 1
        keep = "<=" if op == "argmax" else ">="

        def step(st, e):
            v, m = e["v"], st["v"]
            better = f"(!({v} {keep} {m}) && {m} == {m})" if flt else f"({v} {cmp} {m})"
            return {"v": f"({better} ? {v} : {m})",
                    "i": Fmt(f"({better} ? {{0}} : {st['i']})", (Cast(u32, e["i"]),))}

        return Monoid(op, (("v", dt), ("i", u32)), (Lit(_limit(dt, op == "argmin"), dt), Lit(none, u32)),
                      lambda e: {"v": e["v"], "i": Cast(u32, e["i"])}, merge, step=step,
                      final=lambda st: f"({st['i']} == {none}u ? 0u : {st['i']})")
    raise Unsupported(f"no {op} reduction")


def _nmax(a: str, b: str) -> str:
    """The larger of two values, NaN if either is."""
    return f"(({b} > {a} || {b} != {b}) ? {b} : {a})"


def online_softmax(dt) -> Monoid:
    """(running max, sum of exp(x - max)): two states merge by rescaling each sum to the
    larger max (MLX's softmax kernels on CUDA and Metal). Every exp of a fold is of a value
    at most 0 (``Math.domain``: a dialect's faster exp there, CUDA's ``__expf`` as MLX's
    ``softmax_exp``); a vector's lanes fold at once (``chunk``: their max, one rescale of
    the sum, an exp per lane independent of the others, as MLX's kernels fold N_READS)."""
    def rescaled(s, m, mm):
        return Fmt(f"({m} == {mm} ? {s} : {s} * {{0}})", (Math("exp", dt, (f"{m} - {mm}",), "nonpositive"),))

    def merge(a, b):
        mm = f"(({b['m']} > {a['m']} || {b['m']} != {b['m']}) ? {b['m']} : {a['m']})"
        return {"m": mm, "s": Fmt("({0} + {1})", (rescaled(a["s"], a["m"], mm),
                                                  rescaled(b["s"], b["m"], mm)))}

    one = "1.0f" if dt == F32 else "1.0"

    def step(st, e):
        """One element into (m, s) with one exp: the smaller of v and m is rescaled to the
        larger (equal ones, -inf with -inf included, add 1 as the merge does)."""
        v, m, s = e["v"], st["m"], st["s"]
        big = f"({v} > {m})"
        ex = Fmt(f"({v} == {m} ? {one} : {{0}})",
                 (Math("exp", dt, (f"({big} ? {m} - {v} : {v} - {m})",), "nonpositive"),))
        return {"m": f"(({big} || {v} != {v}) ? {v} : {m})",
                "s": Fmt(f"({big} ? {s} * {{0}} + {one} : {s} + {{0}})", (ex,))}

    def chunk(st, elems, t):
        """The lanes' max (a tree of NaN-propagating maxima) and the state's, then the
        sum rescaled once plus each lane's exp (equal values, -inf with -inf included, add
        1 as ``step`` does; NaN anywhere gives NaN)."""
        lets, vals = [], [e["v"] for e in elems]
        while len(vals) > 1:
            nxt = []
            for j in range(0, len(vals) - 1, 2):
                lets.append(Let(f"{t}x{len(lets)}", dt, _nmax(vals[j], vals[j + 1])))
                nxt.append(lets[-1].name)
            vals = nxt + vals[len(vals) - len(vals) % 2:]
        m, s = st["m"], st["s"]
        lets.append(Let(f"{t}m", dt, _nmax(m, vals[0])))
        mm = f"{t}m"
        terms = [Fmt(f"({m} == {mm} ? {s} : {s} * {{0}})", (Math("exp", dt, (f"{m} - {mm}",), "nonpositive"),))]
        terms += [Fmt(f"({e['v']} == {mm} ? {one} : {{0}})",
                      (Math("exp", dt, (f"{e['v']} - {mm}",), "nonpositive"),)) for e in elems]
        while len(terms) > 1:  # a tree of sums: the lanes' exps in flight together
            terms = [Fmt("({0} + {1})", (terms[j], terms[j + 1])) for j in range(0, len(terms) - 1, 2)] + \
                terms[len(terms) - len(terms) % 2:]
        return lets, {"m": mm, "s": terms[0]}

    return Monoid("softmax", (("m", dt), ("s", dt)), (Lit(float("-inf"), dt), Lit(0, dt)),
                  lambda e: {"m": e["v"], "s": one}, merge, step=step, chunk=chunk,
                  elem_fields=(("v", dt),))


# -- Reduce ---------------------------------------------------------------------------------

def _load(in_dt, acc_dt, index) -> object:
    return _as(in_dt, acc_dt, Load("x", index, in_dt))


def _as(in_dt, acc_dt, v) -> object:
    """A value of ``in_dt`` in the accumulator's type."""
    return v if np.dtype(in_dt) == acc_dt or acc_dtype(in_dt) == acc_dt else Cast(acc_dt, v)


def _final(acc: Monoid, st: dict):
    return st["i"] if acc.name in ("argmax", "argmin") and acc.final is None else acc.value(st)


def _params(layout: str, in_dt, out_dt, extra=()) -> list:
    p = [Param("in", "x", in_dt), Param("out", "out", out_dt)]
    if layout == "general":
        return p + [Param("int", n) for n in ("rows", "cols", "knd", "rnd")] + [
            Param("ints", n) for n in ("kshape", "kstrides", "rshape", "rstrides")] + list(extra)
    if layout == "all":
        return p + [Param("out", "part", extra[0]), Param("int", "cols"), Param("int", "parts")]
    return p + [Param("int", n) for n in ("rows", "cols", "sr", "sc")] + list(extra)


def _offsets(layout: str) -> tuple:
    """(row base, element offset) index expressions of each layout."""
    if layout == "general":
        return "ts_loc(r, kshape, kstrides, knd)", "ts_loc(c, rshape, rstrides, rnd)"
    if layout == "row":
        return "r * sr", "c"
    return "r * sr", "c * sc"


def reduce_kernel(name: str, op: str, in_dt, out_dt, layout: str, gpu: bool) -> Kernel:
    """Reduce (and ArgReduce: ``op`` argmax / argmin) of ``x`` into ``out`` in ``layout``."""
    in_dt, out_dt = np.dtype(in_dt), np.dtype(out_dt)
    arg = op in ("argmax", "argmin")
    adt = acc_dtype(in_dt) if arg or op in ("max", "min", "and", "or") else acc_dtype(out_dt)
    if op in ("and", "or"):
        adt = acc_dtype(in_dt)  # the values tested; the state is bool
    # ArgReduce folds each thread's elements in increasing index order on every schedule (a
    # GPU thread's strided share too): a 32-bit index replaced only by a strictly better
    # element, the index-ordered merge between threads (MLX's arg_reduce: reduce_many
    # within a thread, the pair's merge across the block)
    acc = monoid(op, adt, ordered=arg)
    if layout == "col" and not gpu:
        return _col_cpu(name, op, acc, in_dt, out_dt, adt)
    if layout == "col":
        return _col_gpu(name, op, acc, in_dt, out_dt, adt)
    if layout == "all":
        return _all(name, op, acc, in_dt, out_dt, adt, gpu)
    base, off = _offsets(layout)
    vec = Vec("x", base, in_dt, lambda v, i: ([Let("v", adt, _as(in_dt, adt, v))], {"v": "v", "i": i})) \
        if layout == "row" else None
    load = [Let("v", adt, _load(in_dt, adt, f"{base} + {off}"))]
    row = [Reduce("c", 0, "cols", load, acc, "a", {"v": "v", "i": "c"}, unroll=UNROLL, vec=vec),
           First([Store("out", "r", _final(acc, state_vars("a", acc)), out_dt)])]
    if gpu or not acc.omp:  # a GPU's group per row; ArgReduce's lanes (no OpenMP merge)
        return Kernel(name, _params(layout, in_dt, out_dt),
                      [Range("r", 0, "rows", row, "blocks", f"rows > 1 && rows * cols >= {PAR_MIN}")],
                      block=1024, groups=lambda v: min(v["rows"], 1 << 30),
                      threads=lambda v: row_threads(v["cols"]), wide=True)
    if layout == "general" and acc.final is None:
        return _general_cpu(name, acc, in_dt, out_dt, adt)
    # the CPU: ROW_TILE rows folded in one loop (that many streams in flight) where there
    # are two tiles at least, the rows past the last whole tile one at a time (fewer rows:
    # each its own, a thread per row as before)
    T = ROW_TILE
    if acc.final is not None and _is_half(in_dt):  # float16 / bfloat16 max / min: on the bits
        tiled = _half_extreme_tile(op, in_dt, layout)
    elif acc.final is not None:  # float max / min: a NaN witness per pair of the tile's rows
        tiled = _extreme_tile(op, acc, in_dt, out_dt, adt, layout, load)
    else:
        tiled = [Reduce("c", 0, "cols", load, acc, "a", {"v": "v", "i": "c"},
                        tiles=tuple(f"rt * {T} + {j}" for j in range(T)), tile_var="r")]
        tiled += [Store("out", f"rt * {T} + {j}", _final(acc, state_vars(f"a{j}", acc)), out_dt)
                  for j in range(T)]
        if op == "sum" and in_dt == _BF16 and layout == "row":
            tiled = [If("(sr % 2) == 0 && ((uintptr_t)x % 4) == 0", _bf16_pair_sum_tile(out_dt), tiled)]
    return Kernel(name, _params(layout, in_dt, out_dt),
                  [Let("nt", INDEX, f"rows >= {2 * T} ? rows / {T} : 0"),
                   Range("rt", 0, "nt", tiled, "blocks", f"rows * cols >= {PAR_MIN}"),
                   Range("r", f"nt * {T}", "rows", row, "blocks",
                         f"nt == 0 && rows > 1 && rows * cols >= {PAR_MIN}")], wide=True)


def _general_cpu(name, acc, in_dt, out_dt, adt) -> Kernel:
    """The CPU's general layout as MLX's ``GeneralContiguousReduce`` (``backend/cpu/
    reduce.cpp``): each output folds the runs of its last reduced axis (``n`` elements of
    stride ``s``) one after another, a run's base offset from its index over the other
    reduced axes, its elements under ``omp simd`` (vector lanes, unit stride its own loop).
    An offset per element from its whole index (``ts_loc`` per load) kept gcc from
    vectorising the loop: one sequential sum, three times float32's error of a lane-wise
    one over 1024 elements (MLX's ``test_block_masked_matmul`` mask gradients missed its
    tolerance)."""
    st = {f: f"g_{f}" for f, _ in acc.fields}

    def run(a: str, index: str) -> list:
        return [Reduce("i", 0, "n", [Let(f"{a}v", adt, _load(in_dt, adt, index))], acc, a,
                       {"v": f"{a}v", "i": "i"}),
                Merge(acc, st, state_vars(a, acc))]

    runs = [Let("ob", INDEX, "rb + ts_loc(o, rshape, rstrides, rnd - 1)"),
            If("s == 1", run("p", "ob + i"), run("q", "ob + i * s"))]
    row = [Let("rb", INDEX, "ts_loc(r, kshape, kstrides, knd)")]
    row += [Let(st[f], dt, ident, mutable=True) for (f, dt), ident in zip(acc.fields, acc.identity)]
    row += [Range("o", 0, "cols / n", runs), Store("out", "r", _final(acc, st), out_dt)]
    body = [Let("n", INDEX, "rnd > 0 && rshape[rnd - 1] > 0 ? rshape[rnd - 1] : 1"),
            Let("s", INDEX, "rnd > 0 ? rstrides[rnd - 1] : 0"),
            Range("r", 0, "rows", row, "blocks", f"rows > 1 && rows * cols >= {PAR_MIN}")]
    return Kernel(name, _params("general", in_dt, out_dt), body, wide=True)


def _extreme_tile(op, acc, in_dt, out_dt, adt, layout, load) -> list:
    """ROW_TILE rows of a float max / min in one loop and a NaN witness for the tile. Each
    element is folded as ``m > v ? m : v`` (x86's ``maxps m, v``: a NaN element enters m,
    a NaN m leaves at the next element), so a NaN of the row lives in its new extreme for
    the one step that loaded it; each step multiplies the new extremes of a row pair into
    the pair's witness, ``w = fma(m0, m1, w)`` (``ts_fmadd``): one instruction per two rows' vectors, and
    a NaN in either stays in w (NaN times, plus anything is NaN). The witness can also turn
    NaN without a NaN element (inf x 0, +inf + -inf, an overflowed product: an extreme of
    +-inf or beyond 1e19 in both rows of a pair), and that is harmless: once a witness is
    NaN the extremes are not used, and the tile folds each of its rows again with the exact
    monoid (a row with NaN gives NaN, as MLX's max / min do; a row without, its extreme).
    Before (8911c8d..cpured) the flag was an int or-ed with unordered compares of the new
    extremes, which AVX-512 made two compares, a mask or, a masked move and an or per four
    vectors: 12 instructions a loop (sum's is 7) and, streamed from memory, the max 1.3x
    slower than the sum (BENCHMARKS.md, branch cpubars); with the witness 9."""
    import re

    T = ROW_TILE
    cmp = ">" if op == "max" else "<"
    base, off = _offsets(layout)
    rows = [f"rt * {T} + {j}" for j in range(T)]
    ms = [f"m{j}" for j in range(T)]
    ws = [f"w{k}" for k in range(T // 2)]

    def witness(m0, m1, w):  # (the C prelude's ts_fmadd: one FMA, or a multiply and an add)
        return Fmt("ts_fmadd({0}, {1}, {2})", (m0, m1, w))

    def lift(e):
        return {**{m: e[f"v{j}"] for j, m in enumerate(ms)},
                **{w: Fmt("({0} * {1})", (e[f"v{2 * k}"], e[f"v{2 * k + 1}"])) for k, w in enumerate(ws)}}

    def merge(a, b):
        return {**{m: f"({b[m]} {cmp} {a[m]} ? {b[m]} : {a[m]})" for m in ms},
                **{w: f"({a[w]} + {b[w]})" for w in ws}}

    def step(st, e):
        new = {m: f"({st[m]} {cmp} {e[f'v{j}']} ? {st[m]} : {e[f'v{j}']})" for j, m in enumerate(ms)}
        return {**new, **{w: witness(new[ms[2 * k]], new[ms[2 * k + 1]], st[w]) for k, w in enumerate(ws)}}

    tile = Monoid(f"{op}{T}", tuple((m, adt) for m in ms) + tuple((w, adt) for w in ws),
                  tuple(acc.identity[0] for _ in ms) + tuple(Lit(0, adt) for _ in ws), lift, merge,
                  omp=tuple(op for _ in ms) + tuple("+" for _ in ws), step=step)
    body = [Let(f"b{j}", INDEX, re.sub(r"\br\b", f"({r})", base)) for j, r in enumerate(rows)]
    loads = [Let(f"v{j}", adt, _load(in_dt, adt, f"b{j} + {off}")) for j in range(T)]
    body.append(Reduce("c", 0, "cols", loads, tile, "a", {f"v{j}": f"v{j}" for j in range(T)}))
    again = []
    for j, r in enumerate(rows):
        exact = [Let("v", adt, _load(in_dt, adt, f"b{j} + {off}"))]
        again += [Reduce("c", 0, "cols", exact, acc, f"e{j}", {"v": "v", "i": "c"}),
                  Store("out", r, _final(acc, state_vars(f"e{j}", acc)), out_dt)]
    nan = " || ".join(f"a_{w} != a_{w}" for w in ws)
    body.append(If(nan, again, [Store("out", r, f"a_m{j}", out_dt) for j, r in enumerate(rows)]))
    return body


def _bf16_pair_sum_tile(out_dt) -> list:
    """ROW_TILE rows of a bfloat16 sum read as 32-bit words, two elements each: the word's
    two float32 values are its low half shifted up and its high half masked
    (``ts_bf16_pair``: a shift, an and and an add for two elements, where widening each
    element took a zero-extension, a shift and, for every other vector, an extract: 19
    instructions per 128 elements of four rows, 36 before). Where the rows start on a word
    (an even row stride, ``x`` 4-byte aligned); an odd length's last element after."""
    T = ROW_TILE
    u32 = np.dtype(np.uint32)
    fields = tuple(f"s{j}" for j in range(T))
    acc = Monoid("sum_pairs", tuple((f, F32) for f in fields), tuple(Lit(0, F32) for _ in fields),
                 lambda e: {f: e[f] for f in fields}, lambda a, b: {f: f"({a[f]} + {b[f]})" for f in fields},
                 omp=("+",) * T)
    body = [Let(f"b{j}", INDEX, f"(rt * {T} + {j}) * sr") for j in range(T)]
    loads = []
    for j in range(T):
        loads += [Let(f"w{j}", u32, f"((const ts_u32a*)(x + b{j}))[c]"), Let(f"p{j}", F32, f"ts_bf16_pair(w{j})")]
    body.append(Reduce("c", 0, "cols / 2", loads, acc, "a", {f: f"p{j}" for j, f in enumerate(fields)}))
    for j in range(T):
        last = Fmt(f"(cols % 2 ? a_s{j} + {{0}} : a_s{j})", (Load("x", f"b{j} + cols - 1", _BF16),))
        body.append(Store("out", f"rt * {T} + {j}", last, out_dt))
    return body


# the order key of a 16-bit float's bits (int16: the bits with the magnitude's bits flipped
# where the sign is set, so the keys' integer order is the values' order, -0 just below +0)
_KEY = "((int16_t)({0} ^ ((uint16_t)((int16_t){0} >> 15) & 0x7fffu)))"
_HALF_INF = {np.dtype(np.float16): (0x7C00, 0x7E00), _BF16: (0x7F80, 0x7FC0)}  # +inf, a NaN


def _half_extreme_tile(op, in_dt, layout) -> list:
    """ROW_TILE rows of a float16 / bfloat16 max / min folded on the bits, never converted:
    each element's order key (``_KEY``, three integer operations) into the row's largest
    and smallest keys (int16 max / min: 32 lanes of AVX-512, 16 of AVX2), where a float32
    fold converted every element first (float16's conversion from the bits is ~11 vector
    operations for 16 elements). A row holds a NaN exactly when its largest key is beyond
    +inf's (a NaN with the sign clear) or its smallest below -inf's (the sign set), so each
    row's result is exact with no second pass: NaN then, else its key's bits. (The loop
    IR's C kernels hold both 16-bit types as their bits: ``CLoopDialect``.)"""
    import re

    T = ROW_TILE
    u16, i16 = np.dtype(np.uint16), np.dtype(np.int16)
    inf, nan = _HALF_INF[np.dtype(in_dt)]
    pos = inf  # the keys of +inf and of -inf
    neg = int(np.array((0x8000 | inf) ^ 0x7FFF, np.uint16).view(np.int16))
    base, off = _offsets(layout)
    rows = [f"rt * {T} + {j}" for j in range(T)]
    hi, lo = [f"h{j}" for j in range(T)], [f"l{j}" for j in range(T)]

    def lift(e):
        return {**{h: e[f"k{j}"] for j, h in enumerate(hi)}, **{l: e[f"k{j}"] for j, l in enumerate(lo)}}

    def merge(a, b):
        return {**{h: f"({b[h]} > {a[h]} ? {b[h]} : {a[h]})" for h in hi},
                **{l: f"({b[l]} < {a[l]} ? {b[l]} : {a[l]})" for l in lo}}

    tile = Monoid(f"{op}{T}_bits", tuple((f, i16) for f in hi + lo),
                  tuple(Lit(-(1 << 15), i16) for _ in hi) + tuple(Lit((1 << 15) - 1, i16) for _ in lo),
                  lift, merge, omp=tuple("max" for _ in hi) + tuple("min" for _ in lo))
    body = [Let(f"b{j}", INDEX, re.sub(r"\br\b", f"({r})", base)) for j, r in enumerate(rows)]
    loads = []
    for j in range(T):
        loads += [Let(f"u{j}", u16, Load("x", f"b{j} + {off}", u16)), Let(f"k{j}", i16, _KEY.format(f"u{j}"))]
    body.append(Reduce("c", 0, "cols", loads, tile, "a", {f"k{j}": f"k{j}" for j in range(T)}))
    for j, r in enumerate(rows):
        k = f"a_h{j}" if op == "max" else f"a_l{j}"
        bits = f"((uint16_t)({k} ^ ((uint16_t)((int16_t){k} >> 15) & 0x7fffu)))"
        body.append(Store("out", r, f"((a_h{j} > {pos} || a_l{j} < {neg}) ? (uint16_t){nan}u : {bits})", u16))
    return body


def _col_cpu(name, op, acc, in_dt, out_dt, adt) -> Kernel:
    """Blocks of ``cb`` (<= ``COL_BLOCK``) kept elements, one per thread where the kept
    elements are few: each reduced index adds a contiguous run of the block. A block of
    exactly ``COL_REG`` kept elements (few kept: a short row) runs a loop of that constant
    length, its accumulators in registers for the whole reduced run."""
    B = COL_BLOCK
    st = {f: f"acc_{f}[k]" for f, _ in acc.fields}
    body = [Let("k0", INDEX, "kb * cb"), Let("nb", INDEX, "rows - k0 < cb ? rows - k0 : cb")]
    R = COL_REG
    rg = {f: f"reg_{f}[k]" for f, _ in acc.fields}
    reg = [Local(f"reg_{f}", dt, R) for f, dt in acc.fields]
    reg.append(Range("k", 0, R, [Assign(rg[f], ident) for (f, _), ident in
                                 zip(acc.fields, acc.identity)], "threads"))
    reg.append(Range("c", 0, "cols", [Range("k", 0, R, [
        Let("v", adt, _load(in_dt, adt, "k0 + k + c * sc")),
        Fold(acc, rg, {"v": "v", "i": "c"})], "threads")]))
    reg.append(Range("k", 0, R, [Store("out", "k0 + k", _final(acc, rg), out_dt)], "threads"))
    general = [Local(f"acc_{f}", dt, B) for f, dt in acc.fields]
    general.append(Range("k", 0, "nb", [Assign(st[f], ident) for (f, _), ident in
                                      zip(acc.fields, acc.identity)], "threads"))
    # ROW_TILE reduced indices per pass over the block, folded in order (that many runs in
    # flight, the accumulators loaded and stored once per pass), then the rest one by one
    T = ROW_TILE
    tile = []
    for j in range(T):
        tile += [Let(f"v{j}", adt, _load(in_dt, adt, f"k0 + k + (c + {j}) * sc")),  # col: sr == 1
                 Fold(acc, st, {"v": f"v{j}", "i": f"c + {j}"})]
    general.append(Range("c", 0, f"cols / {T} * {T}", [Range("k", 0, "nb", tile, "threads")], step=T))
    general.append(Range("c", f"cols / {T} * {T}", "cols", [Range("k", 0, "nb", [
        Let("v", adt, _load(in_dt, adt, "k0 + k + c * sc")),
        Fold(acc, st, {"v": "v", "i": "c"})], "threads")]))
    general.append(Range("k", 0, "nb", [Store("out", "k0 + k", _final(acc, st), out_dt)], "threads"))
    body.append(If(f"nb == {R}", reg, general))
    return Kernel(name, _params("col", in_dt, out_dt, (Param("int", "cb"),)),
                  [Range("kb", 0, "(rows + cb - 1) / cb", body, "blocks",
                         f"rows > cb && rows * cols >= {PAR_MIN}")], wide=True)


COL_LANES, COL_WARPS = 32, 8  # a GPU column group: 32 kept elements x 8 slices of the reduced run


def col_unroll(in_dt) -> int:
    """A GPU column lane's unrolled loads: UNROLL float32s, as many 16 bytes of a narrower
    dtype (8 bfloat16 / float16, 16 int8), so a 16-bit column reduction keeps as many bytes
    in flight per lane as a float32 one."""
    return max(UNROLL, 16 // max(1, np.dtype(in_dt).itemsize))


def _col_gpu(name, op, acc, in_dt, out_dt, adt) -> Kernel:
    """A group per 32 kept elements (a warp's lanes, coalesced loads) and per ``cb`` reduced
    elements (a split of the reduced run: ``ceil(cols / cb)`` of them side by side in the
    grid, their results at ``out[split * rows + k]`` for a second pass to merge, as MLX's
    column reductions split a long reduced run over the grid); its 8 warps each fold every
    8th element of the split, then warp 0 merges the 8 partial states from group memory."""
    L, W = COL_LANES, COL_WARPS
    st = state_vars("a", acc)
    sh = {f: f"sh_{f}" for f, _ in acc.fields}
    body = [Let("kb", INDEX, "g % nkb"), Let("sp", INDEX, "g / nkb"),
            Let("k", INDEX, Fmt(f"kb * {L} + {{0}}", (ThreadId("lane"),))),
            Let("w", INDEX, ThreadId("warp")),
            Let("c1", INDEX, "(sp + 1) * cb < cols ? (sp + 1) * cb : cols")]
    body += [Let(st[f], dt, ident, mutable=True) for (f, dt), ident in zip(acc.fields, acc.identity)]
    # a lane's loads in flight: 16 bytes of them whatever the dtype (4 float32, 8 bfloat16),
    # as MLX's col_reduce reads N_READS = 16 / sizeof(T) per thread (reduce/col_reduce.cu)
    body.append(If("k < rows", [Range("c", "sp * cb + w", "c1", [
        Let("v", adt, _load(in_dt, adt, "k + c * sc")), Fold(acc, st, {"v": "v", "i": "c"})],
        step=W, unroll=col_unroll(in_dt))]))
    body += [Local(sh[f], dt, L * W, shared=True) for f, dt in acc.fields]
    body += [Assign(f"{sh[f]}[w * {L} + (k - kb * {L})]", st[f]) for f, _ in acc.fields]
    body.append(Barrier())
    body.append(If("w == 0 && k < rows", [
        Range("j", 1, W, [Merge(acc, st, {f: f"{sh[f]}[j * {L} + (k - kb * {L})]" for f in sh})]),
        Store("out", "sp * rows + k", _final(acc, st), out_dt)]))
    body.append(Barrier())
    groups = f"nkb * ((cols + cb - 1) / cb)"
    return Kernel(name, _params("col", in_dt, out_dt, (Param("int", "cb"),)),
                  [Let("nkb", INDEX, f"(rows + {L - 1}) / {L}"), Range("g", 0, groups, body, "blocks")],
                  block=L * W,
                  groups=lambda v: min(-(-v["rows"] // L) * -(-v["cols"] // v["cb"]), 1 << 30))


def _all(name, op, acc, in_dt, out_dt, adt, gpu) -> Kernel:
    """Parts of one contiguous run reduced in parallel into ``part``; on the CPU the same
    kernel then merges the parts (a GPU launches the row kernel over them)."""
    st = state_vars("a", acc)
    part = [Let("c0", INDEX, "p * ((cols + parts - 1) / parts)"),
            Let("c1", INDEX, "c0 + (cols + parts - 1) / parts < cols ? "
                             "c0 + (cols + parts - 1) / parts : cols"),
            Reduce("c", "c0", "c1", [Let("v", adt, _load(in_dt, adt, "c"))], acc, "a", {"v": "v"}),
            First([Store("part", "p", acc.value(st), acc.fields[0][1])])]
    body = [Range("p", 0, "parts", part, "blocks", f"parts > 1 && cols >= {PAR_MIN}")]
    if not gpu:
        body.append(Reduce("q", 0, "parts", [Let("w", acc.fields[0][1],
                                                 Load("part", "q", acc.fields[0][1]))],
                           acc, "t", {"v": "w"}))
        body.append(Store("out", 0, acc.value(state_vars("t", acc)), out_dt))
    return Kernel(name, _params("all", in_dt, out_dt, (acc.fields[0][1],)), body,
                  block=1024, groups=lambda v: v["parts"],
                  threads=lambda v: row_threads(-(-v["cols"] // v["parts"])), wide=True)


# -- Softmax and LogSumExp ------------------------------------------------------------------

def _max_skipping_nan(dt) -> Monoid:
    """The largest number of the elements (NaN ones skipped: ``v > m ? v : m`` keeps m,
    x86's ``maxps v, m``); -inf when there is none."""
    return Monoid("max", (("m", dt),), (Lit(float("-inf"), dt),), lambda e: {"m": e["v"]},
                  lambda a, b: {"m": f"({b['m']} > {a['m']} ? {b['m']} : {a['m']})"},
                  omp=("max",))


def _row_softmax_cpu(in_dt, out_dt, log: bool, F32) -> list:
    """The CPU's rows: a max pass, an exp-sum pass (softmax: exp stored when the output is
    float32, recomputed otherwise), then the scaling pass; LogSumExp: max, then sum."""
    x = Load("x", "r * sr + c", in_dt)
    # softmax's max may skip NaN (a compare, an and and an or of each vector less): a NaN
    # of the row makes its exp, the sum and so every output NaN (the exp passes NaN), as
    # MLX's NaN max does; logsumexp's exp does not pass NaN, so its max must give it
    mx, sm = (monoid("max", F32) if log else _max_skipping_nan(F32)), monoid("sum", F32)
    body = [Reduce("c", 0, "cols", [Let("v", F32, Cast(F32, x))], mx, "m", {"v": "v"}),
            Let("mx", F32, mx.value(state_vars("m", mx)))]
    if log:
        body.append(Let("z", F32, Fmt("(isinf(mx) ? {0} : mx)", (Lit(0, F32),))))
        # a NaN in the row makes z NaN, and the result z + log(s) NaN whatever s is: the exp
        # need not pass NaN on (two instructions of ~30 a vector)
        body.append(Reduce("c", 0, "cols", [Let("e", F32, Math("exp", F32, (Fmt("{0} - z", (Cast(F32, x),)),),
                                                                "nonpositive_nan_unused"))],
                           sm, "s", {"v": "e"}))
        body.append(First([Store("out", "r", Fmt("(isinf(mx) ? mx : z + {0})",
                                                 (Math("log", F32, ("s_s",)),)), out_dt)]))
        return body
    keep = np.dtype(out_dt) == F32  # the exp is stored where the output holds it exactly
    e = [Let("e", F32, Math("exp", F32, (Fmt("{0} - mx", (Cast(F32, x),)),), "nonpositive"))]
    if keep:
        e.append(Store("out", "r * cols + c", "e", out_dt))
    body.append(Reduce("c", 0, "cols", e, sm, "s", {"v": "e"}))
    body.append(Let("inv", F32, Fmt("{0} / s_s", (Lit(1, F32),))))
    again = Load("out", "r * cols + c", out_dt) if keep else \
        Math("exp", F32, (Fmt("{0} - mx", (Cast(F32, x),)),), "nonpositive")
    body.append(Range("c", 0, "cols", [Store("out", "r * cols + c", Fmt("{0} * inv", (again,)), out_dt)],
                      "threads"))
    return body


def _row_softmax_gpu(in_dt, out_dt, log: bool, F32) -> list:
    """A GPU's rows: one online pass (running max and rescaled sum, merged across the block),
    then softmax's output pass. The row's 16-byte vectors stay in registers between the two
    where they fit (``Vec.cache``: x read from memory once, as extended fusion's softmax
    does) and the output is stored 16 bytes at a time where its row is aligned as x's."""
    x = Cast(F32, Load("x", "r * sr + c", in_dt))
    cache = None if log else "xr"
    body = [Reduce("c", 0, "cols", [Let("v", F32, x)], online_softmax(F32), "a", {"v": "v"},
                   unroll=UNROLL, vec=Vec("x", "r * sr", in_dt,
                                          lambda v, i: ([Let("v", F32, Cast(F32, v))], {"v": "v"}),
                                          cache=cache))]
    if log:
        body.append(First([Store("out", "r", Fmt("(isinf(a_m) ? a_m : a_m + {0})",
                                                 (Math("log", F32, ("a_s",)),)), out_dt)]))
        return body
    body.append(Let("inv", F32, Fmt("{0} / a_s", (Lit(1, F32),))))

    def scaled(v, i):
        return [Let("o", F32, Fmt("{0} * inv", (Math("exp", F32, (Fmt("{0} - a_m", (Cast(F32, v),)),),
                                                     "nonpositive"),)))]

    plain = scaled(Load("x", "r * sr + c", in_dt), "c") + [Store("out", "r * cols + c", "o", out_dt)]
    body.append(Range("c", 0, "cols", plain, "threads", unroll=UNROLL,
                      vec=Vec("x", "r * sr", in_dt, scaled, cache=cache,
                              store=("out", "r * cols", out_dt, "o"))))
    return body


def softmax_kernel(name: str, in_dt, out_dt, log: bool, gpu: bool) -> Kernel:
    if not _is_float(np.dtype(in_dt)):
        raise Unsupported(f"{'LogSumExp' if log else 'Softmax'} on {np.dtype(in_dt)}")
    wide = np.dtype(np.float64) if np.dtype(in_dt) == np.float64 else F32  # MLX: float math, double for double
    rows = (_row_softmax_gpu if gpu else _row_softmax_cpu)(in_dt, out_dt, log, wide)
    params = _params("row", in_dt, out_dt)[:-1]  # rows, cols, sr (the last axis is unit)
    if log and not gpu:
        # the CPU: ROW_TILE rows a loop where there are two tiles at least (as the row
        # reductions), the rest one at a time
        T = ROW_TILE
        return Kernel(name, params,
                      [Let("nt", INDEX, f"rows >= {2 * T} ? rows / {T} : 0"),
                       Range("rt", 0, "nt", _lse_tile_cpu(in_dt, out_dt, wide), "blocks",
                             f"rows * cols >= {PAR_MIN_EXP}"),
                       Range("r", f"nt * {T}", "rows", rows, "blocks",
                             f"nt == 0 && rows > 1 && rows * cols >= {PAR_MIN_EXP}")], wide=True)
    return Kernel(name, params,
                  [Range("r", 0, "rows", rows, "blocks", f"rows > 1 && rows * cols >= {PAR_MIN_EXP}")],
                  block=1024, groups=lambda v: min(v["rows"], 1 << 30),
                  threads=lambda v: row_threads(v["cols"]), wide=True)


def _lse_tile_cpu(in_dt, out_dt, F32) -> list:
    """LogSumExp of ROW_TILE rows (``rt * ROW_TILE + j``): their max pass in one loop,
    then their exp pass in one loop (that many independent exp chains, and the passes'
    starts and ends paid once a tile: 4096 x 128 one thread 0.82 -> 0.72 ns an element,
    1000-long rows 4% less), each row's z from a per-tile array."""
    T = ROW_TILE
    x = Load("x", "r * sr + c", in_dt)
    mx, sm = monoid("max", F32), monoid("sum", F32)
    tiles = tuple(f"rt * {T} + {j}" for j in range(T))
    body = [Reduce("c", 0, "cols", [Let("v", F32, Cast(F32, x))], mx, "m", {"v": "v"},
                   tiles=tiles, tile_var="r"),
            Local("zt", F32, T)]
    for j in range(T):
        body += [Let(f"mx{j}", F32, mx.value(state_vars(f"m{j}", mx))),
                 Assign(f"zt[{j}]", Fmt(f"(isinf(mx{j}) ? {{0}} : mx{j})", (Lit(0, F32),)))]
    e = Math("exp", F32, (Fmt("{0} - zt[r - rt * %d]" % T, (Cast(F32, x),)),), "nonpositive_nan_unused")
    body.append(Reduce("c", 0, "cols", [Let("e", F32, e)], sm, "s", {"v": "e"}, tiles=tiles, tile_var="r"))
    body += [Store("out", t, Fmt(f"(isinf(mx{j}) ? mx{j} : zt[{j}] + {{0}})",
                                 (Math("log", F32, (f"s{j}_s",)),)), out_dt)
             for j, t in enumerate(tiles)]
    return body


# -- Scan -----------------------------------------------------------------------------------

def scan_kernel(name: str, op: str, in_dt, out_dt, inclusive: bool, reverse: bool,
                contiguous: bool, gpu: bool) -> Kernel:
    """Cumulative ``op`` along an axis of ``n`` elements (stride ``sa``), ``outer`` x ``inner``
    independent scans (stride ``so`` / unit), output contiguous."""
    in_dt, out_dt = np.dtype(in_dt), np.dtype(out_dt)
    adt = acc_dtype(out_dt)
    acc = monoid(op, adt, nan_flag=False)
    (f, _), = acc.fields
    j = "(n - 1 - c)" if reverse else "c"
    params = [Param("in", "x", in_dt), Param("out", "out", out_dt)] + [
        Param("int", n) for n in ("outer", "n", "inner", "so", "sa", "si")]

    def step(st, src, dst):
        load = [Let("v", adt, _load(in_dt, adt, src))]
        fold = [Fold(acc, st, {"v": "v"})]
        store = [Store("out", dst, st[f], out_dt)]
        return load + (fold + store if inclusive else store + fold)

    if contiguous:  # one scan per row, in turn along it (a GPU: one thread of the block)
        st = {f: "acc"}
        row = [Let("acc", adt, acc.identity[0], mutable=True),
               Range("c", 0, "n", step(st, f"o * so + {j} * sa", f"o * n + {j}"))]
        return Kernel(name, params, [Range("o", 0, "outer", [First(row)], "blocks",
                                           f"outer > 1 && outer * n >= {PAR_MIN}")],
                      groups=lambda v: min(v["outer"], 1 << 30), threads=lambda v: 32)
    if gpu:  # one thread per (outer, inner) scan
        st = {f: "acc"}
        body = [Let("o", INDEX, "e / inner"), Let("i", INDEX, "e % inner"),
                Let("acc", adt, acc.identity[0], mutable=True),
                Range("c", 0, "n", step(st, f"o * so + {j} * sa + i * si", f"(o * n + {j}) * inner + i"))]
        return Kernel(name, params, [Range("e", 0, "outer * inner", body, "global")],
                      groups=lambda v: -(-(v["outer"] * v["inner"]) // 256))
    B = SCAN_BLOCK
    st = {f: "acc[k]"}
    body = [Let("nib", INDEX, f"(inner + {B - 1}) / {B}"), Let("o", INDEX, "ob / nib"),
            Let("i0", INDEX, f"(ob % nib) * {B}"),
            Let("nb", INDEX, f"inner - i0 < {B} ? inner - i0 : {B}"), Local("acc", adt, B),
            Range("k", 0, "nb", [Assign("acc[k]", acc.identity[0])], "threads"),
            Range("c", 0, "n", [Range("k", 0, "nb", step(
                st, f"o * so + {j} * sa + (i0 + k) * si", f"(o * n + {j}) * inner + i0 + k"),
                "threads")])]
    return Kernel(name, params, [Range("ob", 0, f"outer * ((inner + {B - 1}) / {B})", body, "blocks",
                                       f"outer * n * inner >= {PAR_MIN}")])


# -- the specs ------------------------------------------------------------------------------

def dtype_name(dt) -> str:
    return np.dtype(dt).name


@dataclass(frozen=True)
class KernelSpec(IRKernelSpec):
    """One generated kernel of a reduction primitive: ``family`` (reduce, softmax,
    logsumexp, scan) and what its builder takes; ``name`` is its kernel name."""

    family: str
    op: str
    in_dtype: str
    out_dtype: str
    layout: str  # reduce: row / col / strided / all / general; scan: contig / strided
    inclusive: bool = True
    reverse: bool = False
    precise: bool = False

    @property
    def name(self) -> str:
        i, o = self.in_dtype, self.out_dtype
        if self.family == "reduce":
            if self.op in ("argmax", "argmin"):
                return f"{self.layout}_{self.op}_{i}"
            return f"{self.layout}_reduce_{self.op}_{i}_{o}"
        if self.family in ("softmax", "logsumexp"):
            return f"block_{self.family}_{'precise_' if self.precise else ''}{i}"
        kind = "inclusive" if self.inclusive else "exclusive"
        rev = "reverse_" if self.reverse else ""
        return f"{self.layout}_scan_{rev}{kind}_{self.op}_{i}_{o}"

    lib_name = name  # what the kernel cache and the Kernels tab call it

    def kernel(self, gpu: bool = False) -> Kernel:
        n = self.name
        if self.family == "reduce":
            return reduce_kernel(n, self.op, self.in_dtype, self.out_dtype, self.layout, gpu)
        if self.family in ("softmax", "logsumexp"):
            return softmax_kernel(n, self.in_dtype, self.out_dtype, self.family == "logsumexp", gpu)
        return scan_kernel(n, self.op, self.in_dtype, self.out_dtype, self.inclusive, self.reverse,
                           self.layout == "contig", gpu)


REDUCE_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "bfloat16", "float32", "float64")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def all_specs() -> list:
    """Every kernel the reduction primitives can ask for (the dialect tests render them all)."""
    from ..common.reductions import sum_dtype

    out = []
    for dt in REDUCE_DTYPES:
        for op in ("sum", "prod", "max", "min", "and", "or", "argmax", "argmin"):
            o = ("uint32" if op.startswith("arg") else "bool" if op in ("and", "or")
                 else sum_dtype(dt).name if op in ("sum", "prod") else dt)
            for layout in ("row", "col", "strided", "general") + (() if op.startswith("arg") else ("all",)):
                out.append(KernelSpec("reduce", op, dt, o, layout))
        for op in ("sum", "prod", "max", "min"):
            o = "int32" if op == "sum" and dt == "bool" else dt
            for layout in ("contig", "strided"):
                for inclusive in (True, False):
                    for reverse in (False, True):
                        out.append(KernelSpec("scan", op, dt, o, layout, inclusive, reverse))
    for dt in FLOAT_DTYPES:
        out += [KernelSpec("softmax", "softmax", dt, dt, "row"),
                KernelSpec("softmax", "softmax", dt, dt, "row", precise=True),
                KernelSpec("logsumexp", "logsumexp", dt, dt, "row")]
    return out
