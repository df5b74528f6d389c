"""Where the time of one eager fast-primitive call on the GPU goes: the wall time of a
synchronised call, the kernel's own time (CUDA events recorded on the stream right before
and after the kernel's launch: the host's work outside it excluded) and a cProfile of the
host side (the top functions by own time), for the rows of ``fast_ops.py --device gpu``.

    TAPESCOPE_CUDA=1 python benchmarks/fast_ops_profile.py [--calls 30] [--ops rope]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import os
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import tapescope.core as mx  # noqa: E402
from fast_ops import inputs, tapescope_fn  # noqa: E402

CASES = [("layer_norm", (16384, 4096)), ("rms_norm", (16384, 4096)),
         ("rope", (4, 16, 2048, 64)), ("rope", (4, 16, 2048, 128))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--ops", default="")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    import cupy
    from tapescope.kernels.cuda import reductions as launches  # Step.run launches through it

    times: list = []
    orig = launches.launch_recorded

    def timed(entry, kernel, ints, a, name, detail):
        s = cupy.cuda.get_current_stream()
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(s)
        orig(entry, kernel, ints, a, name, detail)
        e1.record(s)
        times.append((e0, e1, kernel.launch(ints)))

    launches.launch_recorded = timed
    ops = set(filter(None, args.ops.split(",")))
    for op, shape in CASES:
        if ops and op not in ops:
            continue
        x, w, b = inputs(op, shape, np.dtype(args.dtype))
        f = tapescope_fn(op, x, w, b, "gpu")
        f(), f()
        times.clear()
        wall = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            f()
            wall.append((time.perf_counter() - t0) * 1e3)
        ks = [cupy.cuda.get_elapsed_time(e0, e1) for e0, e1, _ in times]
        launch = times[-1][2] if times else None
        k = statistics.median(ks) if ks else float("nan")
        moved = 2 * x.nbytes
        print(f"{op:<10} {str(shape):<20} wall {statistics.median(wall):7.3f} ms  kernel {k:7.3f} ms "
              f"({moved / (k * 1e-3) / 1e9:6.0f} GB/s)  launches/call {len(ks) / args.calls:.1f}  "
              f"grid, block {launch}", flush=True)
        if args.profile:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(args.calls):
                f()
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
            print("\n".join(s.getvalue().splitlines()[:34]), flush=True)
    launches.launch_recorded = orig


if __name__ == "__main__":
    main()
