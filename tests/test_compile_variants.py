"""Strided and contiguous kernel variants build and run as C (no silent numpy fallback),
whatever letters the tape gives its inputs; results against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapescope
import tapescope.core as mx
from tapescope.core.fusion import tapes
from tapescope.kernels.cpu import compiler

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
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_in=st.integers(2, 20), layout=st.sampled_from(["row", "col", "transposed", "3d"]),
       seed=st.integers(0, 2**16))
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
