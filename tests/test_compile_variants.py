"""Strided and contiguous kernel variants build and run as C (no silent numpy fallback),
whatever letters the tape gives its inputs; results against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tapescope
import tapescope.core as mx
from tapescope.core.fusion import tapes
from tapescope.kernels.cpu import compiler

from conftest import sweep

needs_cc = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")


def _runtimes(g) -> set:
    libs = {t.lib_name for p in g.programs() for t in tapes(p)}
    return {e["runtime"] for e in tapescope.kernel_cache()
            if any(e["name"].startswith(lib + "_") for lib in libs)}


@needs_cc
def test_broadcast_row_with_input_named_C_builds_strided_kernel():
    """Regression: the strided kernel's locals were named R and C, like tape inputs."""
    rng = np.random.default_rng(1)
    xn = rng.uniform(-2, 2, (64, 48)).astype(np.float32)
    rn = rng.uniform(-2, 2, 48).astype(np.float32)
    g = mx.compile(lambda x, r: 2 * x + 3 * r - x * r)
    out = np.array(g(mx.array(xn), mx.array(rn)))
    with np.errstate(all="ignore"):
        ref = np.float32(2) * xn + np.float32(3) * rn - xn * rn
    np.testing.assert_array_equal(out, ref)
    assert _runtimes(g) == {"cpu"}


@needs_cc
@settings(max_examples=sweep(30, 12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_in=st.integers(2, 20), layout=st.sampled_from(["row", "col", "transposed", "3d"]),
       seed=st.integers(0, 2**16))
@example(n_in=20, layout="transposed", seed=5)  # (the most inputs, in make test's sample too)
def test_many_input_strided_tapes_run_as_c(n_in, layout, seed):
    """Tapes with up to 20 inputs (letters A..T and beyond for ops) on strided layouts."""
    rng = np.random.default_rng(seed)
    shape = (2, 5, 7) if layout == "3d" else (5, 7)
    ns = []
    for i in range(n_in):
        if i % 2 == 0:
            a = rng.uniform(-2, 2, shape).astype(np.float32)
            if layout == "transposed":
                a = np.ascontiguousarray(a.T).T
        elif layout == "col":
            a = rng.uniform(-2, 2, shape[:-1] + (1,)).astype(np.float32)
        else:
            a = rng.uniform(-2, 2, shape[-1:]).astype(np.float32)
        ns.append(a)
    xs = []
    for a in ns:
        if layout == "transposed" and a.ndim == 2 and a.flags.f_contiguous and not a.flags.c_contiguous:
            xs.append(mx.transpose(mx.array(np.ascontiguousarray(a.T))))
        else:
            xs.append(mx.array(a))

    def f(*vals):
        acc = vals[0]
        for j, v in enumerate(vals[1:]):
            acc = acc * v + 0.5 if j % 2 else acc - v * 1.5
        return acc

    g = mx.compile(f)
    out = np.array(g(*xs))
    with np.errstate(all="ignore"):
        acc = ns[0]
        for j, v in enumerate(ns[1:]):
            acc = acc * v + np.float32(0.5) if j % 2 else acc - v * np.float32(1.5)
    np.testing.assert_allclose(out, acc, rtol=1e-5, atol=1e-5)
    assert _runtimes(g) == {"cpu"}


# -- the streaming-store path of large contiguous outputs -----------------------------------

def _big_n() -> int:
    from tapescope.kernels.codegen.render import CDialect

    return CDialect.stream_min_bytes // 4 + 1  # just past the threshold for float32


@needs_cc
@pytest.mark.parametrize("offset", [0, 1, 3, 7])
def test_streaming_kernel_writes_every_element_at_any_output_alignment(offset):
    """Head (until the output is vector-aligned), blocks, tail: all elements, exactly."""
    from tapescope.kernels.cpu.compiled import run_compiled

    n = _big_n() + 37
    rng = np.random.default_rng(offset)
    xn = rng.uniform(-2, 2, n).astype(np.float32)
    yn = rng.uniform(-2, 2, n).astype(np.float32)
    g = mx.compile(lambda x, y: 2 * x + 3 * y - x * y)
    mx.eval(g(mx.array(xn[:8]), mx.array(yn[:8])))
    prim = g(mx.array(xn), mx.array(yn))._d.node.primitive
    tape = prim.kw["tape"]
    ins = [np.asarray(np.float32(x.constant)) if x.is_constant else (xn if x.name == "A" else yn)
           for x in tape.inputs]
    backing = np.full(n + 16, np.nan, np.float32)
    out = backing[offset:offset + n]
    (res,) = run_compiled(tape, ins, (n,), out=out)
    assert res is out
    np.testing.assert_array_equal(out, np.float32(2) * xn + np.float32(3) * yn - xn * yn)
    assert np.isnan(backing[:offset]).all() and np.isnan(backing[offset + n:]).all()


@needs_cc
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
def test_streaming_kernel_multi_output_and_dtypes_match_numpy(dtype, mixed):
    """Two outputs of one itemsize stream together; a bool output beside them (another
    itemsize, another alignment phase) sends the tape down the ordinary loop."""
    n = _big_n() + 5
    mdt = getattr(mx, dtype)
    rng = np.random.default_rng(0)
    base = rng.integers(-50, 50, n) if dtype == "int32" else rng.uniform(-2, 2, n)
    x = mx.array(base.astype(np.float32)).astype(mdt)
    y = mx.array(base[::-1].astype(np.float32)).astype(mdt)

    def f(a, b):
        s = a * b + a
        return (s, s - b, a > b) if mixed else (s, s - b)

    g = mx.compile(f)
    outs = g(x, y)
    ref = f(x, y)  # the ops one by one (numpy rules), rounded per op as the kernel does
    for o, r in zip(outs, ref):
        assert o.dtype == r.dtype
        np.testing.assert_array_equal(np.array(o.astype(mx.float32) if o.dtype == mx.bfloat16 else o),
                                      np.array(r.astype(mx.float32) if r.dtype == mx.bfloat16 else r))
    assert _runtimes(g) == {"cpu"}


@needs_cc
def test_streaming_kernel_keeps_ieee_specials_and_exp_accuracy():
    n = _big_n()
    vals = np.resize(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.7, 88.8, -103.9, -150.0,
                               1e-45, 3.4e38], np.float32), n)
    g = mx.compile(lambda v: mx.exp(v) * 1.0 + mx.maximum(v, -0.0) * 0.0)
    out = np.array(g(mx.array(vals)))
    with np.errstate(all="ignore"):
        ref = np.exp(vals.astype(np.float64)).astype(np.float32) + np.maximum(vals, np.float32(-0.0)) * np.float32(0)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    m = ~np.isnan(ref)
    exact = m & (~np.isfinite(ref) | (ref == 0) | (np.abs(ref) == np.float32(1)))
    np.testing.assert_array_equal(out[exact], ref[exact])  # inf, 0, exp(+-0) = 1
    ulp = np.spacing(np.abs(ref[m & ~exact]))
    assert np.all(np.abs(out[m & ~exact].astype(np.float64) - ref[m & ~exact]) <= 1.01 * ulp)
    np.testing.assert_array_equal(np.signbit(out[m]), np.signbit(ref[m]))


@needs_cc
@pytest.mark.parametrize("n", [4099, (1 << 21) + 3])  # the plain loop and the streaming loop
def test_generated_float32_exp_within_one_ulp_over_its_whole_range(n):
    """``ts_expf`` (the kernels' own float32 exp) on every binade from the underflow edge
    (results subnormal or 0) to the overflow edge, against float64 rounded to float32."""
    rng = np.random.default_rng(n)
    pts = np.concatenate([rng.uniform(-110, 92, n), rng.uniform(-104, -87, n // 4),
                          rng.uniform(-1e-3, 1e-3, n // 8), np.linspace(88.0, 89.0, n // 8)])
    vals = pts.astype(np.float32)
    g = mx.compile(lambda v: mx.exp(v) * 1.0)
    out = np.array(g(mx.array(vals))).astype(np.float64)
    with np.errstate(all="ignore"):
        ref = np.exp(vals.astype(np.float64))
    ulp = np.maximum(np.spacing(np.minimum(ref, np.finfo(np.float32).max).astype(np.float32)).astype(np.float64),
                     np.finfo(np.float32).smallest_subnormal)
    big = ref > np.finfo(np.float32).max * (1 + 2**-25)  # rounds to inf
    assert np.all(np.isinf(out[big]))
    err = np.abs(out[~big] - ref[~big]) / ulp[~big]
    assert err.max() <= 1.01, err.max()
    assert _runtimes(g) == {"cpu"}


@needs_cc
@pytest.mark.parametrize("offset", [0, 1, 5])
@pytest.mark.parametrize("cols", [1029, 2048])
def test_streaming_strided_rows_write_every_element(offset, cols):
    """A broadcast row (strided kernel, unit-stride rows) streams each row: head, blocks,
    tail per row, any output alignment, rows of odd length."""
    from tapescope.kernels.cpu.compiled import run_compiled

    rows = _big_n() // cols + 3
    rng = np.random.default_rng(cols + offset)
    xn = rng.uniform(-2, 2, (rows, cols)).astype(np.float32)
    rn = rng.uniform(-2, 2, cols).astype(np.float32)
    g = mx.compile(lambda x, r: 2 * x + 3 * r - x * r)
    prim = g(mx.array(xn), mx.array(rn))._d.node.primitive
    tape = prim.kw["tape"]
    ins = [np.asarray(np.float32(x.constant)) if x.is_constant else (xn if x.name == "A" else rn)
           for x in tape.inputs]
    backing = np.full(rows * cols + 16, np.nan, np.float32)
    out = backing[offset:offset + rows * cols].reshape(rows, cols)
    (res,) = run_compiled(tape, ins, (rows, cols), out=out)
    assert res is out
    np.testing.assert_array_equal(out, np.float32(2) * xn + np.float32(3) * rn - xn * rn)
    assert np.isnan(backing[:offset]).all() and np.isnan(backing[offset + rows * cols:]).all()
    assert _runtimes(g) == {"cpu"}


@needs_cc
def test_streaming_strided_3d_two_outputs_match_numpy():
    rng = np.random.default_rng(3)
    xn = rng.uniform(-2, 2, (3, _big_n() // (3 * 1100) + 1, 1100)).astype(np.float32)
    cn = rng.uniform(-2, 2, xn.shape[1:]).astype(np.float32)  # broadcast over the outer dim
    rn = rng.uniform(-2, 2, 1100).astype(np.float32)
    g = mx.compile(lambda x, c, r: (x * r - c, (x * r - c) * 0.5 + r))
    o1, o2 = g(mx.array(xn), mx.array(cn), mx.array(rn))
    t = xn * rn - cn
    np.testing.assert_array_equal(np.array(o1), t)
    np.testing.assert_array_equal(np.array(o2), t * np.float32(0.5) + rn)
    assert _runtimes(g) == {"cpu"}
