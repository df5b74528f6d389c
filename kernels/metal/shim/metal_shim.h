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
     float and rounded back), numeric_limits, select / clamp / min / max / fma;
   - atomic<T> and the atomic_*_explicit functions (one OS thread runs the grid: plain
     loads and stores), simd_* reductions / shuffles and threadgroup_barrier, which run the
     threads of a threadgroup as cooperative fibers (ucontext) when the kernel uses them.

   What it does not: threadgroup memory is not shared between threads (the runner refuses
   sources that declare it), no textures, no simdgroup matrices, no double. Timing on the
   shim says nothing about a GPU. */
#pragma once
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <ucontext.h>

#define device
#define constant
#define thread
#define threadgroup
#define METAL_FUNC inline
#define METAL_CONST_PROGRAM
#define TS_SHIM 1

using uint = unsigned int;
using ushort = unsigned short;
using uchar = unsigned char;
using half = _Float16;
using float16_t = _Float16;
using size_t = std::size_t;

/* ---- bfloat: the top 16 bits of a float, rounded to nearest even ------------------- */
struct bfloat {
  uint16_t bits;
  static uint16_t from_float(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  bfloat() = default;
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>
  constexpr bfloat(T v) : bits(from_float((float)v)) {}
  operator float() const { uint32_t u = (uint32_t)bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
  bfloat operator-() const { bfloat r; r.bits = bits ^ 0x8000u; return r; }
};
using bfloat16_t = bfloat;

template <class T> struct ts_is_bf : std::false_type {};
template <> struct ts_is_bf<bfloat> : std::true_type {};
#define TS_BF_BINOP(op)                                                                 \
  inline bfloat operator op(bfloat a, bfloat b) { return bfloat((float)a op (float)b); } \
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>             \
  inline auto operator op(bfloat a, T b) { return (float)a op b; }                       \
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>             \
  inline auto operator op(T a, bfloat b) { return a op (float)b; }
TS_BF_BINOP(+) TS_BF_BINOP(-) TS_BF_BINOP(*) TS_BF_BINOP(/)
#define TS_BF_CMP(op)                                                                   \
  inline bool operator op(bfloat a, bfloat b) { return (float)a op (float)b; }           \
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>             \
  inline bool operator op(bfloat a, T b) { return (float)a op b; }                       \
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>>             \
  inline bool operator op(T a, bfloat b) { return a op (float)b; }
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

/* ---- metal:: math: float, with half / bfloat computed in float and rounded back ------ */
namespace metal {
template <class T> struct numeric_limits : std::numeric_limits<T> {};
template <> struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true;
  static bfloat infinity() { bfloat r; r.bits = 0x7f80; return r; }
  static bfloat quiet_NaN() { bfloat r; r.bits = 0x7fc0; return r; }
  static bfloat max() { bfloat r; r.bits = 0x7f7f; return r; }
  static bfloat lowest() { bfloat r; r.bits = 0xff7f; return r; }
  static bfloat min() { bfloat r; r.bits = 0x0080; return r; }
  static bfloat epsilon() { bfloat r; r.bits = 0x3c00; return r; }
};
template <class T> using ts_f = std::conditional_t<std::is_integral<T>::value, float, T>;
#define TS_MATH1(name, fn)                                                              \
  inline float name(float x) { return fn(x); }                                           \
  inline half name(half x) { return (half)fn((float)x); }                                \
  inline bfloat name(bfloat x) { return bfloat(fn((float)x)); }                          \
  template <class T, class = std::enable_if_t<std::is_integral<T>::value>>               \
  inline float name(T x) { return fn((float)x); }
#define TS_MATH2(name, fn)                                                              \
  inline float name(float x, float y) { return fn(x, y); }                               \
  inline half name(half x, half y) { return (half)fn((float)x, (float)y); }              \
  inline bfloat name(bfloat x, bfloat y) { return bfloat(fn((float)x, (float)y)); }
#define TS_ALL_MATH                                                                     \
  TS_MATH1(exp, __builtin_expf) TS_MATH1(exp2, __builtin_exp2f) TS_MATH1(exp10, ts_exp10f) \
  TS_MATH1(log, __builtin_logf) TS_MATH1(log2, __builtin_log2f) TS_MATH1(log10, __builtin_log10f) \
  TS_MATH1(sin, __builtin_sinf) TS_MATH1(cos, __builtin_cosf) TS_MATH1(tan, __builtin_tanf) \
  TS_MATH1(asin, __builtin_asinf) TS_MATH1(acos, __builtin_acosf) TS_MATH1(atan, __builtin_atanf) \
  TS_MATH1(sinh, __builtin_sinhf) TS_MATH1(cosh, __builtin_coshf) TS_MATH1(tanh, __builtin_tanhf) \
  TS_MATH1(asinh, __builtin_asinhf) TS_MATH1(acosh, __builtin_acoshf) TS_MATH1(atanh, __builtin_atanhf) \
  TS_MATH1(sqrt, __builtin_sqrtf) TS_MATH1(rsqrt, ts_rsqrtf) TS_MATH1(cbrt, __builtin_cbrtf) \
  TS_MATH1(floor, __builtin_floorf) TS_MATH1(ceil, __builtin_ceilf) TS_MATH1(trunc, __builtin_truncf) \
  TS_MATH1(round, __builtin_roundf) TS_MATH1(rint, __builtin_rintf) TS_MATH1(fabs, __builtin_fabsf) \
  TS_MATH1(log1p, __builtin_log1pf) TS_MATH1(expm1, __builtin_expm1f) TS_MATH1(erf, __builtin_erff) \
  TS_MATH2(pow, __builtin_powf) TS_MATH2(powr, __builtin_powf) TS_MATH2(atan2, __builtin_atan2f) \
  TS_MATH2(fmod, __builtin_fmodf) TS_MATH2(copysign, __builtin_copysignf) TS_MATH2(fmin, __builtin_fminf) \
  TS_MATH2(fmax, __builtin_fmaxf) TS_MATH2(nextafter, __builtin_nextafterf)
inline float ts_exp10f(float x) { return __builtin_powf(10.0f, x); }
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
TS_SIMD_REDUCE(simd_or, T(0), T(acc | v))
TS_SIMD_REDUCE(simd_and, T(~T(0)), T(acc & v))
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
template <class T> inline T simd_prefix_exclusive_sum(T x) {
  if (!ts_c) return T(0);
  ts_put(x); ts_yield(2);
  T acc = T(0);
  for (int i = ts_simd_base(); i < ts_c->cur; ++i) acc = T(acc + ts_get<T>(i));
  ts_yield(2);
  return acc;
}
template <class T> inline T simd_prefix_inclusive_sum(T x) { return T(simd_prefix_exclusive_sum(x) + x); }
}  // namespace metal

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
template <class T> static inline T ts_attr(uint3 v) { return ts_attr_cast<T>::get(v); }
template <class T> static inline T ts_attr(uint v) { return ts_attr_cast<T>::get(uint3(v, 0, 0)); }

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

/* A kernel argument bound by buffer index: a pointer, or a reference to the buffer's
   first element (``constant uint& size``). */
template <class T> struct ts_arg_s { static T get(void* p) { return (T)p; } };
template <class T> struct ts_arg_s<T&> { static T& get(void* p) { return *(T*)p; } };
template <class T> static inline decltype(auto) ts_arg(void* p) { return ts_arg_s<T>::get(p); }
