"""Device time of GPU work for the timeline: CUDA events around each primitive.

While the timeline records, each primitive run on a GPU stream is bracketed by two timing
CUDA events on its stream; once they have completed (``flush``: after a host wait or a
synchronize), a ``gpu_work`` record gives the kernels' device time, placed on the host
clock through a reference event synchronised once (its completion is taken as that host
instant, which is off by at most the synchronisation's latency).
"""

from __future__ import annotations

import threading

import cupy

from .. import timeline

_lock = threading.Lock()
_pending: list = []  # (start event, end event, record fields)
_ref = None  # (reference event, host ns at its completion)


def _reference():
    global _ref
    if _ref is None:
        ev = cupy.cuda.Event()
        ev.record(cupy.cuda.Stream.null)
        ev.synchronize()
        _ref = (ev, timeline.now())
    return _ref


def start(stream) -> "cupy.cuda.Event":
    _reference()
    ev = cupy.cuda.Event()
    ev.record(stream)
    return ev


def end(on, ev0, **fields) -> None:
    ev1 = cupy.cuda.Event()
    ev1.record(on)
    with _lock:
        _pending.append((ev0, ev1, fields))


def flush() -> None:
    """Turn the completed brackets into ``gpu_work`` timeline records."""
    if not _pending:
        return
    with _lock:
        done = [p for p in _pending if p[1].done]
        _pending[:] = [p for p in _pending if not p[1].done]
    if not done:
        return
    ref, ref_ns = _reference()
    for ev0, ev1, fields in done:
        t0 = ref_ns + int(cupy.cuda.get_elapsed_time(ref, ev0) * 1e6)
        ms = cupy.cuda.get_elapsed_time(ev0, ev1)
        detail = dict(fields.pop("detail", {}), device_time_ms=ms)
        timeline.add("gpu_work", t0, t0 + int(ms * 1e6), device="gpu", detail=detail, **fields)
