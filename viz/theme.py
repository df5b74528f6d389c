"""What every tapescope HTML view shares: units, escaping, tables, and one stylesheet drawn
with JupyterLab's CSS variables (so light and dark themes both read), with fallbacks for
nbconvert and GitHub where those variables are not defined; whether a kernel shows widgets
(``in_kernel``) and a widget shown after its snapshot (``show``)."""

from __future__ import annotations

import html
import re
from typing import Any, Iterable, Optional

__all__ = ["CSS", "style_tag", "esc", "fmt_bytes", "fmt_delta_bytes", "fmt_ns", "table",
           "short_name", "details", "plot_html", "in_kernel", "show"]


def esc(x: Any) -> str:
    """``x`` as HTML text."""
    return html.escape(str(x))


def fmt_bytes(n: Optional[int]) -> str:
    """Bytes in the largest unit that keeps the figure >= 1 (B, KiB, MiB, GiB)."""
    if n is None:
        return "—"
    n = int(n)
    x = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            s = f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
            return ("-" if n < 0 else "") + s
        x /= 1024
    return str(n)


def fmt_delta_bytes(n: int) -> str:
    """A change in bytes, signed, in the same units as ``fmt_bytes``."""
    return ("+" if n > 0 else "±" if n == 0 else "") + fmt_bytes(n)


def fmt_ns(ns: float) -> str:
    """A duration in ns, µs, ms or s (three significant figures)."""
    ns = float(ns)
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if a < 1e9:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e9:.3g} s"


def short_name(name: str, width: int = 40) -> str:
    """A kernel name cut to ``width`` characters (head … tail); the full name goes in a tooltip."""
    name = str(name)
    if len(name) <= width:
        return name
    keep = width - 1
    return name[: keep * 2 // 3] + "…" + name[-(keep - keep * 2 // 3):]


def table(head: list, rows: list, cls: str = "", limit: int = 20, total: Optional[int] = None,
          raw: Iterable[int] = (), picks: Optional[list] = None, pages: int = 0) -> str:
    """An HTML table of at most ``limit`` rows, then a row saying how many more there are.
    Columns listed in ``raw`` hold HTML already (tooltips, code); ``picks``: one key per row,
    written as the row's ``data-pick`` (rows a ``PickHTML`` view makes clickable). ``pages``:
    the rows past the first ``limit`` go into up to ``pages`` more pages of ``limit`` rows,
    each a closed section (paging without JavaScript, so static snapshots page too)."""
    raw = set(raw)
    h = "".join(f"<th>{esc(c)}</th>" for c in head)

    def body(lo: int, hi: int) -> str:
        return "".join(
            (f"<tr data-pick='{esc(picks[j])}'>" if picks is not None else "<tr>")
            + "".join(f"<td>{c if i in raw else esc(c)}</td>" for i, c in enumerate(rows[j]))
            + "</tr>" for j in range(lo, min(hi, len(rows))))

    def wrap(inner: str) -> str:
        return (f"<div class='ts-scroll'><table class='ts-table {cls}'><thead><tr>{h}</tr></thead>"
                f"<tbody>{inner}</tbody></table></div>")

    n = len(rows) if total is None else total
    shown = min(len(rows), limit * (1 + max(pages, 0)))
    more = (f"<tr><td class='ts-more' colspan='{len(head)}'>… {n - shown} more (of {n})</td></tr>"
            if n > shown else "")
    if pages <= 0 or len(rows) <= limit:
        return wrap(body(0, limit) + more)
    out = wrap(body(0, limit))
    for lo in range(limit, shown, limit):
        hi = min(lo + limit, shown)
        last = hi >= shown
        out += details(f"rows {lo + 1}–{hi} of {n}", wrap(body(lo, hi) + (more if last else "")),
                       cls="ts-page")
    return out


def details(title: str, body: str, open_: bool = False, cls: str = "") -> str:
    """A collapsible section, closed unless ``open_``."""
    return (f"<details class='ts-section {cls}'{' open' if open_ else ''}><summary>{title}</summary>"
            f"{body}</details>")


# Colours: JupyterLab variables first, light fallbacks after. Status colours are translucent
# tints over the theme's own background, so the theme's text colour stays readable on them.
CSS = """
.tapescope, .tapescope-cell { color: var(--jp-content-font-color1, #1f2937);
  font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: 13px;
  max-width: 100%; box-sizing: border-box; overflow-wrap: anywhere; }
.tapescope *, .tapescope-cell * { box-sizing: border-box; }
.tapescope .ts-scroll, .tapescope-cell .ts-scroll { max-width: 100%; overflow-x: auto; }
.tapescope table, .tapescope-cell table { border-collapse: collapse; margin: 4px 0 8px 0;
  font-size: 12px; max-width: 100%; }
.tapescope th, .tapescope td, .tapescope-cell th, .tapescope-cell td {
  border: 1px solid var(--jp-border-color2, #e5e7eb) !important; padding: 2px 6px !important;
  text-align: left !important; vertical-align: top !important;
  color: var(--jp-content-font-color1, #1f2937); }
.tapescope th, .tapescope-cell th { background: var(--jp-layout-color2, #f3f4f6); }
.tapescope .ts-roofline td, .tapescope-cell .ts-roofline td, .tapescope .ts-roofline th,
.tapescope-cell .ts-roofline th { white-space: nowrap; overflow-wrap: normal; }
.tapescope .ts-roofline td:last-child, .tapescope-cell .ts-roofline td:last-child {
  white-space: normal; min-width: 9em; }
.tapescope td.num, .tapescope-cell td.num { text-align: right; font-variant-numeric: tabular-nums; }
.tapescope .ts-more, .tapescope-cell .ts-more { color: var(--jp-content-font-color2, #6b7280);
  font-style: italic; }
.tapescope code, .tapescope-cell code { font-family: var(--jp-code-font-family, monospace);
  font-size: 11px; word-break: break-all; }
.tapescope pre, .tapescope-cell pre { white-space: pre-wrap; word-break: break-all;
  max-width: 100%; margin: 2px 0; font-size: 11px;
  font-family: var(--jp-code-font-family, monospace);
  background: var(--jp-layout-color2, #f6f8fa); color: var(--jp-content-font-color1, #1f2937);
  padding: 4px 6px; border-radius: 3px; }
.tapescope .ts-section > summary, .tapescope-cell .ts-section > summary { cursor: pointer;
  font-weight: 600; margin: 4px 0; }
.tapescope .ts-headline, .tapescope-cell .ts-headline { font-size: 14px; font-weight: 600; margin: 4px 0; }
.tapescope .ts-look, .tapescope-cell .ts-look { margin: 4px 0 4px 18px; padding: 0; }
.tapescope .ts-ok, .tapescope-cell .ts-ok, .tapescope-cell .tapescope-check td[style*="#d4f4d4"] {
  background: rgba(34, 197, 94, 0.22) !important; color: var(--jp-content-font-color1, #1f2937); }
.tapescope .ts-bad, .tapescope-cell .ts-bad, .tapescope-cell .tapescope-check td[style*="#f8d0d0"] {
  background: rgba(239, 68, 68, 0.25) !important; color: var(--jp-content-font-color1, #1f2937); }
.tapescope-cell .tapescope-check td[style*="#f4ecc8"] {
  background: rgba(234, 179, 8, 0.25) !important; color: var(--jp-content-font-color1, #1f2937); }
.tapescope .ts-error, .tapescope-cell .ts-error { border-left: 4px solid #dc2626; padding: 4px 8px;
  background: rgba(239, 68, 68, 0.12); margin: 4px 0; }
.tapescope .ts-muted, .tapescope-cell .ts-muted { color: var(--jp-content-font-color2, #6b7280); }
.tapescope .ts-swatch, .tapescope-cell .ts-swatch { display: inline-block; width: 10px; height: 10px;
  border-radius: 2px; margin-right: 4px; vertical-align: middle; }
.ts-graph { max-width: 100%; overflow: auto;
  max-height: 640px; border: 1px solid var(--jp-border-color2, #e5e7eb);
  background: #ffffff; border-radius: 3px; }
.ts-graph svg { max-width: none; }
.tapescope .ts-source .highlight, .tapescope-cell .ts-source .highlight { max-width: 100%; }
.tapescope .ts-columns { display: flex; flex-wrap: wrap; gap: 8px; }
.tapescope .ts-columns > div { flex: 1 1 320px; min-width: 0; }
.tapescope .tapescope-kernel-sources, .tapescope-cell .tapescope-kernel-sources {
  table-layout: fixed; width: 100%; }
.tapescope .tapescope-kernel-sources td, .tapescope-cell .tapescope-kernel-sources td { overflow: hidden; }
.tapescope .tapescope-kernel-sources caption, .tapescope-cell .tapescope-kernel-sources caption {
  caption-side: top; text-align: left; }
.tapescope [data-pick], .tapescope-cell [data-pick] { cursor: pointer; }
.tapescope tr[data-pick]:hover td, .tapescope-cell tr[data-pick]:hover td {
  background: rgba(37, 99, 235, 0.10); }
.tapescope tr.ts-picked td, .tapescope-cell tr.ts-picked td { background: rgba(37, 99, 235, 0.20) !important; }
.ts-graph g.ts-pick:hover path, .ts-graph g.ts-pick:hover polygon { stroke-width: 3; }
.ts-graph g.cluster.ts-picked path, .ts-graph g.cluster.ts-picked polygon { stroke: #2563eb; stroke-width: 3.5; }
.tapescope .ts-page > summary, .tapescope-cell .ts-page > summary { font-weight: normal;
  color: var(--jp-content-font-color2, #6b7280); }
.tapescope .plotly-graph-div:empty, .tapescope-cell .plotly-graph-div:empty { display: none; }
.tapescope .ts-plot, .tapescope-cell .ts-plot { max-width: 100%; overflow-x: auto; }
.tapescope .ts-source > .ts-muted, .tapescope-cell .ts-source > .ts-muted { display: block;
  font-size: 11px; line-height: 1.3; margin: 2px 0; }
"""


def style_tag() -> str:
    """The stylesheet as a ``<style>`` element (plus pygments' classes when installed)."""
    extra = ""
    try:
        from pygments.formatters import HtmlFormatter

        extra = HtmlFormatter(style="default").get_style_defs(".tapescope .highlight, .tapescope-cell .highlight")
        # the source box stays light in both themes (like the graph pictures), so pygments'
        # light colours and the untinted tokens read on it
        extra += ("\n.tapescope .highlight, .tapescope-cell .highlight { background: #f8f8f8; color: #1f2937;"
                  " border: 1px solid var(--jp-border-color2, #e5e7eb); border-radius: 3px; }"
                  "\n.tapescope .highlight pre, .tapescope-cell .highlight pre { background: transparent;"
                  " color: #1f2937 !important; }"
                  "\n.tapescope .highlight .err, .tapescope-cell .highlight .err { border: none; }")
    except ImportError:
        pass
    return f"<style>{CSS}{extra}</style>"


def highlight(source: str, language: str = "c") -> str:
    """``source`` as highlighted HTML (pygments), or escaped text without pygments."""
    try:
        from pygments import highlight as _hl
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name

        lexer = get_lexer_by_name({"cuda": "cuda", "metal": "c++", "msl": "c++"}.get(language, language))
        return _hl(source, lexer, HtmlFormatter(nowrap=False))
    except Exception:  # noqa: BLE001 - highlighting is decoration
        return f"<pre>{esc(source)}</pre>"


def collapsed_source(source: str, language: str = "c", lines: int = 12, focus: str = "") -> str:
    """``lines`` lines of ``source`` (cut at a line, never mid-token), from the first line that
    contains ``focus`` (a kernel's name: its signature, past the includes and helpers) or from
    the top; the whole source in a closed section below."""
    all_lines = source.splitlines()
    at = next((i for i, ln in enumerate(all_lines) if focus and focus in ln), 0)
    if at == 0 and len(all_lines) <= lines:
        return f"<div class='ts-source'>{highlight(source, language)}</div>"
    head = "\n".join(all_lines[at:at + lines])
    note = (f"<span class='ts-muted'>from line {at + 1} (the kernel; {at} lines of includes and "
            f"helpers above)</span>" if at else "")
    more = details(f"show all {len(all_lines)} lines", highlight(source, language))
    return f"<div class='ts-source'>{note}{highlight(head, language)}{more}</div>"


def plot_html(fig: Any) -> str:
    """A plotly figure as static HTML: plotly's own div and script (plotly.js from its CDN, the
    figure's data inline), as nbconvert HTML shows it; where scripts do not run (GitHub, an
    untrusted notebook) the empty div is hidden and the tables beside it carry the figures.
    "" for None (plotly missing)."""
    if fig is None:
        return ""
    import plotly.io as pio

    return ("<div class='ts-plot'>" + pio.to_html(
        fig, full_html=False, include_plotlyjs="cdn", default_width="100%",
        default_height=f"{int(fig.layout.height or 260)}px",
        config={"displaylogo": False, "responsive": True}) + "</div>")


# A widget is shown as two outputs: its HTML snapshot, then the live view. In JupyterLab (and
# nbconvert's lab template) these rules hide the snapshot once the live view has rendered, and
# hide the live view's "Loading widget…" / "Error displaying widget: model not found" text when
# it cannot render (a notebook reopened without its kernel); where styles do not apply (GitHub),
# the snapshot simply shows.
FALLBACK_CSS = (
    ".jp-OutputArea-child:has(.tapescope-snapshot):has(~ .jp-OutputArea-child .tapescope-live)"
    " { display: none; }\n"
    ".jp-OutputArea-child:has(.tapescope-snapshot) ~ .jp-OutputArea-child"
    " > .jp-OutputArea-output.jupyter-widgets:not(:has(*)) { display: none; }\n")  # (:has may not nest)


def snapshot_output(snapshot_html: str) -> dict:
    """The mime bundle of a widget's snapshot output (shown until the live view renders)."""
    return {"text/html": f"<style>{FALLBACK_CSS}</style><div class='tapescope-snapshot'>{snapshot_html}</div>",
            "text/plain": "(tapescope: a static snapshot of the widget below)"}


def in_kernel() -> bool:
    """Whether an IPython kernel (with a frontend that can show widgets) runs this code."""
    import sys

    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return shell is not None and getattr(shell, "kernel", None) is not None
    except Exception:  # noqa: BLE001
        return False


def show(widget: Any, snapshot_html: str, what: str, handle: Any = None) -> None:
    """Display ``widget`` (an ipywidgets widget) live, after its HTML snapshot (into ``handle``,
    a display handle, when given)."""
    from IPython.display import display

    widget.add_class("tapescope-live")
    snap = snapshot_output(snapshot_html)
    if handle is not None:
        handle.update(snap, raw=True)
    else:
        display(snap, raw=True)
    view = dict(widget._repr_mimebundle_() or {})
    view["text/plain"] = f"{what} (live in JupyterLab; the snapshot above has its figures)"
    display(view, raw=True)


def inline_plotly(body: str) -> str:
    """The widget snapshots' plots load plotly.js from its CDN; a page made on a fresh machine
    may be read offline, so the first such script is replaced by plotly.js itself (from the
    installed plotly package) and the others are dropped. require.js (the lab template loads it)
    would take plotly's UMD module as an AMD module, so ``define`` is hidden while it loads."""
    tags = re.findall(r'<script[^>]*src="https://cdn\.plot\.ly/plotly-[^"]*"[^>]*></script>', body)
    if not tags:
        return body
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        return body
    inline = ("<script>window.__ts_define = window.define; window.define = undefined;</script>"
              f"<script>{get_plotlyjs()}</script>"
              "<script>window.define = window.__ts_define;</script>")
    first = body.index(tags[0])
    head, tail = body[:first], body[first + len(tags[0]):]
    for tag in set(tags):
        tail = tail.replace(tag, "")
    return head + inline + tail
