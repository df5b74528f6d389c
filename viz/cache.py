"""The kernel-cache widget: a sortable, filterable, paged table of ``tapescope.kernel_cache()``
(short names, the full name on hover), and the source of the selected kernel, highlighted,
beside the sources of the other variants of the same tape (one column per variant and
dialect: only the C dialect exists so far)."""

from __future__ import annotations

import os
from typing import Any, Optional

from .theme import collapsed_source, esc, short_name, style_tag, table

__all__ = ["CacheWidget", "cache_rows", "snapshot_html", "SORT_KEYS"]

SORT_KEYS = ("name", "runtime", "variant", "build_ms", "hits", "misses", "origin")
PAGE = 12
COLUMNS = ["kernel", "runtime", "variant", "build ms", "hits", "misses", "from", "disk path"]


def _entries() -> list:
    from tapescope.kernel_cache import kernel_cache

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
            e.get("origin", ""), path)


def rows_html(rows: list, start: int = 0, page: int = PAGE) -> str:
    """One page of the table."""
    shown = rows[start:start + page]
    if not rows:
        return "<p class='ts-muted'>No kernels are cached (nothing compiled has run yet).</p>"
    return table(COLUMNS, [_row(e) for e in shown], "tapescope-cache", limit=page, raw=(0, 7)) + (
        f"<p class='ts-muted'>rows {start + 1}–{start + len(shown)} of {len(rows)}</p>")


def source_html(entry: dict, entries: list) -> str:
    """The selected kernel's source and, beside it, the other variants of the same tape."""
    base = base_name(entry)
    same = [e for e in entries if base_name(e) == base and e["source"]]
    same.sort(key=lambda e: e["name"] != entry["name"])
    cols = "".join(
        f"<div><p><b>{esc(e['runtime'])} · {esc(e['variant'])}</b>"
        f"{' (selected)' if e['name'] == entry['name'] else ''}</p>"
        f"{collapsed_source(e['source'], 'c', 16)}</div>" for e in same)
    head = (f"<p><code title='{esc(entry['name'])}'>{esc(short_name(entry['name'], 60))}</code>: "
            f"{entry['hits']} hit(s), {entry['misses']} miss(es), built in {entry['build_ms']:.1f} ms, "
            f"from {esc(entry.get('origin', ''))}{'; ' + esc(entry['cache_note']) if entry.get('cache_note') else ''}</p>")
    return head + (f"<div class='ts-columns'>{cols}</div>" if cols else
                   "<p class='ts-muted'>No source (a numpy fallback).</p>")


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

        self.filter = W.Text(placeholder="filter: name, runtime, variant, origin",
                             layout=W.Layout(width="260px"))
        self.sort = W.Dropdown(options=list(SORT_KEYS), value="hits", description="sort by",
                               layout=W.Layout(width="190px"), style={"description_width": "initial"})
        self.descending = W.ToggleButton(value=True, description="descending",
                                         layout=W.Layout(width="auto"))
        self.prev_button = W.Button(description="◀ previous", layout=W.Layout(width="auto"))
        self.next_button = W.Button(description="next ▶", layout=W.Layout(width="auto"))
        self.refresh_button = W.Button(description="refresh", layout=W.Layout(width="auto"))
        self.table = W.HTML(layout=W.Layout(max_width="100%"))
        self.select = W.Dropdown(description="kernel", options=[], layout=W.Layout(width="100%"),
                                 style={"description_width": "initial"})
        self.source = W.HTML(layout=W.Layout(max_width="100%"))
        for w in (self.filter, self.sort, self.descending):
            w.observe(lambda _: self._redraw(reset=True), names="value")
        self.select.observe(lambda _: self._show_source(), names="value")
        self.prev_button.on_click(lambda _: self.page(-1))
        self.next_button.on_click(lambda _: self.page(1))
        self.refresh_button.on_click(lambda _: self.refresh())
        controls = W.HBox([self.filter, self.sort, self.descending, self.prev_button, self.next_button,
                           self.refresh_button], layout=W.Layout(flex_flow="row wrap"))
        box = W.VBox([W.HTML(style_tag()), controls, self.table, self.select, self.source],
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
        page = rows[self.start:self.start + PAGE]
        opts = [(short_name(e["name"], 70), e["name"]) for e in page]
        keep = self.select.value if self.select.value in [v for _, v in opts] else None
        self.select.options = opts
        self.select.value = keep if keep is not None else (opts[0][1] if opts else None)
        self._show_source()

    def _show_source(self) -> None:
        e = next((e for e in self._entries if e["name"] == self.select.value), None)
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
