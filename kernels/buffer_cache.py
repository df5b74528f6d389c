"""MLX's BufferCache (mlx/backend/common/buffer_cache.h): freed buffers kept for reuse, by
size and by age.

A size-ordered index (MLX: a multimap) finds the smallest cached buffer that fits; an LRU
list (newest at the head) decides what to evict first (the oldest, from the tail). A cached
buffer is reused only if ``size <= cached < min(2 * size, size + 2 * page_size)``, so a small
request never pins a much larger block. Not thread-safe: the allocator holds its lock.

``BufferCache`` is kernels/_handle.c's where that extension is built (the same cache with its
index and LRU in C, which the allocator's C malloc / free use without a Python call), this
module's ``PyBufferCache`` otherwise.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from typing import Callable, Generic, Optional, TypeVar

T = TypeVar("T")


class PyBufferCache(Generic[T]):
    """Cache of free buffers; ``get_size(buf)`` gives a buffer's real size (None: its
    ``size`` attribute), ``free(buf)`` releases it.

    The multimap is a dict of size -> FIFO of (seq, buffer) plus the sorted list of sizes
    present, so reuse and recycling cost O(log sizes) however many buffers are cached. Within
    one size the FIFO is in insertion order, so the oldest of a size is always at its left:
    the one MLX's multimap reuses first, and the one LRU eviction reaches first.
    """

    def __init__(self, page_size: int, get_size: Optional[Callable[[T], int]],
                 free: Callable[[T], None]):
        self.page_size = page_size
        self._get_size = get_size
        self._free = free
        self._sizes: list[int] = []  # sorted sizes that have cached buffers
        self._by_size: dict[int, collections.deque] = {}  # size -> deque of (seq, buf)
        self._lru: "collections.OrderedDict[int, int]" = collections.OrderedDict()  # seq -> size, oldest first
        self._seq = itertools.count()
        self.pool_size = 0

    def __len__(self) -> int:
        return len(self._lru)

    def cache_size(self) -> int:
        """Bytes held in the cache."""
        return self.pool_size

    def _take(self, size: int) -> T:
        """Remove and return the oldest cached buffer of exactly ``size`` bytes."""
        q = self._by_size[size]
        seq, buf = q.popleft()
        if not q:
            del self._by_size[size]
            del self._sizes[bisect.bisect_left(self._sizes, size)]
        del self._lru[seq]
        self.pool_size -= size
        return buf

    def reuse_from_cache(self, size: int) -> Optional[T]:
        """The smallest cached buffer of at least ``size`` bytes within the reuse window, or None."""
        if size in self._by_size:
            return self._take(size)
        i = bisect.bisect_left(self._sizes, size)
        if i == len(self._sizes):
            return None
        cached = self._sizes[i]
        if cached >= min(2 * size, size + 2 * self.page_size):
            return None
        return self._take(cached)

    def recycle_to_cache(self, buf: T) -> None:
        """Keep ``buf`` for reuse (it becomes the most recently used)."""
        get_size = self._get_size
        size = buf.size if get_size is None else get_size(buf)
        seq = next(self._seq)
        q = self._by_size.get(size)
        if q is None:
            q = self._by_size[size] = collections.deque()
            bisect.insort(self._sizes, size)
        q.append((seq, buf))
        self._lru[seq] = size
        self.pool_size += size

    def release_cached_buffers(self, min_bytes_to_free: int) -> int:
        """Free the oldest buffers until ``min_bytes_to_free`` bytes are freed (all of them when
        that is at least 90% of the pool); returns how many buffers were freed."""
        if min_bytes_to_free >= 0.9 * self.pool_size:
            return self.clear()
        freed = count = 0
        while self._lru and freed < min_bytes_to_free:
            size = next(iter(self._lru.values()))
            self._free(self._take(size))  # the oldest of its size is the oldest overall
            freed += size
            count += 1
        return count

    def clear(self) -> int:
        """Free every cached buffer in the multimap's order (ascending size, oldest first
        within a size); returns how many were freed. The cache is empty before the first
        ``free`` runs."""
        bufs = [buf for size in self._sizes for _, buf in self._by_size[size]]
        self._lru.clear()
        self._by_size.clear()
        self._sizes.clear()
        self.pool_size = 0
        for buf in bufs:
            self._free(buf)
        return len(bufs)

    def buffers(self) -> list[T]:
        """The cached buffers, oldest first (for the widgets)."""
        items = [item for q in self._by_size.values() for item in q]
        return [buf for _, buf in sorted(items, key=lambda it: it[0])]


try:  # the same cache with its state in C (kernels/_handle.c)
    from ._handle import BufferCache
except ImportError:  # built without a C compiler
    BufferCache = PyBufferCache
