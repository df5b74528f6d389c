"""MLX's float32 matmul precision on CUDA (kernels/cuda/precision.py): TF32 by default,
full float32 with ``MLX_ENABLE_TF32=0`` / ``settings.tf32 = False``; bfloat16 products in full
float32 either way; the process's own CuPy setting put back after each product. The setting's
parsing runs anywhere; the products skip unless ``TAPESCOPE_CUDA=1`` with CuPy and a GPU
(``tests/run_gpu_suites.sh`` part ``cuda_runtime``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends
from tapescope.kernels.settings import settings

GPU = os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0
needs_gpu = pytest.mark.skipif(not GPU, reason="needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")


def test_the_switch_reads_mlx_s_variable(monkeypatch):
    monkeypatch.delenv("MLX_ENABLE_TF32", raising=False)
    assert settings.tf32 is True  # MLX's default (mlx/utils.h: get_var("MLX_ENABLE_TF32", 1))
    monkeypatch.setenv("MLX_ENABLE_TF32", "0")
    assert settings.tf32 is False
    monkeypatch.setenv("MLX_ENABLE_TF32", "2")
    with pytest.raises(ValueError, match="MLX_ENABLE_TF32"):
        settings.tf32


def _relative_error(dtype, k=512, **kw) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, k)).astype(np.float32)
    b = rng.standard_normal((k, 48)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    x = mx.array(a).astype(dtype)
    y = mx.array(b).astype(dtype)
    got = np.asarray(mx.matmul(x, y, stream=mx.gpu).astype(mx.float32)).astype(np.float64)
    if dtype == mx.bfloat16:  # the reference of bfloat16 inputs
        want = (np.asarray(x.astype(mx.float32)).astype(np.float64)
                @ np.asarray(y.astype(mx.float32)).astype(np.float64))
    return float(np.abs(got - want).max() / np.abs(want).max())


@needs_gpu
def test_float32_products_are_tf32_by_default_and_full_precision_when_off():
    from cupy._core import _routines_linalg as table

    before = table.get_compute_type(np.float32)
    with settings(tf32=False):
        full = _relative_error(mx.float32)
    with settings(tf32=True):
        tf32 = _relative_error(mx.float32)
    # full float32 over k = 512: ~1e-7 relative; TF32 rounds the inputs to 10 mantissa bits
    assert full < 2e-6, full
    assert 2e-5 < tf32 < 5e-3, tf32
    assert table.get_compute_type(np.float32) == before  # the process's own setting kept


@needs_gpu
def test_bfloat16_products_accumulate_in_float32_with_tf32_on():
    with settings(tf32=True):
        err = _relative_error(mx.bfloat16)
    assert err < 1e-2, err  # one bfloat16 rounding of the result, no TF32 rounding of inputs


@needs_gpu
def test_attention_prefill_follows_the_switch():
    """The prefill's two cuBLAS GEMMs (kernels/cuda/attention.py) in TF32 under the switch,
    as MLX's fallback matmuls: full float32 when off, TF32's error when on."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 4, 64, 128)).astype(np.float32) for _ in range(3))
    s = np.einsum("bhld,bhkd->bhlk", q.astype(np.float64), k.astype(np.float64)) * 128 ** -0.5
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhlk,bhkd->bhld", p / p.sum(-1, keepdims=True), v.astype(np.float64))

    def err():
        qa, ka, va = (mx.array(a) for a in (q, k, v))
        got = mx.fast.scaled_dot_product_attention(qa, ka, va, scale=128 ** -0.5, stream=mx.gpu)
        return float(np.abs(np.asarray(got).astype(np.float64) - want).max() / np.abs(want).max())

    with settings(tf32=False):
        full = err()
    with settings(tf32=True):
        tf32 = err()
    assert full < 2e-5, full
    assert 1e-4 < tf32 < 2e-2, tf32
