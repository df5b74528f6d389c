"""MLX's ``ScaledDotProductAttention`` as loop-IR kernels: a vector kernel for decoding (query
length up to 8, MLX's ``sdpa_vector`` in ``mlx/backend/metal/kernels/sdpa_vector.h``) and a
tiled flash-style kernel for long queries (MLX's ``steel/attn/kernels/steel_attention.h``).

Both walk groups of query rows that share one key / value head: the ``H / Hk`` query heads of
a grouped-query head and their positions are one run of ``(H / Hk) * L`` rows, cut into
blocks (``BQ`` rows; the vector kernel's block is up to ``VQ`` rows, one block per (batch,
kv head) when they fit). A block keeps its queries (times ``scale``), its output rows, and
each row's running max ``m`` and sum ``l`` in float32 (MLX's ``U = float``) and walks the
keys in blocks of ``BK`` with the online softmax: the block's scores ``s``, their max, ``p =
exp(s - m')``, ``l = l exp(m - m') + sum(p)``, ``o = o exp(m - m') + p v``; the output is
``o / l`` rounded once to the inputs' type. No (L x kL) temporary exists.

The scores (``q kᵀ``) and the ``p v`` product of the tiled kernel are small GEMMs with
register tiles (``R`` rows x ``W`` lanes of accumulators, one fused multiply-add per
element, ``Kernel.wide``: a 512-bit vector per tile row where the CPU has them): the block's
queries are transposed once (``qt``) so the scores come out transposed (``sc[key][row]``,
lanes over rows) with each key element read in place and broadcast, and the online softmax
runs lane-wise over rows with no horizontal reductions; ``p v`` reads the values in place.
The vector kernel reads each key and value row once from memory, for every row of its block.

MLX's semantics (``mlx/fast.cpp``'s fallback, which MLX's CPU runs): ``causal``: query ``l``
sees keys ``j <= l + kL - L`` (key blocks past a block's last visible key are not visited);
a boolean mask's False gives the score float32's lowest (so a row with every key masked
averages the values, as the fallback does); an additive mask is added to the scaled score;
``sinks`` (one per query head) start ``m`` at the sink and ``l`` at 1 (a logit in the
denominator with no value, as ``sdpa_vector`` starts them).

Decoding with long caches splits the keys (MLX's ``sdpa_vector_2pass``, "flash decoding"):
``vector_2pass_1`` is the vector kernel over one run of ``chunk`` keys per block (``NB`` runs
a row, the sinks in the first), writing each row's partial state (the output at its own max,
unnormalised, its max ``m`` and sum ``l``, float32) to ``part``; ``vector_2pass_2`` merges a
row's ``NB`` states (``o = sum_c o_c exp(m_c - M) / sum_c l_c exp(m_c - M)``, ``M`` their max)
and rounds once to the inputs' type. ``part`` holds, for ``P = B * H * L * NB`` partial rows
numbered ``((b * H + h) * L + l) * NB + c``: ``P`` output rows of ``head`` floats, then the
``P`` maxes, then the ``P`` sums. Its maxes are in the kernel's own base: natural here, base 2
in the CUDA kernels (``attention_cuda.py``), each dialect's two passes alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .c_ops import Unsupported, _is_float
from .ir_spec import IRKernelSpec
from .loop_ir import INDEX, Assign, Fmt, If, Kernel, Let, Lit, Load, Local, Math, Monoid, Param, Range, Reduce, Store
from .norm_kernels import F32, _bf16, sums

BQ, BK = 32, 64  # the tiled kernel's query rows and keys per block
R, W = 8, 16  # a register tile: rows x lanes (one 512-bit vector of float32 per row)
VQ, VK = 32, 64  # the vector kernel's rows per block at most (MLX: L x gqa <= 32), keys per block
VECTOR_MAX_L = 8  # query lengths the vector kernel takes (MLX's sdpa_vector)
LOWEST = float(np.finfo(np.float32).min)  # a boolean mask's False (MLX's fallback's finfo.min)
PAR_MIN = 1 << 18  # multiply-adds below which a call runs on one thread
HEAD_MAX = 256  # head sizes the kernels take (MLX's largest)


def _max(field: str) -> Monoid:
    """The float32 max of the scores (OpenMP's ``max`` reduction)."""
    return Monoid("max" + field, ((field, F32),), (Lit(float("-inf"), F32),),
                  lambda e: {field: e[field]},
                  lambda a, b: {field: f"({b[field]} > {a[field]} ? {b[field]} : {a[field]})"},
                  omp=("max",))


def _dot() -> Monoid:
    """A float32 dot product: ``elem`` is a pair (``s``, ``k``) folded by one fused
    multiply-add (``step``); states merge with ``+`` (OpenMP's reduction)."""
    return Monoid("dot", (("s", F32),), (Lit(0, F32),), lambda e: {"s": Fmt("{0} * {1}", (e["s"], e["k"]))},
                  lambda a, b: {"s": f"({a['s']} + {b['s']})"}, omp=("+",),
                  step=lambda st, e: {"s": _fma(e["s"], e["k"], st["s"])})


def _fma(a, b, c) -> Math:
    return Math("fma", F32, (a, b, c))


def _lanes(d: int) -> int:
    """Lanes of the ``p v`` tile: the widest of 16, 8, 4, 2, 1 dividing the head size."""
    return next(w for w in (16, 8, 4, 2, 1) if d % w == 0)


@dataclass(frozen=True)
class SdpaSpec(IRKernelSpec):
    """One generated attention kernel: ``mode`` (``vector``: MLX's decode kernel; ``full``:
    the tiled one; ``vector_2pass_1`` / ``vector_2pass_2``: decoding's split keys and their
    merge, MLX's ``sdpa_vector_2pass``), the element dtype, the head size ``head`` (query, key and value),
    ``mask`` (``none``, ``bool``, ``add``), ``causal`` and ``sinks``."""

    mode: str
    dtype: str
    head: int
    mask: str = "none"
    causal: bool = False
    sinks: bool = False

    @property
    def name(self) -> str:
        if self.mode == "vector_2pass_2":  # (no mask, causal or sinks: the merge only)
            return f"sdpa_vector_2pass_2_{self.dtype}_{self.head}"
        stem = (f"sdpa_{self.mode}_{self.dtype}_{self.head}_{self.head}" if self.mode != "full"
                else f"sdpa_full_{self.dtype}_bq{BQ}_bk{BK}_bd{self.head}")
        return (stem + {"none": "", "bool": "_boolmask", "add": "_floatmask"}[self.mask]
                + ("_causal" if self.causal else "") + ("_sinks" if self.sinks else ""))

    lib_name = name  # what the kernel cache and the Kernels tab call it

    @property
    def layout(self) -> str:
        return self.mode

    def kernel(self, gpu: bool = False) -> Kernel:
        dt = np.dtype(self.dtype) if self.dtype != "bfloat16" else _bf16()
        if not _is_float(dt):
            raise Unsupported(f"attention on {dt}")
        if gpu:
            raise Unsupported("the attention kernels are CPU schedules (SIMD lanes, one "
                              "thread per block)")
        if self.mode == "vector_2pass_2":
            return merge_kernel(self, dt)
        return attention_kernel(self, dt)

    def source(self, dialect) -> str:
        from .lower import render_kernel

        gpu = getattr(dialect, "ir_threads", None) is not None
        if gpu and getattr(dialect, "name", "") == "CUDA":  # MLX's sdpa_vector, written out
            from .attention_cuda import vector_source

            return vector_source(self)
        return render_kernel(self.kernel(gpu), dialect)


INTS = ("B", "H", "Hk", "L", "kL", "qsb", "qsh", "qsl", "ksb", "ksh", "ksl", "vsb", "vsh", "vsl")
MASK_INTS = ("msb", "msh", "msl", "msk")
SPLIT_INTS = ("NB", "chunk")  # the split kernel's: key runs a row, keys a run
MERGE_INTS = ("rows", "NB")  # the merge's: rows (B * H * L), partial states a row


def _params(spec: SdpaSpec, dt) -> list:
    ps = [Param("in", "q", dt), Param("in", "k", dt), Param("in", "v", dt)]
    if spec.mask != "none":
        ps.append(Param("in", "mask", np.dtype(np.bool_) if spec.mask == "bool" else dt))
    if spec.sinks:
        ps.append(Param("in", "sinks", dt))
    ps.append(Param("in", "fp", F32))
    ps.append(Param("out", "part", F32) if spec.mode == "vector_2pass_1" else Param("out", "out", dt))
    ints = INTS + (SPLIT_INTS if spec.mode == "vector_2pass_1" else ())
    return ps + [Param("int", n) for n in ints + (MASK_INTS if spec.mask != "none" else ())]


def _rows(spec: SdpaSpec, dt, bq: int) -> list:
    """Each row of the block: its query times ``scale`` into ``qs``, its output and mask
    offsets, its causal limit, ``m`` / ``l`` (the sink's logit and 1, or lowest and 0), a zero
    output row; rows past the run are zero queries (their results are not written)."""
    D = spec.head
    live = [Let("fr", INDEX, "q0 + r"), Let("li", INDEX, "fr % L"),
            Let("h", INDEX, "hk * reps + fr / L"),
            Range("d", 0, D, [Store("qs", f"r * {D} + d", Fmt("{0} * fp[0]", (
                Load("q", "b * qsb + h * qsh + li * qsl + d", dt),)), F32)], "threads"),
            Assign("oo[r]", f"((b * H + h) * L + li) * {D}"), Assign("lim[r]", "li + kL - L")]
    if spec.mask != "none":
        live.append(Assign("mo[r]", "b * msb + h * msh + li * msl"))
    if spec.sinks and spec.mode == "vector_2pass_1":  # the first run of keys holds the sink
        live += [Store("m", "r", Fmt("(c == 0 ? {0} : {1})", (Load("sinks", "h", dt), Lit(LOWEST, F32))), F32),
                 Store("l", "r", Fmt("(c == 0 ? {0} : {1})", (Lit(1, F32), Lit(0, F32))), F32)]
    elif spec.sinks:
        live += [Store("m", "r", Load("sinks", "h", dt), F32), Store("l", "r", Lit(1, F32), F32)]
    else:
        live += [Store("m", "r", Lit(LOWEST, F32), F32), Store("l", "r", Lit(0, F32), F32)]
    pad = [Range("d", 0, D, [Store("qs", f"r * {D} + d", Lit(0, F32), F32)], "threads"),
           Assign("lim[r]", "kL"), Store("m", "r", Lit(LOWEST, F32), F32),
           Store("l", "r", Lit(0, F32), F32)]
    if spec.mask != "none":
        pad.append(Assign("mo[r]", "0"))
    return [Range("r", 0, bq, [If("r < nr", live, pad),
                               Range("d", 0, D, [Store("o", f"r * {D} + d", Lit(0, F32), F32)],
                                     "threads")])]


def _masked(spec: SdpaSpec, dt, s: str, key: str):
    """The score ``s`` of the row ``i``'s key ``key`` after the causal limit and the mask."""
    val = s
    if spec.mask == "bool":
        val = Fmt("({0} ? {1} : {2})", (Load("mask", f"mo[i] + ({key}) * msk", np.dtype(np.bool_)),
                                         val, Lit(LOWEST, F32)))
    elif spec.mask == "add":
        val = Fmt("({0} + {1})", (val, Load("mask", f"mo[i] + ({key}) * msk", dt)))
    if spec.causal:
        val = Fmt("(({0}) <= lim[i] ? {1} : {2})", (key, val, Lit(LOWEST, F32)))
    return val


def _softmax(spec: SdpaSpec, dt, rows: str, bk: int) -> list:
    """Row ``i`` of the key block (``nk`` keys of ``bk``): masked scores, their max ``mx``,
    ``p = exp(s - mx)`` in place of the scores (0 past ``nk``), ``l``, ``m`` and the factor
    ``fac = exp(m - mx)`` the row's output is rescaled by."""
    body = [Range("j", 0, bk, [Store("sc", f"i * {bk} + j", Fmt("(j < nk ? {0} : {1})", (
                _masked(spec, dt, f"sc[i * {bk} + j]", "kb + j"), Lit(float("-inf"), F32))), F32)],
                  "threads"),
            Reduce("j", 0, bk, [], _max("x"), "a", {"x": f"sc[i * {bk} + j]"}),
            Let("mx", F32, "(a_x > m[i] ? a_x : m[i])"),
            Reduce("j", 0, bk, [Let("p", F32, Math("exp", F32, (f"sc[i * {bk} + j] - mx",), "nonpositive")),
                                Store("sc", f"i * {bk} + j", "p", F32)], sums("s"), "e", {"s": "p"}),
            Let("f", F32, Math("exp", F32, ("m[i] - mx",), "nonpositive")),
            Store("l", "i", "l[i] * f + e_s", F32), Store("m", "i", "mx", F32),
            Store("fac", "i", "f", F32)]
    return [Range("i", 0, rows, body)]


def _tile(acc: str, rows: int, lanes: int, init, steps: str, a, bv, out) -> list:
    """A register tile ``acc`` (``rows`` x ``lanes``): ``init(rr, j)``, then over ``t`` in
    ``[0, steps)`` ``acc[rr][j] += a(rr, t) * bv(t, j)``, then ``out(rr, j, value)``."""
    n = rows * lanes
    return [Local(acc, F32, n),
            Range("j", 0, lanes, [Store(acc, f"{rr * lanes} + j", init(rr), F32) for rr in range(rows)],
                  "threads"),
            Range("t", 0, steps, [Range("j", 0, lanes, [Let("bv", F32, bv)] + [
                Store(acc, f"{rr * lanes} + j", _fma(a(rr), "bv", f"{acc}[{rr * lanes} + j]"), F32)
                for rr in range(rows)], "threads")]),
            Range("j", 0, lanes, [out(rr, f"{acc}[{rr * lanes} + j]") for rr in range(rows)], "threads")]


def _full_blocks(spec: SdpaSpec, dt) -> list:
    """The tiled kernel's key blocks, scores kept transposed (``st[key][row]``, SIMD lanes
    over the block's rows): the GEMM ``st = k qtᵀ`` (each key element broadcast against 16
    rows of the transposed queries ``qt``, so keys are read in place, never transposed), the
    online softmax lane-wise over rows (no horizontal reductions), then the GEMM ``o = o fac
    + p v`` (lanes over the head, values read in place)."""
    D, wv = spec.head, _lanes(spec.head)
    keys = [Let(f"kr{rr}", INDEX, f"kb0 + (kb + jb + {rr} < kend ? kb + jb + {rr} : kend - 1) * ksl")
            for rr in range(R)]
    scores = Range("jb", 0, "nk", keys + [Range("i0", 0, "nrw", _tile(
        "acc", R, W, lambda rr: Lit(0, F32), D, lambda rr: Load("k", f"kr{rr} + t", dt),
        f"qt[t * {BQ} + i0 + j]",
        lambda rr, v: Store("sc", f"(jb + {rr}) * {BQ} + i0 + j", v, F32)), step=W)], step=R)
    mask = Range("j", 0, "nk", [Range("i", 0, "nrw", [Store("sc", f"j * {BQ} + i", _masked(
        spec, dt, f"sc[j * {BQ} + i]", "kb + j"), F32)], "threads")])
    rows = Range("i", 0, "nrw", [Store("mx", "i", "m[i]", F32), Store("ls", "i", Lit(0, F32), F32)],
                 "threads")
    most = Range("j", 0, "nk", [Range("i", 0, "nrw", [Store("mx", "i", Fmt(
        f"(sc[j * {BQ} + i] > mx[i] ? sc[j * {BQ} + i] : mx[i])"), F32)], "threads")])
    exps = Range("j", 0, "nk", [Range("i", 0, "nrw", [
        Let("p", F32, Math("exp", F32, (f"sc[j * {BQ} + i] - mx[i]",), "nonpositive")),
        Store("sc", f"j * {BQ} + i", "p", F32), Store("ls", "i", "ls[i] + p", F32)], "threads")])
    fold = Range("i", 0, "nrw", [Let("f", F32, Math("exp", F32, ("m[i] - mx[i]",), "nonpositive")),
                                 Store("l", "i", "l[i] * f + ls[i]", F32), Store("m", "i", "mx[i]", F32),
                                 Store("fac", "i", "f", F32)], "threads")
    pv = Range("i0", 0, "nrt", [Range("db", 0, D, _tile(
        "acc", R, wv, lambda rr: Fmt(f"o[(i0 + {rr}) * {D} + db + j] * fac[i0 + {rr}]"), "nk",
        lambda rr: f"sc[t * {BQ} + i0 + {rr}]", Load("v", "vb0 + (kb + t) * vsl + db + j", dt),
        lambda rr, v: Store("o", f"(i0 + {rr}) * {D} + db + j", v, F32)), step=wv)], step=R)
    return [scores] + ([mask] if spec.mask != "none" or spec.causal else []) + [rows, most, exps, fold, pv]


def _pv_rows(D: int, dt, j: str, kb: str, src: str) -> list:
    """Each row's output gets ``p v`` of the value row ``kb + j`` (``p`` from ``src``)."""
    return [Let("vr", INDEX, f"vb0 + ({kb} + {j}) * vsl"), Range("i", 0, "nr", [
        Let("p", F32, f"{src}[i * {VK} + {j}]"),
        Range("d", 0, D, [Store("o", f"i * {D} + d", _fma("p", Load("v", "vr + d", dt), f"o[i * {D} + d]"), F32)],
              "threads")])]


def _vector_blocks(spec: SdpaSpec, dt) -> list:
    """The vector kernel's key blocks, pipelined so the key and value streams run together:
    block ``c``'s key rows (each one's dot with every query of the block) are read in the
    same loop as block ``c - 1``'s value rows (``p v`` with that block's ``pp``, the output
    already at block ``c - 1``'s max); then the online softmax of block ``c`` rescales the
    output to the new max and leaves its ``p`` in ``pp`` for the next block."""
    D = spec.head
    score = [Let("kr", INDEX, "kb0 + (kb + j) * ksl"), Range("i", 0, "nr", [
        Reduce("d", 0, D, [Let("kv", F32, Load("k", "kr + d", dt))], _dot(), "a",
               {"s": f"qs[i * {D} + d]", "k": "kv"}),
        Store("sc", f"i * {VK} + j", "a_s", F32)])]
    fused = Range("j", 0, "(nk > np ? nk : np)", [If("j < nk", score),
                                                  If("j < np", _pv_rows(D, dt, "j", "kb - " + str(VK), "pp"))])
    keep = Range("i", 0, "nr", [
        Range("d", 0, D, [Store("o", f"i * {D} + d", f"o[i * {D} + d] * fac[i]", F32)], "threads"),
        Range("j", 0, VK, [Store("pp", f"i * {VK} + j", f"sc[i * {VK} + j]", F32)], "threads")])
    return [fused] + _softmax(spec, dt, "nr", VK) + [keep, Assign("np", "nk")]


def attention_kernel(spec: SdpaSpec, dt) -> Kernel:
    """The kernel of ``spec``: one OpenMP block per (batch, kv head, block of rows), and per
    run of keys where it splits them (``vector_2pass_1``: its partial states to ``part``)."""
    D = spec.head
    full = spec.mode == "full"
    split = spec.mode == "vector_2pass_1"
    bq, bk = (BQ, BK) if full else (VQ, VK)
    locs = [Local("qs", F32, bq * D), Local("o", F32, bq * D), Local("sc", F32, bq * bk),
            Local("m", F32, bq), Local("l", F32, bq), Local("fac", F32, bq),
            Local("oo", INDEX, bq), Local("lim", INDEX, bq)]
    if spec.mask != "none":
        locs.append(Local("mo", INDEX, bq))
    if full:
        locs += [Local("qt", F32, D * bq), Local("mx", F32, bq), Local("ls", F32, bq)]
    else:
        locs.append(Local("pp", F32, bq * bk))
    head = [Let("reps", INDEX, "H / Hk"), Let("nrows", INDEX, "reps * L"),
            Let("nqb", INDEX, f"(nrows + {bq - 1}) / {bq}"),
            Let("gr", INDEX, "g / NB" if split else "g"),  # the block of rows
            Let("c", INDEX, "g % NB" if split else "0"),  # its run of keys
            Let("b", INDEX, "gr / (Hk * nqb)"), Let("hk", INDEX, "(gr / nqb) % Hk"),
            Let("q0", INDEX, f"(gr % nqb) * {bq}"),
            Let("nr", INDEX, f"(nrows - q0 < {bq} ? nrows - q0 : {bq})"),
            Let("nrt", INDEX, f"((nr + {R - 1}) / {R}) * {R}"),
            Let("nrw", INDEX, f"((nr + {W - 1}) / {W}) * {W}"),
            Let("kb0", INDEX, "b * ksb + hk * ksh"), Let("vb0", INDEX, "b * vsb + hk * vsh")]
    if spec.causal:  # the block's last visible key: its last row's (every position when the
        # block holds the end of one head's rows and the start of the next)
        head += [Let("last", INDEX, "q0 + nr - 1"),
                 Let("maxl", INDEX, "(q0 / L == last / L ? last % L : L - 1)"),
                 Let("kall", INDEX, "(maxl + kL - L + 1 < kL ? maxl + kL - L + 1 : kL)")]
    else:
        head.append(Let("kall", INDEX, "kL"))
    if split:  # keys [k0, kend): the run's, up to the block's last visible one
        head += [Let("k0", INDEX, "c * chunk"),
                 Let("kend", INDEX, "(k0 + chunk < kall ? k0 + chunk : kall)")]
    else:
        head += [Let("k0", INDEX, "0"), Let("kend", INDEX, "kall")]
    blocks = _full_blocks(spec, dt) if full else _vector_blocks(spec, dt)
    keys = Range("kb", "k0", "kend", [Let("nk", INDEX, f"(kend - kb < {bk} ? kend - kb : {bk})")] + blocks,
                 step=bk)
    if not full:  # the last key block's values (the pipeline's tail)
        keys = [Let("np", INDEX, "0", mutable=True), keys,
                Range("j", 0, "np", _pv_rows(D, dt, "j", f"k0 + ((kend - k0 - 1) / {VK}) * {VK}", "pp"))]
    else:
        keys = [keys]
    if split:  # the rows' partial states: the output at the row's max, the max, the sum
        write = Range("r", 0, "nr", [
            Let("pr", INDEX, f"(oo[r] / {D}) * NB + c"), Let("P", INDEX, "B * H * L * NB"),
            Range("d", 0, D, [Store("part", f"pr * {D} + d", f"o[r * {D} + d]", F32)], "threads"),
            Store("part", f"P * {D} + pr", "m[r]", F32), Store("part", f"P * {D} + P + pr", "l[r]", F32)])
    else:
        write = Range("r", 0, "nr", [Range("d", 0, D, [Store("out", "oo[r] + d", f"o[r * {D} + d] / l[r]", dt)],
                                           "threads")])
    setup = _rows(spec, dt, bq)
    if full:  # the block's queries transposed, once: the scores' GEMM reads 16 rows a lane
        setup.append(Range("d", 0, D, [Range("r", 0, bq, [Store("qt", f"d * {bq} + r", f"qs[r * {D} + d]", F32)],
                                             "threads")]))
    body = head + locs + setup + keys + [write]
    groups = f"B * Hk * ((H / Hk * L + {bq - 1}) / {bq})" + (" * NB" if split else "")
    par = f"{groups} > 1 && B * H * L * kL * {D} >= {PAR_MIN}"
    return Kernel(spec.name, _params(spec, dt), [Range("g", 0, groups, body, "blocks", par)],
                  wide=True)


def merge_kernel(spec: SdpaSpec, dt) -> Kernel:
    """``vector_2pass_2``: each row's ``NB`` partial states merged (their max ``M``, the
    weights ``exp(m_c - M)``), the output ``sum_c w_c o_c / sum_c w_c l_c`` (0 where that sum
    is 0: no key visible) rounded once to the inputs' type."""
    D = spec.head
    at = lambda i: Load("part", i, F32)  # noqa: E731
    body = [Let("P", INDEX, "rows * NB"),
            Reduce("c", 0, "NB", [], _max("x"), "a", {"x": f"part[P * {D} + g * NB + c]"}),  # (float32)
            Local("acc", F32, D),
            Range("d", 0, D, [Store("acc", "d", Lit(0, F32), F32)], "threads"),
            Let("S", F32, Lit(0, F32), mutable=True),
            Range("c", 0, "NB", [
                Let("w", F32, Math("exp", F32, (Fmt("{0} - a_x", (at(f"P * {D} + g * NB + c"),)),), "nonpositive")),
                Assign("S", Fmt("S + {0} * w", (at(f"P * {D} + P + g * NB + c"),))),
                Range("d", 0, D, [Store("acc", "d", _fma(at(f"(g * NB + c) * {D} + d"), "w", "acc[d]"), F32)],
                      "threads")]),
            Let("inv", F32, Fmt("(S == {0} ? {0} : {1} / S)", (Lit(0, F32), Lit(1, F32)))),
            Range("d", 0, D, [Store("out", f"g * {D} + d", "acc[d] * inv", dt)], "threads")]
    params = [Param("in", "part", F32), Param("out", "out", dt)] + [Param("int", n) for n in MERGE_INTS]
    return Kernel(spec.name, params, [Range("g", 0, "rows", body, "blocks",
                                            f"rows > 1 && rows * NB * {D} >= {PAR_MIN}")])


MODES = ("vector", "full")
MASKS = ("none", "bool", "add")


def all_specs(dtypes=("float16", "bfloat16", "float32"), heads=(64, 128)) -> list:
    """The attention kernels of these dtypes and head sizes (the dialect tests render them)."""
    return [SdpaSpec(mode, dt, d, mask, causal, sinks) for mode in MODES for dt in dtypes
            for d in heads for mask in MASKS for causal in (False, True) for sinks in (False, True)]
