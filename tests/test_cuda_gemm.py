"""Matmul and AddMM on the GPU as one cuBLAS GEMM (kernels/cuda/gemm.py) against float64
numpy: operands row-major, transposed, sliced (copied), broadcast over the batch, batches that
do and do not collapse to one stride; float32 (TF32 off: full precision), float16, bfloat16
(its storage handed to cuBLAS: no float32 copy, one rounding of the float32 sum), complex64
(float64 is refused on a GPU stream, as MLX refuses it); AddMM's alpha, beta and broadcast ``c``; empty products. Skips unless
``TAPESCOPE_CUDA=1`` with CuPy and a GPU (``tests/run_gpu_suites.sh`` part ``cuda_runtime``).
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

import tapescope.core as mx
from tapescope.kernels import backends
from tapescope.kernels.settings import settings

GPU = os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0
pytestmark = pytest.mark.skipif(not GPU, reason="needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")

# relative tolerance of max |error| / max |reference| per dtype, the inputs exact in it
_TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1e-2, "complex64": 2e-6}


def _exact(rng, shape, dtype):
    """Values exact in ``dtype`` (so the reference sees the same inputs), as float64."""
    x = rng.standard_normal(shape)
    if dtype == "complex64":
        x = x + 1j * rng.standard_normal(shape)
        return x.astype(np.complex64).astype(np.complex128)
    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return x.astype(np_dt).astype(np.float64)


def _on_gpu(x64, dtype):
    host = np.complex64 if dtype == "complex64" else np.float32
    return mx.array(x64.astype(host), dtype=getattr(mx, dtype))


def _check(got, want, dtype):
    got = np.asarray(got.astype(mx.complex64 if dtype == "complex64" else mx.float32))
    assert got.shape == want.shape
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got.astype(np.complex128) - want).max()) / scale
    assert err < _TOL[dtype], (dtype, err)


def _layout(x, how):
    """``x`` (an mx array) read the way ``how`` names: its own, a transpose of a transposed
    copy (column-major storage), a slice of a wider array (a copy is made)."""
    if how == "transposed":
        return mx.swapaxes(mx.contiguous(mx.swapaxes(x, -1, -2)), -1, -2)
    if how == "sliced":
        wide = mx.concatenate([x, x], axis=-1)
        return wide[..., : x.shape[-1]]
    return x


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "complex64"])
@pytest.mark.parametrize("la", ["row", "transposed", "sliced"])
@pytest.mark.parametrize("lb", ["row", "transposed"])
def test_matmul_layouts_and_dtypes(dtype, la, lb):
    rng = np.random.default_rng(1)
    a, b = _exact(rng, (33, 65), dtype), _exact(rng, (65, 17), dtype)
    with settings(tf32=False):
        x = _layout(_on_gpu(a, dtype), la)
        y = _layout(_on_gpu(b, dtype), lb)
        got = mx.matmul(x, y, stream=mx.gpu)
        mx.eval(got)
    assert got.dtype == getattr(mx, dtype)
    _check(got, a @ b, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_products_broadcast_and_uncollapsible_batches(dtype):
    rng = np.random.default_rng(2)
    a = _exact(rng, (2, 3, 8, 5), dtype)
    b = _exact(rng, (5, 4), dtype)  # broadcast over both batch axes: batch stride 0
    c = _exact(rng, (3, 2, 5, 4), dtype)
    with settings(tf32=False):
        x = _on_gpu(a, dtype)
        got1 = mx.matmul(x, _on_gpu(b, dtype), stream=mx.gpu)
        # a batch that does not collapse to one stride: the axes swapped
        y = mx.swapaxes(_on_gpu(c, dtype), 0, 1)
        got2 = mx.matmul(x, y, stream=mx.gpu)
        mx.eval(got1, got2)
    _check(got1, a @ b, dtype)
    _check(got2, a @ np.swapaxes(c, 0, 1), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0), (-1.5, 1.0)])
@pytest.mark.parametrize("c_shape", [(17,), (33, 17), (1, 17), (33, 1)])
def test_addmm_alpha_beta_and_broadcast_c(dtype, alpha, beta, c_shape):
    rng = np.random.default_rng(3)
    a, b = _exact(rng, (33, 40), dtype), _exact(rng, (40, 17), dtype)
    c = _exact(rng, c_shape, dtype)
    with settings(tf32=False):
        got = mx.addmm(_on_gpu(c, dtype), _on_gpu(a, dtype), _on_gpu(b, dtype),
                       alpha=alpha, beta=beta, stream=mx.gpu)
        mx.eval(got)
    _check(got, alpha * (a @ b) + beta * c, dtype)


def test_bfloat16_products_match_one_rounding_of_the_float32_sum():
    """cuBLAS's float32 accumulation rounded once to bfloat16, as MLX's CUBLAS_COMPUTE_32F
    gives: within one bfloat16 ulp of the float64 product rounded to bfloat16."""
    rng = np.random.default_rng(4)
    a, b = _exact(rng, (64, 256), "bfloat16"), _exact(rng, (256, 32), "bfloat16")
    got = np.asarray(mx.matmul(_on_gpu(a, "bfloat16"), _on_gpu(b, "bfloat16"),
                               stream=mx.gpu).astype(mx.float32)).astype(np.float64)
    want = (a @ b).astype(ml_dtypes.bfloat16).astype(np.float64)
    ulp = np.maximum(np.abs(want), 1.0) * 2.0 ** -7  # near 0: the float32 sum's own error
    assert np.all(np.abs(got - want) <= ulp)


def test_empty_products():
    with settings(tf32=False):
        z = mx.matmul(mx.ones((3, 0)), mx.ones((0, 4)), stream=mx.gpu)
        e = mx.matmul(mx.ones((0, 5)), mx.ones((5, 4)), stream=mx.gpu)
        m = mx.addmm(mx.full((3, 4), 2.0), mx.ones((3, 0)), mx.ones((0, 4)), beta=3.0,
                     stream=mx.gpu)
        mx.eval(z, e, m)
    np.testing.assert_array_equal(np.asarray(z), np.zeros((3, 4), np.float32))
    assert e.shape == (0, 4)
    np.testing.assert_array_equal(np.asarray(m), np.full((3, 4), 6.0, np.float32))


def test_tf32_rounds_the_inputs_only_when_on():
    rng = np.random.default_rng(5)
    a, b = _exact(rng, (64, 512), "float32"), _exact(rng, (512, 48), "float32")
    x, y = _on_gpu(a, "float32"), _on_gpu(b, "float32")
    errs = {}
    for on in (False, True):
        with settings(tf32=on):
            got = np.asarray(mx.matmul(x, y, stream=mx.gpu)).astype(np.float64)
        want = a @ b
        errs[on] = float(np.abs(got - want).max() / np.abs(want).max())
    assert errs[False] < 2e-6 and 2e-5 < errs[True] < 5e-3, errs


@hsettings(max_examples=25, deadline=None)
@given(m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 70),
       batch=st.sampled_from([(), (1,), (3,), (2, 2)]), ta=st.booleans(), tb=st.booleans())
def test_shapes_against_numpy(m, n, k, batch, ta, tb):
    rng = np.random.default_rng(m * 10000 + n * 100 + k)
    a, b = _exact(rng, batch + (m, k), "float32"), _exact(rng, batch + (k, n), "float32")
    with settings(tf32=False):
        x = _layout(_on_gpu(a, "float32"), "transposed" if ta else "row")
        y = _layout(_on_gpu(b, "float32"), "transposed" if tb else "row")
        got = mx.matmul(x, y, stream=mx.gpu)
        mx.eval(got)
    _check(got, a @ b, "float32")


def test_no_float32_copy_for_bfloat16_operands():
    """The product reads bfloat16 storage itself: the timeline has no float32 fallback for it."""
    from tapescope.kernels import timeline

    x = mx.ones((64, 64), dtype=mx.bfloat16)
    y = mx.ones((64, 64), dtype=mx.bfloat16)
    mx.eval(x, y)
    with timeline.record() as rec:
        mx.eval(mx.matmul(x, y, stream=mx.gpu))
    assert not [r for r in rec.records if r.kind == "fallback" and r.name == "Matmul"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_into_the_evaluators_buffer_and_a_donated_c(dtype):
    """The product is written into the buffer the loop hands the rule: a fresh one, or the
    memory of a dying ``c`` (AddMM copies c there first, then the GEMM adds it); a dying
    operand of the product itself is never written while cuBLAS reads it."""
    rng = np.random.default_rng(6)
    a, b = _exact(rng, (20, 30), dtype), _exact(rng, (30, 20), dtype)
    c = _exact(rng, (20, 20), dtype)
    with settings(tf32=False):
        x, y, z = _on_gpu(a, dtype), _on_gpu(b, dtype), _on_gpu(c, dtype)
        got1 = mx.addmm(z * 1.0, x, y, alpha=0.5, beta=2.0, stream=mx.gpu)  # c dies: donated
        got2 = mx.matmul(x * 1.0, y, stream=mx.gpu)  # a dying operand
        sq = _on_gpu(c, dtype)
        got3 = mx.matmul(sq * 1.0, sq, stream=mx.gpu)  # same shape as the result, dying
        mx.eval(got1, got2, got3)
    _check(got1, 0.5 * (a @ b) + 2.0 * c, dtype)
    _check(got2, a @ b, dtype)
    _check(got3, c @ c, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_planned_product_is_launched_by_the_loop_from_its_second_call(dtype):
    """A layout's first product makes its plan (``gemm.GemmPlan``); from the second on the
    eval loop launches that plan from C (``cuda/_driver.c``'s cuBLAS call where the backend
    has its C launch, else ``launch_fused``: its gpu_work record names the cuBLAS call), with
    the same results as float64 numpy, AddMM's c copied in first."""
    from tapescope.kernels import timeline
    from tapescope.kernels.cuda.gemm import GemmPlan

    in_c = backends.backend("gpu").device_api is not None
    if in_c:
        from tapescope.kernels.cuda import _driver

        g0 = _driver.stats()["gemms"]

    rng = np.random.default_rng(7)
    a, b = _exact(rng, (23, 41), dtype), _exact(rng, (41, 15), dtype)  # (layouts no other
    c = _exact(rng, (15,), dtype)  # test plans)
    kinds = []
    with settings(tf32=False):
        for _ in range(3):
            x, y, z = _on_gpu(a, dtype), _on_gpu(b, dtype), _on_gpu(c, dtype)
            mx.eval(x, y, z)
            with timeline.record() as rec:
                p = mx.matmul(x, y, stream=mx.gpu)
                q = mx.addmm(z, x, y, alpha=0.5, beta=2.0, stream=mx.gpu)
                mx.eval(p, q)
            _check(p, a @ b, dtype)
            _check(q, 0.5 * (a @ b) + 2.0 * c, dtype)
            kinds.append(sorted(r.name for r in rec.records if r.kind == "gpu_work"
                                and (r.detail or {}).get("kernel") == GemmPlan.name))
    assert kinds[0] == [] and kinds[1] == kinds[2] == ["AddMM", "Matmul"], kinds
    if in_c:  # the two planned calls' GEMMs, each launched by _driver.c (CuPy's libcublas)
        assert _driver.stats()["gemms"] - g0 == 4 and _driver.stats()["cublas"] == "found"
