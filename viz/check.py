"""``tapescope.check``'s report: the records of what was compared (``Comparison``: one array
against JAX's; ``CheckReport``: every output, optionally every node, the first divergence),
their text form and their HTML (the verdict, the outputs' and every node's table against
JAX, how the reference was made, the first divergence with its inputs).

``tapescope.check`` (the notebook layer's ``check/``) computes the numbers and fills these
records (``check/compare.py``); nothing here reaches the notebook layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .theme import esc

__all__ = ["PASS", "FAIL", "NO_REFERENCE", "Comparison", "CheckReport", "check_html"]

PASS = "pass"
FAIL = "fail"
NO_REFERENCE = "no reference"


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
        return check_html(self)


# a row's status cell (the report's words) -> its pale background; each carries its own dark
# text (a dark theme's light text on them was unreadable: nbconvert's dark page, JupyterLab's)
_STATUS_COLOURS = {"pass": "#d4f4d4", "fail": "#f8d0d0", "no reference": "#f4ecc8"}


def _table(rep: CheckReport, comps: list, title: str) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in rep.COLUMNS)
    status = rep.COLUMNS.index("status")
    body = []
    for c in comps:
        cells = []
        for i, v in enumerate(rep.row(c)):
            colour = _STATUS_COLOURS.get(c.status) if i == status else None
            style = f' style="background:{colour};color:#1a1a1a"' if colour else ""
            cells.append(f"<td{style}>{esc(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<table class='tapescope-check'><caption>{esc(title)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def check_html(rep: CheckReport) -> str:
    """The whole report of ``tapescope.check`` (what ``CheckReport._repr_html_`` shows)."""
    parts = [f"<div class='tapescope-check-report'><b>{esc(rep.headline())}</b>",
             f"<p>{esc(rep.verdict())}</p>", _table(rep, rep.outputs, "outputs")]
    parts += [f"<p>{esc(line)}</p>" for line in rep.reference_lines()]
    if rep.every_node:
        parts.append(_table(rep, rep.nodes, "every node (JAX on tapescope's inputs)"))
    d = rep.first_divergence
    if d is not None:
        rows = "".join(f"<tr><td>{esc(lbl)}</td><td>{esc(str(sh))}</td>"
                       f"<td>{esc(dt)}</td><td><pre>{esc(ts)}</pre></td>"
                       f"<td><pre>{esc(jx)}</pre></td></tr>"
                       for lbl, sh, dt, ts, jx in d.inputs)
        parts.append(
            f"<p><b>first divergence: {esc(d.label)}</b> — {esc(d.reason)}</p>"
            f"<pre>tapescope: {esc(d.actual_preview)}\n"
            f"JAX:       {esc(d.expected_preview)}</pre>"
            "<table class='tapescope-check-inputs'><caption>its inputs</caption><thead><tr>"
            "<th>input</th><th>shape</th><th>dtype</th><th>tapescope</th><th>JAX (end to end)</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>")
    if rep.no_reference:
        parts.append("<p>no reference (no JAX rule): " + esc(", ".join(rep.no_reference)) + "</p>")
    parts.append("</div>")
    return "".join(parts)
