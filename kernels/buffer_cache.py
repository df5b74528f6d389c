"""MLX's BufferCache: freed buffers kept for reuse, by size and by age.

A size-ordered index (MLX: a multimap) finds the smallest cached buffer that fits; an LRU
list (newest at the head) decides what to evict first (the oldest, from the tail). A cached
buffer is reused only if ``size <= cached < min(2 * size, size + 2 * page_size)``, so a small
request never pins a much larger block. Not thread-safe: the allocator holds its lock.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from typing import Callable, Generic, Optional, TypeVar

T = TypeVar("T")


class BufferCache(Generic[T]):
    """Cache of free buffers; ``get_size(buf)`` gives a buffer's real size, ``free(buf)`` releases it."""

    def __init__(self, page_size: int, get_size: Callable[[T], int], free: Callable[[T], None]):
        self.page_size = page_size
        self._get_size = get_size
        self._free = free
        self._by_size: list[tuple[int, int]] = []  # sorted (size, seq): the multimap
        self._lru: "collections.OrderedDict[int, T]" = collections.OrderedDict()  # seq -> buf, oldest first
        self._seq = itertools.count()
        self.pool_size = 0

    def __len__(self) -> int:
        return len(self._lru)

    def cache_size(self) -> int:
        """Bytes held in the cache."""
        return self.pool_size

    def reuse_from_cache(self, size: int) -> Optional[T]:
        """The smallest cached buffer of at least ``size`` bytes within the reuse window, or None."""
        i = bisect.bisect_left(self._by_size, (size, -1))
        if i == len(self._by_size):
            return None
        cached, seq = self._by_size[i]
        if cached >= min(2 * size, size + 2 * self.page_size):
            return None
        del self._by_size[i]
        buf = self._lru.pop(seq)
        self.pool_size -= cached
        return buf

    def recycle_to_cache(self, buf: T) -> None:
        """Keep ``buf`` for reuse (it becomes the most recently used)."""
        size = self._get_size(buf)
        seq = next(self._seq)
        bisect.insort(self._by_size, (size, seq))
        self._lru[seq] = buf
        self.pool_size += size

    def release_cached_buffers(self, min_bytes_to_free: int) -> int:
        """Free the oldest buffers until ``min_bytes_to_free`` bytes are freed (all of them when
        that is at least 90% of the pool); returns how many buffers were freed."""
        if min_bytes_to_free >= 0.9 * self.pool_size:
            return self.clear()
        freed = count = 0
        while self._lru and freed < min_bytes_to_free:
            seq, buf = self._lru.popitem(last=False)
            size = self._get_size(buf)
            del self._by_size[bisect.bisect_left(self._by_size, (size, seq))]
            self._free(buf)
            freed += size
            count += 1
        self.pool_size -= freed
        return count

    def clear(self) -> int:
        """Free every cached buffer; returns how many were freed."""
        n = len(self._lru)
        for buf in self._lru.values():
            self._free(buf)
        self._lru.clear()
        self._by_size.clear()
        self.pool_size = 0
        return n

    def buffers(self) -> list[T]:
        """The cached buffers, oldest first (for the widgets)."""
        return list(self._lru.values())
