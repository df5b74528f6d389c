"""Drawing a big compiled graph (``Graph.to_dot``) after a long recorded session: the
timeline full (``timeline.CAPACITY`` records) and the graph's kernels built and run.

A picture asks each kernel what ran it (``Kernel.tier``); that must not read the whole
timeline per kernel. Prints the records on the timeline, the kernels drawn and the median
of ``--repeat`` drawings (seconds). ``--records 0`` draws with an empty timeline.

    .venv/bin/python benchmarks/viz_draw.py [--rounds 200] [--records 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import tapescope
import tapescope.core as mx
from tapescope.kernels import timeline


def big(rounds: int):
    def f(x):
        for _ in range(rounds):
            x = mx.sum(mx.exp(x) * 2, axis=0, keepdims=True) + x
        return x
    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--records", type=int, default=timeline.CAPACITY)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    f = big(a.rounds)
    x = mx.array(np.arange(1, 10, dtype=np.float32).reshape(3, 3))
    timeline.set_recording(True)
    try:
        mx.eval(mx.compile(f)(x))  # the kernels built and run, their launches recorded
        y = mx.array(np.ones(8, np.float32))
        while timeline.next_seq() < a.records:  # a long session's records
            mx.eval(mx.exp(y))
    finally:
        timeline.set_recording(False)
    g = tapescope.trace(f, x)
    times = []
    for _ in range(a.repeat):
        t = time.perf_counter()
        g.to_dot(max_nodes=None)
        times.append(time.perf_counter() - t)
    print(f"records on the timeline {len(timeline.records())}, kernels {len(g.kernels)}, "
          f"to_dot median {statistics.median(times):.3f} s (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
