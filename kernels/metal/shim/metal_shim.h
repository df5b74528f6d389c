/* tapescope's Metal shim: a TEST TOOL, not a Metal implementation.

   It maps enough of the Metal Shading Language onto C++17 for generated MSL (tapescope's
   fused and elementwise kernels, mx.fast.metal_kernel sources, MLX's own elementwise
   kernel headers) to compile with the system g++ and run on the CPU over its launch grid,
   so the numbers can be compared with numpy on machines without an Apple GPU. What it maps:

   - address spaces (device, constant, thread, threadgroup) and [[attributes]]: erased
     (g++ ignores unknown attributes; -Wno-attributes);
   - half = _Float16, bfloat (bfloat16_t) = a 16-bit struct rounding to nearest even,
     Metal's vector types (uint3, float4, ...: x/y/z/w members, elementwise operators);
   - metal:: / metal::precise:: / metal::fast:: math in float (half and bfloat computed in
     float and rounded back), numeric_limits, type traits, select / clamp / min / max / fma;
     only the functions Metal has (no erf, expm1, log1p or cbrt: MSL lacks them too);
   - floating literals are float (-fsingle-precision-constant), as Metal has no double;
   - atomic<T> and the atomic_*_explicit functions (one OS thread runs the grid: plain
     loads and stores), simd_* reductions / shuffles and threadgroup_barrier, which run the
     threads of a threadgroup as cooperative fibers (ucontext) when the kernel uses them.

   Threadgroup arrays declared in a kernel (threadgroup T name[N];) become static arrays
   (shim.py rewrites them): the threadgroups run one at a time on one OS thread, so the
   threads of a group share them. What it does not do: other threadgroup variables (the
   runner refuses them), textures, simdgroup matrices, double. Timing on the shim says
   nothing about a GPU. */
#pragma once
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
/* MSL's INFINITY and NAN (metal_math defines both as float constants) */
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
#include <utility>
#include <ucontext.h>

#define device
#define constant
#define thread
#define threadgroup
#define TS_THREADGROUP_ARRAY static  /* shim.py: a kernel's threadgroup arrays, one per group */
#define METAL_FUNC inline
#define METAL_CONST_PROGRAM
#define TS_SHIM 1
#define __METAL_VERSION__ 320  /* what MSL 3.2 headers test for (<metal_logging>) */

using uint = unsigned int;
using ushort = unsigned short;
using uchar = unsigned char;
using half = _Float16;
using float16_t = _Float16;
using size_t = std::size_t;

/* ---- bfloat: the top 16 bits of a float, rounded to nearest even ------------------- */
struct bfloat {
  uint16_t bits;
  static constexpr uint16_t from_float(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  bfloat() = default;
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value ||
                                              std::is_same<T, _Float16>::value>>
  constexpr bfloat(T v) : bits(from_float((float)v)) {}
  constexpr operator float() const { return __builtin_bit_cast(float, (uint32_t)bits << 16); }
  constexpr bfloat operator-() const { bfloat r{}; r.bits = bits ^ 0x8000u; return r; }
};
using bfloat16_t = bfloat;
#pragma GCC diagnostic ignored "-Wliteral-suffix"
constexpr half operator""h(long double v) { return (half)v; }
constexpr half operator""H(long double v) { return (half)v; }

template <class T> struct ts_is_bf : std::false_type {};
template <> struct ts_is_bf<bfloat> : std::true_type {};
#define TS_BF_BINOP(op)                                                                 \
  constexpr bfloat operator op(bfloat a, bfloat b) { return bfloat((float)a op (float)b); } \
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>             \
  constexpr auto operator op(bfloat a, T b) { return (float)a op b; }                    \
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>             \
  constexpr auto operator op(T a, bfloat b) { return a op (float)b; }
TS_BF_BINOP(+) TS_BF_BINOP(-) TS_BF_BINOP(*) TS_BF_BINOP(/)
#define TS_BF_CMP(op)                                                                   \
  constexpr bool operator op(bfloat a, bfloat b) { return (float)a op (float)b; }        \
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>             \
  constexpr bool operator op(bfloat a, T b) { return (float)a op b; }                    \
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>             \
  constexpr bool operator op(T a, bfloat b) { return a op (float)b; }
TS_BF_CMP(<) TS_BF_CMP(>) TS_BF_CMP(<=) TS_BF_CMP(>=) TS_BF_CMP(==) TS_BF_CMP(!=)
#define TS_BF_ASSIGN(op)                                                                \
  template <class T> inline bfloat& operator op##=(bfloat& a, T b) { a = bfloat(a op b); return a; }
TS_BF_ASSIGN(+) TS_BF_ASSIGN(-) TS_BF_ASSIGN(*) TS_BF_ASSIGN(/)

/* ---- vector types ----------------------------------------------------------------- */
template <class T, int N> struct ts_vec;
template <class T> struct ts_vec<T, 2> {
  T x, y;
  ts_vec() = default;
  constexpr ts_vec(T a) : x(a), y(a) {}
  constexpr ts_vec(T a, T b) : x(a), y(b) {}
  template <class U> explicit ts_vec(const ts_vec<U, 2>& o) : x(T(o.x)), y(T(o.y)) {}
  T& operator[](int i) { return (&x)[i]; }
  const T& operator[](int i) const { return (&x)[i]; }
};
template <class T> struct ts_vec<T, 3> {
  T x, y, z;
  ts_vec() = default;
  constexpr ts_vec(T a) : x(a), y(a), z(a) {}
  constexpr ts_vec(T a, T b, T c) : x(a), y(b), z(c) {}
  template <class U> explicit ts_vec(const ts_vec<U, 3>& o) : x(T(o.x)), y(T(o.y)), z(T(o.z)) {}
  T& operator[](int i) { return (&x)[i]; }
  const T& operator[](int i) const { return (&x)[i]; }
};
template <class T> struct ts_vec<T, 4> {
  T x, y, z, w;
  ts_vec() = default;
  constexpr ts_vec(T a) : x(a), y(a), z(a), w(a) {}
  constexpr ts_vec(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  template <class U> explicit ts_vec(const ts_vec<U, 4>& o) : x(T(o.x)), y(T(o.y)), z(T(o.z)), w(T(o.w)) {}
  T& operator[](int i) { return (&x)[i]; }
  const T& operator[](int i) const { return (&x)[i]; }
};
#define TS_VEC_OP(op)                                                                   \
  template <class T, int N> ts_vec<T, N> operator op(ts_vec<T, N> a, const ts_vec<T, N>& b) { \
    for (int i = 0; i < N; ++i) a[i] = a[i] op b[i]; return a; }                         \
  template <class T, int N> ts_vec<T, N> operator op(ts_vec<T, N> a, T b) {               \
    for (int i = 0; i < N; ++i) a[i] = a[i] op b; return a; }                            \
  template <class T, int N> ts_vec<T, N> operator op(T a, ts_vec<T, N> b) {               \
    for (int i = 0; i < N; ++i) b[i] = a op b[i]; return b; }
TS_VEC_OP(+) TS_VEC_OP(-) TS_VEC_OP(*) TS_VEC_OP(/) TS_VEC_OP(%)
#define TS_VEC_TYPES(T, name) \
  using name##2 = ts_vec<T, 2>; using name##3 = ts_vec<T, 3>; using name##4 = ts_vec<T, 4>;
TS_VEC_TYPES(float, float) TS_VEC_TYPES(half, half) TS_VEC_TYPES(int, int)
TS_VEC_TYPES(uint, uint) TS_VEC_TYPES(short, short) TS_VEC_TYPES(ushort, ushort)
TS_VEC_TYPES(bool, bool) TS_VEC_TYPES(int64_t, long) TS_VEC_TYPES(uint64_t, ulong)
TS_VEC_TYPES(bfloat, bfloat)
namespace metal {
template <class T, int N> using vec = ts_vec<T, N>;
template <class T, size_t N> struct array {  /* <metal_array> */
  T v[N];
  T& operator[](size_t i) { return v[i]; }
  const T& operator[](size_t i) const { return v[i]; }
  static constexpr size_t size() { return N; }
};
}  // namespace metal
using packed_float2 = float2; using packed_float3 = float3; using packed_float4 = float4;

/* ---- atomics: one OS thread runs the grid, so plain memory operations -------------- */
namespace metal {
enum memory_order { memory_order_relaxed, memory_order_seq_cst };
template <class T> struct atomic { T value; };
}  // namespace metal
using metal::memory_order;
using metal::memory_order_relaxed;
using metal::memory_order_seq_cst;
using atomic_int = metal::atomic<int>;
using atomic_uint = metal::atomic<uint>;
using atomic_float = metal::atomic<float>;
using atomic_bool = metal::atomic<bool>;
#define TS_ATOMIC_RMW(name, expr)                                                       \
  template <class T, class U> inline T atomic_##name##_explicit(metal::atomic<T>* p, U v, memory_order) { \
    T old = p->value; p->value = (expr); return old; }
TS_ATOMIC_RMW(fetch_add, T(old + v))
TS_ATOMIC_RMW(fetch_sub, T(old - v))
TS_ATOMIC_RMW(fetch_max, T(old > T(v) ? old : T(v)))
TS_ATOMIC_RMW(fetch_min, T(old < T(v) ? old : T(v)))
TS_ATOMIC_RMW(fetch_and, T(old & v))
TS_ATOMIC_RMW(fetch_or, T(old | v))
TS_ATOMIC_RMW(fetch_xor, T(old ^ v))
TS_ATOMIC_RMW(exchange, T(v))
template <class T, class U> inline void atomic_store_explicit(metal::atomic<T>* p, U v, memory_order) { p->value = T(v); }
template <class T> inline T atomic_load_explicit(const metal::atomic<T>* p, memory_order) { return p->value; }
template <class T, class U>
inline bool atomic_compare_exchange_weak_explicit(metal::atomic<T>* p, T* expected, U v, memory_order, memory_order) {
  if (p->value == *expected) { p->value = T(v); return true; }
  *expected = p->value; return false;
}

#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f

/* ---- metal:: math: float, with half / bfloat computed in float and rounded back ------ */
namespace metal {
/* Metal's <metal_type_traits>: the standard ones, with half and bfloat floating point */
using std::enable_if; using std::enable_if_t; using std::is_same; using std::is_same_v;
using std::is_convertible; using std::is_convertible_v; using std::conditional;
using std::conditional_t; using std::integral_constant; using std::true_type;
using std::false_type; using std::is_integral; using std::is_integral_v; using std::is_signed;
using std::is_signed_v; using std::is_unsigned; using std::is_unsigned_v;
using std::remove_cv_t; using std::remove_reference_t; using std::decay_t;
using std::make_unsigned_t; using std::make_signed_t; using std::is_pointer_v;
template <class T> struct is_floating_point : std::is_floating_point<T> {};
template <> struct is_floating_point<half> : std::true_type {};
template <> struct is_floating_point<bfloat> : std::true_type {};
template <class T> constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T> struct is_arithmetic
    : std::integral_constant<bool, std::is_arithmetic<T>::value || is_floating_point<T>::value> {};
template <class T> constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T> struct numeric_limits : std::numeric_limits<T> {};
template <> struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true;
  static constexpr bfloat bits_(uint16_t b) { bfloat r{}; r.bits = b; return r; }
  static constexpr bfloat infinity() { return bits_(0x7f80); }
  static constexpr bfloat quiet_NaN() { return bits_(0x7fc0); }
  static constexpr bfloat max() { return bits_(0x7f7f); }
  static constexpr bfloat lowest() { return bits_(0xff7f); }
  static constexpr bfloat min() { return bits_(0x0080); }
  static constexpr bfloat epsilon() { return bits_(0x3c00); }
};
template <class T> using ts_f = std::conditional_t<std::is_integral<T>::value, float, T>;
#define TS_MATH1(name, fn)                                                              \
  inline float name(float x) { return fn(x); }                                           \
  inline half name(half x) { return (half)fn((float)x); }                                \
  template <class T, class = std::enable_if_t<std::is_integral<T>::value>>               \
  inline float name(T x) { return fn((float)x); }
#define TS_MATH2(name, fn)                                                              \
  inline float name(float x, float y) { return fn(x, y); }                               \
  inline half name(half x, half y) { return (half)fn((float)x, (float)y); }
#define TS_ALL_MATH                                                                     \
  TS_MATH1(exp, __builtin_expf) TS_MATH1(exp2, __builtin_exp2f) TS_MATH1(exp10, ts_exp10f) \
  TS_MATH1(log, __builtin_logf) TS_MATH1(log2, __builtin_log2f) TS_MATH1(log10, __builtin_log10f) \
  TS_MATH1(sin, __builtin_sinf) TS_MATH1(cos, __builtin_cosf) TS_MATH1(tan, __builtin_tanf) \
  TS_MATH1(asin, __builtin_asinf) TS_MATH1(acos, __builtin_acosf) TS_MATH1(atan, __builtin_atanf) \
  TS_MATH1(sinh, __builtin_sinhf) TS_MATH1(cosh, __builtin_coshf) TS_MATH1(tanh, __builtin_tanhf) \
  TS_MATH1(asinh, __builtin_asinhf) TS_MATH1(acosh, __builtin_acoshf) TS_MATH1(atanh, __builtin_atanhf) \
  TS_MATH1(sqrt, __builtin_sqrtf) TS_MATH1(rsqrt, ts_rsqrtf) \
  TS_MATH1(floor, __builtin_floorf) TS_MATH1(ceil, __builtin_ceilf) TS_MATH1(trunc, __builtin_truncf) \
  TS_MATH1(round, __builtin_roundf) TS_MATH1(rint, __builtin_rintf) TS_MATH1(fabs, __builtin_fabsf) \
  TS_MATH2(pow, __builtin_powf) TS_MATH2(powr, __builtin_powf) TS_MATH2(atan2, __builtin_atan2f) \
  TS_MATH2(fmod, __builtin_fmodf) TS_MATH2(copysign, __builtin_copysignf) TS_MATH2(fmin, __builtin_fminf) \
  TS_MATH2(fmax, __builtin_fmaxf) TS_MATH2(nextafter, __builtin_nextafterf)                \
  TS_MATH1(sinpi, ts_sinpif) TS_MATH1(cospi, ts_cospif) TS_MATH1(tanpi, ts_tanpif)          \
  TS_MATH1(fract, ts_fractf)
inline float ts_exp10f(float x) { return __builtin_powf(10.0f, x); }
inline float ts_sinpif(float x) { return __builtin_sinf(M_PI_F * x); }
inline float ts_cospif(float x) { return __builtin_cosf(M_PI_F * x); }
inline float ts_tanpif(float x) { return __builtin_tanf(M_PI_F * x); }
inline float ts_fractf(float x) { float f = x - __builtin_floorf(x); return f < 0x1.fffffep-1f ? f : 0x1.fffffep-1f; }
inline float ts_rsqrtf(float x) { return 1.0f / __builtin_sqrtf(x); }
TS_ALL_MATH
namespace precise { TS_ALL_MATH }
namespace fast { TS_ALL_MATH }
template <class T> inline T abs(T x) { return x < T(0) ? T(-x) : x; }
inline float abs(float x) { return __builtin_fabsf(x); }
template <class T> inline bool isnan(T x) { return (float)x != (float)x; }
template <class T> inline bool isinf(T x) { return __builtin_isinf((float)x); }
template <class T> inline bool isfinite(T x) { return __builtin_isfinite((float)x); }
template <class T> inline bool signbit(T x) { return __builtin_signbit((float)x); }
template <class T> inline T sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); }
template <class T> inline T min(T a, T b) { return b < a ? b : a; }
template <class T> inline T max(T a, T b) { return a < b ? b : a; }
template <class T> inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
template <class T> inline T fma(T a, T b, T c) { return T(__builtin_fmaf((float)a, (float)b, (float)c)); }
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }
inline float sincos(float x, thread float& c) { c = __builtin_cosf(x); return __builtin_sinf(x); }
template <class T, class U> inline T as_type(U v) {
  static_assert(sizeof(T) == sizeof(U), "as_type: sizes differ");
  T r; std::memcpy(&r, &v, sizeof(T)); return r;
}
template <class T> inline int popcount(T x) { return __builtin_popcountll((unsigned long long)x); }
template <class T> inline T mulhi(T a, T b) {
  using W = std::conditional_t<std::is_signed<T>::value, __int128, unsigned __int128>;
  return T(((W)a * (W)b) >> (8 * sizeof(T)));
}
struct os_log {  /* <metal_logging>: nothing is logged */
  constexpr os_log(const char*, const char*) {}
  template <class... A> void log_debug(const char*, A...) const {}
  template <class... A> void log_info(const char*, A...) const {}
  template <class... A> void log_error(const char*, A...) const {}
};
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
}  // namespace metal

/* ---- the launch: thread attributes, and fibers for simdgroups and barriers --------- */
struct ts_thread {
  uint3 pos_grid, pos_tg, tg_pos, grid_size, tg_size, n_tg;
  uint index_tg, simd_lane, simd_group, n_simd;
};
static thread_local ts_thread ts_t;
static const uint ts_simd_width = 32;

struct ts_coop {  /* one threadgroup run as fibers when the kernel synchronises */
  ucontext_t main;
  ucontext_t* ctx = nullptr;
  char* stacks = nullptr;
  ts_thread* th = nullptr;
  int* state = nullptr;  /* 0 runnable, 1 done, 2 at a simd collective, 3 at a barrier */
  int n = 0, cur = -1;
  unsigned char slot[1024][16];
};
static thread_local ts_coop* ts_c = nullptr;

static inline void ts_yield(int why) {
  ts_c->state[ts_c->cur] = why;
  swapcontext(&ts_c->ctx[ts_c->cur], &ts_c->main);
}

namespace metal {
inline void threadgroup_barrier(mem_flags = mem_flags::mem_none) { if (ts_c) ts_yield(3); }
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none) { if (ts_c) ts_yield(2); }
}  // namespace metal
using metal::threadgroup_barrier;
using metal::simdgroup_barrier;
using metal::mem_flags;

/* The lanes of the calling thread's simdgroup that have not returned (all of them run to
   the collective before any continues). Returns the first lane's thread index. */
static inline int ts_simd_base() { return ts_c->cur - (int)ts_t.simd_lane; }
template <class T> static inline void ts_put(T v) { std::memcpy(ts_c->slot[ts_c->cur], &v, sizeof(T)); }
template <class T> static inline T ts_get(int i) { T v; std::memcpy(&v, ts_c->slot[i], sizeof(T)); return v; }
static inline int ts_simd_end() {
  int e = ts_simd_base() + (int)ts_simd_width; return e < ts_c->n ? e : ts_c->n; }

/* xor / or / and (op 0 / 1 / 2) of two values' bits; op 3: all bits set */
template <class T> static inline T ts_bits(T a, T b, int op) {
  using U = std::conditional_t<sizeof(T) == 1, uint8_t, std::conditional_t<sizeof(T) == 2,
            uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  U x, y; std::memcpy(&x, &a, sizeof(T)); std::memcpy(&y, &b, sizeof(T));
  U r = op == 0 ? U(x ^ y) : op == 1 ? U(x | y) : op == 2 ? U(x & y) : U(~U(0));
  T out; std::memcpy(&out, &r, sizeof(T)); return out;
}
#define TS_SIMD_REDUCE(name, init, comb)                                                \
  template <class T> inline T name(T x) {                                               \
    if (!ts_c) return x;                                                                \
    ts_put(x); ts_yield(2);                                                             \
    T acc = init;                                                                       \
    for (int i = ts_simd_base(); i < ts_simd_end(); ++i)                                \
      if (ts_c->state[i] != 1) { T v = ts_get<T>(i); acc = comb; }                     \
    ts_yield(2);                                                                        \
    return acc; }
namespace metal {
TS_SIMD_REDUCE(simd_sum, T(0), T(acc + v))
TS_SIMD_REDUCE(simd_prod, T(1), T(acc * v))
TS_SIMD_REDUCE(simd_max, numeric_limits<T>::lowest(), (v > acc ? v : acc))
TS_SIMD_REDUCE(simd_min, numeric_limits<T>::max(), (v < acc ? v : acc))
TS_SIMD_REDUCE(simd_product, T(1), T(acc * v))
TS_SIMD_REDUCE(simd_xor, T(0), ts_bits(acc, v, 0))
TS_SIMD_REDUCE(simd_or, T(0), ts_bits(acc, v, 1))
TS_SIMD_REDUCE(simd_and, ts_bits(T(0), T(0), 3), ts_bits(acc, v, 2))
inline bool simd_any(bool x) { return simd_or((int)x) != 0; }
inline bool simd_all(bool x) { return simd_and((int)x) != 0; }
template <class T> inline T ts_simd_read(T x, int lane) {
  if (!ts_c) return x;
  ts_put(x); ts_yield(2);
  int i = ts_simd_base() + lane;
  T r = (lane >= 0 && lane < (int)ts_simd_width && i < ts_c->n) ? ts_get<T>(i) : x;
  ts_yield(2);
  return r;
}
template <class T> inline T simd_shuffle(T x, ushort lane) { return ts_simd_read(x, lane); }
template <class T> inline T simd_broadcast(T x, ushort lane) { return ts_simd_read(x, lane); }
template <class T> inline T simd_broadcast_first(T x) { return ts_simd_read(x, 0); }
template <class T> inline T simd_shuffle_down(T x, ushort d) {
  int lane = (int)ts_t.simd_lane + d; return ts_simd_read(x, lane < (int)ts_simd_width ? lane : -1); }
template <class T> inline T simd_shuffle_up(T x, ushort d) {
  int lane = (int)ts_t.simd_lane - d; return ts_simd_read(x, lane); }
template <class T> inline T simd_shuffle_xor(T x, ushort m) { return ts_simd_read(x, (int)(ts_t.simd_lane ^ m)); }
template <class T> inline T simd_shuffle_and_fill_up(T data, T filling, ushort d) {
  int lane = (int)ts_t.simd_lane;
  T a = ts_simd_read(data, lane - (int)d);
  T b = ts_simd_read(filling, lane - (int)d + (int)ts_simd_width);
  return lane >= (int)d ? a : b;
}
template <class T> inline T simd_shuffle_and_fill_down(T data, T filling, ushort d) {
  int lane = (int)ts_t.simd_lane;
  T a = ts_simd_read(data, lane + (int)d);
  T b = ts_simd_read(filling, lane + (int)d - (int)ts_simd_width);
  return lane + (int)d < (int)ts_simd_width ? a : b;
}
template <class T> inline T simd_shuffle_and_fill_up(T data, T filling, ushort d, ushort m) {
  int lane = (int)ts_t.simd_lane, base = lane - lane % (int)m, in = lane % (int)m;
  T a = ts_simd_read(data, lane - (int)d);
  T b = ts_simd_read(filling, base + in - (int)d + (int)m);
  return in >= (int)d ? a : b;
}
template <class T> inline T simd_shuffle_and_fill_down(T data, T filling, ushort d, ushort m) {
  int lane = (int)ts_t.simd_lane, base = lane - lane % (int)m, in = lane % (int)m;
  T a = ts_simd_read(data, lane + (int)d);
  T b = ts_simd_read(filling, base + in + (int)d - (int)m);
  return in + (int)d < (int)m ? a : b;
}
template <class T> inline T simd_prefix_exclusive_sum(T x) {
  if (!ts_c) return T(0);
  ts_put(x); ts_yield(2);
  T acc = T(0);
  for (int i = ts_simd_base(); i < ts_c->cur; ++i) acc = T(acc + ts_get<T>(i));
  ts_yield(2);
  return acc;
}
template <class T> inline T simd_prefix_inclusive_sum(T x) { return T(simd_prefix_exclusive_sum(x) + x); }
template <class T> inline T simd_prefix_exclusive_product(T x) {
  if (!ts_c) return T(1);
  ts_put(x); ts_yield(2);
  T acc = T(1);
  for (int i = ts_simd_base(); i < ts_c->cur; ++i) acc = T(acc * ts_get<T>(i));
  ts_yield(2);
  return acc;
}
template <class T> inline T simd_prefix_inclusive_product(T x) { return T(simd_prefix_exclusive_product(x) * x); }
template <class T> inline T simd_shuffle_rotate_down(T x, ushort d) {
  return ts_simd_read(x, (int)((ts_t.simd_lane + d) % ts_simd_width)); }
template <class T> inline T simd_shuffle_rotate_up(T x, ushort d) {
  return ts_simd_read(x, (int)((ts_t.simd_lane + ts_simd_width - d % ts_simd_width) % ts_simd_width)); }
}  // namespace metal
/* the compiler builtins Metal's own headers (and MLX's bf16_math.h) call */
#define TS_BUILTIN(name) \
  template <class... A> inline auto __metal_##name(A... a) { return metal::name(a...); }
TS_BUILTIN(simd_sum) TS_BUILTIN(simd_product) TS_BUILTIN(simd_max) TS_BUILTIN(simd_min)
TS_BUILTIN(simd_and) TS_BUILTIN(simd_or) TS_BUILTIN(simd_xor) TS_BUILTIN(simd_broadcast)
TS_BUILTIN(simd_prefix_exclusive_sum) TS_BUILTIN(simd_prefix_inclusive_sum)
TS_BUILTIN(simd_prefix_exclusive_product) TS_BUILTIN(simd_prefix_inclusive_product)
TS_BUILTIN(simd_shuffle) TS_BUILTIN(simd_shuffle_down) TS_BUILTIN(simd_shuffle_up)
TS_BUILTIN(simd_shuffle_xor) TS_BUILTIN(simd_shuffle_rotate_down) TS_BUILTIN(simd_shuffle_rotate_up)
TS_BUILTIN(simd_shuffle_and_fill_up) TS_BUILTIN(simd_shuffle_and_fill_down)
template <class T> inline T __metal_get_simdgroup_size(T) { return T(32); }
#define __METAL_MAYBE_FAST_MATH__ 0
#define __METAL_FAST_MATH__ 1
#define __METAL_PRECISE_MATH__ 2
#define TS_MB1(name) inline float __metal_##name(float x, int = 0) { return metal::name(x); }
#define TS_MB2(name) inline float __metal_##name(float x, float y, int = 0) { return metal::name(x, y); }
TS_MB1(acos) TS_MB1(acosh) TS_MB1(asin) TS_MB1(asinh) TS_MB1(atan) TS_MB1(atanh) TS_MB1(ceil)
TS_MB1(cos) TS_MB1(cosh) TS_MB1(cospi) TS_MB1(exp) TS_MB1(exp10) TS_MB1(exp2) TS_MB1(fabs)
TS_MB1(floor) TS_MB1(fract) TS_MB1(log) TS_MB1(log10) TS_MB1(log2) TS_MB1(rint) TS_MB1(round)
TS_MB1(rsqrt) TS_MB1(sin) TS_MB1(sinh) TS_MB1(sinpi) TS_MB1(sqrt) TS_MB1(tan) TS_MB1(tanh)
TS_MB1(tanpi) TS_MB1(trunc)
TS_MB2(atan2) TS_MB2(fmax) TS_MB2(fmin) TS_MB2(fmod) TS_MB2(nextafter) TS_MB2(pow) TS_MB2(powr)
inline float __metal_divide(float x, float y, int = 0) { return x / y; }
inline float __metal_fma(float a, float b, float c, int = 0) { return __builtin_fmaf(a, b, c); }
inline float __metal_fmax3(float a, float b, float c, int = 0) { return __builtin_fmaxf(a, __builtin_fmaxf(b, c)); }
inline float __metal_fmin3(float a, float b, float c, int = 0) { return __builtin_fminf(a, __builtin_fminf(b, c)); }
inline float __metal_fmedian3(float a, float b, float c, int = 0) {
  return __builtin_fmaxf(__builtin_fminf(a, b), __builtin_fminf(__builtin_fmaxf(a, b), c)); }
inline float __metal_frexp(float x, int* e) { return __builtin_frexpf(x, e); }
inline float __metal_frexp(float x, thread int& e) { return __builtin_frexpf(x, &e); }
inline float __metal_ldexp(float x, int k, int = 0) { return __builtin_ldexpf(x, k); }

/* Attribute values of the current thread, converted to the parameter's declared type. */
template <class T> struct ts_attr_cast {
  static T get(uint3 v) { return T(v.x); }
};
template <class U> struct ts_attr_cast<ts_vec<U, 2>> {
  static ts_vec<U, 2> get(uint3 v) { return ts_vec<U, 2>(U(v.x), U(v.y)); }
};
template <class U> struct ts_attr_cast<ts_vec<U, 3>> {
  static ts_vec<U, 3> get(uint3 v) { return ts_vec<U, 3>(U(v.x), U(v.y), U(v.z)); }
};

/* Run ``body(bufs)`` for every thread of the grid (dispatchThreads: threadgroups of ``tg``,
   the last ones partial). Cooperative: each threadgroup's threads as fibers. */
typedef void (*ts_body_fn)(void**);
static thread_local ts_body_fn ts_body;
static thread_local void** ts_bufs;
static void ts_fiber() { ts_body(ts_bufs); ts_c->state[ts_c->cur] = 1; }

static void ts_launch(uint3 grid, uint3 tg, bool cooperative, ts_body_fn body, void** bufs) {
  uint3 n_tg((grid.x + tg.x - 1) / tg.x, (grid.y + tg.y - 1) / tg.y, (grid.z + tg.z - 1) / tg.z);
  ts_body = body;
  ts_bufs = bufs;
  for (uint gz = 0; gz < n_tg.z; ++gz)
  for (uint gy = 0; gy < n_tg.y; ++gy)
  for (uint gx = 0; gx < n_tg.x; ++gx) {
    uint3 base(gx * tg.x, gy * tg.y, gz * tg.z);
    uint3 size(grid.x - base.x < tg.x ? grid.x - base.x : tg.x,
               grid.y - base.y < tg.y ? grid.y - base.y : tg.y,
               grid.z - base.z < tg.z ? grid.z - base.z : tg.z);
    int n = (int)(size.x * size.y * size.z);
    ts_thread proto;
    proto.tg_pos = uint3(gx, gy, gz); proto.grid_size = grid; proto.tg_size = size;
    proto.n_tg = n_tg; proto.n_simd = (n + ts_simd_width - 1) / ts_simd_width;
    auto fill = [&](ts_thread& t, int i) {
      t = proto;
      t.pos_tg = uint3(i % size.x, (i / size.x) % size.y, i / (size.x * size.y));
      t.pos_grid = base + t.pos_tg;
      t.index_tg = i; t.simd_lane = i % ts_simd_width; t.simd_group = i / ts_simd_width;
    };
    if (!cooperative) {
      for (int i = 0; i < n; ++i) { fill(ts_t, i); body(bufs); }
      continue;
    }
    ts_coop c;
    const size_t stack = 64 * 1024;
    c.n = n;
    c.ctx = new ucontext_t[n];
    c.stacks = new char[(size_t)n * stack];
    c.th = new ts_thread[n];
    c.state = new int[n];
    ts_c = &c;
    for (int i = 0; i < n; ++i) {
      fill(c.th[i], i);
      c.state[i] = 0;
      getcontext(&c.ctx[i]);
      c.ctx[i].uc_stack.ss_sp = c.stacks + (size_t)i * stack;
      c.ctx[i].uc_stack.ss_size = stack;
      c.ctx[i].uc_link = &c.main;
      makecontext(&c.ctx[i], ts_fiber, 0);
    }
    for (;;) {
      bool ran = false;
      for (int i = 0; i < n; ++i) {
        if (c.state[i] != 0) continue;
        c.cur = i; ts_t = c.th[i];
        swapcontext(&c.main, &c.ctx[i]);
        ran = true;
      }
      if (ran) continue;
      /* everything blocked: release whole simdgroups at a collective, or the whole
         threadgroup at a barrier */
      bool released = false, all_done = true, all_barrier = true;
      for (int i = 0; i < n; ++i) {
        if (c.state[i] != 1) all_done = false;
        if (c.state[i] == 2) all_barrier = false;
      }
      if (all_done) break;
      for (int s = 0; s < n; s += ts_simd_width) {
        int e = s + (int)ts_simd_width < n ? s + (int)ts_simd_width : n;
        bool coll = true, any = false;
        for (int i = s; i < e; ++i) {
          if (c.state[i] == 3) coll = false;
          if (c.state[i] == 2) any = true;
        }
        if (coll && any) {
          for (int i = s; i < e; ++i) if (c.state[i] == 2) c.state[i] = 0;
          released = true;
        }
      }
      if (!released && all_barrier)
        for (int i = 0; i < n; ++i) if (c.state[i] == 3) { c.state[i] = 0; released = true; }
      if (!released) { __builtin_trap(); }  /* threads wait on different collectives */
    }
    ts_c = nullptr;
    delete[] c.ctx; delete[] c.stacks; delete[] c.th; delete[] c.state;
  }
}

/* A kernel argument bound by buffer index, converting to the parameter's type whatever it
   is (template parameters included): a pointer, or a reference to the buffer's first
   element (``constant uint& size``). */
struct ts_buffer {
  void* p;
  template <class T> operator T*() const { return (T*)p; }
  template <class T> operator T&() const { return *(T*)p; }
};
/* A thread attribute, converting to the parameter's declared type (uint, uint2, uint3). */
struct ts_attribute {
  uint3 v;
  template <class T> operator T() const { return ts_attr_cast<T>::get(v); }
};
