"""Buffers and the per-device allocator: active / peak / cache counters, limits, the buffer cache.

Reproduces MLX's allocator policy (seed map 001a §2.1–2.2, 001b §2.3):

- ``malloc(size)``: requests above one page are rounded up to whole pages; reuse a cached
  buffer when one fits the reuse window; on a miss, if ``active + cache + size`` reaches the
  memory limit, evict ``active + cache + size - limit`` bytes of cache (oldest first, all of it
  at >= 90%); then allocate. Active and peak count the buffer's *real* (rounded) size. After
  every allocation the cache is trimmed to the cache limit.
- ``free(buf)``: active drops by the real size; the buffer is recycled into the cache while
  the cache is under its limit, otherwise released.
- A request that cannot be met even after emptying the cache raises
  ``RuntimeError("[malloc] Unable to allocate N bytes. ...")`` and changes no counter.

Memory numpy allocated on its own (a rule's result) is *adopted*: accounted as a buffer of
its real size, and recycled like any other when freed.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Optional

import numpy as np

from . import timeline
from .buffer_cache import BufferCache

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


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 33


class Allocator:
    """The allocator of one device (``"cpu"`` here; CUDA plugs in its own raw allocation)."""

    def __init__(self, device: str = "cpu", page_size: Optional[int] = None,
                 total_memory: Optional[int] = None):
        self.device = device
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self.total_memory = total_memory or _physical_memory()
        self.memory_limit = int(0.8 * self.total_memory)
        self.cache_limit = self.memory_limit
        self.wired_limit = 0
        self.active = 0
        self.peak = 0
        self._lock = threading.RLock()
        self.cache: BufferCache[Buffer] = BufferCache(self.page_size, lambda b: b.size, self._release)

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
        """Requests larger than one page are rounded up to whole pages."""
        if size > self.page_size:
            return -(-size // self.page_size) * self.page_size
        return size

    def malloc(self, size: int) -> Buffer:
        """A buffer of at least ``size`` bytes, from the cache when one fits."""
        if size == 0:
            return Buffer(self._raw_alloc(0), 0)
        size = self.round_size(size)
        with self._lock:
            buf = self.cache.reuse_from_cache(size)
            reused = buf is not None
            if buf is None:
                required = self.active + self.cache.cache_size() + size
                if required >= self.memory_limit:
                    self._evict(required - self.memory_limit)
                buf = self._allocate_or_raise(size)
            self.active += buf.size
            self.peak = max(self.peak, self.active)
            if self.cache.cache_size() > self.cache_limit:
                self._evict(self.cache.cache_size() - self.cache_limit)
        if timeline.enabled:
            timeline.add("cache_reuse" if reused else "alloc", timeline.now(), device=self.device,
                         nbytes=buf.size, detail={"buffer": buf.id, "requested": size})
        return buf

    def _evict(self, nbytes: int) -> None:
        before = self.cache.cache_size()
        n = self.cache.release_cached_buffers(nbytes)
        if n and timeline.enabled:
            timeline.add("evict", timeline.now(), device=self.device,
                         nbytes=before - self.cache.cache_size(), detail={"buffers": n})

    def _allocate_or_raise(self, size: int) -> Buffer:
        raw = None
        if size <= self.total_memory:
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
        return Buffer(raw, size)

    def adopt(self, owner: Any) -> Buffer:
        """Account for memory numpy allocated by itself (``owner`` owns its data)."""
        buf = Buffer(owner, owner.nbytes)
        if buf.size:
            with self._lock:
                self.active += buf.size
                self.peak = max(self.peak, self.active)
            if timeline.enabled:
                timeline.add("alloc", timeline.now(), device=self.device, nbytes=buf.size,
                             detail={"buffer": buf.id, "adopted": True})
        return buf

    def free(self, buf: Buffer) -> None:
        """Return a buffer: to the cache while it is under its limit, else to the system."""
        if buf.size == 0 or buf.raw is None:
            return
        with self._lock:
            self.active -= buf.size
            keep = self.cache.cache_size() < self.cache_limit
            if keep:
                self.cache.recycle_to_cache(buf)
        if timeline.enabled:
            timeline.add("free_to_cache" if keep else "free", timeline.now(), device=self.device,
                         nbytes=buf.size, detail={"buffer": buf.id})
        if not keep:
            self._release(buf)

    # -- statistics and limits (MLX's memory API) -----------------------------------------
    def get_cache_memory(self) -> int:
        return self.cache.cache_size()

    def set_memory_limit(self, limit: int) -> int:
        with self._lock:
            old, self.memory_limit = self.memory_limit, int(limit)
            return old

    def set_cache_limit(self, limit: int) -> int:
        with self._lock:
            old, self.cache_limit = self.cache_limit, int(limit)  # trimmed on the next malloc
            return old

    def set_wired_limit(self, limit: int) -> int:
        with self._lock:
            old, self.wired_limit = self.wired_limit, int(limit)
            return old

    def reset_peak_memory(self) -> None:
        with self._lock:
            self.peak = 0

    def clear_cache(self) -> None:
        with self._lock:
            self._evict(self.cache.cache_size())


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
