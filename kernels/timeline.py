"""The timeline: a bounded ring of records of what happened (evals, primitive runs, ...).

The ring is preallocated (``CAPACITY`` slots; record ``seq`` lives in slot ``seq %
CAPACITY``, so the oldest is overwritten once it is full). Recording costs one flag check
when nobody listens: the eval loop and every other recorder test ``timeline.enabled``
before building a record, and run the same code either way. Listeners (``record()``
regions, counters) turn it on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

CAPACITY = 100_000


@dataclass
class Record:
    """One thing that happened: ``kind`` (e.g. ``"primitive"``), when, where, and details."""

    kind: str
    start_ns: int
    end_ns: int
    stream: Optional[int] = None
    device: Optional[str] = None
    thread: Optional[int] = None
    name: Optional[str] = None
    node: Optional[int] = None
    nbytes: int = 0
    detail: dict = field(default_factory=dict)
    seq: int = 0


# re-entrant: a list made while it is held (records_since) can start a garbage collection
# whose finalizers free buffers, and a free adds a record on the same thread (with a plain
# lock that thread waited on itself forever: a hang seen under xdist on the GPU machine)
_lock = threading.RLock()
_ring: list = [None] * CAPACITY
_next_seq = 0
_first = 0  # the first sequence number still in the ring (``clear`` moves it on)
_listeners = 0
_always = False
enabled = False


def _update_enabled() -> None:
    global enabled
    enabled = _always or _listeners > 0


def set_recording(on: bool) -> None:
    """Keep recording into the ring even when no ``record()`` region is open."""
    global _always
    with _lock:
        _always = bool(on)
        _update_enabled()


def add(kind: str, start_ns: int, end_ns: Optional[int] = None, **kw: Any) -> None:
    """Append a record (callers check ``enabled`` first)."""
    rec = Record(kind, start_ns, start_ns if end_ns is None else end_ns,
                 thread=threading.get_ident(), **kw)
    global _next_seq
    with _lock:
        rec.seq = seq = _next_seq
        _ring[seq % CAPACITY] = rec
        _next_seq = seq + 1


def now() -> int:
    return time.perf_counter_ns()


def records() -> list[Record]:
    """A copy of every record in the ring, oldest first."""
    return records_since(0)


def records_since(seq: int) -> list[Record]:
    """The records with ``seq`` >= ``seq`` still in the ring, oldest first (for pollers such
    as progress bars)."""
    with _lock:
        end = _next_seq
        start = max(seq, _first, end - CAPACITY)
        if start >= end:
            return []
        a, b = start % CAPACITY, end % CAPACITY
        if a < b:
            return _ring[a:b]
        return _ring[a:] + _ring[:b]


def next_seq() -> int:
    """The sequence number the next record will get."""
    return _next_seq


def clear() -> None:
    """Drop every record (the slots are reused; sequence numbers keep counting)."""
    global _first
    with _lock:
        _first = _next_seq
        _ring[:] = [None] * CAPACITY


class record:
    """``with record() as rec:`` captures the records made inside the region in ``rec.records``."""

    def __enter__(self) -> "record":
        global _listeners
        with _lock:
            _listeners += 1
            _update_enabled()
            self._mark = _next_seq
        self.records: list[Record] = []
        return self

    def __exit__(self, *exc) -> bool:
        global _listeners
        with _lock:
            self.records = records_since(self._mark)
            _listeners -= 1
            _update_enabled()
        return False
