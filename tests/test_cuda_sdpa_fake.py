"""The CUDA backend's attention and GEMM host paths over the stand-in CuPy, each case file in
a fresh process: the attention prefill (``kernels/cuda/attention.py``: cuBLAS GEMMs and the
score softmax kernel per query block; ``cuda_sdpa_fake_cases.py``) and Matmul / AddMM
(``kernels/cuda/gemm.py``; ``cuda_gemm_fake_cases.py``) over the stand-in cuBLAS, and
decoding's, the quantized qmv's and the one-row gemv's planned launches from C over the
stand-in driver (``cuda_sdpa_vector_fake_cases.py``, the prefill's fused kernel run on the
host at the packed words' pointers: ``cuda_sdpa_flash_fake_cases.py``, ``cuda_qmv_fake_cases.py``,
``cuda_gemv_fake_cases.py``). The GPU runs the real ones in ``test_cuda_fast.py``
and the GPU suites."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

try:
    from tapescope.kernels.cpu import compiler
    _cc = compiler.toolchain() is not None
except Exception:  # noqa: BLE001
    _cc = False


@pytest.mark.skipif(not _cc, reason="the kernels' CPU builds and the stand-in libcuda need a "
                    "C compiler")
@pytest.mark.parametrize("cases, stand_in", [
    ("cuda_sdpa_fake_cases.py", "fake_cublas"),  # prefill: cuBLAS GEMMs + the softmax kernel
    ("cuda_gemm_fake_cases.py", "fake_cublas"),  # Matmul / AddMM
    # Matmul / AddMM's plans launched from C (the stand-in libcublas)
    ("cuda_gemm_c_fake_cases.py", "fake_cublas,fake_cuda_driver"),
    ("cuda_sdpa_vector_fake_cases.py", "fake_cuda_driver"),  # decoding: launched from C
    ("cuda_sdpa_flash_fake_cases.py", "fake_cuda_driver"),  # prefill's fused kernel: from C
    # quantized_matmul: qmv launched from C, qmm's dequant kernel and cuBLAS GEMM
    ("cuda_qmv_fake_cases.py", "fake_cublas,fake_cuda_driver"),
    # one row times a transposed weight: the gemv launched from C (others: cuBLAS)
    ("cuda_gemv_fake_cases.py", "fake_cublas,fake_cuda_driver"),
    # bfloat16 RMSNorm / RoPE: their storage planned and launched from C
    ("cuda_fast_decode_fake_cases.py", "fake_cuda_driver"),
])
def test_cuda_host_paths_over_a_stand_in_cupy(cases, stand_in):
    installs = "".join(f"import {m}; {m}.install();" for m in stand_in.split(","))
    code = (
        "import sys; sys.path.insert(0, %r); import fake_cupy; fake_cupy.install();%s"
        "import pytest; sys.exit(pytest.main(['-p', 'no:cacheprovider', '-q', '-o', 'addopts=',"
        " '-x', %r]))" % (str(HERE), installs, str(HERE / cases)))
    env = dict(os.environ, TAPESCOPE_CUDA="1", MLX_ENABLE_TF32="0")
    env.pop("TAPESCOPE_DISABLE_GPU", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600, cwd=HERE.parent)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
