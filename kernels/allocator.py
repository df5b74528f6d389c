"""Buffers and the per-device allocator: active / peak / cache counters, limits, the buffer cache.

Each device's allocator follows one MLX backend's policy (``POLICIES``, keyed by backend):

- ``malloc(size)``: round the request as the backend does (CPU: not at all; Metal: whole
  pages above one page); reuse a cached buffer when one fits the reuse window; on a miss,
  where the backend does so (Metal, CUDA; not the CPU), evict ``active + cache + size -
  limit`` bytes of cache when that sum reaches the limit (oldest first, all of it at >= 90%);
  then allocate. Active and peak count the buffer's *real* size. Metal and CUDA trim the
  cache to the cache limit after every allocation.
- ``free(buf)``: active drops by the real size; the buffer is recycled into the cache if it
  fits under the cache limit (CPU) or while the cache is under it (Metal, CUDA), else released.
- ``set_cache_limit`` trims the cache at once on the CPU; Metal and CUDA trim on the next malloc.
- A request that cannot be met even after emptying the cache raises
  ``RuntimeError("[malloc] Unable to allocate N bytes. ...")`` and changes no counter.

Memory numpy allocated on its own (a rule's result) is *adopted*: accounted as a buffer of
its real size, and recycled like any other when freed (``owner``: the array that owns a
result's memory, ``memory_of``: which allocation an array lives in). A device whose arrays
are not numpy's also moves host data in and out here (``import_host``, ``export``: the CUDA
allocator's, ``cuda/memory.py``), as MLX's arrays are made in an allocator's buffers.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from . import timeline
from .buffer_cache import PyBufferCache

_ids = itertools.count(1)


class Buffer:
    """A block of memory: ``raw`` is an array over all of it (a flat uint8 array for memory
    the allocator made; the owning array itself for adopted memory, flattened to bytes only
    when the buffer is reused), ``size`` its real size in bytes."""

    __slots__ = ("raw", "size", "id")

    def __init__(self, raw: Any, size: int):
        self.raw = raw
        self.size = size
        self.id = next(_ids)

    def view(self, nbytes: int, dtype, shape) -> Any:
        """The first ``nbytes`` of the buffer as a C-contiguous array of ``dtype`` and ``shape``."""
        raw = self.raw
        if raw.ndim != 1 or raw.dtype != np.uint8:
            raw = self.raw = raw.reshape(-1, order="A").view(np.uint8)
        if type(raw) is np.ndarray:  # one constructor instead of slice + view + reshape
            return np.ndarray(shape, dtype, raw)
        return self._device_view(raw, nbytes, dtype, shape)

    @staticmethod
    def _device_view(raw, nbytes: int, dtype, shape) -> Any:
        """``view`` of a device array's buffer (an allocator's ``buffer_type`` may do it
        faster for its device)."""
        return raw[:nbytes].view(dtype).reshape(shape)

    def __repr__(self) -> str:
        return f"Buffer(id={self.id}, size={self.size})"


def _owner(a: Any) -> Any:
    """The object at the end of ``a``'s ``base`` chain: the array that owns its memory.

    numpy keeps ``base`` pointing at the owner for ordinary views; ``as_strided`` puts a
    wrapper object in between, which has a ``base`` of its own, so the chain is followed
    through any object. (It may end at a non-array, e.g. ``bytes`` for ``frombuffer``.)
    """
    while True:
        b = getattr(a, "base", None)
        if b is None:
            return a
        a = b


class BufferHandle:
    """Shared ownership of one in-use buffer: arrays (and their views) hold the same handle,
    and the buffer goes back to its allocator when the last holder is gone."""

    __slots__ = ("buffer", "allocator", "__weakref__")

    def __init__(self, buffer: Buffer, allocator: "Allocator"):
        self.buffer = buffer
        self.allocator = allocator

    def __del__(self):
        try:
            self.allocator.free(self.buffer)
        except Exception:  # interpreter shutdown
            pass


try:  # the same class in C (kernels/_handle.c): a free without a Python frame
    from ._handle import BufferHandle  # noqa: F811
    from . import _handle
except ImportError:  # built without a C compiler
    _handle = None


def _physical_memory() -> int:
    """RAM in bytes (MLX: sysinfo's totalram on Linux, hw.memsize on macOS); 0 if unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


# -- MLX's allocator policies, one per backend ----------------------------------------------

MiB = 1 << 20


@dataclass(frozen=True)
class AllocatorPolicy:
    """How one MLX backend's allocator sizes buffers, sets its limits and keeps its cache."""

    source: str  # the MLX file the policy is read from
    page_size: Optional[int]  # the cache's reuse-window page; None: the OS page
    round_size: Callable[[int, int], int]  # (request, page) -> the buffer's real size
    memory_limit: Callable[[int, int], int]  # (total memory, working set) -> default limit
    gc_limit: Optional[Callable[[int, int], int]]  # (memory limit, working set) -> a miss
    #   that brings active + cache + size to it evicts the excess from the cache; None: never
    cache_limit: Optional[int]  # default cache limit in bytes; None: the memory limit
    recycle_if_fits: bool  # free caches a buffer if cache + size <= limit (else: cache < limit)
    trim_after_malloc: bool  # the cache is cut back to its limit after every malloc
    trim_on_set_cache_limit: bool  # set_cache_limit cuts the cache back at once
    wired_limit: bool  # set_wired_limit is supported (else it always returns 0)


def _exact(size: int, page: int) -> int:
    return size


def _whole_pages_above_one(size: int, page: int) -> int:
    return -(-size // page) * page if size > page else size


def _cuda_round(size: int, page: int) -> int:
    if size <= 8:  # cu::small_block_size: served from the scalar pool
        return 8
    if size < page:
        return 1 << (size - 1).bit_length()  # next_power_of_2 (mlx/utils.h)
    return -(-size // page) * page


# the roundings the C malloc does itself (kernels/_handle.c round_c), by its ROUND_* numbers
_ROUND_KINDS = {_exact: 1, _whole_pages_above_one: 2, _cuda_round: 3}


def _cpu_memory_limit(total: int, working_set: int) -> int:
    return int(0.8 * total) if total else 1 << 33


def _metal_block_limit(total: int, working_set: int) -> int:
    return int(min(1.5 * working_set, 0.95 * total))


def _metal_gc_limit(memory_limit: int, working_set: int) -> int:
    return min(memory_limit, int(0.95 * working_set))


def _cuda_memory_limit(total: int, working_set: int) -> int:
    return int(0.95 * total)


def _gc_at_memory_limit(memory_limit: int, working_set: int) -> int:
    return memory_limit


POLICIES: dict[str, AllocatorPolicy] = {
    # mlx/backend/no_gpu/allocator.cpp (CommonAllocator): std::malloc of the exact size;
    # BufferCache page 4096; memory limit 0.8 x RAM (1 << 33 when RAM is unknown), never
    # enforced; cache limit 32 MiB; free caches a buffer if cache + size <= limit;
    # set_cache_limit and clear_cache synchronize the CPU streams (tapescope.core.memory
    # does that part), then trim at once; set_wired_limit returns 0.
    "cpu": AllocatorPolicy(
        source="mlx/backend/no_gpu/allocator.cpp", page_size=4096, round_size=_exact,
        memory_limit=_cpu_memory_limit, gc_limit=None, cache_limit=32 * MiB,
        recycle_if_fits=True, trim_after_malloc=False, trim_on_set_cache_limit=True,
        wired_limit=False),
    # mlx/backend/metal/allocator.cpp (MetalAllocator): requests above one vm page rounded
    # to whole pages; block (memory) limit min(1.5 x max recommended working set, 0.95 x
    # RAM); gc limit min(0.95 x working set, block limit), recomputed by set_memory_limit;
    # cache limit = block limit; a miss reaching the gc limit evicts the excess; the cache
    # is trimmed after every malloc; free caches while cache < limit; set_cache_limit only
    # swaps. Not modelled: the 1 MiB heap for requests < 256 bytes, the resource limit.
    "metal": AllocatorPolicy(
        source="mlx/backend/metal/allocator.cpp", page_size=None,
        round_size=_whole_pages_above_one, memory_limit=_metal_block_limit,
        gc_limit=_metal_gc_limit, cache_limit=None, recycle_if_fits=False,
        trim_after_malloc=True, trim_on_set_cache_limit=False, wired_limit=True),
    # mlx/backend/cuda/allocator.cpp (CudaAllocator), recorded for a CUDA backend: page
    # 16384; requests <= 8 bytes take 8 (the scalar pool), < 16 KiB the next power of two,
    # else whole pages; memory limit 0.95 x device memory (cudaMemGetInfo's total) and cache
    # limit = memory limit; a miss above the memory limit evicts the excess; trimmed after
    # every malloc; free caches while cache < limit; set_cache_limit only swaps;
    # set_wired_limit returns 0. Not modelled: the scalar pool itself, and releasing
    # (total - memory limit) bytes when a CUDA memory pool reserves more than the limit.
    "cuda": AllocatorPolicy(
        source="mlx/backend/cuda/allocator.cpp", page_size=16384, round_size=_cuda_round,
        memory_limit=_cuda_memory_limit, gc_limit=_gc_at_memory_limit, cache_limit=None,
        recycle_if_fits=False, trim_after_malloc=True, trim_on_set_cache_limit=False,
        wired_limit=False),
}


def policy_for(device: str) -> AllocatorPolicy:
    """The policy a device's allocator follows: MLX's CPU policy for ``"cpu"``, Metal's
    otherwise (a CUDA backend passes ``POLICIES["cuda"]`` to its allocator)."""
    return POLICIES["cpu" if device == "cpu" else "metal"]


# a device's frees held (``PyAllocator.free``) are ordered by events in batches of this many
# buffers or bytes, as MLX's CUDA command buffer keeps its temporaries until it completes
# (mlx/backend/cuda/device.cpp: a commit every 100 ops or 1000 MB on an H100); a cache miss
# seals the batch at once
HELD_BATCH = 32
HELD_BATCH_BYTES = 256 << 20


class PyAllocator:
    """The allocator of one device under one MLX backend's policy (the CPU's for ``"cpu"``),
    all in Python: the whole allocator where kernels/_handle.c is not built. ``Allocator``
    is this class over _handle.c's AllocatorBase where it is: the counters, the cache limit,
    the buffer cache and the lock are C-owned there, and malloc / free / adopt are C steps
    over them (``_malloc`` / ``_free`` / ``_adopt``'s, a cache miss ``_malloc`` itself)."""

    buffer_type = Buffer  # a device's allocator may use its own (a faster ``view``)
    cache_type: Any = PyBufferCache
    lock_type: Any = threading.RLock

    def __init__(self, device: str = "cpu", page_size: Optional[int] = None,
                 total_memory: Optional[int] = None, policy: Optional[AllocatorPolicy] = None,
                 working_set: Optional[int] = None):
        self.device = device
        self.policy = p = policy or policy_for(device)
        self.page_size = page_size or p.page_size or os.sysconf("SC_PAGE_SIZE")
        self.total_memory = total_memory or _physical_memory()
        self.working_set = working_set or self.total_memory  # Metal's max recommended working set
        self.memory_limit = p.memory_limit(self.total_memory, self.working_set)
        self.gc_limit = p.gc_limit(self.memory_limit, self.working_set) if p.gc_limit else None
        self.cache_limit = self.memory_limit if p.cache_limit is None else p.cache_limit
        self.wired_limit = 0
        self.active = 0
        self.peak = 0
        self._lock = self.lock_type()
        self.cache = self.cache_type(self.page_size, None, self._release)
        # the policy's rounding, None where it keeps the request (the CPU's): one call less;
        # MLX's policies' roundings are done by the C malloc itself (``_round_kind``)
        self._round = None if p.round_size is _exact else p.round_size
        self._round_kind = _ROUND_KINDS.get(p.round_size, 0)
        self._recycle_if_fits = bool(p.recycle_if_fits)
        self._trim_after_malloc = bool(p.trim_after_malloc)
        # stream-ordered frees (``free``): a device's allocator sets ``_defer`` to the set of
        # its streams whose enqueued work may still run; the host's never holds a buffer
        self._defer: Optional[set] = None
        self._held: list = []  # buffers freed while ``_defer`` was not empty, counted active
        self._held_bytes = 0
        self._held_batches = 0  # batches ``_seal`` ordered by events, not given back yet
        self._batch, self._batch_bytes = HELD_BATCH, HELD_BATCH_BYTES
        # (events, buffers) batches in order of sealing: freed, maybe still read by
        # enqueued kernels until the events complete (``_seal``)
        self._pending: list = []
        # a device's stream state its seals' events are made from in C (_handle.c
        # seal_events_c); None: ``_seal_events``
        self._event_source = None

    # -- raw memory -----------------------------------------------------------------------
    def _raw_alloc(self, size: int) -> Any:
        return np.empty(size, dtype=np.uint8)

    def _release(self, buf: Buffer) -> None:
        if timeline.enabled:
            timeline.add("release", timeline.now(), device=self.device, nbytes=buf.size,
                         detail={"buffer": buf.id})
        buf.raw = None

    # -- the policy -----------------------------------------------------------------------
    def round_size(self, size: int) -> int:
        """The real size of a buffer for a request of ``size`` bytes (the policy's rounding)."""
        return self.policy.round_size(size, self.page_size)

    def _record(self, kind: str, buf: Buffer, requested) -> None:
        """The timeline's record of a malloc / adopt / free (``requested``: the request's
        size, True for adopted memory, None for a free)."""
        detail: dict = {"buffer": buf.id}
        if requested is True:
            detail["adopted"] = True
        elif requested is not None:
            detail["requested"] = requested
        timeline.add(kind, timeline.now(), device=self.device, nbytes=buf.size, detail=detail)

    def _malloc(self, size: int) -> Buffer:
        """A buffer of at least ``size`` bytes, from the cache when one fits; on a miss while
        buffers are held or sealed, after a seal (those whose work has finished are back)."""
        if size == 0:
            return self.buffer_type(self._raw_alloc(0), 0)
        if self._round is not None:
            size = self._round(size, self.page_size)
        buf = self._reuse(size)
        if buf is None and (self._held or self._held_batches):
            self._seal()
            buf = self._reuse(size)
        if buf is None:
            return self._malloc_fresh(size)
        if timeline.enabled:
            self._record("cache_reuse", buf, size)
        return buf

    def _reuse(self, size: int) -> Optional[Buffer]:
        """A cached buffer for a request of ``size`` bytes (rounded already), counted active
        (and the cache trimmed where the policy trims after a malloc); None on a miss."""
        cache = self.cache
        with self._lock:
            buf = cache.reuse_from_cache(size)
            if buf is not None:
                active = self.active = self.active + buf.size
                if active > self.peak:
                    self.peak = active
                if self._trim_after_malloc and cache.pool_size > self.cache_limit:
                    self._evict(cache.pool_size - self.cache_limit)
        return buf

    def _malloc_fresh(self, size: int) -> Buffer:
        """A new buffer of ``size`` bytes (rounded already) where the cache had none: where
        the policy does, evict ``active + cache + size - gc limit`` bytes of cache when that
        sum reaches it; allocate (or raise); the counters and the trim."""
        cache = self.cache
        with self._lock:
            required = self.active + cache.pool_size + size
            if self.gc_limit is not None and required >= self.gc_limit:
                self._evict(required - self.gc_limit)
            buf = self._allocate_or_raise(size)
            active = self.active = self.active + buf.size
            if active > self.peak:
                self.peak = active
            if self._trim_after_malloc and cache.pool_size > self.cache_limit:
                self._evict(cache.pool_size - self.cache_limit)
        if timeline.enabled:
            self._record("alloc", buf, size)
        return buf

    def _evict(self, nbytes: int) -> None:
        before = self.cache.cache_size()
        n = self.cache.release_cached_buffers(nbytes)
        if n and timeline.enabled:
            timeline.add("evict", timeline.now(), device=self.device,
                         nbytes=before - self.cache.cache_size(), detail={"buffers": n})

    def _allocate_or_raise(self, size: int) -> Buffer:
        raw = None
        if size <= (self.total_memory or size):
            try:
                raw = self._raw_alloc(size)
            except (MemoryError, ValueError):
                self._evict(self.cache.cache_size())
                try:
                    raw = self._raw_alloc(size)
                except (MemoryError, ValueError):
                    raw = None
        if raw is None:
            raise RuntimeError(
                f"[malloc] Unable to allocate {size} bytes. (active memory: {self.active} bytes, "
                f"cache memory: {self.cache.cache_size()} bytes, memory limit: "
                f"{self.memory_limit} bytes, device memory: {self.total_memory} bytes)")
        return self.buffer_type(raw, size)

    def _adopt(self, owner: Any) -> Buffer:
        """Account for memory numpy allocated by itself (``owner`` owns its data)."""
        buf = self.buffer_type(owner, owner.nbytes)
        if buf.size:
            with self._lock:
                self.active += buf.size
                self.peak = max(self.peak, self.active)
            if timeline.enabled:
                self._record("alloc", buf, True)
        return buf

    def _free(self, buf: Buffer) -> None:
        """Return a buffer: held while a device stream may still read it (``_defer`` not
        empty; ``_seal`` every ``_batch`` buffers or ``_batch_bytes`` bytes), else to the
        cache when the policy's limit allows, else to the system."""
        if buf.size == 0 or buf.raw is None:
            return
        if self._defer:
            self._held.append(buf)
            self._held_bytes += buf.size
            if len(self._held) >= self._batch or self._held_bytes >= self._batch_bytes:
                self._seal()
            return
        if self._defer is not None and (self._held or self._held_batches):
            self._seal()  # the streams were all seen finished: what is held goes back now
        self._free_now(buf)

    def _seal(self) -> None:
        """The held buffers ordered as one batch after the device work that may still read
        them (``_seal_events``: a device's allocator, ``cuda/memory.py``, one covering event
        per stream that may still run; none on the host), or to the cache at once where
        there is none; then every batch whose events have completed goes to the cache
        (``_collect``). (The C steps' ``_seal`` is kernels/_handle.c's.)"""
        held = self._take_held()
        if held:
            events = self._seal_events()
            if events:
                with self._lock:
                    self._pending.append((events, held))
                    self._held_batches = len(self._pending)
            else:  # no enqueued kernel can still read them
                for buf in held:
                    self._free_now(buf)
        if self._pending:
            self._collect()

    def _collect(self) -> None:
        """Give the batches whose kernels have finished to the cache (or back to the system)."""
        done = []
        with self._lock:
            # events complete in about the order they were recorded: stop at the first busy one
            while self._pending and all(e.done for e in self._pending[0][0]):
                done.extend(self._pending.pop(0)[1])
            self._held_batches = len(self._pending)
        for buf in done:
            self._free_now(buf)

    def _seal_events(self) -> list:
        """The events a batch of held buffers is ordered after: none on the host."""
        return []

    def _take_held(self) -> list:
        """The held buffers, no longer held."""
        held, self._held = self._held, []
        self._held_bytes = 0
        return held

    def _free_now(self, buf: Buffer) -> None:
        """Return a buffer to the cache when the policy's limit allows, else to the system."""
        size = buf.size
        if size == 0 or buf.raw is None:
            return
        cache = self.cache
        with self._lock:
            self.active -= size
            cached = cache.pool_size
            if self._recycle_if_fits:
                keep = cached + size <= self.cache_limit
            else:
                keep = cached < self.cache_limit
            if keep:
                cache.recycle_to_cache(buf)
        if timeline.enabled:
            self._record("free_to_cache" if keep else "free", buf, None)
        if not keep:
            self._release(buf)

    malloc, adopt, free = _malloc, _adopt, _free  # (AllocatorBase's in C come first,
    # and its _free_now, _seal and _collect)

    # -- statistics and limits (MLX's memory API) -----------------------------------------
    def get_cache_memory(self) -> int:
        return self.cache.cache_size()

    def set_memory_limit(self, limit: int) -> int:
        with self._lock:
            old, self.memory_limit = self.memory_limit, int(limit)
            if self.policy.gc_limit is not None:
                self.gc_limit = self.policy.gc_limit(self.memory_limit, self.working_set)
            return old

    def set_cache_limit(self, limit: int) -> int:
        """Set the cache limit; returns the previous one. The CPU policy trims at once, the
        others on the next malloc."""
        with self._lock:
            old, self.cache_limit = self.cache_limit, int(limit)
            excess = self.cache.cache_size() - self.cache_limit
            if self.policy.trim_on_set_cache_limit and excess > 0:
                self._evict(excess)
            return old

    def set_wired_limit(self, limit: int) -> int:
        """Set the wired limit; returns the previous one (always 0 where unsupported)."""
        if not self.policy.wired_limit:
            return 0
        with self._lock:
            old, self.wired_limit = self.wired_limit, int(limit)
            return old

    def settle(self) -> None:
        """Give back the buffers freed while a device still read them whose work has since
        finished (a GPU allocator's, read before the counters); nothing to do on the host."""

    def reset_peak_memory(self) -> None:
        with self._lock:
            self.peak = 0

    # -- the device's arrays and their memory -------------------------------------------
    def memory_of(self, data: Any) -> Any:
        """What identifies the allocation ``data`` lives in (two arrays share memory when
        these are the same object): numpy's owner at the end of the ``base`` chain."""
        return _owner(data)

    def owner(self, data: Any) -> Optional[Any]:
        """The array that owns all of the memory of a rule's result nobody tracks yet, for
        ``adopt``; None when it is not ours to adopt (it must be copied)."""
        o = _owner(data)
        return o if isinstance(o, np.ndarray) and o.flags.owndata else None

    # whether import_host keeps a 0-d array on the host, adopted by the CPU's allocator (as
    # this allocator's own arrays are numpy's, or a device's that keeps its scalars there)
    scalars_on_host = False

    def import_host(self, data: Any, stream: Any) -> tuple:
        """Host data of a new array of this device, as (device array, BufferHandle); asked
        only of a device whose arrays are not numpy's (host data is adopted as is)."""
        raise TypeError(f"[array] the {self.device} allocator's arrays are numpy's: host data "
                        "is adopted, not imported")

    def export(self, data: Any, handle: Any) -> Any:
        """A view of device array ``data`` that keeps its buffer (``handle``) alive, for
        ``__cuda_array_interface__`` / DLPack; asked only of a device whose arrays are not
        numpy's (a host array is exported by numpy's own protocols)."""
        raise TypeError(f"[export] the {self.device} allocator's arrays are numpy's: numpy "
                        "exports them")

    def clear_cache(self) -> None:
        with self._lock:
            self._evict(self.cache.cache_size())


if _handle is not None:
    class Allocator(_handle.AllocatorBase, PyAllocator):
        __doc__ = PyAllocator.__doc__
        cache_type = _handle.BufferCache
        lock_type = _handle.Lock

    _handle.configure(timeline, Buffer, _ids)  # (adopted Buffers made in C, ids from _ids)
else:
    Allocator = PyAllocator  # type: ignore[misc]

_allocators: dict[str, Allocator] = {}
_alloc_lock = threading.Lock()


def allocator(device: str = "cpu") -> Allocator:
    """The allocator of a device (made on first use)."""
    a = _allocators.get(device)
    if a is None:
        with _alloc_lock:
            a = _allocators.get(device)
            if a is None:
                a = _allocators[device] = Allocator(device)
    return a


def owner_of(a: Any) -> Any:
    """The array owning ``a``'s memory."""
    return _owner(a)
