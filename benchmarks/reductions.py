"""Reduction primitives benchmark: tapescope's generated kernels vs jax.jit (and MLX, and
on a GPU PyTorch), side by side in one run, interleaved (one call of each implementation in
turn per repetition), medians, ratios tapescope / jax.jit and tapescope / the best peer.

Ops (float32 unless ``--dtype``, e.g. ``bfloat16``: every side reads and writes bfloat16):
``mx.softmax`` and ``mx.logsumexp`` over the last axis, sum and max over the last axis, sum
over the first axis, argmax over the last axis. CPU grid: rows 1024, 4096 x lengths 128,
1000, 4096. With a CUDA runtime (``TAPESCOPE_CUDA=1``, CuPy, a GPU) the same ops on
``mx.gpu`` at rows 4096, 8192, 32768 x lengths 128, 1000, 4096, 8193, 32768 and one random
shape against jax.jit on the GPU, PyTorch and MLX's CUDA backend where importable; each GPU
cell also prints its bandwidth over the device's copy bandwidth (``kernels/roofline.py``:
a device-to-device copy, read + written) and whether it meets the bar (at most 1.0x the
best peer, or at least 0.85x the copy bandwidth).

A repetition times ``calls`` consecutive calls of one implementation (each call evaluated
and waited for), the implementations taking turns: on the GPU ``--calls 0`` (its default)
picks, per cell, enough calls for ~1 ms of work (1 for long calls, at most 20); ``--calls
1`` (the CPU's default) times every call alone right after another library's (then a GPU
call of a small shape also pays the switch from the other library's work on the device).

    .venv/bin/python benchmarks/reductions.py [--reps 15] [--device cpu|gpu|both] [--quick]
        [--dtype float32|bfloat16] [--calls 0] [--shape 4096,128 ...]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside the others

import ml_dtypes
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
    if x.dtype == BF16:  # (torch.from_numpy has no bfloat16: the bits, viewed)
        t = torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
    else:
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


BF16 = np.dtype(ml_dtypes.bfloat16)
BLOCK_MS = 1.0  # --calls 0: a repetition's calls of one implementation take about this long
MAX_CALLS = 20


def interleaved(impls: dict, reps: int, calls: int = 1) -> dict:
    """Median ms per call of each implementation: per repetition, ``calls`` consecutive
    calls of each in turn, timed together (``calls`` 0: per implementation, enough for
    ~BLOCK_MS from its second warm-up call, 1 to MAX_CALLS)."""
    n = {}
    for k, f in impls.items():
        f()
        t0 = time.perf_counter()
        f()
        once = (time.perf_counter() - t0) * 1e3
        n[k] = calls or max(1, min(MAX_CALLS, math.ceil(BLOCK_MS / max(once, 1e-3))))
    times = {k: [] for k in impls}
    for _ in range(reps):
        for k, f in impls.items():
            m = n[k]
            t0 = time.perf_counter()
            for _ in range(m):
                f()
            times[k].append((time.perf_counter() - t0) * 1e3 / m)
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


def fused_rows(x, reps: int, calls: int) -> None:
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
        except (ImportError, RuntimeError):  # (no JAX, or no GPU platform in it)
            pass
        rows, cols = x.shape
        for op in FUSED:
            tm = interleaved({k: v[op] for k, v in sets.items()}, reps, calls)
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


def inputs(grid: list, dtype):
    """Each shape's input, cast to ``dtype``: a prefix of 2^24 standard-normal float32 values
    repeated as long as the largest shape (2^30 values drawn would take tens of seconds; a
    kernel's time does not depend on the values)."""
    need = max(r * c for r, c in grid)
    base = np.random.default_rng(0).standard_normal(min(need, 1 << 24), dtype=np.float32)
    big = np.tile(base, -(-need // base.size))
    for rows, cols in grid:
        yield rows, cols, big[: rows * cols].reshape(rows, cols).astype(dtype)


def release(device: str) -> None:
    """The last shape's device memory given back by every library's cache (32768 x 32768
    needs room for each library's input and output)."""
    gc.collect()
    mx.clear_cache()
    if device != "gpu":
        return
    try:
        import mlx.core as m

        m.clear_cache()
    except (ImportError, AttributeError):
        pass
    try:
        import torch

        torch.cuda.empty_cache()
    except ImportError:
        pass


def copy_limit(device: str):
    """The device's copy bandwidth in bytes/s (read + written), None where not measured."""
    if device != "gpu":
        return None
    from tapescope.kernels.roofline import machine as limits

    lim = limits("gpu")
    return lim.copy_bytes_per_s if lim is not None and lim.copy_bytes_per_s else None


COPY_BAR, PEER_BAR = 0.85, 1.0  # a GPU cell meets the bar at <= 1.0x the best peer or >= 0.85x copy


def run(device: str, grid: list, reps: int, dtype, fused: bool = False, calls: int = 0) -> list:
    rows_out = []
    limit = copy_limit(device)
    if limit:
        print(f"{device} copy bandwidth {limit / 1e12:.2f} TB/s (device to device, read + "
              "written; kernels/roofline.py)", flush=True)
    for rows, cols, x in inputs(grid, dtype):
        try:
            sets = {"tapescope": tapescope_fns(x, device)}
        except RuntimeError as e:  # (the peers' memory pools hold the device's memory)
            print(f"  ({device} {rows} x {cols} left out: {str(e)[:100]})", flush=True)
            continue
        for name, make in (("jax.jit", jax_fns), ("mlx", mlx_fns), ("torch", torch_fns)):
            try:
                got = make(x, device)
            except Exception as e:  # (a peer out of memory or without the dtype: left out)
                print(f"  ({device} {rows} x {cols} {name} left out: {str(e)[:100]})", flush=True)
                got = None
            if got is not None:
                sets[name] = got
        for op in OPS:
            t = interleaved({k: v[op] for k, v in sets.items()}, reps, calls)
            rows_out.append(((rows, cols), op, t))
            jx = t.get("jax.jit")
            best = min((v for k, v in t.items() if k != "tapescope"), default=None)
            cells = "  ".join(f"{k} {v:8.3f}" for k, v in t.items())
            ratio = f"x jax {t['tapescope'] / jx:5.2f}" if jx else ""
            rb = f"x best {t['tapescope'] / best:5.2f}" if best else ""
            tbs = copy_fraction(op, rows, cols, t["tapescope"], x.itemsize)
            bw = f"  {tbs:5.2f} TB/s"
            if limit:
                frac = tbs * 1e12 / limit
                met = (best is not None and t["tapescope"] <= PEER_BAR * best) or frac >= COPY_BAR
                bw += f"  x copy {frac:4.2f}  {'met' if met else 'NOT MET'}"
            print(f"{device} {rows:>6} x {cols:<6} {op:<12} {cells}   {ratio}  {rb}{bw}", flush=True)
        if device == "gpu" and fused:
            fused_rows(x, reps, calls)
        del sets, x
        release(device)
    return rows_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", choices=["cpu", "gpu", "both"], default="cpu")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16, float16 ...")
    ap.add_argument("--calls", type=int, default=None,
                    help="consecutive calls timed together per repetition (0: ~1 ms of them; "
                         "default 1 on the CPU, 0 on the GPU)")
    ap.add_argument("--quick", action="store_true", help="the smallest and largest shapes only")
    ap.add_argument("--shape", action="append", default=[],
                    help="only this rows,cols (repeatable; the GPU's random shape left out)")
    args = ap.parse_args()
    only = [tuple(int(n) for n in sh.split(",")) for sh in args.shape]
    print(f"machine: {machine()}")
    dtype = BF16 if args.dtype == "bfloat16" else np.dtype(args.dtype)
    t_start = time.perf_counter()
    worst = []
    if args.device in ("cpu", "both"):
        grid = [(r, c) for r in (1024, 4096) for c in (128, 1000, 4096)]
        if args.quick:
            grid = [grid[0], grid[-1]]
        res = run("cpu", only or grid, args.reps, dtype, calls=1 if args.calls is None else args.calls)
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
            res = run("gpu", only or grid, args.reps, dtype, fused=True,
                      calls=0 if args.calls is None else args.calls)
            summary(res, copy_limit("gpu"), dtype)
    if worst:
        w = max(worst)
        print(f"cpu: worst tapescope / jax.jit {w[0]:.2f} ({w[2]} at {w[1][0]} x {w[1][1]})")
    print(f"({time.perf_counter() - t_start:.0f} s)")


def summary(res: list, limit, dtype) -> None:
    """The GPU cells that miss the bar (over 1.0x the best peer, or no peer, and under 0.85x
    the copy bandwidth, or none measured)."""
    isz = np.dtype(dtype).itemsize
    miss = []
    for (rows, cols), op, t in res:
        best = min((v for k, v in t.items() if k != "tapescope"), default=None)
        frac = copy_fraction(op, rows, cols, t["tapescope"], isz) * 1e12 / limit if limit else 0.0
        if not ((best is not None and t["tapescope"] <= PEER_BAR * best) or frac >= COPY_BAR):
            vs = f"{t['tapescope'] / best:.2f}x best" if best is not None else "no peer"
            miss.append(f"{op} {rows}x{cols} ({vs}, {frac:.2f} copy)")
    print(f"gpu {np.dtype(dtype).name}: {len(res) - len(miss)} of {len(res)} cells meet the bar"
          + (f"; not: {', '.join(miss)}" if miss else ""))


if __name__ == "__main__":
    main()
