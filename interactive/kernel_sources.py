"""A fused kernel's sources side by side: C (CPU), CUDA and Metal (MSL) of the same tape.

``sources_html(kernel.sources)`` is what the viz and the ``%%mlx`` report show (one column per
runtime, each highlighted with pygments and collapsed to its first lines); ``Kernel.sources_html()``
in ``graph.py`` calls it for one kernel of ``tapescope.trace(f, x)``, and ``entry_sources`` gives
the same three sources for an entry of ``tapescope.kernel_cache()``.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["LANG", "entry_sources", "sources_html"]

# runtime -> (column title, pygments language for tapescope.viz.theme.highlight)
LANG = {"cpu": ("C", "c"), "cuda": ("CUDA", "cuda"), "metal": ("Metal", "metal")}


def entry_sources(entry: dict) -> dict:
    """runtime -> source for a ``kernel_cache()`` entry: the source it was built from (C, or
    CUDA for a GPU kernel) and the other dialects of the same tape and variant (only the
    built one when the entry kept no tape)."""
    tape = entry.get("tape")
    if tape is None:
        return {"cpu": entry["source"]} if entry.get("source") else {}
    from tapescope.kernels.codegen.render import kernel_sources

    runtime = entry.get("runtime", "cpu")
    built = {runtime: entry.get("source")} if runtime in ("cpu", "cuda") else {}
    return kernel_sources(tape, tape.lib_name, entry["variant"], built=built)


def sources_html(sources: dict, title: str = "", lines: Optional[int] = 14, focus: str = "") -> str:
    """An HTML table with one column per runtime (``cpu``, ``cuda``, ``metal``): each source
    highlighted, ``lines`` lines shown from the first that names ``focus`` (the tape's kernel
    name: the kernel itself rather than the includes) and the rest collapsed (None: all)."""
    from tapescope.viz.theme import collapsed_source, esc, highlight

    heads = "".join(f"<th>{esc(LANG.get(k, (k,))[0])}</th>" for k in sources)
    cells = "".join(
        "<td>" + (collapsed_source(src, LANG.get(k, (k, "c"))[1], lines, focus) if lines else
                  f"<div class='ts-source'>{highlight(src, LANG.get(k, (k, 'c'))[1])}</div>") + "</td>"
        for k, src in sources.items())
    cap = f"<caption><code>{esc(title)}</code></caption>" if title else ""
    return (f"<table class='ts-table tapescope-kernel-sources'>{cap}<thead><tr>{heads}</tr></thead>"
            f"<tbody><tr>{cells}</tr></tbody></table>")
