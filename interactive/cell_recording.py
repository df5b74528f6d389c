"""What a ``%%mlx`` cell's report is made from, collected while the cell runs: the timeline's
records (``Collector``, drained on a thread so a long cell keeps them all), the allocator's
figures (``memory_now``) and the kernel cache's counts (``cache_counts``) before and after.
Each is read through public functions (``mx.get_*_memory``, the timeline, the kernel
registry's entries); the records themselves, their text and their HTML are
``tapescope.viz.cell``'s.
"""

from __future__ import annotations

__all__ = ["memory_now", "cache_counts", "Collector"]


def memory_now():
    """The allocator's active / peak / cache memory now (``mx.get_*_memory``), a
    ``viz.cell.Memory``."""
    import tapescope.core as mx
    from tapescope.viz.cell import Memory

    return Memory(mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory())


def cache_counts() -> dict:
    """Kernel-cache entries now: name -> (hits, misses), the counts ``tapescope.kernel_cache()``
    lists (read without its roofline column)."""
    from tapescope.kernels.kernel_registry import entries

    return {e.name: (e.hits, e.misses) for e in entries()}


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
