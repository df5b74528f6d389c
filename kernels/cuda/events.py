"""``CudaEvent``: an ``mx`` event whose signals on a GPU stream are CUDA events.

MLX's ``mlx::Event`` on CUDA (``mlx/backend/cuda/event.cu``) is a ``CudaEvent`` between GPU
streams (recorded on the producer's stream, ``cudaStreamWaitEvent`` on the consumer's: the
host never blocks) and a shared counter where a CPU stream is involved. Here the counter is
the host value of the base ``Event`` (set when the producer's work has been *enqueued*), and
a signal from a GPU stream also records a CUDA event on that stream (its work *done*):

- a GPU stream that waits waits for the enqueue on the host (its worker thread, before it
  enqueues anything that depends on it), then on the device for the CUDA event;
- the host (a CPU stream, or ``eval``'s caller) waits for both: the data is ready to read;
- ``is_signaled`` is true only once the device work is done (MLX's ``completed()``), so the
  scheduler drops an input's event only when its data is really there;
- a host wait raises the IndexError the stream's checking kernels recorded
  (``cuda/bounds.py``: the deferred bounds check).
"""

from __future__ import annotations

import time
from typing import Optional

import cupy

from .. import timeline
from ..stream_workers import Event
from . import bounds, device, timing


class CudaEvent(Event):
    __slots__ = ("recorded",)
    # the slots __init__ sets to None beyond Event's: an eval's event is made in C with them
    # (interactive/core/_loop.c new_event), no Python __init__
    none_slots = ("recorded",)

    def __init__(self, stream: Optional[int] = None):
        super().__init__(stream)
        self.recorded = None  # the CUDA event of the latest signal from a GPU stream

    def signal(self, value: int = 1) -> None:
        if self.stream is not None and device.is_gpu_stream(self.stream):
            self.recorded = device.covering_event(self.stream)
        super().signal(value)

    def is_signaled(self, value: int = 1) -> bool:
        if self.value < value:
            return False
        ev = self.recorded
        return ev is None or ev.done

    def wait(self, value: int = 1, stream: Optional[int] = None) -> None:
        super().wait(value, stream)  # the producer has enqueued its work
        ev = self.recorded
        if ev is None:
            return
        t0 = timeline.now() if timeline.enabled else 0
        on_device = stream is not None and device.is_gpu_stream(stream)
        if on_device:
            device.cuda_stream(stream).wait_event(ev)  # cudaStreamWaitEvent: no host block
        else:
            host_wait(ev)
            device.note_finished(self.stream, ev)
            timing.flush()
            if bounds.records:  # an index its kernels found out of bounds: raised here
                bounds.check(device.cuda_stream(self.stream).ptr)
        if t0:
            timeline.add("event_wait", t0, timeline.now(), stream=stream,
                         detail={"event": self.id, "value": value, "signaled_by": self.stream,
                                 "device_wait": on_device})


SPIN_S = 200e-6  # a host wait polls the event this long, then sleeps between polls
POLL_S = 20e-6


def host_wait(ev: "cupy.cuda.Event") -> None:
    """Wait on the host for a CUDA event (or a whole stream: its ``done`` is
    ``cudaStreamQuery``): polled (``cudaEventQuery``) for up to ``SPIN_S``,
    then between short sleeps. A blocking-sync event (``cudaEventBlockingSync``) sleeps in
    the driver instead and wakes ~17 us late (measured on the H200 machine: tiny kernel +
    event + wait 28.5 us against 11.2 us polled), which is most of a small eval; the sleeps
    keep a long wait from spinning a core."""
    if ev.done:
        return
    end = time.perf_counter() + SPIN_S
    while time.perf_counter() < end:
        if ev.done:
            return
    while not ev.done:
        time.sleep(POLL_S)
