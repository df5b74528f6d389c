"""The ``%%mlx`` panel: one tabbed widget (Summary | Graph | Kernels | Check | Memory | Cache |
Events) over a ``CellReport``. Summary comes first; a tab appears only when it has something
to show. Memory, Cache and Events hold the live widgets; Graph pans (scroll) and zooms (the
slider), and choosing a fused kernel shows its tape and source."""

from __future__ import annotations

import re
from typing import Any

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
                f"{' (compiled)' if report.compiled else ''}: {_esc(report._run_lines(r)[0])}</div>")
        summary = head + "".join(report.summary_html(x) if not x.unavailable else f"<p>{_esc(x.unavailable)}</p>"
                                 for x in report.runs)
        if r.arrays or len(report.runs) > 1:
            summary += "<p><b>results</b></p>" + report._results_html()
        add("Summary", _html(summary + "</div>"))
        sections = dict(report.sections(r))
        if "Graph" in sections:
            add("Graph", self._graph_tab(sections["Graph"]))
        if "Kernels" in sections:
            add("Kernels", _html(f"{style_tag()}<div class='tapescope-cell'>{sections['Kernels']}</div>"))
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

    def _graph_tab(self, body: str) -> Any:
        import ipywidgets as W

        r = self.report.run
        self._graph_body = body
        self.zoom = W.IntSlider(value=100, min=20, max=400, step=10, description="zoom %",
                                continuous_update=False, layout=W.Layout(width="320px"))
        self.graph_html = W.HTML(layout=W.Layout(max_width="100%"))
        self.zoom.observe(lambda _: self._draw_graph(), names="value")
        self._draw_graph()
        kids = [W.HBox([self.zoom, W.HTML("<span class='ts-muted'>scroll to pan</span>")]), self.graph_html]
        kernels = [(f"kernel {k.index}: {len(k.steps)} ops, {k.variant} ({title})", (title, g, k))
                   for title, g in r.graphs for k in g.kernels]
        if kernels:
            self.kernel_pick = W.Dropdown(options=[("choose a fused kernel…", None)] + kernels,
                                          description="fused kernel", style={"description_width": "initial"},
                                          layout=W.Layout(width="100%"))
            self.kernel_view = W.HTML(layout=W.Layout(max_width="100%"))
            self.kernel_pick.observe(lambda _: self._show_kernel(), names="value")
            kids += [self.kernel_pick, self.kernel_view]
        return W.VBox(kids, layout=W.Layout(max_width="100%"))

    def _draw_graph(self) -> None:
        z = self.zoom.value / 100
        self.graph_html.value = (f"{style_tag()}<div class='tapescope-cell'>"
                                 f"{zoomed_svg(self._graph_body, z) if z != 1 else self._graph_body}</div>")

    def _show_kernel(self) -> None:
        from tapescope.cell_report import source_html, tape_html

        v = self.kernel_pick.value
        if v is None:
            self.kernel_view.value = ""
            return
        title, g, k = v
        src = "".join(source_html(k.symbol, rt, s) for rt, s in k.sources.items())
        self.kernel_view.value = f"{style_tag()}<div class='tapescope-cell'>{tape_html(title, g, k)}{src}</div>"


def _esc(x: Any) -> str:
    import html

    return html.escape(str(x))


def _html(value: str) -> Any:
    import ipywidgets as W

    return W.HTML(value, layout=W.Layout(max_width="100%"))
