"""A ``%%mlx`` cell's report as static HTML: the summary, the Graph, Kernels, Check, Memory,
Cache and Events sections, and the pieces the live panel and the ``%mlx_*`` line magics
show. It reads a ``viz.cell.CellReport`` (the record of what the cell did, which the magic
fills) and the timeline records it holds; nothing here reaches the notebook layer."""

from __future__ import annotations

import html
from collections import Counter
from typing import Any

from tapescope.kernels.primitives import REGISTRY
from tapescope.kernels.roofline import summary as roofline_summary

from .check import CheckReport, check_html
from .records import (
    ALLOC_KINDS, EVENT_KINDS, cache_summary, distinct_kernels, eval_progress, memory_summary,
    primitive_counts, progress_text,
)
from .sources import sources_html
from .theme import details, fmt_bytes, fmt_delta_bytes, fmt_ns, plot_html, short_name, style_tag, table

MAX_ROWS = 200  # rows of a record table before "... more"
PAGE_ROWS, PAGES = 20, 9  # a long record table: 20 rows, then up to 9 closed pages of 20


def _is_elementwise(name: str) -> bool:
    """Whether the primitive ``name`` is one ``mx.compile`` fuses (its definition says)."""
    d = REGISTRY.get(name)
    return d is not None and d.fusable


def _e(x: Any) -> str:
    return html.escape(str(x))


def _bytes(n: int) -> str:
    return fmt_bytes(n)


def record_table(head: list, rows: list, cls: str = "", limit: int = MAX_ROWS, raw: tuple = (),
                 pages: int = 0) -> str:
    """A table of ``rows`` (``viz.theme.table``), ``limit`` rows before "... more"."""
    return table(head, rows, cls, limit=limit, raw=raw, pages=pages)


def _section(title: str, body: str, open_: bool = False) -> str:
    return details(f"<b>{_e(title)}</b>", body, open_)


def _kname(name: str, width: int = 48) -> str:
    """A kernel name cut for a table cell, the full name on hover."""
    return f"<code title='{_e(name)}'>{_e(short_name(name, width))}</code>"


def memory_html(before, after, records: list) -> str:
    """Active / peak / cache memory before and after, and the allocation records."""
    rows = []
    for label in ("active", "peak", "cache"):
        b = getattr(before, label) if before is not None else None
        a = getattr(after, label)
        rows.append((label, "—" if b is None else _bytes(b), _bytes(a),
                     "—" if b is None else fmt_delta_bytes(a - b)))
    out = record_table(["memory", "before", "after", "change"], rows, "tapescope-memory")
    summ = memory_summary(records)
    out += record_table(["record", "count", "bytes"],
                  [(k, c, _bytes(n)) for k, (c, n) in summ.items() if c], "tapescope-alloc")
    recs = [r for r in records if r.kind in ALLOC_KINDS]
    if recs:
        t0 = records[0].start_ns
        out += _section(f"allocator records ({len(recs)})", record_table(
            ["at", "record", "bytes", "device"],
            [(fmt_ns(r.start_ns - t0), r.kind, _bytes(r.nbytes), r.device or "") for r in recs],
            "tapescope-alloc-records", limit=PAGE_ROWS, pages=PAGES))
    return out


def memory_plot_html(before, records: list) -> str:
    """Active / cache / peak memory over the cell (plotly's static HTML; "" without plotly or
    allocator records)."""
    from .memory import MemoryTracker, static_figure

    if before is None or not any(r.kind in ALLOC_KINDS for r in records):
        return ""
    try:
        tracker = MemoryTracker(anchor={"active": before.active, "cache": before.cache, "peak": before.peak})
        tracker.feed(records)
        return plot_html(static_figure(tracker))
    except ImportError:
        return ""


def events_html(records: list) -> str:
    """The cell's events: the timeline (plotly's static HTML) and the counts per kind."""
    try:
        from .events import snapshot_html

        return snapshot_html(records, style=False)
    except ImportError:  # plotly missing
        counts = Counter(r.kind for r in records if r.kind in EVENT_KINDS or r.kind == "primitive")
        return record_table(["kind", "count"], sorted(counts.items()), "ts-event-counts")


def cache_html(records: list, before: dict, after: dict) -> str:
    """Kernel-cache hits / misses / builds / launches / fallbacks during the records."""
    s = cache_summary(records)
    head = (f"<p>{s['hits']} hit(s), {s['misses']} miss(es), {len(s['builds'])} build(s) or load(s), "
            f"{sum(s['launches'].values())} launch(es), {len(s['fallbacks'])} numpy fallback(s); "
            f"{len(before)} → {len(after)} cached kernel(s)</p>")
    out = head
    if s["builds"]:
        out += record_table(["kernel", "from", "variant", "compile ms"],
                      [(_kname(n), o, v, f"{ms:.1f}") for n, o, v, ms in s["builds"]],
                      "tapescope-builds", raw=(0,), limit=PAGE_ROWS, pages=PAGES)
    if s["launches"]:
        out += record_table(["kernel", "launches"], [(_kname(n), c) for n, c in sorted(s["launches"].items())],
                      "tapescope-launches", raw=(0,), limit=PAGE_ROWS, pages=PAGES)
    if s["fallbacks"]:
        out += record_table(["kernel", "why numpy ran it"], [(_kname(n), w) for n, w in s["fallbacks"]],
                      "tapescope-fallbacks", raw=(0,), limit=PAGE_ROWS, pages=PAGES)
    return out


# -- the line magics' views and the running cell's status -----------------------------------
def status_html(text: str) -> str:
    """The one-line live status under a running ``%%mlx`` cell."""
    return f"<span class='tapescope-status'>{_e(text)}</span>"


def note_html(text: str) -> str:
    """A line of text, as the line magics show a message."""
    return f"<p>{_e(text)}</p>"


def titled_graphs_html(graphs: list) -> str:
    """(title, graph) pairs, each title above its picture (``%mlx graph`` of a function
    compiled for several signatures)."""
    return "".join(note_html(t) + graph_html(g) for t, g in graphs)


def memory_view_html(text: str, now, rep=None) -> str:
    """``%mlx memory``: the allocator's state (``text``), then the last ``%%mlx`` cell's
    memory before and ``now`` (``rep``: its report, None before the first)."""
    out = note_html(text)
    if rep is not None:
        out += note_html("Last %%mlx cell (before → now):") + memory_html(
            rep.run.memory_before, now, rep.run.records)
    return out


def cache_view_html(head: list, rows: list, rep=None) -> str:
    """``%mlx cache``: the kernel cache's entries (``rows`` under ``head``), then what the
    last ``%%mlx`` cell (``rep``: its report, None before the first) did to it."""
    out = note_html(f"{len(rows)} cached kernel(s)") + record_table(head, rows, "tapescope-cache")
    if rep is not None:
        out += note_html("Last %%mlx cell:") + cache_html(rep.run.records, rep.run.cache_before,
                                                          rep.run.cache_after)
    return out


def graph_html(g: Any) -> str:
    try:
        bundle = g._repr_mimebundle_()
    except Exception as e:  # noqa: BLE001 - a picture must never hide the report
        return f"<pre>{_e(g.summary())}\n({_e(e)})</pre>"
    svg = bundle.get("image/svg+xml")
    if svg:
        alt = _e(g.summary().splitlines()[0] if g.summary() else "graph")
        svg = svg.replace("<svg ", f"<svg role='img' aria-label='{alt}' ", 1)
        return f"<div class='tapescope-graph ts-graph' title='{alt}'>{svg}</div>"
    return f"<pre>{_e(bundle.get('text/plain', g.summary()))}</pre>"


def tape_html(title: str, g: Any, k: Any) -> str:
    """One fused kernel: its tape, its inputs and why fusion stopped at each."""
    steps = record_table(["node", "primitive", "dtype", "inputs"],
                   [(st[0], st[1], st[2], ", ".join(st[3])) for st in k.steps], "tapescope-tape")
    ins = record_table(["letter", "reads", "made by", "fusion stopped because"],
                 [(i.letter, g._vname(i.value), i.producer, i.reason or "—") for i in k.inputs],
                 "tapescope-tape-inputs")
    return (f"<p><b>{_e(title)}</b>: kernel {k.index} {_kname(k.name)} [{_e(k.variant)}], "
            f"shape {_e(k.shape)}, {len(k.steps)} op(s)</p>{steps}{ins}")


def kernel_html(k: Any, title: str = "") -> str:
    """One fused kernel's generated source in every dialect, side by side (C, CUDA, Metal)."""
    return sources_html(k.sources, title=title or k.symbol, focus=k.name)


def roofline_of(records: list) -> list:
    """The kernels that ran during ``records``, each placed on its device's roofline
    (``tapescope.kernels.roofline``: the first call measures the machine)."""
    from tapescope.kernels import roofline

    return roofline.place(records)


def roofline_html(records: list, figure: bool = True) -> str:
    """The roofline of the kernels that ran (``figure``: with plotly's static figure)."""
    from .roofline import roofline_html as html_of

    placed = roofline_of(records)
    return html_of(placed, figure=figure) if placed else ""


def kernels_section(graphs: list, records: list, tapes: bool, sources: bool,
                     figure: bool = True) -> str:
    """The Kernels tab: the roofline of the kernels that ran (``figure``: with its static
    figure; first when one of them streams, else last), each fused kernel once, its tape (``tapes``) and its sources in every dialect
    side by side (``sources``); then kernels the cell built or launched that no graph drew
    (e.g. inside a compiled function), from the kernel cache."""
    from tapescope.kernels.cache_entries import entry_sources, kernel_cache

    from .cache import base_name

    roof = roofline_html(records, figure) if (tapes or sources) else ""
    # the roofline first when a kernel streams; after the tapes when all are launch-bound
    first = any(p.streams for p in roofline_of(records)) if roof else False
    out, seen = [roof] if first else [], set()
    for title, g in graphs:  # a compiled function's program and the lazy graph share kernels
        for k in g.kernels:
            if k.symbol in seen:
                continue
            seen.add(k.symbol)
            if tapes:
                out.append(tape_html(title, g, k))
            if sources:
                out.append(kernel_html(k))
        for op, spec in g.generated_kernels:  # reductions' own kernels (codegen/reduce_kernels.py)
            if sources and spec.name not in seen:
                seen.add(spec.name)
                out.append(f"<p>{_kname(spec.name)} ({_e(op.primitive)}, generated)</p>"
                           + sources_html(spec.sources(), title=spec.name, focus=spec.name))
    if sources:
        used = {r.name for r in records if r.kind in ("kernel_build", "kernel_launch")}
        for e in kernel_cache():
            if e["name"] in used and e["name"] not in seen and e["source"]:
                seen.add(e["name"])
                out.append(f"<p>{_kname(e['name'])} ({_e(e['runtime'])}, {_e(e['variant'])})</p>"
                           + sources_html(entry_sources(e), title=e["name"], focus=base_name(e)))
    if roof and not first:
        out.append(roof)
    return "".join(out)


def results_html(rep) -> str:
    """The results table: each array's value on every device, and their differences."""
    cols = [r for r in rep.runs]
    head = "".join(f"<th>{_e(r.device)}</th>" for r in cols)
    info = "".join(
        f"<td>{_e(r.unavailable) if r.unavailable else f'{r.wall_s * 1e3:.1f} ms'}</td>" for r in cols)
    rows = [f"<tr><th>time</th>{info}</tr>"]
    names: list = []
    for r in cols:
        names += [a.name for a in r.arrays if a.name not in names]
    for n in names:
        cells = []
        for r in cols:
            a = r.array(n)
            cells.append("<td>—</td>" if a is None else
                         f"<td><pre>{_e(a.text)}</pre><small>{_e(a.shape)} {_e(a.dtype)}</small></td>")
        rows.append(f"<tr><th>{_e(n)}</th>{''.join(cells)}</tr>")
    diffs = rep.differences()
    extra = ""
    if diffs:
        extra = record_table(["array", "same shape/dtype", "max |diff|", "allclose"],
                       [(n, s, "—" if d is None else f"{d:.3g}", c) for n, s, d, c in diffs],
                       "tapescope-diff")
    return (f"<table class='tapescope-results'><thead><tr><th></th>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{extra}")


def look_at(rep, r) -> list:
    """What a reader should look at first, most important first (HTML strings)."""
    out = []
    prims = primitive_counts(r.records)
    kernels = distinct_kernels(r.graphs)
    cs = cache_summary(r.records)
    check = r.check
    if isinstance(check, CheckReport) and not check.passed:
        out.append("<b>Check</b>: tapescope and JAX disagree — the Check tab names the first "
                   "node that diverges.")
    build_ms = sum(ms for *_, ms in cs["builds"])
    if cs["misses"] and build_ms > 0.3 * r.wall_s * 1e3:
        out.append(f"<b>Kernel builds</b> took {build_ms:.0f} ms of the cell's {r.wall_s * 1e3:.0f} ms; "
                   "a second run loads them from the cache (Cache tab).")
    if kernels:
        out.append(f"<b>{len(kernels)} fused kernel(s)</b>: their tapes, why fusion stopped and the "
                   "generated source are in the Kernels tab.")
    elif not rep.compiled and sum(prims.values()) > 8:
        elementwise = sum(c for n, c in prims.items() if _is_elementwise(n))
        if elementwise > 4:
            out.append(f"{sum(prims.values())} primitives ran one by one ({elementwise} elementwise): "
                       "<code>%%mlx --compile</code> or <code>mx.compile</code> fuses elementwise chains "
                       "into one kernel.")
    streams = {x.stream for x in r.records if x.kind == "primitive"}
    if len(streams) > 1:
        out.append(f"The cell ran on {len(streams)} streams: the Events tab draws the waits between them.")
    if r.memory_before is not None and r.memory_after is not None:
        grew = r.memory_after.active - r.memory_before.active
        if grew > 64 * 1024 * 1024:
            out.append(f"Active memory grew by {_bytes(grew)} (Memory tab: the largest buffers and "
                       "the node that made each).")
    if r.graphs and not out:
        out.append("The Graph tab draws what the cell built.")
    return out


def summary_html(rep, r=None) -> str:
    """The Summary tab: what ran, how long, peak memory, the check's verdict, the fused
    kernels, what failed and where, and what to look at first."""
    r = r or rep.run
    if r.unavailable:
        return f"<p>{_e(r.unavailable)}</p>"
    prims = primitive_counts(r.records)
    kernels = distinct_kernels(r.graphs)
    evals = eval_progress(r.records)
    parts = []
    msg = progress_text(r)
    if msg:
        parts.append(f"<div class='ts-error'><b>{_e(msg)}</b></div>")
    elif r.error is not None:
        where = rep.error_where(r)
        loc = (f" at line {where[0]} of the cell: <code>{_e(where[1])}</code>" if where else "")
        parts.append(f"<div class='ts-error'><b>The cell raised {_e(type(r.error).__name__)}: "
                     f"{_e(r.error)}</b>{loc}. Its traceback is below the report; this is what ran "
                     "before it.</div>")
    top = ", ".join(f"{_e(n)} ×{c}" for n, c in prims.most_common(6))
    rows = [("ran", f"{sum(prims.values())} primitive run(s) in {len(evals)} eval(s)"
             + (f": {top}" if top else "")),
            ("took", fmt_ns(r.wall_s * 1e9))]
    if r.memory_after is not None:
        rows.append(("memory", f"peak {_bytes(r.memory_after.peak)}, active {_bytes(r.memory_after.active)}"
                     f", cache {_bytes(r.memory_after.cache)}"))
    if r.check is not None:
        if isinstance(r.check, CheckReport):
            ok = r.check.passed
            verdict = r.check.verdict()
            rows.append(("check", f"<span class='{'ts-ok' if ok else 'ts-bad'}'>"
                         f"{'agrees with JAX' if ok else 'differs from JAX'}</span>"
                         + (f" <span class='ts-muted'>({_e(verdict)})</span>" if verdict else "")))
        else:
            rows.append(("check", _e(r.check)))
    if kernels:
        rows.append(("fused kernels", "; ".join(
            f"{_kname(k.name, 32)} ({len(k.steps)} ops, {_e(k.variant)})" for k in kernels[:4])
            + (f"; … {len(kernels) - 4} more" if len(kernels) > 4 else "")))
    cs = cache_summary(r.records)
    if cs["hits"] or cs["misses"]:
        rows.append(("kernel cache", f"{cs['hits']} hit(s), {cs['misses']} miss(es)"))
    roof = roofline_summary(roofline_of(r.records))
    if roof:
        rows.append(("roofline", _e(roof) + " (Kernels tab)"))
    parts.append(record_table(["", ""], rows, "tapescope-summary", raw=(1,)).replace(
        "<thead><tr><th></th><th></th></tr></thead>", ""))
    for n in r.notes:
        parts.append(f"<p>{_e(n)}</p>")
    look = look_at(rep, r)
    if look:
        parts.append("<p><b>Look at</b></p><ul class='ts-look'>"
                     + "".join(f"<li>{x}</li>" for x in look) + "</ul>")
    return "".join(parts)


def graphs_html(r, pickable: bool = False) -> str:
    """The pictures of ``r``'s graphs, each under its title; ``pickable``: each fused kernel
    carries ``data-pick="<graph index>:ts_kernel_<kernel index>"`` (the panel's clicks)."""
    if not pickable:
        return "".join(f"<p>{_e(t)}</p>{graph_html(g)}" for t, g in r.graphs)
    from .pick import pickable_svg

    return "".join(f"<p>{_e(t)}</p>{pickable_svg(graph_html(g), f'{i}:')}" for i, (t, g) in enumerate(r.graphs))


def sections(rep, r, pickable: bool = False) -> list:
    """(tab title, HTML) of every section that has something to show for ``r``
    (``pickable``: for the panel, fused kernels in the graph pictures are clickable and
    the roofline's figure is left to the panel's live one)."""
    out = []
    if r.unavailable:
        return out
    if "graph" in rep.show:
        body = graphs_html(r, pickable)
        prims = [x for x in r.records if x.kind == "primitive"]
        if prims:
            t0 = r.records[0].start_ns
            body += _section(f"primitives run ({len(prims)}, from the timeline)", record_table(
                ["at", "primitive", "node", "stream", "took", "bytes"],
                [(fmt_ns(p.start_ns - t0), p.name, p.node, p.stream, fmt_ns(p.end_ns - p.start_ns),
                  _bytes(p.nbytes)) for p in prims], "tapescope-primitives", limit=PAGE_ROWS, pages=PAGES),
                open_=not r.graphs)
        if body:
            out.append(("Graph", body))
    kern = kernels_section(r.graphs, r.records, "tapes" in rep.show, "kernels" in rep.show,
                            figure=not pickable)
    if kern:
        out.append(("Kernels", kern))
    if "check" in rep.show and r.check is not None:
        body = check_html(r.check) if isinstance(r.check, CheckReport) else f"<p>{_e(r.check)}</p>"
        out.append(("Check", body))
    if "memory" in rep.show and r.memory_after is not None and (
            any(x.kind in ALLOC_KINDS for x in r.records) or r.error is None):
        out.append(("Memory", memory_plot_html(r.memory_before, r.records)
                    + memory_html(r.memory_before, r.memory_after, r.records)))
    if "cache" in rep.show and (any(x.kind.startswith("kernel_") for x in r.records)):
        out.append(("Cache", cache_html(r.records, r.cache_before, r.cache_after)))
    if "events" in rep.show and any(x.kind in EVENT_KINDS or x.kind in ("primitive", "interrupt")
                                     for x in r.records):
        out.append(("Events", events_html(r.records)))
    return out


def run_html(rep, r) -> str:
    if r.unavailable:
        return ""
    parts = []
    if len(rep.runs) > 1:
        parts.append(f"<h4>{_e(r.device)}</h4>")
    parts.append(summary_html(rep, r))
    for title, body in sections(rep, r):
        parts.append(_section(title, body))
    return "".join(parts)


def report_html(rep) -> str:
    """A ``viz.cell.CellReport`` as one static HTML page: the headline, the results, and
    each device's summary and sections."""
    parts = [style_tag(), "<div class='tapescope-cell'>",
             f"<div class='ts-headline'>%%mlx{' (compiled)' if rep.compiled else ''}: "
             f"{_e(rep.run_lines(rep.run)[0])}</div>"]
    if rep.run.arrays or len(rep.runs) > 1:
        parts.append(_section("results", results_html(rep), open_=len(rep.runs) > 1))
    parts += [run_html(rep, r) for r in rep.runs]
    parts.append("</div>")
    return "".join(parts)
