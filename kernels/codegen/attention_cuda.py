"""MLX's ``sdpa_vector`` (decoding: query lengths up to 8) as CUDA: MLX's CUDA backend's
``kernel_sdpav_1pass`` and, for long caches, its ``kernel_sdpav_2pass_1`` / ``_2``
(mlx/backend/cuda/scaled_dot_product_attention.cu; "flash decoding"), with the boolean and
additive masks the CPU's kernel takes (``attention_kernels.py``).

``vector``: one block of 32 warps x 32 lanes per (batch, query head, query row).
``vector_2pass_1``: one block of 8 warps (MLX's ``BN = 8``) per (batch, query head, query
row, run of ``chunk`` keys), ``NB`` runs a row, writing the run's partial state to ``part``
(the layout of ``attention_kernels.py``'s docstring, maxes in base 2); ``vector_2pass_2``:
one block per row merging its ``NB`` states into the output. Both key kernels share one
body. A key's D elements are spread over a group of ``lanes_per_key`` lanes (``elements`` =
ceil(D / lanes) each, the last ones past D reading nothing): 32 lanes for D >= 32 (MLX's
layout; D = 80 leaves the last lanes' third element empty), D lanes for a D that divides 32
(8, 16: a warp takes 32 / D keys at once). Warp ``w`` walks its keys ``k0 + 32 * w / lanes,
...`` in steps of the block's keys, ``UNROLL`` steps at once (their key and value rows
loaded before the first score is reduced: loads in flight); each key's score is a sum over
its group's lanes (the query pre-scaled by ``scale * log2(e)``, so scores are in base 2 and
``exp2`` is the exponential), then the group's running max ``m``, sum ``s`` and output ``o``
take the online softmax step. The groups of a warp merge by shuffles, then the warps' states
through shared memory (each warp's output row, its max and sum; thread ``d`` sums element
``d`` over the warps at their weights), written once: rounded to the inputs' type (one pass)
or as float32 partial states. MLX's CUDA backend takes head sizes 64, 96 and 128 here (others
go to cuDNN); these kernels take every head size up to 256.

MLX's semantics as the CPU's kernel: ``causal``: query ``l`` sees keys ``j <= l + kL - L``
(the run's end clipped there); a boolean mask's False gives the score float32's lowest (a
row with every key masked averages the values, as MLX's fallback); an additive mask is added
to the scaled score; ``sinks`` (one per query head) start warp 0's max (the first run's) at
the sink and its sum at 1. A row with no visible key is 0.

``splits`` picks the runs a row: two passes above ``SPLIT_KEYS`` keys (MLX's CUDA
``sdpa_vector_fallback``), as many runs as fill the device's first-pass slots once (its SM
count times the blocks an SM holds, device queries: MLX's Metal picks its ``blocks`` by the
device's size), runs of at least ``RUN_MIN`` keys, at most ``SPLITS_MAX`` (MLX's largest).
"""

from __future__ import annotations

from . import attention_cuda_common as common
from .attention_cuda_common import LOG2E, LOWEST, STORE, declarations
from .c_ops import Unsupported

TYPES = {"float32": ("float", "{}"), "float16": ("__half", "__half2float({})"),
         "bfloat16": ("__nv_bfloat16", "__bfloat162float({})")}
SPLIT_PARAMS = ("NB", "chunk")
MERGE_PARAMS = ("rows", "NB")
MODES = ("vector", "vector_2pass_1", "vector_2pass_2")
THREADS = 1024  # one pass: 32 warps of 32 lanes
SPLIT_THREADS = 256  # the split keys' pass: 8 warps (MLX's kernel_sdpav_2pass_1)
UNROLL = 2  # key steps a warp loads at once
SPLIT_KEYS = 1024  # two passes above this many keys (MLX's CUDA backend)
BLOCKS_PER_SM = 8  # first-pass blocks an SM holds where no occupancy query answers (2048 threads)
RUN_MIN = 64  # keys a run at least
SPLITS_MAX = 1024  # runs a row at most (MLX's Metal backend's largest ``blocks``)


def takes(spec) -> bool:
    """Whether the CUDA vector kernels take ``spec`` (an ``SdpaSpec``): decoding (one pass,
    split keys or their merge), a head size up to 256 (32 lanes x up to 8 elements), one of
    their dtypes."""
    return spec.mode in MODES and 0 < spec.head <= 256 and spec.dtype in TYPES


def lanes_per_key(head: int) -> int:
    """The lanes one key's elements are spread over: a group of ``head`` lanes where
    ``head`` divides 32 (a warp takes several keys at once), else the whole warp."""
    return head if head < 32 and 32 % head == 0 else 32


def split_step(head: int) -> int:
    """Keys the split pass's block takes a step (its warps' key groups, ``UNROLL`` steps):
    a run's length is a multiple of it."""
    return (SPLIT_THREADS // 32) * (32 // lanes_per_key(head)) * UNROLL


def splits(rows: int, kL: int, head: int, slots: int, blocks: int = 0) -> tuple:
    """(runs a row, keys a run) of a decoding call of ``rows`` = B * H * L query rows over
    ``kL`` keys on a device that runs ``slots`` first-pass blocks at once (its SMs times the
    blocks an SM holds): (1, kL), one pass, up to ``SPLIT_KEYS`` keys or where the rows
    alone fill the device; else as many runs as the slots take (one wave, no tail), each of
    at least ``RUN_MIN`` keys, at most ``SPLITS_MAX``. ``blocks`` > 0 asks for that many
    runs (MLX_SDPA_BLOCKS, as MLX's Metal backend takes it). A run's length is a multiple of
    ``split_step``, the last run shorter where the keys end, none empty."""
    if kL <= SPLIT_KEYS:
        return 1, kL
    n = blocks if blocks > 0 else slots // max(rows, 1)
    n = min(n, SPLITS_MAX, kL if blocks > 0 else kL // RUN_MIN)
    if n < 2:
        return 1, kL
    step = split_step(head)
    chunk = -(-(-(-kL // n)) // step) * step
    n = -(-kL // chunk)
    return (1, kL) if n < 2 else (n, chunk)


def params(spec) -> list:
    """The kernel's parameters in order: (kind, name), kind ``in`` / ``out`` (a buffer),
    ``int`` (int64) or ``float`` (float32)."""
    if spec.mode == "vector_2pass_2":
        return [("in", "part"), ("out", "out")] + [("int", n) for n in MERGE_PARAMS]
    if spec.mode == "vector_2pass_1":
        return common.params(spec, "part", SPLIT_PARAMS)
    return common.params(spec)


def block_threads(spec) -> int:
    """Threads a block of ``spec``'s kernel."""
    if spec.mode == "vector_2pass_2":
        return min(256, max(32, -(-spec.head // 32) * 32))
    return SPLIT_THREADS if spec.mode == "vector_2pass_1" else THREADS


PRELUDE = """#include <cuda_fp16.h>
#include <cuda_bf16.h>

static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
"""


def vector_source(spec) -> str:
    """The CUDA of ``spec``'s kernel (one pass, the split keys' pass or the merge), named
    ``spec.name``."""
    if not takes(spec):
        raise Unsupported(f"the CUDA vector kernel takes decoding with head sizes up to 256 "
                          f"in {', '.join(TYPES)} ({spec.name})")
    if spec.mode == "vector_2pass_2":
        return _merge_source(spec)
    T, load = TYPES[spec.dtype]
    store = STORE[spec.dtype]
    split = spec.mode == "vector_2pass_1"
    D = spec.head
    lpk = lanes_per_key(D)
    vpt = -(-D // lpk)
    kpw = 32 // lpk
    nw = block_threads(spec) // 32
    full = vpt * lpk == D  # every lane's elements inside the head
    mask_t = "bool" if spec.mask == "bool" else T
    args = declarations(spec, T, params(spec))
    if spec.mask == "bool":
        mask = f"        if (!mk[j * msk]) sc = {LOWEST};\n"
    elif spec.mask == "add":
        mask = f"        sc += {LOG2E!r}f * {load.format('mk[j * msk]')};\n"
    else:
        mask = ""
    mask_base = (f"  const {mask_t}* mk = MASK + b * msb + h * msh + l * msl;\n"
                 if spec.mask != "none" else "")
    guard = "" if full else "if (VPT * el + i < D) "
    first = "c == 0 && " if split else ""
    sink = (f"  if ({first}warp == 0 && sub == 0) {{ m = {LOG2E!r}f * {load.format('SINKS[h]')}; s = 1.f; }}\n"
            if spec.sinks else "")
    where = ("  const long long c = g % NB, r = g / NB;  // (row, run of keys)\n"
             "  const long long k0 = c * chunk;\n"
             "  long long k1 = k0 + chunk < kL ? k0 + chunk : kL;\n" if split else
             "  const long long r = g, k0 = 0;\n  long long k1 = kL;\n")
    clip = ("  if (kL - L + l + 1 < k1) k1 = kL - L + l + 1;  // the row's last visible key ends the run\n"
            if spec.causal else "")
    if split:
        write = f"""  if (threadIdx.x == 0) {{  // the run's max and sum after its output row
    const long long P = B * H * L * NB;
    PART[P * D + g] = mx;
    PART[P * D + P + g] = tot;
  }}
  for (int d = threadIdx.x; d < D; d += NW * 32) {{
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) acc += outs[w][d] * facs[w];
    PART[g * D + d] = acc;
  }}
"""
    else:
        write = f"""  const float inv = tot == 0.f ? 0.f : 1.f / tot;
  for (int d = threadIdx.x; d < D; d += NW * 32) {{
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) acc += outs[w][d] * facs[w];
    O[g * D + d] = {store.format('acc * inv')};
  }}
"""
    return PRELUDE + f"""
extern "C" __global__ void __launch_bounds__({nw * 32}) {spec.name}({args}) {{
  constexpr int D = {D}, LPK = {lpk}, VPT = {vpt}, KPW = {kpw}, NW = {nw}, U = {UNROLL};
  // lanes a key, elements a lane, keys a warp, warps a block, steps loaded at once
  __shared__ float outs[NW][D];
  __shared__ float maxs[NW], sums[NW], facs[NW];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / LPK, el = lane % LPK;  // the lane's key of the warp's, its elements
  const long long g = blockIdx.x;
{where}  const long long l = r % L, h = (r / L) % H, b = r / (L * H);  // (batch, head, query row)
{clip}  const long long hk = h / (H / Hk);
  const {T}* q = Q + b * qsb + h * qsh + l * qsl + VPT * el;
  const {T}* kr = K + b * ksb + hk * ksh + VPT * el;
  const {T}* vr = V + b * vsb + hk * vsh + VPT * el;
{mask_base}  const float sl = scale * {LOG2E!r}f;
  float qv[VPT], o[VPT];
#pragma unroll
  for (int i = 0; i < VPT; i++) {{ qv[i] = 0.f; o[i] = 0.f; {guard}qv[i] = sl * {load.format('q[i]')}; }}
  float m = {LOWEST}, s = 0.f;
{sink}  for (long long jb = k0 + (long long)warp * KPW; jb < k1; jb += NW * KPW * U) {{  // warp-uniform
    float scs[U], vv[U][VPT];
#pragma unroll
    for (int u = 0; u < U; u++) {{  // every step's key and value rows loaded first
      const long long j = jb + u * NW * KPW + sub;
      const long long jj = j < k1 ? j : k0;  // (a step past the run reads its first row)
      const {T}* kj = kr + jj * ksl;
      const {T}* vj = vr + jj * vsl;
      float sc = 0.f;
#pragma unroll
      for (int i = 0; i < VPT; i++) {{ {guard}sc += qv[i] * {load.format('kj[i]')}; vv[u][i] = 0.f; {guard}vv[u][i] = {load.format('vj[i]')}; }}
      scs[u] = sc;
    }}
#pragma unroll
    for (int x = LPK / 2; x > 0; x >>= 1)  // the steps' sums interleaved
#pragma unroll
      for (int u = 0; u < U; u++) scs[u] += __shfl_xor_sync(0xffffffffu, scs[u], x);
#pragma unroll
    for (int u = 0; u < U; u++) {{
      const long long j = jb + u * NW * KPW + sub;
      if (j < k1) {{
        float sc = scs[u];
{mask}        const float nm = fmaxf(m, sc), f = exp2f(m - nm), e = exp2f(sc - nm);
        m = nm;
        s = s * f + e;
#pragma unroll
        for (int i = 0; i < VPT; i++) o[i] = o[i] * f + e * vv[u][i];
      }}
    }}
  }}
  for (int x = LPK; x < 32; x <<= 1) {{  // the warp's key groups merged (all lanes alike after)
    const float m2 = __shfl_xor_sync(0xffffffffu, m, x), s2 = __shfl_xor_sync(0xffffffffu, s, x);
    const float nm = fmaxf(m, m2), f = exp2f(m - nm), f2 = exp2f(m2 - nm);
#pragma unroll
    for (int i = 0; i < VPT; i++) o[i] = o[i] * f + __shfl_xor_sync(0xffffffffu, o[i], x) * f2;
    s = s * f + s2 * f2;
    m = nm;
  }}
  if (lane == 0) {{ maxs[warp] = m; sums[warp] = s; }}
  if (sub == 0) {{
#pragma unroll
    for (int i = 0; i < VPT; i++) if (VPT * el + i < D) outs[warp][VPT * el + i] = o[i];
  }}
  __syncthreads();
  float mx = maxs[0];
#pragma unroll
  for (int w = 1; w < NW; w++) mx = fmaxf(mx, maxs[w]);
  if (threadIdx.x < NW) facs[threadIdx.x] = exp2f(maxs[threadIdx.x] - mx);
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int w = 0; w < NW; w++) tot += sums[w] * facs[w];
{write}}}
"""


def _merge_source(spec) -> str:
    """``vector_2pass_2``: a block per row (``MERGE_PARAMS``' ``rows``), each warp the row's
    max and weighted sum over its ``NB`` states (lanes over states, then shuffles), thread
    ``d`` its output element ``sum_c w_c o_c / sum_c w_c s_c`` (``w_c = exp2(m_c - M)``)."""
    T, _ = TYPES[spec.dtype]
    store = STORE[spec.dtype]
    D = spec.head
    return PRELUDE + f"""
extern "C" __global__ void __launch_bounds__({block_threads(spec)}) {spec.name}(const float* __restrict__ PART, {T}* __restrict__ O, long long rows, long long NB) {{
  constexpr int D = {D};
  const int lane = threadIdx.x & 31;
  const long long g = blockIdx.x, P = rows * NB;
  const float* pm = PART + P * D + g * NB;  // the row's maxes, then (P on) its sums
  const float* ps = pm + P;
  float mx = {LOWEST};
  for (long long c = lane; c < NB; c += 32) mx = fmaxf(mx, pm[c]);
  mx = warp_max(mx);
  float tot = 0.f;
  for (long long c = lane; c < NB; c += 32) tot += ps[c] * exp2f(pm[c] - mx);
  tot = warp_sum(tot);
  const float inv = tot == 0.f ? 0.f : 1.f / tot;
  const float* po = PART + g * NB * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {{
    float acc = 0.f;
    for (long long c = 0; c < NB; c++) acc += po[c * D + d] * exp2f(pm[c] - mx);
    O[g * D + d] = {store.format('acc * inv')};
  }}
}}
"""
