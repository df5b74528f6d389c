"""``x ** 2``, ``x ** 3``, ``x ** 4`` of float32 / half values in generated C: multiplied in
double and rounded once instead of a scalar ``powf`` call per element (which took 60x the
rest of a GELU kernel): within an ulp of the exact power, with pow's zeros, infinities and
NaN; float64 and other exponents keep ``pow``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from tapescope.kernels.codegen.render import CDialect, renderer
from tapescope.kernels.cpu import compiler

pytestmark = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-45, -1e-45, 1e-20,
                    -1e-13, 7.0, -2.5, 1.0, -1.0], np.float32)


def _tape(fn, x):
    """The fused tape of ``fn`` (an op follows the power, so that there is a tape)."""
    return mx.compile(lambda x: fn(x) + 1)(mx.array(x))._d.node.primitive.kw["tape"]


@settings(max_examples=15, deadline=None)
@given(n=st.sampled_from([2, 3, 4]), seed=st.integers(0, 2 ** 16),
       scale=st.sampled_from([1e-12, 1.0, 1e6, 1e13]))
def test_small_float32_powers_are_within_an_ulp_of_the_exact_power(n, seed, scale):
    xn = np.concatenate([(np.random.default_rng(seed).standard_normal(4096) * scale)
                         .astype(np.float32), SPECIAL])
    got = np.array(_POW[n](mx.array(xn)))
    with np.errstate(all="ignore"):
        exact = np.power(xn.astype(np.float64), n)  # exact for n <= 2, else within 2^-53
        ref32 = np.power(xn, np.float32(n))
    fin = np.isfinite(exact) & (np.abs(exact) < np.finfo(np.float32).max)
    ulp = np.spacing(np.abs(exact[fin]).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(got[fin] - exact[fin]) <= ulp)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref32))
    big = ~fin & ~np.isnan(exact)
    np.testing.assert_array_equal(got[big], ref32[big])  # overflow to +-inf as powf
    np.testing.assert_array_equal(np.signbit(got), np.signbit(ref32))


_POW = {n: mx.compile(lambda x, n=n: x ** n) for n in (2, 3, 4)}


def test_the_kernel_multiplies_only_where_it_is_exact_enough():
    x32 = np.ones(8, np.float32)
    src = CDialect().render(_tape(lambda x: x ** 3, x32), "k", True, 1, False)
    assert "powf" not in src and "(double)tmp_A * (double)tmp_A * (double)tmp_A" in src
    for fn, x in ((lambda x: x.astype(mx.float64) ** 3, x32),  # double: pow
                  (lambda x: x ** 5, x32), (lambda x: x ** 2.5, x32), (lambda x: x ** x, x32)):
        src = CDialect().render(_tape(fn, x), "k", True, 1, False)
        assert "pow" in src and " * (double)" not in src
    msl = renderer("metal").render(_tape(lambda x: x ** 3, x32), "k", True, 1, False)
    assert "pow" in msl and "double" not in msl  # MSL has no double: pow stays


def test_half_types_round_once_more_to_their_precision():
    for dt in (mx.float16, mx.bfloat16):
        xn = np.linspace(-3, 3, 64, dtype=np.float32)
        x = mx.array(xn).astype(dt)
        got = np.array(mx.compile(lambda x: x ** 3)(x).astype(mx.float32))
        ref = np.array((x.astype(mx.float32) ** 3).astype(dt).astype(mx.float32))  # uncompiled
        np.testing.assert_allclose(got, ref, rtol=2 ** -7, atol=0)
