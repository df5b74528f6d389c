"""The synchronised 16-element call, tapescope against cupy.fuse, closely interleaved: the
per-call row of ``cuda_fusion.py`` with more rounds (tapescope's call through the one eval
loop: core/_loop.c, the backend's launch hook, the event's host wait). Prints the GPU,
medians with quartiles, and ratios to cupy.fuse (with CuPy's own memory pool).

    TAPESCOPE_CUDA=1 python benchmarks/cuda_per_call.py [--rounds 25] [--calls 2000]

The step table of BENCHMARKS.md ("GPU fusion") was measured with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TAPESCOPE_CUDA", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_fusion import bind, gpu_name, memory_chain  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    import cupy

    import tapescope.core as mx

    mx.set_default_device(mx.gpu)
    h = np.arange(16, dtype=np.float32)
    tx = mx.array(h)
    mx.eval(tx)
    tf = mx.compile(bind(mx, memory_chain))
    cx = cupy.asarray(h)
    fused = cupy.fuse(bind(cupy, memory_chain))
    s = cupy.cuda.get_current_stream()
    pool = cupy.cuda.MemoryPool()

    def ts():
        mx.eval(tf(tx, tx))

    def fuse():
        fused(cx, cx)
        s.synchronize()

    contenders = [("tapescope", ts, lambda: None),
                  ("cupy.fuse", fuse, lambda: cupy.cuda.set_allocator(pool.malloc))]
    times = {name: [] for name, _, _ in contenders}
    for r in range(args.rounds + 2):  # the first two rounds warm up
        for name, f, setup in contenders:
            setup()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                f()
            dt = (time.perf_counter() - t0) / args.calls * 1e6
            cupy.cuda.set_allocator(None)
            if r >= 2:
                times[name].append(dt)
    print(f"# GPU: {gpu_name()}; {args.rounds} interleaved rounds of {args.calls} calls\n")
    print("| per call, 16 float32, synchronised | median µs | q1 | q3 | x cupy.fuse |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.median(times["cupy.fuse"])
    for name, v in times.items():
        q1, q3 = np.percentile(v, [25, 75])
        m = statistics.median(v)
        print(f"| {name} | {m:.2f} | {q1:.2f} | {q3:.2f} | {m / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
