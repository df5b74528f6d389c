"""MLX's fast primitives as generated CUDA on an NVIDIA GPU (kernels/cuda/fast_kernels.py):
RMSNorm, LayerNorm, their VJPs and RoPE on ``mx.gpu`` against float64 numpy on the host,
over row lengths around warps and blocks, weight / bias given or not, strided inputs and
RoPE's offsets; each case checks that a CUDA kernel ran. Skips unless ``TAPESCOPE_CUDA=1``
with CuPy and a GPU (``tests/run_gpu_suites.sh`` part ``cuda_runtime``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends

from conftest import kernel_launches
from test_fast_kernels import layer_ref, rms_ref, rope_ref

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="the CUDA runtime needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")

EPS = 1e-5


def on_gpu(x: np.ndarray):
    return mx.add(mx.array(x), 0, stream=mx.gpu)


def close(got, want, tol=3e-5):
    g = np.asarray(got.astype(mx.float32)).astype(np.float64)
    np.testing.assert_allclose(g, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max(initial=0)))


@pytest.mark.parametrize("cols", [1, 31, 32, 33, 255, 1000, 1025, 4096, 8193])
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_norms_and_their_vjps_match_numpy(rows, cols, dtype):
    rng = np.random.default_rng(rows * cols)
    x, w, b, g = (rng.standard_normal(s).astype(dtype) for s in
                  ((rows, cols), (cols,), (cols,), (rows, cols)))
    tol = 3e-5 if dtype == "float32" else 4e-3
    a, wa, ba, ga = (on_gpu(v) for v in (x, w, b, g))
    with kernel_launches("cuda") as rec:
        outs = [mx.fast.rms_norm(a, wa, EPS), mx.fast.layer_norm(a, wa, ba, EPS),
                mx.fast.rms_norm(a.T.T[:, ::1], None, EPS), mx.fast.layer_norm(a, None, ba, EPS)]
        _, grads = mx.vjp(lambda x, w, b: mx.fast.layer_norm(x, w, b, EPS), [a, wa, ba], [ga])
        _, rgrads = mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, EPS), [a, wa], [ga])
        mx.eval(*outs, *grads, *rgrads)
    close(outs[0], rms_ref(x, w), tol)
    close(outs[1], layer_ref(x, w, b), tol)
    close(outs[2], rms_ref(x, None), tol)
    close(outs[3], layer_ref(x, None, b), tol)
    from tapescope.kernels.rules import fast as rules

    x32, w32, b32, g32 = (v.astype(np.float32) for v in (x, w, b, g))
    want = rules.layer_norm_vjp(np, x32, w32, b32, g32, eps=EPS)
    for got, wv in zip(grads, want):
        close(got, wv.astype(np.float64), tol * max(1.0, rows / 8))
    want = rules.rms_norm_vjp(np, x32, w32, g32, eps=EPS)
    for got, wv in zip(rgrads, want):
        close(got, wv.astype(np.float64), tol * max(1.0, rows / 8))
    assert {"RMSNorm", "LayerNorm", "LayerNormVJP", "RMSNormVJP"} <= rec.primitives, rec.fallbacks


@pytest.mark.parametrize("shape,dims", [((2, 4, 33, 64), 64), ((1, 3, 5, 128), 96), ((3, 7, 18), 8)])
@pytest.mark.parametrize("traditional", [False, True])
def test_rope_matches_numpy(shape, dims, traditional):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    off = rng.integers(0, 100, shape[0]).astype(np.int32)
    a = on_gpu(x)
    with kernel_launches("cuda") as rec:
        y = mx.fast.rope(a, dims, traditional=traditional, base=1e4, scale=0.5, offset=mx.array(off))
        z = mx.fast.rope(mx.swapaxes(a, -2, -3) if len(shape) == 4 else a, dims,
                         traditional=traditional, base=1e4, scale=1.0, offset=3)
        mx.eval(y, z)
    close(y, rope_ref(x, dims, traditional, 1e4, 0.5, off), 1e-4)
    xz = np.swapaxes(x, -2, -3) if len(shape) == 4 else x
    close(z, rope_ref(np.ascontiguousarray(xz), dims, traditional, 1e4, 1.0, 3), 1e-4)
    assert "RoPE" in rec.primitives, rec.fallbacks
