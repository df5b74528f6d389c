"""The Metal Shading Language dialect: tables over the shared C-family renderer (the Metal
runtime, kernels/metal/runtime.py, compiles and runs it; no MSL compiler exists on Linux).
MLX's Metal
conventions: ``[[kernel]]`` functions, buffers bound by index, ``half`` / ``bfloat``
storage computed in float, ``thread_position_in_grid`` (a 2-D grid for ``_large``),
``_contiguous`` with work per thread ``max(1, 8 / itemsize)``, ``_strided_1``..``_strided_7``,
``_strided_dynamic`` for ndim >= 8. Metal has no ``double``: float64 tapes cannot render."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

from .gpu import GpuSchedule
from ..primitives import spellings
from .render import C_MATH, C_OPS, INTEGER_TYPES, CFamily

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)

# Metal's math has no expm1 / log1p / erf: ours, in float (accuracy is the runtime's to test)
_PRELUDE = r"""#include <metal_stdlib>
using namespace metal;
static inline float ts_expm1(float x) {
  if (metal::fabs(x) < 1e-5f) return x + 0.5f * x * x;
  return metal::precise::exp(x) - 1.0f;
}
static inline float ts_log1p(float x) {
  const float u = 1.0f + x;
  return u == 1.0f ? x : metal::precise::log(u) * (x / (u - 1.0f));
}
static inline float ts_erf(float x) {
  /* Abramowitz-Stegun 7.1.26 refined: |error| < 1.2e-7 */
  const float a = metal::fabs(x), t = 1.0f / (1.0f + 0.5f * a);
  const float y = 1.0f - t * metal::precise::exp(-a * a - 1.26551223f + t * (1.00002368f +
      t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f +
      t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f)))))))));
  return metal::copysign(y, x);
}
"""

_MATH = {"expm1": "ts_expm1", "log1p": "ts_log1p", "erf": "ts_erf", "floor": "metal::floor",
         "ceil": "metal::ceil", "rint": "metal::rint", "fabs": "metal::fabs"}


# a lane exchange of any state type: bool through int, 64-bit integers as two 32-bit halves
_IR_PRELUDE = r"""template <typename T> static inline T ts_shfl_xor(T v, ushort o) { return simd_shuffle_xor(v, o); }
static inline bool ts_shfl_xor(bool v, ushort o) { return simd_shuffle_xor((int)v, o) != 0; }
static inline uint64_t ts_shfl_xor(uint64_t v, ushort o) {
  const uint lo = simd_shuffle_xor((uint)(v & 0xffffffffu), o);
  const uint hi = simd_shuffle_xor((uint)(v >> 32), o);
  return ((uint64_t)hi << 32) | (uint64_t)lo;
}
static inline int64_t ts_shfl_xor(int64_t v, ushort o) { return (int64_t)ts_shfl_xor((uint64_t)v, o); }
"""


class MetalDialect(CFamily):
    """MSL: the C spellings hold (MSL is C++14 with C's operators); types, half conversions,
    math names, address-space qualifiers, buffer bindings and the thread index differ."""

    name = "Metal"
    type_names = {**INTEGER_TYPES, _F16: "half", _BF16: "bfloat", _F32: "float"}
    code_for_op = {**C_OPS, **spellings("metal")}  # the definitions' Metal spellings over C's
    math_functions = C_MATH
    half_load = {_F16: "(float){}", _BF16: "(float){}"}
    half_store = {_F16: "(half)({})", _BF16: "(bfloat)({})"}
    half_round = {_F16: "(float)(half)({})", _BF16: "(float)(bfloat)({})"}
    math_names = _MATH
    prelude = _PRELUDE
    lacks = ("double",)
    kernel_prefix = "[[kernel]] void"
    index_types = {False: "uint", True: "int64_t"}
    thread_params = ("uint3 thread_pos [[thread_position_in_grid]]",
                     "uint3 grid_size [[threads_per_grid]]")
    thread_index = {False: "thread_pos.x",
                    True: "thread_pos.x + (int64_t)grid_size.x * thread_pos.y"}
    unroll = ""
    schedule = GpuSchedule(bytes_per_thread=8, block_size=1024, max_static_ndim=7)

    # the loop IR's tables (codegen/lower.py)
    ir_param = {"in": "device const {t}* {n} [[buffer({k})]]", "out": "device {t}* {n} [[buffer({k})]]",
                "int": "constant const int64_t& {n} [[buffer({k})]]",
                "ints": "constant const int64_t* {n} [[buffer({k})]]"}
    ir_thread_params = ("uint3 ts_tg [[threadgroup_position_in_grid]]",
                        "uint3 ts_ntg [[threadgroups_per_grid]]",
                        "uint3 ts_tid [[thread_position_in_threadgroup]]",
                        "uint3 ts_tgs [[threads_per_threadgroup]]",
                        "uint ts_lane [[thread_index_in_simdgroup]]",
                        "uint ts_warp [[simdgroup_index_in_threadgroup]]")
    ir_threads = {"group": "(int64_t)ts_tg.x", "groups": "(int64_t)ts_ntg.x",
                  "thread": "(int64_t)ts_tid.x", "group_size": "(int64_t)ts_tgs.x",
                  "lane": "ts_lane", "warp": "ts_warp"}
    ir_shared = "threadgroup {t} {n}[{size}];"
    ir_barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    ir_shuffle = "ts_shfl_xor({}, (ushort){})"
    ir_simd = {"sum": "simd_sum({})"}  # one call per simdgroup (MLX's Metal reductions)
    ir_simd_types = (_F32, np.dtype(np.int32), np.dtype(np.uint32))
    ir_const_space = "constant const"
    ir_prelude = _IR_PRELUDE

    def __init__(self, **kw):
        pass

    def math(self, stem: str, dt) -> str:
        return self.math_names.get(stem, f"metal::precise::{stem}")

    def param(self, kind: str, name: str, t: str, k: int) -> str:
        return {"in": f"device const {t}* {name} [[buffer({k})]]",
                "out": f"device {t}* {name} [[buffer({k})]]",
                "strides": f"constant const int64_t* {name} [[buffer({k})]]",
                "shape": f"constant const int* {name} [[buffer({k})]]",
                "size": f"constant const {t}& {name} [[buffer({k})]]",
                "ndim": f"constant const int& {name} [[buffer({k})]]"}[kind]

    def helper(self, text: str) -> str:
        """C's helpers with Metal's math names (``log1pf(`` -> ``ts_log1p(``)."""
        return re.sub(r"\b(log1p|exp|fmod|fabs|log|floor|sqrt)f\(",
                      lambda m: self.math(m.group(1), _F32) + "(", text)
