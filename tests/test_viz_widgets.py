"""The widgets' models in Python: figures follow the allocator and the timeline, buttons change
the allocator's state, the cache table filters and sorts, the events layout draws the fence
between two streams, and export_trace writes Chrome trace-event JSON. References: the public
memory API (mx.get_*_memory), numpy byte counts, tapescope.kernel_cache()."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

import tapescope  # noqa: E402
import tapescope.core as mx  # noqa: E402
from tapescope.viz import CacheWidget, EventsWidget, MemoryWidget  # noqa: E402
from conftest import needs_dot


def _until(fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.05)
    return False


def test_memory_widget_figures_follow_the_allocator_and_its_buffers_name_their_node():
    w = MemoryWidget(live=False)
    w.start()
    try:
        n = 1 << 18
        a = mx.full((n,), 3.0, dtype=mx.float32)
        mx.eval(a)
        w.refresh()
        assert w.figures["active"] == mx.get_active_memory()
        assert w.figures["peak"] == mx.get_peak_memory()
        assert w.tracker.series["active"][-1] == mx.get_active_memory()
        big = w.tracker.largest(1)[0]
        assert big[1] >= np.zeros(n, np.float32).nbytes and big[3] == "Full"
    finally:
        w.stop()


def test_memory_widget_live_thread_redraws_while_work_runs():
    w = MemoryWidget(live=True, interval=0.05)
    try:
        first = w.updates
        keep = []
        for i in range(20):
            keep.append(mx.zeros((4096,)) + i)
            mx.eval(keep[-1])
        assert _until(lambda: w.updates >= first + 3)
        assert _until(lambda: w.figures["active"] == mx.get_active_memory())
    finally:
        w.stop()


def test_memory_widget_buttons_change_the_allocator():
    w = MemoryWidget(live=False)
    old_cache_limit = w.figures["cache_limit"]
    old_memory_limit = mx.get_memory_limit()
    try:
        a = mx.zeros((1 << 16,)) + 1
        mx.eval(a)
        del a
        assert mx.get_cache_memory() > 0
        w.clear_button.click()
        assert mx.get_cache_memory() == 0 and w.figures["cache"] == 0
        mx.eval(mx.zeros((1 << 16,)) + 2)
        w.reset_button.click()
        assert mx.get_peak_memory() == mx.get_active_memory() or mx.get_peak_memory() == 0
        w.cache_limit_input.value = 64
        w.set_cache_button.click()
        assert w.figures["cache_limit"] == 64 * 1024
        assert mx.set_cache_limit(old_cache_limit) == 64 * 1024  # the allocator had it
        w.memory_limit_input.value = 1 << 20
        w.set_memory_button.click()
        assert mx.get_memory_limit() == (1 << 20) * 1024
    finally:
        mx.set_cache_limit(old_cache_limit)
        mx.set_memory_limit(old_memory_limit)


def test_memory_widget_snapshot_html_has_the_figures():
    w = MemoryWidget(live=False)
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "largest live buffers" in bundle["text/html"] and "memory limit" in bundle["text/html"]


def test_cache_widget_filters_sorts_pages_and_shows_the_selected_source():
    f = mx.compile(lambda x: mx.exp(x) * 2 + 1)
    g = mx.compile(lambda x: mx.sin(x) - x * 3)
    x = mx.ones((64,))
    mx.eval(f(x), f(x), g(x))
    w = CacheWidget()
    names = {e["name"] for e in tapescope.kernel_cache()}
    assert {e["name"] for e in w.rows()} == names
    w.filter.value = "Sin"  # any case, in the name, runtime, variant or origin
    found = {e["name"] for e in tapescope.kernel_cache()
             if any("sin" in e[k].lower() for k in ("name", "runtime", "variant", "origin"))}
    assert {e["name"] for e in w.rows()} == found
    assert any("Sin" in n and "Subtract" in n for n in found)  # g's kernel
    w.filter.value = ""
    w.sort.value = "hits"
    w.descending.value = True
    hits = [e["hits"] for e in w.rows()]
    assert hits == sorted(hits, reverse=True)
    chosen = w.selected  # a row of the page shown (the first one until one is clicked)
    assert chosen in [e["name"] for e in w.rows()[:12]]
    entry = next(e for e in tapescope.kernel_cache() if e["name"] == chosen)
    # (its source's first word shown; a kernel listed without source — earlier tests of the
    # process decide which kernel has the most hits — shows none)
    first = next((ln.split()[0] for ln in entry["source"].splitlines() if ln.split()), None)
    assert first is None or ("highlight" in w.source.value and first in w.source.value)
    assert "title='" + entry["name"] in w.table.value or entry["name"][:20] in w.table.value
    # clicking a row (the view sets ``picked`` to the row's data-pick) shows that kernel's tape
    # in C, CUDA and Metal side by side
    # g's kernel (other tests of this process may have cached other kernels with a Sin)
    sin = next(e for e in tapescope.kernel_cache() if "Sin" in e["name"] and "Subtract" in e["name"])
    w.filter.value = sin["name"]  # its row on the page shown, however many kernels are cached
    assert f"<tr data-pick='{sin['name']}'>" in w.table.value
    w.table.picked = sin["name"]
    assert w.selected == sin["name"]
    src = w.source.value
    assert [h in src for h in ("<th>C</th>", "<th>CUDA</th>", "<th>Metal</th>")] == [True] * 3
    symbol = sin["name"]
    assert "__global__" in src and "kernel" in src and "void" in src
    assert src.count(symbol[-30:]) >= 3  # each dialect's kernel is named after the variant


def test_events_widget_lanes_arrows_and_counts_follow_the_timeline(tmp_path):
    with tapescope.record() as rec:
        s2 = mx.new_stream(mx.cpu)
        a = mx.exp(mx.array([1.0, 2.0]), stream=s2)
        b = a + 1
        mx.eval(b)
    w = EventsWidget(rec.records)
    prims = [r for r in rec.records if r.kind == "primitive"]
    assert w.layout.counts["primitive"] == len(prims)
    assert {f"stream {r.stream}" for r in prims} <= set(w.layout.lanes)
    fence_updates = [r for r in rec.records if r.kind == "fence_update"]
    assert len([a for a in w.layout.arrows if a.kind == "fence"]) == len(fence_updates) >= 1
    assert w.figure is not None and len(w.figure.data) >= 3
    path = tapescope.export_trace(tmp_path / "trace.json", rec.records)
    data = json.load(open(path))
    ev = data["traceEvents"]
    assert sum(1 for e in ev if e.get("ph") == "X" and e["cat"] == "primitive") == len(prims)
    assert {e["args"]["name"] for e in ev if e.get("name") == "thread_name"} >= {f"stream {r.stream}" for r in prims}
    assert any(e["ph"] == "s" for e in ev) and any(e["ph"] == "f" for e in ev)


@needs_dot  # the pick keys are in the rendered SVG
def test_clicking_a_fused_kernel_in_the_graph_shows_its_tape_and_every_dialect():
    from tapescope.viz import cell as cr
    from tapescope.viz.panel import CellPanel
    from tapescope.viz.report import sections as report_sections

    x = mx.array(np.linspace(-1, 1, 32, dtype=np.float32))
    g1 = tapescope.trace(lambda a: mx.exp(a) * 2 + a, x)
    g2 = tapescope.trace(lambda a: mx.sin(a) - a * 3, x)
    report = cr.CellReport("", [cr.DeviceRun("cpu", graphs=[("f", g1), ("g", g2)])])
    panel = CellPanel(report)
    svg = panel.graph_html.value
    # every fused kernel's cluster (and the nodes of its tape) carries its pick key
    assert 'class="cluster ts-pick" data-pick="0:ts_kernel_0"' in svg
    assert 'class="cluster ts-pick" data-pick="1:ts_kernel_0"' in svg
    assert panel.kernel_view.value == ""
    panel.graph_html.picked = "1:ts_kernel_0"  # what a click on g's kernel sends
    (k,) = g2.kernels
    view = panel.kernel_view.value
    assert "The kernel view of" not in view, view[-3000:]  # the view says why it failed
    assert k.symbol in view and "Sin" in view and "Exp" not in view.split("</table>")[0]
    src = k.sources
    for runtime, head in (("cpu", "C"), ("cuda", "CUDA"), ("metal", "Metal")):
        assert f"<th>{head}</th>" in view
        first = src[runtime].splitlines()[0]  # each dialect's first line, as pygments split it
        assert all(tok in view for tok in first.split()[:2] if tok.isidentifier()), (runtime, first)
    panel.graph_html.picked = "7:ts_kernel_0"  # no such graph: nothing shown
    assert panel.kernel_view.value == ""
    # the Kernels tab: each kernel's tape and its three sources side by side
    kernels = dict(report_sections(report, report.run))["Kernels"]
    assert kernels.count("<th>CUDA</th>") == 2 and kernels.count("tapescope-tape'") == 2


def test_static_snapshots_carry_plotly_figures_of_the_records():
    from tapescope.viz import events, memory

    with tapescope.record() as rec:
        keep = [mx.zeros((1 << 14,)) + i for i in range(6)]
        mx.eval(*keep)
        del keep
    # the allocator's counters, read once: a later read can differ (a garbage collection
    # frees an earlier test's buffers; on a GPU a free can land once its kernels finish)
    now = memory.memory_figures()
    tracker = memory.MemoryTracker(rec.records, anchor=now)
    fig = memory.static_figure(tracker)
    mib = 1024 * 1024
    # the lines are the tracker's series in MiB; the series ends at the allocator's counters
    assert list(fig.data[0].y) == [v / mib for v in tracker.series["active"]]
    assert fig.data[0].y[-1] == now["active"] / mib
    # the default device's allocator records (a GPU cell may allocate host memory too)
    dev = mx.default_device().type.name
    allocs = sum(1 for r in rec.records if r.kind in ("alloc", "cache_reuse", "free_to_cache", "free", "evict")
                 and r.device == dev)
    assert len(fig.data[0].x) == allocs
    snap = memory.snapshot_html(tracker, now)
    assert "plotly-graph-div" in snap and "Plotly.newPlot" in snap and f"memory ({dev})" in snap
    # the events figure: one trace per kind, its legend counting that kind's records
    efig = events.events_figure(rec.records, widget=False)
    prims = sum(1 for r in rec.records if r.kind == "primitive")
    (bar,) = [t for t in efig.data if t.name.startswith("primitive run")]
    assert bar.name == f"primitive run ({prims})" and len(bar.x) == prims
    assert "plotly-graph-div" in events.snapshot_html(rec.records)
