"""``CudaAllocator``: the GPU's memory under MLX's CUDA policy (``mlx/backend/cuda/allocator.cpp``).

- Raw memory is plain ``cudaMalloc`` (CuPy's ``runtime.malloc``) wrapped as a CuPy array, not
  CuPy's memory pool (which would be a second cache under ours) and not managed memory (an
  over-subscribed managed allocation can stall a shared GPU). CuPy's own pool is switched
  off, so arrays CuPy makes inside a rule are plain ``cudaMalloc`` too and are adopted.
- The figures are the device's: total memory from ``cudaMemGetInfo``, the memory limit by the
  CUDA policy (``allocator.POLICIES["cuda"]``).
- **Stream-ordered reuse.** A buffer is freed as soon as no array holds it, while kernels
  already enqueued on a GPU stream may still read it. MLX keeps such buffers alive in its
  command encoder's temporaries until the command buffer completes (a completion handler
  on its worker thread: mlx/backend/cuda/device.cpp ``CommandEncoder::commit``,
  worker.cpp). Here ``Allocator.free`` (C, kernels/_handle.c) *holds* a buffer freed while
  any GPU stream may still run (``device.unfinished``, the allocator's ``_defer``): no
  Python code, no event per free. Every ``HELD_BATCH`` buffers (or bytes), at a cache miss
  and before the counters are read, ``_seal`` orders the held batch after that work by one
  covering CUDA event per unfinished stream (``device.covering_event``, shared with the
  eval's signal) and gives the batches whose events have completed to the cache. Held
  buffers stay *active* until then. A free after every stream was seen finished (an eval's
  host wait) needs no event: it gives back what is held, then itself.
- ``cudaFree`` synchronises the device, so raw frees happen on one registered thread (MLX's
  ``cuda_free`` re-posts frees from other threads to its worker), never on a stream's thread.
- **CuPy allocates from the cache.** Inside a node's device context (a rule: a matmul, a
  reduction's temporaries, a bfloat16 rule's float32 copies) CuPy's allocations are buffers
  of this cache *lent* to it (``lending``: a thread-local CuPy allocator): the memory is an
  ``UnownedMemory`` whose owner, a ``_Lease``, frees the buffer (stream-ordered, as above)
  when CuPy lets go of it. A rule's result over lent memory is adopted with size 0: its lease
  already counts it. Before, each such allocation was a ``cudaMalloc`` and each temporary's
  free a ``cudaFree`` (a device synchronisation, inside an eager step), and adopted results
  filled the cache with buffers nobody asked for again (~70 MiB a step of an MLP's Adam step).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Optional

import cupy
import numpy as np

from .. import timeline
from ..allocator import POLICIES, Allocator, Buffer, BufferHandle, _handle, allocator, owner_of
from . import device
from .bfloat16 import BF16, U16, BF16Array


class _Freer:
    """One thread that returns raw device memory to CUDA (``cudaFree`` synchronises)."""

    def __init__(self) -> None:
        self.q: "queue.SimpleQueue" = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="tapescope-cuda-free", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            raw = self.q.get()
            del raw  # the last reference: CuPy frees the memory here

    def free(self, raw: Any) -> None:
        self.q.put(raw)


class _Lease:
    """The owner of a buffer's memory lent to CuPy: gives the buffer back when CuPy's last
    array over it goes (``CudaAllocator._lend``)."""

    __slots__ = ("alloc", "buf")

    def __init__(self, alloc: "CudaAllocator", buf: Buffer):
        self.alloc, self.buf = alloc, buf

    def __del__(self) -> None:
        try:
            self.alloc._returned(self.buf)
        except Exception:  # (at interpreter exit the allocator's pieces may be gone)
            pass


class CudaBuffer(Buffer):
    """A buffer whose typed views are made in one CuPy constructor over its memory pointer
    (~1.6 us on the H200's host, against ~4.3 us for slice + view + reshape), and kept:
    reused with the same shape and dtype (a small eval's output) it hands out that view
    again (~0.9 us a call). Only the array holding the buffer holds its view, so nobody
    else sees the object again; ``_release`` drops it with the memory."""

    __slots__ = ("last",)

    def __init__(self, raw: Any, size: int):
        super().__init__(raw, size)
        self.last = None  # (shape, dtype, the view)

    def view(self, nbytes: int, dtype, shape) -> Any:
        last = self.last
        if last is not None and last[1] is dtype and last[0] == shape:
            return last[2]
        raw = self.raw
        if type(raw) is cupy.ndarray and raw.ndim == 1 and raw.dtype == np.uint8:
            # (the allocator's own memory: the constructor here, no frames of Buffer.view)
            v = (BF16Array(cupy.ndarray(shape, U16, raw.data)) if dtype == BF16
                 else cupy.ndarray(shape, dtype, raw.data))
        else:
            v = Buffer.view(self, nbytes, dtype, shape)
        self.last = (shape, dtype, v)
        return v

    @staticmethod
    def _device_view(raw, nbytes: int, dtype, shape) -> Any:
        if dtype == BF16:  # CuPy has no bfloat16: uint16 storage (cuda/bfloat16.py)
            return BF16Array(cupy.ndarray(shape, U16, raw.data))
        return cupy.ndarray(shape, dtype, raw.data)


class StandInBuffer(Buffer):
    """A buffer of a CuPy without memory pointers (the tests' stand-in): bfloat16 views
    are ``BF16Array`` over uint16 storage, as ``CudaBuffer``'s."""

    __slots__ = ()

    @staticmethod
    def _device_view(raw, nbytes: int, dtype, shape) -> Any:
        if dtype == BF16:
            return BF16Array(raw[:nbytes].view(U16).reshape(shape))
        return raw[:nbytes].view(dtype).reshape(shape)


if _handle is not None:  # these buffers' views made in C for the eval loop (_handle.c view_c)
    _WRAPS = {BF16: (U16, BF16Array)}
    if hasattr(cupy.cuda, "MemoryPointer"):
        _handle.view_form(CudaBuffer, "pointer", cupy.ndarray, _WRAPS, np.dtype(np.uint8))
    _handle.view_form(StandInBuffer, "slice", cupy.ndarray, _WRAPS, np.dtype(np.uint8))


class CudaAllocator(Allocator):
    # import_host keeps a 0-d array (a Python scalar's) on the host, adopted by the CPU's
    # allocator: core/_binary.c makes a scalar's desc for this device as it does for the host
    scalars_on_host = True

    def __init__(self, device_id: int = 0):
        self.device_id = device_id
        cupy.cuda.set_allocator(None)  # no CuPy pool under ours: plain cudaMalloc / cudaFree
        # (the tests' stand-in CuPy has no memory pointers)
        self.buffer_type = CudaBuffer if hasattr(cupy.cuda, "MemoryPointer") else StandInBuffer
        _, total = device.memory_info(device_id)
        super().__init__("gpu", policy=POLICIES["cuda"], total_memory=int(total))
        self._defer = device.unfinished()  # frees are held while a stream may still run
        # a seal's covering events made in C from the streams' state (_handle.c
        # seal_events_c: ``_unfinished_events``'s steps over device.py's records)
        self._event_source = device.event_source()
        self._freer = _Freer()
        self._lent: dict = {}  # device pointer -> the buffer lent to CuPy there
        using = getattr(cupy.cuda, "using_allocator", None)  # (not in the tests' stand-in)
        self.lending = None if using is None or self.buffer_type is not CudaBuffer else (
            lambda: using(self._lend))

    # -- raw memory -----------------------------------------------------------------------
    def _raw_alloc(self, size: int) -> Any:
        try:
            with cupy.cuda.Device(self.device_id):
                if self.buffer_type is not CudaBuffer:
                    return cupy.empty(size, dtype=np.uint8)
                # cudaMalloc itself: never CuPy's current allocator (in a device context
                # that is ``_lend``, which comes back here on a miss)
                mem = cupy.cuda.MemoryPointer(cupy.cuda.memory.Memory(size), 0)
                return cupy.ndarray((size,), np.uint8, mem)
        except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError) as e:
            # without CuPy's pool a failed cudaMalloc is a CUDARuntimeError (status 2,
            # cudaErrorMemoryAllocation), not CuPy's OutOfMemoryError
            if not isinstance(e, cupy.cuda.memory.OutOfMemoryError) and getattr(e, "status", 2) != 2:
                raise
            # buffers freed while kernels still read them are not in the cache yet: let the
            # device finish, so the caller's evict-and-retry can reach them too
            cupy.cuda.runtime.deviceSynchronize()
            self._give_back_all()
            raise MemoryError(str(e)) from None

    def _give_back_all(self) -> None:
        """After the whole device is idle: every held buffer to the cache."""
        with self._lock:
            batches = list(self._pending)
            self._pending.clear()
            self._held_batches = 0
        for buf in self._take_held() + [b for _, bufs in batches for b in bufs]:
            self._free_now(buf)

    def _release(self, buf: Buffer) -> None:
        raw = buf.raw
        if type(buf) is CudaBuffer:
            buf.last = None  # the view holds the memory too
        super()._release(buf)
        if raw is not None:
            self._freer.free(raw)

    # -- CuPy's allocations lent from the cache --------------------------------------------
    def _lend(self, size: int) -> "cupy.cuda.MemoryPointer":
        """CuPy's allocator inside a device context: a cached buffer of ``size`` bytes."""
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.memory.Memory(0), 0)
        buf = self.malloc(size)
        ptr = buf.raw.data.ptr
        self._lent[ptr] = buf
        mem = cupy.cuda.UnownedMemory(ptr, buf.size, _Lease(self, buf), self.device_id)
        return cupy.cuda.MemoryPointer(mem, 0)

    def _returned(self, buf: Buffer) -> None:
        """CuPy let go of a lent buffer's memory (its last array is gone)."""
        self._lent.pop(buf.raw.data.ptr, None)
        self.free(buf)

    def lent(self, mem: Any) -> bool:
        """Whether CuPy's memory object ``mem`` is a buffer this allocator lent."""
        return type(mem) is cupy.cuda.UnownedMemory and mem.ptr in self._lent

    def adopt(self, owner: Any) -> Buffer:
        """A rule's result: over lent memory a buffer of size 0 that keeps it (the lease
        counts the memory and frees it with the last array); else adopted as CuPy's own."""
        data = getattr(owner, "data", None)
        if self._lent and self.lent(getattr(data, "mem", None)):
            return self.buffer_type(owner, 0)
        return Allocator.adopt(self, owner)

    # -- stream-ordered reuse -------------------------------------------------------------
    # ``_seal`` (kernels/_handle.c; PyAllocator._seal the reference): the held buffers
    # (``Allocator.free``: freed while a GPU stream had unfinished work) ordered as one
    # batch after that work, by one covering event per stream that may still run
    # (``_seal_events``; none for a stream seen finished), then every batch whose events
    # have completed given back to the cache (``_collect``).
    def _seal_events(self) -> list:
        return _unfinished_events()

    def settle(self) -> None:
        if self._held or self._pending:
            self._seal()

    def held_buffers(self) -> list:
        """The buffers freed by their arrays that may still be read by enqueued kernels
        (held, or sealed in a batch whose events have not completed): counted active."""
        with self._lock:
            return list(self._held) + [b for _, bufs in self._pending for b in bufs]

    def pending_bytes(self) -> int:
        """Bytes freed by their arrays but still read by enqueued kernels (counted active)."""
        return sum(b.size for b in self.held_buffers())

    # -- the device's arrays and their memory (Allocator's, for CUDA memory) -------------
    def import_host(self, data: Any, stream: Any) -> tuple:
        """Host data of a new GPU array: copied into an allocator buffer on the stream's
        CUDA stream; returns (device array, BufferHandle). bfloat16 is copied as its
        uint16 bits (a ``BF16Array``); other types CuPy has no dtype for stay on the host,
        accounted by the CPU's allocator.

        The host does not wait for the copy (MLX's eager ops make no host synchronisation
        either): ``cudaMemcpyAsync`` from pageable memory has staged the bytes when it
        returns, so ``data`` may change at once; kernels on this stream run after the copy
        in stream order, and ``device.uploaded`` orders every other reader (CuPy's host
        reads on the default stream, the other mx streams) after it by event."""
        data = np.asarray(data)
        if data.ndim == 0 or (data.dtype.kind == "V" and data.dtype != BF16):
            # a 0-d array (a Python scalar's) stays on the host: an eager op's kernel takes
            # its value as a parameter (cuda/eager.py), with no upload; anything else moves
            # it in when it reads it (to_device)
            if data.ndim == 0 or data.base is not None:
                data = np.array(data)  # (a copy: the caller's array may change)
            alloc = allocator("cpu")
            return data, BufferHandle(alloc.adopt(owner_of(data)), alloc)
        buf = self.malloc(data.nbytes)
        view = buf.view(data.nbytes, data.dtype, data.shape)
        index = stream.index
        cs = device.cuda_stream(index)
        host = np.asarray(data, order="C")
        if type(view) is BF16Array:
            view.raw.set(host.view(U16), stream=cs)
        else:
            view.set(host, stream=cs)
        device.uploaded(index)
        return view, BufferHandle(buf, self)

    def export(self, data: Any, handle: Any) -> Any:
        """A CuPy view of ``data`` that keeps its buffer (``handle``) alive, for
        ``__cuda_array_interface__`` / DLPack consumers: the buffer is not recycled while
        the consumer holds it (the CPU's exports keep theirs the same way)."""
        if type(data) is BF16Array:
            raise TypeError("A bfloat16 GPU array cannot be exported through CuPy, which has no "
                            "bfloat16 dtype: view it as uint16 first (x.view(mx.uint16)).")
        mem = data.data.mem
        keep = cupy.cuda.UnownedMemory(mem.ptr, mem.size, owner=(handle, data))
        ptr = cupy.cuda.MemoryPointer(keep, data.data.ptr - mem.ptr)
        return cupy.ndarray(data.shape, data.dtype, ptr, strides=data.strides)

    def memory_of(self, data: Any) -> Any:
        """The CUDA allocation (CuPy's ``Memory``) a device array lives in. CuPy's ``base``
        does not say it: ``as_strided`` and other arrays made from a memory pointer have
        none, so a view of an input looked like memory of its own and was adopted a second
        time, its buffer cached and handed out while the input still used it."""
        if type(data) is BF16Array:
            data = data.raw
        mem = _memory(data)
        return mem if mem is not None else owner_of(data)

    def owner(self, data: Any) -> Optional[Any]:
        """All of the allocation of a result CuPy made (as a uint8 array, the form of the
        allocator's raw buffers); None for memory CuPy does not own (``UnownedMemory``)."""
        if type(data) is BF16Array:
            data = data.raw
        mem = _memory(data)
        if mem is None:  # not a CuPy array (the tests' stand-in CuPy is numpy underneath)
            o = owner_of(data)
            return o if isinstance(o, cupy.ndarray) and o.base is None else None
        if type(mem) is not cupy.cuda.memory.Memory and not self.lent(mem):
            return None  # (memory of a lent buffer: its lease accounts for it, see adopt)
        return cupy.ndarray((mem.size,), np.uint8, cupy.cuda.MemoryPointer(mem, 0))

    def synchronize(self) -> None:
        """After the device is idle every held buffer can be reused."""
        self._seal()
        with self._lock:
            rest = [item for item in self._pending if all(e.done for e in item[0])]
            for item in rest:
                self._pending.remove(item)
            self._held_batches = len(self._pending)
        for _, bufs in rest:
            for buf in bufs:
                self._free_now(buf)

    def clear_cache(self) -> None:
        self._seal()
        super().clear_cache()
        if timeline.enabled:
            timeline.add("clear_cache", timeline.now(), device=self.device)


def _unfinished_events() -> list:
    """A covering event of every GPU stream whose work may still run (those that have
    finished are noted so: their buffers need none)."""
    events = []
    for index in list(device.unfinished()):
        ev = device.covering_event(index)
        if ev.done:
            device.note_finished(index, ev)
        else:
            events.append(ev)
    return events


def _memory(data: Any) -> Any:
    """CuPy's ``Memory`` object behind a device array (None for other arrays: a host
    array's ``data`` is a memoryview, which numpy cannot even make for bfloat16)."""
    if not isinstance(data, cupy.ndarray):
        return None
    return getattr(data.data, "mem", None)
