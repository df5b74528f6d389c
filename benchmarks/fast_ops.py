"""MLX's fast primitives benchmark: ``mx.fast.layer_norm``, ``rms_norm``, ``rope`` and
``scaled_dot_product_attention`` (tapescope's MLX primitives) vs jax.jit (and MLX; on a GPU PyTorch and MLX's CUDA
backend), side by side in one run, interleaved (one call of each implementation in turn per
repetition), medians, ratios tapescope / jax.jit and tapescope / the best peer.

CPU rows: layer_norm and rms_norm at (1024, 4096) and (4096, 4096) with weight (and bias),
rope at (4, 16, 2048, 64) and (4, 16, 2048, 128) (dims = head size, base 10000, offset 0);
sdpa (no mask, scale D^-0.5; shape rows are (B, heads, L, kL, D)) for prefill at (4, 16, 2048,
2048, 64 / 128) and for decoding at (4, 16, 1, 4096, 64 / 128); jax.jit's is the written-out
softmax(q kᵀ) v at ``highest`` precision, PyTorch's ``F.scaled_dot_product_attention`` (TF32
off) on the GPU, where the prefill rows add L = 8192; ``--dtype bfloat16`` (or float16) runs
every side in that type.
``qmm`` rows (shape (M, K, N)): 4-bit affine ``quantized_matmul`` of an (M, K) x by a
(N, K) weight (transpose=True, group size 64, MLX's defaults; ``--qbits``, ``--qgroup``,
``--qmode`` pick another of MLX's quantizations) at M = 1 and 512, K = N = 4096,
against MLX (its CPU, or its CUDA backend on the GPU; JAX and PyTorch have no such product);
the bandwidth column counts x, the packed weight, its scales and biases and the output, and
the 1-row GPU row also prints that bandwidth over the device's copy bandwidth
(``roofline.machine("gpu")``).
``--device gpu`` (``TAPESCOPE_CUDA=1``, CuPy, a GPU): the norms at (16384, 4096) and the same
ropes on ``mx.gpu`` against jax.jit on the GPU (float32 at ``highest`` precision),
PyTorch's ``F.layer_norm`` / ``F.rms_norm`` / a written-out rope, and MLX's CUDA backend,
where importable. The last column is the bandwidth tapescope reached (bytes read + written).
On the GPU a second line per row gives each one's kernel time with the host out of the way
(``kernel_ms``: CUDA events) and tapescope's per-call host time (the synchronised call's
median minus its kernel time).

    .venv/bin/python benchmarks/fast_ops.py [--reps 15] [--device cpu|gpu|both] [--dtype float32]
        [--ops sdpa,rope] [--peers jax.jit,mlx] [--shape 4,16,1,4096,64 ...]
        [--qbits 4 --qgroup 64 --qmode affine]
"""

from __future__ import annotations

import argparse
import os
import sys

import ml_dtypes  # noqa: F401  (np.dtype("bfloat16") for --dtype bfloat16)
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import device_time  # noqa: E402  (the timeline's and PyTorch's device times)
import tapescope.core as mx  # noqa: E402
from reductions import interleaved, machine  # noqa: E402  (the machine line, the timing loop)

EPS = 1e-5




def cases(device: str) -> list:
    """(op, shape) rows of the run."""
    if device == "gpu":
        return [("layer_norm", (16384, 4096)), ("rms_norm", (16384, 4096)),
                ("rope", (4, 16, 2048, 64)), ("rope", (4, 16, 2048, 128))] + SDPA + [
                ("sdpa", (4, 16, 8192, 8192, 64)), ("sdpa", (4, 16, 8192, 8192, 128))] + QMM
    return [("layer_norm", (1024, 4096)), ("layer_norm", (4096, 4096)),
            ("rms_norm", (1024, 4096)), ("rms_norm", (4096, 4096)),
            ("rope", (4, 16, 2048, 64)), ("rope", (4, 16, 2048, 128))] + SDPA + QMM


SDPA = [("sdpa", (4, 16, 2048, 2048, 64)), ("sdpa", (4, 16, 2048, 2048, 128)),
        ("sdpa", (4, 16, 1, 4096, 64)), ("sdpa", (4, 16, 1, 4096, 128))]
QMM = [("qmm", (1, 4096, 4096)), ("qmm", (512, 4096, 4096))]
QBITS, QGROUP, QMODE = 4, 64, "affine"  # the qmm rows' quantization (MLX's defaults;
# --qbits / --qgroup / --qmode change it: affine 2, 3, 4, 5, 6, 8 bits; mxfp4, mxfp8, nvfp4)


def qmm_bytes(shape: tuple, itemsize: int) -> int:
    """Bytes a qmm row moves: x and the output in the row's dtype, the packed weight, its
    scales and biases (one each per group, in the row's dtype; the fp modes: one scale byte
    per group, no biases)."""
    M, K, N = shape
    groups = N * (K // QGROUP) * (2 * itemsize if QMODE == "affine" else 1)
    return (M * K + M * N) * itemsize + N * K * QBITS // 8 + groups


def inputs(op: str, shape: tuple, dtype) -> tuple:
    rng = np.random.default_rng(0)
    if op == "qmm":  # (x, the float weight, unused): each side quantizes w itself
        M, K, N = shape
        return (rng.standard_normal((M, K)).astype(dtype),
                (rng.standard_normal((N, K)) * K ** -0.5).astype(dtype), np.zeros(1, dtype))
    if op == "sdpa":  # (q, k, v)
        B, H, L, kL, D = shape
        return (rng.standard_normal((B, H, L, D)).astype(dtype),
                rng.standard_normal((B, H, kL, D)).astype(dtype),
                rng.standard_normal((B, H, kL, D)).astype(dtype))
    x = rng.standard_normal(shape).astype(dtype)
    d = shape[-1]
    return x, rng.standard_normal(d).astype(dtype), rng.standard_normal(d).astype(dtype)


def tapescope_fn(op, x, w, b, device):
    s = mx.gpu if device == "gpu" else mx.cpu
    a, wa, ba = (mx.array(v) for v in (x, w, b))
    if device == "gpu":
        a, wa, ba = (mx.add(v, 0, stream=s) for v in (a, wa, ba))
    mx.eval(a, wa, ba)
    if op == "qmm":
        wq, sc, *bi = mx.quantize(wa, group_size=QGROUP, bits=QBITS, mode=QMODE, stream=s)
        bi = bi[0] if bi else None
        mx.eval(wq, sc, *([] if bi is None else [bi]))
    f = {"qmm": lambda: mx.quantized_matmul(a, wq, sc, bi, transpose=True, group_size=QGROUP,
                                            bits=QBITS, mode=QMODE, stream=s),
         "layer_norm": lambda: mx.fast.layer_norm(a, wa, ba, EPS, stream=s),
         "rms_norm": lambda: mx.fast.rms_norm(a, wa, EPS, stream=s),
         "rope": lambda: mx.fast.rope(a, x.shape[-1], traditional=False, base=10000.0, scale=1.0,
                                      offset=0, stream=s),
         "sdpa": lambda: mx.fast.scaled_dot_product_attention(a, wa, ba, scale=x.shape[-1] ** -0.5,
                                                              stream=s)}[op]
    run = lambda: mx.eval(f())  # noqa: E731
    run.issue = f  # one call, not evaluated (kernel_ms queues several)
    return run


def jax_fn(op, x, w, b, device):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    if op == "qmm":  # no quantized product in JAX
        return None
    try:
        dev = jax.devices("gpu")[0] if device == "gpu" else jax.devices("cpu")[0]
    except RuntimeError:
        return None
    jax.config.update("jax_default_matmul_precision", "highest")
    a, wa, ba = (jax.device_put(v, dev) for v in (x, w, b))

    def ln(v, w, b):
        mu = jnp.mean(v, -1, keepdims=True)
        c = v - mu
        return c * jax.lax.rsqrt(jnp.mean(c * c, -1, keepdims=True) + EPS) * w + b

    def rms(v, w):
        return v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + EPS) * w

    def rope(v):
        L, D = v.shape[-2], v.shape[-1]
        half = D // 2
        inv = jnp.exp(-jnp.arange(half, dtype=jnp.float32) * (np.log(10000.0) / half))
        th = jnp.arange(L, dtype=jnp.float32)[:, None] * inv
        c, s = jnp.cos(th).astype(v.dtype), jnp.sin(th).astype(v.dtype)
        x1, x2 = v[..., :half], v[..., half:]
        return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1)

    def sdpa(q, k, v):
        s = jnp.einsum("bhld,bhkd->bhlk", q, k) * (q.shape[-1] ** -0.5)
        return jnp.einsum("bhlk,bhkd->bhld", jax.nn.softmax(s, -1), v)

    jf, args = {"sdpa": (sdpa, (a, wa, ba)), "layer_norm": (ln, (a, wa, ba)),
                "rms_norm": (rms, (a, wa)), "rope": (rope, (a,))}[op]
    f = jax.jit(jf)
    run = lambda: f(*args).block_until_ready()  # noqa: E731
    run.issue = lambda: f(*args)  # dispatched, not waited for
    return run


def mlx_fn(op, x, w, b, device):
    try:
        import mlx.core as m
    except ImportError:
        return None
    if device == "gpu" and not (hasattr(m, "cuda") and m.cuda.is_available()):
        return None
    s = m.gpu if device == "gpu" else m.cpu
    if x.dtype.name == "bfloat16":  # (through float32: exact)
        a, wa, ba = (m.array(v.astype(np.float32)).astype(m.bfloat16) for v in (x, w, b))
    else:
        a, wa, ba = (m.array(v) for v in (x, w, b))
    m.eval(a, wa, ba)
    if op == "qmm":
        wq, sc, *bi = m.quantize(wa, group_size=QGROUP, bits=QBITS, mode=QMODE, stream=s)
        bi = bi[0] if bi else None
        m.eval(wq, sc, *([] if bi is None else [bi]))
    f = {"qmm": lambda: m.quantized_matmul(a, wq, sc, bi, transpose=True, group_size=QGROUP,
                                           bits=QBITS, mode=QMODE, stream=s),
         "layer_norm": lambda: m.fast.layer_norm(a, wa, ba, EPS, stream=s),
         "rms_norm": lambda: m.fast.rms_norm(a, wa, EPS, stream=s),
         "rope": lambda: m.fast.rope(a, x.shape[-1], traditional=False, base=10000.0, scale=1.0,
                                     offset=0, stream=s),
         "sdpa": lambda: m.fast.scaled_dot_product_attention(a, wa, ba, scale=x.shape[-1] ** -0.5,
                                                             stream=s)}[op]
    return lambda: m.eval(f())


def torch_fn(op, x, w, b, device):
    if device != "gpu" or op == "qmm":
        return None
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    if x.dtype.name == "bfloat16":  # (the bits: torch takes no ml_dtypes array)
        a, wa, ba = (torch.from_numpy(v.view(np.uint16).view(np.int16)).cuda().view(torch.bfloat16)
                     for v in (x, w, b))
    else:
        a, wa, ba = (torch.from_numpy(v).cuda() for v in (x, w, b))
    D = x.shape[-1]
    if op == "sdpa":
        def f():
            return F.scaled_dot_product_attention(a, wa, ba, scale=D ** -0.5)
    elif op == "rope":
        half = D // 2
        inv = torch.exp(-torch.arange(half, dtype=torch.float32, device="cuda") * (np.log(1e4) / half))
        th = torch.arange(x.shape[-2], dtype=torch.float32, device="cuda")[:, None] * inv
        c, s = torch.cos(th), torch.sin(th)

        def f():
            x1, x2 = a[..., :half], a[..., half:]
            return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)
    elif op == "layer_norm":
        def f():
            return F.layer_norm(a, (D,), wa, ba, EPS)
    else:
        def f():
            return F.rms_norm(a, (D,), wa, EPS)
    run = lambda: (f(), torch.cuda.synchronize())  # noqa: E731
    run.issue = f
    return run


QUEUED = 20  # calls queued back to back for a kernel time
KERNELS: dict = {}  # the last row's tapescope kernels (gpu_work names), printed on the GPU


def kernel_ms(name: str, run, op: str):
    """Device time of one call with the host out of the way, by CUDA events: tapescope's
    from the timeline (its timing events around each launch: ``gpu_work`` records), the
    mean over ``QUEUED`` calls; PyTorch's around
    ``QUEUED`` calls queued back to back; jax.jit has no events here: the wall time of
    ``QUEUED`` queued calls / calls (an upper bound)."""
    import time

    issue = getattr(run, "issue", None)
    if issue is None:
        return None
    if name == "tapescope":  # the timeline's device time of each launch (gpu_work)
        ms, names = device_time.tapescope_ms(run, QUEUED)
        KERNELS.clear()
        KERNELS.update((k, None) for k in names)
        return ms
    if name == "torch":
        return device_time.torch_ms(issue, QUEUED)
    if name == "jax.jit":
        outs = [issue()]  # warm
        outs[0].block_until_ready()
        t0 = time.perf_counter()
        outs = [issue() for _ in range(QUEUED)]
        outs[-1].block_until_ready()
        return (time.perf_counter() - t0) * 1e3 / QUEUED
    return None


def _runs(name: str, f, op: str, shape) -> bool:
    """Whether a peer's call runs (JAX's reference runs an H100 out of memory at L = 8192):
    the row goes on without it, saying why."""
    try:
        f()
        return True
    except Exception as e:  # noqa: BLE001 - any peer failure leaves the peer out of the row
        print(f"  ({name} left out of {op} {shape}: {type(e).__name__}: {str(e)[:120]})", flush=True)
        return False


def run(device: str, reps: int, dtype, ops=None, peers=None, shapes=None) -> list:
    out = []
    for op, shape in cases(device):
        if (ops and op not in ops) or (shapes and shape not in shapes):
            continue
        x, w, b = inputs(op, shape, dtype)
        impls = {"tapescope": tapescope_fn(op, x, w, b, device)}
        for name, make in (("jax.jit", jax_fn), ("mlx", mlx_fn), ("torch", torch_fn)):
            if peers and name not in peers:
                continue
            f = make(op, x, w, b, device)
            if f is not None and _runs(name, f, op, shape):
                impls[name] = f
        t = interleaved(impls, reps)
        out.append((op, shape, t))
        jx = t.get("jax.jit")
        best = min((v for k, v in t.items() if k != "tapescope"), default=None)
        cells = "  ".join(f"{k} {v:8.3f}" for k, v in t.items())
        moved = (qmm_bytes(shape, x.itemsize) if op == "qmm" else
                 x.nbytes * 2 + w.nbytes + b.nbytes if op == "sdpa" else 2 * x.nbytes)
        gbs = moved / (t["tapescope"] * 1e-3) / 1e9
        ratio = f"x jax {t['tapescope'] / jx:5.2f}" if jx else ""
        rb = f"x best {t['tapescope'] / best:5.2f}" if best else ""
        print(f"{device} {op:<10} {str(shape):<20} {cells}   {ratio}  {rb}  {gbs:6.1f} GB/s",
              flush=True)
        if device == "gpu":
            k = {n: kernel_ms(n, f, op) for n, f in impls.items()}
            kc = "  ".join(f"{n} {v:8.3f}" for n, v in k.items() if v is not None)
            kt = k.get("tapescope")
            kg = f"  {moved / (kt * 1e-3) / 1e9:6.1f} GB/s" if kt else ""
            host = f"  (tapescope host per call ~{t['tapescope'] - kt:6.3f})" if kt else ""
            print(f"{device} {op:<10} {str(shape):<20} kernel ms: {kc}{kg}{host}", flush=True)
            if op == "qmm":  # which kernels ran (qmv's plan: affine_qmv_<dtype>_gs_64_b_4_m_1)
                print(f"{device} {op:<10} {str(shape):<20} kernels: {', '.join(KERNELS)}",
                      flush=True)
            if op == "qmm" and shape[0] == 1 and kt:
                from tapescope.kernels.roofline import machine as limits

                lim = limits("gpu")
                if lim is not None:
                    print(f"{device} {op:<10} {str(shape):<20} kernel bandwidth / copy "
                          f"bandwidth {moved / (kt * 1e-3) / lim.copy_bytes_per_s:5.2f}",
                          flush=True)
    return out


def main():
    global QBITS, QGROUP, QMODE
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", choices=["cpu", "gpu", "both"], default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ops", default="", help="comma-separated ops to run (default: all)")
    ap.add_argument("--shape", action="append", default=[],
                    help="only this row's shape, e.g. 4,16,1,4096,64 (repeatable; default: all)")
    ap.add_argument("--peers", default="", help="comma-separated peers (jax.jit, mlx, torch; "
                    "default: all; MLX's CPU prefill attention takes ~20 s a call)")
    ap.add_argument("--qbits", type=int, default=QBITS, help="the qmm rows' code width")
    ap.add_argument("--qgroup", type=int, default=QGROUP, help="the qmm rows' group size")
    ap.add_argument("--qmode", default=QMODE, help="the qmm rows' mode (affine, mxfp4, "
                    "mxfp8, nvfp4: give their bits and group size too)")
    args = ap.parse_args()
    QBITS, QGROUP, QMODE = args.qbits, args.qgroup, args.qmode
    print(f"machine: {machine()}")
    print("load average: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    from tapescope.kernels.settings import settings

    # MLX_ENABLE_TF32 switches both tapescope's and MLX's float32 GEMMs (sdpa's prefill):
    # =0 for the rows against jax.jit at "highest" and PyTorch with TF32 off
    print(f"float32 GEMMs in TF32 (MLX_ENABLE_TF32, tapescope and MLX): {settings.tf32}", flush=True)
    print(f"qmm rows: {QMODE} {QBITS}-bit, group size {QGROUP}", flush=True)
    dtype = np.dtype(args.dtype)
    shapes = {tuple(int(n) for n in sh.split(",")) for sh in args.shape}
    if args.device in ("cpu", "both"):
        ops = set(filter(None, args.ops.split(",")))
        peers = set(filter(None, args.peers.split(",")))
        res = run("cpu", args.reps, dtype, ops, peers, shapes)
        worst = max(((t["tapescope"] / t["jax.jit"], op, shape) for op, shape, t in res
                     if "jax.jit" in t), default=None)
        if worst:
            print(f"cpu: worst tapescope / jax.jit {worst[0]:.2f} ({worst[1]} at {worst[2]})")
        print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if args.device in ("gpu", "both"):
        if not mx.cuda.is_available():
            print("gpu: no CUDA runtime (TAPESCOPE_CUDA=1, CuPy and a GPU are needed)")
        else:
            run("gpu", args.reps, dtype, set(filter(None, args.ops.split(","))),
                set(filter(None, args.peers.split(","))), shapes)


if __name__ == "__main__":
    main()
