#include <metal_stdlib>
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

[[kernel]] void LIB_strided_1(
    device const half* A [[buffer(0)]],
    constant const int64_t* A_strides [[buffer(1)]],
    device const half* B [[buffer(2)]],
    constant const int64_t* B_strides [[buffer(3)]],
    device half* out0 [[buffer(4)]],
    constant const int* shape [[buffer(5)]],
    uint3 thread_pos [[thread_position_in_grid]],
    uint3 grid_size [[threads_per_grid]]) {
  uint size = 1;
  for (int d = 0; d < 1; ++d) size *= (uint)shape[d];
  const uint index0 = (uint)(thread_pos.x) * 1;
  for (int w = 0; w < 1; ++w) {
    const uint index = index0 + w;
    if (index >= size) return;
    uint rem = index;
    int64_t A_loc = 0, B_loc = 0;
    for (int d = 1 - 1; d >= 0; --d) {
      const uint q = rem % (uint)shape[d];
      rem /= (uint)shape[d];
      A_loc += (int64_t)q * A_strides[d];
      B_loc += (int64_t)q * B_strides[d];
    }
    float tmp_A = (float)A[A_loc];
    float tmp_B = (float)B[B_loc];
    float tmp_C = 2.0f;
    float tmp_D = (float)(half)((float)(-tmp_A));
    float tmp_E = (float)(half)(metal::precise::exp(tmp_D));
    float tmp_F = (float)(half)(metal::precise::sin(tmp_B));
    float tmp_G = (float)(half)((tmp_E * tmp_F));
    float tmp_H = (float)(half)(tmp_C);
    float tmp_I = (float)(half)((tmp_A * tmp_H));
    float tmp_J = (float)(half)((tmp_I * tmp_B));
    float tmp_K = (float)(half)((tmp_G + tmp_J));
    float tmp_L = (float)(half)(metal::precise::tanh(tmp_A));
    float tmp_M = (float)(half)((tmp_K - tmp_L));
    out0[index] = (half)(tmp_M);
  }
}
