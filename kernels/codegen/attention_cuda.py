"""MLX's ``sdpa_vector`` (decoding: query lengths up to 8) as CUDA: MLX's CUDA backend's
``kernel_sdpav_1pass`` (mlx/backend/cuda/scaled_dot_product_attention.cu), with the
boolean and additive masks the CPU's kernel takes (``attention_kernels.py``).

One block of 32 warps x 32 lanes per (batch, query head, query row). A key's D elements
are spread over a group of ``lanes_per_key`` lanes (``elements`` = ceil(D / lanes) each,
the last ones past D reading nothing): 32 lanes for D >= 32 (MLX's layout; D = 80 leaves
the last lanes' third element empty), D lanes for a D that divides 32 (8, 16: a warp takes
32 / D keys at once). Warp ``w`` walks its keys ``32 * w / lanes, ...`` in steps of the
block's keys: each key's score is a sum over its group's lanes (the query pre-scaled by
``scale * log2(e)``, so scores are in base 2 and ``exp2`` is the exponential), then the
group's running max ``m``, sum ``s`` and output ``o`` take the online softmax step. The
groups of a warp merge by shuffles, then the 32 warps' states through shared memory: a
warp's lane ``i`` reads warp ``i``'s max and sum, the outputs go through a transposed tile so
each warp sums one run of ``elements`` output elements, and lane 0 of each warp writes its
run, rounded once to the inputs' type. MLX's CUDA backend takes head sizes 64, 96 and 128
here (others go to cuDNN); this kernel takes every head size up to 256.

MLX's semantics as the CPU's kernel: ``causal``: query ``l`` sees keys ``j <= l + kL - L``;
a boolean mask's False gives the score float32's lowest (a row with every key masked
averages the values, as MLX's fallback); an additive mask is added to the scaled score;
``sinks`` (one per query head) start warp 0's max at the sink and its sum at 1.
"""

from __future__ import annotations

from .c_ops import Unsupported

LOG2E = 1.4426950408889634
TYPES = {"float32": ("float", "{}"), "float16": ("__half", "__half2float({})"),
         "bfloat16": ("__nv_bfloat16", "__bfloat162float({})")}
STORE = {"float32": "{}", "float16": "__float2half_rn({})", "bfloat16": "__float2bfloat16_rn({})"}
PARAMS = ("B", "H", "Hk", "L", "kL", "qsb", "qsh", "qsl", "ksb", "ksh", "ksl", "vsb", "vsh",
          "vsl")
MASK_PARAMS = ("msb", "msh", "msl", "msk")
THREADS = 1024  # 32 warps of 32 lanes


def takes(spec) -> bool:
    """Whether the CUDA vector kernel takes ``spec`` (an ``SdpaSpec``): decoding, a head size
    up to 256 (32 lanes x up to 8 elements), one of its dtypes."""
    return spec.mode == "vector" and 0 < spec.head <= 256 and spec.dtype in TYPES


def lanes_per_key(head: int) -> int:
    """The lanes one key's elements are spread over: a group of ``head`` lanes where
    ``head`` divides 32 (a warp takes several keys at once), else the whole warp."""
    return head if head < 32 and 32 % head == 0 else 32


def params(spec) -> list:
    """The kernel's parameters in order: (kind, name), kind ``in`` / ``out`` (a buffer),
    ``int`` (int64) or ``float`` (float32)."""
    ps = [("in", "q"), ("in", "k"), ("in", "v")]
    if spec.mask != "none":
        ps.append(("in", "mask"))
    if spec.sinks:
        ps.append(("in", "sinks"))
    ps.append(("out", "out"))
    ps += [("int", n) for n in PARAMS + (MASK_PARAMS if spec.mask != "none" else ())]
    return ps + [("float", "scale")]


def vector_source(spec) -> str:
    """The CUDA of ``spec``'s vector kernel, named ``spec.name``."""
    if not takes(spec):
        raise Unsupported(f"the CUDA vector kernel takes decoding with head sizes up to 256 "
                          f"in {', '.join(TYPES)} ({spec.name})")
    T, load = TYPES[spec.dtype]
    store = STORE[spec.dtype]
    D = spec.head
    lpk = lanes_per_key(D)
    vpt = -(-D // lpk)
    kpw = 32 // lpk
    full = vpt * lpk == D  # every lane's elements inside the head
    mask_t = "bool" if spec.mask == "bool" else T
    args = [f"const {T}* __restrict__ Q", f"const {T}* __restrict__ K", f"const {T}* __restrict__ V"]
    if spec.mask != "none":
        args.append(f"const {mask_t}* __restrict__ MASK")
    if spec.sinks:
        args.append(f"const {T}* __restrict__ SINKS")
    args.append(f"{T}* __restrict__ O")
    args += [f"long long {n}" for n in PARAMS + (MASK_PARAMS if spec.mask != "none" else ())]
    args.append("float scale")
    lowest = "(-3.402823466e+38f)"
    if spec.mask == "bool":
        mask = f"      if (!mk[j * msk]) sc = {lowest};\n"
    elif spec.mask == "add":
        mask = f"      sc += {LOG2E!r}f * {load.format('mk[j * msk]')};\n"
    else:
        mask = ""
    mask_base = (f"  const {mask_t}* mk = MASK + b * msb + h * msh + l * msl;\n"
                 if spec.mask != "none" else "")
    guard = "" if full else "if (VPT * el + i < D) "
    causal = ("    if (jb > kL - L + l) break;  // keys only grow: none later is visible\n"
              if spec.causal else "")
    visible = "j < kL" + (" && j <= kL - L + l" if spec.causal else "")
    sink = (f"  if (warp == 0 && sub == 0) {{ m = {LOG2E!r}f * {load.format('SINKS[h]')}; s = 1.f; }}\n"
            if spec.sinks else "")
    return f"""#include <cuda_fp16.h>
#include <cuda_bf16.h>

static __device__ __forceinline__ float warp_sum(float v) {{
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}}
static __device__ __forceinline__ float warp_max(float v) {{
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}}

extern "C" __global__ void __launch_bounds__({THREADS}) {spec.name}({", ".join(args)}) {{
  constexpr int D = {D}, LPK = {lpk}, VPT = {vpt}, KPW = {kpw};  // lanes a key, elements a lane, keys a warp
  __shared__ float outs[32][33];
  __shared__ float maxs[32], sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / LPK, el = lane % LPK;  // the lane's key of the warp's, its elements
  const long long g = blockIdx.x;  // (batch, head, query row)
  const long long l = g % L, h = (g / L) % H, b = g / (L * H);
  const long long hk = h / (H / Hk);
  const {T}* q = Q + b * qsb + h * qsh + l * qsl + VPT * el;
  const {T}* kr = K + b * ksb + hk * ksh + VPT * el;
  const {T}* vr = V + b * vsb + hk * vsh + VPT * el;
{mask_base}  const float sl = scale * {LOG2E!r}f;
  float qv[VPT], o[VPT];
#pragma unroll
  for (int i = 0; i < VPT; i++) {{ qv[i] = 0.f; o[i] = 0.f; {guard}qv[i] = sl * {load.format('q[i]')}; }}
  float m = {lowest}, s = 0.f;
{sink}  for (long long jb = (long long)warp * KPW; jb < kL; jb += 32 * KPW) {{  // warp-uniform
{causal}    const long long j = jb + sub;
    const bool seen = {visible};
    const {T}* kj = kr + (seen ? j : 0) * ksl;
    float sc = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; i++) {guard}sc += qv[i] * {load.format('kj[i]')};
    for (int x = LPK / 2; x > 0; x >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, x);
    if (seen) {{
{mask}      const float nm = fmaxf(m, sc), f = exp2f(m - nm), e = exp2f(sc - nm);
      m = nm;
      s = s * f + e;
      const {T}* vj = vr + j * vsl;
#pragma unroll
      for (int i = 0; i < VPT; i++) {{ float vv = 0.f; {guard}vv = {load.format('vj[i]')}; o[i] = o[i] * f + e * vv; }}
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
  __syncthreads();
  const float mw = maxs[lane], nm = warp_max(mw), f = exp2f(mw - nm);
  float tot = warp_sum(sums[lane] * f);
  tot = tot == 0.f ? 0.f : 1.f / tot;
#pragma unroll
  for (int i = 0; i < VPT; i++) {{
    outs[lane][warp] = o[i];  // lane's elements VPT * el + i, warp's keys
    __syncthreads();
    o[i] = warp_sum(outs[warp][lane] * f) * tot;  // elements VPT * warp + i, every warp's keys
    __syncthreads();
  }}
  if (lane == 0 && warp < LPK) {{
    {T}* out = O + ((b * H + h) * L + l) * D + VPT * warp;
#pragma unroll
    for (int i = 0; i < VPT; i++) if (VPT * warp + i < D) out[i] = {store.format('o[i]')};
  }}
}}
"""
