"""What a ``%%mlx`` cell did, as the report draws it: plain records the notebook layer fills.

A ``CellReport`` holds one ``DeviceRun`` per device the cell ran on: the timeline records
made while it ran, the arrays it assigned or evaluated (``ArrayResult``), the graphs it drew
(``viz/graph.py``'s), memory (``Memory``) and kernel-cache figures before and after, the
check's report (``viz/check.py``'s) and the error that ended it. Its text form is here, its
HTML ``viz/report.py``'s, its live panel ``viz/panel.py``'s; the ``%%mlx`` magic fills it
(``magic.py``, from what ``cell_recording.py`` collects) and nothing here reads the notebook
layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

__all__ = ["SECTIONS", "Memory", "ArrayResult", "DeviceRun", "CellReport"]

SECTIONS = ("graph", "tapes", "kernels", "check", "memory", "cache", "events")


@dataclass
class Memory:
    """Allocator figures at one moment (bytes): active, peak and buffer-cache memory."""

    active: int
    peak: int
    cache: int


@dataclass
class ArrayResult:
    """One array the cell produced: its name, shape, dtype, printed value and data."""

    name: str
    shape: tuple
    dtype: str
    text: str
    data: Optional[np.ndarray] = field(default=None, repr=False)


@dataclass
class DeviceRun:
    """One run of the cell on one device, with everything recorded while it ran."""

    device: str
    records: list = field(default_factory=list)
    arrays: list = field(default_factory=list)  # ArrayResult
    graphs: list = field(default_factory=list)  # (title, viz.graph.Graph)
    check: Any = None  # viz.check.CheckReport, or a str saying why there is none
    error: Optional[BaseException] = None
    wall_s: float = 0.0
    memory_before: Optional[Memory] = None
    memory_after: Optional[Memory] = None
    cache_before: dict = field(default_factory=dict)
    cache_after: dict = field(default_factory=dict)
    unavailable: Optional[str] = None  # why the device could not run the cell
    notes: list = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        """Whether the run ended with KeyboardInterrupt."""
        return isinstance(self.error, KeyboardInterrupt)

    def array(self, name: str) -> Optional[ArrayResult]:
        """The result named ``name``, or None."""
        return next((a for a in self.arrays if a.name == name), None)


class CellReport:
    """The display of a ``%%mlx`` cell: one DeviceRun per device, and the sections to show."""

    def __init__(self, code: str, runs: list, show: Optional[set] = None, compiled: bool = False,
                 filename: Optional[str] = None):
        self.code, self.runs = code, runs
        self.show = set(SECTIONS) if show is None else set(show)
        self.compiled = compiled
        self.filename = filename  # the cell's file name in tracebacks (where the error is)

    @property
    def run(self) -> DeviceRun:
        """The run whose results the namespace keeps (the first device that ran)."""
        return next((r for r in self.runs if r.unavailable is None), self.runs[0])

    def differences(self) -> list:
        """(name, shape/dtype match, max abs difference, allclose) between the first two runs."""
        ran = [r for r in self.runs if r.unavailable is None]
        if len(ran) < 2:
            return []
        a, b = ran[0], ran[1]
        out = []
        for x in a.arrays:
            y = b.array(x.name)
            if (y is None or x.data is None or y.data is None or x.data.shape != y.data.shape
                    or x.dtype != y.dtype):
                out.append((x.name, False, None, False))
                continue
            wide = np.complex128 if np.iscomplexobj(x.data) else np.float64
            xd, yd = x.data.astype(wide), y.data.astype(wide)
            d = float(np.max(np.abs(xd - yd))) if xd.size else 0.0
            out.append((x.name, True, d, bool(np.allclose(xd, yd, equal_nan=True))))
        return out

    # -- text ------------------------------------------------------------------------------
    def run_lines(self, r: DeviceRun) -> list:
        """The text lines of one device's run: what ran, its notes, how far it got, its arrays."""
        from .records import primitive_counts, progress_text

        if r.unavailable:
            return [f"[{r.device}] {r.unavailable}"]
        prims = primitive_counts(r.records)
        lines = [f"[{r.device}] {sum(prims.values())} primitive(s) run in {r.wall_s * 1e3:.1f} ms"
                 + (f": {', '.join(f'{n} x{c}' for n, c in prims.most_common(8))}" if prims else "")]
        lines += [f"  {n}" for n in r.notes]
        p = progress_text(r)
        if p:
            lines.append("  " + p)
        elif r.error is not None:
            lines.append(f"  stopped by {type(r.error).__name__}: {r.error}")
        for a in r.arrays:
            lines.append(f"  {a.name}: {a.shape} {a.dtype}")
        return lines

    def error_where(self, r: DeviceRun) -> Optional[tuple]:
        """(line number in the cell, its text) where the cell's error was raised, or None."""
        from .records import user_frames

        frames = user_frames(r.error, self.filename)
        return frames[-1] if frames else None

    def __repr__(self) -> str:
        lines = ["%%mlx" + (" (compiled)" if self.compiled else "")]
        for r in self.runs:
            lines += self.run_lines(r)
        for name, same, d, close in self.differences():
            lines.append(f"  {name}: " + ("shape/dtype differ" if not same else
                                          f"max |diff| {d:.3g}, {'close' if close else 'DIFFERENT'}"))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from .report import report_html

        return report_html(self)

    def _repr_mimebundle_(self, **kw: Any) -> dict:
        """The live tabbed panel (in a kernel with ipywidgets) with this static HTML as its
        snapshot; only the HTML elsewhere."""
        from .theme import in_kernel

        bundle = {"text/html": self._repr_html_(), "text/plain": repr(self)}
        if in_kernel():
            try:
                from .panel import CellPanel

                self.panel = CellPanel(self)
                view = self.panel.widget._repr_mimebundle_(**kw) or {}
                bundle.update({k: v for k, v in view.items() if k != "text/plain"})
            except ImportError:
                pass
        return bundle
