"""CPU fusion benchmark: tapescope's compiled C kernels vs numpy, jax.jit, MLX and a
hand-written C + OpenMP kernel, side by side in one run (medians, N = 2**24 float32).

Part 2: reductions and an MLP, all compiled — softmax, layernorm, logsumexp,
variance over the first axis, the MLP ``gelu(x @ W1) @ W2`` — at the named shapes and
others of the same kinds, run interleaved (one call of each implementation in turn per
repetition), medians, for tapescope in both fusion modes ("mlx", "extended"), jax.jit
(persistent compilation cache off), numpy and MLX (columns skipped when absent), with the
ratio of tapescope extended to JAX. Then ``benchmarks/cpu_calls.py``'s rows (per-call cost,
first call) when that file exists.

    .venv/bin/python benchmarks/cpu_fusion.py [--n 24] [--reps 7] [--only reductions]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import subprocess
import tempfile
import time

import numpy as np

import tapescope.core as mx

HAND_C = r"""
#include <math.h>
#include <stddef.h>
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
void chain_a(const float* x, const float* y, float* o, size_t n) {
  #pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) o[i] = 2.0f * x[i] + 3.0f * y[i] - x[i] * y[i];
}
void chain_b(const float* x, const float* y, float* o, size_t n) {
  #pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) o[i] = expf(-x[i]) * sinf(y[i]) + 2.0f * x[i] * y[i] - tanhf(x[i]);
}
"""


def median_ms(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def build_hand():
    d = tempfile.mkdtemp(prefix="hand-")
    src, lib = os.path.join(d, "hand.c"), os.path.join(d, "libhand.so")
    open(src, "w").write(HAND_C)
    subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared",
                    src, "-o", lib, "-lmvec", "-lm"], check=True)
    L = ctypes.CDLL(lib)
    for f in (L.chain_a, L.chain_b):
        f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t]
    return L


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", choices=["elementwise", "reductions"], default=None)
    args = ap.parse_args()
    print(f"machine: {machine()}")
    _jax_setup()
    if args.only != "reductions":
        elementwise(args)
    if args.only != "elementwise":
        reductions(args.reps)
        calls()


def elementwise(args):
    N, R = 2 ** args.n, args.reps
    rng = np.random.default_rng(0)
    xn = rng.uniform(-2, 2, N).astype(np.float32)
    yn = rng.uniform(-2, 2, N).astype(np.float32)
    big = rng.uniform(-2, 2, (4096, 4096)).astype(np.float32)
    row = rng.uniform(-2, 2, 4096).astype(np.float32)
    tiny = rng.uniform(-2, 2, 16).astype(np.float32)

    fa = lambda m, x, y: 2 * x + 3 * y - x * y  # noqa: E731
    fb = lambda m, x, y: m.exp(-x) * m.sin(y) + 2 * x * y - m.tanh(x)  # noqa: E731
    fc = lambda m, x, r: 2 * x + 3 * r - x * r  # noqa: E731

    cases = {
        "a": (fa, (xn, yn)),
        "b": (fb, (xn, yn)),
        "c": (fc, (big, row)),
        "d": (fa, ("T", big, big)),
        "e": (fa, (tiny, tiny)),
    }
    results: dict = {}

    # tapescope
    for k, (f, ins) in cases.items():
        g = mx.compile(lambda x, y, f=f: f(mx, x, y))
        if isinstance(ins[0], str):
            x, y = mx.array(ins[1]), mx.array(ins[2])
            mx.eval(x, y)
            x = mx.transpose(x)
        else:
            x, y = mx.array(ins[0]), mx.array(ins[1])
        mx.eval(x, y)
        results.setdefault(k, {})["tapescope"] = median_ms(lambda: mx.eval(g(x, y)), R if k != "e" else 2000)

    # numpy
    for k, (f, ins) in cases.items():
        x, y = (ins[1].T, ins[2]) if isinstance(ins[0], str) else ins
        results[k]["numpy"] = median_ms(lambda: f(np, x, y), R if k != "e" else 2000)

    # jax
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_platforms", "cpu")
        for k, (f, ins) in cases.items():
            jf = jax.jit(lambda x, y, f=f: f(jnp, x, y))
            if isinstance(ins[0], str):
                bx, y = jnp.asarray(ins[1]), jnp.asarray(ins[2])
                jt = jax.jit(lambda x, y, f=f: f(jnp, x.T, y))
                results[k]["jax"] = median_ms(lambda: jt(bx, y).block_until_ready(), R)
                continue
            x, y = jnp.asarray(ins[0]), jnp.asarray(ins[1])
            results[k]["jax"] = median_ms(lambda: jf(x, y).block_until_ready(), R if k != "e" else 2000)
    except ImportError:
        pass

    # MLX
    try:
        import mlx.core as mlx

        for k, (f, ins) in cases.items():
            g = mlx.compile(lambda x, y, f=f: f(mlx, x, y))
            if isinstance(ins[0], str):
                x, y = mlx.array(ins[1]), mlx.array(ins[2])
                mlx.eval(x, y)
                x = x.T
            else:
                x, y = mlx.array(ins[0]), mlx.array(ins[1])
            mlx.eval(x, y)
            results[k]["mlx"] = median_ms(lambda: mlx.eval(g(x, y)), R if k != "e" else 2000)
    except ImportError:
        pass

    # hand-written C + OpenMP (the ceiling for a and b)
    L = build_hand()
    out = np.empty(N, np.float32)
    for k, fn in (("a", L.chain_a), ("b", L.chain_b)):
        results[k]["hand C"] = median_ms(
            lambda: fn(xn.ctypes.data, yn.ctypes.data, out.ctypes.data, N), R)

    # accuracy of (b) against float64
    ref = fb(np, xn.astype(np.float64), yn.astype(np.float64))
    ours = np.array(mx.compile(lambda x, y: fb(mx, x, y))(mx.array(xn), mx.array(yn)), dtype=np.float64)
    npf = fb(np, xn, yn).astype(np.float64)
    scale = np.maximum(np.abs(ref), 1.0)

    print(f"N = 2^{args.n} float32, median of {R} runs (e: 2000 runs), milliseconds")
    peers = ["tapescope", "numpy", "jax", "mlx", "hand C"]
    print("case  " + "".join(f"{p:>11}" for p in peers) + "   tapescope vs: jax    hand C")
    for k in cases:
        r = results[k]
        cells = "".join(f"{r[p]:11.3f}" if p in r else f"{'-':>11}" for p in peers)
        vs_jax = f"{r['jax'] / r['tapescope']:6.2f}x" if "jax" in r else "   -  "
        vs_hand = f"{r['hand C'] / r['tapescope']:6.2f}x" if "hand C" in r else "   -  "
        print(f"({k})  {cells}   {vs_jax:>14} {vs_hand:>8}")
    print(f"(b) max scaled error vs float64: tapescope {np.max(np.abs(ours - ref) / scale):.3g}, "
          f"numpy float32 {np.max(np.abs(npf - ref) / scale):.3g}")
    e_split(tiny)


def e_split(tiny):
    """Where (e)'s time goes: the compiled call (recording the node), the kernel path (the
    Compiled rule's launch), and the rest (the eval loop, output buffer, freeing)."""
    from tapescope.kernels.cpu.compiled import run_compiled

    g = mx.compile(lambda x, y: 2 * x + 3 * y - x * y)
    x, y = mx.array(tiny), mx.array(tiny)
    mx.eval(x, y, g(x, y))
    prim = g(x, y)._d.node.primitive
    tape, shape = prim.kw["tape"], prim.kw["shape"]
    ins = [np.asarray(np.float32(v.constant)) if v.is_constant else tiny for v in tape.inputs]
    out = np.empty(16, np.float32)

    def per_call_us(fn, n=2000):
        return median_ms(lambda: [fn() for _ in range(n)], 9) * 1e3 / n

    full = per_call_us(lambda: mx.eval(g(x, y)))
    call = per_call_us(lambda: g(x, y))
    kern = per_call_us(lambda: run_compiled(tape, ins, shape, out=out))
    print(f"(e) split, us per call: total {full:.1f} = compiled call {call:.1f} + kernel launch "
          f"{kern:.1f} + eval loop / output buffer / free {full - call - kern:.1f}")


# -- part 2: reductions and the MLP --------------------------------------------------------

def _softmax(m, x):
    e = m.exp(x - m.max(x, axis=-1, keepdims=True))
    return e / m.sum(e, axis=-1, keepdims=True)


def _layernorm(m, x, w, b):
    mu = m.mean(x, axis=-1, keepdims=True)
    v = m.var(x, axis=-1, keepdims=True)
    return (x - mu) / m.sqrt(v + 1e-5) * w + b


def _logsumexp(m, x):
    mx_ = m.max(x, axis=-1, keepdims=True)
    return m.log(m.sum(m.exp(x - mx_), axis=-1)) + m.squeeze(mx_, -1)


def _var0(m, x):
    return m.var(x * 2 + 1, axis=0)


def _gelu(m, x):
    return 0.5 * x * (1 + m.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def _mlp(m, x, w1, w2):
    return _gelu(m, x @ w1) @ w2


def reduction_cases(rng):
    """(label, function of (module, *arrays), numpy inputs); the named shapes first."""
    f32 = np.float32

    def r(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(f32)

    return [
        ("softmax (4096,4096)", _softmax, (r(4096, 4096),)),
        ("softmax (32768,128)", _softmax, (r(32768, 128),)),
        ("softmax (256,65536)", _softmax, (r(256, 65536),)),
        ("layernorm (8192,1024)", _layernorm, (r(8192, 1024), r(1024), r(1024))),
        ("layernorm (2048,4096)", _layernorm, (r(2048, 4096), r(4096), r(4096))),
        ("layernorm (65536,96)", _layernorm, (r(65536, 96), r(96), r(96))),
        ("logsumexp (4096,4096)", _logsumexp, (r(4096, 4096),)),
        ("var axis 0 (4096,4096)", _var0, (r(4096, 4096),)),
        ("MLP 512x1024@1024x1024,GELU,@1024x256", _mlp,
         (r(512, 1024), r(1024, 1024, scale=0.03), r(1024, 256, scale=0.03))),
        ("MLP 256x2048@2048x512,GELU,@512x2048", _mlp,
         (r(256, 2048), r(2048, 512, scale=0.02), r(512, 2048, scale=0.04))),
    ]


def _implementations(f, ins):
    """name -> a no-argument call that computes ``f`` on ``ins`` to completion."""
    from tapescope.core import fusion

    impls = {}
    for mode in ("mlx", "extended"):
        fusion.set_fusion(mode)
        g = mx.compile(lambda *a, f=f: f(mx, *a))
        arrs = [mx.array(a) for a in ins]
        mx.eval(*arrs)

        def run(g=g, arrs=arrs, mode=mode):
            fusion.set_fusion(mode)
            mx.eval(g(*arrs))

        impls[f"tapescope {mode}"] = run
    def numpy_own(f=f, ins=ins):  # numpy as it comes: OpenBLAS on every core
        from tapescope.kernels.cpu import threads

        for set_n, _ in threads._openblas_libs_cached():
            set_n(ctypes.c_int(os.cpu_count() or 1))
        threads._blas["n"] = None  # tapescope's next matmul sets its own count again
        f(np, *ins)

    impls["numpy"] = numpy_own
    try:
        import jax
        import jax.numpy as jnp

        jf = jax.jit(lambda *a: f(jnp, *a))
        jins = [jnp.asarray(a) for a in ins]
        impls["jax"] = lambda: jf(*jins).block_until_ready()
    except ImportError:
        pass
    try:
        import mlx.core as mlx

        mf = mlx.compile(lambda *a: f(mlx, *a))
        mins = [mlx.array(a) for a in ins]
        mlx.eval(*mins)
        impls["mlx"] = lambda: mlx.eval(mf(*mins))
    except ImportError:
        pass
    return impls


def _jax_setup():
    """JAX on the CPU, its persistent compilation cache off (every run compiles afresh)."""
    try:
        import jax

        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_enable_compilation_cache", False)
    except ImportError:
        pass


def reductions(reps: int):
    """Part 2's table: interleaved medians, ms, and tapescope extended / JAX."""
    from tapescope.core import fusion

    before = fusion.fusion_mode()
    rng = np.random.default_rng(1)
    cols = ["tapescope mlx", "tapescope extended", "jax", "numpy", "mlx"]
    print(f"\nreductions and MLP, float32, compiled, interleaved, median of {reps} runs, ms")
    print(f"{'case':40}" + "".join(f"{c:>20}" for c in cols) + "   extended/jax")
    for label, f, ins in reduction_cases(rng):
        impls = _implementations(f, ins)
        for fn in impls.values():  # warm-up: traces, builds, JIT
            fn()
        times: dict = {k: [] for k in impls}
        for _ in range(reps):
            for k, fn in impls.items():
                t0 = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        cells = "".join(f"{med[c]:20.3f}" if c in med else f"{'-':>20}" for c in cols)
        ratio = (f"{med['tapescope extended'] / med['jax']:9.2f}" if "jax" in med else "      -")
        print(f"{label:40}{cells}   {ratio}")
    fusion.set_fusion(before)


def calls():
    """The per-call and first-call rows of ``benchmarks/cpu_calls.py``,
    when that file exists, so one run prints everything."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_calls.py")
    if not os.path.exists(path):
        return
    spec = importlib.util.spec_from_file_location("cpu_calls", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except ImportError as e:
        print(f"\n(benchmarks/cpu_calls.py not run: {e})")
        return
    print()
    run = getattr(mod, "main", None) or getattr(mod, "rows", None)
    if run is not None:
        try:
            run([]) if run.__code__.co_argcount else run()
        except SystemExit:
            pass


if __name__ == "__main__":
    main()
