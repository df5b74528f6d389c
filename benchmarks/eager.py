"""Eager and small-call speed on the CPU, side by side in one run: tapescope, MLX (CPU), JAX.

Rows (medians of per-call microseconds, the implementations taking turns per repetition):

- ``a + b`` and its eval, 16 float32 elements: tapescope / JAX eager / MLX;
- a 20-op eager chain (ten multiplies, ten adds, each its own op) on 16 and 2^20 elements:
  tapescope / MLX / JAX eager;
- a compiled ``2x + 3y - x*y`` on 16 elements, called and evaluated: tapescope's
  ``mx.compile`` / ``jax.jit`` / MLX's ``mx.compile``;
- decode: microseconds per greedy token of a tiny llama-style model written with ``mlx.nn``
  (2 layers, width 64, 4 heads, RMSNorm, RoPE, ``mx.fast.scaled_dot_product_attention``, a
  KV cache as mlx_lm's: preallocated in steps, written by slice assignment), run by MLX and
  by tapescope through ``tapescope.as_mlx()`` with the same weights (the tokens must match);
- decode with ``mlx_lm`` itself: microseconds per token of ``mlx_lm.generate.generate_step``
  (its greedy sampler, KV cache and async evals) over ``mlx_lm.models.llama`` (2 layers,
  width 64, 4 heads, 2 KV heads, random weights), where mlx_lm is installed;
- an ``mlx.nn`` MLP Adam step (batch 64, 32 -> 64 -> 10, cross entropy), eager and with the
  step compiled as MLX's examples do (``partial(mx.compile, inputs=state, outputs=state)``).

The model rows run each implementation in its own worker process (``mlx.nn`` is bound to
one ``mlx.core`` per process), taking turns. Prints the machine (with its load) and each
row's ratio to its peers.

    .venv/bin/python benchmarks/eager.py [--reps 7] [--calls 2000] [--rounds 3] [--before DIR]
    TAPESCOPE_CUDA=1 python benchmarks/eager.py --only models --device gpu   # beside MLX's CUDA

``--before DIR`` adds a ``before`` implementation to the model rows, taking turns with the
others: a worker whose ``tapescope`` is imported from ``DIR`` (a folder holding a
``tapescope`` package: another tree's ``interactive/`` with its ``kernels/`` and ``viz/``
copied inside, extensions built), so a change is measured against its parent in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _sibling(name: str):
    """Another script of benchmarks/ as a module (one definition of what they share)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def machine() -> str:
    """cpu_fusion.py's machine line, with the load average now."""
    return f"{_sibling('cpu_fusion').machine()}, load {os.getloadavg()[0]:.2f}"


def interleaved(fns: dict, reps: int, calls: int) -> dict:
    """Median over ``reps`` of each function's mean µs per call, the functions taking turns."""
    for fn in fns.values():
        for _ in range(max(20, calls // 20)):
            fn()
    times: dict = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[k].append((time.perf_counter() - t0) * 1e6 / calls)
    return {k: statistics.median(v) for k, v in times.items()}


def fused(mod, x, y):
    return 2 * x + 3 * y - x * y


def micro_rows(reps: int, calls: int) -> list:
    """The in-process rows: (name, {implementation: µs})."""
    import jax
    import jax.numpy as jnp
    import mlx.core as mlx

    import tapescope.core as ts

    jax.config.update("jax_platforms", "cpu")
    rng = np.random.default_rng(0)
    chain20 = _sibling("dispatch").chain20  # ten multiplies and ten adds, each its own op
    rows = []
    a16, b16 = rng.random(16, dtype=np.float32), rng.random(16, dtype=np.float32)
    big_a = rng.random(1 << 20, dtype=np.float32)
    big_b = rng.random(1 << 20, dtype=np.float32)

    ta, tb, ma, mb = ts.array(a16), ts.array(b16), mlx.array(a16), mlx.array(b16)
    ja, jb = jnp.asarray(a16), jnp.asarray(b16)
    rows.append(("a + b, eval (16)", interleaved({
        "tapescope": lambda: ts.eval(ta + tb),
        "jax eager": lambda: (ja + jb).block_until_ready(),
        "mlx": lambda: mlx.eval(ma + mb)}, reps, calls)))
    rows.append(("20-op chain (16)", interleaved({
        "tapescope": lambda: ts.eval(chain20(ts, ta, tb)),
        "mlx": lambda: mlx.eval(chain20(mlx, ma, mb)),
        "jax eager": lambda: chain20(jnp, ja, jb).block_until_ready()}, reps, calls // 10)))
    TA, TB, MA, MB = ts.array(big_a), ts.array(big_b), mlx.array(big_a), mlx.array(big_b)
    JA, JB = jnp.asarray(big_a), jnp.asarray(big_b)
    rows.append(("20-op chain (2^20)", interleaved({
        "tapescope": lambda: ts.eval(chain20(ts, TA, TB)),
        "mlx": lambda: mlx.eval(chain20(mlx, MA, MB)),
        "jax eager": lambda: chain20(jnp, JA, JB).block_until_ready()},
        reps, max(3, calls // 200))))
    tf = ts.compile(partial(fused, ts))
    mf = mlx.compile(partial(fused, mlx))
    jf = jax.jit(partial(fused, jnp))
    rows.append(("compiled call, eval (16)", interleaved({
        "tapescope": lambda: ts.eval(tf(ta, tb)),
        "jax.jit": lambda: jf(ja, jb).block_until_ready(),
        "mlx": lambda: mlx.eval(mf(ma, mb))}, reps, calls)))
    return rows


# -- the model rows, one worker process per implementation ---------------------------------

VOCAB, DIM, LAYERS, HEADS, PROMPT, TOKENS = 256, 64, 2, 4, 8, 48


def _seeded(model, mx, seed: int) -> None:
    """The same weights for every implementation: numpy's, in the parameters' order."""
    from mlx.utils import tree_flatten, tree_unflatten

    rng = np.random.default_rng(seed)
    params = [(k, mx.array((rng.standard_normal(v.shape) * 0.2).astype(np.float32)))
              for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))


def _llama(mx, nn):
    class KVCache:
        """mlx_lm's KVCache: preallocated in steps of 256, written by slice assignment."""

        step = 256

        def __init__(self):
            self.keys = self.values = None
            self.offset = 0

        def update_and_fetch(self, keys, values):
            prev = self.offset
            if self.keys is None or prev + keys.shape[2] > self.keys.shape[2]:
                B, H, _, D = keys.shape
                n = (self.step + keys.shape[2] - 1) // self.step * self.step
                k = mx.zeros((B, H, n, D), keys.dtype)
                v = mx.zeros((B, H, n, D), values.dtype)
                if self.keys is not None:
                    k = mx.concatenate([self.keys[..., :prev, :], k], axis=2)
                    v = mx.concatenate([self.values[..., :prev, :], v], axis=2)
                self.keys, self.values = k, v
            self.offset += keys.shape[2]
            self.keys[..., prev:self.offset, :] = keys
            self.values[..., prev:self.offset, :] = values
            return self.keys[..., :self.offset, :], self.values[..., :self.offset, :]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.hd = DIM // HEADS
            self.q_proj = nn.Linear(DIM, DIM, bias=False)
            self.k_proj = nn.Linear(DIM, DIM, bias=False)
            self.v_proj = nn.Linear(DIM, DIM, bias=False)
            self.o_proj = nn.Linear(DIM, DIM, bias=False)
            self.rope = nn.RoPE(self.hd, traditional=False, base=10000)

        def __call__(self, x, mask, cache):
            B, L, _ = x.shape
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            q = q.reshape(B, L, HEADS, self.hd).transpose(0, 2, 1, 3)
            k = k.reshape(B, L, HEADS, self.hd).transpose(0, 2, 1, 3)
            v = v.reshape(B, L, HEADS, self.hd).transpose(0, 2, 1, 3)
            q, k = self.rope(q, offset=cache.offset), self.rope(k, offset=cache.offset)
            k, v = cache.update_and_fetch(k, v)
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.hd ** -0.5, mask=mask)
            return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, DIM))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attention()
            self.n1, self.n2 = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
            self.gate = nn.Linear(DIM, 2 * DIM, bias=False)
            self.up = nn.Linear(DIM, 2 * DIM, bias=False)
            self.down = nn.Linear(2 * DIM, DIM, bias=False)

        def __call__(self, x, mask, cache):
            x = x + self.attn(self.n1(x), mask, cache)
            h = self.n2(x)
            return x + self.down(nn.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.layers = [Block() for _ in range(LAYERS)]
            self.norm = nn.RMSNorm(DIM)
            self.head = nn.Linear(DIM, VOCAB, bias=False)

        def __call__(self, tokens, caches):
            x = self.embed(tokens)
            mask = "causal" if tokens.shape[1] > 1 else None
            for layer, c in zip(self.layers, caches):
                x = layer(x, mask, c)
            return self.head(self.norm(x))

    return Llama, KVCache


def llama_decoder(mx, nn, dtype: str = "float32", tokens: int = TOKENS):
    """The tiny llama on ``mx``'s default device, its weights seeded (then cast to
    ``dtype``), and ``generate()``: a fresh KV cache, the prompt, then ``tokens - 1`` greedy
    tokens, each evaluated and read (``.item()``) before the next is asked, as a decoding
    loop does; it returns (µs per decoded token, prompt excluded; the tokens). The one
    model of this file's decode row and of ``cuda_eager.py``'s llama row."""
    Llama, KVCache = _llama(mx, nn)
    model = Llama()
    _seeded(model, mx, 1)
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    prompt = mx.array(np.random.default_rng(2).integers(0, VOCAB, (1, PROMPT)).astype(np.int32))

    def generate():
        caches = [KVCache() for _ in range(LAYERS)]
        y = mx.argmax(model(prompt, caches)[:, -1, :], axis=-1)
        mx.eval(y)
        out = [y.item()]
        t0 = time.perf_counter()
        for _ in range(tokens - 1):
            y = mx.argmax(model(y[:, None], caches)[:, -1, :], axis=-1)
            mx.eval(y)
            out.append(y.item())
        return (time.perf_counter() - t0) * 1e6 / (tokens - 1), out

    return model, KVCache, generate


def decode_worker(mx, nn) -> dict:
    """µs per decoded token (prompt excluded) and the greedy tokens."""
    generate = llama_decoder(mx, nn)[2]
    generate()  # warm (kernel builds, caches)
    runs = [generate() for _ in range(5)]
    return {"us": statistics.median(r[0] for r in runs), "tokens": runs[0][1]}


def mlx_lm_worker(mx) -> dict:
    """µs per token of mlx_lm's own generate_step over its llama (prompt excluded) and the
    greedy tokens."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.generate import generate_step
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", hidden_size=DIM, num_hidden_layers=LAYERS,
                           intermediate_size=2 * DIM, num_attention_heads=HEADS,
                           num_key_value_heads=HEADS // 2, rms_norm_eps=1e-5, vocab_size=VOCAB)
    model = llama.Model(args)
    rng = np.random.default_rng(1)
    model.update(tree_unflatten([(k, mx.array((rng.standard_normal(v.shape) * 0.2).astype(np.float32)))
                                 for k, v in tree_flatten(model.parameters())]))
    mx.eval(model.parameters())
    prompt = mx.array(np.random.default_rng(2).integers(0, VOCAB, PROMPT).astype(np.int32))

    def generate():
        out, t0 = [], 0.0
        for i, (tok, _) in enumerate(generate_step(prompt, model, max_tokens=TOKENS)):
            if i == 0:
                t0 = time.perf_counter()
            out.append(int(tok))
        return (time.perf_counter() - t0) * 1e6 / (TOKENS - 1), out

    generate()
    runs = [generate() for _ in range(5)]
    return {"us": statistics.median(r[0] for r in runs), "tokens": runs[0][1]}


def adam_worker(mx, nn, compiled: bool) -> dict:
    """µs per MLP Adam step (batch 64, 32 -> 64 -> 10) and the first step's loss."""
    import mlx.optimizers as optim

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    _seeded(model, mx, 3)
    opt = optim.Adam(learning_rate=1e-2)
    rng = np.random.default_rng(4)
    x = mx.array(rng.standard_normal((64, 32)).astype(np.float32))
    y = mx.array(rng.integers(0, 10, 64).astype(np.int32))

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    grad_fn = nn.value_and_grad(model, loss_fn)

    def step(x, y):
        loss, grads = grad_fn(model, x, y)
        opt.update(model, grads)
        return loss

    state = [model.state, opt.state]
    if compiled:
        step = partial(mx.compile, inputs=state, outputs=state)(step)
    steps = 100
    first = step(x, y)
    mx.eval(state, first)  # the optimizer's state exists from here on
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = step(x, y)
            mx.eval(state)
        runs.append((time.perf_counter() - t0) * 1e6 / steps)
    return {"us": statistics.median(runs), "loss": first.item()}


def worker(task: str, impl: str) -> None:
    if impl == "tapescope":
        import tapescope

        tapescope.as_mlx()
    import mlx.core as mx
    import mlx.nn as nn

    if os.environ.get("EAGER_BENCH_DEVICE") == "gpu":  # --device gpu: MLX's CUDA, tapescope's
        mx.set_default_device(mx.gpu)
    if task == "decode":
        res = decode_worker(mx, nn)
    elif task == "mlx-lm":
        res = mlx_lm_worker(mx)
    else:
        res = adam_worker(mx, nn, compiled=task == "adam-compiled")
    print(json.dumps(res))


def model_rows(rounds: int, before: str = "") -> list:
    rows = []
    import importlib.util

    tasks = [("decode", "llama decode, per token")]
    if importlib.util.find_spec("mlx_lm") is not None:
        tasks.append(("mlx-lm", "mlx_lm llama decode, per token"))
    else:
        print("(mlx_lm is not installed: its row does not run; `.venv/bin/pip install "
              "mlx-lm==0.32.2` adds it)")
    tasks += [("adam", "MLP Adam step, eager"), ("adam-compiled", "MLP Adam step, compiled")]
    for task, name in tasks:
        times: dict = {"tapescope": [], "mlx": []}
        if before:
            times["before"] = []
        check = {}
        for _ in range(rounds):
            for impl in times:
                env = dict(os.environ)
                if impl == "before":
                    env["PYTHONPATH"] = before + os.pathsep + env.get("PYTHONPATH", "")
                out = subprocess.run([sys.executable, __file__, "--worker", task,
                                      "tapescope" if impl == "before" else impl],
                                     capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    raise RuntimeError(f"{task} on {impl} failed:\n{out.stderr[-3000:]}")
                res = json.loads(out.stdout.strip().splitlines()[-1])
                times[impl].append(res["us"])
                check[impl] = res.get("tokens", res.get("loss"))
        decode = task in ("decode", "mlx-lm")
        if before and check["before"] != check["tapescope"] and decode:
            raise RuntimeError(f"{task}: before and after decode different tokens")
        same = check["tapescope"] == check["mlx"] if decode else \
            abs(check["tapescope"] - check["mlx"]) <= 1e-4 * max(1.0, abs(check["mlx"]))
        rows.append((f"{name} ({'same' if same else 'DIFFERENT'} "
                     f"{'tokens' if decode else 'loss'})",
                     {k: statistics.median(v) for k, v in times.items()}))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", nargs=2, metavar=("TASK", "IMPL"))
    ap.add_argument("--only", choices=("micro", "models"))
    ap.add_argument("--before", default="", metavar="DIR")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                    help="the model rows' default device (gpu: MLX's CUDA backend against "
                         "tapescope's, TAPESCOPE_CUDA=1)")
    args = ap.parse_args()
    if args.device == "gpu":
        os.environ["EAGER_BENCH_DEVICE"] = "gpu"  # the workers inherit it
    if args.worker:
        worker(*args.worker)
        return
    import jax
    import mlx.core

    print(f"machine: {machine()}; mlx {mlx.core.__version__}, jax {jax.__version__}")
    rows = []
    if args.only != "models":
        rows += micro_rows(args.reps, args.calls)
    if args.only != "micro":
        rows += model_rows(args.rounds, args.before)
    print(f"{'row':44s} {'tapescope us':>13s} {'peer':>10s} {'peer us':>9s} {'ratio':>7s}")
    for name, res in rows:
        ts_us = res["tapescope"]
        for i, p in enumerate(k for k in res if k != "tapescope"):
            first = i == 0
            print(f"{name if first else '':44s} {f'{ts_us:.2f}' if first else '':>13s} "
                  f"{p:>10s} {res[p]:9.2f} {ts_us / res[p]:6.2f}x")
    print(f"machine after: load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
