"""The memory widget: active, peak and cache memory and the limits, now and over time.

``MemoryTracker`` turns the timeline's allocator records into a series (each record moves
active / cache memory by its bytes) and the live buffers with the graph node that made each;
every poll re-anchors the series on the allocator's own counters (``mx.get_*_memory``).
``MemoryWidget`` draws the tracker with ipywidgets and a plotly ``FigureWidget``; it updates
on a thread, at most every ``interval`` seconds, while it is open. Without a kernel it is a
static HTML snapshot (``snapshot_html``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from tapescope.kernels import timeline

from .theme import esc, fmt_bytes, fmt_ns, plot_html, style_tag, table

__all__ = ["MemoryTracker", "MemoryWidget", "memory_figures", "static_figure", "snapshot_html"]

MAX_POINTS = 2000
# active / cache change per allocator record kind (release follows free or evict: no change)
_DELTA = {"alloc": (1, 0), "cache_reuse": (1, -1), "free_to_cache": (-1, 1), "free": (-1, 0),
          "evict": (0, -1)}


def memory_figures() -> dict:
    """The allocator's figures now: the default device's, as ``mx.get_*_memory`` (and
    ``mx.set_*_limit``) read and set them; ``device`` names it."""
    import tapescope.core as mx

    return {"active": mx.get_active_memory(), "peak": mx.get_peak_memory(),
            "cache": mx.get_cache_memory(), "memory_limit": mx.get_memory_limit(),
            "cache_limit": _cache_limit(), "device": mx.default_device().type.name}


def _cache_limit() -> int:
    """The default device's cache limit (MLX has no getter; the allocator's statistics do):
    the allocator ``mx.set_cache_limit`` sets."""
    import tapescope.core as mx
    from tapescope.kernels.backends import backend

    return backend(mx.default_device()).allocator.cache_limit


class MemoryTracker:
    """Active / cache / peak memory over time, and the live buffers, from the timeline
    records of one device's allocator (``device``; default: the default device's, whose
    counters ``mx.get_*_memory`` read and the series is anchored on)."""

    def __init__(self, records: Optional[list] = None, anchor: Optional[dict] = None,
                 device: Optional[str] = None):
        if device is None:
            import tapescope.core as mx

            device = mx.default_device().type.name
        self.device = device
        now = memory_figures() if anchor is None else anchor
        self.active, self.cache, self.peak = now["active"], now["cache"], now["peak"]
        self.t0 = None
        self.times: list = []  # seconds since t0
        self.series = {"active": [], "cache": [], "peak": []}
        self.buffers: dict = {}  # buffer id -> [nbytes, node, primitive, t]
        self._pending: dict = {}  # thread -> buffer ids not yet matched with a primitive
        self.last_seq = -1
        if records:
            first = [r for r in records if r.kind in _DELTA and r.device == device]
            if first:  # walk back from the anchor to where the records start
                for r in first:
                    da, dc = _DELTA[r.kind]
                    self.active -= da * r.nbytes
                    self.cache -= dc * r.nbytes
            self.feed(records)

    def _point(self, t_ns: int) -> None:
        if self.t0 is None:
            self.t0 = t_ns
        self.times.append((t_ns - self.t0) / 1e9)
        self.series["active"].append(self.active)
        self.series["cache"].append(self.cache)
        self.series["peak"].append(self.peak)
        if len(self.times) > MAX_POINTS:  # keep every other point of the older half
            half = len(self.times) // 2
            keep = list(range(0, half, 2)) + list(range(half, len(self.times)))
            self.times = [self.times[i] for i in keep]
            for k in self.series:
                self.series[k] = [self.series[k][i] for i in keep]

    def feed(self, records: list) -> None:
        """Apply new records (oldest first)."""
        for r in records:
            self.last_seq = max(self.last_seq, r.seq)
            d = _DELTA.get(r.kind)
            if d is not None and r.device == self.device:
                self.active += d[0] * r.nbytes
                self.cache += d[1] * r.nbytes
                self.peak = max(self.peak, self.active)
                self._point(r.start_ns)
                buf = (r.detail or {}).get("buffer")
                if buf is not None:
                    if r.kind in ("alloc", "cache_reuse"):
                        self.buffers[buf] = [r.nbytes, None, None, r.start_ns]
                        self._pending.setdefault(r.thread, []).append((buf, r.start_ns))
                    elif r.kind in ("free", "free_to_cache"):
                        self.buffers.pop(buf, None)
            elif r.kind == "primitive":
                for buf, t in self._pending.pop(r.thread, []):
                    if buf in self.buffers and t >= r.start_ns:
                        self.buffers[buf][1:3] = [r.node, r.name]

    def anchor(self, figures: Optional[dict] = None) -> None:
        """Re-anchor on the allocator's counters now: a point at the current time when they
        differ from the series' last point (an idle allocator adds no points)."""
        f = memory_figures() if figures is None else figures
        now = (f["active"], f["cache"], f["peak"])
        last = tuple(self.series[k][-1] for k in ("active", "cache", "peak")) if self.times else None
        self.active, self.cache, self.peak = now
        if now != last:
            self._point(timeline.now())

    def largest(self, n: int = 8) -> list:
        """The ``n`` largest live buffers seen: (buffer id, bytes, node, primitive)."""
        rows = sorted(self.buffers.items(), key=lambda kv: -kv[1][0])[:n]
        return [(b, v[0], v[1], v[2]) for b, v in rows]


def _figures_html(f: dict) -> str:
    return table(["active", "peak", "cache", "cache limit", "memory limit"],
                 [(fmt_bytes(f["active"]), fmt_bytes(f["peak"]), fmt_bytes(f["cache"]),
                   fmt_bytes(f["cache_limit"]), fmt_bytes(f["memory_limit"]))], "ts-memory-now")


def _buffers_html(rows: list) -> str:
    if not rows:
        return "<p class='ts-muted'>No live buffers were allocated while this view recorded.</p>"
    return table(["buffer", "size", "made by node", "primitive"],
                 [(b, fmt_bytes(n), "—" if node is None else node, prim or "— (not a node)")
                  for b, n, node, prim in rows], "ts-buffers")


def static_figure(tracker: MemoryTracker, points: int = 400) -> Any:
    """The memory plot of ``tracker`` as a plain plotly Figure (at most ``points`` samples, the
    series thinned evenly), or None without plotly or samples."""
    if len(tracker.times) < 2:  # one sample draws nothing
        return None
    fig = _figure(widget=False)
    if fig is None:
        return None
    step = max(1, -(-len(tracker.times) // points))
    keep = list(range(0, len(tracker.times), step))
    if keep[-1] != len(tracker.times) - 1:
        keep.append(len(tracker.times) - 1)
    _fill(fig, [tracker.times[i] for i in keep],
          {k: [v[i] for i in keep] for k, v in tracker.series.items()})
    return fig


def _fill(fig: Any, times: list, series: dict) -> None:
    """Put the active / cache / peak series (bytes) into ``fig``'s three lines (MiB)."""
    mib = 1 / (1024 * 1024)
    with fig.batch_update():
        for i, k in enumerate(("active", "cache", "peak")):
            fig.data[i].x = times
            fig.data[i].y = [v * mib for v in series[k]]


def snapshot_html(tracker: MemoryTracker, figures: dict, title: Optional[str] = None) -> str:
    """A static view: the figures now, the plot over time (plotly's HTML), the series' extremes,
    the largest buffers."""
    title = title or f"memory ({figures.get('device', tracker.device)})"
    span = tracker.times[-1] - tracker.times[0] if len(tracker.times) > 1 else 0.0
    trend = (f"<p>{len(tracker.times)} samples over {fmt_ns(span * 1e9)}: active "
             f"{fmt_bytes(min(tracker.series['active']))} … {fmt_bytes(max(tracker.series['active']))}, "
             f"cache {fmt_bytes(min(tracker.series['cache']))} … {fmt_bytes(max(tracker.series['cache']))}"
             "</p>") if tracker.times else ""
    return (f"{style_tag()}<div class='tapescope ts-memory-snapshot'><div class='ts-headline'>"
            f"{esc(title)}</div>{_figures_html(figures)}{plot_html(static_figure(tracker))}{trend}"
            "<p><b>largest live buffers</b></p>"
            f"{_buffers_html(tracker.largest())}</div>")


class MemoryWidget:
    """Memory now and over time, with buttons for ``clear_cache`` / ``reset_peak_memory`` and
    inputs for ``set_cache_limit`` / ``set_memory_limit``; live while open.

    ``records``: timeline records to start the series with (a ``%%mlx`` cell's); ``live``:
    poll the timeline every ``interval`` seconds on a thread (off: call ``refresh()``).
    """

    def __init__(self, records: Optional[list] = None, live: bool = True, interval: float = 0.25):
        self.tracker = MemoryTracker(records)
        self.interval = float(interval)
        self._lock = threading.Lock()
        self._listener = None
        self._thread = None
        self._stop = threading.Event()
        self.updates = 0
        self.widget = self._build()
        self.refresh()
        if live:
            self.start()

    # -- the view ----------------------------------------------------------------------------
    def _build(self) -> Any:
        import ipywidgets as W

        self.now_html = W.HTML(layout=W.Layout(max_width="100%"))
        self.status = W.HTML(layout=W.Layout(max_width="100%"))
        self.buffers_html = W.HTML(layout=W.Layout(max_width="100%"))
        self.clear_button = W.Button(description="clear_cache", tooltip="mx.clear_cache()",
                                     layout=W.Layout(width="auto"))
        self.reset_button = W.Button(description="reset_peak_memory", tooltip="mx.reset_peak_memory()",
                                     layout=W.Layout(width="auto"))
        f = memory_figures()
        self.cache_limit_input = W.BoundedIntText(value=f["cache_limit"] // 1024, min=0, max=2**50,
                                                  description="cache limit KiB",
                                                  style={"description_width": "initial"},
                                                  layout=W.Layout(width="230px"))
        self.memory_limit_input = W.BoundedIntText(value=f["memory_limit"] // 1024, min=0, max=2**50,
                                                   description="memory limit KiB",
                                                   style={"description_width": "initial"},
                                                   layout=W.Layout(width="250px"))
        self.set_cache_button = W.Button(description="set_cache_limit", layout=W.Layout(width="auto"))
        self.set_memory_button = W.Button(description="set_memory_limit", layout=W.Layout(width="auto"))
        self.clear_button.on_click(lambda _: self.clear_cache())
        self.reset_button.on_click(lambda _: self.reset_peak_memory())
        self.set_cache_button.on_click(lambda _: self.set_cache_limit(self.cache_limit_input.value * 1024))
        self.set_memory_button.on_click(lambda _: self.set_memory_limit(self.memory_limit_input.value * 1024))
        self.figure = _figure()
        row1 = W.HBox([self.clear_button, self.reset_button], layout=W.Layout(flex_flow="row wrap"))
        row2 = W.HBox([self.cache_limit_input, self.set_cache_button, self.memory_limit_input,
                       self.set_memory_button], layout=W.Layout(flex_flow="row wrap"))
        kids = [W.HTML(style_tag()), self.now_html, self.status]
        if self.figure is not None:
            kids.append(self.figure)
        kids += [row1, row2, W.HTML("<b>largest live buffers</b> (since this view opened)"),
                 self.buffers_html]
        box = W.VBox(kids, layout=W.Layout(max_width="100%", overflow="hidden"))
        box.add_class("tapescope")
        box.add_class("tapescope-memory-widget")
        return box

    # -- actions (what the buttons do) --------------------------------------------------------
    def clear_cache(self) -> None:
        import tapescope.core as mx

        mx.clear_cache()
        self.refresh()

    def reset_peak_memory(self) -> None:
        import tapescope.core as mx

        mx.reset_peak_memory()
        self.refresh()

    def set_cache_limit(self, limit: int) -> int:
        import tapescope.core as mx

        old = mx.set_cache_limit(int(limit))
        self.refresh()
        return old

    def set_memory_limit(self, limit: int) -> int:
        import tapescope.core as mx

        old = mx.set_memory_limit(int(limit))
        self.refresh()
        return old

    # -- updating ------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the new timeline records and the allocator's counters; redraw."""
        with self._lock:
            new = timeline.records_since(self.tracker.last_seq + 1) if self._listener else []
            self.tracker.feed(new)
            f = memory_figures()
            self.tracker.anchor(f)
            self.figures = f
            self.now_html.value = _figures_html(f)
            self.status.value = (f"<span class='ts-muted'>{len(self.tracker.times)} samples · "
                                 f"updated {time.strftime('%H:%M:%S')} · update #{self.updates + 1}</span>")
            self.buffers_html.value = _buffers_html(self.tracker.largest())
            if self.figure is not None:
                _fill(self.figure, self.tracker.times, self.tracker.series)
            self.updates += 1

    def start(self) -> None:
        """Record the timeline and refresh every ``interval`` seconds on a daemon thread."""
        if self._thread is not None:
            return
        self._listener = timeline.record().__enter__()
        self.tracker.last_seq = timeline.next_seq() - 1
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tapescope-memory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a view must never break the kernel
                pass

    def stop(self) -> None:
        """Stop refreshing and recording."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._listener is not None:
            self._listener.__exit__(None, None, None)
            self._listener = None

    def close(self) -> None:
        self.stop()
        self.widget.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self._stop.set()
        except Exception:  # noqa: BLE001
            pass

    # -- display -------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kw: Any) -> dict:
        """One bundle: the live view and the HTML snapshot (IPython displays widgets through
        ``_ipython_display_``, as two outputs)."""
        bundle = self.widget._repr_mimebundle_(**kw) or {}
        bundle["text/html"] = snapshot_html(self.tracker, self.figures)
        return bundle

    def _ipython_display_(self) -> None:
        from .theme import show

        show(self.widget, snapshot_html(self.tracker, self.figures), repr(self))

    def __repr__(self) -> str:
        f = self.figures
        return (f"MemoryWidget(active={f['active']}, peak={f['peak']}, cache={f['cache']}, "
                f"cache_limit={f['cache_limit']}, memory_limit={f['memory_limit']})")


def _figure(widget: bool = True) -> Any:
    """The plotly figure of active / cache / peak memory, empty (a FigureWidget when ``widget``;
    None without plotly)."""
    try:
        import plotly.graph_objects as go

        fig = go.FigureWidget() if widget else go.Figure()
    except Exception:  # noqa: BLE001 - plotly or anywidget missing: figures only
        return None
    for name, color, dash in (("active", "#2563eb", None), ("cache", "#16a34a", None),
                              ("peak", "#dc2626", "dot")):
        fig.add_scatter(x=[], y=[], mode="lines", name=name, line=dict(color=color, dash=dash, shape="hv"),
                        hovertemplate="%{y:.2f} MiB at %{x:.3f} s<extra>" + name + "</extra>")
    fig.update_layout(height=260, margin=dict(l=50, r=10, t=10, b=40), autosize=True,
                      xaxis_title="time (s)", yaxis_title="MiB", template="plotly_white",
                      legend=dict(orientation="h", y=1.12, x=0))
    return fig
