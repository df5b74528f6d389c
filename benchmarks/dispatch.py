"""Dispatch latency: ``mx.eval(a + b)`` on 16-element arrays, and a 20-op eager chain.

Side by side in one run: tapescope, numpy, JAX eager (CPU) and, when installed, MLX.
Prints the median microseconds per iteration, tapescope's ratio to each peer, and the
machine. Run: ``.venv/bin/python benchmarks/dispatch.py``.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable

import numpy as np

import tapescope.core as ts

REPEATS = 7
ITERS = 2000


def bench(fn: Callable[[], object]) -> float:
    """Median over REPEATS of the mean microseconds per call over ITERS calls."""
    for _ in range(200):
        fn()
    runs = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        for _ in range(ITERS):
            fn()
        runs.append((time.perf_counter() - t) / ITERS * 1e6)
    return statistics.median(runs)


def chain20(mod, a, b):
    """Ten multiplies and ten adds, each a separate op."""
    x = a
    for _ in range(10):
        x = mod.multiply(x, b)
        x = mod.add(x, a)
    return x


def main() -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"{platform.platform()}, python {platform.python_version()}")
    rng = np.random.default_rng(0)
    a_np = rng.random(16, dtype=np.float32)
    b_np = rng.random(16, dtype=np.float32)
    rows: dict[str, dict[str, float]] = {"a + b": {}, "20-op chain": {}}

    a, b = ts.array(a_np), ts.array(b_np)
    rows["a + b"]["tapescope"] = bench(lambda: ts.eval(a + b))
    rows["20-op chain"]["tapescope"] = bench(lambda: ts.eval(chain20(ts, a, b)))

    rows["a + b"]["numpy"] = bench(lambda: a_np + b_np)
    rows["20-op chain"]["numpy"] = bench(lambda: chain20(np, a_np, b_np))

    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_platforms", "cpu")
        ja, jb = jnp.asarray(a_np), jnp.asarray(b_np)
        rows["a + b"]["jax eager"] = bench(lambda: (ja + jb).block_until_ready())
        rows["20-op chain"]["jax eager"] = bench(lambda: chain20(jnp, ja, jb).block_until_ready())
        print(f"jax {jax.__version__}")
    except ImportError:
        print("jax not installed: skipped")

    try:
        import mlx.core as mlx

        ma, mb = mlx.array(a_np), mlx.array(b_np)
        rows["a + b"]["mlx"] = bench(lambda: mlx.eval(ma + mb))
        rows["20-op chain"]["mlx"] = bench(lambda: mlx.eval(chain20(mlx, ma, mb)))
        print(f"mlx {mlx.__version__}")
    except ImportError:
        print("mlx not installed: skipped")

    peers = [p for p in ("numpy", "jax eager", "mlx") if p in rows["a + b"]]
    print(f"\n{'case':<14}{'tapescope us':>14}" + "".join(f"{p + ' us':>14}" for p in peers)
          + "".join(f"{'ts/' + p:>16}" for p in peers))
    for case, r in rows.items():
        line = f"{case:<14}{r['tapescope']:>14.2f}" + "".join(f"{r[p]:>14.2f}" for p in peers)
        line += "".join(f"{r['tapescope'] / r[p]:>16.2f}" for p in peers)
        print(line)


if __name__ == "__main__":
    main()
