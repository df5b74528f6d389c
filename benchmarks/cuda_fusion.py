"""GPU fusion benchmark: tapescope's fused CUDA kernels against CuPy op by op, cupy.fuse,
jax.jit on the GPU and the device-to-device copy, side by side in one run.

    TAPESCOPE_CUDA=1 python benchmarks/cuda_fusion.py [--log2n 26] [--reps 30]

Throughput is bytes read + written per second (the chains read x and y and write one
result: 12 bytes per float32 element; the copy reads and writes 8). Every contender runs
``reps`` rounds interleaved (one call of each per round), each call timed with CUDA events
around a batch of ``--batch`` back-to-back calls (so host dispatch overlaps the GPU, as in
a training loop), median over the rounds. Per call: 16 float32 elements, each call
synchronised before the next (host overhead included), ``reps`` interleaved rounds of
1000 calls each, median. CuPy's contenders run with CuPy's own memory pool (``pooled``:
tapescope's runtime switches it off for the process). First call: a new compiled GELU on
(1024, 1024) with empty kernel caches (tapescope's and CuPy's in fresh temporary folders,
JAX's persistent cache off), in a fresh process each.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TAPESCOPE_CUDA", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

def memory_chain(m, x, y):
    return 2 * x + 3 * y - x * y


def transcendental_chain(m, x, y):
    return m.exp(-x) * m.sin(y) + 2 * x * y - m.tanh(x)


CHAINS = {"2x+3y-x*y": ("memory", memory_chain),
          "exp(-x)*sin(y)+2xy-tanh(x)": ("transcendental", transcendental_chain)}


def bind(module, chain):
    """``chain`` over ``module`` as a named two-argument function (cupy.fuse names its kernel
    after the function: a lambda's name is not a C identifier)."""
    def fused_chain(x, y):
        return chain(module, x, y)

    return fused_chain


def gpu_name() -> str:
    import cupy

    p = cupy.cuda.runtime.getDeviceProperties(0)
    name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
    return f"{name} (sm_{p['major']}{p['minor']}, {p['totalGlobalMem'] / 2**30:.0f} GiB), CuPy {cupy.__version__}"


def pooled(fn):
    """Mark a CuPy contender to run with CuPy's own memory pool as CuPy's allocator. Importing
    tapescope's CUDA runtime switches CuPy's pool off for the whole process (its allocator
    is the only cache: ``kernels/cuda/memory.py``), so without this every CuPy call pays a
    ``cudaMalloc`` and a synchronising ``cudaFree`` (runs before 2026-12-01's third session
    measured CuPy that way: cupy.fuse at ~0.35x the copy bandwidth)."""
    import cupy

    fn.cupy_pool = cupy.cuda.MemoryPool()
    return fn


@contextlib.contextmanager
def allocator_of(fn):
    """CuPy's allocator while ``fn`` runs: its pool when ``pooled``, else none (tapescope's
    setting, restored after)."""
    import cupy

    pool = getattr(fn, "cupy_pool", None)
    if pool is None:
        yield
        return
    cupy.cuda.set_allocator(pool.malloc)
    try:
        yield
    finally:
        cupy.cuda.set_allocator(None)


def timed_batches(contenders: dict, reps: int, batch: int) -> dict:
    """name -> median ms per call; one batch of each contender per round, interleaved."""
    import cupy

    import tapescope.core as mx

    def sync():  # tapescope's stream workers, then the device
        mx.synchronize()
        cupy.cuda.Device().synchronize()

    times = {k: [] for k in contenders}
    for fn in contenders.values():  # warm up (builds, autotuning, caches)
        with allocator_of(fn):
            for _ in range(3):
                fn()
            sync()
    for _ in range(reps):
        for k, fn in contenders.items():
            sync()
            with allocator_of(fn):
                t0 = time.perf_counter()
                for _ in range(batch):
                    fn()
                sync()
                times[k].append((time.perf_counter() - t0) * 1e3 / batch)
            getattr(fn, "reset", lambda: None)()  # drop the batch's outputs
    return {k: statistics.median(v) for k, v in times.items()}


def throughput(log2n: int, reps: int, batch: int) -> list:
    import cupy
    import jax
    import jax.numpy as jnp

    import tapescope.core as mx

    n = 2**log2n
    rng = np.random.default_rng(0)
    xh = rng.standard_normal(n).astype(np.float32)
    yh = rng.standard_normal(n).astype(np.float32)
    cx, cy = cupy.asarray(xh), cupy.asarray(yh)
    jx, jy = jax.device_put(xh), jax.device_put(yh)
    mx.set_default_device(mx.gpu)
    tx, ty = mx.array(xh), mx.array(yh)
    dst = cupy.empty_like(cx)
    rows = []
    copy_ms = None
    for label, (kind, chain) in CHAINS.items():
        tf = mx.compile(bind(mx, chain))
        fused = cupy.fuse(bind(cupy, chain))
        jf = jax.jit(bind(jnp, chain))
        keep: list = []

        def ts():
            o = tf(tx, ty)
            mx.async_eval(o)
            # held until the batch is synchronised: an array dropped before its stream's
            # worker reached it would not be computed at all (nobody wants it)
            keep.append(o)

        ts.reset = keep.clear

        contenders = {
            "copy": lambda: cupy.copyto(dst, cx),
            "tapescope": ts,
            "cupy.fuse": pooled(lambda: fused(cx, cy)),
            "cupy": pooled(lambda: chain(cupy, cx, cy)),
            "jax.jit": lambda: jf(jx, jy),
        }
        # correctness first: the same numbers as CuPy
        got = np.asarray(tf(tx, ty))
        want = cupy.asnumpy(chain(cupy, cx, cy))
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
        ms = timed_batches(contenders, reps, batch)
        mx.synchronize()
        copy_ms = ms["copy"]
        copy_gbs = 8 * n / ms["copy"] / 1e6
        for k, v in ms.items():
            if k == "copy":
                continue
            gbs = 12 * n / v / 1e6
            rows.append((label, k, v, gbs, gbs / copy_gbs))
        rows.append((label, "copy (D2D)", copy_ms, copy_gbs, 1.0))
    return rows


PER_CALL_BATCH = 1000  # synchronised calls per round and contender


def per_call(reps: int) -> dict:
    import cupy
    import jax
    import jax.numpy as jnp

    import tapescope.core as mx

    xh = np.arange(16, dtype=np.float32)
    mx.set_default_device(mx.gpu)
    tx = mx.array(xh)
    cx = cupy.asarray(xh)
    jx = jax.device_put(xh)
    tf = mx.compile(bind(mx, memory_chain))
    fused = cupy.fuse(bind(cupy, memory_chain))
    jf = jax.jit(bind(jnp, memory_chain))
    s = cupy.cuda.get_current_stream()

    def f_ts():
        mx.eval(tf(tx, tx))

    def f_fuse():
        fused(cx, cx)
        s.synchronize()

    def f_jax():
        jf(jx, jx).block_until_ready()

    fns = {"tapescope": f_ts, "cupy.fuse": pooled(f_fuse), "jax.jit": f_jax}
    for f in fns.values():
        with allocator_of(f):
            for _ in range(50):
                f()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            with allocator_of(f):
                t0 = time.perf_counter()
                for _ in range(PER_CALL_BATCH):
                    f()
                times[k].append((time.perf_counter() - t0) / PER_CALL_BATCH * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


FIRST_CALL = {
    "tapescope": ("import tapescope.core as mx, numpy as np, time;"
                  "mx.set_default_device(mx.gpu); x = mx.array(np.ones((1024, 1024), np.float32)); mx.eval(x);"
                  "f = mx.compile(lambda a: 0.5 * a * (1 + mx.tanh(0.7978845608 * (a + 0.044715 * a * a * a))));"
                  "t0 = time.perf_counter(); mx.eval(f(x)); print((time.perf_counter() - t0) * 1e3)"),
    "jax.jit": ("import jax, jax.numpy as jnp, numpy as np, time;"
                "jax.config.update('jax_enable_compilation_cache', False);"
                "x = jax.device_put(np.ones((1024, 1024), np.float32)); x.block_until_ready();"
                "f = jax.jit(lambda a: 0.5 * a * (1 + jnp.tanh(0.7978845608 * (a + 0.044715 * a * a * a))));"
                "t0 = time.perf_counter(); f(x).block_until_ready(); print((time.perf_counter() - t0) * 1e3)"),
    "cupy.fuse": ("import cupy, numpy as np, time\n"
                  "x = cupy.asarray(np.ones((1024, 1024), np.float32)); cupy.cuda.Device().synchronize()\n"
                  "def gelu(a): return 0.5 * a * (1 + cupy.tanh(0.7978845608 * (a + 0.044715 * a * a * a)))\n"
                  "f = cupy.fuse(gelu)\n"
                  "t0 = time.perf_counter(); f(x); cupy.cuda.Device().synchronize(); print((time.perf_counter() - t0) * 1e3)"),
}


def first_call() -> dict:
    out = {}
    for k, code in FIRST_CALL.items():
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, TAPESCOPE_CACHE_DIR=os.path.join(d, "ts"),
                       CUPY_CACHE_DIR=os.path.join(d, "cupy"), TAPESCOPE_CUDA="1",
                       XLA_PYTHON_CLIENT_PREALLOCATE="false")
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                               timeout=300)
            out[k] = float(r.stdout.split()[-1]) if r.returncode == 0 else float("nan")
            if r.returncode:
                print(f"first call of {k} failed: {r.stderr[-800:]}", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=26)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=10)
    args = ap.parse_args(argv)
    print(f"# GPU: {gpu_name()}")
    print(f"# N = 2^{args.log2n} float32, {args.reps} interleaved rounds of {args.batch} calls, medians\n")
    rows = throughput(args.log2n, args.reps, args.batch)
    jax_gbs = {r[0]: r[3] for r in rows if r[1] == "jax.jit"}
    print("| chain | contender | ms / call | GB/s | x copy bandwidth | x jax.jit |")
    print("|---|---|---:|---:|---:|---:|")
    for label, k, ms, gbs, xcopy in rows:
        print(f"| {label} | {k} | {ms:.4f} | {gbs:.0f} | {xcopy:.3f} | {gbs / jax_gbs[label]:.3f} |")
    pc = per_call(args.reps)
    print("\n| per call, 16 float32, synchronised | µs | x cupy.fuse | x jax.jit |")
    print("|---|---:|---:|---:|")
    for k, us in pc.items():
        print(f"| {k} | {us:.1f} | {us / pc['cupy.fuse']:.2f} | {us / pc['jax.jit']:.2f} |")
    fc = first_call()
    print("\n| first call, new compiled GELU (1024, 1024), empty caches | ms |")
    print("|---|---:|")
    for k, ms in fc.items():
        print(f"| {k} | {ms:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
