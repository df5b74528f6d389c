"""What ``tapescope.check`` found: per output (and per node) errors against JAX, as text and HTML.

The numbers: max abs error, max rel error (against the JAX value), the largest distance in
units in the last place for floating outputs, and pass / fail under dtype-aware tolerances
(``|x - ref| <= atol + rtol * |ref|``, NaN equal to NaN, infinities equal when they agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import ml_dtypes
import numpy as np

from tapescope.kernels.backends import host_array

PASS = "pass"
FAIL = "fail"
NO_REFERENCE = "no reference"

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


@dataclass
class Comparison:
    """One compared array: an output of the function or an intermediate node's output."""

    label: str  # "output 0", "out['loss']", or the node as "Exp#12"
    primitive: str  # the primitive that produced it ("" for a leaf)
    shape: tuple
    dtype: str
    status: str = NO_REFERENCE
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    ulp: Optional[int] = None
    ulp_at: Optional[tuple] = None  # the index of the largest ulp distance
    ulp_values: Optional[tuple] = None  # (tapescope's, JAX's) value there
    mismatches: int = 0
    rtol: float = 0.0
    atol: float = 0.0
    reason: str = ""
    chain_max_abs: Optional[float] = None  # every_node: error against JAX run end to end
    inputs: list = field(default_factory=list)  # (label, shape, dtype, tapescope preview, JAX preview)
    actual_preview: str = ""
    expected_preview: str = ""
    reference: str = ""  # how JAX's value was made when not by the rules alone ("jax.grad of ...")

    @property
    def passed(self) -> bool:
        return self.status == PASS


def preview(x: Optional[np.ndarray]) -> str:
    """A short printout of an array's values."""
    if x is None:
        return "—"
    with np.printoptions(threshold=8, edgeitems=2, precision=6, linewidth=100):
        return np.array2string(host_array(x), separator=", ")


def compare(label: str, primitive: str, actual: np.ndarray, expected: Optional[np.ndarray],
            rtol: Optional[float], atol: Optional[float], reason: str = "") -> Comparison:
    """Compare tapescope's ``actual`` (host or device data) against JAX's ``expected``
    (None: no reference)."""
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


def _num(x: Optional[float]) -> str:
    if x is None:
        return "—"
    if x == 0:
        return "0"
    return f"{x:.3g}"


@dataclass
class CheckReport:
    """The result of ``tapescope.check``: outputs, (optionally) every node, first divergence."""

    outputs: list
    nodes: list = field(default_factory=list)
    first_divergence: Optional[Comparison] = None
    no_reference: list = field(default_factory=list)  # primitive names without a JAX rule
    device: str = ""
    n_nodes: int = 0
    every_node: bool = False

    @property
    def passed(self) -> bool:
        """True only when every output matched JAX (a "no reference" output never passes)."""
        return bool(self.outputs) and all(c.passed for c in self.outputs) and (
            not self.every_node or all(c.status != FAIL for c in self.nodes))

    @property
    def status(self) -> str:
        if self.passed:
            return "PASS"
        if any(c.status == FAIL for c in self.outputs + self.nodes):
            return "FAIL"
        return "NO REFERENCE"

    def verdict(self) -> str:
        """The status with what it means: the tolerance it was judged by and, for a float
        result, where the largest ulp distance is and why it passed there (a large ulp
        count near zero, where an ulp is tiny, is inside the absolute tolerance)."""
        if not self.outputs:
            return self.status
        worst = [c for c in self.outputs if c.status == FAIL] or self.outputs
        c = max(worst, key=lambda c: (c.ulp or 0, c.max_abs or 0))
        tol = f"rtol {c.rtol:g}, atol {c.atol:g} for {c.dtype}"
        if c.status == FAIL:
            return f"FAIL: {c.label}: {c.reason} ({tol})"
        if c.status != PASS:
            return f"{self.status}: {c.label}: {c.reason}"
        head = f"PASS within {tol}" if len(self.outputs) == 1 else f"PASS: every output within {tol}"
        if c.ulp is None or c.ulp_at is None or c.ulp_values is None:
            return head
        a, e = c.ulp_values
        err = abs(complex(a) - complex(e))
        where = f"{c.label}[{', '.join(map(str, c.ulp_at))}]" if c.ulp_at else c.label
        text = (f"{head}; largest distance {c.ulp} ulp at {where} "
                f"(tapescope {a:.6g}, JAX {e:.6g}: off by {err:.3g})")
        if c.ulp > 16 and err <= c.atol:
            text += f", a value near zero, where an ulp is {err / c.ulp:.2g}: inside atol"
        return text

    COLUMNS = ("array", "primitive", "shape", "dtype", "max abs", "max rel", "ulp",
               "rtol / atol", "status", "note")

    def row(self, c: Comparison) -> tuple:
        """One comparison's cells, under ``COLUMNS`` (the text and the HTML tables')."""
        return (c.label, c.primitive, str(c.shape), c.dtype, _num(c.max_abs), _num(c.max_rel),
                "—" if c.ulp is None else str(c.ulp), f"{c.rtol:g} / {c.atol:g}", c.status,
                c.reason)

    def headline(self) -> str:
        """The report's first line: status, outputs, nodes, JAX's device."""
        return (f"tapescope.check: {self.status} — {len(self.outputs)} output(s), "
                f"{self.n_nodes} node(s), JAX on {self.device}")

    def reference_lines(self) -> list:
        """One line per way of making the reference other than the JAX rules alone."""
        by: dict = {}
        for c in self.outputs:
            if c.reference:
                by.setdefault(c.reference, []).append(c.label)
        return [f"reference of {', '.join(labels)}: {ref}" for ref, labels in by.items()]

    def _divergence_text(self) -> list:
        d = self.first_divergence
        if d is None:
            return []
        lines = [f"first divergence: {d.label} ({d.reason})",
                 f"  tapescope: {d.actual_preview}", f"  JAX:       {d.expected_preview}"]
        for label, shape, dtype, ts, _ in d.inputs:
            lines.append(f"  input {label} {shape} {dtype}: {ts}")
        return lines

    def __repr__(self) -> str:
        rows = [self.COLUMNS] + [self.row(c) for c in self.outputs]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.COLUMNS))]
        out = [self.headline(), self.verdict()]
        out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        if self.every_node:
            failing = [c for c in self.nodes if c.status != PASS]
            out.append(f"nodes: {sum(c.passed for c in self.nodes)} of {len(self.nodes)} agree"
                       + (f"; not passing: {', '.join(c.label + ' (' + c.status + ')' for c in failing)}"
                          if failing else ""))
        out += self.reference_lines()
        out += self._divergence_text()
        if self.no_reference:
            out.append("no reference (no JAX rule): " + ", ".join(self.no_reference))
        return "\n".join(out)

    def _repr_html_(self) -> str:
        from tapescope.viz.check import check_html

        return check_html(self)
