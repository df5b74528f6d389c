"""MLX's fast primitives as loop-IR kernels: ``RMSNorm``, ``LayerNorm``, their VJPs
(``RMSNormVJP``, ``LayerNormVJP``) and ``RoPE``, one builder each.

Each normalisation is a row kernel (MLX's ``rms_single_row`` / ``layer_norm_single_row`` /
``vjp_rms_*`` in ``mlx/backend/metal/kernels/rms_norm.metal`` and ``layer_norm.metal``,
``backend/cuda/rms_norm.cu``, ``layer_norm.cu``): one row per group (an OpenMP thread's
share on the CPU, a block / threadgroup on a GPU), a ``Reduce`` over the row, then an
elementwise pass over the same row that writes it. MLX's semantics: the row's statistics in
float32, the normalised value rounded to the output type before the weight's multiply and the
bias's add (``w[i] * static_cast<T>(x[i] * normalizer) + b[i]``), the weight with a stride
(0: the scalar 1 MLX passes without a weight). LayerNorm centres before the variance (MLX's
two passes). The VJP kernels take groups of rows and leave each group's weight / bias
gradient in ``part`` (``n_groups x cols``, float32) for one column sum (MLX's ``gw_temp``).

On a GPU each thread keeps its 16-byte vectors of the row in registers between the
reductions and the write where the row fits (``Vec.cache``: x read once), and the write
stores 16 bytes at a time with the weight / bias read as vectors beside it.

RoPE (``rope.metal``, ``rope.cu``): one group per (batch, position) row of a ``(B, H, L, D)``
view; on the CPU the row's ``cos`` / ``sin`` for the ``dims / 2`` frequencies computed once
into local memory and reused by every head, on a GPU a thread per (pair, ``ROPE_HEADS``
heads) with its own (MLX's ``rope_impl``); each pair rotated in float32 and rounded once
(``traditional``: pairs ``(2i, 2i + 1)``, else ``(i, i + dims / 2)``); features past ``dims``
are copied. ``inv`` holds the inverse frequencies (``base ** (-i / half)`` or
``1 / freqs``), ``off`` the offsets (stride 0: one for every batch element).

A float parameter (``eps``, ``scale``) is a one-element float32 buffer ``fp``: the IR's
integer parameters are the only scalars every dialect passes by value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .c_ops import Unsupported, _is_float
from .ir_spec import IRKernelSpec
from .loop_ir import (INDEX, Barrier, Cast, Fmt, Kernel, Let, Lit, Load, Local, Math, Monoid, Param,
                      Range, Reduce, Round, Store, Vec, row_threads)

F32 = np.dtype(np.float32)
PAR_MIN = 1 << 16  # elements below which a row kernel runs on one thread (a wake-up costs more)
STREAM_MIN = 1 << 23  # output bytes from which the CPU's row write streams around the caches
# (the elementwise kernels' threshold: a read for ownership of each line saved)
ROPE_HEADS = 4  # heads a GPU thread rotates with one cos / sin (MLX's rope_impl N)
ROPE_HALF_MAX = 1024  # frequencies a RoPE group keeps in local memory (dims <= 2048)
VJP_GROUPS = 512  # row groups of a VJP kernel (MLX's target_groups): rows of gw partials
UNROLL = 4  # a GPU thread's loads in flight along a row
NORM_BLOCK = 1024  # a norm's threads a row at most (its launch bound: 64 registers a thread)
SLOTS = 4  # 16-byte vectors a GPU thread keeps of its row (16384 float32 / 32768 halves a row)


def sums(*fields: str) -> Monoid:
    """Independent float32 sums, one field each (OpenMP merges them with ``+``)."""
    return Monoid("sum" + "".join(fields), tuple((f, F32) for f in fields),
                  tuple(Lit(0, F32) for _ in fields), lambda e: {f: e[f] for f in fields},
                  lambda a, b: {f: f"({a[f]} + {b[f]})" for f in fields},
                  simd="sum" if len(fields) == 1 else None, omp=("+",) * len(fields))


def _f(v) -> Cast:
    return Cast(F32, v)


def _norm_params(dt, names: tuple, outs: tuple, ints: tuple) -> list:
    return ([Param("in", n, dt) for n in names] + [Param("in", "fp", F32)]
            + [Param("out", n, d) for n, d in outs] + [Param("int", n) for n in ints])


def _rows(body: list, rows: str = "rows", work: str = "rows * cols") -> list:
    return [Range("r", 0, rows, body, "blocks", f"{rows} > 1 && {work} >= {PAR_MIN}")]


def _inv_sqrt(mean_sq) -> Fmt:
    """``1 / sqrt(mean + eps)`` in float32 (MLX's ``precise::rsqrt``)."""
    return Fmt("{0} / {1}", (Lit(1, F32), Math("sqrt", F32, (Fmt("{0} + fp[0]", (mean_sq,)),))))


def _vec(dt, layout: str, make, store=None, aux=()):
    """A row's unit-stride elements for a GPU's 16-byte loads (``row`` layout only), kept in
    registers between the row's passes where they fit (``xr``: x is read once)."""
    return Vec("x", "r * sr", dt, make, cache="xr", slots=SLOTS, store=store,
               aux=aux) if layout == "row" else None


def _pass(dt, layout: str, value, vecs: tuple) -> Range:
    """The row's write: ``out[r, c] = value(c, aux)`` for each element ``v`` of the row (a
    GPU stores 16 bytes at a time and reads the weight / bias ``vecs`` (buffer, stride) 16
    bytes at a time beside the row's vectors: ``aux`` has their values then)."""
    def make(v, i, aux=None):
        return [Let("v", F32, _f(v)), Let("o", F32, value(i, aux))]

    body = make(Load("x", "r * sr + c" if layout == "row" else "r * sr + c * sc", dt), "c") + [
        Store("out", "r * cols + c", "o", dt)]
    return Range("c", 0, "cols", body, "threads", unroll=UNROLL,
                 vec=_vec(dt, layout, make, ("out", "r * cols", dt, "o"), vecs),
                 stream=("out", "r * cols", f"rows * cols >= {STREAM_MIN // np.dtype(dt).itemsize}"))


def _elem(buf: str, stride: str, dt, i, aux):
    """Element ``i`` of a weight / bias in float32 (from ``aux`` where the GPU read it)."""
    return _f(aux[buf]) if aux else _f(Load(buf, f"({i}) * {stride}", dt))


def _row_sum(dt, layout: str, acc: str, field: str, term, square: bool) -> Reduce:
    """``<acc>_<field> = sum(t)`` (or ``sum(t * t)``) of ``t = term(v)`` over the row's
    elements ``v`` in float32."""
    def make(v, i):
        return [Let("v", F32, term(_f(v)))], {field: "v * v" if square else "v"}

    stmts, elem = make(Load("x", "r * sr + c" if layout == "row" else "r * sr + c * sc", dt), "c")
    return Reduce("c", 0, "cols", stmts, sums(field), acc, elem, unroll=UNROLL,
                  vec=_vec(dt, layout, make))


def rms_kernel(name: str, dt, layout: str, has_w: bool) -> Kernel:
    """``out = w * T(x * rsqrt(mean(x^2) + eps))`` per row (``rms_single_row``)."""
    body = [_row_sum(dt, layout, "a", "s", lambda v: v, True),
            Let("n", F32, _inv_sqrt(Fmt("a_s / {0}", (_f("cols"),))))]

    def value(i, aux):
        if not has_w:
            return "v * n"
        return Fmt("{0} * {1}", (Round(dt, "v * n"), _elem("w", "ws", dt, i, aux)))

    body.append(_pass(dt, layout, value, (("w", "ws"),) if has_w else ()))
    return Kernel(name, _norm_params(dt, ("x", "w"), (("out", dt),), ("rows", "cols", "sr", "sc", "ws")),
                  _rows(body), block=NORM_BLOCK, groups=lambda v: min(v["rows"], 1 << 30),
                  threads=lambda v: row_threads(v["cols"], most=NORM_BLOCK))


def layer_kernel(name: str, dt, layout: str, has_w: bool, has_b: bool) -> Kernel:
    """``out = w * T((x - mean) * rsqrt(var + eps)) + b`` per row, the mean first and the
    variance of the centred row after it (``layer_norm_single_row``)."""
    cols = _f("cols")
    body = [_row_sum(dt, layout, "a", "m", lambda v: v, False),
            Let("mu", F32, Fmt("a_m / {0}", (cols,))),
            _row_sum(dt, layout, "b", "q", lambda v: Fmt("{0} - mu", (v,)), True),
            Let("n", F32, _inv_sqrt(Fmt("b_q / {0}", (cols,))))]

    def value(i, aux):
        if not (has_w or has_b):
            return "(v - mu) * n"
        val = Round(dt, "(v - mu) * n")
        if has_w:
            val = Fmt("{0} * {1}", (val, _elem("w", "ws", dt, i, aux)))
            if has_b:
                val = Round(dt, val)
        if has_b:
            val = Fmt("{0} + {1}", (val, _elem("b", "bs", dt, i, aux)))
        return val

    body.append(_pass(dt, layout, value, (("w", "ws"),) * has_w + (("b", "bs"),) * has_b))
    return Kernel(name, _norm_params(dt, ("x", "w", "b"), (("out", dt),),
                                     ("rows", "cols", "sr", "sc", "ws", "bs")),
                  _rows(body), block=NORM_BLOCK, groups=lambda v: min(v["rows"], 1 << 30),
                  threads=lambda v: row_threads(v["cols"], most=NORM_BLOCK))


def _group_rows(body: list, init: list) -> list:
    """Groups of ``rpg`` rows (``groups`` of them): ``init`` once per group, ``body`` per row."""
    rows = [Range("r", "r0", "r1", body)]
    return [Range("gi", 0, "groups", [Let("r0", INDEX, "gi * rpg"),
                                      Let("r1", INDEX, "r0 + rpg < rows ? r0 + rpg : rows")]
                  + init + rows, "blocks", f"groups > 1 && rows * cols >= {PAR_MIN}")]


def _zero_part(names: tuple) -> list:
    return [Range("c", 0, "cols", [Store(p, "gi * cols + c", Lit(0, F32), F32) for p in names],
                  "threads")]


def _add_part(p: str, value) -> Store:
    return Store(p, "gi * cols + c", Fmt("{0} + {1}", (Load(p, "gi * cols + c", F32), value)), F32)


def vjp_rms_kernel(name: str, dt, has_w: bool) -> Kernel:
    """RMSNorm's VJP over row-contiguous ``x`` and ``g`` (``vjp_rms_single_row``):
    ``gx = g w n - x mean(g w x) n^3``; each group's ``sum(g x n)`` rows into ``part``."""
    xv, gv, wv = _f(Load("x", "r * cols + c", dt)), _f(Load("g", "r * cols + c", dt)), \
        _f(Load("w", "c * ws", dt))
    load = [Let("v", F32, xv), Let("gv", F32, gv), Let("wv", F32, wv)]
    cols = _f("cols")
    body = [Reduce("c", 0, "cols", load, sums("s", "t"), "a", {"s": "v * v", "t": "v * wv * gv"}),
            Let("n", F32, _inv_sqrt(Fmt("a_s / {0}", (cols,)))),
            Let("m", F32, Fmt("a_t / {0}", (cols,))), Let("n3", F32, "n * n * n")]
    row = [Store("gx", "r * cols + c", "gv * wv * n - v * m * n3", dt)]
    if has_w:
        row.append(_add_part("part", "gv * v * n"))
    body.append(Range("c", 0, "cols", load + row, "threads"))
    outs = (("gx", dt),) + ((("part", F32),) if has_w else ())
    return Kernel(name, _norm_params(dt, ("x", "w", "g"), outs, ("rows", "cols", "ws", "groups", "rpg")),
                  _group_rows(body, _zero_part(("part",)) if has_w else []), block=1024,
                  groups=lambda v: v["groups"], threads=lambda v: row_threads(v["cols"]))


def vjp_layer_kernel(name: str, dt, has_w: bool, has_b: bool) -> Kernel:
    """LayerNorm's VJP (MLX's fallback in ``mlx/fast.cpp``, in float32): with ``xc = x -
    mean``, ``n = rsqrt(var + eps)``, ``wg = w g``: ``gx = (wg - mean(wg)) n - xc mean(wg
    xc) n^3``; each group's ``sum(g xc n)`` (weight) and ``sum(g)`` (bias) into ``part`` /
    ``partb``."""
    xv, gv, wv = _f(Load("x", "r * cols + c", dt)), _f(Load("g", "r * cols + c", dt)), \
        _f(Load("w", "c * ws", dt))
    cols = _f("cols")
    load = [Let("v", F32, Fmt("{0} - mu", (xv,))), Let("gv", F32, gv), Let("wv", F32, wv)]
    body = [Reduce("c", 0, "cols", [Let("v", F32, xv)], sums("s"), "a", {"s": "v"}),
            Let("mu", F32, Fmt("a_s / {0}", (cols,))),
            Reduce("c", 0, "cols", load, sums("q", "u", "t"), "b",
                   {"q": "v * v", "u": "wv * gv", "t": "wv * gv * v"}),
            Let("n", F32, _inv_sqrt(Fmt("b_q / {0}", (cols,)))),
            Let("mwg", F32, Fmt("b_u / {0}", (cols,))), Let("mwgx", F32, Fmt("b_t / {0}", (cols,))),
            Let("n3", F32, "n * n * n")]
    row = [Store("gx", "r * cols + c", "(wv * gv - mwg) * n - v * mwgx * n3", dt)]
    if has_w:
        row.append(_add_part("part", "gv * v * n"))
    if has_b:
        row.append(_add_part("partb", "gv"))
    body.append(Range("c", 0, "cols", load + row, "threads"))
    parts = (("part",) if has_w else ()) + (("partb",) if has_b else ())
    outs = (("gx", dt),) + tuple((p, F32) for p in parts)
    return Kernel(name, _norm_params(dt, ("x", "w", "g"), outs, ("rows", "cols", "ws", "groups", "rpg")),
                  _group_rows(body, _zero_part(parts) if parts else []), block=1024,
                  groups=lambda v: v["groups"], threads=lambda v: row_threads(v["cols"]))


def rope_kernel(name: str, dt, traditional: bool, forward: bool, gpu: bool) -> Kernel:
    """RoPE over a ``(B, H, L, D)`` view of ``x`` (strides ``sb, sh, sl, sd``) into a
    row-major ``out``, one group per (batch, position) (``rope_impl``'s rotation;
    ``forward=False``: the inverse, the VJP's). On the CPU the position's ``cos`` / ``sin``
    once into local memory, then each head's pairs under ``omp simd``. On a GPU (MLX's
    ``rope.cu``: a thread's ``cos`` / ``sin`` serve ``ROPE_HEADS`` heads) one thread per
    (pair, run of ``ROPE_HEADS`` heads), neighbouring threads on neighbouring pairs of one
    head (a warp's loads and stores are contiguous runs): no group memory, no barrier, the
    loads issued while the rotation's angle is computed."""
    half = "(dims / 2)"
    i1, i2 = ("2 * i", "2 * i + 1") if traditional else ("i", f"i + {half}")
    x1 = _f(Load("x", f"xb + ({i1}) * sd", dt))
    x2 = _f(Load("x", f"xb + ({i2}) * sd", dt))
    if forward:
        r1, r2 = "x1 * c - x2 * s", "x1 * s + x2 * c"
    else:
        r1, r2 = "x2 * s + x1 * c", "x2 * c - x1 * s"
    where = [Let("xb", INDEX, "b * sb + h * sh + l * sl"), Let("ob", INDEX, "((b * H + h) * L + l) * D")]
    rot = [Let("x1", F32, x1), Let("x2", F32, x2),
           Store("out", f"ob + {i1}", r1, dt), Store("out", f"ob + {i2}", r2, dt)]
    copy = [Store("out", "ob + j", _f(Load("x", "xb + j * sd", dt)), dt)]
    theta = Fmt("pos * {0}", (Load("inv", "i", F32),))
    body = [Let("b", INDEX, "bl / L"), Let("l", INDEX, "bl % L"),
            Let("pos", F32, Fmt("{0} * fp[0]", (_f(Fmt("l + {0}", (Cast(INDEX, Load("off", "b * os", np.dtype(np.int32))),))),)))]
    if not gpu:  # the CPU: each head's pairs under omp simd (no divisions in the lanes)
        trig = [Let("c", F32, "cs[i]"), Let("s", F32, "sn[i]")]
        body += [Local("cs", F32, ROPE_HALF_MAX), Local("sn", F32, ROPE_HALF_MAX),
                 Range("i", 0, half, [Let("th", F32, theta), Store("cs", "i", Math("cos", F32, ("th",)), F32),
                                      Store("sn", "i", Math("sin", F32, ("th",)), F32)], "threads"),
                 Range("h", 0, "H", where + [Range("i", 0, half, trig + rot, "threads"),
                                             Range("j", "dims", "D", copy, "threads")])]
    else:
        # 32-bit divisions (a group's H * D is far below 2^32; a 64-bit one is a subroutine)
        def div(a, b, op):
            return f"(int64_t)((unsigned int)({a}) {op} (unsigned int)({b}))"

        runs = f"((H + {ROPE_HEADS - 1}) / {ROPE_HEADS})"
        body += [Range("t", 0, f"{runs} * {half}",
                       [Let("i", INDEX, div("t", half, "%")),
                        Let("h0", INDEX, f"{div('t', half, '/')} * {ROPE_HEADS}"),
                        Let("h1", INDEX, f"h0 + {ROPE_HEADS} < H ? h0 + {ROPE_HEADS} : H"),
                        Let("th", F32, theta), Let("c", F32, Math("cos", F32, ("th",))),
                        Let("s", F32, Math("sin", F32, ("th",))),
                        Range("h", "h0", "h1", where + rot, unroll=ROPE_HEADS)], "threads"),
                 Range("t", 0, "H * (D - dims)",
                       [Let("h", INDEX, div("t", "D - dims", "/")),
                        Let("j", INDEX, "dims + " + div("t", "D - dims", "%"))] + where + copy, "threads")]
    params = [Param("in", "x", dt), Param("in", "off", np.dtype(np.int32)), Param("in", "inv", F32),
              Param("in", "fp", F32), Param("out", "out", dt)] + [
        Param("int", n) for n in ("B", "H", "L", "D", "dims", "sb", "sh", "sl", "sd", "os")]
    return Kernel(name, params, [Range("bl", 0, "B * L", body, "blocks",
                                       f"B * L > 1 && B * L * H * D >= {PAR_MIN}")],
                  block=512, groups=lambda v: min(v["B"] * v["L"], 1 << 30),
                  threads=lambda v: row_threads(-(-v["H"] // ROPE_HEADS) * (v["dims"] // 2),
                                                per_thread=1, most=512))


# -- the specs ------------------------------------------------------------------------------

_KERNELS: dict = {}  # (spec, gpu) -> its Kernel


@dataclass(frozen=True)
class NormSpec(IRKernelSpec):
    """One generated kernel of a fast primitive: ``family`` (rms, layer_norm, vjp_rms,
    vjp_layer_norm, rope), the element dtype, the input layout (``row``: unit column
    stride; ``strided``), whether a weight / bias is given (else MLX's scalar 1 / 0), and
    RoPE's ``traditional`` / ``forward``. ``name`` is its kernel name (MLX's stems:
    ``rms``, ``layer_norm``, ``vjp_rms``, ``rope``, the dtype, MLX's ``_w`` / ``_now``)."""

    family: str
    dtype: str
    layout: str = "row"
    has_w: bool = False
    has_b: bool = False
    traditional: bool = False
    forward: bool = True

    @property
    def name(self) -> str:
        if self.family == "rope":
            return (f"rope{'_traditional' if self.traditional else ''}"
                    f"{'' if self.forward else '_vjp'}_{self.dtype}")
        wb = ("_w" if self.has_w else "_now") + (("_b" if self.has_b else "_nob")
                                                if "layer" in self.family else "")
        lay = "" if self.layout == "row" or self.family.startswith("vjp") else f"_{self.layout}"
        return f"{self.family}{lay}{wb}_{self.dtype}"

    lib_name = name  # what the kernel cache and the Kernels tab call it

    def kernel(self, gpu: bool = False) -> Kernel:
        """The loop-IR kernel (built once per spec and schedule: a GPU call asks for it to
        size its launch, and building it cost more host time than the launch)."""
        got = _KERNELS.get((self, gpu))
        if got is None:
            got = _KERNELS[(self, gpu)] = self._build(gpu)
        return got

    def _build(self, gpu: bool) -> Kernel:
        dt = np.dtype(self.dtype) if self.dtype != "bfloat16" else _bf16()
        if not _is_float(dt):
            raise Unsupported(f"{self.family} on {dt}")
        n = self.name
        if self.family == "rms":
            return rms_kernel(n, dt, self.layout, self.has_w)
        if self.family == "layer_norm":
            return layer_kernel(n, dt, self.layout, self.has_w, self.has_b)
        if self.family == "vjp_rms":
            return vjp_rms_kernel(n, dt, self.has_w)
        if self.family == "vjp_layer_norm":
            return vjp_layer_kernel(n, dt, self.has_w, self.has_b)
        return rope_kernel(n, dt, self.traditional, self.forward, gpu)


def _bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


FAST_DTYPES = ("float16", "bfloat16", "float32", "float64")


def all_specs() -> list:
    """Every kernel the fast primitives can ask for (the dialect tests render them all)."""
    out = []
    for dt in FAST_DTYPES:
        for layout in ("row", "strided"):
            for w in (False, True):
                out.append(NormSpec("rms", dt, layout, w))
                for b in (False, True):
                    out.append(NormSpec("layer_norm", dt, layout, w, b))
        for w in (False, True):
            out.append(NormSpec("vjp_rms", dt, "row", w))
            for b in (False, True):
                out.append(NormSpec("vjp_layer_norm", dt, "row", w, b))
        for trad in (False, True):
            for fwd in (True, False):
                out.append(NormSpec("rope", dt, "strided", traditional=trad, forward=fwd))
    return out
