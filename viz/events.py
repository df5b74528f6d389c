"""The events widget: a zoomable timeline (plotly) with one lane per stream and one for the
host; spans for evals, primitive runs, kernel builds and launches and waits, points for
allocations, signals and interrupts, arrows from each signal to the wait it released; a
legend with counts per kind, a time axis in ms, details on hover."""

from __future__ import annotations

from typing import Any, Optional

from .theme import esc, fmt_ns, plot_html, style_tag, table
from .trace import KINDS, layout

__all__ = ["EventsWidget", "events_figure", "snapshot_html", "counts_html"]

WIDTH = 860  # px


def counts_html(lay: Any) -> str:
    """Counts per kind, with the legend's colours."""
    rows = [(f"<span class='ts-swatch' style='background:{KINDS[k][1]}'></span>{esc(KINDS[k][0])}", n)
            for k, n in sorted(lay.counts.items(), key=lambda kv: list(KINDS).index(kv[0]))]
    return table(["kind", "count"], rows, "ts-event-counts", limit=len(rows) + 1, raw=(0,))


def snapshot_html(records: list, style: bool = True, max_marks: int = 800) -> str:
    """A static view: the timeline (plotly's HTML, at most ``max_marks`` marks), lanes, span,
    counts per kind, how many signal → wait arrows (``style``: with the stylesheet)."""
    lay = layout(records)
    css = style_tag() if style else ""
    if not lay.lanes:
        return (f"{css}<div class='tapescope'><p>No events were recorded (no eval ran while "
                "recording).</p></div>")
    return (f"{css}<div class='tapescope ts-events-snapshot'><div class='ts-headline'>events: "
            f"{sum(lay.counts.values())} record(s) over {fmt_ns(lay.span)} on "
            f"{esc(', '.join(lay.lanes))}</div>{plot_html(events_figure(records, False, max_marks))}"
            f"{counts_html(lay)}<p>{len(lay.arrows)} signal → wait "
            "arrow(s). The live view is a zoomable timeline; <code>tapescope.export_trace(path)</code> "
            "writes these records for Perfetto or chrome://tracing.</p></div>")


def events_figure(records: list, widget: bool = True, max_marks: int = 4000) -> Any:
    """The plotly figure of ``records`` (a FigureWidget when ``widget``), or None without plotly."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return None
    lay = layout(records, max_marks)
    fig = go.FigureWidget() if widget else go.Figure()
    ms = 1e-6
    for kind, (name, color, span) in KINDS.items():
        marks = [m for m in lay.marks if m.kind == kind]
        if not marks:
            continue
        label = f"{name} ({lay.counts[kind]})"
        if span:
            fig.add_bar(orientation="h", base=[m.start * ms for m in marks],
                        x=[max(m.end - m.start, 1) * ms for m in marks], y=[m.lane for m in marks],
                        name=label, marker=dict(color=color), hovertext=[m.text for m in marks],
                        hoverinfo="text", width=0.5 if kind != "eval_end" else 0.8,
                        opacity=0.35 if kind == "eval_end" else 0.9)
        else:
            symbol = {"interrupt": "x", "event_signal": "triangle-up", "fence_update": "diamond"}.get(
                kind, "line-ns-open")
            fig.add_scatter(x=[m.start * ms for m in marks], y=[m.lane for m in marks], mode="markers",
                            name=label, marker=dict(color=color, symbol=symbol, size=9 if kind == "interrupt" else 7,
                                                    line=dict(width=1.5, color=color)),
                            hovertext=[m.text for m in marks], hoverinfo="text")
    if lay.arrows:
        xs, ys = [], []
        for a in lay.arrows:
            xs += [a.t0 * ms, a.t1 * ms, None]
            ys += [a.lane0, a.lane1, None]
        fig.add_scatter(x=xs, y=ys, mode="lines+markers", name=f"signal → wait ({len(lay.arrows)})",
                        line=dict(color="#64748b", width=1), hoverinfo="skip",
                        marker=dict(symbol="arrow", size=8, angleref="previous", color="#64748b"))
    # a fixed width: plotly measures 0 px inside a tab that is hidden when it first draws (and
    # in a notebook reopened from its saved widget state); the box around it scrolls instead
    fig.update_layout(barmode="overlay", height=max(150 + 40 * len(lay.lanes), 22 * len(lay.counts) + 90),
                      width=WIDTH, autosize=False,
                      margin=dict(l=70, r=10, t=30, b=50), template="plotly_white",
                      xaxis=dict(title="time since the first record (ms)", rangeslider=dict(visible=False)),
                      yaxis=dict(categoryorder="array", categoryarray=list(reversed(lay.lanes)), title=""),
                      legend=dict(orientation="v", x=1.01, y=1, font=dict(size=10)),
                      title=dict(text=(f"{sum(lay.counts.values())} records" + (
                          f" (first {len(lay.marks)} drawn)" if lay.dropped else "")), font=dict(size=12)))
    return fig


_default_source: list = [None]  # () -> records or None: set by the ``%%mlx`` magic


def set_default_records(source: Optional[Any]) -> None:
    """``source() -> list | None`` gives the records an ``EventsWidget()`` made without any
    shows (the ``%%mlx`` magic registers its last cell's); when it gives None, or none is set,
    the widget shows the whole timeline ring."""
    _default_source[0] = source


class EventsWidget:
    """The streams' events as a zoomable timeline. ``records``: timeline records (default: the
    last ``%%mlx`` cell's, else the whole timeline ring)."""

    def __init__(self, records: Optional[list] = None):
        self.widget = None
        self._build()
        self.refresh(records)

    def _build(self) -> None:
        import ipywidgets as W

        self.summary = W.HTML(layout=W.Layout(max_width="100%"))
        self.counts = W.HTML(layout=W.Layout(max_width="100%"))
        self.plot = W.Box(layout=W.Layout(max_width="100%", width="100%", overflow="auto"))
        self.refresh_button = W.Button(description="refresh", tooltip="read the timeline again",
                                       layout=W.Layout(width="auto"))
        self.refresh_button.on_click(lambda _: self.refresh())
        box = W.VBox([W.HTML(style_tag()), W.HBox([self.summary, self.refresh_button]), self.plot,
                      self.counts], layout=W.Layout(max_width="100%", overflow="hidden"))
        box.add_class("tapescope")
        box.add_class("tapescope-events-widget")
        self.widget = box

    @staticmethod
    def _default_records() -> list:
        source = _default_source[0]
        records = source() if source is not None else None
        if records is not None:
            return records
        from tapescope.kernels import timeline

        return timeline.records()

    def refresh(self, records: Optional[list] = None) -> None:
        """Draw ``records`` (default as in the constructor)."""
        self._fixed = records if records is not None else getattr(self, "_fixed", None)
        self.records = list(self._fixed) if self._fixed is not None else self._default_records()
        self.layout = layout(self.records)
        lay = self.layout
        if not lay.lanes:
            self.summary.value = "<p>No events were recorded (no eval ran while recording).</p>"
            self.plot.children = ()
            self.counts.value = ""
            return
        self.summary.value = (f"<div class='ts-headline'>{sum(lay.counts.values())} record(s) over "
                              f"{fmt_ns(lay.span)} on {esc(', '.join(lay.lanes))}; "
                              f"{len(lay.arrows)} signal → wait arrow(s)</div>"
                              "<span class='ts-muted'>drag to zoom, double-click to reset; hover for "
                              "details</span>")
        self.figure = events_figure(self.records)
        self.plot.children = (self.figure,) if self.figure is not None else ()
        self.counts.value = counts_html(lay)

    def _repr_mimebundle_(self, **kw: Any) -> dict:
        """One bundle: the live view and the HTML snapshot (IPython displays widgets through
        ``_ipython_display_``, as two outputs)."""
        bundle = self.widget._repr_mimebundle_(**kw) or {}
        bundle["text/html"] = snapshot_html(self.records)
        return bundle

    def _ipython_display_(self) -> None:
        from .theme import show

        show(self.widget, snapshot_html(self.records), repr(self))

    def __repr__(self) -> str:
        return f"EventsWidget({sum(self.layout.counts.values())} records on {', '.join(self.layout.lanes)})"
