/* CUDA C++ on the host, as far as the loop IR's CUDA kernels use it (a test tool:
 * tests/cuda_host.py compiles a rendered kernel against it with g++ and runs it on numpy
 * buffers). A block's threads run as cooperative fibers (ucontext), one block at a time:
 * __syncthreads releases the block once every thread is there, __shfl_xor_sync a warp once
 * its 32 lanes are (each lane's value left in a slot, read after all have written, then a
 * second meeting before the slots are reused), so the warp merges, group memory and
 * barriers of a kernel run as a GPU orders them. __shared__ arrays are statics (one block
 * at a time). Half types: __half through _Float16, __nv_bfloat16 as its 16 bits rounded to
 * nearest even. Atomics are plain read-modify-writes (a fiber yields only at a meeting).
 * Fast intrinsics are their libm functions (__expf is expf): values match a
 * GPU's to its intrinsics' error, no closer; nothing here says how fast a GPU runs.
 * Tensor-core kernels' device functions (below): mma.sync and ldmatrix as warp collectives,
 * cp.async as copies queued per thread that land at its wait. */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __CUDACC__ 1
#define TS_CUDA_HOST_SHIM 1  /* kernels' inline PTX gives way to the emulations below */

using std::isinf;
using std::isnan;

struct ts_dim3 { unsigned x = 0, y = 0, z = 0; };
static ts_dim3 threadIdx, blockIdx, blockDim, gridDim;

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };

struct __half { _Float16 h; };
static inline float __half2float(__half v) { return (float)v.h; }
static inline __half __float2half_rn(float f) { __half r; r.h = (_Float16)f; return r; }
struct __nv_bfloat16 { uint16_t b; };
static inline float __bfloat162float(__nv_bfloat16 v) {
  uint32_t u = (uint32_t)v.b << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  __nv_bfloat16 r;
  if (std::isnan(f)) { r.b = (uint16_t)((u >> 16) | 0x40); return r; }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.b = (uint16_t)(u >> 16); return r; }

static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
/* (glibc declares __expf / __logf but does not export them) */
#define __expf expf
#define __logf logf
static inline float __fdividef(float a, float b) { return a / b; }

/* ---- a block as fibers ------------------------------------------------------------- */
struct ts_copy { void* dst; const void* src; bool ok; };
struct ts_block {
  ucontext_t main;
  ucontext_t* ctx = nullptr;
  char* stacks = nullptr;
  int* state = nullptr;  /* 0 runnable, 1 done, 2 at a warp collective, 3 at a barrier */
  int n = 0, cur = -1;
  unsigned char (*slot)[16] = nullptr;
  uint32_t (*frag)[8] = nullptr;  /* a lane's mma operands (tensor-core emulation) */
  std::vector<struct ts_copy>* copies = nullptr;  /* a thread's cp.async copies not yet waited on */
};
static ts_block* ts_b = nullptr;

static inline void ts_yield(int why) {
  ts_b->state[ts_b->cur] = why;
  swapcontext(&ts_b->ctx[ts_b->cur], &ts_b->main);
}

static inline void __syncthreads() { ts_yield(3); }
static inline void __threadfence_system() {}
static inline void __threadfence() {}
/* atomics: a fiber yields only at a meeting, so a read-modify-write is one step */
template <class T> static inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
template <class T> static inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <class T> static inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T atomicMin(T* p, T v) { T o = *p; if (v < o) *p = v; return o; }

template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
  static_assert(sizeof(T) <= 16, "a lane's value");
  std::memcpy(ts_b->slot[ts_b->cur], &v, sizeof(T));
  ts_yield(2);
  int lane = ts_b->cur & 31, src = (ts_b->cur - lane) + (lane ^ o);
  T r = v;
  if (src < ts_b->n) std::memcpy(&r, ts_b->slot[src], sizeof(T));
  ts_yield(2);
  return r;
}

typedef void (*ts_kernel_fn)(void**);
static ts_kernel_fn ts_fn;
static void** ts_args;
static void ts_fiber() { ts_fn(ts_args); ts_b->state[ts_b->cur] = 1; }

/* Run ``fn(args)`` over ``grid`` blocks of ``block`` threads. Returns 0, or -1 when the
   block's threads wait on different meetings (a kernel that would hang or diverge). */
static int ts_launch(unsigned grid, unsigned block, ts_kernel_fn fn, void** args) {
  ts_fn = fn, ts_args = args;
  gridDim.x = grid, gridDim.y = gridDim.z = 1;
  blockDim.x = block, blockDim.y = blockDim.z = 1;
  const size_t stack = 128 * 1024;
  ts_block b;
  b.n = (int)block;
  b.ctx = new ucontext_t[block];
  b.stacks = new char[(size_t)block * stack];
  b.state = new int[block];
  b.slot = new unsigned char[block][16];
  b.frag = new uint32_t[block][8];
  b.copies = new std::vector<ts_copy>[block];
  ts_b = &b;
  int rc = 0;
  for (unsigned g = 0; g < grid && rc == 0; ++g) {
    blockIdx.x = g;
    for (int i = 0; i < b.n; ++i) {
      b.state[i] = 0;
      b.copies[i].clear();  /* (a block's copies never waited on land nowhere) */
      getcontext(&b.ctx[i]);
      b.ctx[i].uc_stack.ss_sp = b.stacks + (size_t)i * stack;
      b.ctx[i].uc_stack.ss_size = stack;
      b.ctx[i].uc_link = &b.main;
      makecontext(&b.ctx[i], ts_fiber, 0);
    }
    for (;;) {
      bool ran = false;
      for (int i = 0; i < b.n; ++i) {
        if (b.state[i] != 0) continue;
        b.cur = i;
        threadIdx.x = (unsigned)i;
        swapcontext(&b.main, &b.ctx[i]);
        ran = true;
      }
      if (ran) continue;
      bool done = true, barrier = true, released = false;
      for (int i = 0; i < b.n; ++i) {
        done = done && b.state[i] == 1;
        barrier = barrier && (b.state[i] == 3 || b.state[i] == 1);
      }
      if (done) break;
      for (int w = 0; w < b.n; w += 32) {  /* a warp whose every lane is at its collective */
        int e = w + 32 < b.n ? w + 32 : b.n;
        bool all = true;
        for (int i = w; i < e; ++i) all = all && b.state[i] == 2;
        if (all) {
          for (int i = w; i < e; ++i) b.state[i] = 0;
          released = true;
        }
      }
      if (!released && barrier) {
        for (int i = 0; i < b.n; ++i) if (b.state[i] == 3) b.state[i] = 0;
        released = true;
      }
      if (!released) { rc = -1; break; }
    }
  }
  ts_b = nullptr;
  delete[] b.ctx; delete[] b.stacks; delete[] b.state; delete[] b.slot; delete[] b.frag; delete[] b.copies;
  return rc;
}

/* A kernel's parameters from CUDA's launch form (params[i] points at argument i's value). */
template <class... A, size_t... I>
static void ts_invoke(void (*k)(A...), void** p, std::index_sequence<I...>) {
  k(*(std::remove_cv_t<std::remove_reference_t<A>>*)p[I]...);
}
template <class... A> static void ts_invoke(void (*k)(A...), void** p) {
  ts_invoke(k, p, std::index_sequence_for<A...>{});
}

/* ``TS_ENTRY(name)``: ``extern "C" int ts_run_<name>(grid, block, params)``. */
#define TS_ENTRY(name)                                                              \
  static void ts_body_##name(void** p) { ts_invoke(&name, p); }                     \
  extern "C" int ts_run_##name(unsigned grid, unsigned block, void** params) {      \
    return ts_launch(grid, block, ts_body_##name, params); }

/* ---- the tensor cores: mma.sync as a warp collective ---------------------------------
 * Each lane leaves its A (4 registers) and B (2) fragments in its slot, the warp meets,
 * each lane computes its four accumulators from every lane's fragments (PTX ISA's layouts:
 * g = lane / 4, t = lane % 4; D (g, 2t + {0, 1}) and (g + 8, ...)), the warp meets again
 * before the slots are reused. Products are exact (TF32 x TF32 and half x half fit a
 * double), summed in double and added to the float32 accumulator once. */
static inline float ts_tf32_value(uint32_t u) { return __uint_as_float(u & 0xffffe000u); }
static inline unsigned ts_tf32(float x) {  /* cvt.rna.tf32.f32: to nearest, ties away */
  uint32_t u; std::memcpy(&u, &x, 4);
  if (std::isnan(x) || std::isinf(x)) return u;
  return (u + 0x1000u) & 0xffffe000u;
}
static inline float ts_exp2(float x) { return exp2f(x); }
static inline float ts_ldg_f32(const float* p) { return *p; }
static inline unsigned short ts_bits(__half x) { uint16_t u; std::memcpy(&u, &x.h, 2); return u; }
static inline unsigned short ts_bits(__nv_bfloat16 x) { return x.b; }

static inline void ts_mma_meet(const unsigned* a, const unsigned* b) {
  uint32_t* f = ts_b->frag[ts_b->cur];
  for (int i = 0; i < 4; i++) f[i] = a[i];
  f[4] = b[0], f[5] = b[1];
  ts_yield(2);
}
/* A 16x8 (a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)), B 8x8 (b0 (t, g),
   b1 (t + 4, g)), TF32 in 32-bit registers */
static inline void ts_mma_tf32_16x8x8(float* d, const unsigned* a, const unsigned* b) {
  ts_mma_meet(a, b);
  int lane = ts_b->cur & 31, w = ts_b->cur - lane, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; i++) {
    int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
    double acc = 0;
    for (int k = 0; k < 8; k++) {
      float av = ts_tf32_value(ts_b->frag[w + (r % 8) * 4 + k % 4][(r / 8) + 2 * (k / 4)]);
      float bv = ts_tf32_value(ts_b->frag[w + c * 4 + k % 4][4 + k / 4]);
      acc += (double)av * (double)bv;
    }
    d[i] = (float)((double)d[i] + acc);
  }
  ts_yield(2);
}
template <class H> static inline float ts_half_value(uint32_t reg, int hi);
template <> inline float ts_half_value<__half>(uint32_t reg, int hi) {
  __half x; uint16_t u = (uint16_t)(hi ? reg >> 16 : reg); std::memcpy(&x.h, &u, 2); return (float)x.h; }
template <> inline float ts_half_value<__nv_bfloat16>(uint32_t reg, int hi) {
  __nv_bfloat16 x; x.b = (uint16_t)(hi ? reg >> 16 : reg); return __bfloat162float(x); }
/* A 16x16 (a0 (g, 2t..2t+1), a1 (g + 8, ..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..)), B 16x8
   (b0 (2t..2t+1, g), b1 (2t + 8.., g)): two 16-bit values a register, the lower k low */
template <class H> static inline void ts_mma_16x8x16(float* d, const unsigned* a, const unsigned* b) {
  ts_mma_meet(a, b);
  int lane = ts_b->cur & 31, w = ts_b->cur - lane, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; i++) {
    int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
    double acc = 0;
    for (int k = 0; k < 16; k++) {
      float av = ts_half_value<H>(ts_b->frag[w + (r % 8) * 4 + (k % 8) / 2][(r / 8) + 2 * (k / 8)], k & 1);
      float bv = ts_half_value<H>(ts_b->frag[w + c * 4 + (k % 8) / 2][4 + k / 8], k & 1);
      acc += (double)av * (double)bv;
    }
    d[i] = (float)((double)d[i] + acc);
  }
  ts_yield(2);
}
static inline void ts_mma_bf16_16x8x16(float* d, const unsigned* a, const unsigned* b) {
  ts_mma_16x8x16<__nv_bfloat16>(d, a, b); }
static inline void ts_mma_f16_16x8x16(float* d, const unsigned* a, const unsigned* b) {
  ts_mma_16x8x16<__half>(d, a, b); }

/* ---- ldmatrix: four 8x8 16-bit matrices as a warp collective ----------------------------
 * Lane i leaves the address of row i % 8 of matrix i / 8 (16 bytes, 16-byte aligned, else
 * abort: the GPU faults) in its slot; the warp meets; register m of lane (g, t) gets matrix
 * m's row g, columns 2t, 2t + 1 (.trans: rows 2t, 2t + 1 of column g, row 2t low). */
static inline const unsigned char* ts_ldsm_row(int w, int m, int r) {
  const unsigned char* p;
  std::memcpy(&p, ts_b->slot[w + m * 8 + r], sizeof p);
  return p;
}
/* ldmatrix phases whose eight rows share a bank group (16-byte chunk index mod 8): bank
   conflicts on the GPU; cuda_host.launch fails a launch that had any */
static long ts_ldsm_conflict_count = 0;
extern "C" long ts_ldsm_conflicts() { long n = ts_ldsm_conflict_count; ts_ldsm_conflict_count = 0; return n; }
static inline void ts_ldsm_meet(const void* p) {
  if ((uintptr_t)p % 16) abort();
  std::memcpy(ts_b->slot[ts_b->cur], &p, sizeof p);
  ts_yield(2);
  int lane = ts_b->cur & 31, w = ts_b->cur - lane;
  if (lane < 4) {  /* (one lane a matrix checks it) */
    unsigned seen = 0;
    for (int r = 0; r < 8; r++) seen |= 1u << (((uintptr_t)ts_ldsm_row(w, lane, r) >> 4) & 7);
    if (seen != 0xffu) ts_ldsm_conflict_count++;
  }
}
static inline void ts_ldsm_x4(unsigned* r, const void* p) {
  ts_ldsm_meet(p);
  int lane = ts_b->cur & 31, w = ts_b->cur - lane, g = lane >> 2, t = lane & 3;
  for (int m = 0; m < 4; m++) std::memcpy(&r[m], ts_ldsm_row(w, m, g) + 4 * t, 4);
  ts_yield(2);
}
static inline void ts_ldsm_x4_t(unsigned* r, const void* p) {
  ts_ldsm_meet(p);
  int lane = ts_b->cur & 31, w = ts_b->cur - lane, g = lane >> 2, t = lane & 3;
  for (int m = 0; m < 4; m++) {
    uint16_t lo, hi;
    std::memcpy(&lo, ts_ldsm_row(w, m, 2 * t) + 2 * g, 2);
    std::memcpy(&hi, ts_ldsm_row(w, m, 2 * t + 1) + 2 * g, 2);
    r[m] = (unsigned)lo | ((unsigned)hi << 16);
  }
  ts_yield(2);
}

/* ---- cp.async: a thread's copies are queued and land at its wait ---------------------
 * (16 bytes, both ends 16-byte aligned, else abort; zeros where !ok), so a kernel that
 * reads a tile before its wait and barrier reads the old contents, as a GPU may. */
static inline void ts_cp_async16(void* s, const void* g, bool ok) {
  if ((uintptr_t)s % 16 || (ok && (uintptr_t)g % 16)) abort();
  ts_b->copies[ts_b->cur].push_back(ts_copy{s, g, ok});
}
static inline void ts_cp_async_commit() {}
static inline void ts_cp_async_wait_all() {
  for (const ts_copy& c : ts_b->copies[ts_b->cur]) {
    if (c.ok) std::memcpy(c.dst, c.src, 16);
    else std::memset(c.dst, 0, 16);
  }
  ts_b->copies[ts_b->cur].clear();
}
