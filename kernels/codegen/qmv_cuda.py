"""MLX's affine ``qmv`` (a few rows times a transposed 4- or 8-bit weight) as one kernel text
rendered twice: CUDA (the GPU's kernel, ``cuda/quantized.py``'s plan) and C (the same
loops with the grid, its warps and lanes walked in order: the stand-in driver's build of a
packed launch, and the Kernels tab's C).

The mechanism is MLX's CUDA ``qmv_kernel`` (mlx/backend/cuda/quantized/qmm/qmv.cu): a block
of ``WARPS`` warps, each warp one output column ``n`` (a row of the packed weight), its
lanes striding over K in runs of ``EPT`` codes (16 bytes of the weight: 32 4-bit or 16
8-bit codes, inside one group since every group size is a multiple), a warp reduction at
the end. Unlike MLX's kernel, which gives each row of x its own block (``grid.y``), a warp
here multiplies its weight row into every one of the call's ``ROWS`` rows (at most
``MAX_ROWS``) while the decoded codes sit in registers, so the weight is read once for all
of them. A run is ``sum_j x_j (c_j s + b) = s sum_j x_j c_j + b sum_j x_j`` (MLX's
``qdot``, mlx/backend/metal/kernels/quantized.h), in float32 whatever the storage type;
x, scales, biases and the output are one type (``quantized_matmul`` casts them to the
output's), read in their own bits (float16, bfloat16) and the result rounded once.

One launch covers a batch: the grid is one dimension, ``B * ceil(N / WARPS)`` blocks; entry
``bb``'s x, weight, scales and biases start ``bb`` times their batch stride in (0: a
broadcast operand). x's rows are ``x_rs`` elements apart with unit-stride columns; the
weight, scales and biases are row-contiguous matrices. Where x's rows, the weight and x's
row stride are 16-byte aligned the runs are read as ``uint4`` vectors, else element by
element (a warp-uniform choice, made per launch from the pointers).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ROWS = 8  # rows one qmv call multiplies (MLX's CUDA qmv below M * B = 8)
WARPS = 8  # output columns (warps) per block, MLX's rows_per_block
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
TYPES = ("float32", "float16", "bfloat16")
INTS = ("B", "N", "K", "x_rs", "x_bs", "w_bs", "s_bs", "b_bs")
DEQUANT_INTS = ("total", "N", "K", "w_bs", "s_bs", "b_bs")
DEQUANT_THREADS = 256


@dataclass(frozen=True)
class QmvSpec:
    """One kernel: the storage type of x / scales / biases / output, the code width, the
    group size and the rows per call (all compile-time, as MLX's template parameters);
    ``rows`` 0 is the ``dequant`` form (the weight as a (batch, N, K) matrix of the type)."""

    dtype: str
    bits: int
    group_size: int
    rows: int

    @property
    def form(self) -> str:
        return "qmv" if self.rows else "dequant"

    @property
    def name(self) -> str:  # MLX's kernel naming (affine_qmv_float16_t_gs_64_b_4)
        tail = f"_m_{self.rows}" if self.rows else ""
        return f"affine_{self.form}_{self.dtype}_gs_{self.group_size}_b_{self.bits}{tail}"

    @property
    def layout(self) -> str:
        rows = f" x {self.rows} rows" if self.rows else ""
        return f"{self.form} {self.dtype} {self.bits}-bit gs {self.group_size}{rows}"

    lib_name = property(lambda self: self.name)

    def params(self) -> list:
        """(kind, name) in argument order: ``in`` / ``out`` pointers, then int64 values."""
        if not self.rows:
            return ([("in", "w"), ("in", "scales"), ("in", "biases"), ("out", "out")]
                    + [("int", n) for n in DEQUANT_INTS])
        return ([("in", "x"), ("in", "w"), ("in", "scales"), ("in", "biases"), ("out", "out")]
                + [("int", n) for n in INTS])

    def sources(self, built: dict) -> dict:
        """The Kernels tab's three: CUDA, its C build, and why there is no Metal one."""
        return {"cpu": built.get("cpu") or c_source(self),
                "cuda": built.get("cuda") or cuda_source(self),
                "metal": "// no MSL qmv kernel: Metal runs the quantized products' rule"}


def takes(dtype: str, bits: int, group_size: int, rows: int) -> bool:
    """Whether a kernel of this type, width and group size exists for ``rows`` (0: dequant)."""
    return dtype in TYPES and bits in BITS and group_size in GROUP_SIZES and 0 <= rows <= MAX_ROWS


# The kernel's text: the dialects define T, LOAD / STORE (a T to and from float), LOAD16W (16
# bytes into four words), FROM_WORDS (element j of such words as float), the grid's loops
# (FOR_BLOCK_WARP, FOR_LANE), WARP_SUM and LEADER (lane 0 of the warp). In CUDA the loops run
# once per thread (its block, warp and lane); in C they walk every block, warp and lane, the
# lanes' sums falling into one accumulator.
_BODY = """
#define ROWS {rows}
#define BITS {bits}
#define GS {gs}
#define WARPS {warps}
#define EPT (128 / BITS)          /* codes per lane per step: 16 bytes of the weight */
#define XV (EPT * (int)sizeof(T) / 16)  /* 16-byte vectors of x per run */
#define MASK ((1u << BITS) - 1u)
/* the 16 bytes of the weight row's run at code k (vec: one 16-byte load) */
#define LOAD_RUN(words, k) do {{ \\
    if (vec) {{ LOAD16W(words, wr + (k) * BITS / 32); }} \\
    else {{ for (int q_ = 0; q_ < 4; q_++) (words)[q_] = wr[(k) * BITS / 32 + q_]; }} \\
  }} while (0)

KERNEL_HEAD {{
  const long long nblk = (N + WARPS - 1) / WARPS, G = K / GS, wrow = K * BITS / 32;
  FOR_BLOCK_WARP(blk, warp) {{
    const long long bb = blk / nblk, n = (blk % nblk) * WARPS + warp;
    if (n < N) {{  /* warp-uniform */
      const uint32_t* wr = W + bb * w_bs + n * wrow;
      const T* sr = S + bb * s_bs + n * G;
      const T* br = BI + bb * b_bs + n * G;
      const T* xb = X + bb * x_bs;
      const int vec = ((ADDR(wr) | ADDR(xb)) & 15) == 0 && ((x_rs * (long long)sizeof(T)) & 15) == 0;
      float acc[ROWS];
      for (int m = 0; m < ROWS; m++) acc[m] = 0.0f;
      FOR_LANE(lane) {{
        /* the next run's weight words are loaded before this run's products (a second
           load in flight per lane for four registers, not an unrolled loop's dozens) */
        uint32_t wn[4] = {{0u, 0u, 0u, 0u}};
        if ((long long)lane * EPT < K) LOAD_RUN(wn, (long long)lane * EPT);
        for (long long k0 = (long long)lane * EPT; k0 < K; k0 += 32 * EPT) {{
          uint32_t wd[4];
          for (int q = 0; q < 4; q++) wd[q] = wn[q];
          if (k0 + 32 * EPT < K) LOAD_RUN(wn, k0 + 32 * EPT);
          float c[EPT];
          UNROLL
          for (int j = 0; j < EPT; j++) c[j] = (float)((wd[(j * BITS) / 32] >> ((j * BITS) % 32)) & MASK);
          const long long g = k0 / GS;
          const float s = LOAD(sr[g]), b = LOAD(br[g]);
          UNROLL
          for (int m = 0; m < ROWS; m++) {{
            const T* xr = xb + m * x_rs + k0;
            float xf[EPT];
            if (vec) {{
              uint32_t xw[4 * XV];
              UNROLL
              for (int q = 0; q < XV; q++) LOAD16W(xw + 4 * q, (const uint32_t*)xr + 4 * q);
              UNROLL
              for (int j = 0; j < EPT; j++) xf[j] = FROM_WORDS(xw, j);
            }} else {{
              UNROLL
              for (int j = 0; j < EPT; j++) xf[j] = LOAD(xr[j]);
            }}
            float dot = 0.0f, xsum = 0.0f;
            UNROLL
            for (int j = 0; j < EPT; j++) {{
              dot = fmaf(xf[j], c[j], dot);
              xsum += xf[j];
            }}
            acc[m] += fmaf(s, dot, b * xsum);
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

# The dequant form: a thread per run of EPT codes (16 bytes of the weight), its values
# c * s + b rounded once to T and stored as 16-byte words (the tile is row-contiguous and
# 16-byte aligned: a fresh buffer); FOR_THREAD is the thread's index (C: every index).
_DEQUANT = """
#define BITS {bits}
#define GS {gs}
#define EPT (128 / BITS)
#define XV (EPT * (int)sizeof(T) / 16)
#define MASK ((1u << BITS) - 1u)

KERNEL_HEAD {{
  const long long G = K / GS, wrow = K * BITS / 32, per_row = K / EPT;
  const int vec = (ADDR(W) & 15) == 0 && ((w_bs * 4) & 15) == 0;
  FOR_THREAD(t) {{
    if (t < total) {{
      const long long row = t / per_row, k0 = (t % per_row) * EPT, bb = row / N, n = row % N;
      const uint32_t* wr = W + bb * w_bs + n * wrow + k0 * BITS / 32;
      uint32_t wd[4];
      if (vec) {{
        LOAD16W(wd, wr);
      }} else {{
        for (int q = 0; q < 4; q++) wd[q] = wr[q];
      }}
      const long long g = k0 / GS;
      const float s = LOAD(S[bb * s_bs + n * G + g]), b = LOAD(BI[bb * b_bs + n * G + g]);
      uint32_t ow[4 * XV];
      UNROLL
      for (int q = 0; q < 4 * XV; q++) ow[q] = 0u;
      UNROLL
      for (int j = 0; j < EPT; j++) {{
        const float c = (float)((wd[(j * BITS) / 32] >> ((j * BITS) % 32)) & MASK);
        TO_WORDS(ow, j, fmaf(c, s, b));
      }}
      uint32_t* o = (uint32_t*)(OUT + row * K + k0);
      UNROLL
      for (int q = 0; q < XV; q++) STORE16W(o + 4 * q, ow + 4 * q);
    }}
  }}
}}
"""

# (the storage type, a T as float, a float rounded to T, element j of x's 16-byte words as float)
_CU_TYPES = {
    "float32": ("float", "({})", "({})", "__uint_as_float((w)[j])"),
    "float16": ("__half", "__half2float({})", "__float2half_rn({})",
                "__half2float(__ushort_as_half((unsigned short)((w)[(j) >> 1] >> (16 * ((j) & 1)))))"),
    "bfloat16": ("__nv_bfloat16", "__bfloat162float({})", "__float2bfloat16_rn({})",
                 "__uint_as_float(((j) & 1) ? ((w)[(j) >> 1] & 0xffff0000u) : ((w)[(j) >> 1] << 16))"),
}
_C_TYPES = {
    "float32": ("float", "({})", "({})", "u32_float((w)[j])"),
    "float16": ("_Float16", "((float)({}))", "((_Float16)({}))",
                "u16_half((uint16_t)((w)[(j) >> 1] >> (16 * ((j) & 1))))"),
    "bfloat16": ("uint16_t", "bf16_float({})", "float_bf16({})",
                 "u32_float(((j) & 1) ? ((w)[(j) >> 1] & 0xffff0000u) : ((w)[(j) >> 1] << 16))"),
}
# a float rounded to T as its bits (a word for float32, half a word for the 16-bit types)
_CU_BITS = {"float32": "__float_as_uint({})",
            "float16": "(uint32_t)__half_as_ushort(__float2half_rn({}))",
            "bfloat16": "(uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn({}))"}
_C_BITS = {"float32": "float_u32({})", "float16": "half_u16({})", "bfloat16": "(uint32_t)float_bf16({})"}


def _to_words(dtype: str, bits: dict) -> str:
    v = bits[dtype].format("(v)")
    if dtype == "float32":
        return f"#define TO_WORDS(w, j, v) ((w)[j] = {v})\n"
    return f"#define TO_WORDS(w, j, v) ((w)[(j) >> 1] |= {v} << (16 * ((j) & 1)))\n"


_BUFS = {"x": ("X", "const T*"), "w": ("W", "const uint32_t*"), "scales": ("S", "const T*"),
         "biases": ("BI", "const T*"), "out": ("OUT", "T*")}


def _signature(spec: QmvSpec) -> str:
    return ", ".join(f"{_BUFS[n][1]} __restrict__ {_BUFS[n][0]}" if k != "int" else f"long long {n}"
                     for k, n in spec.params())


def _body(spec: QmvSpec, head: str) -> str:
    text = _BODY if spec.rows else _DEQUANT
    return text.format(rows=spec.rows, bits=spec.bits, gs=spec.group_size,
                       warps=WARPS).replace("KERNEL_HEAD {", head, 1)


def cuda_source(spec: QmvSpec) -> str:
    """The CUDA of ``spec``: ``WARPS * 32`` threads a block, a one-dimensional grid."""
    T, load, store, words = _CU_TYPES[spec.dtype]
    threads = WARPS * 32 if spec.rows else DEQUANT_THREADS
    # one row: four blocks an SM (64 registers; ptxas spills a word or two), so the 512
    # blocks of a 4096-column weight are one wave on an H100's 132 SMs (69 registers: three)
    bounds = f"{threads}, 4" if spec.rows == 1 else f"{threads}"
    head = (f'extern "C" __global__ void __launch_bounds__({bounds}) '
            f"{spec.name}({_signature(spec)}) {{")
    return f"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef unsigned int uint32_t;
#define T {T}
#define LOAD(v) {load.format('v')}
#define STORE(v) {store.format('v')}
#define FROM_WORDS(w, j) {words}
#define LOAD16W(words, src) do {{ const uint4 u_ = *(const uint4*)(src); \\
  (words)[0] = u_.x; (words)[1] = u_.y; (words)[2] = u_.z; (words)[3] = u_.w; }} while (0)
#define ADDR(p) ((unsigned long long)(p))
#define UNROLL _Pragma("unroll")
#define FOR_BLOCK_WARP(blk, warp) \\
  for (long long blk = blockIdx.x, warp = threadIdx.x >> 5, _once = 1; _once; _once = 0)
#define FOR_LANE(lane) for (int lane = threadIdx.x & 31, _one = 1; _one; _one = 0)
#define LEADER if ((threadIdx.x & 31) == 0)
#define FOR_THREAD(t) \\
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x, _once = 1; _once; _once = 0)
#define STORE16W(dst, words) (*(uint4*)(dst) = make_uint4((words)[0], (words)[1], (words)[2], (words)[3]))
""" + _to_words(spec.dtype, _CU_BITS) + f"""static __device__ __forceinline__ float WARP_SUM(float v) {{
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}}
""" + _body(spec, head)


def c_source(spec: QmvSpec) -> str:
    """The C of ``spec``: the same loops over every block, warp and lane in order (the
    kernels' ``void** args`` entry: pointers, then the int64 values)."""
    T, load, store, words = _C_TYPES[spec.dtype]
    unpack = []
    for i, (k, n) in enumerate(spec.params()):
        if k == "int":
            unpack.append(f"const long long {n} = (long long)(intptr_t)args[{i}];")
        else:
            name, ty = _BUFS[n]
            unpack.append(f"{ty} {name} = ({ty})args[{i}];")
    head = f"void {spec.name}(void** args) {{\n  " + "\n  ".join(unpack)
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
#define FROM_WORDS(w, j) {words}
#define LOAD16W(words, src) memcpy((words), (src), 16)
#define ADDR(p) ((uintptr_t)(p))
#define UNROLL
#define FOR_BLOCK_WARP(blk, warp) \\
  for (long long blk = 0; blk < B * ((N + WARPS - 1) / WARPS); blk++) \\
    for (long long warp = 0; warp < WARPS; warp++)
#define FOR_LANE(lane) for (int lane = 0; lane < 32; lane++)
#define LEADER
#define WARP_SUM(v) (v)
#define FOR_THREAD(t) for (long long t = 0; t < total; t++)
#define STORE16W(dst, words) memcpy((dst), (words), 16)
""" + _to_words(spec.dtype, _C_BITS) + _body(spec, head)
