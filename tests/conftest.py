"""Shared test helpers: the MLX reference (when installed) and dtype tables."""

from __future__ import annotations

import os
import shutil

import pytest

# graphviz's dot program (the GPU machine has none: pictures fall back to their DOT text)
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz dot is not installed")

# JAX takes 75% of a GPU's memory when it starts; several test processes (pytest-xdist
# workers on the GPU machine) would each try to. Allocate on demand instead.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# JAX references in full float32: on a GPU, JAX's default matmul precision is TF32 (a 1e-4
# relative error), which a test comparing against it at 1e-5 would take for ours
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

try:  # MLX itself, as the reference for exact semantics; tests using it skip when absent
    import mlx.core as mlx_ref  # type: ignore
except Exception:  # pragma: no cover
    mlx_ref = None

requires_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")


@pytest.fixture
def mlx():
    if mlx_ref is None:
        pytest.skip("mlx is not installed")
    return mlx_ref


# Hypothesis: a fixed sequence of examples by default, so a run (CI's included) is
# reproducible; TAPESCOPE_HYPOTHESIS_RANDOM=1 explores new examples instead.
import os as _os  # noqa: E402

from hypothesis import settings as _settings  # noqa: E402

_settings.register_profile("tapescope", derandomize=not _os.environ.get("TAPESCOPE_HYPOTHESIS_RANDOM"),
                           deadline=None)
_settings.load_profile("tapescope")


@pytest.fixture
def young_heap():
    """``gc.collect()`` in the test walks only the objects made since it started: the
    process's older ones (imports, JAX's and other tests' caches: a million objects late in a
    full run, where one collection took 1.4 s instead of 0.08 s) are collected first, then
    frozen (``gc.freeze``) until the test ends. Cycles the test makes are collected as ever."""
    import gc

    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture
def gpu_default_device():
    """The GPU as the default device for a test (the CUDA runtime's tests), restored after;
    the test's GPU work is finished before the device goes back."""
    import tapescope.core as mx

    old = mx.default_device()
    mx.set_default_device(mx.gpu)
    try:
        yield
        mx.synchronize()
    finally:
        mx.set_default_device(old)


def registered_as_gpu(be):
    """A generator for a fixture: ``be`` is the GPU backend while the test runs, and the
    one before it (or none) comes back after the test's GPU work has finished."""
    import tapescope.core as mx
    from tapescope.kernels import backends

    old = backends.register(be)
    try:
        yield be
    finally:
        mx.synchronize()
        if old is None:
            backends.unregister("gpu")
        else:
            backends.register(old)


class kernel_launches:
    """Records the timeline while the block runs: ``primitives``, those a generated kernel
    ran (of ``runtime``, any when None), and ``fallbacks``, the details of the ones that
    ran their array-module rule instead."""

    def __init__(self, runtime=None):
        self.runtime = runtime

    def __enter__(self):
        from tapescope.kernels import timeline

        timeline.set_recording(True)
        self.seq = timeline.next_seq()
        return self

    def __exit__(self, *exc):
        from tapescope.kernels import timeline

        recs = timeline.records_since(self.seq)
        timeline.set_recording(False)
        self.primitives = {r.detail.get("primitive") for r in recs if r.kind == "kernel_launch"
                           and self.runtime in (None, r.detail.get("runtime"))}
        self.fallbacks = [r.detail for r in recs if r.kind == "kernel_fallback"]
        return False


def float64_stream(*dtype_names: str):
    """A context for a test's ops: the default stream, or the CPU's where one of
    ``dtype_names`` is float64 and the default device is a GPU (MLX refuses float64 on a GPU
    stream: mlx/array.cpp), so the GPU-default runs of the op suites keep their float64 cases."""
    import contextlib

    import tapescope.core as mx

    if "float64" in dtype_names and mx.default_device() == mx.gpu:
        return mx.stream(mx.cpu)
    return contextlib.nullcontext()


def _cuda_runtime() -> bool:
    from tapescope.kernels import backends

    return os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0


needs_cuda = pytest.mark.skipif(not _cuda_runtime(),
                                reason="the CUDA runtime needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")


# `make test` runs a representative sample of the heaviest sweeps (every mode, dtype and code
# path at least once, sizes around thresholds kept); TAPESCOPE_FULL_SWEEP=1 (`make test-fuzz`)
# runs all of them and the full hypothesis example counts.
FULL_SWEEP = _os.environ.get("TAPESCOPE_FULL_SWEEP") == "1"


def sweep(full, sample):
    """``full`` under TAPESCOPE_FULL_SWEEP=1, else ``sample`` (a subset of it, or a smaller
    example count)."""
    return full if FULL_SWEEP else sample


def with_and_without_c_call(workload: str) -> list:
    """The last stdout line of ``workload`` (a Python program printing one JSON object) run
    in a fresh process with core/_call.c's paths on (``TAPESCOPE_C_CALL=1``), then off:
    the two decoded objects, for tests that the C loop and its Python reference agree."""
    import json
    import subprocess
    import sys

    runs = []
    for c_call in ("1", "0"):
        env = dict(os.environ, TAPESCOPE_C_CALL=c_call)
        out = subprocess.run([sys.executable, "-c", workload], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


def stand_in_result(code: str, timeout: int = 300) -> dict:
    """The JSON a script printed after ``RESULT``, run in a fresh process with the CUDA
    runtime on (``code`` installs the stand-in CuPy and driver itself); skipped where there
    is no C compiler for the stand-in driver."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if shutil.which(_os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler for the stand-in driver")
    env = dict(_os.environ, TAPESCOPE_CUDA="1")
    env.pop("TAPESCOPE_DISABLE_GPU", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=Path(__file__).parent.parent)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert r.returncode == 0 and line, r.stdout[-4000:] + r.stderr[-4000:]
    return json.loads(line[-1][len("RESULT"):])
