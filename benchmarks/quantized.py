"""Quantized matmul benchmark: tapescope's ``mx.quantized_matmul`` (the generated qmv / qmm
kernels) against jax.jit of the same product written as dequantize + matmul in JAX, MLX's
own ``quantized_matmul`` and, on a GPU, PyTorch's dequantize + matmul; side by side in one
run, interleaved (one call of each in turn per repetition), medians, ratios.

A (N x K) = 4096 x 4096 weight, affine 4-bit, group size 64 (``--bits``, ``--group-size``,
``--mode`` change it), transposed (``x @ w.T``, the linear layer's), for 1 and 512 rows of
float32 x (``--rows``). ``--device gpu`` runs the same on ``mx.gpu`` (``TAPESCOPE_CUDA=1``,
CuPy and a GPU) against jax.jit on the GPU, PyTorch and MLX's CUDA backend where importable;
the 1-row case also prints the bandwidth reached over the packed weight's bytes, and on the
GPU a second line gives tapescope's kernel time (``kernel_ms``: CUDA events around its
launches, the host's per-call work left out).

    .venv/bin/python benchmarks/quantized.py [--reps 15] [--device cpu|gpu] [--rows 1 512]
"""

from __future__ import annotations

import argparse

import numpy as np

import device_time  # the timeline's device times
import tapescope.core as mx
from reductions import interleaved, machine  # noqa: E402  (the machine line, the timing loop)


def quantized(w: np.ndarray, gs: int, bits: int, mode: str):
    """MLX-format (w_q, scales, biases) as numpy arrays, made by tapescope's quantize."""
    q = mx.quantize(mx.array(w), gs, bits, mode=mode)
    mx.eval(*q)
    return [np.array(a) for a in q] + ([None] if mode != "affine" else [])


def tapescope_fn(x, q, gs, bits, mode, device):
    s = mx.gpu if device == "gpu" else mx.cpu
    wq, sc, bi = (None if a is None else mx.array(a) for a in q)
    a = mx.array(x)
    if device == "gpu":
        a, wq, sc = (mx.add(v, 0, stream=s) if v.dtype != mx.uint32 else mx.array(v)
                     for v in (a, wq, sc))
        bi = None if bi is None else mx.add(bi, 0, stream=s)
    mx.eval(a, wq, sc, *(() if bi is None else (bi,)))
    return lambda: mx.eval(mx.quantized_matmul(a, wq, sc, bi, True, gs, bits, mode, stream=s))


def jax_fn(x, q, gs, bits, mode, device):
    """The dequantize + matmul in JAX (affine only), under jax.jit."""
    if mode != "affine":
        return None
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    dev = jax.devices("gpu")[0] if device == "gpu" else jax.devices("cpu")[0]
    wq, sc, bi = (jax.device_put(a, dev) for a in q)
    xj = jax.device_put(x, dev)
    shifts = jnp.arange(0, 32, bits, dtype=jnp.uint32)

    @jax.jit
    def f(v, wq, sc, bi):
        codes = (wq[..., None] >> shifts) & ((1 << bits) - 1)  # (N, K/pf, pf)
        n = wq.shape[0]
        codes = codes.reshape(n, -1, gs).astype(jnp.float32)
        wd = (codes * sc[..., None] + bi[..., None]).reshape(n, -1)
        return v @ wd.T

    if 32 % bits:
        return None
    return lambda: f(xj, wq, sc, bi).block_until_ready()


def mlx_fn(x, q, gs, bits, mode, device):
    try:
        import mlx.core as m
    except ImportError:
        return None
    if device == "gpu" and not (hasattr(m, "cuda") and m.cuda.is_available()):
        return None
    s = m.gpu if device == "gpu" else m.cpu
    wq, sc = m.array(q[0]), m.array(q[1])
    bi = None if q[2] is None else m.array(q[2])
    a = m.array(x)
    m.eval(a, wq, sc, *(() if bi is None else (bi,)))
    return lambda: m.eval(m.quantized_matmul(a, wq, sc, bi, True, gs, bits, mode, stream=s))


def torch_fn(x, q, gs, bits, mode, device):
    if device != "gpu" or mode != "affine" or 32 % bits:
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    wq = torch.from_numpy(q[0].view(np.int32)).cuda()
    sc, bi = (torch.from_numpy(a).cuda() for a in q[1:])
    xt = torch.from_numpy(x).cuda()
    shifts = torch.arange(0, 32, bits, device="cuda", dtype=torch.int32)

    def f():
        codes = (wq[..., None] >> shifts) & ((1 << bits) - 1)
        n = wq.shape[0]
        wd = (codes.reshape(n, -1, gs).float() * sc[..., None] + bi[..., None]).reshape(n, -1)
        (xt @ wd.T)
        torch.cuda.synchronize()

    return f


def kernel_ms(run, calls: int = 20):
    """tapescope's device time of one call from the timeline's CUDA events around each of
    its launches (``gpu_work`` records: the qmv kernel; the dequantize kernel and the
    cuBLAS product), the host's per-call work left out: the mean over ``calls`` calls."""
    return device_time.tapescope_ms(run, calls)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 512])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--mode", default="affine")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    if args.device == "gpu" and not mx.cuda.is_available():
        print("gpu: no CUDA runtime (TAPESCOPE_CUDA=1, CuPy and a GPU are needed)")
        return
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((args.n, args.k)) / args.k ** 0.5).astype(np.float32)
    q = quantized(w, args.group_size, args.bits, args.mode)
    wbytes = sum(a.nbytes for a in q if a is not None)
    for rows in args.rows:
        x = rng.standard_normal((rows, args.k)).astype(np.float32)
        sets = {"tapescope": tapescope_fn(x, q, args.group_size, args.bits, args.mode,
                                          args.device)}
        for name, make in (("jax.jit", jax_fn), ("mlx", mlx_fn), ("torch", torch_fn)):
            f = make(x, q, args.group_size, args.bits, args.mode, args.device)
            if f is not None:
                sets[name] = f
        t = interleaved(sets, args.reps)
        cells = "  ".join(f"{k} {v:8.3f}" for k, v in t.items())
        ratios = "  ".join(f"x {k} {t['tapescope'] / v:5.2f}" for k, v in t.items()
                           if k != "tapescope")
        bw = f"  {wbytes / (t['tapescope'] * 1e-3) / 1e9:6.1f} GB/s over the weight" \
            if rows == 1 else ""
        print(f"{args.device} {args.mode} {args.bits}-bit gs {args.group_size} "
              f"{rows:>4} x {args.k} @ ({args.n} x {args.k}).T  {cells}   {ratios}{bw}",
              flush=True)
        if args.device == "gpu":
            k = kernel_ms(sets["tapescope"])
            if k:
                kb = f"  {wbytes / (k * 1e-3) / 1e9:6.1f} GB/s over the weight" if rows == 1 else ""
                print(f"gpu {rows:>4} rows: tapescope kernel {k:8.3f} ms (CUDA events around its "
                      f"launches){kb}", flush=True)


if __name__ == "__main__":
    main()
