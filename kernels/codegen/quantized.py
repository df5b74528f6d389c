"""MLX's quantized products as generated C (the CPU's; CUDA's are ``qmv_cuda.py``'s):
``qmv`` (a few rows: the packed weight read once, each group dequantized in registers and
multiplied into every row), ``qvm`` (the same for an untransposed weight: rows of the weight
scaled into a block of outputs) and ``dequant`` (a block of the weight dequantized to
float32, the tile a blocked product then reads: MLX's ``qmm``); and ``quantize``, MLX's
affine ``Quantize`` (codes, scales, biases of each group, ``quantize`` in
``mlx/backend/cpu/quantized.cpp``).

The mechanism is MLX's (``mlx/backend/cpu/quantized.cpp``: ``_qmm_t`` / ``_qmm`` /
``fp_qmm_t``). The packed weight is a little-endian bit stream of ``bits``-wide codes, so
eight codes are always ``bits`` whole bytes (the 3-, 5- and 6-bit packs of MLX included):
one unpacking rule for every width. A code's value is ``code * scale + bias`` (affine) or
``value(code) * scale`` (mxfp4 / nvfp4: e2m1, a word's eight codes by one table lookup;
mxfp8: e4m3, by integer arithmetic); the kernels decode e8m0 / e4m3 scale bytes once per
group. Products accumulate in float32. Other widths that divide 32 unpack "slot by slot"
in the vector kernels (code ``j * PF + p`` of a group to ``p * W + j``: one vector shift,
mask and convert per slot; ``qmv_t`` then reads x permuted the same way, ``qmv_n`` puts its
outputs back in order), and each kernel's work item is instanced per group size its mode
takes (``QuantSpec.group_sizes``), as MLX's templates are, outside the OpenMP region, and
for no other: MLX's CPU dispatch throws for another group size (``_qmm_dispatch_group``),
and a generic copy cost a quarter to a half of every build; the caller runs the rule there.

A ``QuantSpec`` names one kernel (MLX's kernel names: ``affine_qmv_t_b4``); ``c_source``
renders it. The kernels take ``void** args``: pointers, then 64-bit integers by value, in
``spec.params()``'s order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .render import C_THREADS

FORMS = ("qmv_t", "qmv_n", "dequant")  # the products' forms; "quantize" (affine) beside them
MAX_ROWS = 8  # rows a qmv call multiplies at once (MLX's qmv / qvm limit on the CPU)
MAX_GROUP = 128
QVM_BLOCK = 256  # output columns per qvm work item (a multiple of every group size)


@dataclass(frozen=True)
class QuantSpec:
    """One kernel: ``form`` (``qmv_t``, ``qmv_n``, ``dequant``), ``kind`` (``affine``: codes
    times scale plus bias; ``table``: a value table times scale) and ``bits``."""

    form: str
    kind: str
    bits: int
    scale: str = "float"  # the C kernels' scales: float32, or e8m0 / e4m3 bytes decoded inline

    @property
    def name(self) -> str:
        tail = "" if self.scale == "float" else f"_{self.scale}"
        return f"{self.kind}_{self.form}_b{self.bits}{tail}"

    @property
    def group_sizes(self) -> tuple:
        """The group sizes the kernel has a copy of, and the only ones it computes (MLX's CPU
        templates': affine 32, 64, 128; mxfp4 / mxfp8 (e8m0 scales) 32; nvfp4 (e4m3) 16)."""
        return {"e8m0": (32,), "e4m3": (16,)}.get(self.scale, (32, 64, 128))

    @property
    def fp4_lut(self) -> bool:
        """e2m1 codes decoded a word at a time by table lookup, in order (no slot order)."""
        return self.kind == "table" and self.bits == 4

    @property
    def slots(self) -> bool:
        """Whether the C ``qmv_t`` reads x in slot order (widths dividing 32, e2m1 aside)."""
        return 32 % self.bits == 0 and not self.fp4_lut

    @property
    def layout(self) -> str:
        return f"{self.form} {self.kind} {self.bits}-bit"

    def params(self) -> list:
        """(name, kind) in argument order: kind ``in`` / ``out`` pointers, ``int`` values."""
        if self.form == "quantize":
            return [("w", "in"), ("wq", "out"), ("scales", "out"), ("biases", "out"),
                    ("rows", "int"), ("cols", "int"), ("group_size", "int")]
        if self.form == "dequant":
            return [("w", "in"), ("scales", "in"), ("biases", "in"), ("table", "in"),
                    ("out", "out"), ("rows", "int"), ("cols", "int"), ("group_size", "int")]
        return [("x", "in"), ("w", "in"), ("scales", "in"), ("biases", "in"), ("table", "in"),
                ("out", "out"), ("x_off", "in"), ("w_off", "in"), ("s_off", "in"),
                ("b_off", "in"), ("batch", "int"), ("M", "int"), ("N", "int"), ("K", "int"),
                ("group_size", "int")]


def _value(kind: str, code: str, scale: str, bias: str) -> str:
    if kind == "affine":
        return f"fmaf((float)({code}), {scale}, {bias})"
    return f"(fp_value({code}) * {scale})"


# e2m1 (4 bits; the word-at-a-time kernels look e2m1 up, ``dequant_group_fp4``) / e4m3 (8 bits)
# codes as float32 bits, by integer arithmetic (no table gather, so the slot loops
# vectorize); the values of ``rules/quantized.py``'s tables, nan for e4m3's 0x7F / 0xFF
_C_FP_VALUE = """
static inline float fp_value(uint32_t c) {
#if BITS == 4
  const uint32_t e = (c >> 1) & 3u, m = c & 1u;
  uint32_t bits = e ? (((e + 126u) << 23) | (m << 22)) : (m ? 0x3F000000u : 0u);
  bits |= (c & 8u) << 28;
#else
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  const float sub = (float)m * 0.001953125f;  /* e == 0: m * 2^-9 */
  uint32_t sb;
  memcpy(&sb, &sub, 4);
  uint32_t bits = e ? (((e + 120u) << 23) | (m << 20)) : sb;
  bits = ((c & 0x7Fu) == 0x7Fu) ? 0x7FC00000u : bits;
  bits |= (c & 0x80u) << 24;
#endif
  float v;
  memcpy(&v, &bits, 4);
  return v;
}
"""


# -- C ------------------------------------------------------------------------------------------
# a scale's type and its float value: float32; e8m0 (2^(s - 127), s = 0 the subnormal 2^-127);
# e4m3 (nvfp4's, with e4m3's nan at 0x7F / 0xFF)
_C_SCALES = {
    "float": "#include <stdint.h>\n#define SCALE_T float\n#define SCALE(s) (s)\n",
    "e8m0": """#include <stdint.h>
#include <string.h>
#define SCALE_T uint8_t
static inline float e8m0_value(uint32_t s) {
  const uint32_t bits = s ? (s << 23) : 0x00400000u;
  float v;
  memcpy(&v, &bits, 4);
  return v;
}
#define SCALE(s) e8m0_value(s)
""",
    "e4m3": """#include <stdint.h>
#include <string.h>
#define SCALE_T uint8_t
static inline float e4m3_value(uint32_t c) {
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  const float sub = (float)m * 0.001953125f;
  uint32_t sb;
  memcpy(&sb, &sub, 4);
  uint32_t bits = e ? (((e + 120u) << 23) | (m << 20)) : sb;
  bits = ((c & 0x7Fu) == 0x7Fu) ? 0x7FC00000u : bits;
  bits |= (c & 0x80u) << 24;
  float v;
  memcpy(&v, &bits, 4);
  return v;
}
#define SCALE(s) e4m3_value(s)
""",
}

_C_HEAD = """#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#define BITS {bits}
#define MASK {mask}u
#define MAX_ROWS {max_rows}
#define QVM_BLOCK {qvm_block}
#define QMV_BLOCK 8

/* gs codes of one group (eight codes are BITS whole bytes) -> their values in v, in order */
#if !defined(FP4_LUT_DECODE)
static inline __attribute__((always_inline)) void dequant_group(const uint8_t* wb, int64_t gs, float s, float b,
                                 const float* table, float* v) {{
  for (int64_t u = 0; u < gs / 8; u++) {{
    uint64_t p = 0;
    memcpy(&p, wb + u * BITS, BITS);
    for (int j = 0; j < 8; j++) {{
      uint32_t c = (uint32_t)(p >> (j * BITS)) & MASK;
      v[u * 8 + j] = {value};
    }}
  }}
}}
#endif

#if defined(FP4_LUT_DECODE)
/* e2m1 (mxfp4 / nvfp4): each word's eight codes in order by one table lookup (MLX's
   FP4_LUT, fp_extract_bits_simd in mlx/backend/cpu/quantized.cpp): with AVX2 (GCC) a
   vpermps of the eight magnitudes by the code's low three bits and its sign bit moved to
   bit 31, else the table; no slot order (x and the outputs stay in order) */
#if defined(__AVX2__) && defined(__GNUC__) && !defined(__clang__)
/* GCC's vector types (no immintrin.h: its parse costs a third of a second a build);
   __builtin_shuffle of eight floats by a variable index is vpermps */
typedef float fp4_f8 __attribute__((vector_size(32)));
typedef int32_t fp4_i8 __attribute__((vector_size(32)));
typedef uint32_t fp4_u8 __attribute__((vector_size(32)));
#define FP4_VECTOR 1
#endif
static inline __attribute__((always_inline)) void dequant_group_fp4(const uint8_t* wb, int64_t gs,
                                                                   float s, const float* table,
                                                                   float* v) {{
  const uint32_t* w32 = (const uint32_t*)wb;
#if defined(FP4_VECTOR)
  const fp4_u8 shifts = {{0, 4, 8, 12, 16, 20, 24, 28}};
  fp4_f8 mags;
  memcpy(&mags, table, sizeof mags);
  for (int64_t u = 0; u < gs / 8; u++) {{
    const fp4_u8 c = (fp4_u8){{w32[u], w32[u], w32[u], w32[u], w32[u], w32[u], w32[u], w32[u]}} >> shifts;
    const fp4_f8 mag = __builtin_shuffle(mags, (fp4_i8)(c & 7u));
    const fp4_u8 val = (fp4_u8)mag ^ ((c & 8u) << 28);
    const fp4_f8 out = (fp4_f8)val * s;
    memcpy(v + 8 * u, &out, sizeof out);
  }}
#else
  for (int64_t u = 0; u < gs / 8; u++)
    for (int j = 0; j < 8; j++) v[8 * u + j] = table[(w32[u] >> (4 * j)) & 15u] * s;
#endif
}}
#define dequant_group(wb, gs, s, b, table, v) dequant_group_fp4(wb, gs, s, table, v)
#define dequant_group_slots dequant_group
#define dequant_group_words dequant_group
#define SLOTS 0
#elif 32 % BITS == 0
#define PF (32 / BITS)
/* the same values with whole codes per uint32 word, word-major within each code slot:
   code j * PF + p of the group lands at v[p * W + j] (W words), so each slot's loop over the
   words is one vector shift, mask and convert */
static inline __attribute__((always_inline)) void dequant_group_slots(const uint8_t* wb, int64_t gs, float s, float b,
                                       const float* table, float* v) {{
  const uint32_t* w32 = (const uint32_t*)wb;
  const int64_t W = gs / PF;
  for (int p = 0; p < PF; p++) {{
    float* vp = v + p * W;
    #pragma omp simd
    for (int64_t j = 0; j < W; j++) {{
      uint32_t c = (w32[j] >> (p * BITS)) & MASK;
      vp[j] = {value};
    }}
  }}
}}
/* the same values in order (code j * PF + p of the group is word j's p-th code): each
   word's PF codes by one vector shift (lanes p), mask and convert; qmv_t's x stays in order */
static inline __attribute__((always_inline)) void dequant_group_words(const uint8_t* wb, int64_t gs, float s, float b,
                                       const float* table, float* v) {{
  const uint32_t* w32 = (const uint32_t*)wb;
  for (int64_t j = 0; j < gs / PF; j++) {{
    const uint32_t wd = w32[j];
    float* vj = v + j * PF;
    #pragma omp simd
    for (int p = 0; p < PF; p++) {{
      uint32_t c = (wd >> (p * BITS)) & MASK;
      vj[p] = {value};
    }}
  }}
}}
#define SLOTS 1
#else
#define dequant_group_slots dequant_group
#define dequant_group_words dequant_group
#define SLOTS 0
#endif
"""

_C_QMV_T = """
/* out[b, m, n] = sum_k x[b, m, k] * W[b, n, k]: each weight row read once for MAX_ROWS rows */
static inline __attribute__((always_inline)) void item(void** args, const int64_t t,
                                                      const int64_t gs) {{
  const float* x = (const float*)args[0];
  const uint8_t* w = (const uint8_t*)args[1];
  const SCALE_T* scales = (const SCALE_T*)args[2];
  const float* biases = (const float*)args[3];
  const float* table = (const float*)args[4];
  float* out = (float*)args[5];
  const int64_t* x_off = (const int64_t*)args[6];
  const int64_t* w_off = (const int64_t*)args[7];
  const int64_t* s_off = (const int64_t*)args[8];
  const int64_t* b_off = (const int64_t*)args[9];
  const int64_t B = (int64_t)args[10], M = (int64_t)args[11], N = (int64_t)args[12];
  const int64_t K = (int64_t)args[13];
  const int64_t G = K / gs, row_bytes = K * BITS / 8, NB = QMV_BLOCK;
  const int64_t nblk = (N + NB - 1) / NB;
  (void)B;
  {{
    const int64_t bb = t / nblk, n0 = (t % nblk) * NB, n1 = n0 + NB < N ? n0 + NB : N;
    const float* xb = x + x_off[bb];
    const uint8_t* wb = w + w_off[bb];
    const SCALE_T* sb = scales + s_off[bb];
    const float* bi = biases + b_off[bb];
    float v[{max_group}];
    for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {{
      const int64_t mm = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
      for (int64_t n = n0; n < n1; n++) {{
        float acc[MAX_ROWS] = {{0}};
        for (int64_t g = 0; g < G; g++) {{
          dequant_group_words(wb + n * row_bytes + g * gs * BITS / 8, gs,
                              SCALE(sb[n * G + g]), {bias_expr}, table, v);
          for (int64_t m = 0; m < mm; m++) {{
            const float* xr = xb + (m0 + m) * K + g * gs;
            float d = 0.0f;
            #pragma omp simd reduction(+:d)
            for (int64_t i = 0; i < gs; i++) d += xr[i] * v[i];
            acc[m] += d;
          }}
        }}
        for (int64_t m = 0; m < mm; m++) out[(bb * M + m0 + m) * N + n] = acc[m];
      }}
    }}
  }}
}}
"""

_C_QMV_N = """
/* out[b, m, n] = sum_k x[b, m, k] * W[b, k, n]: each weight row scaled into a block of
   QVM_BLOCK outputs of MAX_ROWS rows */
static inline __attribute__((always_inline)) void item(void** args, const int64_t t,
                                                      const int64_t gs) {{
  const float* x = (const float*)args[0];
  const uint8_t* w = (const uint8_t*)args[1];
  const SCALE_T* scales = (const SCALE_T*)args[2];
  const float* biases = (const float*)args[3];
  const float* table = (const float*)args[4];
  float* out = (float*)args[5];
  const int64_t* x_off = (const int64_t*)args[6];
  const int64_t* w_off = (const int64_t*)args[7];
  const int64_t* s_off = (const int64_t*)args[8];
  const int64_t* b_off = (const int64_t*)args[9];
  const int64_t B = (int64_t)args[10], M = (int64_t)args[11], N = (int64_t)args[12];
  const int64_t K = (int64_t)args[13];
  const int64_t G = N / gs, row_bytes = N * BITS / 8;
  const int64_t nblk = (N + QVM_BLOCK - 1) / QVM_BLOCK;
  (void)B;
  {{
    const int64_t bb = t / nblk, n0 = (t % nblk) * QVM_BLOCK;
    const int64_t nw = N - n0 < QVM_BLOCK ? N - n0 : QVM_BLOCK;
    const float* xb = x + x_off[bb];
    const uint8_t* wb = w + w_off[bb];
    const SCALE_T* sb = scales + s_off[bb];
    const float* bi = biases + b_off[bb];
    float v[QVM_BLOCK];
    float acc[MAX_ROWS][QVM_BLOCK];
    for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {{
      const int64_t mm = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
      for (int64_t m = 0; m < mm; m++) memset(acc[m], 0, nw * sizeof(float));
      for (int64_t k = 0; k < K; k++) {{
        for (int64_t j = 0; j < nw; j += gs) {{
          const int64_t g = (n0 + j) / gs;
          dequant_group_slots(wb + k * row_bytes + (n0 + j) * BITS / 8, gs,
                              SCALE(sb[k * G + g]), {bias_expr_k}, table, v + j);
        }}
        for (int64_t m = 0; m < mm; m++) {{
          const float xv = xb[(m0 + m) * K + k];
          float* a = acc[m];
          #pragma omp simd
          for (int64_t i = 0; i < nw; i++) a[i] = fmaf(xv, v[i], a[i]);
        }}
      }}
      for (int64_t m = 0; m < mm; m++) {{
        float* o = out + (bb * M + m0 + m) * N + n0;
#if SLOTS
        /* each group's values are slot-ordered: back in order, once per row of a block (not
           unrolled: the complete unrolling of this scatter was half of the kernel's build) */
        const int64_t W = gs / PF;
        for (int64_t j = 0; j < nw; j += gs)
          _Pragma("GCC unroll 1") for (int p = 0; p < PF; p++)
            _Pragma("GCC unroll 1") for (int64_t q = 0; q < W; q++)
              o[j + q * PF + p] = acc[m][j + p * W + q];
#else
        memcpy(o, acc[m], nw * sizeof(float));
#endif
      }}
    }}
  }}
}}
"""

_C_DEQUANT = """
/* out[r, c] = the value of code c of packed row r (float32): the tile of a blocked product */
static inline __attribute__((always_inline)) void item(void** args, const int64_t t,
                                                      const int64_t gs) {{
  const uint8_t* w = (const uint8_t*)args[0];
  const SCALE_T* scales = (const SCALE_T*)args[1];
  const float* biases = (const float*)args[2];
  const float* table = (const float*)args[3];
  float* out = (float*)args[4];
  const int64_t R = (int64_t)args[5], C = (int64_t)args[6];
  const int64_t G = C / gs, row_bytes = C * BITS / 8;
  (void)R;
  {{
    const int64_t r = t;
    const float* bi = biases;
    for (int64_t g = 0; g < G; g++)
      dequant_group(w + r * row_bytes + g * gs * BITS / 8, gs,
                    SCALE(scales[r * G + g]), {bias_expr}, table, out + r * C + g * gs);
  }}
}}
"""


_C_QUANTIZE = """
#include <stdint.h>
#include <string.h>
#include <math.h>
#define BITS {bits}

/* the group's float32 codes (< 2^BITS) as a little-endian stream of BITS-bit codes (eight
   codes are BITS whole bytes); a NaN code packs as the rule's numpy cast leaves it
   (0x80000000, shifted and added word by word where BITS divides 32, else no bits) */
static inline void pack_group(const float* q, int64_t gs, uint8_t* out) {{
#if 32 % BITS == 0
  uint32_t* o = (uint32_t*)out;
  for (int64_t u = 0; u < gs * BITS / 32; u++) {{
    uint32_t word = 0;
    for (int j = 0; j < 32 / BITS; j++) {{
      const float f = q[u * (32 / BITS) + j];
      word += (f == f ? (uint32_t)f : 0x80000000u) << (j * BITS);
    }}
    o[u] = word;
  }}
#else
  for (int64_t u = 0; u < gs / 8; u++) {{
    uint64_t p = 0;
    for (int j = 0; j < 8; j++) {{
      const float f = q[u * 8 + j];
      p |= (uint64_t)(f == f ? (uint32_t)f : 0u) << (j * BITS);
    }}
    memcpy(out + u * BITS, &p, BITS);
  }}
#endif
}}

/* one row of groups: float32 min / max (NaN when any is, as numpy's), the scale that puts
   the larger-magnitude edge exactly on a code (1 bit: the range, bias the minimum), codes
   rounded to nearest even and clipped to [0, 2^BITS - 1]; the rule's float32 steps one for
   one (kernels/rules/quantized.py quantize) */
static inline __attribute__((always_inline)) void item(void** args, const int64_t r,
                                                      const int64_t gs) {{
  const float* w = (const float*)args[0];
  uint8_t* wq = (uint8_t*)args[1];
  float* scales = (float*)args[2];
  float* biases = (float*)args[3];
  const int64_t C = (int64_t)args[5], G = C / gs;
  const float n_bins = (float)((1u << BITS) - 1u);
  float q[{max_group}];
  for (int64_t g = 0; g < G; g++) {{
    const float* v = w + r * C + g * gs;
    float w_max = v[0], w_min = v[0];
    int nan = 0;
    #pragma omp simd reduction(max:w_max) reduction(min:w_min) reduction(|:nan)
    for (int64_t i = 0; i < gs; i++) {{
      const float e = v[i];
      w_max = e > w_max ? e : w_max;
      w_min = e < w_min ? e : w_min;
      nan |= e != e;
    }}
    if (nan) w_max = w_min = NAN;  /* numpy's max / min: NaN when any is */
    const int mask = fabsf(w_min) > fabsf(w_max);
    float scale = (w_max - w_min) / n_bins;
    scale = scale < 1e-7f ? 1e-7f : scale;
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = rintf(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {{
      scale = edge / q0;
      bias = edge;
    }}
#if BITS == 1
    scale = w_max - w_min;
    scale = scale < 1e-7f ? 1e-7f : scale;
    bias = w_min;
#endif
    for (int64_t i = 0; i < gs; i++) {{
      float c = rintf((v[i] - bias) / scale);
      c = c < 0.0f ? 0.0f : c;
      q[i] = c > n_bins ? n_bins : c;
    }}
    pack_group(q, gs, wq + (r * G + g) * (gs * BITS / 8));
    scales[r * G + g] = scale;
    biases[r * G + g] = bias;
  }}
}}
"""


_C_ENTRY = """
/* the work items over OpenMP threads, one copy of the item per group size the mode takes
   (MLX's template instances: constant loop bounds) and none for another (its caller runs the
   rule); the switch sits outside the parallel region, which the compiler outlines before it
   inlines */
#define RUN(GS) \\
  _Pragma("omp parallel for schedule(static) num_threads(nt) if (nt > 1)") \\
  for (int64_t t = 0; t < tasks; t++) item(args, t, GS);
{guard}void {name}(void** args) {{
  const int64_t gs = (int64_t)args[{gs_arg}];
  const int64_t tasks = {tasks}, work = {work};
  /* the free cores (ts_threads: a loop of more threads than free cores waits at its end for
     a preempted one), one thread below 65536 multiply-adds */
  const int nt = work > 65536 ? ts_threads() : 1;
{enter}  switch (gs) {{
{cases}    default: break;
  }}
{leave}}}
"""

# a product's output sharing memory with an input (the eval loop gives an out= rule a dying
# input's buffer, as MLX's donation does): every input is read to the end, so the products
# go to a temporary first, copied out after (as _gemm.c does); where malloc fails, in place
_C_QMV_GUARD = """
static int64_t span_of(const int64_t* off, int64_t B, int64_t size) {
  int64_t m = 0;
  for (int64_t i = 0; i < B; i++) m = off[i] > m ? off[i] : m;
  return m + size;
}
static int overlaps(const void* a, int64_t na, const void* o, int64_t no) {
  const char *pa = (const char*)a, *po = (const char*)o;
  return pa < po + no && po < pa + na;
}
static int out_overlaps(void** args, int64_t gs) {
  const int64_t B = (int64_t)args[10], M = (int64_t)args[11], N = (int64_t)args[12];
  const int64_t K = (int64_t)args[13], G = N * (K / gs), ob = B * M * N * 4;
  const void* o = args[5];
  return overlaps(args[0], 4 * span_of((const int64_t*)args[6], B, M * K), o, ob) ||
         overlaps(args[1], span_of((const int64_t*)args[7], B, N * K * BITS / 8), o, ob) ||
         overlaps(args[2], sizeof(SCALE_T) * span_of((const int64_t*)args[8], B, G), o, ob) ||
         overlaps(args[3], 4 * span_of((const int64_t*)args[9], B, G), o, ob);
}
"""
_C_QMV_ENTER = """  void* local[15];
  float* dest = NULL;
  const int64_t out_bytes = (int64_t)args[10] * (int64_t)args[11] * (int64_t)args[12] * 4;
  if (out_overlaps(args, gs)) {
    memcpy(local, args, sizeof local);
    local[5] = malloc(out_bytes > 0 ? out_bytes : 1);
    if (local[5] != NULL) {
      dest = (float*)args[5];
      args = local;
    }
  }
"""
_C_QMV_LEAVE = """  if (dest != NULL) {
    memcpy(dest, args[5], out_bytes);
    free(args[5]);
  }
"""

_TASKS = {
    "qmv_t": ("(int64_t)args[10] * (((int64_t)args[12] + QMV_BLOCK - 1) / QMV_BLOCK)",
              "(int64_t)args[10] * (int64_t)args[12] * (int64_t)args[13]"),
    "qmv_n": ("(int64_t)args[10] * (((int64_t)args[12] + QVM_BLOCK - 1) / QVM_BLOCK)",
              "(int64_t)args[10] * (int64_t)args[12] * (int64_t)args[13]"),
    "dequant": ("(int64_t)args[5]", "(int64_t)args[5] * (int64_t)args[6]"),
    "quantize": ("(int64_t)args[4]", "(int64_t)args[4] * (int64_t)args[5]"),
}


def c_source(spec: QuantSpec) -> str:
    """The C of ``spec`` (OpenMP over output blocks, ``omp simd`` inner products)."""
    return "#undef _FORTIFY_SOURCE\n" + C_THREADS + _c_source(spec)


def _c_source(spec: QuantSpec) -> str:
    if spec.form == "quantize":
        return _C_QUANTIZE.format(bits=spec.bits, max_group=MAX_GROUP) + _entry(spec)
    affine = spec.kind == "affine"
    head = _C_HEAD.format(bits=spec.bits, mask=(1 << spec.bits) - 1, max_rows=MAX_ROWS,
                          qvm_block=QVM_BLOCK, value=_value(spec.kind, "c", "s", "b"))
    if not affine:
        head = head.replace("/* gs codes of one group", _C_FP_VALUE + "\n/* gs codes of one group", 1)
    if spec.fp4_lut:
        head = "#define FP4_LUT_DECODE 1\n" + head
    head = _C_SCALES[spec.scale] + head
    body = {"qmv_t": _C_QMV_T, "qmv_n": _C_QMV_N, "dequant": _C_DEQUANT}[spec.form]
    bias = {"qmv_t": "bi[n * G + g]", "qmv_n": "bi[k * G + g]", "dequant": "bi[r * G + g]"}
    return head + body.format(name=spec.name, max_group=MAX_GROUP,
                              bias_expr=bias[spec.form] if affine else "0.0f",
                              bias_expr_k=bias[spec.form] if affine else "0.0f") + _entry(spec)


def _entry(spec: QuantSpec) -> str:
    cases = "".join(f"    case {g}: RUN({g}) break;\n" for g in spec.group_sizes)
    qmv = spec.form in ("qmv_t", "qmv_n")
    return _C_ENTRY.format(name=spec.name, gs_arg=len(spec.params()) - 1, cases=cases,
                           tasks=_TASKS[spec.form][0], work=_TASKS[spec.form][1],
                           guard=_C_QMV_GUARD if qmv else "", enter=_C_QMV_ENTER if qmv else "",
                           leave=_C_QMV_LEAVE if qmv else "")
