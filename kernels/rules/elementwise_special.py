"""Rules for the special functions numpy lacks: ``Erf`` and ``ErfInv``.

Both compute in float64 with array-module operations only (numpy and cupy share them) and
round to the input's dtype, so float32 / float16 results are correctly rounded or within an
ulp of the true value:

- erf: for |x| < 2.5 the series ``erf(x) = 2/sqrt(pi) * exp(-x^2) * sum 2^n x^(2n+1) / (2n+1)!!``
  (all terms positive, no cancellation); for |x| >= 2.5 ``1 - erfc(x)`` with erfc from its
  continued fraction, evaluated bottom-up at a fixed depth.
- erfinv: Giles' single-precision approximation ("Approximating the erfinv function",
  GPU Computing Gems, 2011) refined by Newton steps on the float64 erf above (three for
  float64, one for the narrower types).
"""

from __future__ import annotations

import math

from ..primitives import UNARY, define
from .elementwise import finish

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SERIES_TERMS = 40
_CF_DEPTH = 30
_SPLIT = 2.5


def _erf_series(xp, ax):
    """erf on ``ax`` in [0, _SPLIT): the all-positive series (in place: one buffer per term)."""
    x2 = ax * ax
    x2 *= 2.0
    term = ax.copy()
    total = ax.copy()
    for n in range(1, _SERIES_TERMS):
        term *= x2
        term /= 2 * n + 1
        total += term
    x2 *= -0.5
    total *= xp.exp(x2)
    total *= _TWO_OVER_SQRT_PI
    return total


def _erf_cf(xp, ax):
    """erf on ``ax`` >= _SPLIT (finite): 1 - erfc, erfc from its continued fraction."""
    frac = xp.zeros_like(ax)
    for k in range(_CF_DEPTH, 0, -1):
        frac += ax
        frac = xp.divide(k / 2.0, frac, out=frac)
    frac += ax
    erfc = xp.exp(-ax * ax) / math.sqrt(math.pi) / frac
    return 1.0 - erfc


def erf64(xp, x):
    """erf of a float64 array, accurate to a few float64 ulps: each element through one of
    the two forms (the series below _SPLIT, the continued fraction above it)."""
    ax = xp.abs(x)
    small = ax < _SPLIT
    res = xp.ones_like(ax)  # inf (and nan, fixed below) -> 1
    res[small] = _erf_series(xp, ax[small])
    large = ~small & xp.isfinite(ax)
    res[large] = _erf_cf(xp, ax[large])
    res = xp.where(xp.signbit(x), -res, res)  # odd: erf(-0.0) is -0.0, as math.erf
    return xp.where(xp.isnan(x), x, res)


# glibc's erff / erf: within 1 ulp (scalar calls; libmvec has no erf)
@define("Erf", family=UNARY, out=True, c="erf")
def erf(xp, a, out=None):
    return finish(erf64(xp, a.astype(xp.float64)).astype(a.dtype), out)


def _giles(xp, y):
    """Giles' single-precision erfinv approximation (float64 arithmetic)."""
    w = -xp.log((1.0 - y) * (1.0 + y))
    w1 = w - 2.5
    p1 = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p1 = c + p1 * w1
    w2 = xp.sqrt(xp.where(w >= 5.0, w, 5.0)) - 3.0
    p2 = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        p2 = c + p2 * w2
    return xp.where(w < 5.0, p1, p2) * y


def erfinv64(xp, y, steps: int = 3):
    """erfinv of a float64 array: ±inf at ±1, NaN outside [-1, 1]. Giles' approximation is
    within 1.3e-7 (relative); each Newton step roughly doubles the correct digits, so one
    step (6e-13) is enough for a result rounded to float32 or narrower."""
    inside = xp.abs(y) < 1.0
    ys = xp.where(inside, y, 0.0)
    x = _giles(xp, ys)
    for _ in range(steps):  # Newton on erf(x) - y
        err = erf64(xp, x) - ys
        x = x - err / (_TWO_OVER_SQRT_PI * xp.exp(-x * x))
    x = xp.where(y == 1.0, math.inf, x)
    x = xp.where(y == -1.0, -math.inf, x)
    return xp.where(inside | (xp.abs(y) == 1.0), x, math.nan)


@define("ErfInv", family=UNARY, out=True, kernel="erfinv",
        why={"c": "no C spelling (libm has no erfinv): a fusion boundary, run by this rule"})
def erfinv(xp, a, out=None):
    steps = 3 if a.dtype == xp.float64 else 1
    return finish(erfinv64(xp, a.astype(xp.float64), steps).astype(a.dtype), out)
