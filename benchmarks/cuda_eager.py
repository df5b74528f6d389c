"""Eager speed on an NVIDIA GPU, side by side in one run: tapescope's CUDA runtime against
PyTorch eager, CuPy and MLX's CUDA backend (each where importable), float32 and bfloat16.

Rows (medians of per-call milliseconds, the implementations taking turns per round):

- ``a + b`` and its eval, 16 elements;
- the 50-op eager chain ``v = v * 1.0001 + 0.5`` (25 times) on 2^20 elements, then eval;
- an ``mlx.nn`` MLP Adam step (batch 1024, 784 -> 2048 -> 2048 -> 10, cross entropy), eager
  and with the step compiled as MLX's examples do (``partial(mx.compile, inputs=state,
  outputs=state)``); tapescope runs MLX's ``mlx.nn`` / ``mlx.optimizers`` through
  ``tapescope.as_mlx()`` (the mlx wheel's Python files only), PyTorch the same model
  (``torch.nn`` + ``torch.optim.Adam``);
- the tiny llama-style model of ``benchmarks/eager.py`` (``eager.llama_decoder``: ``mlx.nn``,
  2 layers, width 64, RMSNorm, RoPE, ``mx.fast.scaled_dot_product_attention``, mlx_lm's KV
  cache) decoding greedily, milliseconds per decoded token (prompt excluded; each token
  evaluated and read before the next), tapescope through ``as_mlx()`` against MLX's CUDA
  backend (in its own process, as the MLP step's), the same weights: the row says whether
  the tokens are the same.

float32 products run at one precision on every side: full float32 by default (PyTorch's TF32
off, ``MLX_ENABLE_TF32=0`` for tapescope and MLX), or TF32 everywhere with ``--tf32`` (MLX's
own default on CUDA). Prints the GPU, the precision and each row's ratio to tapescope.

    TAPESCOPE_CUDA=1 python benchmarks/cuda_eager.py [--rounds 7] [--steps 10] [--tf32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial

os.environ.setdefault("TAPESCOPE_CUDA", "1")

import numpy as np  # noqa: E402


TF32 = [False]  # --tf32: float32 products in TensorFloat-32 on every side
HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA = "llama decode, per token"


def _timed(fn, n: int) -> float:
    """Milliseconds per call of ``fn`` (which waits for its own result), over ``n`` calls;
    a function that times itself (returns its milliseconds per unit: the llama row's per
    decoded token) gives the mean of what it returned."""
    own = []
    t0 = time.perf_counter()
    for _ in range(n):
        r = fn()
        if r is not None:
            own.append(r)
    return sum(own) / len(own) if own else (time.perf_counter() - t0) * 1e3 / n


def _tapescope(dtype: str):
    import tapescope.core as mx

    mx.set_default_device(mx.gpu)
    dt = getattr(mx, dtype)
    a = mx.array(np.arange(16, dtype=np.float32)).astype(dt)
    v0 = mx.array(np.linspace(-1, 1, 1 << 20, dtype=np.float32)).astype(dt)
    mx.eval(a, v0)

    def add():
        mx.eval(a + a)

    def chain():
        v = v0
        for _ in range(25):
            v = v * 1.0001 + 0.5
        mx.eval(v)

    return {"a + b (16)": add, "50-op chain (2^20)": chain}


def _torch(dtype: str):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = TF32[0]
    torch.backends.cudnn.allow_tf32 = TF32[0]
    dt = getattr(torch, dtype)
    a = torch.arange(16, dtype=torch.float32, device="cuda").to(dt)
    v0 = torch.linspace(-1, 1, 1 << 20, device="cuda").to(dt)
    sync = torch.cuda.synchronize

    def add():
        _ = a + a
        sync()

    def chain():
        v = v0
        for _ in range(25):
            v = v * 1.0001 + 0.5
        sync()

    return {"a + b (16)": add, "50-op chain (2^20)": chain}


def _cupy(dtype: str):
    if dtype != "float32":
        return None  # CuPy has no bfloat16
    import cupy

    a = cupy.arange(16, dtype=cupy.float32)
    v0 = cupy.linspace(-1, 1, 1 << 20, dtype=cupy.float32)
    s = cupy.cuda.get_current_stream()

    def add():
        _ = a + a
        s.synchronize()

    def chain():
        v = v0
        for _ in range(25):
            v = v * 1.0001 + 0.5
        s.synchronize()

    return {"a + b (16)": add, "50-op chain (2^20)": chain}


_REAL_MLX: list = []  # MLX's own mlx.core, imported before as_mlx() takes the name over


def _real_mlx():
    if not _REAL_MLX:
        try:
            import mlx.core as m
            ok = getattr(m, "__name__", "") == "mlx.core" and m.cuda.is_available()
        except Exception:  # noqa: BLE001 - not installed, or its core library is not there
            ok = False
        _REAL_MLX.append(m if ok else None)
    return _REAL_MLX[0]


def _mlx_cuda(dtype: str):
    """MLX's own CUDA backend, where its wheel is installed (``mlx[cuda]``)."""
    mlx_mx = _real_mlx()
    if mlx_mx is None:
        return None
    mlx_mx.set_default_device(mlx_mx.gpu)
    dt = getattr(mlx_mx, dtype)
    a = mlx_mx.arange(16).astype(dt)
    v0 = mlx_mx.array(np.linspace(-1, 1, 1 << 20, dtype=np.float32)).astype(dt)

    def add():
        mlx_mx.eval(a + a)

    def chain():
        v = v0
        for _ in range(25):
            v = v * 1.0001 + 0.5
        mlx_mx.eval(v)

    return {"a + b (16)": add, "50-op chain (2^20)": chain}


def mlp_steps(mx, nn, optim, dtype: str, batch: int, device=None,
              sizes: tuple = (784, 2048, 2048, 10)) -> dict:
    """The MLP Adam step, eager and compiled, over whichever ``mlx.core`` / ``mlx.nn`` /
    ``mlx.optimizers`` it is given (tapescope's through ``as_mlx()``, or MLX's own), on the
    GPU unless ``device`` says; ``sizes``: the layers' widths (ReLU between)."""
    mx.set_default_device(mx.gpu if device is None else device)
    rng = np.random.default_rng(0)
    layers = []
    for k in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[k], sizes[k + 1])] + ([nn.ReLU()] if k < len(sizes) - 2 else [])
    model = nn.Sequential(*layers)
    if dtype == "bfloat16":
        model.set_dtype(mx.bfloat16)
    opt = optim.Adam(learning_rate=1e-3)
    x = mx.array(rng.standard_normal((batch, sizes[0])).astype(np.float32)).astype(getattr(mx, dtype))
    y = mx.array(rng.integers(0, sizes[-1], batch).astype(np.int32))
    mx.eval(model.parameters(), x, y)

    def loss_fn(m, x, y):
        return nn.losses.cross_entropy(m(x), y, reduction="mean")

    lg = nn.value_and_grad(model, loss_fn)

    def step(x, y):
        loss, g = lg(model, x, y)
        opt.update(model, g)
        return loss

    state = [model.state, opt.state]
    compiled = partial(mx.compile, inputs=state, outputs=state)(step)

    def eager():
        loss = step(x, y)
        mx.eval(loss, state)

    def comp():
        loss = compiled(x, y)
        mx.eval(loss, state)

    return {f"MLP Adam step eager (b{batch})": eager, f"MLP Adam step compiled (b{batch})": comp}


def llama_decode(mx, nn, dtype: str, device=None) -> tuple:
    """The llama row over whichever ``mlx.core`` / ``mlx.nn`` it is given: ({row: a function
    decoding one sequence, returning its ms per decoded token}, {"tokens": the last
    sequence's tokens}). ``device``: the default device (the GPU unless given: a smoke test
    of MLX's side on a machine without its CUDA backend passes ``mx.cpu``)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from eager import llama_decoder  # (the one model: benchmarks/eager.py's decode row's)

    mx.set_default_device(mx.gpu if device is None else device)
    generate = llama_decoder(mx, nn, dtype)[2]
    seen: dict = {}

    def decode():
        us, seen["tokens"] = generate()
        return us / 1e3

    return {LLAMA: decode}, seen


def _llama_tapescope(dtype: str):
    """The llama row through MLX's mlx.nn over tapescope (None without the mlx package)."""
    import importlib.util

    if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx.nn") is None:
        return None
    import tapescope

    tapescope.as_mlx()
    import mlx.core as mx
    import mlx.nn as nn

    return llama_decode(mx, nn, dtype)


def _mlp_tapescope(dtype: str, batch: int):
    """The MLP step through MLX's mlx.nn over tapescope (None without the mlx package)."""
    import importlib.util

    if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx.nn") is None:
        return None
    import tapescope

    tapescope.as_mlx()
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    return mlp_steps(mx, nn, optim, dtype, batch)


def _mlp_torch(dtype: str, batch: int):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = TF32[0]
    torch.backends.cudnn.allow_tf32 = TF32[0]
    dt = getattr(torch, dtype)
    model = torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 10)).cuda().to(dt)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 784, device="cuda").to(dt)
    y = torch.randint(0, 10, (batch,), device="cuda")

    def eager():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()

    return {f"MLP Adam step eager (b{batch})": eager}


MLX_MLP = r"""
import json, sys, time
sys.path.insert(0, sys.argv[5])
import mlx.core as mx, mlx.nn as nn, mlx.optimizers as optim
from cuda_eager import _timed, llama_decode, mlp_steps
dtype, batch, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llama, seen = llama_decode(mx, nn, dtype)
out = {}
for name, fn in {**mlp_steps(mx, nn, optim, dtype, batch), **llama}.items():
    for _ in range(3):
        fn()
    out[name] = [_timed(fn, 1 if name in llama else steps) for _ in range(rounds)]
print(json.dumps({"times": out, "tokens": seen["tokens"]}))
"""


def _mlp_mlx_cuda(dtype: str, batch: int, rounds: int, steps: int) -> dict:
    """MLX's own MLP step and llama decode times (ms per step / per decoded token, per
    round) and its llama's tokens, ``{"times": ..., "tokens": ...}``, measured in a process
    of its own (``as_mlx()`` takes the name ``mlx`` over in this one), just before the
    others; {} without MLX's CUDA backend."""
    import json
    import subprocess
    import sys

    if _real_mlx() is None:
        return {}
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", MLX_MLP, dtype, str(batch), str(rounds), str(steps), here],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    if r.returncode != 0:
        print(f"(MLX CUDA's MLP step failed: {r.stderr.strip().splitlines()[-1:]})")
        return {}
    return json.loads(r.stdout.strip().splitlines()[-1])


def gpu_name() -> str:
    import cupy

    p = cupy.cuda.runtime.getDeviceProperties(0)
    return p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--tf32", action="store_true",
                    help="float32 products in TF32 on every side (MLX's CUDA default)")
    args = ap.parse_args(argv)
    TF32[0] = args.tf32  # tapescope and MLX read MLX's variable (MLX: once, at first use)
    os.environ["MLX_ENABLE_TF32"] = "1" if args.tf32 else "0"
    _real_mlx()  # MLX's own module, before as_mlx() takes its name
    print(f"GPU: {gpu_name()}; float32 products in {'TF32' if args.tf32 else 'full float32'}; "
          f"medians of {args.rounds} rounds, ms per call; ratio = other / tapescope")
    for dtype in ("float32", "bfloat16"):
        contenders = {"tapescope": _tapescope(dtype), "PyTorch": _torch(dtype),
                      "CuPy": _cupy(dtype), "MLX CUDA": _mlx_cuda(dtype)}
        mlp = {"tapescope": _mlp_tapescope(dtype, args.batch), "PyTorch": _mlp_torch(dtype, args.batch)}
        llama = _llama_tapescope(dtype)
        if llama is not None:
            mlp["tapescope"] = {**(mlp["tapescope"] or {}), **llama[0]}
        for name, cases in mlp.items():
            if cases and contenders.get(name) is not None:
                contenders[name] = {**contenders[name], **cases}
        live = {k: v for k, v in contenders.items() if v}
        missing = [k for k, v in contenders.items() if not v]
        rows = sorted({r for v in live.values() for r in v}, key=lambda r: ("MLP" in r, r))
        times = {(k, r): [] for k in live for r in live[k] if r in rows}
        for k in live:  # warm-up: kernel builds, caches
            for r, fn in live[k].items():
                for _ in range(3):
                    fn()
        mlx_own = _mlp_mlx_cuda(dtype, args.batch, args.rounds, args.steps)
        for r, ts in mlx_own.get("times", {}).items():
            if "MLX CUDA" not in live:
                live["MLX CUDA"] = {}
                missing.remove("MLX CUDA")
            times[("MLX CUDA", r)] = ts  # (its own process, just before)
        for _ in range(args.rounds):
            for r in rows:
                for k in live:
                    fn = live[k].get(r)
                    if fn is not None:
                        n = args.steps if "MLP" in r else (
                            1 if r == LLAMA else args.calls if "16" in r else 20)
                        times[(k, r)].append(_timed(fn, n))
        print(f"\n{dtype}" + (f" (not importable or no {dtype}: {', '.join(missing)})" if missing else ""))
        print(f"| work | " + " | ".join(live) + " |")
        print("|---|" + "---:|" * len(live))
        for r in rows:
            base = statistics.median(times[("tapescope", r)]) if ("tapescope", r) in times else None
            cells = []
            for k in live:
                if (k, r) not in times:
                    cells.append("")
                    continue
                m = statistics.median(times[(k, r)])
                cells.append(f"{m:.3f}" + (f" ({m / base:.2f}x)" if base and k != "tapescope" else ""))
            if r == LLAMA and llama is not None and mlx_own.get("tokens"):
                same = llama[1].get("tokens") == mlx_own["tokens"]
                r = f"{r} ({'same' if same else 'DIFFERENT'} tokens)"
            print(f"| {dtype} {r} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
