"""The CUDA device and its streams: what ``mlx/backend/cuda/device.cpp`` keeps per GPU.

MLX has one ``cu::Device`` per GPU index, and per ``mx`` stream one ``DeviceStream`` over a
``cudaStreamNonBlocking`` stream. Here: ``cuda_stream(index)`` is the CuPy
``Stream(non_blocking=True)`` of the ``mx`` stream with that index (made on first use);
``is_gpu_stream(index)`` says whether an index has one. ``selected()`` is the GPU this
process uses: its local rank (from the launcher) modulo the device count, so each rank of
``mpirun`` gets its own GPU (MLX's NCCL backend: ``cudaSetDevice(rank % ndev)``), else 0.
"""

from __future__ import annotations

import functools
import os
import threading

import cupy

from . import bounds

_lock = threading.Lock()
_streams: dict[int, "cupy.cuda.Stream"] = {}
# per mx stream index: [work generation, nodes running on it now]. A generation ends each
# time a node leaves the stream's device context; an event recorded on the stream while
# no node runs there and the generation has not moved since covers all of its work
_work: dict[int, list] = {}
_marks: dict[int, tuple] = {}  # mx stream index -> (generation, the event recorded then)
# mx GPU streams that have had work enqueued since their work was last seen finished: a
# buffer freed while this is empty can go straight back to the cache, with no event
_unfinished: set = set()


@functools.lru_cache(maxsize=None)
def properties(device: int = 0) -> dict:
    """``cudaGetDeviceProperties`` of a GPU, as a dict."""
    return cupy.cuda.runtime.getDeviceProperties(device)


def info(device: int = 0) -> dict:
    """``mx.device_info(mx.gpu)``: MLX's keys for a CUDA device."""
    p = properties(device)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    free, total = memory_info(device)
    return {
        "device_name": name,
        "architecture": f"sm_{p['major']}{p['minor']}",
        "compute_capability_major": int(p["major"]),
        "compute_capability_minor": int(p["minor"]),
        "memory_size": int(total),
        "free_memory": int(free),
        "total_memory": int(total),
        "uuid": _uuid(p),
    }


def _uuid(p: dict) -> str:
    raw = p.get("uuid")
    if isinstance(raw, (bytes, bytearray)) and len(raw) == 16:
        h = raw.hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return ""


def memory_info(device: int = 0) -> tuple:
    """``cudaMemGetInfo``: (free, total) bytes of the GPU."""
    with cupy.cuda.Device(device):
        return cupy.cuda.runtime.memGetInfo()


# what launchers set for a process's rank on its node (Open MPI, MPICH / hydra, Slurm,
# torchrun); MLX's own MLX_RANK last (its NCCL backend uses the global rank)
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                    "SLURM_LOCALID", "LOCAL_RANK", "MLX_RANK")


@functools.lru_cache(maxsize=None)
def selected() -> int:
    """The GPU of this process: local rank % device count (0 without a launcher); made
    current on the calling thread."""
    rank = next((int(os.environ[v]) for v in _LOCAL_RANK_VARS
                 if os.environ.get(v, "").isdigit()), 0)
    dev = rank % max(1, cupy.cuda.runtime.getDeviceCount())
    if dev:  # a thread's current device is 0 until set
        cupy.cuda.runtime.setDevice(dev)
    return dev


def cuda_stream(index: int) -> "cupy.cuda.Stream":
    """The non-blocking CUDA stream of the ``mx`` stream ``index``."""
    s = _streams.get(index)
    if s is None:
        with _lock:
            s = _streams.get(index)
            if s is None:
                with cupy.cuda.Device(selected()):
                    s = cupy.cuda.Stream(non_blocking=True)
                    _wait_uploads(s)
                    _streams[index] = s
    return s


# re-entrant: a garbage collection may run a finalizer that frees a buffer (note_finished)
# at any bytecode while this thread holds it (Python 3.12 collects at function entries)
_work_lock = threading.RLock()


def work(index: int) -> list:
    """The ``[generation, running, index]`` record of an mx GPU stream (see ``_work``)."""
    w = _work.get(index)
    if w is None:
        w = _work.setdefault(index, [0, 0, index])
    return w


def enter_work(w: list) -> None:
    """A node starts enqueueing on the stream of ``w`` (its ``work`` record)."""
    with _work_lock:
        w[1] += 1
        _unfinished.add(w[2])


def unfinished() -> set:
    """The mx GPU streams whose enqueued work may still be running (``note_finished``)."""
    return _unfinished


def note_finished(index: int, ev: "cupy.cuda.Event") -> None:
    """The host saw ``ev`` complete: when it is the stream's covering event and nothing was
    enqueued there since, all of the stream's work has finished."""
    with _work_lock:
        gen, running, _ = work(index)
        mark = _marks.get(index)
        if not running and mark is not None and mark[1] is ev and mark[0] == gen:
            _unfinished.discard(index)


def leave_work(w: list) -> None:
    """That node has enqueued all its work: a generation ends."""
    with _work_lock:
        w[0] += 1
        w[1] -= 1


def covering_event(index: int) -> "cupy.cuda.Event":
    """A CUDA event recorded on the mx stream's CUDA stream after all the work enqueued there
    so far: the last one made here while no node has left the stream's device context since
    and none runs there now, else a new one (~2.4 us). An eval's signal and the allocator's
    frees that follow it share one."""
    gen, running, _ = work(index)
    mark = _marks.get(index)
    if mark is None or mark[0] != gen or running:
        ev = cupy.cuda.Event(block=False, disable_timing=True)
        ev.record(cuda_stream(index))
        mark = _marks[index] = (gen, ev)
    return mark[1]


def event_source() -> tuple:
    """The state ``covering_event`` and ``note_finished`` work on, for the allocator's seal
    in C (kernels/_handle.c seal_events_c, the same steps): (``_unfinished``, ``_work``,
    ``_marks``, ``_streams``, ``_work_lock``, the event maker)."""
    return (_unfinished, _work, _marks, _streams, _work_lock,
            functools.partial(cupy.cuda.Event, block=False, disable_timing=True))


def is_gpu_stream(index) -> bool:
    return index in _streams


def gpu_stream_indices() -> list:
    """The mx stream index of every CUDA stream made so far."""
    return list(_streams)


# -- host synchronisations and uploads -------------------------------------------------------
# every host block on the device that this runtime makes itself (a stream's synchronize);
# an eager chain makes none until its eval's wait (tests/test_cuda_bf16.py counts them)
_host_syncs = [0]


def host_syncs() -> int:
    """How many times this runtime has blocked the host on a whole stream or the device."""
    return _host_syncs[0]


def synchronize(index: int) -> None:
    """Block the host until the mx stream's CUDA stream has done its work (counted); the
    stream is then noted finished when nothing was enqueued there meanwhile (its buffers
    freed from now on need no event, those held go back without one); then the IndexError
    its checking kernels recorded, if any (``cuda/bounds.py``)."""
    _host_syncs[0] += 1
    w = work(index)
    gen = w[0]
    cs = cuda_stream(index)
    cs.synchronize()
    with _work_lock:
        if w[0] == gen and not w[1]:
            _unfinished.discard(index)
    if bounds.records:  # the deferred bounds check's error, raised at the host's wait
        bounds.check(cs.ptr)


_uploads: dict = {}  # mx stream index -> the event after its latest host-to-device copy


def uploaded(index: int) -> None:
    """A host-to-device copy was just enqueued on the mx stream ``index`` (a new array's
    data, ``CudaAllocator.import_host``): what may read the new array off that stream is
    ordered after it on the device, never by blocking the host. CuPy's host reads
    (``get``) and the arrays of other libraries use the legacy default stream, and the
    other mx streams run their own: each of them waits for the copy's event
    (``cudaStreamWaitEvent``); a stream made later waits for it when it is made."""
    w = work(index)
    enter_work(w)  # the allocator's frees see the copy as the stream's work
    leave_work(w)
    ev = covering_event(index)
    _uploads[index] = ev
    cupy.cuda.Stream.null.wait_event(ev)
    for j, s in list(_streams.items()):
        if j != index:
            s.wait_event(ev)


def _wait_uploads(s: "cupy.cuda.Stream") -> None:
    """A new stream starts after the copies enqueued before it was made."""
    for ev in list(_uploads.values()):
        s.wait_event(ev)
