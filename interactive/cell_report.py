"""What a ``%%mlx`` cell did, read off the timeline, rendered as static HTML and SVG.

A ``CellReport`` holds one ``DeviceRun`` per device the cell ran on: the timeline records made
while it ran (``tapescope.record()``), the arrays it assigned or evaluated, the compiled
functions it traced, memory and kernel-cache figures before and after, the check report and
the error that ended it. Every section (graph, tapes, kernels, check, memory, cache, events)
is computed from those records and public functions only; nothing here reaches into the
scheduler or the allocator.
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

__all__ = ["SECTIONS", "Memory", "ArrayResult", "DeviceRun", "CellReport", "memory_now",
           "cache_counts", "eval_progress", "primitive_counts", "memory_summary",
           "cache_summary", "events_html", "memory_html", "cache_html"]

SECTIONS = ("graph", "tapes", "kernels", "check", "memory", "cache", "events")
ALLOC_KINDS = ("alloc", "cache_reuse", "free_to_cache", "free", "evict", "release")
EVENT_KINDS = ("event_signal", "event_wait", "fence_update", "fence_wait", "event_detach")
MAX_ROWS = 200  # rows of a record table before "... more"
PAGE_ROWS, PAGES = 20, 9  # a long record table: 20 rows, then up to 9 closed pages of 20


@dataclass
class Memory:
    """Allocator figures at one moment (bytes): active, peak and buffer-cache memory."""

    active: int
    peak: int
    cache: int


def memory_now() -> Memory:
    """The allocator's active / peak / cache memory now (``mx.get_*_memory``)."""
    import tapescope.core as mx

    return Memory(mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory())


def cache_counts() -> dict:
    """Kernel-cache entries now: name -> (hits, misses), the counts ``tapescope.kernel_cache()``
    lists (read without its roofline column)."""
    from tapescope.kernels.cpu import compiler

    return {e.name: (e.hits, e.misses) for e in compiler.entries()}


@dataclass
class ArrayResult:
    """One array the cell produced: its name, shape, dtype, printed value and data."""

    name: str
    shape: tuple
    dtype: str
    text: str
    data: Optional[np.ndarray] = field(default=None, repr=False)


@dataclass
class DeviceRun:
    """One run of the cell on one device, with everything recorded while it ran."""

    device: str
    records: list = field(default_factory=list)
    arrays: list = field(default_factory=list)  # ArrayResult
    graphs: list = field(default_factory=list)  # (title, tapescope.Graph)
    check: Any = None  # CheckReport, or a str saying why there is none
    error: Optional[BaseException] = None
    wall_s: float = 0.0
    memory_before: Optional[Memory] = None
    memory_after: Optional[Memory] = None
    cache_before: dict = field(default_factory=dict)
    cache_after: dict = field(default_factory=dict)
    unavailable: Optional[str] = None  # why the device could not run the cell
    notes: list = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        """Whether the run ended with KeyboardInterrupt."""
        return isinstance(self.error, KeyboardInterrupt)

    def array(self, name: str) -> Optional[ArrayResult]:
        """The result named ``name``, or None."""
        return next((a for a in self.arrays if a.name == name), None)


# -- reading the records ---------------------------------------------------------------------


def primitive_counts(records: list) -> Counter:
    """How many times each primitive ran."""
    return Counter(r.name for r in records if r.kind == "primitive")


def eval_progress(records: list) -> list:
    """One dict per eval: nodes (total), done (primitive records), interrupted, streams.

    An eval opens at ``eval_begin`` and closes after one ``eval_end`` per stream it ran on; an
    ``interrupt`` record marks the evals open at that moment as interrupted.
    """
    evals: list = []
    open_: list = []
    for r in sorted(records, key=lambda r: r.seq):
        if r.kind == "eval_begin":
            streams = r.detail.get("streams") or [r.stream]
            e = {"nodes": int(r.detail.get("nodes", 0)), "done": 0, "interrupted": False,
                 "done_before_interrupt": None, "streams": list(streams), "ends": len(streams),
                 "start_ns": r.start_ns, "end_ns": None}
            evals.append(e)
            open_.append(e)
        elif r.kind == "primitive" and open_:
            open_[0]["done"] += 1
        elif r.kind == "interrupt":
            for e in open_:
                e["interrupted"] = True
                if e["done_before_interrupt"] is None:
                    e["done_before_interrupt"] = e["done"]
        elif r.kind == "eval_end" and open_:
            e = open_[0]
            e["ends"] -= 1
            if r.detail.get("interrupted"):
                e["interrupted"] = True
            e["end_ns"] = r.end_ns
            if e["ends"] <= 0:
                open_.pop(0)
    for e in evals:
        del e["ends"]
    return evals


def memory_summary(records: list) -> dict:
    """kind -> (count, bytes) for the allocator records (alloc, cache_reuse, free, ...)."""
    out = {k: [0, 0] for k in ALLOC_KINDS}
    for r in records:
        if r.kind in out:
            out[r.kind][0] += 1
            out[r.kind][1] += int(r.nbytes or 0)
    return {k: tuple(v) for k, v in out.items()}


def cache_summary(records: list) -> dict:
    """Kernel-cache activity: hits, misses, builds (name, origin, ms), launches, fallbacks."""
    hits = misses = 0
    builds, fallbacks = [], []
    launches: Counter = Counter()
    for r in records:
        if r.kind == "kernel_build":
            if r.detail.get("hit"):
                hits += 1
            else:
                misses += 1
                builds.append((r.name, r.detail.get("origin", ""), r.detail.get("variant", ""),
                               float(r.detail.get("compile_ms", 0.0))))
        elif r.kind == "kernel_launch":
            launches[r.name] += 1
        elif r.kind == "kernel_fallback":
            fallbacks.append((r.name, r.detail.get("reason", "")))
    return {"hits": hits, "misses": misses, "builds": builds, "launches": launches,
            "fallbacks": fallbacks}


# -- HTML helpers ----------------------------------------------------------------------------


def _e(x: Any) -> str:
    return html.escape(str(x))


def _bytes(n: int) -> str:
    from tapescope.viz.theme import fmt_bytes

    return fmt_bytes(n)


def _table(head: list, rows: list, cls: str = "", limit: int = MAX_ROWS, raw: tuple = (),
           pages: int = 0) -> str:
    from tapescope.viz.theme import table

    return table(head, rows, cls, limit=limit, raw=raw, pages=pages)


def _section(title: str, body: str, open_: bool = False) -> str:
    from tapescope.viz.theme import details

    return details(f"<b>{_e(title)}</b>", body, open_)


def _kname(name: str, width: int = 48) -> str:
    """A kernel name cut for a table cell, the full name on hover."""
    from tapescope.viz.theme import short_name

    return f"<code title='{_e(name)}'>{_e(short_name(name, width))}</code>"


def memory_html(before: Optional[Memory], after: Memory, records: list) -> str:
    """Active / peak / cache memory before and after, and the allocation records."""
    from tapescope.viz.theme import fmt_delta_bytes, fmt_ns

    rows = []
    for label in ("active", "peak", "cache"):
        b = getattr(before, label) if before is not None else None
        a = getattr(after, label)
        rows.append((label, "—" if b is None else _bytes(b), _bytes(a),
                     "—" if b is None else fmt_delta_bytes(a - b)))
    out = _table(["memory", "before", "after", "change"], rows, "tapescope-memory")
    summ = memory_summary(records)
    out += _table(["record", "count", "bytes"],
                  [(k, c, _bytes(n)) for k, (c, n) in summ.items() if c], "tapescope-alloc")
    recs = [r for r in records if r.kind in ALLOC_KINDS]
    if recs:
        t0 = records[0].start_ns
        out += _section(f"allocator records ({len(recs)})", _table(
            ["at", "record", "bytes", "device"],
            [(fmt_ns(r.start_ns - t0), r.kind, _bytes(r.nbytes), r.device or "") for r in recs],
            "tapescope-alloc-records", limit=PAGE_ROWS, pages=PAGES))
    return out


def memory_plot_html(before: Optional[Memory], records: list) -> str:
    """Active / cache / peak memory over the cell (plotly's static HTML; "" without plotly or
    allocator records)."""
    from tapescope.viz.memory import MemoryTracker, static_figure
    from tapescope.viz.theme import plot_html

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
        from tapescope.viz.events import snapshot_html

        return snapshot_html(records, style=False)
    except ImportError:  # plotly missing
        counts = Counter(r.kind for r in records if r.kind in EVENT_KINDS or r.kind == "primitive")
        return _table(["kind", "count"], sorted(counts.items()), "ts-event-counts")


def cache_html(records: list, before: dict, after: dict) -> str:
    """Kernel-cache hits / misses / builds / launches / fallbacks during the records."""
    s = cache_summary(records)
    head = (f"<p>{s['hits']} hit(s), {s['misses']} miss(es), {len(s['builds'])} build(s) or load(s), "
            f"{sum(s['launches'].values())} launch(es), {len(s['fallbacks'])} numpy fallback(s); "
            f"{len(before)} → {len(after)} cached kernel(s)</p>")
    out = head
    if s["builds"]:
        out += _table(["kernel", "from", "variant", "compile ms"],
                      [(_kname(n), o, v, f"{ms:.1f}") for n, o, v, ms in s["builds"]],
                      "tapescope-builds", raw=(0,), limit=PAGE_ROWS, pages=PAGES)
    if s["launches"]:
        out += _table(["kernel", "launches"], [(_kname(n), c) for n, c in sorted(s["launches"].items())],
                      "tapescope-launches", raw=(0,), limit=PAGE_ROWS, pages=PAGES)
    if s["fallbacks"]:
        out += _table(["kernel", "why numpy ran it"], [(_kname(n), w) for n, w in s["fallbacks"]],
                      "tapescope-fallbacks", raw=(0,), limit=PAGE_ROWS, pages=PAGES)
    return out


# -- the report ------------------------------------------------------------------------------


def _graph_html(g: Any) -> str:
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
    steps = _table(["node", "primitive", "dtype", "inputs"],
                   [(st[0], st[1], st[2], ", ".join(st[3])) for st in k.steps], "tapescope-tape")
    ins = _table(["letter", "reads", "made by", "fusion stopped because"],
                 [(i.letter, g._vname(i.value), i.producer, i.reason or "—") for i in k.inputs],
                 "tapescope-tape-inputs")
    return (f"<p><b>{_e(title)}</b>: kernel {k.index} {_kname(k.name)} [{_e(k.variant)}], "
            f"shape {_e(k.shape)}, {len(k.steps)} op(s)</p>{steps}{ins}")


def kernel_html(k: Any, title: str = "") -> str:
    """One fused kernel's generated source in every dialect, side by side (C, CUDA, Metal)."""
    from tapescope.kernel_sources import sources_html

    return sources_html(k.sources, title=title or k.symbol, focus=k.name)


def roofline_of(records: list) -> list:
    """The kernels that ran during ``records``, each placed on its device's roofline
    (``tapescope.kernels.roofline``: the first call measures the machine)."""
    from tapescope.kernels import roofline

    return roofline.place(records)


def roofline_html(records: list, figure: bool = True) -> str:
    """The roofline of the kernels that ran (``figure``: with plotly's static figure)."""
    from tapescope.viz.roofline import roofline_html as html_of

    placed = roofline_of(records)
    return html_of(placed, figure=figure) if placed else ""


def _kernels_section(graphs: list, records: list, tapes: bool, sources: bool,
                     figure: bool = True) -> str:
    """The Kernels tab: the roofline of the kernels that ran (``figure``: with its static
    figure; first when one of them streams, else last), each fused kernel once, its tape (``tapes``) and its sources in every dialect
    side by side (``sources``); then kernels the cell built or launched that no graph drew
    (e.g. inside a compiled function), from the kernel cache."""
    from tapescope.kernel_cache import kernel_cache
    from tapescope.kernel_sources import entry_sources, sources_html
    from tapescope.viz.cache import base_name

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


def _distinct_kernels(graphs: list) -> list:
    """The fused kernels of ``graphs``, each kernel name once (a compiled function's program
    and the cell's lazy graph often hold the same kernel)."""
    seen, out = set(), []
    for _, g in graphs:
        for k in g.kernels:
            if k.symbol not in seen:
                seen.add(k.symbol)
                out.append(k)
    return out


def _user_frames(err: BaseException, filename: Optional[str]) -> list:
    """(line number, text) of the user's cell frames in ``err``'s traceback, outermost first."""
    import traceback

    if err is None or err.__traceback__ is None:
        return []
    out = []
    for fs in traceback.extract_tb(err.__traceback__):
        if filename and fs.filename == filename:
            out.append((fs.lineno, (fs.line or "").strip()))
    return out


def _progress_text(run: DeviceRun) -> str:
    evals = eval_progress(run.records)
    stopped = [e for e in evals if e["interrupted"]]
    if run.interrupted and stopped:
        e = stopped[-1]
        return (f"Interrupted: the eval stopped after {e['done']} of {e['nodes']} nodes "
                f"({e['done_before_interrupt']} done before the interrupt); evaluated arrays "
                "keep their data and the rest stay lazy.")
    if run.interrupted:
        return "Interrupted outside an eval (no node had started)."
    return ""


class CellReport:
    """The display of a ``%%mlx`` cell: one DeviceRun per device, and the sections to show."""

    def __init__(self, code: str, runs: list, show: Optional[set] = None, compiled: bool = False,
                 filename: Optional[str] = None):
        self.code, self.runs = code, runs
        self.show = set(SECTIONS) if show is None else set(show)
        self.compiled = compiled
        self.filename = filename  # the cell's file name in tracebacks (where the error is)

    @property
    def run(self) -> DeviceRun:
        """The run whose results the namespace keeps (the first device that ran)."""
        return next((r for r in self.runs if r.unavailable is None), self.runs[0])

    def differences(self) -> list:
        """(name, shape/dtype match, max abs difference, allclose) between the first two runs."""
        ran = [r for r in self.runs if r.unavailable is None]
        if len(ran) < 2:
            return []
        a, b = ran[0], ran[1]
        out = []
        for x in a.arrays:
            y = b.array(x.name)
            if y is None or x.data is None or y.data is None:
                out.append((x.name, False, None, False))
                continue
            same = x.data.shape == y.data.shape and x.dtype == y.dtype
            if not same:
                out.append((x.name, False, None, False))
                continue
            wide = np.complex128 if np.iscomplexobj(x.data) else np.float64
            xd, yd = x.data.astype(wide), y.data.astype(wide)
            d = float(np.max(np.abs(xd - yd))) if xd.size else 0.0
            out.append((x.name, True, d, bool(np.allclose(xd, yd, equal_nan=True))))
        return out

    # -- text ------------------------------------------------------------------------------
    def _run_lines(self, r: DeviceRun) -> list:
        if r.unavailable:
            return [f"[{r.device}] {r.unavailable}"]
        prims = primitive_counts(r.records)
        lines = [f"[{r.device}] {sum(prims.values())} primitive(s) run in {r.wall_s * 1e3:.1f} ms"
                 + (f": {', '.join(f'{n} x{c}' for n, c in prims.most_common(8))}" if prims else "")]
        lines += [f"  {n}" for n in r.notes]
        p = _progress_text(r)
        if p:
            lines.append("  " + p)
        elif r.error is not None:
            lines.append(f"  stopped by {type(r.error).__name__}: {r.error}")
        for a in r.arrays:
            lines.append(f"  {a.name}: {a.shape} {a.dtype}")
        return lines

    def __repr__(self) -> str:
        lines = ["%%mlx" + (" (compiled)" if self.compiled else "")]
        for r in self.runs:
            lines += self._run_lines(r)
        for name, same, d, close in self.differences():
            lines.append(f"  {name}: " + ("shape/dtype differ" if not same else
                                          f"max |diff| {d:.3g}, {'close' if close else 'DIFFERENT'}"))
        return "\n".join(lines)

    # -- HTML ------------------------------------------------------------------------------
    def _results_html(self) -> str:
        cols = [r for r in self.runs]
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
        diffs = self.differences()
        extra = ""
        if diffs:
            extra = _table(["array", "same shape/dtype", "max |diff|", "allclose"],
                           [(n, s, "—" if d is None else f"{d:.3g}", c) for n, s, d, c in diffs],
                           "tapescope-diff")
        return (f"<table class='tapescope-results'><thead><tr><th></th>{head}</tr></thead>"
                f"<tbody>{''.join(rows)}</tbody></table>{extra}")

    # -- the summary: what ran, how long, memory, verdict, kernels, where to look ----------
    def error_where(self, r: DeviceRun) -> Optional[tuple]:
        """(line number in the cell, its text) where the cell's error was raised, or None."""
        frames = _user_frames(r.error, self.filename)
        return frames[-1] if frames else None

    def look_at(self, r: DeviceRun) -> list:
        """What a reader should look at first, most important first (HTML strings)."""
        out = []
        prims = primitive_counts(r.records)
        kernels = _distinct_kernels(r.graphs)
        cs = cache_summary(r.records)
        check = r.check
        if check is not None and hasattr(check, "passed") and not check.passed:
            out.append("<b>Check</b>: tapescope and JAX disagree — the Check tab names the first "
                       "node that diverges.")
        build_ms = sum(ms for *_, ms in cs["builds"])
        if cs["misses"] and build_ms > 0.3 * r.wall_s * 1e3:
            out.append(f"<b>Kernel builds</b> took {build_ms:.0f} ms of the cell's {r.wall_s * 1e3:.0f} ms; "
                       "a second run loads them from the cache (Cache tab).")
        if kernels:
            out.append(f"<b>{len(kernels)} fused kernel(s)</b>: their tapes, why fusion stopped and the "
                       "generated source are in the Kernels tab.")
        elif not self.compiled and sum(prims.values()) > 8:
            elementwise = sum(c for n, c in prims.items() if n in _ELEMENTWISE)
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

    def summary_html(self, r: Optional[DeviceRun] = None) -> str:
        """The Summary tab: what ran, how long, peak memory, the check's verdict, the fused
        kernels, what failed and where, and what to look at first."""
        from tapescope.viz.theme import fmt_ns

        r = r or self.run
        if r.unavailable:
            return f"<p>{_e(r.unavailable)}</p>"
        prims = primitive_counts(r.records)
        kernels = _distinct_kernels(r.graphs)
        evals = eval_progress(r.records)
        parts = []
        msg = _progress_text(r)
        if msg:
            parts.append(f"<div class='ts-error'><b>{_e(msg)}</b></div>")
        elif r.error is not None:
            where = self.error_where(r)
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
            if hasattr(r.check, "passed"):
                ok = r.check.passed
                verdict = r.check.verdict() if hasattr(r.check, "verdict") else ""
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
        from tapescope.kernels.roofline import summary

        roof = summary(roofline_of(r.records))
        if roof:
            rows.append(("roofline", _e(roof) + " (Kernels tab)"))
        parts.append(_table(["", ""], rows, "tapescope-summary", raw=(1,)).replace(
            "<thead><tr><th></th><th></th></tr></thead>", ""))
        for n in r.notes:
            parts.append(f"<p>{_e(n)}</p>")
        look = self.look_at(r)
        if look:
            parts.append("<p><b>Look at</b></p><ul class='ts-look'>"
                         + "".join(f"<li>{x}</li>" for x in look) + "</ul>")
        return "".join(parts)

    def graphs_html(self, r: DeviceRun, pickable: bool = False) -> str:
        """The pictures of ``r``'s graphs, each under its title; ``pickable``: each fused kernel
        carries ``data-pick="<graph index>:ts_kernel_<kernel index>"`` (the panel's clicks)."""
        if not pickable:
            return "".join(f"<p>{_e(t)}</p>{_graph_html(g)}" for t, g in r.graphs)
        from tapescope.viz.pick import pickable_svg

        return "".join(f"<p>{_e(t)}</p>{pickable_svg(_graph_html(g), f'{i}:')}" for i, (t, g) in enumerate(r.graphs))

    def sections(self, r: DeviceRun, pickable: bool = False) -> list:
        """(tab title, HTML) of every section that has something to show for ``r``
        (``pickable``: for the panel, fused kernels in the graph pictures are clickable and
        the roofline's figure is left to the panel's live one)."""
        from tapescope.viz.theme import fmt_ns

        out = []
        if r.unavailable:
            return out
        if "graph" in self.show:
            body = self.graphs_html(r, pickable)
            prims = [x for x in r.records if x.kind == "primitive"]
            if prims:
                t0 = r.records[0].start_ns
                body += _section(f"primitives run ({len(prims)}, from the timeline)", _table(
                    ["at", "primitive", "node", "stream", "took", "bytes"],
                    [(fmt_ns(p.start_ns - t0), p.name, p.node, p.stream, fmt_ns(p.end_ns - p.start_ns),
                      _bytes(p.nbytes)) for p in prims], "tapescope-primitives", limit=PAGE_ROWS, pages=PAGES),
                    open_=not r.graphs)
            if body:
                out.append(("Graph", body))
        kern = _kernels_section(r.graphs, r.records, "tapes" in self.show, "kernels" in self.show,
                                figure=not pickable)
        if kern:
            out.append(("Kernels", kern))
        if "check" in self.show and r.check is not None:
            body = r.check._repr_html_() if hasattr(r.check, "_repr_html_") else f"<p>{_e(r.check)}</p>"
            out.append(("Check", body))
        if "memory" in self.show and r.memory_after is not None and (
                any(x.kind in ALLOC_KINDS for x in r.records) or r.error is None):
            out.append(("Memory", memory_plot_html(r.memory_before, r.records)
                        + memory_html(r.memory_before, r.memory_after, r.records)))
        if "cache" in self.show and (any(x.kind.startswith("kernel_") for x in r.records)):
            out.append(("Cache", cache_html(r.records, r.cache_before, r.cache_after)))
        if "events" in self.show and any(x.kind in EVENT_KINDS or x.kind in ("primitive", "interrupt")
                                         for x in r.records):
            out.append(("Events", events_html(r.records)))
        return out

    def _run_html(self, r: DeviceRun) -> str:
        if r.unavailable:
            return ""
        parts = []
        if len(self.runs) > 1:
            parts.append(f"<h4>{_e(r.device)}</h4>")
        parts.append(self.summary_html(r))
        for title, body in self.sections(r):
            parts.append(_section(title, body))
        return "".join(parts)

    def _repr_html_(self) -> str:
        from tapescope.viz.theme import style_tag

        parts = [style_tag(), "<div class='tapescope-cell'>",
                 f"<div class='ts-headline'>%%mlx{' (compiled)' if self.compiled else ''}: "
                 f"{_e(self._run_lines(self.run)[0])}</div>"]
        if self.run.arrays or len(self.runs) > 1:
            parts.append(_section("results", self._results_html(), open_=len(self.runs) > 1))
        parts += [self._run_html(r) for r in self.runs]
        parts.append("</div>")
        return "".join(parts)

    def _repr_mimebundle_(self, **kw: Any) -> dict:
        """The live tabbed panel (in a kernel with ipywidgets) with this static HTML as its
        snapshot; only the HTML elsewhere."""
        bundle = {"text/html": self._repr_html_(), "text/plain": repr(self)}
        if _in_kernel():
            try:
                from tapescope.viz.panel import CellPanel

                self.panel = CellPanel(self)
                view = self.panel.widget._repr_mimebundle_(**kw) or {}
                bundle.update({k: v for k, v in view.items() if k != "text/plain"})
            except ImportError:
                pass
        return bundle


_ELEMENTWISE = {"Add", "Subtract", "Multiply", "Divide", "Exp", "Log", "Sin", "Cos", "Tanh", "Sigmoid",
                "Square", "Sqrt", "Rsqrt", "Abs", "Negative", "Maximum", "Minimum", "Power", "Erf",
                "Log1p", "Expm1", "Select", "Greater", "Less", "Equal", "AsType", "Broadcast"}


def _in_kernel() -> bool:
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


class Collector:
    """Records the timeline while a cell runs, draining the ring on a thread every ``interval``
    seconds so that a long cell keeps every record (up to ``limit``), not only the ring's last
    ``timeline.CAPACITY``."""

    def __init__(self, interval: float = 0.05, limit: int = 2_000_000):
        self.interval, self.limit = interval, limit
        self.records: list = []
        self.dropped = 0
        self._last = -1
        self._stop = None
        self._thread = None
        self._listener = None

    def _drain(self) -> None:
        from tapescope.kernels import timeline

        new = []
        for r in reversed(timeline.records()):
            if r.seq <= self._last:
                break
            new.append(r)
        if not new:
            return
        new.reverse()
        self._last = new[-1].seq
        room = self.limit - len(self.records)
        if room < len(new):
            self.dropped += len(new) - max(room, 0)
            new = new[:max(room, 0)]
        self.records.extend(new)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._drain()

    def __enter__(self) -> "Collector":
        import threading

        from tapescope.kernels import timeline

        self._listener = timeline.record().__enter__()
        recs = timeline.records()
        self._last = recs[-1].seq if recs else -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tapescope-cell", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join()
        self._drain()
        self._listener.__exit__(None, None, None)
        return False
