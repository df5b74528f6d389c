#!/usr/bin/env bash
# The GPU machine's run (`make test-gpu`): an NVIDIA GPU with CuPy, JAX and pytest-xdist
# installed system-wide, nothing to download. Three parts, each reported even if one fails:
#   1. the whole suite with the CPU as the default device (no CUDA runtime registered);
#   2. the CUDA runtime's own suites (TAPESCOPE_CUDA=1: the GPU is the default device);
#   3. the op, memory, scheduler and compile suites again with the GPU as the default device.
# The browser test needs chromium, which the GPU machine lacks. JAX must not take 75% of the
# GPU in each of the test processes: XLA_PYTHON_CLIENT_PREALLOCATE=false.
set -u
PY=${PY:-python3}
N=${N:-15}
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
# wheels carried to the machine (it cannot download), e.g. the graphviz package the viz needs
if compgen -G "wheels/*.whl" > /dev/null; then "$PY" -m pip install -q --no-deps wheels/*.whl; fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false
run() {  # name, time limit (s), pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$PY" -m pytest -p no:cacheprovider -o addopts= -o timeout=60 -q -rfE "$@" \
    > "$OUT/$name.txt" 2>&1
  echo "== $name: rc=$? $(grep -E '(passed|failed)' "$OUT/$name.txt" | tail -1)"
  grep -E '^(FAILED|ERROR)' "$OUT/$name.txt" | cut -c1-200 | head -40
}
# the device tool allows 600 s per command: about 300 + 120 + 150 at most
run cpu_default 300 -n "$N" tests --ignore tests/test_browser.py
export TAPESCOPE_CUDA=1
run cuda_runtime 120 -n 8 tests/test_cuda_runtime.py tests/test_cuda_rules.py
run gpu_default 150 -n "$N" tests/test_elementwise_ops.py tests/test_elementwise_binary.py \
  tests/test_elementwise_unary.py tests/test_reduction.py tests/test_shape.py tests/test_indexing.py \
  tests/test_scan.py tests/test_sort.py tests/test_creation.py tests/test_memory.py \
  tests/test_scheduler.py tests/test_stream_threads.py tests/test_compile_api.py tests/test_laziness.py
