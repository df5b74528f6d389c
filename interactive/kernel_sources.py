"""A fused kernel's sources side by side: C (CPU), CUDA and Metal (MSL) of the same tape.

``sources_html(kernel.sources)`` is the hook the viz / ``%%mlx`` panel can call (one column
per runtime, the code highlighted with pygments when it is installed); ``Kernel.sources_html()``
in ``graph.py`` calls it for one kernel of ``tapescope.trace(f, x)``.
"""

from __future__ import annotations

import html

LANG = {"cpu": ("C", "c"), "cuda": ("CUDA", "cuda"), "metal": ("Metal", "cpp")}


def _code(source: str, lexer: str) -> str:
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name

        return highlight(source, get_lexer_by_name(lexer), HtmlFormatter(noclasses=True, nowrap=False))
    except Exception:  # no pygments: plain text
        return f"<pre>{html.escape(source)}</pre>"


def sources_html(sources: dict, title: str = "") -> str:
    """An HTML table with one column per runtime (``cpu``, ``cuda``, ``metal``)."""
    heads = "".join(f"<th>{LANG.get(k, (k,))[0]}</th>" for k in sources)
    cells = "".join(
        f'<td style="vertical-align:top;max-width:40em;overflow:auto;font-size:11px">'
        f"{_code(src, LANG.get(k, (k, 'c'))[1])}</td>" for k, src in sources.items())
    cap = f"<caption>{html.escape(title)}</caption>" if title else ""
    return f'<table class="tapescope-kernel-sources">{cap}<tr>{heads}</tr><tr>{cells}</tr></table>'
