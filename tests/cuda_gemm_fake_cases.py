"""The CUDA backend's GEMMs (``kernels/cuda/gemm.py``: ``gemm`` on a first call, its
``GemmPlan`` launched by the eval loop on later calls of one layout) over the stand-in CuPy
and cuBLAS (``fake_cupy.py``, ``fake_cublas.py``), collected by ``test_cuda_sdpa_fake.py`` in
a fresh process: transposed, sliced, broadcast and batched operands, empty sums, AddMM's
alpha / beta, float32 / float16 / bfloat16 / complex64, against float64 numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cublas
import tapescope.core as mx
from conftest import sweep



def host(a):
    """``a``'s values on the host, float64 (complex128 for a complex array)."""
    v = np.asarray(a.view(mx.uint16)).view(BF16) if a.dtype == mx.bfloat16 else np.asarray(a)
    return v.astype(np.complex128 if v.dtype.kind == "c" else np.float64)

BF16 = np.dtype(ml_dtypes.bfloat16)

DT = {"float32": (mx.float32, 2e-5), "float16": (mx.float16, 2e-3),
      "bfloat16": (mx.bfloat16, 1.6e-2), "complex64": (mx.complex64, 2e-5)}


pytestmark = pytest.mark.usefixtures("gpu_default_device")  # (conftest.py's)


def _operand(rng, shape, dtype, layout):
    """A float64 value of ``shape`` and an mx array of it in ``layout``: row-major, the last
    two axes' transpose of a row-major buffer, a slice of a wider buffer (not readable in
    place: a copy first), or broadcast over the leading batch axis."""
    x = rng.standard_normal(shape)
    if dtype == "complex64":
        x = x + 1j * rng.standard_normal(shape)
    t = DT[dtype][0]
    x = host(mx.array(x, dtype=t)).astype(np.complex128 if dtype == "complex64" else np.float64)
    if layout == "transposed":
        a = mx.swapaxes(mx.array(np.ascontiguousarray(np.swapaxes(x, -1, -2)), dtype=t), -1, -2)
    elif layout == "sliced":
        wide = np.zeros(shape[:-1] + (shape[-1] + 3,), x.dtype)
        wide[..., 1:1 + shape[-1]] = x
        a = mx.array(wide, dtype=t)[..., 1:1 + shape[-1]]
    elif layout == "broadcast" and len(shape) == 3:
        x = np.broadcast_to(x[:1], shape)
        a = mx.broadcast_to(mx.array(np.ascontiguousarray(x[:1]), dtype=t), shape)
    else:
        a = mx.array(x, dtype=t)
    return x, a


@st.composite
def products(draw):
    batch = draw(st.sampled_from([(), (1,), (3,)]))
    m, k, n = (draw(st.sampled_from([0, 1, 5, 16])) for _ in range(3))
    dtype = draw(st.sampled_from(list(DT)))
    layouts = [draw(st.sampled_from(["contiguous", "transposed", "sliced", "broadcast"]))
               for _ in range(2)]
    addmm = draw(st.booleans())
    alpha = draw(st.sampled_from([1.0, 0.5]))
    beta = draw(st.sampled_from([0.0, 1.0, -2.0]))
    return batch, m, k, n, dtype, layouts, addmm, alpha, beta, draw(st.integers(0, 2 ** 16))


@settings(max_examples=sweep(80, 30), deadline=None)
@given(products())
def test_gemm_matches_float64_numpy_on_the_first_and_a_planned_call(c):
    batch, m, k, n, dtype, layouts, addmm, alpha, beta, seed = c
    rng = np.random.default_rng(seed)
    x, a = _operand(rng, batch + (m, k), dtype, layouts[0])
    y, b = _operand(rng, batch + (k, n), dtype, layouts[1])
    want = x @ y
    if addmm:
        z, cc = _operand(rng, batch + (m, n), dtype, "contiguous")
        want = alpha * want + beta * z
    tol = DT[dtype][1]
    for _ in range(2):  # the second call of a layout takes its plan (launched from C)
        calls = fake_cublas.CALLS[0]
        out = mx.addmm(cc, a, b, alpha=alpha, beta=beta) if addmm else a @ b
        mx.eval(out)
        assert out.dtype == DT[dtype][0] and out.shape == want.shape
        np.testing.assert_allclose(host(out), want, rtol=tol,
                                   atol=tol * max(1.0, k, np.abs(want).max(initial=0)))
        assert fake_cublas.CALLS[0] - calls == (1 if m * n * k else 0)
