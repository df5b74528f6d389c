"""Per-call cost and first-call latency on the CPU, side by side in one run.

Rows (medians; the implementations interleaved, one batch of each in turn per repetition):
- a compiled ``2x + 3y - x*y`` on 16 float32 elements, called and evaluated: tapescope,
  ``jax.jit`` (``block_until_ready``) and MLX's ``mx.compile``;
- an eager ``a + b`` and its eval on 16 float32 elements: tapescope, JAX eager and MLX;
- where tapescope's compiled call goes (recording the call / the kernel launch / the rest);
- the first call of a new compiled GELU on (1024, 1024) float32 with an empty kernel cache,
  each in a fresh process (JAX with its persistent compilation cache off): tapescope with
  tiered first calls (``tapescope.set_tiered(True)``) and without, jax.jit, MLX; and a second
  new function in the same process (the compiler probed, nothing cached).

    .venv/bin/python benchmarks/cpu_calls.py [--reps 9] [--calls 2000] [--procs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

TINY = np.linspace(-1, 1, 16, dtype=np.float32)


def machine() -> str:
    """cpu_fusion.py's machine line (one definition), with the load average now."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_fusion.py")
    spec = importlib.util.spec_from_file_location("cpu_fusion_machine", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return f"{mod.machine()}, load {os.getloadavg()[0]:.2f}"


def _per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) * 1e6 / calls


def interleaved(fns: dict, reps: int, calls: int) -> dict:
    """Median over ``reps`` of each function's mean µs per call, taking turns."""
    for fn in fns.values():
        for _ in range(50):
            fn()
    times: dict = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            times[k].append(_per_call_us(fn, calls))
    return {k: statistics.median(v) for k, v in times.items()}


def call_cost(reps: int, calls: int) -> tuple:
    """(compiled-call row, eager-row) dicts of µs per call, by implementation."""
    import tapescope.core as mx

    f = lambda m, x, y: 2 * x + 3 * y - x * y  # noqa: E731
    g = mx.compile(lambda x, y: f(mx, x, y))
    x, y = mx.array(TINY), mx.array(TINY[::-1].copy())
    mx.eval(x, y)
    compiled = {"tapescope": lambda: mx.eval(g(x, y))}
    eager = {"tapescope": lambda: mx.eval(x + y)}
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_platforms", "cpu")
        jf = jax.jit(lambda x, y: f(jnp, x, y))
        jx, jy = jnp.asarray(TINY), jnp.asarray(TINY[::-1].copy())
        compiled["jax.jit"] = lambda: jf(jx, jy).block_until_ready()
        eager["JAX eager"] = lambda: (jx + jy).block_until_ready()
    except ImportError:
        pass
    try:
        import mlx.core as mlx

        gm = mlx.compile(lambda x, y: f(mlx, x, y))
        mx_, my_ = mlx.array(TINY), mlx.array(TINY[::-1].copy())
        mlx.eval(mx_, my_)
        compiled["MLX"] = lambda: mlx.eval(gm(mx_, my_))
        eager["MLX"] = lambda: mlx.eval(mx_ + my_)
    except ImportError:
        pass
    return interleaved(compiled, reps, calls), interleaved(eager, reps, calls)


def call_split(reps: int, calls: int) -> dict:
    """Where tapescope's 16-element compiled call goes: recording the call (the lazy output),
    the kernel launch alone (``Launch.call`` into a ready buffer), and the rest (eval loop,
    output buffer, freeing)."""
    import tapescope.core as mx
    from tapescope.kernels.cpu.compiled import launch_for

    g = mx.compile(lambda x, y: 2 * x + 3 * y - x * y)
    x, y = mx.array(TINY), mx.array(TINY[::-1].copy())
    mx.eval(x, y, g(x, y))
    node = g(x, y)._d.node
    tape, shape = node.primitive.kw["tape"], node.primitive.kw["shape"]
    ins = [d.data for d in node.inputs]
    ln = launch_for(tape, ins, shape)
    out = np.empty(16, np.float32)
    t = interleaved({"total": lambda: mx.eval(g(x, y)), "call": lambda: g(x, y),
                     "launch": lambda: ln.call(ins, (out,))}, reps, calls)
    t["rest"] = t["total"] - t["call"] - t["launch"]
    return t


FIRST_CALL = r"""
import json, math, os, sys, time
import numpy as np
which = sys.argv[1]
xn = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
c = math.sqrt(2 / math.pi)
def gelu(m):
    return lambda x: 0.5 * x * (1 + m.tanh(c * (x + 0.044715 * x ** 3)))
def gelu2(m):  # a second new function: another tape, another kernel
    return lambda x: x * (1 + m.tanh(c * (x + 0.044715 * x ** 3))) * 0.25
out = {}
if which.startswith("tapescope"):
    import tapescope, tapescope.core as mx
    tapescope.set_tiered(which == "tapescope-tiered")
    x = mx.array(xn); mx.eval(x)
    for k, fn in (("first", gelu), ("second", gelu2)):
        t0 = time.perf_counter(); f = mx.compile(fn(mx)); mx.eval(f(x))
        out[k] = (time.perf_counter() - t0) * 1e3
    from tapescope.kernels.cpu import tiered
    tiered.wait()
    t0 = time.perf_counter(); mx.eval(f(x)); out["after"] = (time.perf_counter() - t0) * 1e3
elif which == "jax":
    import jax, jax.numpy as jnp
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_enable_compilation_cache", False)
    x = jnp.asarray(xn); x.block_until_ready()
    for k, fn in (("first", gelu), ("second", gelu2)):
        t0 = time.perf_counter(); f = jax.jit(fn(jnp)); f(x).block_until_ready()
        out[k] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter(); f(x).block_until_ready(); out["after"] = (time.perf_counter() - t0) * 1e3
elif which == "mlx":
    import mlx.core as mlx
    x = mlx.array(xn); mlx.eval(x)
    for k, fn in (("first", gelu), ("second", gelu2)):
        t0 = time.perf_counter(); f = mlx.compile(fn(mlx)); mlx.eval(f(x))
        out[k] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter(); mlx.eval(f(x)); out["after"] = (time.perf_counter() - t0) * 1e3
print(json.dumps(out))
"""


def first_calls(procs: int) -> dict:
    """impl -> {"first", "second", "after"}: medians (ms) over ``procs`` fresh processes,
    each with its own empty kernel cache; the implementations take turns."""
    impls = ["tapescope-tiered", "tapescope", "jax", "mlx"]
    got: dict = {k: [] for k in impls}
    for _ in range(procs):
        for which in impls:
            with tempfile.TemporaryDirectory() as d:
                os.chmod(d, 0o700)
                env = {**os.environ, "TAPESCOPE_CACHE_DIR": os.path.join(d, "kernels"),
                       "TAPESCOPE_TIERED": "0"}
                r = subprocess.run([sys.executable, "-c", FIRST_CALL, which], env=env,
                                   capture_output=True, text=True, timeout=600)
            if r.returncode == 0 and r.stdout.strip():
                got[which].append(json.loads(r.stdout.strip().splitlines()[-1]))
    return {k: {f: statistics.median(v[f] for v in runs) for f in runs[0]}
            for k, runs in got.items() if runs}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--procs", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    print(f"per call: mean of {args.calls} calls, median of {args.reps} interleaved repetitions, µs")
    compiled, eager = call_cost(args.reps, args.calls)
    ts = compiled["tapescope"]
    print("| work | " + " | ".join(compiled) + " | tapescope / jax.jit |")
    print("|---|" + "---:|" * (len(compiled) + 1))
    print("| compiled call + eval, 16 float32 | " + " | ".join(f"{v:.2f}" for v in compiled.values())
          + f" | {_ratio(ts, compiled.get('jax.jit', 0))} |")
    te = eager["tapescope"]
    print("| work | " + " | ".join(eager) + " | tapescope / JAX eager |")
    print("|---|" + "---:|" * (len(eager) + 1))
    print("| eager a + b + eval, 16 float32 | " + " | ".join(f"{v:.2f}" for v in eager.values())
          + f" | {_ratio(te, eager.get('JAX eager', 0))} |")
    s = call_split(args.reps, args.calls)
    print(f"tapescope's compiled call, µs: total {s['total']:.2f} = recording the call "
          f"{s['call']:.2f} + kernel launch {s['launch']:.2f} + eval loop / output buffer / "
          f"free {s['rest']:.2f}")
    print(f"first call of a new compiled GELU on (1024, 1024) float32, empty kernel cache, "
          f"fresh process each (median of {args.procs}), ms:")
    fc = first_calls(args.procs)
    jax_first = fc.get("jax", {}).get("first", 0)
    print("| implementation | first new function | second new function | a later call | first / jax.jit |")
    print("|---|---:|---:|---:|---:|")
    names = {"tapescope-tiered": "tapescope, tiered", "tapescope": "tapescope, waits for gcc",
             "jax": "jax.jit", "mlx": "MLX"}
    for k, v in fc.items():
        print(f"| {names[k]} | {v['first']:.1f} | {v['second']:.1f} | {v['after']:.2f} | "
              f"{_ratio(v['first'], jax_first)} |")


if __name__ == "__main__":
    main()
