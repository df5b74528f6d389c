"""Every prefill attention kernel tapescope has, timed side by side on one GPU, to pick
``kernels/cuda/attention.py``'s ``FLASH`` table: for each row (dtype, (B, H, L, kL, D), no
mask, scale D^-0.5) the fused kernel's first loop (``first``; for float32 also ``qreload``,
its query fragments re-read each key tile), each tile of the half types' ldmatrix / cp.async kernel (``codegen/attention_flash16.py``: ``w<warps>m<blocks>k<keys>``),
the cuBLAS GEMMs + softmax composition (``composed``) and PyTorch's
``F.scaled_dot_product_attention`` (FlashAttention / cuDNN for the half types; TF32 off for
float32, its memory-efficient kernel). Times are device times (CUDA events: tapescope's
timeline ``gpu_work`` records, PyTorch's events around queued calls), the mean over queued
calls; each variant's output is checked against PyTorch's (the ``err`` column: max |diff| /
max |torch|) so a kernel wrong on the GPU shows here. The last lines are the ``FLASH``
entries the run measured fastest (geometric mean over the row's lengths), to paste.

Float32 rows run twice: ``tf32`` (``settings.tf32`` on: TF32 in the fused kernel and the
GEMMs; MLX's default) and ``f32x3`` (off: 3xTF32 in the fused kernel, full float32 GEMMs).

    TAPESCOPE_CUDA=1 python3 benchmarks/sdpa_variants.py [--full] [--dtypes bfloat16,float32]
        [--lengths 2048,8192] [--heads 64,128] [--causal]

The default set takes about a minute on an H100 (NVRTC builds included); ``--full`` times
every tile for float16 too and float32 at 8192 with full accuracy.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import device_time  # noqa: E402  (the timeline's and PyTorch's device times)
import tapescope.core as mx  # noqa: E402

PRIM = "ScaledDotProductAttention"
# the tiles timed by default per head size (the others: --full)
TILES = {64: ("w4m1k64", "w8m1k64", "w4m2k64", "w4m2k64q", "w4m1k32", "w4m1k128"),
         128: ("w4m1k64", "w8m1k64", "w4m1k32", "w4m2k32q", "w4m1k64q")}


def _queued(L: int) -> int:
    return 10 if L <= 2048 else 4


def tapescope_ms(f, n: int) -> tuple:
    """(mean device time of ``n`` calls after two warm ones, the kernels that ran)."""
    mx.eval(f())
    mx.eval(f())
    ms, names = device_time.tapescope_ms(lambda: mx.eval(f()), n)
    return (float("nan") if ms is None else ms), sorted(str(k) for k in names)


def row(dtype: str, prec: str, shape: tuple, variants: list, causal: bool) -> dict:
    """``{variant: (ms, err, kernels)}`` of one row."""
    import torch
    import torch.nn.functional as F

    from tapescope.kernels.cuda import attention
    from tapescope.kernels.settings import settings

    B, H, L, kL, D = shape
    rng = np.random.default_rng(0)
    x = [rng.standard_normal((B, H, n, D), dtype=np.float32) for n in (L, kL, kL)]
    tt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    ta = [torch.from_numpy(a).cuda().to(tt) for a in x]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tf = lambda: F.scaled_dot_product_attention(*ta, scale=D ** -0.5, is_causal=causal)  # noqa: E731
    want = tf().float()
    scale_ref = float(want.abs().max())
    out = {"torch": (device_time.torch_ms(tf, _queued(L)), 0.0, [])}
    mt = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}[dtype]
    qa, ka, va = (mx.add(mx.array(a, dtype=mt), 0, stream=mx.gpu) for a in x)
    mx.eval(qa, ka, va)
    cls = "half" if dtype != "float32" else prec
    keep = attention.FLASH.get((cls, D))
    try:
        with settings(tf32=prec != "f32x3"):
            for v in variants:
                attention.FLASH[cls, D] = None if v == "composed" else ("" if v == "first" else v)
                attention.RULES[PRIM].plans.clear()
                f = lambda: mx.fast.scaled_dot_product_attention(  # noqa: E731
                    qa, ka, va, scale=D ** -0.5, mask="causal" if causal else None, stream=mx.gpu)
                try:
                    ms, names = tapescope_ms(f, _queued(L))
                    got = torch.from_numpy(np.asarray(f().astype(mx.float32))).cuda()
                    err = float((got - want).abs().max()) / scale_ref
                except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the run goes on
                    print(f"  {dtype} {prec} {shape} {v}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    ms, err, names = float("nan"), float("nan"), []
                fused = [n for n in names if n.startswith("sdpa_flash")]
                ran = (not fused if v == "composed" else
                       bool(fused) and all((f"_{v}_" in n) == (v != "first") for n in fused))
                if names and not ran:  # (the variant's kernel did not run: say so, no time)
                    print(f"  {dtype} {prec} {shape} {v}: ran {names}", flush=True)
                    ms = float("nan")
                out[v] = (ms, err, names)
    finally:
        attention.FLASH[cls, D] = keep
        attention.RULES[PRIM].plans.clear()
    del qa, ka, va, ta, want
    torch.cuda.empty_cache()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--lengths", default="2048,8192")
    p.add_argument("--heads", default="64,128")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--full", action="store_true")
    args = p.parse_args()
    if not mx.cuda.is_available():
        sys.exit("no CUDA runtime (TAPESCOPE_CUDA=1, CuPy and a GPU are needed)")
    import torch

    from tapescope.kernels.cuda import attention

    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; causal {args.causal}",
          flush=True)
    t0 = time.time()
    lengths = [int(n) for n in args.lengths.split(",")]
    heads = [int(n) for n in args.heads.split(",")]
    from tapescope.kernels.codegen import attention_flash16 as f16

    rows = []  # (dtype, prec, shape, results)
    for dtype in args.dtypes.split(","):
        for prec in (("tf32", "f32x3") if dtype == "float32" else ("",)):
            for D in heads:
                for L in lengths:
                    if dtype == "float32":
                        if prec == "f32x3" and L > 2048 and not args.full:
                            continue
                        variants = ["first", "qreload", "composed"]
                    elif dtype == "float16" and not args.full:
                        if L > 2048:
                            continue
                        variants = [attention.FLASH["half", D] or "w4m1k64", "composed"]
                    else:
                        tiles = [t for t in (f16.TILES if args.full else TILES.get(D, f16.TILES))
                                 if f16.fits(D, t)]
                        variants = ["first", *tiles, "composed"]
                    shape = (4, 16, L, L, D)
                    res = row(dtype, prec, shape, list(dict.fromkeys(variants)), args.causal)
                    rows.append((dtype, prec, shape, res))
                    best = min((v for v in res if v != "torch"), key=lambda v: res[v][0]
                               if res[v][0] == res[v][0] else math.inf)
                    cells = "  ".join(f"{v} {ms:7.3f}" + (f" (err {err:.1e})" if v != "torch" else "")
                                      for v, (ms, err, _) in res.items())
                    print(f"{dtype:8s} {prec:5s} {shape}  {cells}  | best {best} "
                          f"x torch {res[best][0] / res['torch'][0]:.2f}", flush=True)
    print(f"\n(total {time.time() - t0:.0f} s)")
    # the table: ms per variant, and the best against PyTorch
    print("\n| dtype | prec | (B, H, L, kL, D) | variant | ms | x torch | err |")
    print("|---|---|---|---|---:|---:|---:|")
    for dtype, prec, shape, res in rows:
        for v, (ms, err, _) in res.items():
            print(f"| {dtype} | {prec} | {shape} | {v} | {ms:.3f} | {ms / res['torch'][0]:.2f} | "
                  f"{'' if v == 'torch' else f'{err:.1e}'} |")
    # the FLASH entries the run measured fastest (geometric mean over the lengths; the
    # variants with an error over 2e-2 (16-bit) / 1e-2 (tf32) / 1e-4 (f32x3) left out)
    bound = {"": 2e-2, "tf32": 1e-2, "f32x3": 1e-4}
    print("\n# FLASH entries measured fastest (kernels/cuda/attention.py):")
    picks = {}
    for dtype, prec, shape, res in rows:
        cls = "half" if dtype != "float32" else prec
        if dtype == "float16" and any(r[0] == "bfloat16" for r in rows):
            continue  # (the half class follows bfloat16's rows where both ran)
        d = picks.setdefault((cls, shape[-1]), {})
        for v, (ms, err, _) in res.items():
            if v != "torch" and ms == ms and err <= bound[prec]:
                d.setdefault(v, []).append(math.log(ms))
    for (cls, D), d in sorted(picks.items()):
        if not d:
            continue
        n = max(len(x) for x in d.values())
        full = {v: sum(x) / len(x) for v, x in d.items() if len(x) == n}
        if not full:
            continue
        v = min(full, key=full.get)
        entry = "None" if v == "composed" else repr("" if v == "first" else v)
        print(f"FLASH[{cls!r}, {D}] = {entry}  # geomean {math.exp(full[v]):.3f} ms over {n} length(s)")


if __name__ == "__main__":
    main()
