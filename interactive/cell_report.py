"""What a ``%%mlx`` cell did, read off the timeline (its HTML is ``tapescope.viz.report``'s).

A ``CellReport`` holds one ``DeviceRun`` per device the cell ran on: the timeline records made
while it ran (``tapescope.record()``), the arrays it assigned or evaluated, the compiled
functions it traced, memory and kernel-cache figures before and after, the check report and
the error that ended it. Every section (graph, tapes, kernels, check, memory, cache, events)
is computed from those records and public functions only; nothing here reaches into the
scheduler or the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

__all__ = ["SECTIONS", "Memory", "ArrayResult", "DeviceRun", "CellReport", "memory_now",
           "cache_counts", "Collector"]

SECTIONS = ("graph", "tapes", "kernels", "check", "memory", "cache", "events")


@dataclass
class Memory:
    """Allocator figures at one moment (bytes): active, peak and buffer-cache memory."""

    active: int
    peak: int
    cache: int


def memory_now() -> Memory:
    """The allocator's active / peak / cache memory now (``mx.get_*_memory``)."""
    import tapescope.core as mx

    return Memory(mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory())


def cache_counts() -> dict:
    """Kernel-cache entries now: name -> (hits, misses), the counts ``tapescope.kernel_cache()``
    lists (read without its roofline column)."""
    from tapescope.kernels.cpu import compiler

    return {e.name: (e.hits, e.misses) for e in compiler.entries()}


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
    graphs: list = field(default_factory=list)  # (title, tapescope.Graph)
    check: Any = None  # CheckReport, or a str saying why there is none
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
            if y is None or x.data is None or y.data is None:
                out.append((x.name, False, None, False))
                continue
            same = x.data.shape == y.data.shape and x.dtype == y.dtype
            if not same:
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
        from tapescope.viz.records import primitive_counts, progress_text

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
        from tapescope.viz.records import user_frames

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
        from tapescope.viz.report import report_html

        return report_html(self)

    def _repr_mimebundle_(self, **kw: Any) -> dict:
        """The live tabbed panel (in a kernel with ipywidgets) with this static HTML as its
        snapshot; only the HTML elsewhere."""
        bundle = {"text/html": self._repr_html_(), "text/plain": repr(self)}
        if _in_kernel():
            try:
                from tapescope.viz.panel import CellPanel

                self.panel = CellPanel(self)
                view = self.panel.widget._repr_mimebundle_(**kw) or {}
                bundle.update({k: v for k, v in view.items() if k != "text/plain"})
            except ImportError:
                pass
        return bundle


def _in_kernel() -> bool:
    """Whether an IPython kernel (with a frontend that can show widgets) runs this code."""
    import sys

    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return shell is not None and getattr(shell, "kernel", None) is not None
    except Exception:  # noqa: BLE001
        return False


class Collector:
    """Records the timeline while a cell runs, draining the ring on a thread every ``interval``
    seconds so that a long cell keeps every record (up to ``limit``), not only the ring's last
    ``timeline.CAPACITY``."""

    def __init__(self, interval: float = 0.05, limit: int = 2_000_000):
        self.interval, self.limit = interval, limit
        self.records: list = []
        self.dropped = 0
        self._last = -1
        self._stop = None
        self._thread = None
        self._listener = None

    def _drain(self) -> None:
        from tapescope.kernels import timeline

        new = []
        for r in reversed(timeline.records()):
            if r.seq <= self._last:
                break
            new.append(r)
        if not new:
            return
        new.reverse()
        self._last = new[-1].seq
        room = self.limit - len(self.records)
        if room < len(new):
            self.dropped += len(new) - max(room, 0)
            new = new[:max(room, 0)]
        self.records.extend(new)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._drain()

    def __enter__(self) -> "Collector":
        import threading

        from tapescope.kernels import timeline

        self._listener = timeline.record().__enter__()
        recs = timeline.records()
        self._last = recs[-1].seq if recs else -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tapescope-cell", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join()
        self._drain()
        self._listener.__exit__(None, None, None)
        return False
