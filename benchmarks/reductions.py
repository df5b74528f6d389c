"""Reduction primitives benchmark: tapescope's generated kernels vs jax.jit (and MLX, and
on a GPU PyTorch), side by side in one run, interleaved (one call of each implementation in
turn per repetition), medians, ratios tapescope / jax.jit and tapescope / the best peer.

Ops (float32 unless ``--dtype``): ``mx.softmax`` and ``mx.logsumexp`` over the last axis,
sum and max over the last axis, sum over the first axis, argmax over the last axis. CPU
grid: rows 1024, 4096 x lengths 128, 1000, 4096. With a CUDA runtime
(``TAPESCOPE_CUDA=1``, CuPy, a GPU) the same ops on ``mx.gpu`` at rows 4096, 8192, 32768 x
lengths 128, 1000, 4096, 8193, 32768 against jax.jit on the GPU, PyTorch and MLX's CUDA
backend where importable.

    .venv/bin/python benchmarks/reductions.py [--reps 15] [--device cpu|gpu|both] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tapescope.core as mx

OPS = ("softmax", "logsumexp", "sum_last", "max_last", "sum_first", "argmax_last")


def machine() -> str:
    """cpu_fusion.py's machine line and the load average (the cores are shared)."""
    from cpu_fusion import machine as base

    try:
        load = " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        load = "unknown"
    return f"{base()}, load average {load}"


def tapescope_fns(x, device):
    a = mx.array(x)
    if device == "gpu":
        a = mx.add(a, 0, stream=mx.gpu)  # made on the device
    mx.eval(a)
    s = mx.gpu if device == "gpu" else mx.cpu
    fns = {
        "softmax": lambda: mx.softmax(a, axis=-1, stream=s),
        "logsumexp": lambda: mx.logsumexp(a, axis=-1, stream=s),
        "sum_last": lambda: mx.sum(a, axis=-1, stream=s),
        "max_last": lambda: mx.max(a, axis=-1, stream=s),
        "sum_first": lambda: mx.sum(a, axis=0, stream=s),
        "argmax_last": lambda: mx.argmax(a, axis=-1, stream=s),
    }
    return {k: (lambda f=f: mx.eval(f())) for k, f in fns.items()}


def jax_fns(x, device):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    dev = jax.devices("gpu")[0] if device == "gpu" else jax.devices("cpu")[0]
    j = jax.device_put(x, dev)
    fs = {
        "softmax": jax.jit(lambda v: jax.nn.softmax(v, axis=-1)),
        "logsumexp": jax.jit(lambda v: jax.nn.logsumexp(v, axis=-1)),
        "sum_last": jax.jit(lambda v: jnp.sum(v, axis=-1)),
        "max_last": jax.jit(lambda v: jnp.max(v, axis=-1)),
        "sum_first": jax.jit(lambda v: jnp.sum(v, axis=0)),
        "argmax_last": jax.jit(lambda v: jnp.argmax(v, axis=-1)),
    }
    return {k: (lambda f=f: f(j).block_until_ready()) for k, f in fs.items()}


def mlx_fns(x, device):
    try:
        import mlx.core as m
    except ImportError:
        return None
    if device == "gpu" and not (hasattr(m, "cuda") and m.cuda.is_available()):
        return None
    s = m.gpu if device == "gpu" else m.cpu
    a = m.array(x)
    m.eval(a)
    fs = {
        "softmax": lambda: m.softmax(a, axis=-1, stream=s),
        "logsumexp": lambda: m.logsumexp(a, axis=-1, stream=s),
        "sum_last": lambda: m.sum(a, axis=-1, stream=s),
        "max_last": lambda: m.max(a, axis=-1, stream=s),
        "sum_first": lambda: m.sum(a, axis=0, stream=s),
        "argmax_last": lambda: m.argmax(a, axis=-1, stream=s),
    }
    return {k: (lambda f=f: m.eval(f())) for k, f in fs.items()}


def torch_fns(x, device):
    if device != "gpu":
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    t = torch.from_numpy(x).cuda()
    fs = {
        "softmax": lambda: torch.softmax(t, dim=-1),
        "logsumexp": lambda: torch.logsumexp(t, dim=-1),
        "sum_last": lambda: t.sum(-1),
        "max_last": lambda: t.amax(-1),
        "sum_first": lambda: t.sum(0),
        "argmax_last": lambda: t.argmax(-1),
    }
    return {k: (lambda f=f: (f(), torch.cuda.synchronize())) for k, f in fs.items()}


def interleaved(impls: dict, reps: int) -> dict:
    """Median ms of each implementation, one call of each in turn per repetition."""
    for f in impls.values():
        f()
        f()
    times = {k: [] for k in impls}
    for _ in range(reps):
        for k, f in impls.items():
            t0 = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


FUSED = ("softmax_written", "xent_written")  # hand-written, compiled with extended fusion


def written(lib):
    """Softmax and a soft-label cross-entropy written out in ``lib``'s ops (mx / jnp)."""
    def softmax(v):
        e = lib.exp(v - lib.max(v, axis=-1, keepdims=True))
        return e / lib.sum(e, axis=-1, keepdims=True)

    def xent(v, t):
        m = lib.max(v, axis=-1, keepdims=True)
        lse = lib.log(lib.sum(lib.exp(v - m), axis=-1, keepdims=True)) + m
        return lib.sum(t * (lse - v), axis=-1)

    return softmax, xent


def fused_rows(x, reps: int) -> None:
    """Extended fusion's one-kernel softmax and cross-entropy on the GPU against jax.jit."""
    import tapescope

    t = np.full_like(x, 1.0 / x.shape[-1])
    old = tapescope.fusion_mode()
    tapescope.set_fusion("extended")
    try:
        a, b = (mx.add(mx.array(v), 0, stream=mx.gpu) for v in (x, t))
        mx.eval(a, b)
        sm, xe = (mx.compile(f) for f in written(mx))
        sets = {"tapescope": {"softmax_written": lambda: mx.eval(sm(a)),
                              "xent_written": lambda: mx.eval(xe(a, b))}}
        try:
            import jax
            import jax.numpy as jnp

            dev = jax.devices("gpu")[0]
            ja, jb = jax.device_put(x, dev), jax.device_put(t, dev)
            js, jx = (jax.jit(f) for f in written(jnp))
            sets["jax.jit"] = {"softmax_written": lambda: js(ja).block_until_ready(),
                               "xent_written": lambda: jx(ja, jb).block_until_ready()}
        except ImportError:
            pass
        rows, cols = x.shape
        for op in FUSED:
            tm = interleaved({k: v[op] for k, v in sets.items()}, reps)
            cells = "  ".join(f"{k} {v:8.3f}" for k, v in tm.items())
            jx_ = tm.get("jax.jit")
            ratio = f"x jax {tm['tapescope'] / jx_:5.2f}" if jx_ else ""
            print(f"gpu {rows:>6} x {cols:<6} {op:<15} {cells}   {ratio}", flush=True)
    finally:
        tapescope.set_fusion(old)


def copy_fraction(op: str, rows: int, cols: int, ms: float, itemsize: int) -> float:
    """The bandwidth a call reached (bytes read + written / time) in TB/s."""
    out = rows * cols if op == "softmax" else cols if op == "sum_first" else rows
    return (rows * cols + out) * itemsize / (ms * 1e-3) / 1e12


def run(device: str, grid: list, reps: int, dtype, fused: bool = False) -> list:
    rows_out = []
    peers_seen: set = set()
    for rows, cols in grid:
        x = np.random.default_rng(0).standard_normal((rows, cols)).astype(dtype)
        try:
            sets = {"tapescope": tapescope_fns(x, device)}
        except RuntimeError as e:  # (the peers' memory pools hold the device's memory)
            print(f"  ({device} {rows} x {cols} left out: {str(e)[:100]})", flush=True)
            continue
        for name, make in (("jax.jit", jax_fns), ("mlx", mlx_fns), ("torch", torch_fns)):
            got = make(x, device)
            if got is not None:
                sets[name] = got
                peers_seen.add(name)
        for op in OPS:
            t = interleaved({k: v[op] for k, v in sets.items()}, reps)
            rows_out.append(((rows, cols), op, t))
            jx = t.get("jax.jit")
            best = min((v for k, v in t.items() if k != "tapescope"), default=None)
            cells = "  ".join(f"{k} {v:8.3f}" for k, v in t.items())
            ratio = f"x jax {t['tapescope'] / jx:5.2f}" if jx else ""
            rb = f"x best {t['tapescope'] / best:5.2f}" if best else ""
            bw = f"  {copy_fraction(op, rows, cols, t['tapescope'], x.itemsize):5.2f} TB/s"
            print(f"{device} {rows:>6} x {cols:<6} {op:<12} {cells}   {ratio}  {rb}{bw}", flush=True)
        if device == "gpu" and fused:
            fused_rows(x, reps)
    return rows_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", choices=["cpu", "gpu", "both"], default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quick", action="store_true", help="the smallest and largest shapes only")
    ap.add_argument("--shape", action="append", default=[],
                    help="only this rows,cols (repeatable; the GPU's random shape left out)")
    args = ap.parse_args()
    only = [tuple(int(n) for n in sh.split(",")) for sh in args.shape]
    print(f"machine: {machine()}")
    dtype = np.dtype(args.dtype)
    worst = []
    if args.device in ("cpu", "both"):
        grid = [(r, c) for r in (1024, 4096) for c in (128, 1000, 4096)]
        if args.quick:
            grid = [grid[0], grid[-1]]
        res = run("cpu", only or grid, args.reps, dtype)
        worst += [(t["tapescope"] / t["jax.jit"], shape, op) for shape, op, t in res if "jax.jit" in t]
    if args.device in ("gpu", "both"):
        if not mx.cuda.is_available():
            print("gpu: no CUDA runtime (TAPESCOPE_CUDA=1, CuPy and a GPU are needed)")
        else:
            rng = np.random.default_rng()
            grid = [(r, c) for r in (4096, 8192, 32768) for c in (128, 1000, 4096, 8193, 32768)
                    if r * c <= 1 << 30]
            r = int(rng.integers(1, 40000))
            grid.append((r, int(rng.integers(1, min(40000, (1 << 28) // r + 1)))))
            run("gpu", only or grid, args.reps, dtype, fused=True)
    if worst:
        w = max(worst)
        print(f"cpu: worst tapescope / jax.jit {w[0]:.2f} ({w[2]} at {w[1][0]} x {w[1][1]})")


if __name__ == "__main__":
    main()
