"""A fused kernel's sources side by side: C (CPU), CUDA and Metal (MSL) of the same tape.

``sources_html(kernel.sources)`` is what the viz and the ``%%mlx`` report show (one column per
runtime, each highlighted with pygments and collapsed to its first lines); ``sources_page``
(its styles with it) is what ``Kernel.sources_html()`` in ``graph.py`` shows for one kernel of
``tapescope.trace(f, x)``; for an entry of
``tapescope.kernel_cache()`` the three sources come from ``tapescope.kernels.cache_entries.entry_sources``.
"""

from __future__ import annotations

from typing import Optional

from .theme import collapsed_source, esc, highlight, style_tag

__all__ = ["LANG", "sources_html", "sources_page"]

# runtime -> (column title, pygments language for tapescope.viz.theme.highlight)
LANG = {"cpu": ("C", "c"), "cuda": ("CUDA", "cuda"), "metal": ("Metal", "metal")}


def sources_html(sources: dict, title: str = "", lines: Optional[int] = 14, focus: str = "") -> str:
    """An HTML table with one column per runtime (``cpu``, ``cuda``, ``metal``): each source
    highlighted, ``lines`` lines shown from the first that names ``focus`` (the tape's kernel
    name: the kernel itself rather than the includes) and the rest collapsed (None: all)."""
    heads = "".join(f"<th>{esc(LANG.get(k, (k,))[0])}</th>" for k in sources)
    cells = "".join(
        "<td>" + (collapsed_source(src, LANG.get(k, (k, "c"))[1], lines, focus) if lines else
                  f"<div class='ts-source'>{highlight(src, LANG.get(k, (k, 'c'))[1])}</div>") + "</td>"
        for k, src in sources.items())
    cap = f"<caption><code>{esc(title)}</code></caption>" if title else ""
    return (f"<table class='ts-table tapescope-kernel-sources'>{cap}<thead><tr>{heads}</tr></thead>"
            f"<tbody><tr>{cells}</tr></tbody></table>")


def sources_page(sources: dict, title: str = "", focus: str = "") -> str:
    """``sources_html`` with tapescope's styles, to show on its own (a notebook output)."""
    return f"{style_tag()}<div class='tapescope'>{sources_html(sources, title=title, focus=focus)}</div>"
