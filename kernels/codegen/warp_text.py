"""One kernel text, two builds: the macros under which a kernel written over blocks, warps and
lanes (``FOR_BLOCK_WARP``, ``FOR_LANE``, ``WARP_SUM``, ``LEADER``) is CUDA (a warp's 32
threads, shuffles) or C (the grid's blocks, warps and lanes walked in order: the stand-in
driver's build of a packed launch, and the Kernels tab's C). ``qmv_cuda.py`` (MLX's qmv,
its gather and dequant forms) and ``gemv_cuda.py`` (MLX's gemv) are written this way.

The storage types: T, ``LOAD`` (a T as float), ``STORE`` (a float rounded to T, to nearest
even), ``FROM_WORDS(w, j)`` (element j of 16-byte words as float), ``LOADW4`` / ``LOADW2``
(16 / 8 bytes as words), ``STORE16W`` (four words to 16 bytes), ``FBITS`` (a word's float).
"""

from __future__ import annotations

# (the storage type, a T as float, a float rounded to T, element j of 16-byte words as float)
CU_TYPES = {
    "float32": ("float", "({})", "({})", "__uint_as_float((w)[j])"),
    "float16": ("__half", "__half2float({})", "__float2half_rn({})",
                "__half2float(__ushort_as_half((unsigned short)((w)[(j) >> 1] >> (16 * ((j) & 1)))))"),
    "bfloat16": ("__nv_bfloat16", "__bfloat162float({})", "__float2bfloat16_rn({})",
                 "__uint_as_float(((j) & 1) ? ((w)[(j) >> 1] & 0xffff0000u) : ((w)[(j) >> 1] << 16))"),
}
C_TYPES = {
    "float32": ("float", "({})", "({})", "u32_float((w)[j])"),
    "float16": ("_Float16", "((float)({}))", "((_Float16)({}))",
                "u16_half((uint16_t)((w)[(j) >> 1] >> (16 * ((j) & 1))))"),
    "bfloat16": ("uint16_t", "bf16_float({})", "float_bf16({})",
                 "u32_float(((j) & 1) ? ((w)[(j) >> 1] & 0xffff0000u) : ((w)[(j) >> 1] << 16))"),
}


def cuda_prelude(dtype: str) -> str:
    """The CUDA side: one thread a lane, a warp's sum by shuffles."""
    T, load, store, words = CU_TYPES[dtype]
    return f"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef unsigned int uint32_t;
#define T {T}
#define LOAD(v) {load.format('v')}
#define STORE(v) {store.format('v')}
#define FBITS(u) __uint_as_float(u)
#define DEVFN static __device__ __forceinline__
#define FROM_WORDS(w, j) {words}
#define LOADW4(words, src) do {{ const uint4 u_ = *(const uint4*)(src); \\
  (words)[0] = u_.x; (words)[1] = u_.y; (words)[2] = u_.z; (words)[3] = u_.w; }} while (0)
#define LOADW2(words, src) do {{ const uint2 u_ = *(const uint2*)(src); \\
  (words)[0] = u_.x; (words)[1] = u_.y; }} while (0)
#define STORE16W(dst, words) (*(uint4*)(dst) = make_uint4((words)[0], (words)[1], (words)[2], (words)[3]))
#define ADDR(p) ((unsigned long long)(p))
#define UNROLL _Pragma("unroll")
#define FOR_BLOCK_WARP(blk, warp) \\
  for (long long blk = blockIdx.x, warp = threadIdx.x >> 5, _once = 1; _once; _once = 0)
#define FOR_LANE(lane) for (int lane = threadIdx.x & 31, _one = 1; _one; _one = 0)
#define LEADER if ((threadIdx.x & 31) == 0)
static __device__ __forceinline__ float WARP_SUM(float v) {{
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}}
"""


def c_prelude(dtype: str) -> str:
    """The C side: the blocks of ``B * ceil(N / WARPS)`` and their warps and lanes in order
    (the kernel defines ``B``, ``N``, ``WARPS``), a warp's sum its lanes' running sum."""
    T, load, store, words = C_TYPES[dtype]
    return f"""#include <stdint.h>
#include <string.h>
#include <math.h>
static inline float u32_float(uint32_t u) {{
  float f;
  memcpy(&f, &u, 4);
  return f;
}}
static inline float u16_half(uint16_t u) {{
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}}
static inline float bf16_float(uint16_t h) {{ return u32_float((uint32_t)h << 16); }}
static inline uint32_t float_u32(float f) {{
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}}
static inline uint32_t half_u16(float f) {{
  const _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}}
static inline uint16_t float_bf16(float f) {{  /* round to nearest even, NaN kept quiet */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}}
#define T {T}
#define LOAD(v) {load.format('v')}
#define STORE(v) {store.format('v')}
#define FBITS(u) u32_float(u)
#define DEVFN static inline
#define FROM_WORDS(w, j) {words}
#define LOADW4(words, src) memcpy((words), (src), 16)
#define LOADW2(words, src) memcpy((words), (src), 8)
#define STORE16W(dst, words) memcpy((dst), (words), 16)
#define ADDR(p) ((uintptr_t)(p))
#define UNROLL
#define FOR_BLOCK_WARP(blk, warp) \\
  for (long long blk = 0; blk < B * ((N + WARPS - 1) / WARPS); blk++) \\
    for (long long warp = 0; warp < WARPS; warp++)
#define FOR_LANE(lane) for (int lane = 0; lane < 32; lane++)
#define LEADER
#define WARP_SUM(v) (v)
"""


def c_head(name: str, params, bufs: dict) -> str:
    """The C entry ``void name(void** args)``: each parameter unpacked from ``args`` (a
    buffer as ``bufs[name] = (its name in the text, its C type)``, an int as long long)."""
    unpack = []
    for i, (k, n) in enumerate(params):
        if k == "int":
            unpack.append(f"const long long {n} = (long long)(intptr_t)args[{i}];")
        else:
            var, ty = bufs[n]
            unpack.append(f"{ty} {var} = ({ty})args[{i}];")
    return f"void {name}(void** args) {{\n  " + "\n  ".join(unpack)
