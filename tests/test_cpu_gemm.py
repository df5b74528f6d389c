"""kernels/cpu/gemm.py: small 2-D Matmul / AddMM as planned BLAS calls, against numpy in
float64 over random shapes, dtypes, operand layouts (row-major, transposed views, row
slices), ``alpha`` / ``beta`` and broadcast ``c``; eager, compiled, and into a donated
operand's buffer (the product computed into a temporary first)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope
import tapescope.core as mx
from tapescope.kernels.cpu import gemm

pytestmark = pytest.mark.skipif(gemm._trampoline() is None or gemm.cblas("s") is None,
                                reason="no _gemm extension or no OpenBLAS CBLAS found")


def _mx(a):
    return mx.array(a, dtype=mx.float64 if a.dtype == np.float64 else mx.float32)


def _operand(draw, rows, cols, dtype, rng):
    """A (rows, cols) operand as it lies: row-major, a transposed view, or every other row."""
    kind = draw(st.sampled_from(["c", "t", "slice"]))
    if kind == "t":
        base = rng.standard_normal((cols, rows)).astype(dtype)
        return mx.transpose(_mx(base)), base.T
    if kind == "slice":
        base = rng.standard_normal((2 * rows, cols)).astype(dtype)
        return _mx(base)[::2], base[::2]
    base = rng.standard_normal((rows, cols)).astype(dtype)
    return _mx(base), base


@st.composite
def products(draw):
    m, n, k = (draw(st.integers(1, 24)) for _ in range(3))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    a, an = _operand(draw, m, k, dtype, rng)
    b, bn = _operand(draw, k, n, dtype, rng)
    cshape = draw(st.sampled_from([(m, n), (n,), (1, n), (m, 1)]))
    cn = rng.standard_normal(cshape).astype(dtype)
    alpha = draw(st.sampled_from([1.0, 0.5, -2.0]))
    beta = draw(st.sampled_from([1.0, 0.0, 2.0]))
    return a, an, b, bn, _mx(cn), cn, alpha, beta


def _close(got, want, dtype):
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(np.array(got), want, rtol=tol, atol=tol * 10)


@settings(max_examples=80, deadline=None)
@given(products(), st.booleans())
def test_small_products_are_numpys(case, compiled):
    a, an, b, bn, c, cn, alpha, beta = case
    dtype = an.dtype
    want_mm = an.astype(np.float64) @ bn.astype(np.float64)
    want_add = alpha * want_mm + beta * np.broadcast_to(cn, want_mm.shape)
    if compiled:
        mm = mx.compile(lambda x, y: x @ y)
        add = mx.compile(lambda z, x, y: mx.addmm(z, x, y, alpha=alpha, beta=beta))
    else:
        mm = lambda x, y: x @ y  # noqa: E731
        add = lambda z, x, y: mx.addmm(z, x, y, alpha=alpha, beta=beta)  # noqa: E731
    for _ in range(2):  # the second call runs the plan the first made
        _close(mm(a, b), want_mm, dtype)
        _close(add(c, a, b), want_add, dtype)


@st.composite
def vector_products(draw):
    """``products`` with one row (a decoding step's ``x @ W.T``) or one column."""
    k = draw(st.integers(1, 40))
    m, n = (1, draw(st.integers(1, 40))) if draw(st.booleans()) else (draw(st.integers(1, 40)), 1)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    a, an = _operand(draw, m, k, dtype, rng)
    b, bn = _operand(draw, k, n, dtype, rng)
    cn = rng.standard_normal(draw(st.sampled_from([(m, n), (n,), (1, n), (m, 1)]))).astype(dtype)
    return a, an, b, bn, _mx(cn), cn, draw(st.sampled_from([1.0, -2.0])), \
        draw(st.sampled_from([1.0, 0.0, 0.5]))


@settings(max_examples=80, deadline=None)
@given(vector_products())
def test_one_row_or_column_products_are_one_gemv_and_numpys(case):
    a, an, b, bn, c, cn, alpha, beta = case
    dtype = an.dtype
    want_mm = an.astype(np.float64) @ bn.astype(np.float64)
    want_add = alpha * want_mm + beta * np.broadcast_to(cn, want_mm.shape)
    prefix = "d" if dtype == np.float64 else "s"
    for _ in range(2):
        with tapescope.record() as rec:
            mm, add = a @ b, mx.addmm(c, a, b, alpha=alpha, beta=beta)
            mx.eval(mm, add)
        _close(mm, want_mm, dtype)
        _close(add, want_add, dtype)
    launched = [r.name for r in rec.records if r.kind == "kernel_launch"]
    if gemm.cblas(prefix, "gemv") is not None:
        assert launched == [f"{prefix}gemv"] * 2


def test_the_product_is_planned_and_writes_into_a_donated_operand():
    rng = np.random.default_rng(1)
    an, bn = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    rule = gemm.RULES["Matmul"]
    for _ in range(3):  # (a + 0) dies into the product: its buffer is the output's
        a, b = mx.array(an), mx.array(bn)
        got = np.array((a + 0) @ b)
        np.testing.assert_allclose(got, an.astype(np.float64) @ bn, rtol=1e-5, atol=1e-5)
    key = ("Matmul", np.ndarray, an.dtype, an.shape, an.strides, np.ndarray, bn.dtype, bn.shape,
           bn.strides)
    assert rule.plans.get(key) is not None  # the loop's call made the plan
    out = np.empty((8, 8), np.float32)
    a = an.copy()
    plan = rule.planned((a, bn), {})
    plan(a, bn, a)  # the output is the first operand's memory
    np.testing.assert_allclose(a, an.astype(np.float64) @ bn, rtol=1e-5, atol=1e-5)
    assert rule.planned((an.T.copy().T[:, :3], bn[:3]), {}) is not None  # a column-major operand
    assert rule.planned((np.ones((2, 3, 4), np.float32), np.ones((2, 4, 5), np.float32)), {}) is None
    assert rule.planned((np.ones((3, 4), np.float16), np.ones((4, 5), np.float16)), {}) is None
    big = np.ones((128, 128), np.float32)
    assert rule.planned((big, big), {}) is None  # past SMALL_PRODUCT: the rule (BLAS threads)
    del out


def test_half_and_batched_products_take_the_rule():
    rng = np.random.default_rng(2)
    for dtype in (np.float16,):
        an = rng.standard_normal((2, 5, 3)).astype(dtype)
        bn = rng.standard_normal((2, 3, 4)).astype(dtype)
        got = np.array(mx.array(an) @ mx.array(bn)).astype(np.float64)
        np.testing.assert_allclose(got, an.astype(np.float64) @ bn, rtol=2e-2, atol=2e-2)
