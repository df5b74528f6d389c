"""Attention prefill as one fused CUDA kernel on the tensor cores: FlashAttention-2's tiled
online softmax (MLX's Metal ``steel_attention.h`` runs the same loop on simdgroup matrices:
``max_score`` / ``sum_score`` per row, ``factor = exp2(old - new)``, the output tile
rescaled, one write; its ``kb_lim`` cut for causal).

A CTA of ``WARPS`` warps takes ``BQ`` = 16 * ``WARPS`` query rows of one (batch, query head);
warp ``w`` owns rows ``16 w .. 16 w + 15`` and keeps their query fragments, its 16 x ``BK``
score tile and its 16 x D output accumulator in registers. The CTA walks the keys in tiles of
``BK``: the tile's key and value rows are copied to shared memory (rows padded so the
fragment loads hit distinct banks; 16-byte loads where ``vec`` and the call's rows start on
16 bytes),
each warp computes ``S = Q Kᵀ`` with ``mma.sync`` (m16n8k8 TF32 for float32, m16n8k16 for
float16 / bfloat16 with float32 accumulators), scales it to base 2 (``scale * log2 e``),
applies causal / the mask / the key tail, takes the online softmax step (the row max over
the four lanes that share a row, by shuffles; each lane's partial row sum, merged once at
the end) and accumulates ``O += P V`` with a second ``mma.sync`` (P from the score
accumulators in registers: for m16n8k16 the accumulator layout is the A operand's; for
m16n8k8 the key order of the contraction is permuted so lane ``t``'s keys ``2t, 2t + 1``
are the A operand's columns ``t, t + 4``, and V's rows are read in the same order; the head
dimension of ``Q Kᵀ`` is permuted the same way, so a lane's two elements of a key row are
one 8-byte shared load). Half
types round P to their type before ``P V`` (as cuDNN does).

Float32 precision (``precision``): ``tf32`` rounds each operand to TF32 (``cvt.rna``;
MLX's CUDA matmuls with TF32 on); ``f32x3`` is full float32 accuracy by three TF32 products
(each operand split into a TF32 high part and its TF32 residual: ``hi hi + hi lo + lo hi``,
CUTLASS's fast-accurate float32), chosen for ``MLX_ENABLE_TF32=0`` (3 x 495 / 3 TFLOP/s of
TF32 peak on an H100 against 67 TFLOP/s of float32 SIMT).

Semantics as MLX's fallback (mlx/fast.cpp): the scaled score; causal aligned at the lower
right (query ``l`` sees keys ``j <= l + kL - L``, others float32's lowest, tiles past the
CTA's last visible key skipped unless a row of it sees none); a boolean mask's False gives
float32's lowest, an additive one is added (both read through their strides, broadcast to
``(B, H, L, kL)``); ``sinks`` start a row's max at the sink's logit and its sum at 1;
grouped heads read key head ``h / (H / Hk)``. Keys past ``kL`` weigh nothing.

``FlashSpec.tile`` picks a variant: for float16 / bfloat16 a tile of ``attention_flash16``
(the same loop on ``ldmatrix`` / ``cp.async``, swizzled shared rows, 64 or 128 query rows a
CTA, the queries optionally in shared memory); for float32 ``qreload`` (the query fragments
re-read from L1 each key tile instead of held in registers: head 128 without spills).
``cuda/attention.py``'s ``FLASH`` table says which runs.

The tensor-core operations are device functions (``ts_mma_tf32_16x8x8``,
``ts_mma_bf16_16x8x16``, ``ts_mma_f16_16x8x16``, ``ts_tf32``), inline PTX on the GPU; the
host shim (tests/cuda_host_shim.h, ``TS_CUDA_HOST_SHIM``) gives warp-collective emulations
of the same fragment layouts, so this very text runs on the host in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import attention_flash16 as f16
from .attention_cuda_common import LOG2E, LOWEST, MASK_PARAMS, STORE, declarations, key_end, masked, params
from .attention_kernels import SdpaSpec
from .c_ops import Unsupported

WARPS = 4  # warps a CTA
BQ = 16 * WARPS  # query rows a CTA
THREADS = 32 * WARPS
SMEM = 40 * 1024  # bytes of the key and value tiles at most (static shared memory: 48 KiB)
HEADS = (16, 32, 48, 64, 80, 96, 112, 128)  # head sizes the kernel takes (multiples of 16)
TYPES = {"float32": ("float", "float"), "float16": ("__half", "unsigned short"),
         "bfloat16": ("__nv_bfloat16", "unsigned short")}  # (element type, shared storage)


@dataclass(frozen=True)
class FlashSpec(SdpaSpec):
    """One fused prefill kernel: ``SdpaSpec``'s fields (mode ``full``: the CPU's C is the
    tiled kernel of the same semantics), ``precision`` (float32: ``tf32`` or ``f32x3``;
    ``""`` for the half types) and ``vec`` (16-byte tile loads where the keys' and values'
    strides allow them; the kernel takes them where the call's base addresses do too),
    ``tile``: for float16 / bfloat16, ``""`` is this module's loop (scalar fragment loads,
    64 query rows, no pipelining), a name of ``attention_flash16.TILES`` that module's kernel
    (ldmatrix, cp.async, its warps, rows and key tile); for float32, ``qreload`` re-reads the
    query fragments from global memory (L1) for each key tile instead of holding them in
    registers (at head 128: 64 registers a thread fewer, no spills with 3xTF32)."""

    precision: str = ""
    vec: bool = False
    tile: str = ""

    @property
    def name(self) -> str:
        p = f"_{self.precision}" if self.precision else ""
        if self.tile:
            p += f"_{self.tile}"
        return (f"sdpa_flash_{self.dtype}{p}_bq{rows(self)}_bk{tile_keys(self)}_bd{self.head}"
                + ("_vec" if self.vec else "")
                + {"none": "", "bool": "_boolmask", "add": "_floatmask"}[self.mask]
                + ("_causal" if self.causal else "") + ("_sinks" if self.sinks else ""))

    lib_name = name

    @property
    def layout(self) -> str:
        return "flash"

    def source(self, dialect) -> str:
        if getattr(dialect, "ir_threads", None) is not None and getattr(dialect, "name", "") == "CUDA":
            return flash_source(self)
        return super().source(dialect)


def takes(spec: FlashSpec) -> bool:
    """Whether the fused kernel takes ``spec``: a head size of ``HEADS``, one of ``TYPES``,
    float32 with a precision named; a ``tile`` for the half types one that fits the head
    size, for float32 ``qreload``."""
    return (spec.head in HEADS and spec.dtype in TYPES
            and (spec.precision in ("tf32", "f32x3")) == (spec.dtype == "float32")
            and (spec.precision == "" or spec.dtype == "float32")
            and (not spec.tile or (spec.tile == "qreload" if spec.dtype == "float32"
                                   else f16.fits(spec.head, spec.tile))))


def rows(spec) -> int:
    """Query rows a CTA."""
    return f16.rows(spec.tile) if spec.tile and spec.dtype != "float32" else BQ


def threads(spec) -> int:
    """Threads a CTA."""
    return f16.threads(spec.tile) if spec.tile and spec.dtype != "float32" else THREADS


def tile_keys(spec) -> int:
    """Keys a tile: the ``tile``'s, else 64, or 32 / 16 where two tiles of 64 would pass
    ``SMEM``."""
    if spec.tile and spec.dtype != "float32":
        return f16.parse(spec.tile)[2]
    item = 4 if spec.dtype == "float32" else 2
    dp = spec.head + (4 if item == 4 else 8)
    bk = 64
    while bk > 16 and 2 * bk * dp * item > SMEM:
        bk //= 2
    return bk


def grid(B: int, H: int, L: int, bq: int = BQ) -> int:
    """CTAs of a call: one per ``bq`` query rows of each (batch, head)."""
    return B * H * -(-L // bq)


PTX = r"""#ifndef TS_CUDA_HOST_SHIM
// the tensor cores through inline PTX (the host shim emulates the same fragment layouts)
static __device__ __forceinline__ unsigned ts_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// d += a b: A 16x8 (a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)), B 8x8
// (b0 (t, g), b1 (t + 4, g)), D 16x8 (d0, d1 (g, 2t + {0, 1}), d2, d3 (g + 8, ...))
static __device__ __forceinline__ void ts_mma_tf32_16x8x8(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// d += a b: A 16x16 (a0 (g, 2t..2t+1), a1 (g + 8, ..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..)),
// B 16x8 (b0 (2t..2t+1, g), b1 (2t + 8.., g)), each register two 16-bit values, low first
static __device__ __forceinline__ void ts_mma_bf16_16x8x16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void ts_mma_f16_16x8x16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// a read-only global load the compiler keeps in the loop (not hoisted into registers)
static __device__ __forceinline__ float ts_ldg_f32(const float* p) {
  float r;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(r) : "l"(p));
  return r;
}
static __device__ __forceinline__ float ts_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
static __device__ __forceinline__ unsigned short ts_bits(__half x) { return __half_as_ushort(x); }
static __device__ __forceinline__ unsigned short ts_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
#endif
"""


def flash_source(spec: FlashSpec) -> str:
    """The CUDA of ``spec``'s kernel, named ``spec.name``."""
    if not takes(spec):
        raise Unsupported(f"the fused CUDA attention takes head sizes {HEADS} in "
                          f"{', '.join(TYPES)} ({spec.name})")
    T, S = TYPES[spec.dtype]
    f32 = spec.dtype == "float32"
    D, BK = spec.head, tile_keys(spec)
    DP = D + (4 if f32 else 8)
    VW = (4 if f32 else 8) if spec.vec else 1
    LT = ("float4" if f32 else "uint4") if spec.vec else S
    mask_t = "bool" if spec.mask == "bool" else T
    args = declarations(spec, T, params(spec))
    load = "{}" if f32 else ("__half2float({})" if spec.dtype == "float16" else "__bfloat162float({})")
    mma = "ts_mma_tf32_16x8x8" if f32 else f"ts_mma_{'f16' if spec.dtype == 'float16' else 'bf16'}_16x8x16"
    x3 = spec.precision == "f32x3"
    two = "__floats2half2_rn" if spec.dtype == "float16" else "__floats2bfloat162_rn"
    pair = "__half2" if spec.dtype == "float16" else "__nv_bfloat162"
    pack = "" if f32 else f"""// two floats rounded to {T} (to nearest even), lo in the low 16 bits: one cvt.rn.*x2.f32
#ifndef TS_CUDA_HOST_SHIM
static __device__ __forceinline__ unsigned ts_pack(float lo, float hi) {{
  const {pair} v = {two}(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}}
#else
static __device__ __forceinline__ unsigned ts_pack(float lo, float hi) {{
  return (unsigned)ts_bits({STORE[spec.dtype].format('lo')}) | ((unsigned)ts_bits({STORE[spec.dtype].format('hi')}) << 16);
}}
#endif
"""
    if spec.tile and not f32:
        return f16.source(spec, T, mma, PTX + pack)

    # the query fragments, the scores, the output
    if f32:
        qload = """  float qf[D / 8][4];  // A fragments of Q (rows g, g + 8; columns t, t + 4: d 2t, 2t + 1 of each 8)
#pragma unroll
  for (int kk = 0; kk < D / 8; kk++) {
    qf[kk][0] = q0p[kk * 8 + 2 * t]; qf[kk][1] = q1p[kk * 8 + 2 * t];
    qf[kk][2] = q0p[kk * 8 + 2 * t + 1]; qf[kk][3] = q1p[kk * 8 + 2 * t + 1];
  }
"""
        if spec.tile == "qreload":  # (re-read each tile from L1: 64 registers at head 128)
            qload = "  // the query fragments: re-read for each key tile (ts_ldg_f32, L1-resident)\n"
            split = ("      const float qf[1][4] = {{ts_ldg_f32(q0p + kk * 8 + 2 * t), ts_ldg_f32(q1p + kk * 8 + 2 * t),\n"
                     "                               ts_ldg_f32(q0p + kk * 8 + 2 * t + 1), ts_ldg_f32(q1p + kk * 8 + 2 * t + 1)}};\n")
        else:
            split = ""
        split += ("      unsigned ah[4], al[4];\n"
                 "#pragma unroll\n"
                 "      for (int i = 0; i < 4; i++) { ah[i] = ts_tf32(qf[kk][i]); al[i] = ts_tf32(qf[kk][i] - __uint_as_float(ah[i])); }\n"
                 if x3 else
                 "      unsigned ah[4];\n"
                 "#pragma unroll\n"
                 "      for (int i = 0; i < 4; i++) ah[i] = ts_tf32(qf[kk][i]);\n")
        if spec.tile == "qreload":
            split = split.replace("qf[kk][i]", "qf[0][i]")
        prod = ("        { unsigned bl[2] = {ts_tf32(k0 - __uint_as_float(bh[0])), ts_tf32(k1 - __uint_as_float(bh[1]))};\n"
                "          ts_mma_tf32_16x8x8(s[n], al, bh); ts_mma_tf32_16x8x8(s[n], ah, bl); }\n" if x3 else "")
        scores = f"""#pragma unroll
    for (int kk = 0; kk < D / 8; kk++) {{
{split}#pragma unroll
      for (int n = 0; n < BK / 8; n++) {{  // B = Kᵀ: key g's d 2t, 2t + 1 (one 8-byte load)
        const float2 kp = *(const float2*)(Ks + (n * 8 + g) * DP + kk * 8 + 2 * t);
        const float k0 = kp.x, k1 = kp.y;
        unsigned bh[2] = {{ts_tf32(k0), ts_tf32(k1)}};
{prod}        ts_mma_tf32_16x8x8(s[n], ah, bh);
      }}
    }}
"""
        psplit = ("      unsigned ph[4] = {ts_tf32(s[n][0]), ts_tf32(s[n][2]), ts_tf32(s[n][1]), ts_tf32(s[n][3])};\n"
                  + ("      unsigned pl[4] = {ts_tf32(s[n][0] - __uint_as_float(ph[0])), ts_tf32(s[n][2] - __uint_as_float(ph[1])),\n"
                     "                        ts_tf32(s[n][1] - __uint_as_float(ph[2])), ts_tf32(s[n][3] - __uint_as_float(ph[3]))};\n"
                     if x3 else ""))
        vprod = ("        { unsigned vl[2] = {ts_tf32(v0 - __uint_as_float(vh[0])), ts_tf32(v1 - __uint_as_float(vh[1]))};\n"
                 "          ts_mma_tf32_16x8x8(o[dn], pl, vh); ts_mma_tf32_16x8x8(o[dn], ph, vl); }\n" if x3 else "")
        pv = f"""#pragma unroll
    for (int n = 0; n < BK / 8; n++) {{  // P's columns t, t + 4 are keys 2t, 2t + 1 of the 8
{psplit}#pragma unroll
      for (int dn = 0; dn < D / 8; dn++) {{
        const float v0 = Vs[(n * 8 + 2 * t) * DP + dn * 8 + g], v1 = Vs[(n * 8 + 2 * t + 1) * DP + dn * 8 + g];
        unsigned vh[2] = {{ts_tf32(v0), ts_tf32(v1)}};
{vprod}        ts_mma_tf32_16x8x8(o[dn], ph, vh);
      }}
    }}
"""
    else:
        qload = """  unsigned qf[D / 16][4];  // A fragments of Q, two 16-bit values a register
  const unsigned short* q0s = (const unsigned short*)q0p;
  const unsigned short* q1s = (const unsigned short*)q1p;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const int c = kk * 16 + 2 * t;
    qf[kk][0] = (unsigned)q0s[c] | ((unsigned)q0s[c + 1] << 16);
    qf[kk][1] = (unsigned)q1s[c] | ((unsigned)q1s[c + 1] << 16);
    qf[kk][2] = (unsigned)q0s[c + 8] | ((unsigned)q0s[c + 9] << 16);
    qf[kk][3] = (unsigned)q1s[c + 8] | ((unsigned)q1s[c + 9] << 16);
  }
"""
        scores = f"""#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {{
#pragma unroll
      for (int n = 0; n < BK / 8; n++) {{  // B = Kᵀ: key g's d 2t, 2t + 1 and 2t + 8, 2t + 9
        const unsigned* kw = (const unsigned*)(Ks + (n * 8 + g) * DP + kk * 16 + 2 * t);
        unsigned b[2] = {{kw[0], kw[4]}};
        {mma}(s[n], qf[kk], b);
      }}
    }}
"""
        pv = f"""#pragma unroll
    for (int c = 0; c < BK / 16; c++) {{  // P (rounded to {T}) as the A operand: tiles 2c, 2c + 1
      unsigned p[4] = {{ts_pack(s[2 * c][0], s[2 * c][1]), ts_pack(s[2 * c][2], s[2 * c][3]),
                       ts_pack(s[2 * c + 1][0], s[2 * c + 1][1]), ts_pack(s[2 * c + 1][2], s[2 * c + 1][3])}};
#pragma unroll
      for (int dn = 0; dn < D / 8; dn++) {{
        const {S}* vc = Vs + (c * 16 + 2 * t) * DP + dn * 8 + g;
        unsigned b[2] = {{(unsigned)vc[0] | ((unsigned)vc[DP] << 16),
                         (unsigned)vc[8 * DP] | ((unsigned)vc[9 * DP] << 16)}};
        {mma}(o[dn], p, b);
      }}
    }}
"""
    elem = masked(spec, load)
    mask_rows = (f"  const {mask_t}* mrow[2] = {{MASK + b * msb + h * msh + (r0 < L ? r0 : L - 1) * msl,\n"
                 f"                         MASK + b * msb + h * msh + (r1 < L ? r1 : L - 1) * msl}};\n"
                 if spec.mask != "none" else "")
    mk = f"          const {mask_t}* mk = mrow[i >> 1];\n" if spec.mask != "none" else ""
    sink = (f"  m[0] = m[1] = {LOG2E!r}f * {load.format('SINKS[h]')};  // the sink's logit, once in a row's sum\n"
            "  if (t == 0) l[0] = l[1] = 1.f;\n" if spec.sinks else "")
    kend, edge = key_end(spec)
    def tile_load(vw: int, lt: str, pad: str) -> str:
        return (f"{pad}for (int i = threadIdx.x; i < BK * (D / {vw}); i += NT) {{\n"
                f"{pad}  const int row = i / (D / {vw}), c = (i % (D / {vw})) * {vw};\n"
                f"{pad}  const long long j = j0 + row;\n"
                f"{pad}  {lt} kv{{}}, vv{{}};\n"
                f"{pad}  if (j < kL) {{ kv = *(const {lt}*)(kr + j * ksl + c); vv = *(const {lt}*)(vr + j * vsl + c); }}\n"
                f"{pad}  *({lt}*)(Ks + row * DP + c) = kv;\n"
                f"{pad}  *({lt}*)(Vs + row * DP + c) = vv;\n"
                f"{pad}}}\n")

    if spec.vec:  # 16-byte loads where this call's rows start on 16 bytes (the strides do)
        tiles = ("    if (vec) {  // the tile's key and value rows\n" + tile_load(VW, LT, "      ")
                 + "    } else {\n" + tile_load(1, S, "      ") + "    }\n")
    else:
        tiles = tile_load(1, S, "    ")
    store = STORE[spec.dtype]
    return ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n" + PTX + pack + f"""
extern "C" __global__ void __launch_bounds__({THREADS}) {spec.name}({args}) {{
  constexpr int D = {D}, BQ = {BQ}, BK = {BK}, DP = {DP}, VW = {VW}, NT = {THREADS};
  // head size, query rows a CTA, keys a tile, a shared row's elements, elements a tile load
  const float LOWEST = {LOWEST};
  __shared__ __align__(16) {S} Ks[BK * DP];
  __shared__ __align__(16) {S} Vs[BK * DP];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const long long nqb = (L + BQ - 1) / BQ;
  const long long qb = nqb - 1 - (long long)blockIdx.x % nqb, bh = (long long)blockIdx.x / nqb;  // (the longest causal blocks first)
  const long long h = bh % H, b = bh / H, hk = h / (H / Hk);
  const long long r0 = qb * BQ + warp * 16 + g, r1 = r0 + 8;  // the lane's two rows
  const {S}* kr = (const {S}*)(K + b * ksb + hk * ksh);
  const {S}* vr = (const {S}*)(V + b * vsb + hk * vsh);
  const bool vec = ((unsigned long long)kr % 16 == 0) && ((unsigned long long)vr % 16 == 0);
  const {T}* q0p = Q + b * qsb + h * qsh + (r0 < L ? r0 : L - 1) * qsl;
  const {T}* q1p = Q + b * qsb + h * qsh + (r1 < L ? r1 : L - 1) * qsl;
{qload}{mask_rows}  const float sl = scale * {LOG2E!r}f;
  float o[D / 8][4];
#pragma unroll
  for (int dn = 0; dn < D / 8; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
  float m[2] = {{LOWEST, LOWEST}}, l[2] = {{0.f, 0.f}};  // rows r0, r1: running max (base 2), the lane's partial sum
{sink}{kend}  for (long long j0 = 0; j0 < kend; j0 += BK) {{
    __syncthreads();  // (the last tile's reads done)
{tiles}    __syncthreads();
    float s[BK / 8][4];
#pragma unroll
    for (int n = 0; n < BK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
{scores}    const bool edge = false{edge};
    float mt[2] = {{m[0], m[1]}};
#pragma unroll
    for (int n = 0; n < BK / 8; n++) {{
#pragma unroll
      for (int i = 0; i < 4; i++) {{
        float x = s[n][i] * sl;
        if (edge) {{
          const long long j = j0 + n * 8 + 2 * t + (i & 1), r = (i >> 1) ? r1 : r0;
{mk}          if (j >= kL) x = __int_as_float(0xff800000);
          else {{ {elem} }}
        }}
        s[n][i] = x;
        mt[i >> 1] = fmaxf(mt[i >> 1], x);
      }}
    }}
    float f[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {{  // the row's max over its four lanes, the rescale
      mt[e] = fmaxf(mt[e], __shfl_xor_sync(0xffffffffu, mt[e], 1));
      mt[e] = fmaxf(mt[e], __shfl_xor_sync(0xffffffffu, mt[e], 2));
      f[e] = ts_exp2(m[e] - mt[e]);
      m[e] = mt[e];
      l[e] *= f[e];
    }}
#pragma unroll
    for (int n = 0; n < BK / 8; n++) {{
#pragma unroll
      for (int i = 0; i < 4; i++) {{ s[n][i] = ts_exp2(s[n][i] - m[i >> 1]); l[i >> 1] += s[n][i]; }}
    }}
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) {{ o[dn][0] *= f[0]; o[dn][1] *= f[0]; o[dn][2] *= f[1]; o[dn][3] *= f[1]; }}
{pv}  }}
#pragma unroll
  for (int e = 0; e < 2; e++) {{
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 1);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 2);
  }}
  const float i0 = l[0] == 0.f ? 0.f : 1.f / l[0], i1 = l[1] == 0.f ? 0.f : 1.f / l[1];
  {T}* o0 = O + ((b * H + h) * L + r0) * D + 2 * t;
  {T}* o1 = O + ((b * H + h) * L + r1) * D + 2 * t;
#pragma unroll
  for (int dn = 0; dn < D / 8; dn++) {{
    if (r0 < L) {{ o0[dn * 8] = {store.format('o[dn][0] * i0')}; o0[dn * 8 + 1] = {store.format('o[dn][1] * i0')}; }}
    if (r1 < L) {{ o1[dn * 8] = {store.format('o[dn][2] * i1')}; o1[dn * 8 + 1] = {store.format('o[dn][3] * i1')}; }}
  }}
}}
""")


def all_specs() -> list:
    """Every fused kernel the prefill can ask for (the dialect tests render them)."""
    out = []
    for dt, precs in (("float32", ("tf32", "f32x3")), ("float16", ("",)), ("bfloat16", ("",))):
        for p in precs:
            for D in HEADS:
                for mask in ("none", "bool", "add"):
                    for causal in (False, True):
                        for sinks in (False, True):
                            for vec in (False, True):
                                for tile in ("",) + (f16.TILES if not p else ("qreload",)):
                                    s = FlashSpec("full", dt, D, mask, causal, sinks, p, vec, tile)
                                    if takes(s):
                                        out.append(s)
    return out


def aligned(strides, item: int) -> bool:
    """Whether 16-byte tile loads can read rows of these strides: every row / head / batch
    stride a multiple of 16 bytes (the kernel checks each call's base addresses itself)."""
    return all((s * item) % 16 == 0 for st in strides for s in st[:-1])


def launch(dtype: str, q_shape: tuple, q_strides: tuple, k_shape: tuple, k_strides: tuple,
           v_strides: tuple, mask: str, mask_strides, causal: bool, sinks: bool,
           precision: str, tile: str = "") -> tuple:
    """``(spec, ints, grid, block)`` of one call (strides in elements, each input's last 1;
    ``mask``: ``none``, ``bool``, ``add``; ``tile``: the half types' kernel, ``FlashSpec``'s)."""
    B, H, L, D = (int(n) for n in q_shape)
    Hk, kL = int(k_shape[1]), int(k_shape[2])
    item = 4 if dtype == "float32" else 2
    vec = aligned((k_strides, v_strides), item)
    spec = FlashSpec("full", dtype, D, mask, bool(causal), bool(sinks),
                     precision if dtype == "float32" else "", vec,
                     tile)
    ints = {"B": B, "H": H, "Hk": Hk, "L": L, "kL": kL,
            "qsb": q_strides[0], "qsh": q_strides[1], "qsl": q_strides[2],
            "ksb": k_strides[0], "ksh": k_strides[1], "ksl": k_strides[2],
            "vsb": v_strides[0], "vsh": v_strides[1], "vsl": v_strides[2]}
    if mask != "none":
        ints.update(zip(MASK_PARAMS, mask_strides))
    return spec, ints, grid(B, H, L, rows(spec)), threads(spec)
