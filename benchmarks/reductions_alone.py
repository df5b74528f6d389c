"""The reduction grid's cells taken apart, in one process: tapescope's eager call, its
generated kernel alone (the ``KernelCall`` the eval loop runs, on 1 and on 2 OpenMP
threads) and jax.jit, interleaved one call of each in turn per repetition; min and median
of each, and the load. ``--after-jax``: each kernel-alone call right after a jax.jit call
of the same op (as the grid runs them), against one after a pause; ``--cold``: the input
read from memory each call. With ``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1"`` jax.jit runs on one thread: like with like against k1.

    .venv/bin/python benchmarks/reductions_alone.py [--reps 101] [--shapes 4096x1000,...]
        [--ops max_last,logsumexp] [--after-jax] [--cold] [--no-jax]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np

import tapescope.core as mx
from tapescope.kernels.cpu import primitive_kernels

OPS = ("softmax", "logsumexp", "sum_last", "max_last", "sum_first", "argmax_last")


def _gomp():
    """libgomp as the kernels load it (omp_set_num_threads sets the next regions' count)."""
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "libgomp" in line})
    return ctypes.CDLL(paths[0]) if paths else None


def graphs(a):
    return {
        "softmax": lambda: mx.softmax(a, axis=-1),
        "logsumexp": lambda: mx.logsumexp(a, axis=-1),
        "sum_last": lambda: mx.sum(a, axis=-1),
        "max_last": lambda: mx.max(a, axis=-1),
        "sum_first": lambda: mx.sum(a, axis=0),
        "argmax_last": lambda: mx.argmax(a, axis=-1),
    }


def kernel_alone(y, x: np.ndarray):
    """The reduction node under ``y`` (past a Squeeze) as its planned KernelCall on ``x``."""
    node = y._d.node
    while node.primitive.name not in primitive_kernels.RULES:
        node = node.inputs[0].node
    prim = node.primitive
    plan = primitive_kernels.RULES[prim.name].planned((x,), dict(prim.kw))
    out = np.empty(plan.out_shape, plan.out_dtype)
    return lambda: plan(x, out), plan


def jax_fn(x, op):
    import jax
    import jax.numpy as jnp

    f = {"softmax": lambda v: jax.nn.softmax(v, axis=-1),
         "logsumexp": lambda v: jax.nn.logsumexp(v, axis=-1),
         "sum_last": lambda v: jnp.sum(v, axis=-1), "max_last": lambda v: jnp.max(v, axis=-1),
         "sum_first": lambda v: jnp.sum(v, axis=0),
         "argmax_last": lambda v: jnp.argmax(v, axis=-1)}[op]
    j = jax.device_put(x, jax.devices("cpu")[0])
    g = jax.jit(f)
    return lambda: g(j).block_until_ready()


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:4])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=101)
    ap.add_argument("--shapes", default="1024x1000,1024x4096,4096x128,4096x1000,4096x4096")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--after-jax", action="store_true")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--cold", action="store_true",
                    help="a 96 MB pass before each call (the input read from memory, as in "
                         "the grid, where three copies of a 16 MB input evict each other)")
    args = ap.parse_args()
    from reductions import machine

    print(f"machine: {machine()}", flush=True)
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
        a = mx.array(x)
        mx.eval(a)
        for op in args.ops.split(","):
            g = graphs(a)[op]
            eager = lambda g=g: mx.eval(g())
            alone, plan = kernel_alone(g(), x)
            alone()
            gomp = _gomp()
            cores = gomp.omp_get_max_threads()

            def threads(n, f=alone):
                def run():
                    gomp.omp_set_num_threads(n)
                    f()
                    gomp.omp_set_num_threads(cores)
                return run

            impls = {"eager": eager, "k1": threads(1), f"k{cores}": threads(cores)}
            jx = None if args.no_jax else jax_fn(x, op)
            if jx:
                impls["jax"] = jx
            for f in impls.values():
                f(), f()
            times = {k: [] for k in impls}
            cpu = {k: 0.0 for k in impls}  # process CPU time / wall time: threads busy
            wall = {k: 0.0 for k in impls}
            after = {"k_after_jax": [], "k_after_pause": []}
            junk = np.ones(24 << 20, np.float32) if args.cold else None
            for _ in range(args.reps):
                for k, f in impls.items():
                    if junk is not None:
                        junk += 1.0
                    c0 = time.process_time()
                    t0 = time.perf_counter()
                    f()
                    t1 = time.perf_counter()
                    cpu[k] += time.process_time() - c0
                    wall[k] += t1 - t0
                    times[k].append((t1 - t0) * 1e6)
                if args.after_jax and jx:
                    jx()
                    t0 = time.perf_counter()
                    alone()
                    after["k_after_jax"].append((time.perf_counter() - t0) * 1e6)
                    time.sleep(0.003)
                    t0 = time.perf_counter()
                    alone()
                    after["k_after_pause"].append((time.perf_counter() - t0) * 1e6)
            if args.after_jax and jx:
                times.update(after)
            cells = "  ".join(f"{k} {min(v):8.1f}/{statistics.median(v):8.1f}"
                              + (f" ({cpu[k] / wall[k]:.1f})" if k in cpu else "")
                              for k, v in times.items())
            name = plan.entry.name if hasattr(plan.entry, "name") else ""
            if "jax" in times:  # medians over jax.jit's: the grid's ratio, and the kernel's
                jm = statistics.median(times["jax"])
                cells += "  x jax: " + " ".join(f"{k} {statistics.median(times[k]) / jm:.2f}"
                                                for k in times if k != "jax")
            print(f"{rows:>5} x {cols:<5} {op:<12} {cells}  [us min/med (busy threads)]  {name}  load {load()}",
                  flush=True)


if __name__ == "__main__":
    main()
