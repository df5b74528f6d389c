"""The kernel-cache widget: a sortable, filterable, paged table of ``tapescope.kernel_cache()``
(short names, the full name on hover); clicking a row shows that kernel's source highlighted,
the sources of the same tape and variant in every dialect side by side (C, CUDA, Metal), and
the C of the tape's other cached variants."""

from __future__ import annotations

import os
from typing import Any, Optional

from .theme import collapsed_source, details, esc, short_name, style_tag, table

__all__ = ["CacheWidget", "cache_rows", "snapshot_html", "SORT_KEYS"]

SORT_KEYS = ("name", "runtime", "variant", "build_ms", "hits", "misses", "origin")
PAGE = 12
COLUMNS = ["kernel", "runtime", "variant", "build ms", "hits", "misses", "of copy bw", "from",
           "disk path"]


def _entries() -> list:
    from tapescope.kernels.cache_entries import kernel_cache

    return kernel_cache()


def base_name(entry: dict) -> str:
    """The kernel name without its variant suffix (the tape's name)."""
    name, var = entry["name"], entry.get("variant") or ""
    return name[: -len(var) - 1] if var and name.endswith("_" + var) else name


def cache_rows(entries: list, filter_text: str = "", sort: str = "name", descending: bool = False) -> list:
    """The entries whose name, runtime, variant or origin contains ``filter_text`` (any case),
    sorted by ``sort``."""
    if sort not in SORT_KEYS:
        raise ValueError(f"[CacheWidget] sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}.")
    f = filter_text.strip().lower()
    rows = [e for e in entries
            if not f or any(f in str(e.get(k, "")).lower() for k in ("name", "runtime", "variant", "origin"))]
    return sorted(rows, key=lambda e: (e.get(sort) is None, e.get(sort)), reverse=descending)


def _row(e: dict) -> tuple:
    name = f"<code title='{esc(e['name'])}'>{esc(short_name(e['name'], 36))}</code>"
    disk = e.get("disk_path") or ""
    path = f"<span title='{esc(disk)}'>{esc(short_name(os.path.basename(disk), 24))}</span>" if disk else "—"
    return (name, e["runtime"], e["variant"], f"{e['build_ms']:.1f}", e["hits"], e["misses"],
            _roof(e.get("roofline")), e.get("origin", ""), path)


def _roof(r) -> str:
    """The roofline column: the recorded launches' fraction of the copy bandwidth."""
    if not r or r.get("bandwidth_fraction") is None:
        return "—"
    return f"{r['bandwidth_fraction']:.0%}" + (f" ({r['why']})" if r.get("why") else "")


def rows_html(rows: list, start: int = 0, page: int = PAGE) -> str:
    """One page of the table; each row's ``data-pick`` is its kernel name."""
    shown = rows[start:start + page]
    if not rows:
        return "<p class='ts-muted'>No kernels are cached (nothing compiled has run yet).</p>"
    return table(COLUMNS, [_row(e) for e in shown], "tapescope-cache", limit=page, raw=(0, 8),
                 picks=[e["name"] for e in shown]) + (
        f"<p class='ts-muted'>rows {start + 1}–{start + len(shown)} of {len(rows)}</p>")


def source_html(entry: dict, entries: list) -> str:
    """The selected kernel: its figures, its tape's source in every dialect side by side
    (``viz.sources``), then the C of the tape's other cached variants."""
    from tapescope.kernels.cache_entries import entry_sources

    from .sources import sources_html

    base = base_name(entry)
    head = (f"<p><code title='{esc(entry['name'])}'>{esc(short_name(entry['name'], 60))}</code>: "
            f"{entry['hits']} hit(s), {entry['misses']} miss(es), built in {entry['build_ms']:.1f} ms, "
            f"from {esc(entry.get('origin', ''))}{'; ' + esc(entry['cache_note']) if entry.get('cache_note') else ''}</p>")
    sources = entry_sources(entry)
    if not sources:
        return head + "<p class='ts-muted'>No source (a numpy fallback).</p>"
    out = head + sources_html(sources, lines=16, focus=base)
    others = [e for e in entries if base_name(e) == base and e["name"] != entry["name"] and e["source"]]
    for e in others:
        out += details(f"the {esc(e['variant'])} variant of this tape ({esc(e['runtime'])})",
                       collapsed_source(e["source"], "c", 16))
    return out


def snapshot_html(entries: Optional[list] = None) -> str:
    """A static view: the first page of the table, sorted by hits."""
    entries = _entries() if entries is None else entries
    rows = cache_rows(entries, sort="hits", descending=True)
    return (f"{style_tag()}<div class='tapescope ts-cache-snapshot'><div class='ts-headline'>kernel cache: "
            f"{len(entries)} kernel(s), {sum(e['hits'] for e in entries)} hit(s), "
            f"{sum(e['misses'] for e in entries)} miss(es)</div>{rows_html(rows)}</div>")


class CacheWidget:
    """The kernel cache as a live table: filter, sort, pages, and the selected kernel's source."""

    def __init__(self, entries: Optional[list] = None):
        self._fixed = entries
        self.start = 0
        self.widget = self._build()
        self.refresh()

    def _build(self) -> Any:
        import ipywidgets as W

        from .pick import PickHTML

        self.filter = W.Text(placeholder="filter: name, runtime, variant, origin",
                             layout=W.Layout(width="260px"))
        self.sort = W.Dropdown(options=list(SORT_KEYS), value="hits", description="sort by",
                               layout=W.Layout(width="190px"), style={"description_width": "initial"})
        self.descending = W.ToggleButton(value=True, description="descending",
                                         layout=W.Layout(width="auto"))
        self.prev_button = W.Button(description="◀ previous", layout=W.Layout(width="auto"))
        self.next_button = W.Button(description="next ▶", layout=W.Layout(width="auto"))
        self.refresh_button = W.Button(description="refresh", layout=W.Layout(width="auto"))
        self.table = PickHTML(layout=W.Layout(max_width="100%"))  # click a row: its source
        self.source = W.HTML(layout=W.Layout(max_width="100%"))
        for w in (self.filter, self.sort, self.descending):
            w.observe(lambda _: self._redraw(reset=True), names="value")
        self.table.observe(lambda _: self._show_source(), names="picked")
        self.prev_button.on_click(lambda _: self.page(-1))
        self.next_button.on_click(lambda _: self.page(1))
        self.refresh_button.on_click(lambda _: self.refresh())
        controls = W.HBox([self.filter, self.sort, self.descending, self.prev_button, self.next_button,
                           self.refresh_button], layout=W.Layout(flex_flow="row wrap"))
        box = W.VBox([W.HTML(style_tag()), controls, self.table,
                      W.HTML("<span class='ts-muted'>click a row for its source in C, CUDA and Metal</span>"),
                      self.source],
                     layout=W.Layout(max_width="100%", overflow="hidden"))
        box.add_class("tapescope")
        box.add_class("tapescope-cache-widget")
        return box

    @property
    def entries(self) -> list:
        return self._entries

    def rows(self) -> list:
        """The rows the table shows now (filtered and sorted; every page)."""
        return cache_rows(self._entries, self.filter.value, self.sort.value, self.descending.value)

    def refresh(self) -> None:
        """Read ``tapescope.kernel_cache()`` again and redraw."""
        self._entries = list(self._fixed) if self._fixed is not None else _entries()
        self._redraw()

    def page(self, step: int) -> None:
        n = len(self.rows())
        self.start = max(0, min(self.start + step * PAGE, max(n - 1, 0) // PAGE * PAGE))
        self._redraw()

    def _redraw(self, reset: bool = False) -> None:
        if reset:
            self.start = 0
        rows = self.rows()
        self.table.value = rows_html(rows, self.start)
        page = [e["name"] for e in rows[self.start:self.start + PAGE]]
        if self.table.picked not in page:
            self.table.picked = page[0] if page else ""
        self._show_source()

    @property
    def selected(self) -> str:
        """The name of the kernel whose source is shown ("" for none)."""
        return self.table.picked

    def _show_source(self) -> None:
        e = next((e for e in self._entries if e["name"] == self.table.picked), None)
        self.source.value = "" if e is None else source_html(e, self._entries)

    def _repr_mimebundle_(self, **kw: Any) -> dict:
        """One bundle: the live view and the HTML snapshot (IPython displays widgets through
        ``_ipython_display_``, as two outputs)."""
        bundle = self.widget._repr_mimebundle_(**kw) or {}
        bundle["text/html"] = snapshot_html(self._entries)
        return bundle

    def _ipython_display_(self) -> None:
        from .theme import show

        show(self.widget, snapshot_html(self._entries), repr(self))

    def __repr__(self) -> str:
        return f"CacheWidget({len(self._entries)} kernel(s))"
