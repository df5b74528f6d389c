"""The CUDA dialect: tables over the shared C-family renderer (kernels/cuda/ runs it). MLX's CUDA
conventions: ``__half`` / ``__nv_bfloat16`` computed in float, ``extern "C" __global__`` kernels."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

from .gpu import GpuSchedule
from .render import C_MATH, C_OPS, INTEGER_TYPES, CFamily

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)

# NVRTC has no <cstdint>: the fixed-width integer types spelled out (also kernels/cuda/custom.py's)
RTC_INT_TYPES = r"""#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#endif
"""

_PRELUDE = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
""" + RTC_INT_TYPES + r"""// a run of N elements loaded or stored in one access (the contiguous kernels' vector path)
template <typename T, int N> struct alignas(sizeof(T) * N) ts_vec { T v[N]; };
// a shape or strides as one by-value parameter (MLX's const __grid_constant__ Shape)
template <typename T, int N> struct ts_arr { T v[N]; __device__ T operator[](int i) const { return v[i]; } };
static __device__ __forceinline__ bool d_aligned(const void* p, unsigned long long n) {
  return ((unsigned long long)p & (n - 1)) == 0;
}
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
"""


# a lane exchange of any state type (warp merges): 32- and 64-bit values directly, others via int
_IR_PRELUDE = r"""template <typename T> static __device__ __forceinline__ T ts_shfl_xor(T v, int o) {
  return (T)__shfl_xor_sync(0xffffffffu, (int)v, o);
}
template <> __device__ __forceinline__ float ts_shfl_xor(float v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
template <> __device__ __forceinline__ double ts_shfl_xor(double v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
template <> __device__ __forceinline__ unsigned int ts_shfl_xor(unsigned int v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
template <> __device__ __forceinline__ long long ts_shfl_xor(long long v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
template <> __device__ __forceinline__ unsigned long long ts_shfl_xor(unsigned long long v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
template <> __device__ __forceinline__ long ts_shfl_xor(long v, int o) {
  return (long)__shfl_xor_sync(0xffffffffu, (long long)v, o);
}
template <> __device__ __forceinline__ unsigned long ts_shfl_xor(unsigned long v, int o) {
  return (unsigned long)__shfl_xor_sync(0xffffffffu, (unsigned long long)v, o);
}
"""


class CUDADialect(CFamily):
    """CUDA C++: the C spellings hold (CUDA has C's libm names and operators); types,
    half conversions, qualifiers, the thread index and the kernel prefix differ."""

    name = "CUDA"
    type_names = {**INTEGER_TYPES, _F16: "__half", _BF16: "__nv_bfloat16",
                  np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
    code_for_op = C_OPS
    math_functions = C_MATH
    half_load = {_F16: "__half2float({})", _BF16: "__bfloat162float({})"}
    half_store = {_F16: "__float2half_rn({})", _BF16: "__float2bfloat16_rn({})"}
    half_round = {_F16: "__half2float(__float2half_rn({}))", _BF16: "__bfloat162float(__float2bfloat16_rn({}))"}
    prelude = _PRELUDE
    kernel_prefix = 'extern "C" __global__ void __launch_bounds__({block})'
    function_prefix = "static __device__ __forceinline__ "
    index_types = {False: "uint32_t", True: "int64_t"}
    thread_params: tuple = ()
    thread_index = {False: "blockIdx.x * blockDim.x + threadIdx.x",
                    True: "(int64_t)blockIdx.x * blockDim.x + threadIdx.x"}
    unroll = "#pragma unroll"
    vector_type = "ts_vec<{}, {}>"  # the contiguous path's whole-run loads and stores
    # 16-byte loads and stores per thread on the contiguous path (MLX's N_READS, mlx/backend/cuda/binary/binary.cuh)
    schedule = GpuSchedule(bytes_per_thread=16, block_size=256, max_static_ndim=8)
    # a completion word a one-block kernel may write itself (after a system-wide fence); every launch
    # here passes null: the stream writes the host's word (kernels/cuda/_driver.c)
    completion_word = ("unsigned int* __restrict__ done_word", "const unsigned int done_value")
    completion_word_store = [
        "done:",
        "  if (done_word != nullptr) {  // one block: once all its threads are here, one writes",
        "    __syncthreads();",
        "    if (threadIdx.x == 0) {",
        "      __threadfence_system();",
        "      *(volatile unsigned int*)done_word = done_value;",
        "    }",
        "  }",
    ]

    # the loop IR's tables (codegen/lower.py)
    ir_param = {"in": "const {t}* __restrict__ {n}", "out": "{t}* __restrict__ {n}",
                "int": "const int64_t {n}", "ints": "const int64_t* __restrict__ {n}"}
    ir_threads = {"group": "(int64_t)blockIdx.x", "groups": "(int64_t)gridDim.x",
                  "thread": "(int64_t)threadIdx.x", "group_size": "(int64_t)blockDim.x",
                  "lane": "(threadIdx.x & 31)", "warp": "(threadIdx.x >> 5)"}
    ir_shared = "__shared__ {t} {n}[{size}];"
    ir_barrier = "__syncthreads();"
    ir_shuffle = "ts_shfl_xor({}, {})"
    ir_unroll = "#pragma unroll {}"
    # 16-byte loads (loop_ir.Vec): the row's pointer, its elements before a 16-byte boundary (MLX's
    # load_vector / AlignedVector, N_READS = 16 / sizeof(T)); ``cache``: a row kept in registers
    ir_vector = {"types": {"float32": "float4", "int32": "int4", "uint32": "uint4",
                           "float16": "ts_vec<__half, 8>", "bfloat16": "ts_vec<__nv_bfloat16, 8>"},
                 "lane": lambda vt, v, j: f"{v}.{'xyzw'[j]}" if vt[-1] == "4" else f"{v}.v[{j}]",
                 "ptr": "const {t}* __restrict__ {n} = {buf} + ({base});",
                 "head": "(int64_t)(((16 - ((unsigned long long){p} & 15)) & 15) / {size})",
                 "load": "const {vt} {n} = *reinterpret_cast<const {vt}*>({p} + {i});",
                 "cache": True}
    ir_prelude = _IR_PRELUDE
    own_math_domain = {("exp", "nonpositive"): "__expf"}  # x - max <= 0: MLX's softmax_exp

    def __init__(self, **kw):
        pass

    # static variants' shape / strides, by-value scalars: parameters' values (cuda/compiled.py)
    fixed_array, scalar_by_value = "const ts_arr<{t}, {n}> {name}", True

    def param(self, kind: str, name: str, t: str, k: int) -> str:
        return {"in": f"const {t}* __restrict__ {name}", "value": f"const {t} {name}",
                "out": f"{t}* __restrict__ {name}", "strides": f"const int64_t* __restrict__ {name}",
                "shape": f"const int32_t* __restrict__ {name}", "size": f"const {t} {name}",
                "ndim": f"const int {name}"}[kind]

    def helper(self, text: str) -> str:
        return re.sub(r"^static inline ", self.function_prefix, text, flags=re.M)
