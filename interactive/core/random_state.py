"""``mx.random.state``: the global PRNG key, one per thread, behind one process-wide object.

As MLX 0.32 keeps it (python/src/random.cpp): each thread has its own key (a thread's first
key is the process's time seed's, so threads do not race on one key), and
``mx.random.state`` is the same sentinel object on every thread, so capturing it
(``mx.compile(..., inputs=mx.random.state, outputs=mx.random.state)``) is thread-independent:
the tree walks (``tree.py``) read and write the calling thread's key where they meet it.
``mx.clear_streams()`` resets the calling thread's key (its streams are gone).
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

import numpy as np

from . import dtypes as _dt
from .array import array

_TIME_SEED = int(time.time() * 1000)
_U32_MAX = 2**32 - 1
_local = threading.local()


def key_array(seed: int) -> array:
    """A PRNG key from a checked seed: ``[seed >> 32, seed & 0xffffffff]`` as uint32."""
    return array._from_data(np.array([seed >> 32, seed & _U32_MAX], dtype=np.uint32), _dt.uint32)


def thread_key() -> array:
    """The calling thread's global key (made from the time seed on first use)."""
    k = getattr(_local, "key", None)
    if k is None:
        k = _local.key = key_array(_TIME_SEED)
    return k


def set_thread_key(k: array) -> None:
    """Replace the calling thread's global key."""
    _local.key = k


def reset_thread_key() -> None:
    """Forget the calling thread's key (MLX's ``reset_random_state``, on clear_streams)."""
    _local.key = None


class _RandomState:
    """The ``mx.random.state`` sentinel: a one-item sequence whose item is the calling
    thread's key (MLX's ``_RandomState``: ``len``, ``[0]`` / ``[-1]``, iteration)."""

    __slots__ = ()

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> array:
        if i not in (0, -1):
            raise IndexError("random state index out of range")
        return thread_key()

    def __iter__(self) -> Iterator[array]:
        return iter([thread_key()])


state = _RandomState()
