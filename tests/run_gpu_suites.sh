#!/usr/bin/env bash
# The GPU machine's run (`make test-gpu`): an NVIDIA GPU with CuPy, JAX and pytest-xdist
# installed system-wide, nothing to download. Five parts, each reported even if one fails:
#   1. the whole suite with the CPU as the default device (no CUDA runtime registered);
#   2. the CUDA runtime's own suites (TAPESCOPE_CUDA=1: the GPU is the default device), with
#      NCCL in a world of one on one GPU;
#   3. the op, memory, scheduler, compile and notebook-layer (magic, viz, widgets, snapshots,
#      progress, check, roofline) suites again with the GPU as the default device;
#   4. notebooks: the course executed in real kernels (nbclient) with the CUDA runtime opted in,
#      so the GPU cells of notebooks 03 and 09 run (nbclient, ipykernel, jupyter_client, pyzmq
#      carried as wheels);
#   5. nccl: mx.distributed over NCCL, one process per GPU under mpirun (>= 2 GPUs).
# PARTS="nccl" (say) runs only the parts named.
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
# tapescope's suites compare float32 products with float64 numpy at float32's tolerances: MLX's
# TF32 default off here (tests/test_cuda_precision.py switches it on where it tests it)
export MLX_ENABLE_TF32=${MLX_ENABLE_TF32:-0}
PARTS=${PARTS:-cpu_default cuda_runtime gpu_default notebooks nccl}
run() {  # name, time limit (s), per-test limit (s), pytest arguments...
  local name=$1 limit=$2 each=$3; shift 3
  case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
  # thread-method timeouts: a test stuck in C (a CUDA wait) is killed with its stack printed,
  # and xdist names it, instead of the whole part running into ``timeout``
  timeout "$limit" "$PY" -m pytest -p no:cacheprovider -o addopts= -o timeout="$each" \
    -o timeout_method=thread -q -rfE "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name: rc=$? $(grep -E '(passed|failed)' "$OUT/$name.txt" | tail -1)"
  grep -E '^(FAILED|ERROR)' "$OUT/$name.txt" | cut -c1-200 | head -40
}
# the device tool allows 600 s per command: the whole suite took 71 s, the CUDA parts ~110 s
run cpu_default 300 200 -n "$N" tests --ignore tests/test_browser.py
export TAPESCOPE_CUDA=1
run cuda_runtime 200 120 -n 8 tests/test_cuda_runtime.py tests/test_cuda_bf16.py tests/test_cuda_float64.py tests/test_cuda_subnormals.py tests/test_cuda_interop.py tests/test_cuda_donation.py \
  tests/test_cuda_eager.py tests/test_cuda_fusion.py tests/test_cuda_eval_loop.py tests/test_cuda_kernel.py tests/test_cuda_indexing.py tests/test_cuda_slice_update.py \
  tests/test_cuda_rules.py tests/test_cuda_gemm.py tests/test_distributed_nccl.py tests/test_allocator_c.py tests/test_compile_call_c.py \
  tests/test_cuda_reductions.py tests/test_reduction_dialects.py tests/test_cuda_fast.py tests/test_cuda_precision.py tests/test_quantized_kernels.py \
  tests/test_roofline.py::test_a_cuda_copy_kernel_reaches_the_measured_device_copy_bandwidth
run gpu_default 200 60 -n "$N" tests/test_elementwise_ops.py tests/test_elementwise_binary.py \
  tests/test_elementwise_unary.py tests/test_reduction.py tests/test_shape.py tests/test_indexing.py \
  tests/test_scan.py tests/test_sort.py tests/test_creation.py tests/test_memory.py \
  tests/test_scheduler.py tests/test_stream_threads.py tests/test_compile_api.py tests/test_laziness.py \
  tests/test_magic.py tests/test_viz_graph.py tests/test_viz_widgets.py tests/test_viz_dot.py \
  tests/test_viz_render.py tests/test_progress.py tests/test_check.py tests/test_check_grad.py \
  tests/test_roofline.py tests/test_viz_snapshots.py
run notebooks 300 280 tests/test_notebooks.py
NGPU=$("$PY" -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())" 2>/dev/null || echo 0)
if [ "${NGPU:-0}" -ge 2 ]; then
  run nccl 300 280 tests/test_distributed_nccl.py
else
  echo "== nccl: not run (CuPy sees ${NGPU:-0} GPU(s); it needs 2)"
fi
