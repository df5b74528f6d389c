"""Where an eager GPU op spends its host time: cProfile (by own time) of `a + b` and its eval
(16 floats) and the 50-op chain of cuda_eager.py on 16 floats, after the microseconds per
call. `--fake` runs it over tests/fake_cupy.py (the Python side alone, no GPU needed).

    TAPESCOPE_CUDA=1 python benchmarks/cuda_eager_profile.py [--fake]
"""
import cProfile
import os
import pstats
import sys
import time

os.environ.setdefault("TAPESCOPE_CUDA", "1")
if "--fake" in sys.argv:
    sys.path.insert(0, "tests")
    import fake_cupy

    fake_cupy.install()
import numpy as np
import tapescope.core as mx
mx.set_default_device(mx.gpu)
a = mx.array(np.arange(16, dtype=np.float32)); b = mx.array(np.ones(16, np.float32)); mx.eval(a, b)
def add(): mx.eval(a + b)
def chain():
    v = a
    for _ in range(25): v = v * 1.0001 + 0.5
    mx.eval(v)
for f, n in ((add, 3000), (chain, 100)):
    for _ in range(50): f()
    t0 = time.perf_counter()
    for _ in range(n): f()
    print(f.__name__, "us/call", (time.perf_counter() - t0) / n * 1e6)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(n): f()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)
