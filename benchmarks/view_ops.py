"""Instructions per call of the view ops' recording (reshape, transpose, ``.T``, expand_dims,
squeeze, swapaxes, moveaxis, astype, basic indexing and the KV cache's write), each called ``--calls`` times on an
array of a decode step's sizes (recorded and freed, nothing evaluated).

Run under ``valgrind --tool=callgrind --instr-atstart=no`` with ``--callgrind``: one dump
per op (its instructions over the calls, the main thread); without it, wall-clock us a call
(min of 5; noisy on a shared machine).

    valgrind --tool=callgrind --instr-atstart=no .venv/bin/python benchmarks/view_ops.py \
        --callgrind [--impl mlx] [op ...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

_C = r"""
#include <valgrind/callgrind.h>
void measure_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void measure_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""


def ops(mx) -> dict:
    x = mx.zeros((1, 1, 128))
    q = mx.zeros((1, 1, 4, 32))
    k = mx.zeros((1, 4, 1, 32))
    w = mx.zeros((256, 128))
    c = mx.zeros((1, 2, 256, 32))
    kv = mx.zeros((1, 2, 1, 32))
    mx.eval(x, q, k, w, c, kv)

    def cache_write():
        c2 = c[...]  # (a new handle: the write rebinds it, not c)
        c2[..., 100:101, :] = kv
    return {
        "reshape": lambda: x.reshape(1, 1, 4, -1),
        "mx.reshape": lambda: mx.reshape(x, (1, 1, 4, 32)),
        "transpose": lambda: q.transpose(0, 2, 1, 3),
        "mx.transpose": lambda: mx.transpose(q, (0, 2, 1, 3)),
        ".T": lambda: w.T,
        "expand_dims": lambda: mx.expand_dims(x, 0),
        "squeeze": lambda: mx.squeeze(k, 2),
        "swapaxes": lambda: mx.swapaxes(q, 1, 2),
        "moveaxis": lambda: mx.moveaxis(q, 2, 1),
        "astype same": lambda: x.astype(mx.float32),
        "astype": lambda: x.astype(mx.float16),
        "x[..., :n, :]": lambda: c[..., :100, :],
        "x[:, -1, :]": lambda: q[:, -1, :],
        "x[..., i:j, :] = v": cache_write,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ops", nargs="*")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--impl", choices=("tapescope", "mlx"), default="tapescope")
    args = ap.parse_args()
    if args.impl == "mlx":
        import mlx.core as mx
    else:
        import tapescope.core as mx
    table = ops(mx)
    names = args.ops or list(table)
    lib = None
    if args.callgrind:
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "m.c"), "w") as f:
            f.write(_C)
        subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", os.path.join(d, "m.so"),
                        os.path.join(d, "m.c")], check=True)
        lib = ctypes.CDLL(os.path.join(d, "m.so"))
    for name in names:
        fn = table[name]
        for _ in range(50):
            fn()
        if lib is not None:
            lib.measure_start()
            for _ in range(args.calls):
                fn()
            lib.measure_stop()
            print(f"{name}: measured {args.calls} calls", file=sys.stderr)
        else:
            best = min(_timed(fn, args.calls) for _ in range(5))
            print(f"{name:16s} {best * 1e6:8.2f} us")


def _timed(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


if __name__ == "__main__":
    main()
