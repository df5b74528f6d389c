"""The host side of cuda_eager.py's llama decode row, measured without a GPU: the tiny
llama of ``benchmarks/eager.py`` (``eager.llama_decoder``) through ``tapescope.as_mlx()`` on
the CUDA backend over ``tests/fake_cupy.py``, ``tests/fake_cublas.py`` and
``tests/fake_cuda_driver.py`` (launches run nothing), as ``cuda_host_cost.py`` measures one op.

Per decoded token and dtype: Python function calls (cProfile), launches from C
(cuLaunchKernel) and from Python, the eval loop's dispatch paths, and the nodes that ran
through the Python ``evaluate._run_node`` (the C loop declined them) by primitive; with
``--callgrind`` the instructions per token (run under ``valgrind --tool=callgrind
--instr-atstart=no --collect-atstart=no``).

A token is the decoding loop's: the model over the last token and the KV caches, the
argmax, ``mx.eval`` and ``.item()``. The stand-in launches compute nothing, so the argmax's
buffer holds no token: each step feeds the next token from a fixed list of (1, 1) device
arrays made beforehand (the graph is the decoding loop's, its input a ready array rather
than ``y[:, None]``'s view). The cache grows one position per token, as in the row.

    python benchmarks/cuda_decode_host_cost.py [float32 bfloat16] [--tokens 24] [--callgrind]
        [--python-gemm] [--cpu]

``--cpu``: the same decoding on the CPU (benchmarks/eager.py's CPU row: its recording, the
CPU's eval loop and kernels), still measured through the stand-in driver's hook.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cuda_host_cost import callgrind_totals, host_cost  # noqa: E402  (the stand-in stack first)
import fake_cublas  # noqa: E402
import fake_cuda_driver  # noqa: E402
import numpy as np  # noqa: E402


def python_nodes() -> collections.Counter:
    """A counter of the nodes the eval loop hands to the Python ``evaluate._run_node``, by
    primitive name (the C loop reconfigured with a counting wrapper)."""
    from tapescope.core import evaluate as ev

    seen: collections.Counter = collections.Counter()
    run = ev._run_node

    def counted(node):
        seen[node.primitive.name] += 1
        return run(node)

    ev._run_node = counted
    ev.c_loop = ev._c_loop()  # (its python_run: the wrapper)
    return seen


def decode_step(mx, nn, dtype: str, tokens: int):
    """(one decoded token's call, the model): the model over the next fed token and the
    caches, the argmax, its eval and ``.item()``."""
    import eager

    model, KVCache, _ = eager.llama_decoder(mx, nn, dtype)
    caches = [KVCache() for _ in range(eager.LAYERS)]
    rng = np.random.default_rng(5)
    feed = [mx.array(rng.integers(0, eager.VOCAB, (1, 1)).astype(np.int32)) for _ in range(tokens)]
    prompt = mx.array(rng.integers(0, eager.VOCAB, (1, eager.PROMPT)).astype(np.int32))
    mx.eval(*feed, prompt)
    mx.eval(mx.argmax(model(prompt, caches)[:, -1, :], axis=-1))
    at = [0]

    def step():
        y = mx.argmax(model(feed[at[0]], caches)[:, -1, :], axis=-1)
        at[0] += 1
        mx.eval(y)
        y.item()

    return step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dtypes", nargs="*")
    ap.add_argument("--tokens", type=int, default=24, help="tokens measured (after 4 warm)")
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--profile", type=int, default=0, help="print the top N cProfile rows")
    ap.add_argument("--cpu", action="store_true", help="decode on the CPU (eager.py's row)")
    ap.add_argument("--python-gemm", action="store_true",
                    help="GEMM plans declined by cuda/_driver.c (the Python launch_fused)")
    args = ap.parse_args(argv)
    fake_cublas.compute(False)  # (counted: a GPU's cuBLAS call costs the host no arithmetic)
    import tapescope
    from tapescope.kernels.cuda import _driver

    _driver.use_cublas(not args.python_gemm)

    tapescope.as_mlx()
    import mlx.core as mx
    import mlx.nn as nn

    mx.set_default_device(mx.cpu if args.cpu else mx.gpu)
    seen = python_nodes()
    measured = ctypes.CDLL(None).fake_measured if args.callgrind else None
    names = args.dtypes or ["float32", "bfloat16"]
    n, warm = args.tokens, 4
    for dtype in names:
        step = decode_step(mx, nn, dtype, warm + 1 + n * (2 if args.callgrind else 1))
        for _ in range(warm):
            step()
        seen.clear()
        g_c, g_p = fake_cublas.c_gemms(), fake_cublas.PY_CALLS[0]
        calls, c_l, p_l, paths = host_cost(step, n, 0, measured, args.profile)
        runs = 1 + n * (2 if measured else 1)
        g_c = (fake_cublas.c_gemms() - g_c) / runs
        g_p = (fake_cublas.PY_CALLS[0] - g_p) / runs
        per = {k: round(v / (n + 1), 1) for k, v in sorted(seen.items())}
        nodes = sum(paths.values())
        print(f"{dtype:9s} python calls/token {calls:8.0f}  nodes {nodes}"
              f"  launches/token C {c_l} Python {p_l}  GEMMs/token C {g_c:.1f} Python {g_p:.1f}"
              f"  paths {paths}", flush=True)
        print(f"{'':9s} nodes/token through Python run_node: {per}", flush=True)
    if args.callgrind:
        for (fname, ir), dtype in zip(callgrind_totals(), names):
            print(f"{dtype:9s} instructions/token {ir / n:12.0f}   ({fname})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
