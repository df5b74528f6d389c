"""Host cost of one CUDA sdpa prefill call's rule (kernels/cuda/attention.py) over the
stand-in CuPy / cuBLAS (tests/fake_cupy.py, tests/fake_cublas.py), the GEMMs and the softmax
launch made no-ops (their Python call sites kept): the rule's Python per call and the
launches it makes, no GPU needed.

    TAPESCOPE_CUDA=1 .venv/bin/python benchmarks/sdpa_prefill_host.py
"""
import statistics
import sys
import time
import os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import fake_cupy; fake_cupy.install()
import fake_cublas; fake_cublas.install()
import numpy as np
import cupy
calls = {"gemm": 0, "softmax": 0}
def noop_gemm(*a):
    calls["gemm"] += 1
sys.modules["cupy_backends.cuda.libs.cublas"].gemmStridedBatchedEx = noop_gemm
from tapescope.kernels.cuda import attention, compiled, gemm
gemm._cublas = sys.modules["cupy_backends.cuda.libs.cublas"]
class E:
    hits = 0
    def fn(self, g, b, a): calls["softmax"] += 1
e = E()
real = compiled.get_kernel
compiled.get_kernel = lambda name, *a, **k: e if name.startswith("sdpa_softmax_") else real(name, *a, **k)
for shape in [(4, 16, 2048, 2048, 64), (4, 16, 8192, 8192, 128), (4, 32, 2048, 2048, 128, 8)]:
    B, H, L, kL, D = shape[:5]
    Hk = shape[5] if len(shape) > 5 else H
    q = cupy.empty((B, H, L, D), np.float32); k = cupy.empty((B, Hk, kL, D), np.float32); v = cupy.empty((B, Hk, kL, D), np.float32)
    kw = dict(scale=D ** -0.5, causal=False, has_mask=False, has_sinks=False)
    attention.rule(cupy, q, k, v, **kw)
    ts = []
    for _ in range(200):
        calls.update(gemm=0, softmax=0)
        t0 = time.perf_counter(); attention.rule(cupy, q, k, v, **kw); ts.append(time.perf_counter() - t0)
    print(shape, f"rule host {statistics.median(ts)*1e6:.1f} us (min {min(ts)*1e6:.1f})", calls)
print("load average: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
