"""``RandomBits`` and ``ErfInv`` as generated C on the CPU: the two rules ``mx.random.normal``
spends its time in (``sqrt(2) * erfinv(uniform)``, as ``mlx/random.cpp`` composes it).

``RandomBits``: MLX's threefry2x32 (20 rounds) per counter pair, the words laid out per key as
``kernels/rules/random.py`` lays them (bit for bit MLX's). ``ErfInv``: the rule's algorithm
(``kernels/rules/elementwise_special.py``: Giles' approximation in double, Newton steps on
erf; glibc's double ``erf`` here), one step for float32 and narrower, three for float64,
rounded once to the output type (half types get the double result and round in numpy).
Both are built once through the kernel cache (``compiler.get_kernel``); without a compiler
(or on a failed build) the primitive's array-module rule runs, recorded as a
``kernel_fallback``.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import timeline
from ..codegen.render import C_THREADS, LIBMVEC_2_35
from ..fallback import run_rule
from ..primitives import REGISTRY, by_kernel
from . import compiler

_SMALL = 1 << 14
_entries: dict = {}

# the threads of a parallel loop: the cores other processes leave free (render.py's ts_threads,
# the elementwise kernels' rule: a loop of more threads than free cores waits at its end for a
# preempted one)
_THREEFRY = "#undef _FORTIFY_SOURCE\n" + C_THREADS + r"""
#include <stdint.h>
static inline void threefry(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1,
                            uint32_t* o0, uint32_t* o1) {
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  static const int R[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  uint32_t x0 = c0 + ks[0], x1 = c1 + ks[1];
  for (int i = 0; i < 5; i++) {
    for (int r = 0; r < 4; r++) {
      x0 += x1;
      x1 = (x1 << R[i % 2][r]) | (x1 >> (32 - R[i % 2][r]));
      x1 ^= x0;
    }
    x0 += ks[(i + 1) % 3];
    x1 += ks[(i + 2) % 3] + (uint32_t)(i + 1);
  }
  *o0 = x0;
  *o1 = x1;
}

/* out (keys, words): words j and half + odd + j from counter (j, half + odd + j); an odd
   middle word from counter (half, 0) */
void random_bits_threefry(void** args) {
  const uint32_t* keys = (const uint32_t*)args[0];
  uint32_t* out = (uint32_t*)args[1];
  const int64_t nk = (int64_t)args[2], words = (int64_t)args[3];
  const int64_t half = words / 2, odd = words % 2;
  /* over keys, on the free cores (ts_threads); one key, or little work: no parallel region */
  const int nt = nk > 1 && nk * words > 65536 ? ts_threads() : 1;
  #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (int64_t k = 0; k < nk; k++) {
    const uint32_t k0 = keys[2 * k], k1 = keys[2 * k + 1];
    uint32_t* o = out + k * words;
    #pragma omp simd
    for (int64_t j = 0; j < half; j++) {
      uint32_t a, b;
      threefry(k0, k1, (uint32_t)j, (uint32_t)(j + half + odd), &a, &b);
      o[j] = a;
      o[j + half + odd] = b;
    }
    if (odd) {
      uint32_t a, b;
      threefry(k0, k1, (uint32_t)half, 0u, &a, &b);
      o[half] = a;
    }
  }
}
"""

_ERFINV = r"""
#include <stdint.h>
#include <math.h>
/* Giles' approximation and Newton steps on erf, branch-free so that the loop vectorises
   (both of Giles' polynomials computed, one selected; log / sqrt / erf / exp from libmvec
   where VECTOR_MATH declares them) */
static inline double giles(double y) {
  const double w = -log((1.0 - y) * (1.0 + y));
  const double w1 = w - 2.5, w2 = sqrt(w) - 3.0;
  double p = 2.81022636e-08, q = -0.000200214257;
  p = 3.43273939e-07 + p * w1; p = -3.5233877e-06 + p * w1; p = -4.39150654e-06 + p * w1;
  p = 0.00021858087 + p * w1; p = -0.00125372503 + p * w1; p = -0.00417768164 + p * w1;
  p = 0.246640727 + p * w1; p = 1.50140941 + p * w1;
  q = 0.000100950558 + q * w2; q = 0.00134934322 + q * w2; q = -0.00367342844 + q * w2;
  q = 0.00573950773 + q * w2; q = -0.0076224613 + q * w2; q = 0.00943887047 + q * w2;
  q = 1.00167406 + q * w2; q = 2.83297682 + q * w2;
  return (w < 5.0 ? p : q) * y;
}

static inline OUT_T erfinv_one(const double y) {
  const int inside = fabs(y) < 1.0;
  const double ys = inside ? y : 0.0;
  double x = giles(ys);
  for (int s = 0; s < STEPS; s++)
    x = x - (erf(x) - ys) / (1.1283791670955126 * exp(-x * x));
  return (OUT_T)(inside ? x : y == 1.0 ? INFINITY : y == -1.0 ? -INFINITY : NAN);
}

/* below 16384 elements, or with one core free (ts_threads), one thread and no parallel
   region: an ``if`` clause on ``parallel for simd`` would turn the simd off too (OpenMP 5
   applies it to every construct of the combination: the loop ran scalar, ~5x slower) */
void NAME(void** args) {
  const IN_T* a = (const IN_T*)args[0];
  OUT_T* out = (OUT_T*)args[1];
  const int64_t n = (int64_t)args[2];
  const int nt = n <= 16384 ? 1 : ts_threads();
  if (nt == 1) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = erfinv_one((double)a[i]);
    return;
  }
  #pragma omp parallel for simd schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; i++) out[i] = erfinv_one((double)a[i]);
}
"""

def _erfinv_source(name: str, in_t: str, out_t: str, steps: int, vector_math: tuple) -> str:
    """The erfinv kernel's C, its log / exp (and erf, which glibc 2.35's libmvec has beside
    the stems of ``LIBMVEC_2_35``) declared ``omp declare simd`` where libmvec has them."""
    fns = [fn for fn in ("log", "exp") if fn in vector_math]
    if set(LIBMVEC_2_35) <= set(vector_math):
        fns.append("erf")
    decls = "".join(f"#pragma omp declare simd notinbranch\ndouble {fn}(double);\n"
                    for fn in fns)
    return ("#undef _FORTIFY_SOURCE\n" + C_THREADS +
            f"#define NAME {name}\n#define IN_T {in_t}\n#define OUT_T {out_t}\n"
            f"#define STEPS {steps}\n#include <math.h>\n" + decls + _ERFINV)


def _entry(name: str, source_fn):
    """The kernel ``name`` (its C from ``source_fn(toolchain)``), or the BuildError."""
    got = _entries.get(name)
    if got is not None and got[0] == compiler.generation():
        return got[1]
    try:
        entry = compiler.get_kernel(name, "contiguous", source_fn)
    except compiler.BuildError as e:
        entry = e
    _entries[name] = (compiler.generation(), entry)
    return entry


def _call(entry, ptrs: list, small: bool, name: str, prim: str) -> None:
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    t0 = timeline.now() if timeline.enabled else 0
    entry.fast_fn(gil=small)(argv)
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=name, device="cpu",
                     detail={"runtime": "cpu", "variant": "contiguous", "primitive": prim,
                             "tier": "kernel"})
    entry.hits += 1


_fallback = run_rule  # (prim, why, xp, args, kw): the definition's rule, recorded


def random_bits(xp, keys, *, shape, width):
    kw = dict(shape=shape, width=width)
    size = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    k = np.ascontiguousarray(keys, dtype=np.uint32).reshape(-1, 2)
    nk = k.shape[0]
    if size == 0 or nk == 0 or width not in (1, 2, 4):
        return REGISTRY["RandomBits"].rule(xp, keys, **kw)
    entry = _entry("random_bits_threefry", lambda tc: _THREEFRY)
    if isinstance(entry, compiler.BuildError):
        return _fallback("RandomBits", str(entry), xp, (keys,), kw)
    bytes_per_key = width * (size // nk)
    words = (bytes_per_key + 3) // 4
    chunk = np.empty((nk, words), "<u4")
    _call(entry, [k.ctypes.data, chunk.ctypes.data, nk, words], chunk.size < _SMALL,
          "random_bits_threefry", "RandomBits")
    raw = chunk.view(np.uint8)[:, :bytes_per_key]
    out_dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    return np.ascontiguousarray(raw).view(out_dtype).reshape(shape)


_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def erfinv(xp, a, out=None):
    dt = a.dtype
    if a.size == 0 or dt.kind != "f" and dt.name != "bfloat16":
        return REGISTRY["ErfInv"].rule(xp, a, out=out)
    src = a if dt in _C_TYPES else a.astype(np.float32)  # float16 / bfloat16 values are exact
    res_dt = dt if dt in _C_TYPES else np.dtype(np.float64)  # rounded once, below
    steps = 3 if dt == np.float64 else 1
    name = f"erfinv_{_C_TYPES[src.dtype]}_{_C_TYPES[res_dt]}"
    entry = _entry(name, lambda tc: _erfinv_source(name, _C_TYPES[src.dtype], _C_TYPES[res_dt],
                                                   steps, tc.vector_math))
    if isinstance(entry, compiler.BuildError):
        return _fallback("ErfInv", str(entry), xp, (a,), {"out": out})
    src = np.ascontiguousarray(src)
    target = out if (out is not None and res_dt == dt and out.dtype == dt and
                     out.flags.c_contiguous and out.shape == a.shape) else None
    res = target if target is not None else np.empty(a.shape, res_dt)
    _call(entry, [src.ctypes.data, res.ctypes.data, a.size], a.size < _SMALL, name, "ErfInv")
    if res_dt != dt:
        res = res.astype(dt)
        if out is not None and out.shape == res.shape and out.dtype == dt:
            out[...] = res
            return out
    return res


# primitive name -> rule, for the definitions that name these kernels (PrimitiveDef.kernel)
RULES: dict = by_kernel({"random_bits": random_bits, "erfinv": erfinv})
