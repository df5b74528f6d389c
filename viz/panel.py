"""The ``%%mlx`` panel: one tabbed widget (Summary | Graph | Kernels | Check | Memory | Cache |
Events) over a ``CellReport``. Summary comes first; a tab appears only when it has something
to show. Memory, Cache and Events hold the live widgets; Graph pans (scroll) and zooms (the
slider), and clicking a fused kernel in the picture shows its tape and its source in every
dialect (``viz/pick.py``)."""

from __future__ import annotations

import re
from typing import Any

from .report import kernel_html, results_html, summary_html, tape_html
from .report import sections as report_sections
from .theme import style_tag

__all__ = ["CellPanel", "zoomed_svg"]

_SIZE = re.compile(r'<svg([^>]*?)\swidth="([\d.]+)pt"\s+height="([\d.]+)pt"')


def zoomed_svg(svg: str, zoom: float) -> str:
    """A graphviz SVG drawn at ``zoom`` times its natural size (width and height in px)."""
    def repl(m: re.Match) -> str:
        w, h = float(m.group(2)) * 4 / 3 * zoom, float(m.group(3)) * 4 / 3 * zoom
        return f'<svg{m.group(1)} width="{w:.0f}px" height="{h:.0f}px"'

    return _SIZE.sub(repl, svg)


class CellPanel:
    """The widget shown under a ``%%mlx`` cell (``widget``: an ipywidgets Tab)."""

    def __init__(self, report: Any):
        import ipywidgets as W

        self.report = report
        r = report.run
        self.titles: list = []
        kids: list = []

        def add(title: str, child: Any) -> None:
            self.titles.append(title)
            kids.append(child)

        head = (f"{style_tag()}<div class='tapescope-cell'><div class='ts-headline'>%%mlx"
                f"{' (compiled)' if report.compiled else ''}: {_esc(report.run_lines(r)[0])}</div>")
        summary = head + "".join(summary_html(report, x) if not x.unavailable else f"<p>{_esc(x.unavailable)}</p>"
                                 for x in report.runs)
        if r.arrays or len(report.runs) > 1:
            summary += "<p><b>results</b></p>" + results_html(report)
        add("Summary", _html(summary + "</div>"))
        sections = dict(report_sections(report, r, pickable=True))
        if "Graph" in sections:
            add("Graph", self._graph_tab(sections["Graph"]))
        if "Kernels" in sections:
            add("Kernels", self._kernels_tab(sections["Kernels"]))
        if "Check" in sections:
            add("Check", _html(f"{style_tag()}<div class='tapescope-cell'>{sections['Check']}</div>"))
        failed = r.error is not None and not r.records
        if "memory" in report.show and not failed:
            from .memory import MemoryWidget

            self.memory = MemoryWidget(records=r.records, live=False)
            cell = sections.get("Memory", "")
            add("Memory", W.VBox([self.memory.widget, _html(
                f"{style_tag()}<div class='tapescope-cell'><p><b>this cell</b></p>{cell}</div>")]))
        if "cache" in report.show and not failed:
            from .cache import CacheWidget

            self.cache = CacheWidget()
            cell = sections.get("Cache", "")
            kids_c = [self.cache.widget]
            if cell:
                kids_c.insert(0, _html(f"{style_tag()}<div class='tapescope-cell'><p><b>this cell</b>"
                                       f"</p>{cell}</div>"))
            add("Cache", W.VBox(kids_c))
        if "events" in report.show and "Events" in sections:
            from .events import EventsWidget

            self.events = EventsWidget(r.records)
            add("Events", self.events.widget)
        tab = W.Tab(children=kids, layout=W.Layout(max_width="100%"))
        for i, t in enumerate(self.titles):
            tab.set_title(i, t)
        tab.add_class("tapescope-panel")
        self.widget = tab

    def _kernels_tab(self, body: str) -> Any:
        """The roofline as a live plotly figure beside the Kernels section (its table, the
        tapes and the sources): above it when a kernel streams, else below."""
        import ipywidgets as W

        from tapescope.kernels import roofline

        from .roofline import roofline_figure

        html = _html(f"{style_tag()}<div class='tapescope-cell'>{body}</div>")
        placed = roofline.place(self.report.run.records)
        self.roofline = roofline_figure(placed, widget=True)
        if self.roofline is None:
            return html
        # first when a kernel streams (its table follows it), else below the tapes and sources
        kids = [self.roofline, html] if any(p.streams for p in placed) else [html, self.roofline]
        return W.VBox(kids, layout=W.Layout(max_width="100%"))

    def _graph_tab(self, body: str) -> Any:
        import ipywidgets as W

        from .pick import PickHTML

        r = self.report.run
        self._graph_body = body  # the pictures (fused kernels clickable) and the primitives run
        self.zoom = W.IntSlider(value=100, min=20, max=400, step=10, description="zoom %",
                                continuous_update=False, layout=W.Layout(width="320px"))
        self.graph_html = PickHTML(layout=W.Layout(max_width="100%"))
        self.zoom.observe(lambda _: self._draw_graph(), names="value")
        self._draw_graph()
        hint = "scroll to pan"
        if any(g.kernels for _, g in r.graphs):
            hint += "; click a fused kernel (a green box) for its tape and source"
        kids = [W.HBox([self.zoom, W.HTML(f"<span class='ts-muted'>{hint}</span>")]), self.graph_html]
        self.kernel_view = W.HTML(layout=W.Layout(max_width="100%"))
        self.graph_html.observe(lambda _: self._show_kernel(), names="picked")
        kids.append(self.kernel_view)
        return W.VBox(kids, layout=W.Layout(max_width="100%"))

    def _draw_graph(self) -> None:
        z = self.zoom.value / 100
        self.graph_html.value = (f"{style_tag()}<div class='tapescope-cell'>"
                                 f"{zoomed_svg(self._graph_body, z) if z != 1 else self._graph_body}</div>")

    def kernel_at(self, key: str) -> Any:
        """(graph title, Graph, Kernel) for a picked key ``"<graph>:ts_kernel_<kernel>"``, or None."""
        m = re.fullmatch(r"(\d+):ts_kernel_(\d+)", key or "")
        if m is None:
            return None
        graphs = self.report.run.graphs
        i, k = int(m.group(1)), int(m.group(2))
        if i >= len(graphs) or k >= len(graphs[i][1].kernels):
            return None
        title, g = graphs[i]
        return title, g, g.kernels[k]

    def _show_kernel(self) -> None:

        v = self.kernel_at(self.graph_html.picked)
        if v is None:
            self.kernel_view.value = ""
            return
        title, g, k = v
        try:
            body = f"{tape_html(title, g, k)}{kernel_html(k)}"
        except Exception as e:  # noqa: BLE001 - said in the view (a widget callback's error is lost)
            import traceback

            body = (f"<p class='ts-error'>The kernel view of {_esc(k.symbol)} failed: "
                    f"{_esc(type(e).__name__)}: {_esc(e)}</p><pre>{_esc(traceback.format_exc())}</pre>")
        self.kernel_view.value = f"{style_tag()}<div class='tapescope-cell ts-kernel-view'>{body}</div>"


def _esc(x: Any) -> str:
    import html

    return html.escape(str(x))


def _html(value: str) -> Any:
    import ipywidgets as W

    return W.HTML(value, layout=W.Layout(max_width="100%"))
