"""Streams on worker threads, events, fences and the interrupt flag (MLX's execution model).

- ``StreamWorker``: one thread per stream that runs the stream's tasks in order.
- ``Event``: a value that a stream signals and others wait for (MLX's SharedEvent, on the
  host: a counter behind a condition variable). One per stream per eval marks completion.
- ``Fence``: orders work across streams inside one eval: the producer stream ``update``s
  (bumps the count and signals it), the consumer stream ``wait``s for that count.
- ``Interrupt``: ``interrupt_eval()`` takes effect only while an eval runs; the eval loop
  polls ``interrupted()`` between nodes.

Knows nothing of arrays: tasks are plain callables. Every signal / wait / update goes on the
timeline when it records.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Callable, Optional

from . import timeline

_event_ids = itertools.count(1)


_cond_lock = threading.Lock()


class Event:
    """A monotonically increasing value; ``wait(v)`` blocks until it reaches ``v``.

    The condition variable is made only when somebody has to wait, so an event that is
    signalled before anyone looks (the common, inline case) costs no lock.
    """

    __slots__ = ("id", "stream", "value", "_cond")

    def __init__(self, stream: Optional[int] = None):
        self.id = next(_event_ids)
        self.stream = stream
        self.value = 0
        self._cond: Optional[threading.Condition] = None

    def signal(self, value: int = 1) -> None:
        if value > self.value:
            self.value = value
        cond = self._cond
        if cond is not None:
            with cond:
                cond.notify_all()
        if timeline.enabled:
            timeline.add("event_signal", timeline.now(), stream=self.stream,
                         detail={"event": self.id, "value": value})

    def is_signaled(self, value: int = 1) -> bool:
        return self.value >= value

    def wait(self, value: int = 1, stream: Optional[int] = None) -> None:
        """Block the calling thread until the event reaches ``value``."""
        if self.value >= value:
            return
        t0 = timeline.now() if timeline.enabled else 0
        if self._cond is None:
            with _cond_lock:
                if self._cond is None:
                    self._cond = threading.Condition(threading.Lock())
        with self._cond:
            while self.value < value:
                self._cond.wait()
        if t0:
            timeline.add("event_wait", t0, timeline.now(), stream=stream,
                         detail={"event": self.id, "value": value, "signaled_by": self.stream})


class Fence:
    """A counter for one producer stream's edges to other streams within an eval."""

    __slots__ = ("stream", "count", "event")

    def __init__(self, stream: int, event_type: type = None):
        self.stream = stream
        self.count = 0
        self.event = (event_type or Event)(stream)  # the producer device's event

    def next_update(self) -> int:
        """Reserve the next count (at scheduling time); the producer signals it when it runs."""
        self.count += 1
        return self.count

    def update(self, count: int) -> None:
        if timeline.enabled:
            timeline.add("fence_update", timeline.now(), stream=self.stream,
                         detail={"fence": self.event.id, "count": count})
        self.event.signal(count)

    def wait(self, count: int, stream: int) -> None:
        t0 = timeline.now() if timeline.enabled else 0
        self.event.wait(count, stream)  # a GPU event lets a GPU stream wait on the device
        if t0:
            timeline.add("fence_wait", t0, timeline.now(), stream=stream,
                         detail={"fence": self.event.id, "count": count, "producer": self.stream})


class StreamWorker:
    """Runs one stream's tasks in order on its own thread.

    ``exec_lock`` is held while a task runs, so a caller may also run work for this stream
    inline (when the queue is empty) without breaking the stream's order.
    ``error``: the earliest error of an asynchronous eval on this stream that nobody has
    seen yet (MLX's ``StreamThread::error``, mlx/scheduler.cpp), raised by
    ``check_error`` (``mx.synchronize``).
    """

    def __init__(self, index: int, name: str):
        self.index = index
        self.exec_lock = threading.Lock()
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._pending = 0
        self._stop = False
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name=f"tapescope-{name}", daemon=True)
        self._thread.start()

    @property
    def thread_id(self) -> Optional[int]:
        return self._thread.ident

    def idle(self) -> bool:
        return self._pending == 0

    def enqueue(self, task: Callable[[], None]) -> None:
        with self._cond:
            self._queue.append(task)
            self._pending += 1
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if not self._queue:
                    return
                task = self._queue.popleft()
            with self.exec_lock:
                try:
                    task()
                finally:
                    with self._cond:
                        self._pending -= 1
                        self._cond.notify_all()

    def synchronize(self) -> None:
        """Wait until every task enqueued so far has run."""
        with self._cond:
            while self._pending:
                self._cond.wait()

    def keep_error(self, error: BaseException) -> None:
        """Keep an asynchronous eval's error unless an earlier one is kept."""
        with self._cond:
            if self.error is None:
                self.error = error

    def check_error(self) -> None:
        """Raise the kept error, once (MLX's ``scheduler::check_error``: throw and clear)."""
        with self._cond:
            error, self.error = self.error, None
        if error is not None:
            raise error

    def stop(self) -> None:
        """Finish the queued tasks, then end the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()


_workers: dict[int, StreamWorker] = {}
_workers_lock = threading.Lock()


def worker(index: int, name: str = "") -> StreamWorker:
    """The worker of stream ``index`` (started on first use)."""
    w = _workers.get(index)
    if w is None:
        with _workers_lock:
            w = _workers.get(index)
            if w is None:
                w = _workers[index] = StreamWorker(index, name or f"stream{index}")
    return w


def existing_worker(index: int) -> Optional[StreamWorker]:
    return _workers.get(index)


def on_worker() -> bool:
    """Whether the calling thread is a stream's worker thread."""
    me = threading.get_ident()
    return any(w.thread_id == me for w in list(_workers.values()))


def stop_workers() -> None:
    """Drain and stop every worker thread (they restart on next use)."""
    with _workers_lock:
        ws = list(_workers.values())
        _workers.clear()
    for w in ws:
        w.stop()


class _InterruptFlag:
    """MLX's interrupt flag: honoured only while an eval runs, cleared when the last ends.

    One instance, ``Interrupt``; ``begin``/``end`` bracket every eval (they are on the eager
    hot path, hence a plain lock and instance attributes)."""

    __slots__ = ("_lock", "_running", "_flag")

    def __init__(self):
        self._lock = threading.Lock()
        self._running = 0
        self._flag = False

    def begin(self) -> None:
        with self._lock:
            self._running += 1

    def end(self) -> None:
        with self._lock:
            self._running -= 1
            if not self._running:
                self._flag = False

    def request(self) -> bool:
        """Ask running evals to stop; True only if an eval was running."""
        with self._lock:
            if self._running:
                self._flag = True
                if timeline.enabled:
                    timeline.add("interrupt", timeline.now())
                return True
            return False

    def interrupted(self) -> bool:
        return self._flag

    def running(self) -> bool:
        return self._running > 0


Interrupt = _InterruptFlag()
