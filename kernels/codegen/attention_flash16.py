"""The fused prefill attention kernel for float16 / bfloat16 on ldmatrix and cp.async
(FlashAttention-2's forward structure, Dao 2023, §3.1-3.3 and its ``flash_fwd_kernel.h``;
MLX's CUDA backend takes cuDNN's fused attention for these types,
mlx/backend/cuda/scaled_dot_product_attention.cpp).

A CTA of ``warps`` warps takes ``16 * mt * warps`` query rows of one (batch, query head);
warp ``w`` owns ``mt`` blocks of 16 rows and keeps their 16 x ``BK`` score tiles and 16 x D
float32 output accumulators in registers, and their query fragments: in registers (read once
from global memory), or with a ``q`` tile in shared memory, read by ``ldmatrix`` for each key
tile (FA2's default: at head 128 the registers then hold two 16-row blocks, 128 rows a CTA
of 4 warps, without spills). Key and value tiles (``BK`` rows) live in shared memory. Rows
of a multiple of 64 elements are XOR-swizzled (16-byte chunk ``c`` of row ``r`` at ``c ^ (r %
8)``, CUTLASS's Swizzle<3, 3, 3>), others padded by one 16-byte chunk (an odd number of chunks
a row); either way the eight rows one ``ldmatrix`` phase reads (eight consecutive keys or
queries at one column) fall in eight distinct groups of four banks: no conflicts (the host
shim counts the phases that have one). Tiles arrive by ``cp.async`` (16 bytes a thread, zero-filled past the
keys), overlapped as FlashAttention-2 overlaps them: the value tile ``j`` loads while
``S = Q Kᵀ`` and the softmax of tile ``j`` run, the key tile ``j + 1`` while ``O += P V`` runs
(one buffer of each, two waits and two barriers a tile). Layouts whose rows are not 16-byte
aligned load the tiles with element loads instead (same barriers).

Both products are ``mma.sync`` m16n8k16 with float32 accumulators: ``S``'s B operand (Kᵀ,
column-major: key rows) by ``ldmatrix.x4`` (two 8-key tiles x 16 head elements a load), ``P
V``'s (V: key-major) by ``ldmatrix.x4.trans``; ``P`` stays in registers (the m16n8k16
accumulator layout of two 8-key score tiles is the A operand's of 16 keys), rounded to the
inputs' type as cuDNN does. The online softmax keeps the running max in base 2 and the scale
folded in (``p = exp2(s * scale log2 e - m)``: one FFMA and one ``ex2.approx`` a score on
tiles with no mask, causal or key-tail element; a negative scale flips the query fragments'
signs, exact, so the raw scores' max is the scaled one's); the output is rescaled once a
tile, each lane's partial row sums are merged once at the end, one write (pairs of 16-bit
values a 32-bit store).

Semantics are ``attention_flash``'s (MLX's fallback: causal at the lower right, boolean masks'
False as float32's lowest, additive masks added, sinks, grouped heads, keys past ``kL``
weighing nothing). ``ldmatrix`` and ``cp.async`` are device functions (``ts_ldsm_x4``,
``ts_ldsm_x4_t``, ``ts_cp_async16``, ``ts_cp_async_commit``, ``ts_cp_async_wait_all``):
inline PTX on the GPU, warp-collective / deferred-copy emulations in tests/cuda_host_shim.h,
so this text runs on the host in the tests.
"""

from __future__ import annotations

import re

from .attention_cuda_common import LOG2E, LOWEST, declarations, key_end, masked, params
SMEM = 48 * 1024  # static shared memory a CTA
# the tile configurations the kernel takes: w<warps>m<16-row blocks a warp>k<keys a tile>,
# a trailing q: the query tile in shared memory too (ldmatrix'd each key tile; FA2's default)
TILES = ("w4m1k64", "w8m1k64", "w4m2k64", "w4m1k32", "w4m2k32", "w8m1k32", "w4m1k128",
         "w8m1k128", "w4m2k32q", "w4m2k64q", "w4m1k64q")


def parse(tile: str) -> tuple:
    """``(warps, mt, BK)`` of a tile name."""
    return parse_all(tile)[:3]


def parse_all(tile: str) -> tuple:
    """``(warps, mt, BK, q)`` of a tile name (``q``: the queries in shared memory)."""
    m = re.fullmatch(r"w(\d+)m(\d+)k(\d+)(q?)", tile)
    if m is None:
        raise ValueError(f"not a tile of the 16-bit fused attention kernel: {tile!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), bool(m.group(4))


def swizzled(head: int) -> bool:
    """Rows of a multiple of 64 elements (128 bytes) are stored XOR-swizzled (16-byte chunk
    ``c`` of row ``r`` at ``c ^ (r % 8)``: the eight rows an ldmatrix phase reads at one
    column land in eight bank groups; CUTLASS's Swizzle<3, 3, 3>, as FA2's shared layouts);
    others padded by one 16-byte chunk (an odd number of chunks a row: the same guarantee)."""
    return head % 64 == 0


def rows(tile: str) -> int:
    """Query rows a CTA."""
    w, mt, _ = parse(tile)
    return 16 * w * mt


def threads(tile: str) -> int:
    return 32 * parse(tile)[0]


def smem(head: int, tile: str) -> int:
    """Bytes of shared memory: one key and one value tile (and the query tile for ``q``)."""
    w, mt, bk, q = parse_all(tile)
    rs = head if swizzled(head) else head + 8
    return (2 * bk + (16 * w * mt if q else 0)) * rs * 2


def fits(head: int, tile: str) -> bool:
    """Whether ``tile`` takes ``head``: its shared memory fits, and two 16-row blocks a warp
    with the queries in registers only up to head 64 (at 128 their accumulators spill:
    ptxas, sm_90)."""
    w, mt, bk, q = parse_all(tile) if tile in TILES else (0, 0, 0, False)
    return (tile in TILES and head % 16 == 0 and smem(head, tile) <= SMEM
            and (mt == 1 or head <= 64 or q))


PTX = r"""#ifndef TS_CUDA_HOST_SHIM
static __device__ __forceinline__ unsigned ts_smem(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
// four 8x8 16-bit matrices: lane i gives the address of row i % 8 of matrix i / 8 (16
// bytes, aligned); register m gets the lane's (row g, columns 2t, 2t + 1) of matrix m
static __device__ __forceinline__ void ts_ldsm_x4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ts_smem(p)));
}
// the same transposed: register m gets (rows 2t, 2t + 1, column g) of matrix m, row 2t low
static __device__ __forceinline__ void ts_ldsm_x4_t(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ts_smem(p)));
}
// 16 bytes global -> shared without the registers, zero-filled where !ok
static __device__ __forceinline__ void ts_cp_async16(void* s, const void* g, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(ts_smem(s)), "l"(g), "r"(ok ? 16 : 0) : "memory");
}
static __device__ __forceinline__ void ts_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
static __device__ __forceinline__ void ts_cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
#endif
"""


def source(spec, T: str, mma: str, prelude: str) -> str:
    """The CUDA of ``spec`` (a 16-bit ``attention_flash.FlashSpec`` with a ``tile``): ``T``
    the element type, ``mma`` the m16n8k16 device function, ``prelude`` the device
    functions it shares with ``attention_flash`` (the mma, ``ts_exp2``, ``ts_pack``: two
    floats rounded to ``T``, packed)."""
    W, MT, BK, QS = parse_all(spec.tile)
    D = spec.head
    NT, BQ = 32 * W, 16 * W * MT
    SW = swizzled(D)
    RS = D if SW else D + 8  # a shared row's elements

    def at(row: str, col: str, sub: bool = False) -> str:
        """The shared offset of (row, col): col a multiple of 8 unless ``sub``."""
        if not SW:
            return f"({row}) * RS + ({col})"
        return (f"({row}) * RS + (((({col}) >> 3) ^ (({row}) & 7)) << 3)"
                + (f" + (({col}) & 7)" if sub else ""))
    mask_t = "bool" if spec.mask == "bool" else T
    load = "__half2float({})" if spec.dtype == "float16" else "__bfloat162float({})"
    args = declarations(spec, T, params(spec))

    elem = masked(spec, load)
    row = ("            const long long r = rw + 16 * mi + g + 8 * (i >> 1);\n" if spec.causal else "")
    mask_rows = (f"    mrow[mi][0] = MASK + b * msb + h * msh + (r0 < L ? r0 : L - 1) * msl;\n"
                 f"    mrow[mi][1] = MASK + b * msb + h * msh + (r1 < L ? r1 : L - 1) * msl;\n"
                 if spec.mask != "none" else "")
    mrow_decl = f"  const {mask_t}* mrow[MT][2];\n" if spec.mask != "none" else ""
    mk = f"            const {mask_t}* mk = mrow[mi][i >> 1];\n" if spec.mask != "none" else ""
    sink = (f"    m[mi][0] = m[mi][1] = {LOG2E!r}f * {load.format('SINKS[h]')};  // the sink's logit, once in a row's sum\n"
            "    if (t == 0) l[mi][0] = l[mi][1] = 1.f;\n" if spec.sinks else "")
    kend, edge = key_end(spec)

    def tile(dst: str, src: str, stride: str, n: str = "BK", lim: str = "kL", ok: str = "vec") -> str:
        async_ = (f"        for (int i = threadIdx.x; i < {n} * (D / 8); i += NT) {{\n"
                  f"          const int row = i / (D / 8), c = (i % (D / 8)) * 8;\n"
                  f"          const long long j = j0n + row;\n"
                  f"          ts_cp_async16({dst} + {at('row', 'c')}, {src} + (j < {lim} ? j : 0) * {stride} + c, j < {lim});\n"
                  f"        }}\n")
        plain = (f"        for (int i = threadIdx.x; i < {n} * D; i += NT) {{\n"
                 f"          const int row = i / D, c = i % D;\n"
                 f"          const long long j = j0n + row;\n"
                 f"          {dst}[{at('row', 'c', True)}] = j < {lim} ? {src}[j * {stride} + c] : (unsigned short)0;\n"
                 f"        }}\n")
        return (f"      if ({ok}) {{\n{async_}      }} else {{\n{plain}      }}\n"
                "      ts_cp_async_commit();\n")

    if QS:  # the query tile by cp.async with the first key tile, its fragments by ldmatrix
        qdecl = ""
        qregs = ""
        qtile = ("  {  // the CTA's query rows (rows past L zero-filled)\n"
                 "    const unsigned short* qr = (const unsigned short*)(Q + b * qsb + h * qsh);\n"
                 "    const bool qvec = ((unsigned long long)qr % 16 == 0) && (qsl % 8 == 0);\n"
                 "    const long long j0n = qb * BQ;\n"
                 + tile("Qs", "qr", "qsl", "BQ", "L", "qvec")
                 + "  }\n")
        qfrag = ("        unsigned qa[MT][4];  // A of the warp's rows 16 mi .., d 16 kk ..: four 8x8 matrices\n"
                 "#pragma unroll\n"
                 "        for (int mi = 0; mi < MT; mi++) {\n"
                 f"          ts_ldsm_x4(qa[mi], Qs + {at('warp * 16 * MT + 16 * mi + (lane & 15)', 'kk * 16 + (lane >> 4) * 8')});\n"
                 "          qa[mi][0] ^= flip; qa[mi][1] ^= flip; qa[mi][2] ^= flip; qa[mi][3] ^= flip;\n"
                 "        }\n")
        qa = "qa[mi]"
    else:
        qdecl = "  unsigned qf[MT][D / 16][4];  // A fragments of Q, two 16-bit values a register\n"
        qregs = """    const unsigned short* q0s = (const unsigned short*)(Q + b * qsb + h * qsh + (r0 < L ? r0 : L - 1) * qsl);
    const unsigned short* q1s = (const unsigned short*)(Q + b * qsb + h * qsh + (r1 < L ? r1 : L - 1) * qsl);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      const int c = kk * 16 + 2 * t;
      qf[mi][kk][0] = ((unsigned)q0s[c] | ((unsigned)q0s[c + 1] << 16)) ^ flip;
      qf[mi][kk][1] = ((unsigned)q1s[c] | ((unsigned)q1s[c + 1] << 16)) ^ flip;
      qf[mi][kk][2] = ((unsigned)q0s[c + 8] | ((unsigned)q0s[c + 9] << 16)) ^ flip;
      qf[mi][kk][3] = ((unsigned)q1s[c + 8] | ((unsigned)q1s[c + 9] << 16)) ^ flip;
    }
"""
        qtile = qfrag = ""
        qa = "qf[mi][kk]"

    def load_tile(dst, src, stride, pos):
        return f"    {{  // the {'key' if dst == 'Ks' else 'value'} tile at {pos}\n      const long long j0n = {pos};\n" + tile(dst, src, stride) + "    }\n"

    return ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n" + prelude + PTX + f"""
extern "C" __global__ void __launch_bounds__({NT}) {spec.name}({args}) {{
  constexpr int D = {D}, MT = {MT}, BQ = {BQ}, BK = {BK}, RS = {RS}, NT = {NT};
  // head size, 16-row blocks a warp, query rows a CTA, keys a tile, a shared row's elements
  const float LOWEST = {LOWEST};
  __shared__ __align__(128) unsigned short Ks[BK * RS];
  __shared__ __align__(128) unsigned short Vs[BK * RS];
{"  __shared__ __align__(128) unsigned short Qs[BQ * RS];" + chr(10) if QS else ""}
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const long long nqb = (L + BQ - 1) / BQ;
  const long long qb = nqb - 1 - (long long)blockIdx.x % nqb, bh = (long long)blockIdx.x / nqb;  // (the longest causal blocks first)
  const long long h = bh % H, b = bh / H, hk = h / (H / Hk);
  const long long rw = qb * BQ + warp * (16 * MT);  // the warp's first row
  const unsigned short* kr = (const unsigned short*)(K + b * ksb + hk * ksh);
  const unsigned short* vr = (const unsigned short*)(V + b * vsb + hk * vsh);
  const bool vec = ((unsigned long long)kr % 16 == 0) && ((unsigned long long)vr % 16 == 0)
                   && (ksl % 8 == 0) && (vsl % 8 == 0);
  float sl = scale * {LOG2E!r}f;
  unsigned flip = 0u;  // (a negative scale: the queries' signs flipped, the scale's dropped)
  if (sl < 0.f) {{ sl = -sl; flip = 0x80008000u; }}
{qdecl}{mrow_decl}  float o[MT][D / 8][4];
  float m[MT][2], l[MT][2];  // rows g, g + 8 of each block: running max (base 2), the lane's partial sum
#pragma unroll
  for (int mi = 0; mi < MT; mi++) {{
    const long long r0 = rw + 16 * mi + g, r1 = r0 + 8;
{qregs}{mask_rows}#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) o[mi][dn][0] = o[mi][dn][1] = o[mi][dn][2] = o[mi][dn][3] = 0.f;
    m[mi][0] = m[mi][1] = LOWEST;
    l[mi][0] = l[mi][1] = 0.f;
{sink}  }}
{kend}  // ldmatrix's row addresses: lane i reads row i % 8 of matrix i / 8
  const int krow = (lane >> 4) * 8 + (lane & 7), kcol = ((lane >> 3) & 1) * 8;  // K: (keys +8, d +8)
  const int vrow = ((lane >> 3) & 1) * 8 + (lane & 7), vcol = (lane >> 4) * 8;  // V: (keys +8, d +8)
{qtile}  if (kend > 0) {{
{load_tile("Ks", "kr", "ksl", "0")}  }}
  for (long long j0 = 0; j0 < kend; j0 += BK) {{
    ts_cp_async_wait_all();
    __syncthreads();  // the key tile in; every warp done with the last value tile
{load_tile("Vs", "vr", "vsl", "j0")}    float s[MT][BK / 8][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
      for (int n = 0; n < BK / 8; n++) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {{
{qfrag}#pragma unroll
      for (int np = 0; np < BK / 16; np++) {{  // Kᵀ of keys 16 np .. 16 np + 15: two B operands
        unsigned kb[4];
        ts_ldsm_x4(kb, Ks + {at("np * 16 + krow", "kk * 16 + kcol")});
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {{
          {mma}(s[mi][2 * np], {qa}, kb);
          {mma}(s[mi][2 * np + 1], {qa}, kb + 2);
        }}
      }}
    }}
    const bool edge = false{edge};
    const float mul = edge ? 1.f : sl;  // (edge tiles hold scaled scores, others raw ones)
#pragma unroll
    for (int mi = 0; mi < MT; mi++) {{
      float mt[2] = {{__int_as_float(0xff800000), __int_as_float(0xff800000)}};
#pragma unroll
      for (int n = 0; n < BK / 8; n++) {{
#pragma unroll
        for (int i = 0; i < 4; i++) {{
          if (edge) {{
            float x = s[mi][n][i] * sl;
            const long long j = j0 + n * 8 + 2 * t + (i & 1);
{row}{mk}            if (j >= kL) x = __int_as_float(0xff800000);
            else {{ {elem} }}
            s[mi][n][i] = x;
          }}
          mt[i >> 1] = fmaxf(mt[i >> 1], s[mi][n][i]);
        }}
      }}
      float f[2], nm[2];
#pragma unroll
      for (int e = 0; e < 2; e++) {{  // the row's max over its four lanes, the rescale
        mt[e] = fmaxf(mt[e], __shfl_xor_sync(0xffffffffu, mt[e], 1));
        mt[e] = fmaxf(mt[e], __shfl_xor_sync(0xffffffffu, mt[e], 2));
        nm[e] = fmaxf(m[mi][e], mt[e] * mul);
        f[e] = ts_exp2(m[mi][e] - nm[e]);
        m[mi][e] = nm[e];
        l[mi][e] *= f[e];
      }}
#pragma unroll
      for (int n = 0; n < BK / 8; n++) {{
#pragma unroll
        for (int i = 0; i < 4; i++) {{
          s[mi][n][i] = ts_exp2(fmaf(s[mi][n][i], mul, -nm[i >> 1]));
          l[mi][i >> 1] += s[mi][n][i];
        }}
      }}
#pragma unroll
      for (int dn = 0; dn < D / 8; dn++) {{
        o[mi][dn][0] *= f[0]; o[mi][dn][1] *= f[0]; o[mi][dn][2] *= f[1]; o[mi][dn][3] *= f[1];
      }}
    }}
    ts_cp_async_wait_all();
    __syncthreads();  // the value tile in; every warp done with the key tile
    if (j0 + BK < kend) {{
{load_tile("Ks", "kr", "ksl", "j0 + BK")}    }}
#pragma unroll
    for (int c = 0; c < BK / 16; c++) {{  // P (rounded to {T}) as the A operand: score tiles 2c, 2c + 1
      unsigned p[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; mi++) {{
        p[mi][0] = ts_pack(s[mi][2 * c][0], s[mi][2 * c][1]);
        p[mi][1] = ts_pack(s[mi][2 * c][2], s[mi][2 * c][3]);
        p[mi][2] = ts_pack(s[mi][2 * c + 1][0], s[mi][2 * c + 1][1]);
        p[mi][3] = ts_pack(s[mi][2 * c + 1][2], s[mi][2 * c + 1][3]);
      }}
#pragma unroll
      for (int dp = 0; dp < D / 16; dp++) {{  // V of keys 16 c .. 16 c + 15, d 16 dp ..: two B operands
        unsigned vb[4];
        ts_ldsm_x4_t(vb, Vs + {at("c * 16 + vrow", "dp * 16 + vcol")});
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {{
          {mma}(o[mi][2 * dp], p[mi], vb);
          {mma}(o[mi][2 * dp + 1], p[mi], vb + 2);
        }}
      }}
    }}
  }}
#pragma unroll
  for (int mi = 0; mi < MT; mi++) {{
    const long long r0 = rw + 16 * mi + g, r1 = r0 + 8;
    float inv[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {{
      float le = l[mi][e];
      le += __shfl_xor_sync(0xffffffffu, le, 1);
      le += __shfl_xor_sync(0xffffffffu, le, 2);
      inv[e] = le == 0.f ? 0.f : 1.f / le;
    }}
    unsigned* o0 = (unsigned*)(O + ((b * H + h) * L + r0) * D + 2 * t);
    unsigned* o1 = (unsigned*)(O + ((b * H + h) * L + r1) * D + 2 * t);
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) {{
      if (r0 < L) o0[dn * 4] = ts_pack(o[mi][dn][0] * inv[0], o[mi][dn][1] * inv[0]);
      if (r1 < L) o1[dn * 4] = ts_pack(o[mi][dn][2] * inv[1], o[mi][dn][3] * inv[1]);
    }}
  }}
}}
""")
