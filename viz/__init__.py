"""tapescope.viz: graphviz pictures and widgets (graphviz, ipywidgets, plotly and pygments
load lazily, when a picture or widget is first made).

``MemoryWidget()``, ``CacheWidget()`` and ``EventsWidget()`` each work alone in a notebook;
``export_trace(path)`` writes the timeline as Chrome trace-event JSON.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MemoryWidget", "CacheWidget", "EventsWidget", "export_trace"]


def __getattr__(name: str) -> Any:  # lazy: importing tapescope.viz imports no widget library
    if name == "MemoryWidget":
        from .memory import MemoryWidget

        return MemoryWidget
    if name == "CacheWidget":
        from .cache import CacheWidget

        return CacheWidget
    if name == "EventsWidget":
        from .events import EventsWidget

        return EventsWidget
    if name == "export_trace":
        from .trace import export_trace

        return export_trace
    raise AttributeError(f"module 'tapescope.viz' has no attribute {name!r}")
