"""Progress bars for long evals and kernel-build batches, read off the timeline.

While enabled, a monitor thread reads the timeline's new records every ``interval`` seconds:
an ``eval_begin`` record (``detail["nodes"]``) opens an eval, each ``primitive`` record is one
node done, and its ``eval_end`` records (one per stream) close it; a ``kernel_batch_begin``
record (``detail["kernels"]``) opens a batch of kernel builds, each ``kernel_build`` record
that was not a cache hit is one kernel built, and ``kernel_batch_end`` closes it. Once an eval
or batch has run longer than ``min_seconds`` it gets a ``tqdm.auto`` bar (a widget in
notebooks, text in terminals): "nodes done of total" / "kernels built of total".

Enabling turns timeline recording on (one ``record()`` listener) for as long as it lasts;
``tapescope.core`` knows nothing of this module and never imports tqdm.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from tapescope.kernels import timeline

MIN_SECONDS = 1.0
INTERVAL = 0.1


class _Task:
    """One eval or kernel batch being watched."""

    __slots__ = ("kind", "start_ns", "total", "done", "ends_left", "bar")

    def __init__(self, kind: str, start_ns: int, total: int, ends: int = 1):
        self.kind, self.start_ns, self.total, self.done = kind, start_ns, total, 0
        self.ends_left = ends
        self.bar = None


class ProgressMonitor:
    """Turns timeline records into progress bars (``feed`` is the whole logic; ``poll``
    reads the timeline; ``start`` runs ``poll`` on a daemon thread)."""

    def __init__(self, min_seconds: float = MIN_SECONDS, interval: float = INTERVAL,
                 file: Any = None, leave: bool = False):
        self.min_seconds = float(min_seconds)
        self.interval = float(interval)
        self.file = file
        self.leave = leave
        self.tasks: list[_Task] = []
        self.shown = 0  # how many bars were opened (for tests and the %%mlx display)
        self._last_seq = -1
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._listener: Optional[timeline.record] = None
        self._lock = threading.Lock()

    # -- the logic ---------------------------------------------------------------------------
    def feed(self, records: list, now_ns: int) -> None:
        """Apply new timeline records (oldest first), then open or update bars as of ``now_ns``."""
        with self._lock:
            for r in records:
                self._apply(r)
            for t in self.tasks:
                if t.bar is None and now_ns - t.start_ns >= self.min_seconds * 1e9:
                    self._open(t)
                if t.bar is not None:
                    t.bar.n = min(t.done, t.total)
                    t.bar.refresh()
            for t in [t for t in self.tasks if t.ends_left <= 0]:
                self._close(t)

    def _apply(self, r) -> None:
        kind = r.kind
        if kind == "eval_begin":
            streams = r.detail.get("streams") or [None]
            self.tasks.append(_Task("eval", r.start_ns, int(r.detail.get("nodes", 0)), len(streams)))
        elif kind == "primitive":
            t = self._oldest("eval")
            if t is not None:
                t.done += 1
        elif kind == "eval_end":
            t = self._oldest("eval")
            if t is not None:
                t.ends_left -= 1
        elif kind == "kernel_batch_begin":
            self.tasks.append(_Task("kernels", r.start_ns, int(r.detail.get("kernels", 0))))
        elif kind == "kernel_build":
            if not r.detail.get("hit", False):
                t = self._oldest("kernels")
                if t is not None:
                    t.done += 1
        elif kind == "kernel_batch_end":
            t = self._oldest("kernels")
            if t is not None:
                t.ends_left -= 1

    def _oldest(self, kind: str) -> Optional[_Task]:
        for t in self.tasks:
            if t.kind == kind and t.ends_left > 0:
                return t
        return None

    def _open(self, t: _Task) -> None:
        from tqdm.auto import tqdm

        desc, unit = ("eval", "node") if t.kind == "eval" else ("building kernels", "kernel")
        t.bar = tqdm(total=t.total, initial=min(t.done, t.total), desc=desc, unit=unit,
                     file=self.file, leave=self.leave, dynamic_ncols=True)
        self.shown += 1

    def _close(self, t: _Task) -> None:
        if t.bar is not None:
            t.bar.n = min(t.done, t.total)
            t.bar.refresh()
            t.bar.close()
        self.tasks.remove(t)

    # -- reading the timeline ----------------------------------------------------------------
    def poll(self) -> None:
        """Feed the records added to the timeline since the last poll. Records the ring dropped
        before this poll read them (a long eval outruns a descheduled poller) count as nodes
        done of the oldest open eval: nearly every record of a running eval is a primitive
        run, and a bar that stops short of what the report says is wrong."""
        new = timeline.records_since(self._last_seq + 1)
        if new:
            lost = new[0].seq - (self._last_seq + 1)
            self._last_seq = new[-1].seq
            if lost > 0:
                with self._lock:
                    t = self._oldest("eval")
                    if t is not None:
                        t.done = min(t.total, t.done + lost)
        self.feed(new, timeline.now())

    def start(self) -> None:
        """Start recording the timeline and watching it on a daemon thread."""
        if self._thread is not None:
            return
        self._listener = timeline.record().__enter__()
        self._last_seq = timeline.next_seq() - 1
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tapescope-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a progress bar must never break an eval
                pass

    def stop(self) -> None:
        """Stop watching: a last poll, close every bar, stop recording."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            self.poll()
        finally:
            with self._lock:
                for t in list(self.tasks):
                    t.ends_left = 0
                    self._close(t)
            if self._listener is not None:
                self._listener.__exit__(None, None, None)
                self._listener = None


_monitor: Optional[ProgressMonitor] = None


def enable(min_seconds: float = MIN_SECONDS, interval: float = INTERVAL, file: Any = None) -> ProgressMonitor:
    """Show a progress bar for every eval / kernel batch longer than ``min_seconds``."""
    global _monitor
    disable()
    _monitor = ProgressMonitor(min_seconds, interval, file)
    _monitor.start()
    return _monitor


def disable() -> None:
    """Stop showing progress bars (and stop the timeline recording they needed)."""
    global _monitor
    if _monitor is not None:
        _monitor.stop()
        _monitor = None


def is_enabled() -> bool:
    """Whether progress bars are on."""
    return _monitor is not None


class progress:
    """``with progress():`` shows progress bars for what runs inside the block."""

    def __init__(self, min_seconds: float = MIN_SECONDS, interval: float = INTERVAL, file: Any = None):
        self.monitor = ProgressMonitor(min_seconds, interval, file)

    def __enter__(self) -> ProgressMonitor:
        self.monitor.start()
        return self.monitor

    def __exit__(self, *exc) -> bool:
        self.monitor.stop()
        return False
