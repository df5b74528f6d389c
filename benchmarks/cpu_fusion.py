"""CPU fusion benchmark: tapescope's compiled C kernels vs numpy, jax.jit, MLX and a
hand-written C + OpenMP kernel, side by side in one run (medians, N = 2**24 float32).

    .venv/bin/python benchmarks/cpu_fusion.py [--n 24] [--reps 7]
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
    args = ap.parse_args()
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

    print(f"machine: {machine()}")
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


if __name__ == "__main__":
    main()
