"""``tapescope.check``'s report as HTML: the verdict, the outputs' (and every node's) table
against JAX, how the reference was made and the first divergence with its inputs.

It reads a ``check.report.CheckReport`` (the notebook layer's record: ``headline()``,
``verdict()``, ``COLUMNS`` / ``row(c)``, ``reference_lines()``, ``first_divergence``,
``no_reference``); nothing here reaches the notebook layer."""

from __future__ import annotations

from typing import Any

from .theme import esc

__all__ = ["check_html"]

# a row's status cell (the report's words) -> its pale background; each carries its own dark
# text (a dark theme's light text on them was unreadable: nbconvert's dark page, JupyterLab's)
_STATUS_COLOURS = {"pass": "#d4f4d4", "fail": "#f8d0d0", "no reference": "#f4ecc8"}


def _table(rep: Any, comps: list, title: str) -> str:
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


def check_html(rep: Any) -> str:
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
