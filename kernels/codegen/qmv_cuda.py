"""MLX's ``qmv`` (a few rows times a transposed quantized weight) and the weight's
``dequant`` tile (``cuda/quantized.py``'s ``QmmPlan``: the tile, then one cuBLAS GEMM), for
every quantization MLX's CUDA backend takes, as one kernel text rendered twice: CUDA (the
GPU's kernel) and C (the same loops with the grid, its warps and lanes walked in order: the
stand-in driver's build of a packed launch, and the Kernels tab's C).

The quantizations are MLX's ``dispatch_quant_types`` (mlx/backend/cuda/quantized/qmm/qmv.cu):
affine codes of 2, 3, 4, 5, 6 or 8 bits in groups of 32, 64 or 128 (``code * scale + bias``,
scales and biases of x's type); mxfp4 (e2m1 codes, e8m0 scales, groups of 32), mxfp8 (e4m3
codes, e8m0 scales, groups of 32) and nvfp4 (e2m1 codes, e4m3 scales, groups of 16): the
code's value times the scale, no bias. The packed weight is a little-endian stream of
``bits``-wide codes read as uint32 words (``rules/quantized.py``'s packing: codes of 3, 5 and
6 bits straddle words), so a run of ``EPT`` codes (32; 16 for 8-bit codes and nvfp4's
groups of 16) is ``EPT * bits / 32`` whole words inside one group, decoded by compile-time
shifts (a straddling code ORs its high bits from the next word). One generator, the width
and the mode its parameters, as MLX's templates over ``Q`` / ``S``.

The mechanism is MLX's CUDA ``qmv_kernel``: a block of ``WARPS`` warps, each warp one output
column ``n`` (a row of the packed weight), its lanes striding over K in runs of ``EPT``
codes, a warp reduction at the end. Unlike MLX's kernel, which gives each row of x its own
block (``grid.y``), a warp here multiplies its weight row into every one of the call's
``ROWS`` rows (at most ``MAX_ROWS``) while the decoded codes sit in registers, so the weight
is read once for all of them. A run is ``sum_j x_j (c_j s + b) = s sum_j x_j c_j + b sum_j
x_j`` (MLX's ``qdot``, mlx/backend/metal/kernels/quantized.h; ``s sum_j x_j v(c_j)`` for the
fp modes), in float32 whatever the storage type; x, affine scales and biases and the output
are one type, read in their own bits (float16, bfloat16) and the result rounded once.

One launch covers a batch: the grid is one dimension, ``B * ceil(N / WARPS)`` blocks; entry
``bb``'s x, weight, scales and biases start ``bb`` times their batch stride in (0: a
broadcast operand). ``gather`` (MLX's ``gather_qmv_kernel``) reads entry ``bb``'s matrices'
indices from ``lhs`` / ``rhs`` instead (the index arrays' layout as up to three strided
dimensions; a negative index counts from the batch's end, as numpy's; an index outside the
batch, where MLX's kernel reads out of bounds, is noted in the stream's bounds record
(``bounds_text.py``: numpy's error for ``x[lhs]`` first, then ``w[rhs]``, raised at the
host's wait) and the entry reads matrix 0). x's rows are ``x_rs`` elements apart with unit-stride columns; the weight, scales
and biases are row-contiguous matrices. Where x's rows, the weight and x's row stride are
aligned the runs are read as vectors (16 bytes of x; 16 or 8 bytes of the weight), else
word by word (a warp-uniform choice, made per launch from the pointers).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import bounds_text
from .warp_text import c_head, c_prelude, cuda_prelude

MAX_ROWS = 8  # rows one qmv call multiplies (MLX's CUDA qmv below M * B = 8)
WARPS = 8  # output columns (warps) per block, MLX's rows_per_block
TYPES = ("float32", "float16", "bfloat16")
# mode -> (code widths, group sizes, the scales' format, the codes' format) (MLX's
# dispatch_quant_types and dispatch_groups)
MODES = {
    "affine": ((2, 3, 4, 5, 6, 8), (32, 64, 128), "T", "uint"),
    "mxfp4": ((4,), (32,), "e8m0", "e2m1"),
    "mxfp8": ((8,), (32,), "e8m0", "e4m3"),
    "nvfp4": ((4,), (16,), "e4m3", "e2m1"),
}
BITS = MODES["affine"][0]
GROUP_SIZES = MODES["affine"][1]
INDEX_TYPES = ("int32", "uint32", "int64", "uint64")  # the gather's index arrays
GATHER_INTS = ("nx", "nw", "i1", "i2", "l0", "l1", "l2", "r0", "r1", "r2")
DEQUANT_THREADS = 256


@dataclass(frozen=True)
class QmvSpec:
    """One kernel: the storage type of x / the output (and affine scales / biases), the
    mode, the code width, the group size and the rows per call (all compile-time, as MLX's
    template parameters); ``rows`` 0 is the ``dequant`` form (the weight as a (batch, N, K)
    matrix of the type); ``index`` the gather's index type ("": no gather)."""

    dtype: str
    bits: int
    group_size: int
    rows: int
    mode: str = "affine"
    index: str = ""

    @property
    def form(self) -> str:
        return ("gather_qmv" if self.index else "qmv") if self.rows else "dequant"

    @property
    def affine(self) -> bool:
        return self.mode == "affine"

    @property
    def ept(self) -> int:
        """Codes per lane per step: a run of whole words inside one group."""
        return min(self.group_size, 16 if self.bits in (6, 8) else 32)

    @property
    def name(self) -> str:  # MLX's kernel naming (affine_qmv_float16_t_gs_64_b_4)
        tail = f"_m_{self.rows}" if self.rows else ""
        tail += f"_i_{self.index}" if self.index else ""
        return f"{self.mode}_{self.form}_{self.dtype}_gs_{self.group_size}_b_{self.bits}{tail}"

    @property
    def layout(self) -> str:
        rows = f" x {self.rows} rows" if self.rows else ""
        gather = f" gather {self.index}" if self.index else ""
        return f"{self.form} {self.dtype} {self.mode} {self.bits}-bit gs {self.group_size}{rows}{gather}"

    lib_name = property(lambda self: self.name)

    def params(self) -> list:
        """(kind, name) in argument order: ``in`` / ``out`` pointers, then int64 values."""
        bias = [("in", "biases")] if self.affine else []
        b_bs = [("int", "b_bs")] if self.affine else []
        if not self.rows:
            return ([("in", "w"), ("in", "scales")] + bias + [("out", "out")]
                    + [("int", n) for n in ("total", "N", "K", "w_bs", "s_bs")] + b_bs)
        idx = [("in", "lhs"), ("in", "rhs"), ("in", "bounds")] if self.index else []
        gints = [("int", n) for n in GATHER_INTS] if self.index else []
        return ([("in", "x"), ("in", "w"), ("in", "scales")] + bias + idx + [("out", "out")]
                + [("int", n) for n in ("B", "N", "K", "x_rs", "x_bs", "w_bs", "s_bs")]
                + b_bs + gints)

    def sources(self, built: dict) -> dict:
        """The Kernels tab's three: CUDA, its C build, and why there is no Metal one."""
        return {"cpu": built.get("cpu") or c_source(self),
                "cuda": built.get("cuda") or cuda_source(self),
                "metal": "// no MSL qmv kernel: Metal runs the quantized products' rule"}


def takes(dtype: str, mode: str, bits: int, group_size: int, rows: int, index: str = "") -> bool:
    """Whether a kernel of this type, mode, width and group size exists for ``rows`` (0:
    dequant; a gather only as qmv)."""
    m = MODES.get(mode)
    return (m is not None and dtype in TYPES and bits in m[0] and group_size in m[1]
            and 0 <= rows <= MAX_ROWS and (not index or (index in INDEX_TYPES and rows > 0)))


# The kernel's text: the dialects define T, LOAD / STORE (a T to and from float), FBITS (a
# word's bits as float), LOADW4 / LOADW2 (16 / 8 bytes into words), FROM_WORDS (element j
# of x's words as float), the grid's loops (FOR_BLOCK_WARP, FOR_LANE), WARP_SUM and LEADER
# (lane 0 of the warp); the spec: SCALE (a group's scale as float), VALUE (a code's value
# before the scale), the entry's matrix indices (XI, WI). In CUDA the loops run once per
# thread (its block, warp and lane); in C they walk every block, warp and lane, the lanes'
# sums falling into one accumulator.
_COMMON = """
#define BITS {bits}
#define GS {gs}
#define EPT {ept}                 /* codes per lane per step, inside one group */
#define WPR (EPT * BITS / 32)     /* the run's weight words */
#define VW {vw}                   /* words per weight vector load (1: word by word) */
#define XV (EPT * (int)sizeof(T) / 16)  /* 16-byte vectors of x (or out) per run */
#define MASK ((1u << BITS) - 1u)
#define AFFINE {affine}
/* the run's weight words at code k (vec: vector loads) */
#define LOAD_RUN(words, base, k) do {{ \\
    const uint32_t* src_ = (base) + (k) * BITS / 32; \\
    if (VW > 1 && vec) {{ \\
      UNROLL \\
      for (int q_ = 0; q_ < WPR; q_ += VW) {{ if (VW == 4) LOADW4((words) + q_, src_ + q_); \\
                                             else LOADW2((words) + q_, src_ + q_); }} \\
    }} else {{ \\
      UNROLL \\
      for (int q_ = 0; q_ < WPR; q_++) (words)[q_] = src_[q_]; \\
    }} \\
  }} while (0)
/* code j of a run's words (a code straddling two words takes its high bits from the next) */
#define CODE(wd, j) ((((wd)[((j) * BITS) >> 5] >> (((j) * BITS) & 31)) | \\
    ((((j) * BITS & 31) + BITS > 32) ? ((wd)[(((j) * BITS) >> 5) + 1] << (32 - (((j) * BITS) & 31))) : 0u)) & MASK)
"""

# the codes' and scales' formats: e2m1 / e4m3 codes, e8m0 / e4m3 scales as float32 by integer
# arithmetic (the values of rules/quantized.py's FP4_LUT and fp8_decode, nan for e4m3's
# 0x7F / 0xFF; e8m0 0 is 2^-127); e2m1's form keeps the one-row fp4 qmv within 64 registers
# (ptxas -v for sm_90: no spills, where the exponent / mantissa form spills 148 bytes)
_FORMATS = """
DEVFN float e2m1_value(uint32_t c) {  /* magnitudes 2..7 are 0.5's bits plus q << 22 */
  const uint32_t q = c & 7u;
  const uint32_t mag = q < 2u ? (q ? 0x3F000000u : 0u) : (q << 22) + 0x3F000000u;
  return FBITS(mag | ((c & 8u) << 28));
}
DEVFN float e4m3_value(uint32_t c) {
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  float v = e ? FBITS(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
  v = ((c & 0x7Fu) == 0x7Fu) ? FBITS(0x7FC00000u) : v;
  return (c & 0x80u) ? -v : v;
}
DEVFN float e8m0_value(uint32_t s) { return FBITS(s ? (s << 23) : 0x00400000u); }
"""
_SCALE = {"T": "LOAD({})", "e8m0": "e8m0_value({})", "e4m3": "e4m3_value({})"}
_VALUE = {"uint": "((float)({}))", "e2m1": "e2m1_value({})", "e4m3": "e4m3_value({})"}

_BODY = """
#define ROWS {rows}
#define GATHER {gather}

KERNEL_HEAD {{
  const long long nblk = (N + WARPS - 1) / WARPS, G = K / GS, wrow = K * BITS / 32;
  FOR_BLOCK_WARP(blk, warp) {{
    const long long bb = blk / nblk, n = (blk % nblk) * WARPS + warp;
    if (n < N) {{  /* warp-uniform */
#if GATHER
      /* entry bb's matrices: its indices (negative: from the end); one outside its batch
         noted (x's before w's: numpy's order) and read as 0 */
      const long long j2 = bb % i2, j1 = (bb / i2) % i1, j0 = bb / (i1 * i2);
      const IT lraw = LHS[j0 * l0 + j1 * l1 + j2 * l2], rraw = RHS[j0 * r0 + j1 * r1 + j2 * r2];
      long long xi = (long long)lraw, wi = (long long)rraw;
      const int xbad = IT_SIGNED ? (xi < -nx || xi >= nx) : ((unsigned long long)lraw >= (unsigned long long)nx);
      const int wbad = IT_SIGNED ? (wi < -nw || wi >= nw) : ((unsigned long long)rraw >= (unsigned long long)nw);
      if (xbad || wbad)
        bounds_note(BOUNDS, xbad ? (unsigned long long)bb : (unsigned long long)(B + bb),
                    xbad ? (unsigned long long)lraw : (unsigned long long)rraw, 0, xbad ? nx : nw,
                    ADDR(LHS), !IT_SIGNED);
      xi = xbad ? 0 : (xi < 0 ? xi + nx : xi);
      wi = wbad ? 0 : (wi < 0 ? wi + nw : wi);
#else
      const long long xi = bb, wi = bb;
#endif
      const uint32_t* wr = W + wi * w_bs + n * wrow;
      const ST* sr = S + wi * s_bs + n * G;
#if AFFINE
      const T* br = BI + wi * b_bs + n * G;
#endif
      const T* xb = X + xi * x_bs;
      const int vec = ((ADDR(wr) & (4 * VW - 1)) | (ADDR(xb) & 15)) == 0
                      && ((x_rs * (long long)sizeof(T)) & 15) == 0;
      float acc[ROWS];
      for (int m = 0; m < ROWS; m++) acc[m] = 0.0f;
      FOR_LANE(lane) {{
        /* the next run's weight words are loaded before this run's products (a second
           load in flight per lane, not an unrolled loop's dozens) */
        uint32_t wn[WPR];
        for (int q = 0; q < WPR; q++) wn[q] = 0u;
        if ((long long)lane * EPT < K) LOAD_RUN(wn, wr, (long long)lane * EPT);
        for (long long k0 = (long long)lane * EPT; k0 < K; k0 += 32 * EPT) {{
          uint32_t wd[WPR];
          UNROLL
          for (int q = 0; q < WPR; q++) wd[q] = wn[q];
          if (k0 + 32 * EPT < K) LOAD_RUN(wn, wr, k0 + 32 * EPT);
          float c[EPT];
          UNROLL
          for (int j = 0; j < EPT; j++) c[j] = VALUE(CODE(wd, j));
          const long long g = k0 / GS;
          const float s = SCALE(sr[g]);
#if AFFINE
          const float b = LOAD(br[g]);
#endif
          UNROLL
          for (int m = 0; m < ROWS; m++) {{
            const T* xr = xb + m * x_rs + k0;
            float xf[EPT];
            if (vec) {{
              uint32_t xw[4 * XV];
              UNROLL
              for (int q = 0; q < XV; q++) LOADW4(xw + 4 * q, (const uint32_t*)xr + 4 * q);
              UNROLL
              for (int j = 0; j < EPT; j++) xf[j] = FROM_WORDS(xw, j);
            }} else {{
              UNROLL
              for (int j = 0; j < EPT; j++) xf[j] = LOAD(xr[j]);
            }}
            float dot = 0.0f;
#if AFFINE
            float xsum = 0.0f;
#endif
            UNROLL
            for (int j = 0; j < EPT; j++) {{
              dot = fmaf(xf[j], c[j], dot);
#if AFFINE
              xsum += xf[j];
#endif
            }}
#if AFFINE
            acc[m] += fmaf(s, dot, b * xsum);
#else
            acc[m] = fmaf(s, dot, acc[m]);
#endif
          }}
        }}
      }}
      for (int m = 0; m < ROWS; m++) acc[m] = WARP_SUM(acc[m]);
      LEADER {{
        for (int m = 0; m < ROWS; m++) OUT[(bb * ROWS + m) * N + n] = STORE(acc[m]);
      }}
    }}
  }}
}}
"""

# The dequant form: a thread per run of EPT codes, its values (c s + b, or v(c) s) rounded
# once to T and stored as 16-byte words (the tile is row-contiguous and 16-byte aligned: an
# allocator buffer); FOR_THREAD is the thread's index (C: every index).
_DEQUANT = """
KERNEL_HEAD {{
  const long long G = K / GS, wrow = K * BITS / 32, per_row = K / EPT;
  const int vec = (ADDR(W) & (4 * VW - 1)) == 0 && ((w_bs * 4) & (4 * VW - 1)) == 0;
  FOR_THREAD(t) {{
    if (t < total) {{
      const long long row = t / per_row, k0 = (t % per_row) * EPT, bb = row / N, n = row % N;
      uint32_t wd[WPR];
      LOAD_RUN(wd, W + bb * w_bs + n * wrow, k0);
      const long long g = k0 / GS;
      const float s = SCALE(S[bb * s_bs + n * G + g]);
#if AFFINE
      const float b = LOAD(BI[bb * b_bs + n * G + g]);
#endif
      uint32_t ow[4 * XV];
      UNROLL
      for (int q = 0; q < 4 * XV; q++) ow[q] = 0u;
      UNROLL
      for (int j = 0; j < EPT; j++) {{
#if AFFINE
        TO_WORDS(ow, j, fmaf(VALUE(CODE(wd, j)), s, b));
#else
        TO_WORDS(ow, j, VALUE(CODE(wd, j)) * s);
#endif
      }}
      uint32_t* o = (uint32_t*)(OUT + row * K + k0);
      UNROLL
      for (int q = 0; q < XV; q++) STORE16W(o + 4 * q, ow + 4 * q);
    }}
  }}
}}
"""

# a float rounded to T as its bits (a word for float32, half a word for the 16-bit types)
_CU_BITS = {"float32": "__float_as_uint({})",
            "float16": "(uint32_t)__half_as_ushort(__float2half_rn({}))",
            "bfloat16": "(uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn({}))"}
_C_BITS = {"float32": "float_u32({})", "float16": "half_u16({})", "bfloat16": "(uint32_t)float_bf16({})"}
_CU_INDEX = {"int32": "int", "uint32": "unsigned int", "int64": "long long",
             "uint64": "unsigned long long"}
_C_INDEX = {"int32": "int32_t", "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t"}


def _to_words(dtype: str, bits: dict) -> str:
    v = bits[dtype].format("(v)")
    if dtype == "float32":
        return f"#define TO_WORDS(w, j, v) ((w)[j] = {v})\n"
    return f"#define TO_WORDS(w, j, v) ((w)[(j) >> 1] |= {v} << (16 * ((j) & 1)))\n"


_BUFS = {"x": ("X", "const T*"), "w": ("W", "const uint32_t*"), "scales": ("S", "const ST*"),
         "biases": ("BI", "const T*"), "lhs": ("LHS", "const IT*"), "rhs": ("RHS", "const IT*"),
         "bounds": ("BOUNDS", "unsigned long long*"), "out": ("OUT", "T*")}


def _signature(spec: QmvSpec) -> str:
    return ", ".join(f"{_BUFS[n][1]} __restrict__ {_BUFS[n][0]}" if k != "int" else f"long long {n}"
                     for k, n in spec.params())


def _spec_defines(spec: QmvSpec, index_types: dict) -> str:
    """The spec's macros: the scales' and index types, SCALE, VALUE, the common ones."""
    _, _, scale, codes = MODES[spec.mode]
    wpr = spec.ept * spec.bits // 32
    vw = 4 if wpr % 4 == 0 else 2 if wpr % 2 == 0 else 1
    st = "T" if scale == "T" else "unsigned char"
    it = index_types[spec.index] if spec.index else "int"
    return (f"#define ST {st}\n#define IT {it}\n#define IT_SIGNED ((IT)-1 < (IT)0)\n#define WARPS {WARPS}\n"
            f"#define SCALE(v) {_SCALE[scale].format('(v)')}\n"
            f"#define VALUE(c) {_VALUE[codes].format('(c)')}\n"
            + _COMMON.format(bits=spec.bits, gs=spec.group_size, ept=spec.ept, vw=vw,
                             affine=int(spec.affine)) + ("" if spec.affine else _FORMATS))


def _body(spec: QmvSpec, head: str) -> str:
    if spec.rows:
        text = _BODY.format(rows=spec.rows, gather=int(bool(spec.index)))
    else:
        text = _DEQUANT.format()
    return text.replace("KERNEL_HEAD {", head, 1)


def cuda_source(spec: QmvSpec) -> str:
    """The CUDA of ``spec``: ``WARPS * 32`` threads a block, a one-dimensional grid."""
    threads = WARPS * 32 if spec.rows else DEQUANT_THREADS
    # one row: four blocks an SM (64 registers; ptxas spills a word or two), so the 512
    # blocks of a 4096-column weight are one wave on an H100's 132 SMs (69 registers: three);
    # a gather's grid is several weights' blocks, many waves anyway: no cap (its index
    # arithmetic spilled 24 bytes under it)
    bounds = f"{threads}, 4" if spec.rows == 1 and not spec.index else f"{threads}"
    head = (f'extern "C" __global__ void __launch_bounds__({bounds}) '
            f"{spec.name}({_signature(spec)}) {{")
    return (cuda_prelude(spec.dtype) + """#define FOR_THREAD(t) \\
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x, _once = 1; _once; _once = 0)
""" + _to_words(spec.dtype, _CU_BITS) + _spec_defines(spec, _CU_INDEX)
            + (bounds_text.CUDA if spec.index else "") + _body(spec, head))


def c_source(spec: QmvSpec) -> str:
    """The C of ``spec``: the same loops over every block, warp and lane in order (the
    kernels' ``void** args`` entry: pointers, then the int64 values)."""
    return (c_prelude(spec.dtype) + "#define FOR_THREAD(t) for (long long t = 0; t < total; t++)\n"
            + _to_words(spec.dtype, _C_BITS) + _spec_defines(spec, _C_INDEX)
            + (bounds_text.C if spec.index else "")
            + _body(spec, c_head(spec.name, spec.params(), _BUFS)))
