"""MLX's CUDA ``gemv`` (one row times a transposed weight: ``x @ w.T``, the products of an
``nn.Linear`` in decoding) as one kernel text rendered twice: CUDA (``cuda/gemm.py``'s plan,
launched by the eval loop from C) and C (the same loops with the grid, its warps and lanes
walked in order: the stand-in driver's build of a packed launch, and the Kernels tab's C).

The mechanism is MLX's ``gemv_single`` / ``gemv_batched`` (mlx/backend/cuda/gemms/gemv.cu):
a block of ``WARPS`` warps, each warp one output column ``n`` (a row of the weight, unit
stride along K), its lanes striding over K, float32 products summed in float32 whatever the
storage type, a warp reduction, the result rounded once to the storage type. Where x's row,
the weight row and the weight's row stride are 16-byte aligned and K is a whole number of
16-byte vectors, a lane reads 16 bytes at a time (MLX's ``n_per_thread`` vector loads), else
one element at a time (a warp-uniform choice made per launch from the pointers).

One launch covers a batch: the grid is one dimension, ``B * ceil(N / WARPS)`` blocks; entry
``bb``'s x and weight start ``bb`` times their batch stride in (0: a broadcast operand), its
output row at ``bb * N``.
"""

from __future__ import annotations

from dataclasses import dataclass

# (the storage type, a T as float, a float rounded to T, element j of 16-byte words as
# float): qmv's tables, the same loads and stores
from .qmv_cuda import _C_TYPES, _CU_TYPES

WARPS = 8  # output columns (warps) per block
TYPES = ("float32", "float16", "bfloat16")
INTS = ("B", "N", "K", "w_rs", "x_bs", "w_bs")


@dataclass(frozen=True)
class GemvSpec:
    """One kernel: the storage type of x, the weight and the output (compile-time)."""

    dtype: str

    @property
    def name(self) -> str:
        return f"gemv_t_{self.dtype}"

    @property
    def layout(self) -> str:
        return f"gemv {self.dtype} (x @ w.T, one row)"

    lib_name = property(lambda self: self.name)

    def params(self) -> list:
        """(kind, name) in argument order: ``in`` / ``out`` pointers, then int64 values."""
        return [("in", "x"), ("in", "w"), ("out", "out")] + [("int", n) for n in INTS]

    def sources(self, built: dict) -> dict:
        """The Kernels tab's three: CUDA, its C build, and why there is no Metal one."""
        return {"cpu": built.get("cpu") or c_source(self),
                "cuda": built.get("cuda") or cuda_source(self),
                "metal": "// no MSL gemv kernel: Metal runs the matmul rule"}


# The kernel's text: the dialects define T, LOAD (a T as float), STORE (a float rounded to
# T), LOAD16 (16 bytes into four words), FROM_WORDS (element j of such words as float), the
# grid's loops (FOR_BLOCK_WARP, FOR_LANE), WARP_SUM and LEADER (lane 0 of the warp). In CUDA
# the loops run once per thread; in C they walk every block, warp and lane in order, the
# lanes' sums falling into one accumulator.
_BODY = """
#define WARPS {warps}
#define EPV (16 / (int)sizeof(T))  /* elements per 16-byte vector */

KERNEL_HEAD {{
  const long long nblk = (N + WARPS - 1) / WARPS;
  FOR_BLOCK_WARP(blk, warp) {{
    const long long bb = blk / nblk, n = (blk % nblk) * WARPS + warp;
    if (n < N) {{  /* warp-uniform */
      const T* xr = X + bb * x_bs;
      const T* wr = W + bb * w_bs + n * w_rs;
      const int vec = ((ADDR(xr) | ADDR(wr)) & 15) == 0 && K % EPV == 0 &&
                      ((w_rs * (long long)sizeof(T)) & 15) == 0;
      float acc = 0.0f;
      FOR_LANE(lane) {{
        if (vec) {{
          for (long long k0 = (long long)lane * EPV; k0 < K; k0 += 32 * EPV) {{
            uint32_t xw[4], ww[4];
            LOAD16(xw, xr + k0);
            LOAD16(ww, wr + k0);
            UNROLL
            for (int j = 0; j < EPV; j++) acc = fmaf(FROM_WORDS(xw, j), FROM_WORDS(ww, j), acc);
          }}
        }} else {{
          for (long long k = lane; k < K; k += 32) acc = fmaf(LOAD(xr[k]), LOAD(wr[k]), acc);
        }}
      }}
      acc = WARP_SUM(acc);
      LEADER {{ OUT[bb * N + n] = STORE(acc); }}
    }}
  }}
}}
"""

_BUFS = {"x": ("X", "const T*"), "w": ("W", "const T*"), "out": ("OUT", "T*")}


def _signature(spec: GemvSpec) -> str:
    return ", ".join(f"{_BUFS[n][1]} __restrict__ {_BUFS[n][0]}" if k != "int" else f"long long {n}"
                     for k, n in spec.params())


def _body(head: str) -> str:
    return _BODY.format(warps=WARPS).replace("KERNEL_HEAD {", head, 1)


def cuda_source(spec: GemvSpec) -> str:
    """The CUDA of ``spec``: ``WARPS * 32`` threads a block, a one-dimensional grid."""
    T, load, store, words = _CU_TYPES[spec.dtype]
    head = (f'extern "C" __global__ void __launch_bounds__({WARPS * 32}) '
            f"{spec.name}({_signature(spec)}) {{")
    return f"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef unsigned int uint32_t;
#define T {T}
#define LOAD(v) {load.format('v')}
#define STORE(v) {store.format('v')}
#define FROM_WORDS(w, j) {words}
#define LOAD16(words, src) do {{ const uint4 u_ = *(const uint4*)(src); \\
  (words)[0] = u_.x; (words)[1] = u_.y; (words)[2] = u_.z; (words)[3] = u_.w; }} while (0)
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
""" + _body(head)


def c_source(spec: GemvSpec) -> str:
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
#define LOAD16(words, src) memcpy((words), (src), 16)
#define ADDR(p) ((uintptr_t)(p))
#define UNROLL
#define FOR_BLOCK_WARP(blk, warp) \\
  for (long long blk = 0; blk < B * ((N + WARPS - 1) / WARPS); blk++) \\
    for (long long warp = 0; warp < WARPS; warp++)
#define FOR_LANE(lane) for (int lane = 0; lane < 32; lane++)
#define LEADER
#define WARP_SUM(v) (v)
""" + _body(head)
