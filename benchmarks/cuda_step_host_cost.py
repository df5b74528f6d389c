"""The host side of cuda_eager.py's MLP Adam step (eager, or ``--compiled``: the step under
``mx.compile``), measured without a GPU: the CUDA
backend over ``tests/fake_cupy.py``, ``tests/fake_cublas.py`` and ``tests/fake_cuda_driver.py`` (launches run nothing),
as ``cuda_host_cost.py`` measures one op. Per step and dtype: Python function calls
(cProfile), launches from C (cuLaunchKernel) and from Python, the eval loop's dispatch paths
(per node), and with ``--callgrind`` the instructions per step (run under ``valgrind
--tool=callgrind --instr-atstart=no --collect-atstart=no``; the stand-in cuBLAS then
computes nothing: its float64 GEMMs are no host cost).

    python benchmarks/cuda_step_host_cost.py [float32 bfloat16] [--steps 5] [--compiled]
        [--callgrind] [--python-gemm] [--cpu]

``--cpu``: benchmarks/eager.py's CPU row instead (its 32 -> 64 -> 10 MLP, batch 64, on the
CPU: the same recording and backward walk, the CPU's eval loop and BLAS), still measured
through the stand-in driver's ``fake_measured``.

GEMMs per step are counted by path: launched from C (the stand-in libcublas's calls) and
through CuPy's Python binding (``fake_cublas.PY_CALLS``); ``--python-gemm`` declines the C
launch (``_driver.use_cublas(False)``), the path before it, for before/after in one tree.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cuda_host_cost import callgrind_totals, host_cost  # noqa: E402  (the stand-in stack first)
import fake_cublas  # noqa: E402
import fake_cupy  # noqa: E402
import fake_cuda_driver  # noqa: E402


def host_waits(call, n: int) -> tuple:
    """Per ``call()``: the device-to-host reads (CuPy's ``get``: a host synchronisation each,
    a bounds word read back among them) and the host's waits on a stream (the timeline's
    host ``event_wait`` records, the eval's own among them, and the stand-in's stream or
    device synchronisations)."""
    from tapescope.kernels import timeline

    reads = [0]
    real = fake_cupy.ndarray.get

    def get(self, *a, **k):
        reads[0] += 1
        return real(self, *a, **k)

    fake_cupy.ndarray.get = get
    s0 = fake_cupy._SYNCS[0]
    try:
        with timeline.record() as rec:
            for _ in range(n):
                call()
    finally:
        fake_cupy.ndarray.get = real
    waits = sum(1 for r in rec.records if r.kind == "event_wait"
                and not (r.detail or {}).get("device_wait"))
    return reads[0] / n, (waits + fake_cupy._SYNCS[0] - s0) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dtypes", nargs="*")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--compiled", action="store_true", help="the step under mx.compile")
    ap.add_argument("--profile", type=int, default=0, help="print the top N cProfile rows")
    ap.add_argument("--compute-gemm", action="store_true",
                    help="the stand-in cuBLAS computes its GEMMs on the host (by default it "
                    "only counts them: a GPU's cuBLAS call costs the host no arithmetic)")
    ap.add_argument("--cpu", action="store_true",
                    help="eager.py's CPU MLP row (32 -> 64 -> 10, batch 64) on the CPU")
    ap.add_argument("--python-gemm", action="store_true",
                    help="GEMM plans declined by cuda/_driver.c (_driver.use_cublas(False)): "
                    "launched through launch_fused's Python, as before the C launch")
    args = ap.parse_args(argv)
    fake_cublas.compute(args.compute_gemm)
    import cuda_eager as ce
    import tapescope

    tapescope.as_mlx()
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from tapescope.kernels.cuda import _driver

    _driver.use_cublas(not args.python_gemm)
    measured = ctypes.CDLL(None).fake_measured if args.callgrind else None
    names = args.dtypes or ["float32", "bfloat16"]
    n = args.steps
    for dtype in names:
        fns = (ce.mlp_steps(mx, nn, optim, dtype, args.batch, mx.cpu, (32, 64, 10)) if args.cpu
               else ce.mlp_steps(mx, nn, optim, dtype, args.batch))
        mode = "compiled" if args.compiled else "eager"
        f = next(v for k, v in fns.items() if mode in k)
        for _ in range(3):  # (warm: the first calls plan; host_cost's own warm-up none)
            f()
        g_c, g_p = fake_cublas.c_gemms(), fake_cublas.PY_CALLS[0]
        calls, c_l, p_l, paths = host_cost(f, n, 0, measured, args.profile)
        runs = 1 + n * (2 if measured else 1)  # (host_cost's counted call, then n, n more)
        g_c = (fake_cublas.c_gemms() - g_c) / runs
        g_p = (fake_cublas.PY_CALLS[0] - g_p) / runs
        nodes = sum(paths.values())
        print(f"{dtype:9s} {mode:8s} python calls/step {calls:8.0f}  nodes {nodes}"
              f"  calls/node {calls / max(nodes, 1):6.1f}"
              f"  launches/step C {c_l} Python {p_l}  GEMMs/step C {g_c:.0f} Python {g_p:.0f}"
              f"  paths {paths}", flush=True)
        reads, waits = host_waits(f, n)
        print(f"{dtype:9s} {mode:8s} host waits/step {waits:4.1f}  device-to-host reads/step "
              f"{reads:4.1f}", flush=True)
    if args.callgrind:
        for (fname, ir), dtype in zip(callgrind_totals(), names):
            print(f"{dtype:9s} instructions/step {ir / n:12.0f}   ({fname})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
