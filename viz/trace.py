"""Timeline records -> lanes, marks, arrows and counts (what the events widget draws), and the
Chrome trace-event JSON that Perfetto and chrome://tracing open (``export_trace``)."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["KINDS", "Mark", "Arrow", "Layout", "layout", "trace_events", "export_trace"]

# kind -> (legend name, colour, drawn as a span)
KINDS = {
    "eval_end": ("eval", "#94a3b8", True),
    "primitive": ("primitive run", "#3b82f6", True),
    "kernel_build": ("kernel build", "#a16207", True),
    "kernel_launch": ("kernel launch", "#06b6d4", True),
    "gpu_work": ("GPU work (device time)", "#0d9488", True),
    "kernel_fallback": ("numpy fallback", "#dc2626", True),
    "event_wait": ("event wait", "#f59e0b", True),
    "fence_wait": ("fence wait", "#db2777", True),
    "event_signal": ("event signal", "#16a34a", False),
    "fence_update": ("fence update", "#7c3aed", False),
    "event_detach": ("event detach", "#6b7280", False),
    "alloc": ("allocation", "#0ea5e9", False),
    "cache_reuse": ("cache reuse", "#22c55e", False),
    "free_to_cache": ("free to cache", "#84cc16", False),
    "free": ("free", "#9ca3af", False),
    "evict": ("evict", "#ef4444", False),
    "interrupt": ("interrupt", "#b91c1c", False),
}
HOST = "host"


@dataclass
class Mark:
    """One record placed on a lane: times in ns from the first record."""

    kind: str
    lane: str
    start: int
    end: int
    text: str


@dataclass
class Arrow:
    """From a signal (event signal, fence update) to the wait it released."""

    kind: str  # "event" or "fence"
    lane0: str
    t0: int
    lane1: str
    t1: int


@dataclass
class Layout:
    lanes: list = field(default_factory=list)
    marks: list = field(default_factory=list)
    arrows: list = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    t0: int = 0
    span: int = 0
    dropped: int = 0


def _lane(r: Any) -> str:
    return f"stream {r.stream}" if r.stream is not None else HOST


def _text(r: Any) -> str:
    parts = [KINDS[r.kind][0]]
    if r.name:
        parts.append(str(r.name) if len(str(r.name)) <= 60 else str(r.name)[:59] + "…")
    if r.node is not None:
        parts.append(f"node {r.node}")
    if r.nbytes:
        from .theme import fmt_bytes

        parts.append(fmt_bytes(r.nbytes))
    if r.end_ns > r.start_ns:
        from .theme import fmt_ns

        parts.append(fmt_ns(r.end_ns - r.start_ns))
    for k, v in (r.detail or {}).items():
        if k not in ("source", "streams"):
            parts.append(f"{k}={v}")
    return " · ".join(parts)


def layout(records: list, max_marks: int = 4000) -> Layout:
    """Lanes (streams in order, then host), marks (at most ``max_marks``, counted all the
    same), arrows from each signal to the waits it released."""
    shown = [r for r in records if r.kind in KINDS]
    out = Layout()
    if not shown:
        return out
    out.t0 = min(r.start_ns for r in shown)
    out.span = max(max(r.end_ns, r.start_ns) for r in shown) - out.t0
    streams = sorted({r.stream for r in shown if r.stream is not None})
    out.lanes = [f"stream {s}" for s in streams]
    if any(r.stream is None for r in shown):
        out.lanes.append(HOST)
    signals: dict = {}
    for r in sorted(shown, key=lambda r: r.seq):
        out.counts[r.kind] += 1
        lane = _lane(r)
        if len(out.marks) < max_marks or r.kind == "interrupt":
            out.marks.append(Mark(r.kind, lane, r.start_ns - out.t0, max(r.end_ns, r.start_ns) - out.t0,
                                  _text(r)))
        else:
            out.dropped += 1
        d = r.detail or {}
        if r.kind == "event_signal":
            signals[("event", d.get("event"), d.get("value"))] = (lane, r.start_ns - out.t0)
        elif r.kind == "fence_update":
            signals[("fence", d.get("fence"), d.get("count"))] = (lane, r.start_ns - out.t0)
        elif r.kind in ("event_wait", "fence_wait"):
            what = "event" if r.kind == "event_wait" else "fence"
            key = (what, d.get("event" if what == "event" else "fence"),
                   d.get("value" if what == "event" else "count"))
            src = signals.get(key)
            if src is None and what == "event":  # a later value also releases the wait
                src = next((v for k, v in signals.items() if k[0] == "event" and k[1] == key[1]), None)
            if src is not None:
                out.arrows.append(Arrow(what, src[0], src[1], lane, max(r.end_ns, r.start_ns) - out.t0))
    return out


def trace_events(records: list) -> dict:
    """The records as Chrome trace-event JSON (a dict): complete events for spans, instant events
    for points, flow arrows from signals to waits, one thread (lane) per stream plus host."""
    lay = layout(records, max_marks=len(records) + 1)
    tids = {lane: i + 1 for i, lane in enumerate(lay.lanes)}
    ev: list = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "tapescope"}}]
    for lane, tid in tids.items():
        ev.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": lane}})
        ev.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid, "args": {"sort_index": tid}})
    for m in lay.marks:
        name, _, span = KINDS[m.kind]
        e = {"name": m.text.split(" · ")[1] if m.kind == "primitive" and " · " in m.text else name,
             "cat": m.kind, "pid": 1, "tid": tids[m.lane], "ts": m.start / 1e3, "args": {"detail": m.text}}
        if span:
            e.update(ph="X", dur=max(m.end - m.start, 0) / 1e3)
        else:
            e.update(ph="i", s="g" if m.kind == "interrupt" else "t")
        ev.append(e)
    for i, a in enumerate(lay.arrows):
        common = {"name": f"{a.kind} signal → wait", "cat": a.kind, "pid": 1, "id": i + 1}
        ev.append({**common, "ph": "s", "tid": tids[a.lane0], "ts": a.t0 / 1e3})
        ev.append({**common, "ph": "f", "bp": "e", "tid": tids[a.lane1], "ts": a.t1 / 1e3})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"producer": "tapescope", "records": len(records)}}


def export_trace(path: "os.PathLike | str", records: Optional[list] = None) -> str:
    """Write ``records`` (default: the whole timeline ring) as Chrome trace-event JSON to
    ``path``, which Perfetto (ui.perfetto.dev) and chrome://tracing open; returns the path."""
    if records is None:
        from tapescope.kernels import timeline

        records = timeline.records()
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace_events(records), f)
    return path
