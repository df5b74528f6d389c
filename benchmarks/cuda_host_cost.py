"""The host side of one small GPU call, measured without a GPU: the CUDA backend over
``tests/fake_cupy.py`` with ``tests/fake_cuda_driver.py`` (kernels that load without NVRTC,
a stand-in libcuda whose launches run nothing), so each call costs exactly its host work:
recording, the eval loop, plans, the C launch or the rules' Python launches, the wait.

Per op (4096 x 128 float32 unless ``--shape``; the ops of ``.mlxcuda/redprof.py`` and the
extended-fusion rows of ``benchmarks/reductions.py``): Python function calls per call
(cProfile), launches per call from C (cuLaunchKernel) and from Python, the eval loop's
dispatch paths, and with ``--callgrind`` the instructions per call (run it under
``valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no``: the stand-in
driver's ``fake_measured`` instruments and dumps ``--calls`` calls of each op alone, one
file each; ``callgrind_totals`` below reads them).

    TAPESCOPE_CUDA=1 python benchmarks/cuda_host_cost.py [ops...] [--calls 200] [--callgrind]
        [--no-plan] [--keys 256] [--device cpu]
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import glob
import os
import pstats
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def stand_in_stack() -> None:
    """The CUDA backend on, over the stand-in stack: ``tests/fake_cupy.py``,
    ``tests/fake_cublas.py`` (the GEMMs, from Python and from C: its libcublas) and
    ``tests/fake_cuda_driver.py`` (its libcuda), installed before tapescope is imported
    (this module's import does it; cuda_step_host_cost.py and cuda_decode_host_cost.py
    import it first)."""
    os.environ["TAPESCOPE_CUDA"] = "1"
    os.environ.pop("TAPESCOPE_DISABLE_GPU", None)
    tests = os.path.join(HERE, "..", "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import fake_cublas
    import fake_cuda_driver
    import fake_cupy

    fake_cupy.install()
    fake_cublas.install()  # (qmm_prefill's GEMM computed on the host: its shape is small)
    fake_cuda_driver.install()


stand_in_stack()

import fake_cuda_driver  # noqa: E402
import numpy as np  # noqa: E402


def ops(mx, x, y, t, qkv=None, qw=None, qg=None):
    def softmax(v):
        e = mx.exp(v - mx.max(v, axis=-1, keepdims=True))
        return e / mx.sum(e, axis=-1, keepdims=True)

    def xent(v, w):
        m = mx.max(v, axis=-1, keepdims=True)
        lse = mx.log(mx.sum(mx.exp(v - m), axis=-1, keepdims=True)) + m
        return mx.sum(w * (lse - v), axis=-1)

    sm, xe = mx.compile(softmax), mx.compile(xent)
    return {
        "add16": lambda: y + y,
        "mul_scalar16": lambda: y * 0.5,
        "sum_last": lambda: mx.sum(x, axis=-1),
        "sum_last_keep": lambda: mx.sum(x, axis=-1, keepdims=True),
        "max_last": lambda: mx.max(x, axis=-1),
        "argmax_last": lambda: mx.argmax(x, axis=-1),
        "argmax_all": lambda: mx.argmax(x),
        "mean_last": lambda: mx.mean(x, axis=-1),
        "sum_first": lambda: mx.sum(x, axis=0),
        "sum_all": lambda: mx.sum(x),
        "logsumexp": lambda: mx.logsumexp(x, axis=-1),
        "softmax": lambda: mx.softmax(x, axis=-1),
        "softmax_written": lambda: sm(x),
        "xent_written": lambda: xe(x, t),
        # decoding attention, fast_ops.py's (4, 16, 1, 4096, 128) row with 256 keys (--keys:
        # the host's work depends on the cache's length only through one launch or two)
        "sdpa_decode": lambda: mx.fast.scaled_dot_product_attention(*qkv, scale=128 ** -0.5),
        # decoding's quantized product, fast_ops.py's 1-row qmm row (4-bit, group size 64)
        "qmv_decode": lambda: mx.quantized_matmul(*qw[:4], transpose=True, group_size=64, bits=4),
        # more rows (the qmm plan: the dequant kernel and one GEMM), 16 x 256 by 256 x 256
        "qmm_prefill": lambda: mx.quantized_matmul(*qw[4:], transpose=True, group_size=64, bits=4),
        # a mixture of experts' decoding step (mlx_lm's SwitchGLU): one token's x against its
        # top-2 of 8 experts' 4-bit (512 x 4096) weights, lhs the op's default
        "gather_qmv_decode": lambda: mx.gather_qmm(*qg[:4], rhs_indices=qg[4], transpose=True,
                                                   group_size=64, bits=4),
    }


def host_cost(call, n: int, warm: int, measured=None, profile: int = 0) -> tuple:
    """``call()``'s host side over the stand-in stack: run ``warm`` times, once more counting
    the eval loop's dispatch paths and the launches from C (cuLaunchKernel) and from Python,
    then ``n`` times under cProfile (its top ``profile`` rows printed) and, with
    ``measured`` (the stand-in driver's ``fake_measured``), ``n`` times under callgrind's
    instrumentation. (Python calls per call, C launches, Python launches, paths.)"""
    from tapescope.core import evaluate as ev

    for _ in range(warm):
        call()
    ev.reset_dispatch_counts()
    c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
    call()
    paths = {k: v for k, v in ev.dispatch_counts().items() if v}
    c_l, p_l = fake_cuda_driver.launches() - c0, fake_cuda_driver.PY_LAUNCHES[0] - p0
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        call()
    pr.disable()
    st = pstats.Stats(pr)
    if profile:
        st.sort_stats("tottime").print_stats(profile)
    if measured is not None:
        def body():
            for _ in range(n):
                call()

        measured(ctypes.CFUNCTYPE(None)(body))
    return st.total_calls / n, c_l, p_l, paths


def callgrind_totals(pattern: str = "callgrind.out.*") -> list:
    """(dump file, instructions) of each callgrind dump, in order."""
    out = []
    for f in sorted(glob.glob(pattern), key=lambda p: (len(p), p)):
        with open(f) as fh:
            text = fh.read()
        m = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
        if m:
            out.append((f, int(m.group(1))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ops", nargs="*")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--shape", default="4096,128")
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                    help="the default device the ops run on (cpu: the same recording and the"
                         " CPU's eval loop, still measured through the stand-in driver's hook)")
    ap.add_argument("--no-plan", action="store_true",
                    help="decoding attention and quantized_matmul without their plans: the "
                    "rules' Python launches each call")
    ap.add_argument("--keys", type=int, default=256,
                    help="decoding attention's cached keys (past 1024: the split keys' two launches)")
    ap.add_argument("--profile", type=int, default=0, help="print the top N cProfile rows")
    args = ap.parse_args(argv)
    import tapescope
    import tapescope.core as mx

    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    rows, cols = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = mx.add(mx.array(rng.standard_normal((rows, cols)).astype(np.float32)), 0)
    t = mx.add(mx.array(np.full((rows, cols), 1.0 / cols, np.float32)), 0)
    y = mx.add(mx.array(rng.standard_normal(16).astype(np.float32)), 0)
    mx.eval(x, y, t)
    qkv = [mx.add(mx.array(rng.standard_normal(s).astype(np.float32)), 0)
           for s in ((4, 16, 1, 128), (4, 16, args.keys, 128), (4, 16, args.keys, 128))]
    mx.eval(*qkv)
    qw = [mx.add(mx.array(rng.standard_normal((1, 4096)).astype(np.float32)), 0),
          mx.array(np.zeros((4096, 512), np.uint32))] + [
        mx.add(mx.array(rng.standard_normal((4096, 64)).astype(np.float32)), 0) for _ in "sb"]
    qw += [mx.add(mx.array(rng.standard_normal((16, 256)).astype(np.float32)), 0),
           mx.array(np.zeros((256, 32), np.uint32))] + [
        mx.add(mx.array(rng.standard_normal((256, 4)).astype(np.float32)), 0) for _ in "sb"]
    mx.eval(*qw)
    qg = [mx.add(mx.array(rng.standard_normal((1, 1, 1, 1, 4096)).astype(np.float32)), 0),
          mx.array(np.zeros((8, 512, 512), np.uint32))] + [
        mx.add(mx.array(rng.standard_normal((8, 512, 64)).astype(np.float32)), 0) for _ in "sb"]
    qg.append(mx.array(np.array([[[3, 5]]], np.uint32)))
    mx.eval(*qg)
    if args.no_plan:  # no plan kept: the rules plan and launch from Python each call
        from tapescope.kernels.cuda import attention, quantized

        rule = attention.RULES["ScaledDotProductAttention"]
        rule.plan = lambda *a, **k: None

        def python_launch(xp, *ins, out=None, **kw):
            p = attention.vector_plan(*ins, **kw)
            res = attention._empty(p.out_shape, p.out_dtype)
            p(*ins, res)
            return res

        rule.slow = python_launch
        quantized.RULES["QuantizedMatmul"].plan = lambda *a, **k: None
        quantized.RULES["GatherQMM"].plan = lambda *a, **k: None  # (the composition runs)
        import cupy  # (the rule's RawKernels: stand-in kernels, counted as Python launches)

        cupy.RawKernel = lambda source, name: fake_cuda_driver.FakeFunction(name)
    tapescope.set_fusion("extended")
    fns = ops(mx, x, y, t, qkv, qw, qg)
    names = args.ops or list(fns)
    measured = ctypes.CDLL(None).fake_measured if args.callgrind else None
    n = args.calls
    for op in names:
        f = fns[op]
        calls, c_l, p_l, paths = host_cost(lambda: mx.eval(f()), n, 20, measured, args.profile)
        print(f"{op:16s} python calls/call {calls:7.1f}  launches/call C {c_l}"
              f" Python {p_l}  paths {paths}", flush=True)
    if args.callgrind:
        for (fname, ir), op in zip(callgrind_totals(), names):
            print(f"{op:16s} instructions/call {ir / n:10.0f}   ({fname})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
