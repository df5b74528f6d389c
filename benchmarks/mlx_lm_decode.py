"""``mlx_lm`` greedy decoding on the CPU: tapescope (through ``tapescope.as_mlx()``) against
MLX itself, in one process, the two taking turns.

The program is mlx_lm's own: ``mlx_lm.generate.generate_step`` (its greedy sampler, its
``KVCache``, its async evals) over ``mlx_lm.models.<arch>.Model`` built from a small config
with random weights (numpy's, the same for both; no network). Two stacks live in the
process: MLX's ``mlx.nn`` / ``mlx_lm`` imported first over the real ``mlx.core``, then
removed from ``sys.modules`` (the objects stay alive, bound to the real MLX) and imported
again after ``tapescope.as_mlx()``, so they bind ``tapescope.core``.

Rows: decode tokens / s (the prompt's forward pass and the first token excluded) and the
prompt's time, medians over ``--reps`` runs of each implementation in turns, and the median
of each turn's MLX / tapescope ratio; the greedy tokens of the two must be equal.
``--callgrind ARCH`` (under ``valgrind --tool=callgrind --instr-atstart=no
--separate-threads=yes``) counts the instructions of ``--measured`` decode steps of
tapescope alone, every thread: the main thread's recording, the stream worker's eval. ``--quantize`` adds a row of the llama with its linear
layers quantized by ``mlx.nn.quantize`` (4-bit, groups of 32).

    .venv/bin/python benchmarks/mlx_lm_decode.py [--reps 5] [--prompt 32] [--tokens 64]
        [--arch llama qwen2] [--quantize]
    .venv/bin/python benchmarks/mlx_lm_decode.py --profile llama   # cProfile of tapescope's decode
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# Small configs in the shape of the real ones (grouped-query heads, SwiGLU, RMSNorm, RoPE).
CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=128, num_hidden_layers=4,
                  intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                  rms_norm_eps=1e-5, vocab_size=512, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", hidden_size=128, num_hidden_layers=4,
                  intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                  rms_norm_eps=1e-6, vocab_size=512, tie_word_embeddings=True),
    # a mixture of experts: mlx_lm's SwitchGLU (gather_mm; gather_qmm quantized), 2 of 4
    "mixtral": dict(model_type="mixtral", hidden_size=128, num_hidden_layers=4,
                    intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                    num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
                    vocab_size=512),
    "gemma": dict(model_type="gemma", hidden_size=128, num_hidden_layers=4,
                  intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, rms_norm_eps=1e-6, vocab_size=512),
}


def machine() -> str:
    import platform

    cpu = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, load {' '.join(load)}"


def _stack_names() -> list:
    return [n for n in sys.modules
            if (n == "mlx_lm" or n.startswith("mlx_lm.")
                or (n.startswith("mlx.") and not n.startswith("mlx.core")))]


def load_stacks(archs, with_mlx: bool = True) -> dict:
    """{"mlx": (mx, nn, utils, generate, {arch: module}), "tapescope": (...)}: MLX's stack,
    then the same packages imported afresh over ``tapescope.as_mlx()``."""
    stacks = {}

    def grab():
        mx = importlib.import_module("mlx.core")
        nn = importlib.import_module("mlx.nn")
        utils = importlib.import_module("mlx.utils")
        gen = importlib.import_module("mlx_lm.generate")
        models = {a: importlib.import_module(f"mlx_lm.models.{a}") for a in archs}
        return mx, nn, utils, gen, models

    if with_mlx:
        stacks["mlx"] = grab()
        mx = stacks["mlx"][0]
        mx.set_default_device(mx.cpu)
    import mlx

    pkg = sys.modules["mlx"]
    for n in _stack_names():  # MLX's objects keep their modules; the names go
        del sys.modules[n]
        parent, _, child = n.rpartition(".")
        if parent == "mlx":
            pkg.__dict__.pop(child, None)
    import tapescope

    tapescope.as_mlx()
    stacks["tapescope"] = grab()
    assert stacks["tapescope"][0].__name__.startswith("tapescope"), stacks["tapescope"][0]
    assert not with_mlx or stacks["mlx"][1] is not stacks["tapescope"][1]
    return stacks


def build(stack, arch: str, quantize: bool = False):
    mx, nn, utils, _, models = stack
    mod = models[arch]
    model = mod.Model(mod.ModelArgs.from_dict(CONFIGS[arch]))
    rng = np.random.default_rng(1)
    params = [(k, mx.array((rng.standard_normal(v.shape) * 0.08).astype(np.float32)))
              for k, v in utils.tree_flatten(model.parameters())]
    model.update(utils.tree_unflatten(params))
    if quantize:
        nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def generate(stack, model, prompt_np, tokens: int):
    """(prompt seconds, decode tokens / s, the tokens) of one greedy generate_step run."""
    mx, gen = stack[0], stack[3]
    prompt = mx.array(prompt_np)
    out = []
    t0 = time.perf_counter()
    t1 = t0
    for i, (tok, _) in enumerate(gen.generate_step(prompt, model, max_tokens=tokens)):
        if i == 0:
            t1 = time.perf_counter()
        out.append(int(tok))
    t2 = time.perf_counter()
    return t1 - t0, (len(out) - 1) / (t2 - t1), out


def run_rows(stacks, rows, reps: int, prompt_len: int, tokens: int) -> list:
    results = []
    prompt_np = np.random.default_rng(2).integers(0, 512, prompt_len).astype(np.int32)
    for arch, quant in rows:
        models = {k: build(s, arch, quant) for k, s in stacks.items()}
        for k in stacks:  # warm: kernel builds, caches
            generate(stacks[k], models[k], prompt_np, tokens)
        times = {k: [] for k in stacks}
        prompts = {k: [] for k in stacks}
        toks = {}
        for _ in range(reps):
            for k in stacks:
                p, tps, out = generate(stacks[k], models[k], prompt_np, tokens)
                times[k].append(tps)
                prompts[k].append(p)
                toks[k] = out
        same = toks["mlx"] == toks["tapescope"]
        name = f"{arch}{' 4-bit' if quant else ''}"
        # each repetition's MLX / tapescope ratio (the two ran back to back): steadier than
        # the ratio of medians while the machine's load moves
        ratio = statistics.median(m / t for m, t in zip(times["mlx"], times["tapescope"]))
        results.append((name, same, {k: statistics.median(v) for k, v in times.items()},
                        {k: statistics.median(v) for k, v in prompts.items()}, ratio))
    return results


def profile(stacks, arch: str, quant: bool, prompt_len: int, tokens: int) -> None:
    import cProfile
    import pstats

    prompt_np = np.random.default_rng(2).integers(0, 512, prompt_len).astype(np.int32)
    s = stacks["tapescope"]
    model = build(s, arch, quant)
    generate(s, model, prompt_np, tokens)
    from tapescope.kernels import stream_workers

    wpr = cProfile.Profile()  # the stream worker's thread (async_eval's work), its own profile
    enqueue = stream_workers.StreamWorker.enqueue

    def profiled(self, task):
        def run():
            wpr.enable()
            try:
                task()
            finally:
                wpr.disable()
        enqueue(self, run)

    stream_workers.StreamWorker.enqueue = profiled
    pr = cProfile.Profile()
    pr.enable()
    generate(s, model, prompt_np, tokens)
    pr.disable()
    stream_workers.StreamWorker.enqueue = enqueue
    for name, p in (("main thread", pr), ("stream worker", wpr)):
        st = pstats.Stats(p)
        print(f"== {name}: Python calls {st.total_calls} ({st.total_calls / tokens:.0f} a token)")
        st.sort_stats("tottime").print_stats(30)
        st.sort_stats("cumulative").print_stats(30)


_CALLGRIND_C = r"""
#include <valgrind/callgrind.h>
void measure_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void measure_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""


def callgrind(stacks, arch: str, quant: bool, prompt_len: int, tokens: int, measured: int,
              impl: str = "tapescope", prompt_phase: bool = False) -> None:
    """Under ``valgrind --tool=callgrind --instr-atstart=no``: instructions of ``measured``
    decode steps of ``impl`` (after ``tokens - measured`` warm ones, every thread), or
    (``prompt_phase``) of the prompt's forward pass and first token, after a warm run."""
    import ctypes
    import subprocess
    import tempfile

    d = tempfile.mkdtemp()
    with open(os.path.join(d, "m.c"), "w") as f:
        f.write(_CALLGRIND_C)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", os.path.join(d, "m.so"),
                    os.path.join(d, "m.c")], check=True)
    lib = ctypes.CDLL(os.path.join(d, "m.so"))
    prompt_np = np.random.default_rng(2).integers(0, 512, prompt_len).astype(np.int32)
    s = stacks[impl]
    model = build(s, arch, quant)
    generate(s, model, prompt_np, tokens)
    mx, gen = s[0], s[3]
    if prompt_phase:  # the prompt's forward pass and its first token
        lib.measure_start()
        for tok, _ in gen.generate_step(mx.array(prompt_np), model, max_tokens=1):
            int(tok)
        lib.measure_stop()
        print(f"callgrind: the {prompt_len}-token prompt measured")
        return
    start = tokens - measured
    for i, (tok, _) in enumerate(gen.generate_step(mx.array(prompt_np), model, max_tokens=tokens)):
        if i == start:
            lib.measure_start()
        int(tok)
    lib.measure_stop()
    print(f"callgrind: {measured} decode steps measured (see the callgrind.out file's totals)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--arch", nargs="+", default=["llama", "qwen2"], choices=sorted(CONFIGS))
    ap.add_argument("--quantize", action="store_true")
    ap.add_argument("--profile", metavar="ARCH", choices=sorted(CONFIGS))
    ap.add_argument("--callgrind", metavar="ARCH", choices=sorted(CONFIGS),
                    help="run under valgrind --tool=callgrind --instr-atstart=no: the "
                         "instructions of --measured decode steps (every thread)")
    ap.add_argument("--measured", type=int, default=16)
    ap.add_argument("--impl", choices=("tapescope", "mlx"), default="tapescope",
                    help="--callgrind's implementation")
    ap.add_argument("--prompt-phase", action="store_true",
                    help="--callgrind measures the prompt's forward pass instead of decoding")
    args = ap.parse_args()
    extra = {a for a in (args.profile, args.callgrind) if a}
    archs = sorted(set(args.arch) | extra)
    if args.callgrind:  # valgrind lowers the open-files limit that mlx_lm.utils raises
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit = lambda *a: None
    stacks = load_stacks(archs, with_mlx=not args.callgrind or args.impl == "mlx")
    import mlx_lm

    print(f"machine: {machine()}; mlx {importlib.metadata.version('mlx')}, "
          f"mlx-lm {mlx_lm.__version__}")
    if args.callgrind:
        callgrind(stacks, args.callgrind, args.quantize, args.prompt, args.tokens, args.measured,
                  args.impl, args.prompt_phase)
        return
    if args.profile:
        profile(stacks, args.profile, args.quantize, args.prompt, args.tokens)
        return
    rows = [(a, False) for a in args.arch] + ([("llama", True)] if args.quantize else [])
    res = run_rows(stacks, rows, args.reps, args.prompt, args.tokens)
    print(f"{args.prompt}-token prompt, {args.tokens} tokens greedy, medians of {args.reps}")
    print(f"{'model':14s} {'tapescope tok/s':>16s} {'mlx tok/s':>10s} {'mlx / ts':>9s} "
          f"{'ts prompt ms':>13s} {'mlx prompt ms':>14s}  tokens")
    for name, same, tps, pr, ratio in res:  # mlx / ts: the median of the per-turn ratios
        print(f"{name:14s} {tps['tapescope']:16.1f} {tps['mlx']:10.1f} "
              f"{ratio:8.2f}x {pr['tapescope'] * 1e3:13.2f} "
              f"{pr['mlx'] * 1e3:14.2f}  {'same' if same else 'DIFFERENT'}")
    with open("/proc/loadavg") as f:
        print(f"load after: {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
