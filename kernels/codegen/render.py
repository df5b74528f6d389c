"""One C-family source renderer for fused tapes: the kernel's structure written once, dialects
as tables, runtime scheduling as a layer beside the dialect.

``CFamily`` is the renderer: the argument list (MLX's order), loads and stores (with the
float16 / bfloat16 conversions and per-op rounding), one line per tape op, the constants,
the math calls and the helpers a kernel uses. A *dialect* is a subclass that fills in
tables only: type names, qualifiers, literals (``INFINITY`` / ``NAN``), the half-type load /
store / round spellings, math names and helper functions, the thread index and the kernel
prefix. ``CDialect`` is the CPU's; ``cuda.CUDADialect`` and ``metal.MetalDialect`` the GPUs'.

A *schedule* turns the structure into loops: ``CpuSchedule`` (OpenMP, streaming stores for
large outputs, tiles for transposed inputs; ``void <name>(void** args)``) and
``schedule.GpuSchedule`` (one thread per ``work_per_thread`` elements, ``_contiguous`` /
``_strided_<n>`` / ``_strided_dynamic`` and their ``_large`` forms, block size). Each dialect
names its schedule; ``render(tape, name, contiguous, ndim, large)`` asks it.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence

import ml_dtypes
import numpy as np

from ..primitives import BROADCAST, REGISTRY, spellings
from .c_ops import Unsupported, _is_float, _is_half, helper_source
from .tape import Tape, TapeInput

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")

INTEGER_TYPES = {
    np.dtype(np.bool_): "bool", np.dtype(np.int8): "int8_t", np.dtype(np.int16): "int16_t",
    np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t",
    np.dtype(np.uint8): "uint8_t", np.dtype(np.uint16): "uint16_t",
    np.dtype(np.uint32): "uint32_t", np.dtype(np.uint64): "uint64_t",
}


class CFamily:
    """The renderer: the kernel's structure, over a dialect's tables."""

    name = "c-family"
    type_names: dict = {}
    # primitive name -> fn(dialect, args, out_dtype, in_dtype) -> expression (the ``c=`` spellings)
    code_for_op: dict[str, Callable] = {}
    # MLX primitive name -> libm function stem (float versions take the ``f`` suffix)
    math_functions: dict[str, str] = {}
    # -- the tables a dialect fills in ---------------------------------------------------
    kernel_prefix = "void"  # before the kernel's name
    function_prefix = "static inline "  # before each helper function
    infinity, nan = "INFINITY", "NAN"
    half_load: dict = {}  # half dtype -> format of a load into float ({} = the reference)
    half_store: dict = {}  # half dtype -> format of a float stored as that dtype
    half_round: dict = {}  # half dtype -> format of a float rounded to that dtype
    math_names: dict = {}  # libm stem -> the dialect's function (float32 / any) when renamed
    own_math: dict = {}  # libm stem -> our own float32 function (bodies in ``own_source``)
    # the loop IR's thread tables (codegen/lower.py) that a GPU dialect may leave empty
    ir_thread_params: tuple = ()  # kernel parameters that give a thread its place
    ir_thread_setup: tuple = ()  # lines that name it at the kernel's top
    ir_simd: dict = {}  # accumulator -> a one-call group reduction (Metal's simd_sum)
    ir_simd_types: tuple = ()  # the dtypes that call takes
    own_source: dict = {}  # function name -> its source
    prelude = ""  # includes and the half-type helpers
    lacks: tuple = ()  # C words the dialect has no such thing for (Metal: ``double``)
    schedule = None  # the loops: a CpuSchedule or GpuSchedule

    # -- types ---------------------------------------------------------------------------
    def storage_type(self, dt: np.dtype) -> str:
        dt = np.dtype(dt)
        try:
            return self.type_names[dt]
        except KeyError:
            raise Unsupported(f"dtype {dt} has no {self.name} type") from None

    def compute_type(self, dt: np.dtype) -> str:
        """The type arithmetic happens in: float for float16/bfloat16, else the storage type."""
        return "float" if _is_half(np.dtype(dt)) else self.storage_type(dt)

    @staticmethod
    def compute_dtype(dt):
        return _F32 if _is_half(np.dtype(dt)) else np.dtype(dt)

    def load(self, dt: np.dtype, ref: str) -> str:
        fmt = self.half_load.get(np.dtype(dt))
        return fmt.format(ref) if fmt else ref

    def store(self, dt: np.dtype, expr: str) -> str:
        fmt = self.half_store.get(np.dtype(dt))
        return fmt.format(expr) if fmt else expr

    def round_to(self, dt: np.dtype, expr: str) -> str:
        """Round a computed value to ``dt``'s precision (identity except for half types)."""
        fmt = self.half_round.get(np.dtype(dt))
        return fmt.format(expr) if fmt else expr

    def half_from_double(self, dt: np.dtype, expr: str) -> str:
        """A double rounded once to half type ``dt``, in the compute type."""
        return f"({self.compute_type(dt)})({self.storage_type(dt)}){expr}"

    def literal(self, x: TapeInput) -> str:
        dt = np.dtype(x.dtype)
        v = x.constant
        if dt.kind == "b":
            return "1" if bool(v) else "0"
        if dt.kind in "iu":
            iv = int(v)
            if dt.itemsize == 8:
                if dt.kind == "i" and iv == -(2**63):
                    return "(-9223372036854775807LL - 1)"
                return f"{iv}{'ULL' if dt.kind == 'u' else 'LL'}"
            return str(iv)
        if dt.kind == "c":
            raise Unsupported("complex constants")
        f = float(v)
        if np.isnan(f):
            return self.nan
        if np.isinf(f):
            return self.infinity if f > 0 else f"(-{self.infinity})"
        if dt == np.float64:
            return repr(f)
        text = str(np.float32(f))  # shortest text that round-trips in float32
        if "." not in text and "e" not in text:
            text += ".0"
        return text + "f"

    def math(self, stem: str, dt: np.dtype) -> str:
        named = self.math_names.get(stem)
        if named:
            return named
        return stem if np.dtype(dt) == np.float64 else stem + "f"

    def _fn_name(self, stem: str, dt: np.dtype) -> str:
        """The function a math op calls for compute dtype ``dt``."""
        if stem in self.own_math and self.compute_dtype(dt) == np.float32:
            return self.own_math[stem]
        return self.math(stem, self.compute_dtype(dt))

    def exp_name(self, dt: np.dtype) -> str:
        """The exp function the kernels call for values of dtype ``dt``."""
        return self._fn_name("exp", dt)

    def op_expr(self, prim: str, args: list, out_dt: np.dtype, in_dt: np.dtype) -> str:
        stem = self.math_functions.get(prim)
        if stem in self.own_math and _is_float(in_dt) and self.compute_dtype(in_dt) == np.float32:
            return f"{self.own_math[stem]}({args[0]})"
        if stem is not None:
            if not _is_float(in_dt):
                raise Unsupported(f"{prim} on {in_dt}")
            return f"{self.math(stem, in_dt)}({args[0]})"
        fn = self.code_for_op.get(prim)
        if fn is None:
            raise Unsupported(f"no {self.name} spelling for {prim}")
        expr = fn(self, args, np.dtype(out_dt), np.dtype(in_dt))
        for word in self.lacks:
            if re.search(rf"\b{word}\b", expr):
                raise Unsupported(f"{self.name} has no {word} ({prim} on {in_dt})")
        return expr

    # -- the kernel's structure ----------------------------------------------------------
    def arguments(self, tape: Tape, contiguous: bool) -> list:
        """The kernel's arguments in MLX's order, as (kind, name, dtype): per non-constant
        input its data (``in``) and, strided and not a scalar, its element strides
        (``strides``); each output (``out``); then ``size`` (contiguous) or ``shape``."""
        args = []
        values = getattr(self, "scalar_by_value", False)
        for x in tape.non_constant_inputs:
            args.append(("value" if values and x.by_value else "in", x.name, x.dtype))
            if not contiguous and not x.scalar:
                args.append(("strides", f"{x.name}_strides", None))
        for oname, _, dt in self.outputs(tape):
            args.append(("out", oname, dt))
        args.append(("size", "size", None) if contiguous else ("shape", "shape", None))
        return args

    @staticmethod
    def outputs(tape: Tape) -> list:
        """(argument name, tape value, dtype) per output."""
        return [(f"out{j}", name, tape.dtype_of(name)) for j, name in enumerate(tape.outputs)]

    def body(self, tape: Tape, loads: dict, indent: str) -> list:
        """Loads, one line per op, and the output temporaries, in tape order."""
        lines = []
        for x in tape.inputs:
            ct = self.compute_type(x.dtype)
            if x.is_constant:
                lines.append(f"{indent}{ct} tmp_{x.name} = {self.literal(x)};")
            else:
                lines.append(f"{indent}{ct} tmp_{x.name} = {self.load(x.dtype, loads[x.name])};")
        for op in tape.ops:
            in_dt = tape.dtype_of(op.inputs[0]) if op.inputs else op.dtype
            args = [f"tmp_{n}" for n in op.inputs]
            n = self.small_power(tape, op, in_dt)
            if n:  # x ** n by multiplying in double, rounded once (as powf rounds)
                expr = f"({self.compute_type(in_dt)})(" + " * ".join(
                    [f"(double){args[0]}"] * n) + ")"
            else:
                expr = self.op_expr(op.primitive, args, op.dtype, in_dt)
            lines.append(f"{indent}{self.compute_type(op.dtype)} tmp_{op.name} = "
                         f"{self.round_to(op.dtype, expr)};")
        return lines

    exact_small_powers = False  # dialects with a double type set it (not MSL)

    def small_power(self, tape: Tape, op: Any, in_dt: np.dtype) -> int:
        """n when ``op`` is ``Power`` of a float32 / half value to a constant n in 2..4 (read
        through Broadcast) and the dialect can multiply in double: a float's cube is exact
        in 72 bits and within an ulp once rounded, as ``powf`` is, while ``powf`` is a
        scalar call per element (60x the whole GELU kernel's other work). Else 0."""
        if not self.exact_small_powers or not REGISTRY[op.primitive].power or len(op.inputs) != 2:
            return 0
        dt = np.dtype(in_dt)
        if not (dt.kind == "f" and dt.itemsize <= 4 or dt == _BF16):
            return 0
        name = op.inputs[1]
        producers = {o.name: o for o in tape.ops}
        while name in producers and REGISTRY[producers[name].primitive].family == BROADCAST:
            name = producers[name].inputs[0]
        x = next((x for x in tape.inputs if x.name == name and x.is_constant), None)
        if x is None:
            return 0
        try:
            v = float(np.asarray(x.constant))
        except (TypeError, ValueError):
            return 0
        return int(v) if v in (2.0, 3.0, 4.0) else 0

    def stores(self, tape: Tape, ref: Callable, indent: str) -> list:
        """One store per output: ``ref(argument name)`` is the element it writes."""
        return [f"{indent}{ref(o)} = {self.store(dt, f'tmp_{n}')};" for o, n, dt in self.outputs(tape)]

    # -- the preamble: what the kernel calls ---------------------------------------------
    def helper(self, text: str) -> str:
        """A helper function's source in this dialect (C's is the text itself)."""
        return text

    def math_decls(self, used: set) -> str:
        return ""

    def preamble(self, tape: Tape) -> str:
        used = set()
        helpers: dict = {}
        unary = set(self.math_functions.values())
        for op in tape.ops:
            in_dt = tape.dtype_of(op.inputs[0]) if op.inputs else op.dtype
            stem = self.math_functions.get(op.primitive)
            if stem:
                used.add(self._fn_name(stem, in_dt))
                continue
            if op.primitive not in self.code_for_op:
                continue
            # other spellings may call math functions or helpers: find them in the text
            expr = self.op_expr(op.primitive, [f"a{k}" for k in range(len(op.inputs))],
                                op.dtype, in_dt)
            helpers.update(helper_source(expr))
            for fn in _CALL.findall(expr):
                if fn in self.own_source or fn in unary or (fn.endswith("f") and fn[:-1] in unary):
                    used.add(fn)
        own = "".join(self.own_source[f] for f in sorted(used) if f in self.own_source)
        sched = self.schedule.preamble if self.schedule is not None else ""
        return (self.prelude + sched + own + self.math_decls(used)
                + "".join(self.helper(helpers[k]) for k in sorted(helpers)))

    def render(self, tape: Tape, kernel_name: str, contiguous: bool, ndim: int,
               large: bool) -> str:
        """The source of one variant of ``tape`` (the schedule's loops over this dialect)."""
        return self.schedule.render(self, tape, kernel_name, contiguous, ndim, large)

    def module(self, tape: Tape, lib_name: str) -> str:
        """Every variant of ``tape`` in one source (GPU schedules: what a runtime compiles once)."""
        return self.schedule.module(self, tape, lib_name)


# ---------------------------------------------------------------------------------------
# The C dialect's op tables, read off the primitive definitions (``c=`` in kernels/rules/):
# a libm stem (``"exp"``) goes in C_MATH, a spelling function in C_OPS.

C_MATH: dict[str, str] = {n: s for n, s in spellings("c").items() if isinstance(s, str)}
C_OPS: dict[str, Callable] = {n: s for n, s in spellings("c").items() if not isinstance(s, str)}

# libm functions glibc's libmvec has vector versions of (glibc >= 2.35 for most).
LIBMVEC_2_22 = ("exp", "log", "sin", "cos", "pow")
LIBMVEC_2_35 = ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "exp2",
                "expm1", "log10", "log1p", "log2", "sinh", "tan", "tanh")

# Ubuntu's gcc defines _FORTIFY_SOURCE at -O1 and up: glibc's fortified ``open`` is a variadic
# always-inline wrapper whose argument check folds only when the caller is optimised, so in
# the unoptimised ts_runnable / ts_threads (TS_UNOPTIMISED) it fails the build ("call to
# '__open_too_many_args' declared with attribute error"). The kernels call no libc function
# that fortification checks: off, before the first header reads it.
_C_PRELUDE = r"""#undef _FORTIFY_SOURCE
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include <math.h>

static inline float ts_bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } v; v.u = ((uint32_t)h) << 16; return v.f;
}
static inline uint16_t ts_f32_to_bf16(float f) {
  union { uint32_t u; float f; } v; v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
static inline float ts_round_bf16(float f) { return ts_bf16_to_f32(ts_f32_to_bf16(f)); }
/* float16 from and to its bits in integer and float32 arithmetic that gcc vectorises (gcc 12
   converts a _Float16 one value at a time, even with F16C): exact both ways, the store
   rounding to nearest even with subnormals, overflow to inf and a quiet NaN keeping the
   sign and the payload's top bits, as x86's vcvtps2ph (Maratyszcza's FP16 library's
   fp16_ieee_to_fp32_value / fp16_ieee_from_fp32_value; no FTZ / DAZ-sensitive step) */
static inline float ts_f16_to_f32(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16, two_w = w + w;
  union { uint32_t u; float f; } n, d, r;
  n.u = (two_w >> 4) + (0xE0u << 23); n.f *= 0x1.0p-112f;
  d.u = (two_w >> 17) | (126u << 23); d.f -= 0.5f;
  r.u = (w & 0x80000000u) | (two_w < (1u << 27) ? d.u : n.u);
  return r.f;
}
static inline uint16_t ts_f32_to_f16(float f) {
  union { uint32_t u; float f; } v, b, s; v.f = f;
  const uint32_t two_w = v.u + v.u;
  uint32_t bias = two_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  s.u = (v.u & 0x7FFFFFFFu); s.f = (s.f * 0x1.0p+112f) * 0x1.0p-110f;
  b.u = (bias >> 1) + 0x07800000u; b.f += s.f;
  const uint32_t bits = ((b.u >> 13) & 0x7C00u) + (b.u & 0x0FFFu);
  const uint32_t nan = 0x7E00u | ((v.u >> 13) & 0x3FFu);
  return (uint16_t)(((v.u >> 16) & 0x8000u) | (two_w > 0xFF000000u ? nan : bits));
}
static inline float ts_round_f16(float f) { return ts_f16_to_f32(ts_f32_to_f16(f)); }
"""

# Streaming (non-temporal) stores for large outputs: the output is written around the caches,
# which saves the read-for-ownership of every output line (a quarter of the traffic of
# ``o = f(x, y)``). Values are untouched: only the store instruction differs.
_C_STREAM = r"""#if (defined(__AVX__) || defined(__SSE2__)) && (defined(__clang__) || defined(__GNUC__))
/* compiler builtins rather than <immintrin.h>, which costs ~0.4 s of every build */
#define TS_STREAM 1
/* The staging block is written as the output's element type and read here as vectors:
   ``may_alias`` and the memcpy load keep that legal under strict aliasing (a plain
   ``long long`` vector read let gcc -O3 -march=native drop or reorder the staging stores). */
#if defined(__AVX__)
#define TS_VW 32
typedef long long ts_vec __attribute__((vector_size(32), aligned(32), may_alias));
#else
#define TS_VW 16
typedef long long ts_vec __attribute__((vector_size(16), aligned(16), may_alias));
#endif
static inline void ts_stream(void* dst, const void* src, size_t n) {
  for (size_t k = 0; k < n; k += TS_VW) {
    ts_vec v;
    __builtin_memcpy(&v, (const char*)src + k, TS_VW);
#if defined(__clang__)
    __builtin_nontemporal_store(v, (ts_vec*)((char*)dst + k));
#elif defined(__AVX__)
    __builtin_ia32_movntdq256((ts_vec*)((char*)dst + k), v);
#else
    __builtin_ia32_movntdq((ts_vec*)((char*)dst + k), v);
#endif
  }
}
static inline void ts_sfence(void) { __builtin_ia32_sfence(); }
#else
#define TS_STREAM 0
#endif
"""

# The threads a parallel loop of a CPU kernel takes: the cores other processes' sustained load
# leaves free, as cpu/threads.py fits BLAS's (``free_cores``: one rule, its docstring says why).
# A parallel loop of more threads than free cores waits at its end for a thread the scheduler
# preempted: an in-place 2^20-element multiply-add on the 2-core machine of record at load 4.5
# took 1.2-1.4 ms on the mean with two threads against 0.46-0.65 on one (its median about
# equal), 0.28 against 0.48 when a core is free.
_C_THREADS = r"""#ifdef _OPENMP
#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
int omp_get_max_threads(void);
/* ts_runnable and ts_threads run at most every 0.1 s and wait on /proc's syscalls: unoptimised,
   they take gcc a quarter less of the GELU kernel's build (cc1: 432M -> 330M instructions) */
#if defined(__clang__)
#define TS_UNOPTIMISED __attribute__((optnone, noinline))
#elif defined(__GNUC__)
#define TS_UNOPTIMISED __attribute__((optimize("O0")))
#else
#define TS_UNOPTIMISED
#endif
/* 1 when the thread whose stat file is at `path` is runnable (its state field 'R') */
TS_UNOPTIMISED static int ts_runnable(const char* path) {
  const int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  char buf[512];
  const ssize_t k = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (k <= 0) return 0;
  buf[k] = 0;
  const char* p = buf + k;
  while (p > buf && *p != ')') --p;  /* "pid (comm) S ...": comm may hold spaces */
  return p[0] == ')' && p[1] == ' ' && p[2] == 'R';
}
/* The cores other processes leave free, as cpu/threads.py's free_cores: OpenMP's count less
   the other processes' runnable tasks now (/proc/loadavg's running count less this process's
   own runnable threads), counting no more of them than the 1-minute load average holds
   besides this process (rounded, less 1): a quiet machine's passing task (a kworker, the
   nice-19 khugepaged) takes no core. At least 1; sampled at most every 0.1 s */
TS_UNOPTIMISED static int ts_threads(void) {
  static int cached = 0;
  static long long at = 0;
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  const long long now = (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
  const int c = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (c > 0 && now - __atomic_load_n(&at, __ATOMIC_RELAXED) < 100) return c;
  const int max = omp_get_max_threads();  /* libgomp's: the cores of this process's affinity */
  int n = max;
  const int fd = open("/proc/loadavg", O_RDONLY);
  if (fd >= 0) {
    char buf[128];
    const ssize_t k = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (k > 0) {  /* "0.50 0.40 0.30 R/T last": the 1-minute average, R runnable tasks */
      buf[k] = 0;
      const char* p = buf;
      int sustained = 0;  /* round(1-minute average) - 1 */
      while (*p >= '0' && *p <= '9') sustained = sustained * 10 + (*p++ - '0');
      if (*p == '.' && p[1] >= '5' && p[1] <= '9') ++sustained;
      --sustained;
      for (int sp = 0; *p && sp < 3; ++p) sp += *p == ' ';
      int running = 0;
      while (*p >= '0' && *p <= '9') running = running * 10 + (*p++ - '0');
      if (sustained > 0 && running > 1) {  /* else no other load counts: no task scan */
        int own = 1;  /* this thread, runnable while it reads */
        DIR* dir = opendir("/proc/self/task");
        if (dir) {
          own = 0;
          char path[64] = "/proc/self/task/";
          for (struct dirent* e; (e = readdir(dir)) != NULL;) {
            int j = 16;
            for (const char* q = e->d_name; *q >= '0' && *q <= '9' && j < 40; ++q) path[j++] = *q;
            if (j == 16) continue;
            __builtin_memcpy(path + j, "/stat", 6);
            own += ts_runnable(path);
          }
          closedir(dir);
          if (own < 1) own = 1;
        }
        const int others = running > own ? running - own : 0;
        n = max - (others < sustained ? others : sustained);
      }
    }
  }
  if (n > max) n = max;
  if (n < 1) n = 1;
  __atomic_store_n(&cached, n, __ATOMIC_RELAXED);
  __atomic_store_n(&at, now, __ATOMIC_RELAXED);
  return n;
}
#else
static int ts_threads(void) { return 1; }
#endif
"""
C_THREADS = _C_THREADS  # ts_threads() for the hand-written kernels' C (cpu/random_kernels.py,
# codegen/quantized.py): the same rule for every parallel loop of the CPU


# The threads of a loop-IR kernel's parallel range (``lower.Lowering.parallel``): OpenMP's
# count, one per core; 1 without OpenMP
_C_CORES = r"""#ifdef _OPENMP
int omp_get_max_threads(void);
#define ts_cores() omp_get_max_threads()
#else
#define ts_cores() 1
#endif
"""


# Our own float32 math (see ``CDialect.own_math``): branch-free so ``omp simd`` vectorises it.
# k = round(x/ln2), r = x - k*ln2 (two-part ln2, exact high product), the degree-7 Taylor
# polynomial p = exp(r): the body both float32 exps share (``ti`` holds k + 0x4b400000)
_EXPF_POLY = r"""  const float shift = 12582912.0f;
  const float t = x * 1.44269502f + shift;
  const float k = t - shift;
  int32_t ti; memcpy(&ti, &t, 4);
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float q = 1.98412698e-4f;
  q = q * r + 1.38888889e-3f;
  q = q * r + 8.33333333e-3f;
  q = q * r + 4.16666667e-2f;
  q = q * r + 1.66666667e-1f;
  q = q * r + 0.5f;
  const float p = 1.0f + (r + (r * r) * q);
"""

_C_OWN_MATH = {"ts_expf": r"""#include <string.h>
/* exp for float32, within 1.01 ulp: k = round(x/ln2), r = x - k*ln2 (two-part ln2, exact
   high product), degree-7 Taylor polynomial, scaling by 2^k in two steps so that subnormal
   results round once; |x| > 104 is clamped (the result is already 0 or inf), NaN passes. */
static inline float ts_expf(float xf) {
  uint32_t xb; memcpy(&xb, &xf, 4);
  const uint32_t ab = xb & 0x7fffffffu;
  const uint32_t over = -(uint32_t)(ab > 0x42d00000u);
  const uint32_t cb = (xb & ~over) | (((xb & 0x80000000u) | 0x42d00000u) & over);
  float x; memcpy(&x, &cb, 4);
""" + _EXPF_POLY + r"""  const int32_t ki = ti - 0x4b400000;
  const int32_t k1 = ki / 2, k2 = ki - k1;
  const int32_t s1b = (k1 + 127) << 23, s2b = (k2 + 127) << 23;
  float s1, s2; memcpy(&s1, &s1b, 4); memcpy(&s2, &s2b, 4);
  float y = (p * s1) * s2;
  uint32_t yb; memcpy(&yb, &y, 4);
  const uint32_t nan = -(uint32_t)(ab > 0x7f800000u);
  yb = (yb & ~nan) | (xb & nan);
  memcpy(&y, &yb, 4);
  return y;
}
""", "ts_expf_neg": r"""#include <string.h>
/* the steps as fused multiply-adds where the CPU has them (one rounding each, half the
   instructions of softmax's and logsumexp's exp pass); a multiply and an add elsewhere */
#if defined(__FMA__) || defined(__AVX512F__)
#define ts_fmaf(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define ts_fmaf(a, b, c) ((a) * (b) + (c))
#endif
/* exp for x <= 0 (or NaN), within 1.01 ulp where the result is a normal float (ts_expf's
   reduction and polynomial, its steps fused); x < -87.68 gives 0, NaN passes. The exp pass
   is bound by this chain's latency and its instruction count (the vector unit's queue holds
   two or three elements' chains), so the reduction is fused too: t = x/ln2 + shift in one
   step (k the same integer), r = x - k*ln2 in two (k*ln2's high part is exact either way):
   the same worst error (1.0108 ulp at -5.89055 over every 7th float of [-87.33, 0], 1.0333
   over every float), 17% less time a pass on AMD Zen 3. The clamp is a max (``x > -88 ?
   x : -88``); NaN gives -88 there and passes at the end. 2^k is made from t's bits at once: the shift's low bits
   are 127 (XNNPACK's "magic bias"), so t's low mantissa bits hold k + 127 and ``ti << 23``
   is the float 2^k, and y = p * 2^k: one shift and one multiply where the exponent add took
   three integer steps and the flush a compare and a mask (the clamp keeps k >= -127, whose
   2^k bits are 0: y = 0 below -87.68; k = -126 gives p * 2^-126, a subnormal rounded once).
   Every normal result is bit for bit the exponent add's (checked over all floats of
   [-inf, 0]); the pass 9% faster on Zen 3. Horner's order and the final unfused
   ``1 + (r + r*r*q)`` stay: Estrin's order and a fused last step were faster still and
   reached 1.03-1.04 ulp. */
#ifndef TS_EXPF_NEG_ANY
#define TS_EXPF_NEG_ANY
/* the same without NaN's pass (a NaN argument gives some number): for a caller whose
   result is NaN anyway when an argument is (logsumexp's z + log(sum): z is NaN then) */
static inline float ts_expf_neg_any(float xf) {
  const float x = xf > -88.0f ? xf : -88.0f;
  const float shift = 12583039.0f;  /* 1.5 * 2^23 + 127 */
  const float t = ts_fmaf(x, 1.44269502f, shift);
  const float k = t - shift;
  int32_t ti; memcpy(&ti, &t, 4);
  float r = ts_fmaf(k, -0.693359375f, x);
  r = ts_fmaf(k, 2.12194440e-4f, r);
  float q = 1.98412698e-4f;
  q = ts_fmaf(q, r, 1.38888889e-3f);
  q = ts_fmaf(q, r, 8.33333333e-3f);
  q = ts_fmaf(q, r, 4.16666667e-2f);
  q = ts_fmaf(q, r, 1.66666667e-1f);
  q = ts_fmaf(q, r, 0.5f);
  const float p = 1.0f + (r + (r * r) * q);
  const int32_t sb = (int32_t)((uint32_t)ti << 23);
  float s; memcpy(&s, &sb, 4);
  return p * s;
}
#endif
#ifndef TS_EXPF_NEG
#define TS_EXPF_NEG
static inline float ts_expf_neg(float xf) {
  const float y = ts_expf_neg_any(xf);
  return xf != xf ? xf : y;
}
#endif
"""}
# exp of x <= 0 whose NaN arguments need no NaN result (the first part of ts_expf_neg's
# source: the two may be in one kernel, each definition guarded)
_C_OWN_MATH["ts_expf_neg_any"] = _C_OWN_MATH["ts_expf_neg"].split("#ifndef TS_EXPF_NEG\n")[0]


# A loop function that every part of a kernel calls (``CpuSchedule._range`` / ``_nest_fn``):
# kept one function, which -O3 would inline into each caller or clone per constant argument
_NOINLINE = ["#if defined(__GNUC__) && !defined(__clang__)", "__attribute__((noinline, noclone))",
             "#elif defined(__GNUC__)", "__attribute__((noinline))", "#endif"]


class CpuSchedule:
    """The CPU's loops: OpenMP over large loops, streaming stores for large outputs, 2-D
    tiles when an input is transposed; ``void <name>(void** args)`` (ctypes calls it)."""

    omp_min_size = 1 << 16  # below this the loop runs on one thread
    stream_min_bytes = 1 << 23  # outputs this large (bytes, all outputs) use streaming stores
    stream_block = 512  # elements per block of the streaming loop (staged in a stack buffer)
    tile = 64  # edge of the 2-D tiles the strided kernel walks when an input is transposed
    preamble = _C_STREAM + _C_THREADS

    def render(self, d, tape: Tape, kernel_name: str, contiguous: bool, ndim: int,
               large: bool) -> str:
        """The full C source of one variant of ``tape``."""
        # The variant's contract is how ``size`` is passed: 32 bits unless ``_large``. Loop
        # counters are 64-bit on the CPU either way: with a 32-bit counter the compiler must
        # honour its wrap-around and the vector loop loses its simple addressing (measured:
        # 10-20% slower on the benchmark chains).
        idx = "size_t"
        size_type = "int64_t" if large else "uint32_t"
        ins = tape.non_constant_inputs
        outs = d.outputs(tape)
        args = d.arguments(tape, contiguous)
        decode = []
        for k, (kind, name, dt) in enumerate(args[:-1]):  # the void** calling convention
            if kind == "in":
                decode.append(f"  const {d.storage_type(dt)}* {name} = "
                              f"(const {d.storage_type(dt)}*)args[{k}];")
            elif kind == "strides":
                decode.append(f"  const int64_t* {name} = (const int64_t*)args[{k}];")
            else:
                decode.append(f"  {d.storage_type(dt)}* {name} = ({d.storage_type(dt)}*)args[{k}];")
        lines = [d.preamble(tape)]
        if contiguous:
            lines += self._range(d, tape, ins, outs, idx)
        else:
            lines += self._nest_fn(d, tape, ins, outs, len(args) - 1, ndim, decode)
        lines.append(f"{d.kernel_prefix} {kernel_name}(void** args) {{")
        lines += decode
        k = len(args) - 1
        if contiguous:
            def run(out_ptrs, lo, hi, oo="0"):
                a = [x.name for x in ins] + list(out_ptrs) + [lo, hi, oo]
                return f"ts_range({', '.join(a)});"

            direct = [o for o, _, _ in outs]
            lines.append(f"  const {idx} size = ({idx})({size_type})(uintptr_t)args[{k}];")
            lines += self._streaming(d, outs, idx, run)
            # below the threshold (or with one core free) one thread, and no parallel region
            # at all: an OpenMP ``if`` clause on ``parallel for simd`` also turns the simd
            # part off (OpenMP 5: it applies to every construct of the combination), and a
            # parallel region of one thread still costs ~0.5 us a call in libgomp. Else one
            # static share per thread, in whole cache lines of every output.
            lines += [f"  const int nt = size < {self.omp_min_size} ? 1 : ts_threads();",
                      "  if (nt == 1) {",
                      f"    {run(direct, '0', 'size')}",
                      "    return;",
                      "  }",
                      f"  const {idx} share = ((size + nt - 1) / nt + 63) & ~({idx})63;",
                      "  #pragma omp parallel for schedule(static) num_threads(nt)",
                      "  for (int t = 0; t < nt; ++t) {",
                      f"    const {idx} lo = ({idx})t * share < size ? ({idx})t * share : size;",
                      f"    {run(direct, 'lo', 'size - lo < share ? size : lo + share')}",
                      "  }"]
        else:
            lines += self._strided(ins, outs, k, ndim)
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _range(self, d, tape, ins, outs, idx) -> list:
        """The contiguous kernel's one loop: elements ``lo`` to ``hi`` of every output,
        element i stored at ``out[i - oo]`` (``oo`` the first element of a staging block,
        else 0). Every part of the kernel calls it (the serial and the threaded loop, the
        streaming path's head, blocks and tail), so gcc vectorises the body once: written
        out in each of the five parts, the copies were most of a first call's compile time
        (the GELU kernel's gcc run: 673M instructions with five copies, 435M with one).
        ``noinline, noclone`` keep it one function (-O3 would inline it into each caller or
        clone it per constant argument); a call costs a few ns against a block of 512."""
        params = ([f"const {d.storage_type(x.dtype)}* {x.name}" for x in ins]
                  + [f"{d.storage_type(dt)}* {o}" for o, _, dt in outs]
                  + [f"{idx} lo", f"{idx} hi", f"{idx} oo"])
        loads = {x.name: (f"{x.name}[0]" if x.scalar else f"{x.name}[i]") for x in ins}
        L = _NOINLINE + [f"static void ts_range({', '.join(params)}) {{"]
        L += ["  #pragma omp simd", f"  for ({idx} i = lo; i < hi; ++i) {{"]
        L += d.body(tape, loads, "    ")
        L += [f"    {o}[i - oo] = {d.store(dt, f'tmp_{n}')};" for o, n, dt in outs]
        L += ["  }", "}"]
        return L

    def _streaming(self, d, outs, idx, run) -> list:
        """The contiguous kernel's path for large outputs: a scalar head up to the vector
        alignment of the outputs, then blocks computed into a stack buffer and streamed out
        (dynamically scheduled, so a thread that starts late takes fewer blocks), then the
        tail; each part a call of the kernel's range loop (``run``). Only when all outputs
        share an itemsize (one alignment phase for all)."""
        sizes = {np.dtype(dt).itemsize for _, _, dt in outs}
        if len(sizes) != 1:
            return []
        isz = sizes.pop()
        blk = self.stream_block
        n_out = len(outs)
        phase = " && ".join([f"((uintptr_t)out0 % {isz}) == 0"] + [
            f"(((uintptr_t){o} - (uintptr_t)out0) % TS_VW) == 0" for o, _, _ in outs[1:]])
        direct = [o for o, _, _ in outs]
        L = ["#if TS_STREAM",
             f"  if ((uint64_t)size * {isz * n_out} >= {self.stream_min_bytes}ULL && {phase}) {{",
             f"    {idx} head = (({idx})((TS_VW - (uintptr_t)out0 % TS_VW) % TS_VW)) / {isz};",
             "    if (head > size) head = size;",
             f"    const {idx} nb = (size - head) / {blk};",
             f"    {run(direct, '0', 'head')}",
             "    #pragma omp parallel num_threads(ts_threads())",
             "    {",
             "    #pragma omp for schedule(dynamic, 64) nowait",
             f"    for ({idx} b = 0; b < nb; ++b) {{",
             f"      const {idx} i0 = head + b * {blk};"]
        L += [f"      {d.storage_type(dt)} ts_{o}[{blk}] __attribute__((aligned(64)));"
              for o, _, dt in outs]
        L += [f"      {run([f'ts_{o}' for o in direct], 'i0', f'i0 + {blk}', 'i0')}"]
        L += [f"      ts_stream({o} + i0, ts_{o}, sizeof(ts_{o}));" for o in direct]
        L += ["    }",
              "    ts_sfence();  /* each thread orders its own streaming stores */",
              "    }",
              f"    {run(direct, f'head + nb * {blk}', 'size')}",
              "    return;", "  }", "#endif"]
        return L

    def _setup(self, ins, outs, k, ndim, stream: bool) -> list:
        """The strided kernel's shape, strides and tiling (and with ``stream``, whether its
        rows stream their output)."""
        L = [f"  const int* shape = (const int*)args[{k}];"]
        arr = [x for x in ins if not x.scalar]
        if ndim == 1:
            L.append("  const int64_t n_rows = 1, n_cols = shape[0], n_outer = 1;")
            for x in arr:
                L.append(f"  const int64_t {x.name}_sr = 0, {x.name}_sc = {x.name}_strides[0];")
        else:
            L.append(f"  const int64_t n_rows = shape[{ndim - 2}], n_cols = shape[{ndim - 1}];")
            L.append("  int64_t n_outer = 1;")
            L.append(f"  for (int d = 0; d < {ndim - 2}; ++d) n_outer *= shape[d];")
            for x in arr:
                L.append(f"  const int64_t {x.name}_sr = {x.name}_strides[{ndim - 2}], "
                         f"{x.name}_sc = {x.name}_strides[{ndim - 1}];")
        # tile only when some input walks its last dim with a large stride (a transpose)
        cond = " || ".join(f"({x.name}_sc > 1 || {x.name}_sc < -1)" for x in arr) or "0"
        unit = " && ".join(f"{x.name}_sc == 1" for x in arr) or "1"
        L.append(f"  const int tiled = {cond};")
        L.append(f"  const int unit = {unit};")
        L.append(f"  const int64_t t_rows = tiled ? {self.tile} : 1, t_cols = tiled ? {self.tile} : n_cols;")
        L.append("  const int64_t n_rt = (n_rows + t_rows - 1) / t_rows, n_ct = (n_cols + t_cols - 1) / t_cols;")
        if not stream:
            return L
        sizes = {np.dtype(dt).itemsize for _, _, dt in outs}
        blk = self.stream_block
        if len(sizes) == 1:
            # rows walked with unit strides stream their output like the contiguous kernel
            isz = sizes.pop()
            phase = " && ".join([f"((uintptr_t)out0 % {isz}) == 0"] + [
                f"(((uintptr_t){o} - (uintptr_t)out0) % TS_VW) == 0" for o, _, _ in outs[1:]])
            L.append("#if TS_STREAM")
            L.append(f"  const int stream = !tiled && unit && n_cols >= {2 * blk} && "
                     f"(uint64_t)(n_outer * n_rows * n_cols) * {isz * len(outs)} >= "
                     f"{self.stream_min_bytes}ULL && {phase};")
            L.append("#else")
            L.append("  const int stream = 0;")
            L.append("#endif")
        else:
            L.append("  const int stream = 0;")
        return L

    def _nest_fn(self, d, tape, ins, outs, k, ndim, decode) -> list:
        """The strided kernel's one loop nest: ``ts_nest(args, f0, f1)`` walks the (outer
        index, row tile) pairs ``f0`` to ``f1`` of ``n_outer * n_rt``, in order; a thread's
        streaming stores are ordered at its end. The serial call and each thread's share
        (``_strided``) call it, so gcc compiles the body once (``_range``'s reason)."""
        arr = [x for x in ins if not x.scalar]
        L = _NOINLINE + ["static void ts_nest(void** args, int64_t f0, int64_t f1) {"]
        L += decode + self._setup(ins, outs, k, ndim, True)
        L += self._nest(d, tape, ins, outs, arr, ndim, self.stream_block)
        L += ["#if TS_STREAM", "  if (stream) ts_sfence();  /* each thread orders its own streaming stores */",
              "#endif", "}"]
        return L

    def _strided(self, ins, outs, k, ndim) -> list:
        """The strided kernel: on one thread below the threshold or with one core free (no
        parallel region: libgomp's costs ~0.5 us a call even with an ``if`` clause false),
        else a static share of the (outer index, row tile) pairs per thread of the free
        cores' (``collapse(2) schedule(static)`` over the two loops, as before)."""
        L = self._setup(ins, outs, k, ndim, False)
        L += ["  const int64_t n_f = n_outer * n_rt;",
              f"  const int nt = n_outer * n_rows * n_cols < {self.omp_min_size} ? 1 : ts_threads();",
              "  if (nt == 1) {",
              "    ts_nest(args, 0, n_f);",
              "    return;",
              "  }",
              "  #pragma omp parallel for schedule(static) num_threads(nt)",
              "  for (int t = 0; t < nt; ++t) ts_nest(args, n_f * t / nt, n_f * (t + 1) / nt);"]
        return L

    def _nest(self, d, tape, ins, outs, arr, ndim, blk) -> list:
        """The strided kernel's loops over (outer index, row tile) pairs ``f0`` to ``f1``,
        column tiles and rows."""
        L = ["  for (int64_t f = f0; f < f1; ++f) {",
             "    const int64_t o = f / n_rt, rt = f % n_rt;"]
        # base offsets of this outer index
        for x in arr:
            L.append(f"    int64_t {x.name}_o = 0;")
        if ndim > 2:
            L.append("    { int64_t rem = o;")
            L.append(f"      for (int d = {ndim - 3}; d >= 0; --d) {{")
            L.append("        int64_t q = rem % shape[d]; rem /= shape[d];")
            for x in arr:
                L.append(f"        {x.name}_o += q * {x.name}_strides[d];")
            L.append("      } }")
        L.append("    for (int64_t ct = 0; ct < n_ct; ++ct) {")
        L.append("    const int64_t r1 = (rt + 1) * t_rows < n_rows ? (rt + 1) * t_rows : n_rows;")
        L.append("    const int64_t c0 = ct * t_cols, c1 = c0 + t_cols < n_cols ? c0 + t_cols : n_cols;")
        L.append("    for (int64_t r = rt * t_rows; r < r1; ++r) {")
        L.append("      const int64_t orow = (o * n_rows + r) * n_cols;")
        for x in arr:
            L.append(f"      const {d.storage_type(x.dtype)}* {x.name}_p = "
                     f"{x.name} + {x.name}_o + r * {x.name}_sr;")
        for j, (oname, name, dt) in enumerate(outs):
            L.append(f"      {d.storage_type(dt)}* {oname}_p = {oname} + orow;")
        for branch, unit_branch in (("if (unit) {", True), ("} else {", False)):
            L.append(f"      {branch}")
            if unit_branch:
                L += self._stream_row(d, tape, ins, outs, blk)
            L.append("      {")
            L.append("      #pragma omp simd")
            L.append("      for (int64_t c = c0; c < c1; ++c) {")
            loads = {}
            for x in ins:
                if x.scalar:
                    loads[x.name] = f"{x.name}[0]"
                else:
                    loads[x.name] = f"{x.name}_p[c]" if unit_branch else f"{x.name}_p[c * {x.name}_sc]"
            L += d.body(tape, loads, "        ")
            for oname, name, dt in outs:
                L.append(f"        {oname}_p[c] = {d.store(dt, f'tmp_{name}')};")
            L.append("      }")
            L.append("      }")
        L.append("      }")
        L.append("    }")
        L.append("    }")
        L.append("  }")
        return L

    def _stream_row(self, d, tape, ins, outs, blk) -> list:
        """One unit-stride row with streaming stores: head to alignment, blocks, tail; the
        ordinary row loop follows in the ``else`` part."""
        def loads_at(c):
            return {x.name: (f"{x.name}[0]" if x.scalar else f"{x.name}_p[{c}]") for x in ins}

        L = ["#if TS_STREAM",
             "      if (stream) {",
             "        int64_t c = c0;",
             "        for (; c < c1 && ((uintptr_t)(out0_p + c) % TS_VW) != 0; ++c) {"]
        L += d.body(tape, loads_at("c"), "          ")
        L += [f"          {o}_p[c] = {d.store(dt, f'tmp_{n}')};" for o, n, dt in outs]
        isz = np.dtype(outs[0][2]).itemsize
        L += ["        }",
              "        /* whole blocks, then a last partial block: its whole vectors streamed too */",
              f"        for (; c < c1; c += {blk}) {{",
              f"          const int64_t m = c1 - c < {blk} ? c1 - c : {blk};",
              f"          const int64_t full = (m * {isz}) / TS_VW * TS_VW / {isz};"]
        L += [f"          {d.storage_type(dt)} ts_{o}[{blk}] __attribute__((aligned(64)));"
              for o, _, dt in outs]
        L += ["          #pragma omp simd",
              "          for (int64_t k = 0; k < m; ++k) {"]
        L += d.body(tape, loads_at("c + k"), "            ")
        L += [f"            ts_{o}[k] = {d.store(dt, f'tmp_{n}')};" for o, n, dt in outs]
        L += ["          }"]
        L += [f"          ts_stream({o}_p + c, ts_{o}, (size_t)full * {isz});" for o, _, _ in outs]
        L += ["          for (int64_t k = full; k < m; ++k) {"]
        L += [f"            {o}_p[c + k] = ts_{o}[k];" for o, _, _ in outs]
        L += ["          }",
              "        }",
              "      } else",
              "#endif"]
        return L




class CDialect(CFamily):
    """Generated C for the CPU: ``void <name>(void** args)``, OpenMP over large loops.

    Arguments, in MLX's order: per non-constant input its data pointer (and, on the
    strided path for a non-scalar input, a pointer to its int64 element strides); each
    output's data pointer; then ``size`` (contiguous) or a pointer to the int32 shape.
    """

    name = "C"
    type_names = {**INTEGER_TYPES, np.dtype(np.float16): "_Float16", _BF16: "uint16_t",
                  np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
    code_for_op = C_OPS
    math_functions = C_MATH
    half_load = {_BF16: "ts_bf16_to_f32({})", _F16: "(float){}"}
    half_store = {_BF16: "ts_f32_to_bf16({})", _F16: "(_Float16)({})"}
    half_round = {_BF16: "ts_round_bf16({})", _F16: "(float)(_Float16)({})"}
    prelude = _C_PRELUDE
    schedule = CpuSchedule()
    omp_min_size, stream_min_bytes = CpuSchedule.omp_min_size, CpuSchedule.stream_min_bytes
    stream_block, tile = CpuSchedule.stream_block, CpuSchedule.tile

    # float32 math with our own vectorisable C instead of libm: glibc's vector ``expf`` is
    # off by up to 2.6 ulp (every other float vector function used here stays within 2),
    # which made chains like exp(-x)*sin(y) less accurate than numpy. ``ts_expf`` is within
    # 1.01 ulp, keeps inf/NaN/overflow/subnormal results, and costs 1.5x the libmvec call
    # (the double-precision ``exp`` would cost 2.3x).
    own_math = {"exp": "ts_expf"}
    # exp of x <= 0 (softmax's and logsumexp's x - max): one scaling step, no overflow
    # clamp; 0 for x below -87.68, subnormal results above it rounded once
    own_math_domain = {("exp", "nonpositive"): "ts_expf_neg",
                       ("exp", "nonpositive_nan_unused"): "ts_expf_neg_any"}
    own_source = _C_OWN_MATH
    exact_small_powers = True
    ir_cpu_threads = _C_CORES  # the loop IR's parallel ranges: one thread per core
    ir_cpu_stream = _C_STREAM  # the loop IR's streamed ranges (``Range.stream``)

    def __init__(self, vector_math: tuple = ()):
        self.vector_math = tuple(vector_math)  # libm stems declared ``omp declare simd``

    def loop_dialect(self) -> "CLoopDialect":
        """The dialect the loop IR's kernels (reductions, norms, attention) render in."""
        return CLoopDialect(self.vector_math)

    def math_decls(self, used: set) -> str:
        decls = []
        for fn in sorted(used):
            stem = fn[:-1] if fn.endswith("f") and fn[:-1] in self.vector_math else fn
            if stem in self.vector_math:
                ct = "double" if fn == stem else "float"
                decls.append(f"#pragma omp declare simd notinbranch\n{ct} {fn}({ct});")
        return "\n".join(decls) + "\n" if decls else ""


# ``a * b + c`` in one instruction where the target has FMA (fmaf / fma of the operands'
# type), else as a multiply and an add (two roundings): for values whose rounding does not
# matter (the max / min tile's NaN witness), never a libm call, which would leave the loop
# scalar on a target without FMA
_C_FMADD = r"""#if defined(__FMA__) || defined(__FMA4__) || defined(__ARM_FEATURE_FMA)
#define ts_fmadd(a, b, c) _Generic((c), double: fma, default: fmaf)((a), (b), (c))
#else
#define ts_fmadd(a, b, c) ((a) * (b) + (c))
#endif
/* two bfloat16 as one 32-bit word (``may_alias``: read from the uint16_t storage): their
   float32 sum, the low element (the first, little-endian) shifted up, the high one masked */
typedef uint32_t ts_u32a __attribute__((may_alias));
static inline float ts_bf16_pair(uint32_t w) {
  union { uint32_t u; float f; } lo, hi; lo.u = w << 16; hi.u = w & 0xFFFF0000u;
  return lo.f + hi.f;
}
"""


class CLoopDialect(CDialect):
    """The C dialect of the loop IR's kernels: float16 held as its bits, as bfloat16 is, its
    loads, stores and rounding through ``ts_f16_to_f32`` / ``ts_f32_to_f16`` /
    ``ts_round_f16``, which gcc vectorises. gcc 12 converts a ``_Float16`` one value at a
    time even with F16C, so a reduction over float16 ran scalar (a row sum 4.0 -> 2.3
    instructions an element, softmax 73 -> 19, logsumexp 102 -> 8.5). The elementwise
    kernels keep ``_Float16``: their loop body is one element's ops, where F16C's scalar
    conversions (one instruction each) beat the vector ones (~1.8 an element): a float16 add
    115 -> 266 us per 100k elements in bits (a chain of exp / sin / tanh 3824 -> 1713)."""

    type_names = {**CDialect.type_names, _F16: "uint16_t"}
    half_load = {**CDialect.half_load, _F16: "ts_f16_to_f32({})"}
    half_store = {**CDialect.half_store, _F16: "ts_f32_to_f16({})"}
    half_round = {**CDialect.half_round, _F16: "ts_round_f16({})"}
    ir_prelude = _C_FMADD

    def loop_dialect(self) -> "CLoopDialect":
        return self

    def half_from_double(self, dt: np.dtype, expr: str) -> str:
        # float16's storage is its bits here: gcc's double -> _Float16 rounds once
        return f"(float)(_Float16){expr}" if np.dtype(dt) == _F16 else super().half_from_double(dt, expr)


DIALECTS = ("c", "cuda", "metal")  # renderer dialects; ``kernel.sources`` keys: cpu, cuda, metal
RUNTIME_DIALECT = {"cpu": "c", "cuda": "cuda", "metal": "metal"}


def renderer(dialect: str = "c", **kw) -> CFamily:
    """The renderer of a dialect by name: ``"c"``, ``"cuda"`` or ``"metal"`` (``"msl"``)."""
    name = dialect.lower()
    if name in ("c", "cpu"):
        return CDialect(**kw)
    if name == "cuda":
        from .cuda import CUDADialect

        return CUDADialect(**kw)
    if name in ("metal", "msl"):
        from .metal import MetalDialect

        return MetalDialect(**kw)
    raise ValueError(f"unknown dialect {dialect!r}")


DYNAMIC_NDIM = 9  # the dimensions a ``strided_dynamic`` name stands for (above every static kernel)


def parse_variant(variant: str) -> tuple:
    """``contiguous[_large]`` / ``strided_<n>[_large]`` / ``strided_dynamic[_large]`` (a GPU
    name) -> (contiguous, ndim, large)."""
    large = variant.endswith("_large")
    base = variant[:-len("_large")] if large else variant
    if base == "contiguous":
        return True, 1, large
    if base.startswith("reduce_"):  # a fused reduction's one variant (rows x cols, strided)
        return False, 2, large
    n = base.split("_")[1]
    return False, DYNAMIC_NDIM if n == "dynamic" else int(n), large


def kernel_sources(tape: Tape, lib_name: str, variant: str, cpu: Optional[str] = None,
                   built: Optional[dict] = None) -> dict:
    """The source of one variant of ``tape`` for every runtime: ``cpu`` (C), ``cuda`` and
    ``metal`` (MSL), named as each runtime names its variant; ``built`` (runtime -> source;
    ``cpu=`` is ``built={"cpu": ...}``) gives the ones the caller has from a runtime's cache;
    a dialect that cannot express the tape gives a comment saying why."""
    from .gpu import variant_suffix

    built = {**({"cpu": cpu} if cpu else {}), **(built or {})}
    if hasattr(tape, "sources"):  # a loop-IR kernel (reduce_kernels.KernelSpec): its three renders
        return tape.sources(built)
    if tape.reduction is not None:  # extended fusion: the reduction schedule is the CPU's
        from .reduction import render as render_reduction

        out = {}
        for runtime, dialect in RUNTIME_DIALECT.items():
            if built.get(runtime):
                out[runtime] = built[runtime]
            elif runtime == "cpu":
                try:
                    out[runtime] = render_reduction(tape, f"{lib_name}_{variant}")
                except Unsupported as e:
                    out[runtime] = f"// no C kernel ({e}); the tape runs with numpy"
            else:
                from .fused_reduce import fused_reduction_source

                d = renderer(dialect)
                try:
                    out[runtime] = fused_reduction_source(tape, f"{lib_name}_{variant}", d)
                except Unsupported as e:
                    out[runtime] = (f"// no {d.name} kernel: the {d.name} dialect cannot "
                                    f"express it ({e})")
        return out
    contiguous, ndim, large = parse_variant(variant)
    out = {}
    for runtime, dialect in RUNTIME_DIALECT.items():
        if built.get(runtime):
            out[runtime] = built[runtime]
            continue
        d = renderer(dialect)
        sched = d.schedule
        suffix = variant if runtime == "cpu" else variant_suffix(contiguous, ndim, large,
                                                                 sched.max_static_ndim)
        try:
            out[runtime] = d.render(tape, f"{lib_name}_{suffix}", contiguous, ndim, large)
        except Unsupported as e:
            out[runtime] = (f"// no {d.name} kernel: the {d.name} dialect cannot express it "
                            f"({e})" + ("; the tape runs with numpy" if runtime == "cpu" else ""))
    return out


_RENDERABLE: dict = {}


def cannot_render(prim: str, in_dtypes: Sequence, out_dtype, dialect: str = "c") -> Optional[str]:
    """Why ``dialect`` cannot compute ``prim`` on these dtypes inside a fused kernel (None when
    it can): fusion asks this of every op before taking it into a tape."""
    key = (prim, tuple(np.dtype(d) for d in in_dtypes), np.dtype(out_dtype), dialect)
    why = _RENDERABLE.get(key, False)
    if why is False:
        d = renderer(dialect)
        try:
            for dt in (*key[1], key[2]):
                d.storage_type(dt)
            d.op_expr(prim, [f"a{k}" for k in range(len(key[1]))], key[2],
                      key[1][0] if key[1] else key[2])
            why = None
        except Unsupported as e:
            why = str(e)
        _RENDERABLE[key] = why
    return why


def describe_unsupported(tape: Tape, dialect: Optional[CFamily] = None) -> Optional[str]:
    """Why ``dialect`` cannot render ``tape`` (None when it can)."""
    d = dialect or CDialect()
    try:
        d.render(tape, "probe", True, 1, False)
    except Unsupported as e:
        return str(e)
    return None
