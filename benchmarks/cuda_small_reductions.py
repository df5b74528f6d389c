"""Small eager reductions on the GPU, each call evaluated (``mx.eval``): microseconds per call,
median of ``--rounds`` rounds of ``--calls`` calls, the ops taking turns each round; ``y + y``
of 16 floats is the reference row. The host cost these rows are made of is counted without a
GPU by ``cuda_host_cost.py --callgrind`` (same op names).

    TAPESCOPE_CUDA=1 python benchmarks/cuda_small_reductions.py [--shape 16,256] [--rounds 9]
        [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TAPESCOPE_CUDA", "1")

import numpy as np  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16,256")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    import tapescope.core as mx

    mx.set_default_device(mx.gpu)
    rows, cols = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = mx.add(mx.array(rng.standard_normal((rows, cols)).astype(np.float32)), 0)
    y = mx.add(mx.array(rng.standard_normal(16).astype(np.float32)), 0)
    mx.eval(x, y)
    ops = {"add16": lambda: y + y, "mul_scalar16": lambda: y * 0.5,
           "sum_last": lambda: mx.sum(x, axis=-1), "max_last": lambda: mx.max(x, axis=-1),
           "argmax_last": lambda: mx.argmax(x, axis=-1), "argmax_all": lambda: mx.argmax(x),
           "sum_all": lambda: mx.sum(x), "mean_last": lambda: mx.mean(x, axis=-1),
           "logsumexp": lambda: mx.logsumexp(x, axis=-1),
           "softmax": lambda: mx.softmax(x, axis=-1)}
    times: dict = {k: [] for k in ops}
    for f in ops.values():
        for _ in range(50):
            mx.eval(f())
    for _ in range(args.rounds):
        for k, f in ops.items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                mx.eval(f())
            times[k].append((time.perf_counter() - t0) * 1e6 / args.calls)
    ref = statistics.median(times["add16"])
    print(f"x {rows} x {cols} float32, load {os.getloadavg()[0]:.2f}")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"{k:14s} {m:8.2f} us/call  ({m / ref:4.2f} x add16)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
