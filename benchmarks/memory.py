"""The buffer cache at work: a 64 MiB elementwise op evaluated 50 times, cache on vs off.

"on" raises the cache limit to the memory limit; "default" keeps MLX's CPU default (32 MiB,
mlx/backend/no_gpu/allocator.cpp), under which a 64 MiB buffer is never cached, as in MLX;
"off" is ``set_cache_limit(0)``. Prints the median time per evaluation, the minor page faults
(resource.getrusage) in each mode, the ratio, and the machine.
Run: ``.venv/bin/python benchmarks/memory.py``.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time

import numpy as np

import tapescope.core as mx

N = 64 * 1024 * 1024 // 4  # 64 MiB of float32
REPS = 50


def run(limit: int) -> tuple[float, int]:
    """Median seconds per eval and minor page faults over REPS evals under a cache limit."""
    mx.clear_cache()
    old = mx.set_cache_limit(limit)
    x = mx.array(np.random.default_rng(0).random(N, dtype=np.float32))
    mx.eval(x)
    times = []
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(REPS):
        t = time.perf_counter()
        y = x * 2.0  # x is held, so the output needs a fresh 64 MiB buffer each time
        mx.eval(y)
        times.append(time.perf_counter() - t)
        del y  # back to the cache (or to the system when the cache is off)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    mx.set_cache_limit(old)
    mx.clear_cache()
    return statistics.median(times), faults


def main() -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}")
    print(f"python {platform.python_version()}, numpy {np.__version__}")
    default = mx.set_cache_limit(0)
    mx.set_cache_limit(default)
    run(mx.get_memory_limit())  # warm up
    on_t, on_f = run(mx.get_memory_limit())
    def_t, def_f = run(default)
    off_t, off_f = run(0)
    print(f"{'mode':<22}{'median ms/eval':>16}{'minor faults':>14}")
    print(f"{'cache on':<22}{on_t * 1e3:>16.2f}{on_f:>14}")
    print(f"{f'default ({default >> 20} MiB)':<22}{def_t * 1e3:>16.2f}{def_f:>14}")
    print(f"{'cache off':<22}{off_t * 1e3:>16.2f}{off_f:>14}")
    print(f"ratio (off / on): time {off_t / on_t:.2f}x, page faults {off_f / max(on_f, 1):.1f}x")


if __name__ == "__main__":
    main()
