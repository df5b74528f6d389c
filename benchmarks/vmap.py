"""Per-example gradients: ``mx.vmap(mx.grad(loss))`` (one batched graph) against a Python loop
of ``mx.grad(loss)`` over the examples, with ``jax.vmap(jax.grad)`` (jit) and MLX's
``mx.vmap(mx.grad)`` beside them; medians of one run, a small MLP (in 32, hidden 64, out 10).

    .venv/bin/python benchmarks/vmap.py [--batch 64] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

import tapescope.core as mx


def _loss(p, x, y, m):
    h = m.tanh(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"]
    top = m.max(logits)
    return m.log(m.sum(m.exp(logits - top))) + top - logits[y]


def _median_ms(fn, reps: int) -> float:
    fn()  # warm (traces, kernel builds)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(32, 64)).astype(np.float32) * 0.1,
              "b1": np.zeros(64, np.float32), "w2": rng.normal(size=(64, 10)).astype(np.float32)}
    xs = rng.normal(size=(args.batch, 32)).astype(np.float32)
    ys = rng.integers(0, 10, size=args.batch).astype(np.int32)

    p = {k: mx.array(v) for k, v in params.items()}
    x, y = mx.array(xs), mx.array(ys)
    g = mx.grad(lambda p, x, y: _loss(p, x, y, mx))
    vg = mx.vmap(g, in_axes=(None, 0, 0))
    rows = [("tapescope vmap(grad)", _median_ms(lambda: mx.eval(vg(p, x, y)), args.reps)),
            ("tapescope compile(vmap(grad))",
             _median_ms(lambda c=mx.compile(vg): mx.eval(c(p, x, y)), args.reps)),
            ("tapescope loop of grad",
             _median_ms(lambda: mx.eval([g(p, x[i], y[i]) for i in range(args.batch)]),
                        args.reps))]
    try:
        import mlx.core as mlx

        mp = {k: mlx.array(v) for k, v in params.items()}
        mvg = mlx.vmap(mlx.grad(lambda p, x, y: _loss(p, x, y, mlx)), in_axes=(None, 0, 0))
        mxs, mys = mlx.array(xs), mlx.array(ys)
        rows.append(("MLX vmap(grad)", _median_ms(lambda: mlx.eval(mvg(mp, mxs, mys)),
                                                  args.reps)))
    except ImportError:
        pass
    try:
        import jax

        jvg = jax.jit(jax.vmap(jax.grad(lambda p, x, y: _loss(p, x, y, jax.numpy)),
                               in_axes=(None, 0, 0)))
        rows.append(("jax.jit(vmap(grad))",
                     _median_ms(lambda: jax.block_until_ready(jvg(params, xs, ys)), args.reps)))
    except ImportError:
        pass
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, numpy {np.__version__}; batch {args.batch}")
    print("| method | median ms |\n|---|---:|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} |")
    loop = dict(rows)["tapescope loop of grad"]
    print(f"\nloop / vmap(grad): {loop / rows[0][1]:.1f}x")


if __name__ == "__main__":
    main()
