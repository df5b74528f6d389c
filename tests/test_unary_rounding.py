"""Rounding and signed zeros of unary float ops, eager and in generated C kernels.

- sigmoid is correctly rounded on every finite float16 and bfloat16 input, and on a dense
  sample of float32 inputs (``sigmoid(17.0)`` is 0.99999994, not 1.0).
- the odd functions keep the sign of zero: ``f(-0.0)`` is -0.0, as ``math`` gives it.

The sigmoid reference is float64 by another formula than the rule's (``tanh`` and ``exp``
instead of ``1 / (1 + exp(-x))``), rounded once to the type. It is off by a few float64 ulps,
so each case also rounds the reference nudged down and up by more than that: where both
agree the rounding is decided and must be matched exactly; where they do not (the true
value is next to a rounding midpoint) either neighbour is accepted. numpy rounds float64 to
float16 once; ml_dtypes rounds float64 to bfloat16 through float32 (twice), so bfloat16 is
rounded here from the float64 value itself.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tapescope
import tapescope.core as mx
from tapescope.core.fusion import tapes

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = ["float16", "bfloat16", "float32", "float64"]
MARGIN = 2e-15  # relative; the reference's own error is under 1e-15


def npdt(name: str) -> np.dtype:
    return BF16 if name == "bfloat16" else np.dtype(name)


def to_mx(v: np.ndarray) -> mx.array:
    return mx.array(v, dtype=mx.float64) if v.dtype == np.float64 else mx.array(v)


def as_np(a: mx.array, dt: np.dtype) -> np.ndarray:
    """A tapescope array as numpy of dtype ``dt`` (bfloat16 goes through float32, exactly)."""
    return np.array(a.astype(mx.float32) if dt == BF16 else a).astype(dt)


def kernel_runtimes(fn) -> set:
    """The runtimes of the kernels built for ``fn``'s fused tapes ({"cpu"}: generated C)."""
    libs = {t.lib_name for p in fn.programs() for t in tapes(p)}
    return {e["runtime"] for e in tapescope.kernel_cache()
            if any(e["name"].startswith(lib + "_") for lib in libs)}


def round_to(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """float64 ``y`` rounded once, to nearest even, to ``dt``."""
    if dt != BF16:
        return y.astype(dt)
    m, e = np.frexp(y)  # y = m * 2**e with 0.5 <= |m| < 1
    q = np.maximum(e - 8, -133)  # the quantum: 8 significant bits, subnormals 2**-133
    r = np.ldexp(np.rint(np.ldexp(y, -q)), q)  # rint: half to even
    with np.errstate(over="ignore"):  # past the largest bfloat16: inf
        return np.where(np.isfinite(y), r, y).astype(BF16)  # else exact: r has 8 bits


def sigmoid64(x: np.ndarray) -> np.ndarray:
    """sigmoid in float64: ``(1 + tanh(|x|/2)) / 2`` for x >= 0, times ``exp(x)`` below."""
    x = x.astype(np.float64)
    with np.errstate(under="ignore"):
        return np.exp(np.minimum(x, 0.0)) * (0.5 + 0.5 * np.tanh(np.abs(x) / 2))


def assert_correctly_rounded(got: np.ndarray, x: np.ndarray, how: str) -> int:
    """``got`` is the reference rounded to its dtype where the reference decides the
    rounding, one of the two neighbours where it does not; returns how many it did not."""
    y = sigmoid64(x)
    lo, hi = (round_to(y * (1 + s * MARGIN), got.dtype).astype(np.float64) for s in (-1, 1))
    g = got.astype(np.float64)
    bad = (g < lo) | (g > hi)
    assert not bad.any(), (how, x[bad][:8], got[bad][:8], lo[bad][:8], hi[bad][:8])
    return int((lo != hi).sum())


def test_bfloat16_reference_rounds_once():
    """The bfloat16 rounding of this file is one round-to-nearest-even of the float64 value
    (ml_dtypes gives 1.0 for 1 + 2**-8 + 2**-30: its float32 step lands on the midpoint)."""
    y = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 3 * 2**-8 - 2**-30,
                  -(1 + 2**-8 + 2**-30), 2**-134, 3 * 2**-134, 2**-134 + 2**-160, 0.0])
    want = [1 + 2**-7, 1.0, 1 + 2**-6, 1 + 2**-7, -(1 + 2**-7), 0.0, 2**-132, 2**-133, 0.0]
    np.testing.assert_array_equal(round_to(y, BF16).astype(np.float64), want)
    # on float32 values (one rounding either way) it is ml_dtypes' rounding, bit for bit
    bits = np.random.default_rng(0).integers(0, 1 << 32, 1 << 16, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x)]
    np.testing.assert_array_equal(round_to(x.astype(np.float64), BF16).view(np.uint16),
                                  x.astype(BF16).view(np.uint16))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_sigmoid_is_correctly_rounded_on_every_half_input(name):
    """All 65,536 bit patterns, eager and in one generated kernel: every finite input
    correctly rounded (float16 had 11,077 off by an ulp), ±inf give 1 and 0, NaN +NaN."""
    dt = npdt(name)
    x = np.arange(1 << 16, dtype=np.uint16).view(dt)
    x32 = x.astype(np.float32)
    nan, fin = np.isnan(x32), np.isfinite(x32)
    fn = mx.compile(lambda v: mx.sigmoid(v * 1.0))  # * 1.0: a lone op is not fused
    with np.errstate(invalid="ignore"):  # mx.array's NaN check meets signalling NaNs
        xa = to_mx(x)
    for how, out in (("eager", mx.sigmoid(xa)), ("compiled", fn(xa))):
        got = as_np(out, dt)
        undecided = assert_correctly_rounded(got[fin], x[fin], f"{name} {how}")
        assert undecided == 0  # the float64 reference decides every rounding
        g = got.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g), nan)
        assert not np.signbit(g[nan]).any(), how  # +NaN, as MLX
        np.testing.assert_array_equal(g[np.isinf(x32)], (x32[np.isinf(x32)] > 0).astype(float))
    assert kernel_runtimes(fn) == {"cpu"}


def test_float32_sigmoid_is_correctly_rounded_on_a_dense_sample():
    """Every 4099th float32 bit pattern (each binade of both signs), plus the edges of the
    saturation to 1 and of the underflow to subnormals and 0, eager and compiled."""
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    edges = np.array([17.0, -17.0, 16.635532, 16.635534, 88.72284, -88.72284, -87.33655,
                      -103.27893, -103.97208, -104.0, -110.0, 2.0**-23, -(2.0**-23), 2.0**-149,
                      -(2.0**-149), 0.0, -0.0, 3.4028235e38, -3.4028235e38], np.float32)
    x = np.concatenate([x[np.isfinite(x)], edges])
    fn = mx.compile(lambda v: mx.sigmoid(v * 1.0))
    xa = mx.array(x)
    for how, out in (("eager", mx.sigmoid(xa)), ("compiled", fn(xa))):
        got = np.array(out)
        undecided = assert_correctly_rounded(got, x, how)
        assert undecided < 10, undecided  # only inputs whose sigmoid sits on a midpoint
        assert got[len(x) - len(edges)] == np.float32(1) - np.float32(2**-24)  # sigmoid(17)
    assert kernel_runtimes(fn) == {"cpu"}


# the odd functions whose C spelling is a libm call (or ours), with Python's value at -0.0
ODD = {"erf": math.erf, "sinh": math.sinh, "tanh": math.tanh, "arcsin": math.asin,
       "arctan": math.atan, "arcsinh": math.asinh, "arctanh": math.atanh,
       "expm1": math.expm1, "log1p": math.log1p, "sin": math.sin, "tan": math.tan}


def _odd_program(v):
    """Every op of ``ODD`` on ``v``, joined (``r == r`` or-ed) so that they fuse into one tape."""
    outs = [getattr(mx, op)(v) for op in ODD]
    level = [mx.equal(r, r) for r in outs]
    while len(level) > 1:
        level = [mx.logical_or(*level[i:i + 2]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return (*outs, level[0])


@pytest.mark.parametrize("name", FLOATS)
def test_odd_functions_keep_the_sign_of_zero(name):
    """f(-0.0) is -0.0 and f(0.0) is 0.0, eager and compiled (eager erf gave +0.0)."""
    dt = npdt(name)
    v = np.array([-0.0, 0.0] * 37, np.float32).astype(dt)  # the vector loop and its tail
    xa = to_mx(v)
    fn = mx.compile(_odd_program)
    compiled = fn(xa)
    for op, c in zip(ODD, compiled):
        want = np.signbit([ODD[op](float(e)) for e in v.astype(np.float64)])
        assert want[0] and not want[1]
        for how, out in (("eager", getattr(mx, op)(xa)), ("compiled", c)):
            got = as_np(out, dt).astype(np.float64)
            np.testing.assert_array_equal(got, 0.0, err_msg=f"{op} {name} {how}")
            np.testing.assert_array_equal(np.signbit(got), want, err_msg=f"{op} {name} {how}")
    assert kernel_runtimes(fn) == {"cpu"}
    # erfinv has no C spelling: its compiled tape runs interpreted with the numpy rules
    inv = mx.compile(lambda a: mx.erfinv(a * 1.0))
    for how, out in (("eager", mx.erfinv(xa)), ("compiled", inv(xa))):
        got = as_np(out, dt).astype(np.float64)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(v.astype(np.float64)),
                                      err_msg=f"erfinv {name} {how}")
