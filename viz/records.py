"""Facts read off timeline records, for the report and the widgets: how many times each
primitive ran, how far each eval got (and where an interrupt stopped it), the allocator's and
the kernel cache's activity, the distinct fused kernels of traced graphs."""

from __future__ import annotations

from collections import Counter
from typing import Optional

__all__ = ["ALLOC_KINDS", "EVENT_KINDS", "primitive_counts", "eval_progress", "memory_summary",
           "cache_summary", "distinct_kernels", "user_frames", "progress_text"]

ALLOC_KINDS = ("alloc", "cache_reuse", "free_to_cache", "free", "evict", "release")
EVENT_KINDS = ("event_signal", "event_wait", "fence_update", "fence_wait", "event_detach")


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


def distinct_kernels(graphs: list) -> list:
    """The fused kernels of ``graphs``, each kernel name once (a compiled function's program
    and the cell's lazy graph often hold the same kernel)."""
    seen, out = set(), []
    for _, g in graphs:
        for k in g.kernels:
            if k.symbol not in seen:
                seen.add(k.symbol)
                out.append(k)
    return out


def user_frames(err: BaseException, filename: Optional[str]) -> list:
    """(line number, text) of the user's cell frames in ``err``'s traceback, outermost first."""
    import traceback

    if err is None or err.__traceback__ is None:
        return []
    out = []
    for fs in traceback.extract_tb(err.__traceback__):
        if filename and fs.filename == filename:
            out.append((fs.lineno, (fs.line or "").strip()))
    return out


def progress_text(run) -> str:
    """Why a run (a ``viz.cell.DeviceRun``) stopped early: how far its interrupted eval got."""
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
