"""One array of tapescope's against JAX's: the numbers of a ``Comparison`` (its record, with
the report's text and HTML, is ``tapescope.viz.check``'s).

The numbers: max abs error, max rel error (against the JAX value), the largest distance in
units in the last place for floating outputs, and pass / fail under dtype-aware tolerances
(``|x - ref| <= atol + rtol * |ref|``, NaN equal to NaN, infinities equal when they agree).
"""

from __future__ import annotations

from typing import Optional

import ml_dtypes
import numpy as np

from tapescope.kernels.backends import host_array

_BF16 = np.dtype(ml_dtypes.bfloat16)

# dtype name -> (rtol, atol) used when check() is not given them.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-12),
    "complex128": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "complex64": (1e-5, 1e-6),
    "float16": (5e-3, 1e-3),
    "bfloat16": (3e-2, 1e-2),
}


def default_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for a dtype: a few ulps for floats, exact (0, 0) for integers and bool."""
    return DEFAULT_TOLERANCES.get(np.dtype(dtype).name, (0.0, 0.0))


def _is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype) == _BF16 or np.dtype(dtype).kind in "fc"


def _ordered(x: np.ndarray) -> np.ndarray:
    """Float bits mapped to integers that count ulps monotonically (+0 and -0 both 0)."""
    bits = x.view({2: np.int16, 4: np.int32, 8: np.int64}[x.dtype.itemsize]).astype(np.int64)
    mag = bits & np.int64((1 << (x.dtype.itemsize * 8 - 1)) - 1)
    return np.where(bits < 0, -mag, mag)


def ulp_distance(actual: np.ndarray, expected: np.ndarray) -> Optional[int]:
    """Largest distance in ulps of the array's float dtype (NaN pairs skipped; None if no
    finite comparison is possible)."""
    w = ulp_worst(actual, expected)
    return None if w is None else w[0]


def ulp_worst(actual: np.ndarray, expected: np.ndarray) -> Optional[tuple]:
    """(largest ulp distance, the index where it is) over the non-NaN pairs; a complex
    array's worse part (real or imaginary). None if no finite comparison is possible."""
    if actual.dtype.kind == "c":
        parts = [ulp_worst(actual.real.copy(), expected.real.copy()),
                 ulp_worst(actual.imag.copy(), expected.imag.copy())]
        parts = [p for p in parts if p is not None]
        return max(parts, key=lambda p: p[0]) if parts else None
    a, e = np.ascontiguousarray(actual), np.ascontiguousarray(expected.astype(actual.dtype))
    with np.errstate(invalid="ignore"):
        keep = ~(np.isnan(a.astype(np.float64)) | np.isnan(e.astype(np.float64)))
    if not keep.any():
        return None
    d = np.abs(_ordered(a).astype(np.float64) - _ordered(e).astype(np.float64))
    d = np.where(keep, d, -1.0)
    i = int(np.argmax(d))
    # (ascontiguousarray makes a 0-d array 1-d: the index is the input's own)
    at = tuple(int(j) for j in np.unravel_index(i, actual.shape)) if actual.ndim else ()
    return int(d.reshape(-1)[i]), at


def preview(x: Optional[np.ndarray]) -> str:
    """A short printout of an array's values."""
    if x is None:
        return "—"
    with np.printoptions(threshold=8, edgeitems=2, precision=6, linewidth=100):
        return np.array2string(host_array(x), separator=", ")


def compare(label: str, primitive: str, actual: np.ndarray, expected: Optional[np.ndarray],
            rtol: Optional[float], atol: Optional[float], reason: str = ""):
    """Compare tapescope's ``actual`` (host or device data) against JAX's ``expected``
    (None: no reference): a ``viz.check.Comparison``."""
    from tapescope.viz.check import FAIL, NO_REFERENCE, PASS, Comparison

    actual = host_array(actual)
    c = Comparison(label, primitive, tuple(actual.shape), actual.dtype.name)
    drt, dat = default_tolerance(actual.dtype)
    c.rtol = drt if rtol is None else float(rtol)
    c.atol = dat if atol is None else float(atol)
    c.actual_preview = preview(actual)
    if expected is None:
        c.status, c.reason = NO_REFERENCE, reason or "no JAX reference"
        return c
    expected = np.asarray(expected)
    c.expected_preview = preview(expected)
    if expected.shape != actual.shape:
        c.status = FAIL
        c.reason = f"shape {actual.shape} vs JAX {expected.shape}"
        return c
    if expected.dtype != actual.dtype:
        expected = expected.astype(actual.dtype)
    if actual.size == 0:
        c.status, c.max_abs, c.max_rel = PASS, 0.0, 0.0
        c.ulp = 0 if _is_float(actual.dtype) else None
        return c
    wide = np.complex128 if actual.dtype.kind == "c" else np.float64
    a, e = actual.astype(wide), expected.astype(wide)
    with np.errstate(all="ignore"):
        same = (actual == expected) if actual.dtype.kind in "biu" else (a == e)
        both_nan = np.isnan(a) & np.isnan(e) if _is_float(actual.dtype) else np.zeros_like(same)
        agree = same | both_nan
        err = np.where(agree, 0.0, np.abs(a - e))
        err = np.where(np.isnan(err), np.inf, err)  # NaN on one side only, or inf - inf
        mag = np.abs(e)
        rel = np.where(err == 0, 0.0, np.where(mag > 0, err / np.where(mag > 0, mag, 1), np.inf))
        if actual.dtype.kind in "biu" and c.rtol == 0 and c.atol == 0:
            close = same
        else:
            close = agree | (err <= c.atol + c.rtol * mag)
    c.max_abs = float(err.max())
    c.max_rel = float(rel.max())
    if _is_float(actual.dtype):
        w = ulp_worst(actual, expected)
        if w is not None:
            c.ulp, c.ulp_at = w
            c.ulp_values = (actual[c.ulp_at].item(), expected[c.ulp_at].item())
    c.mismatches = int((~close).sum())
    c.status = PASS if c.mismatches == 0 else FAIL
    if c.mismatches:
        nan_only = int((np.isnan(a) != np.isnan(e)).sum()) if _is_float(actual.dtype) else 0
        c.reason = f"{c.mismatches} of {actual.size} elements outside tolerance"
        if nan_only:
            c.reason += f" ({nan_only} NaN on one side only)"
    return c
