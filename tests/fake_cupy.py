"""A stand-in for CuPy over numpy, for running the CUDA backend's host logic without a GPU.

Only what ``kernels/cuda`` calls exists: ``ndarray`` (a numpy subclass, so the core sees a
foreign device's array type), ``asarray`` / ``asnumpy`` / ``empty`` / ``array``, the
``cuda`` namespace (``Stream`` with ``use`` / ``synchronize`` / ``wait_event``, ``Event``
with ``record`` / ``done`` / ``synchronize``, ``Device``, ``runtime`` facts, ``set_allocator``,
``memory.OutOfMemoryError``). Work is synchronous, so an event is done when recorded: the
stream-ordering tests need the real GPU. The rules' array-module behaviour is tested with
``tests/cupy_like.py``; this module only carries the backend's plumbing.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import types

import numpy as np

__fake__ = True
TOTAL = 8 << 30
ELAPSED_MS = [0.0]  # what every pair of events measures (a test sets it: no device clock here)


def _refuse(dtype) -> None:
    """CuPy has no bfloat16 (nor other ml_dtypes) dtype: refuse it as CuPy does."""
    if dtype is not None and np.dtype(dtype).kind == "V":
        raise TypeError(f"Unsupported type {np.dtype(dtype)}")


class ndarray(np.ndarray):
    """A 'device' array: numpy memory, a distinct type."""

    def astype(self, dtype, *args, **kw):
        _refuse(dtype)
        return np.ndarray.astype(self, dtype, *args, **kw)

    def set(self, arr, stream=None):  # host to device; CuPy's checks, no broadcasting
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        self[...] = arr

    def get(self, stream=None):  # device to host
        return np.array(self.view(np.ndarray))

    @property
    def base(self):  # as in CuPy, a fresh array owns its memory (no numpy base behind it)
        b = np.ndarray.base.__get__(self)
        fresh = type(b) is np.ndarray and b.base is None and b.nbytes == self.nbytes
        return None if fresh else b


def asarray(a, dtype=None, **kw):
    a = np.asarray(a.view(np.ndarray) if isinstance(a, ndarray) else a, dtype=dtype, **kw)
    _refuse(a.dtype)
    return a.view(ndarray)


def array(a, dtype=None, copy=True, **kw):
    a = np.array(a.view(np.ndarray) if isinstance(a, ndarray) else a, dtype=dtype, copy=copy, **kw)
    _refuse(a.dtype)
    return a.view(ndarray)


def asnumpy(a):
    return np.array(a.view(np.ndarray) if isinstance(a, ndarray) else a)


def empty(shape, dtype=np.float32, order="C"):
    _refuse(dtype)
    return np.empty(shape, dtype, order=order).view(ndarray)


# -- cupy.cuda ------------------------------------------------------------------------------
_current = threading.local()


class Stream:
    null = None

    def __init__(self, non_blocking: bool = False):
        self.non_blocking = non_blocking
        self.waited: list = []

    def use(self):
        _current.stream = self
        return self

    def __enter__(self):  # ``with stream:`` makes it current, as CuPy's
        self._prev = get_current_stream()
        return self.use()

    def __exit__(self, *exc):
        self._prev.use()
        return False

    def synchronize(self):
        _synchronized()

    def wait_event(self, ev):
        self.waited.append(ev)


Stream.null = Stream()


def get_current_stream():
    return getattr(_current, "stream", Stream.null)


LAG = [0]  # polls of ``done`` that an event answers False after its record (0: done at once)
_SYNCS = [0]  # device / stream synchronisations so far: events recorded before one are done


def _synchronized() -> None:
    _SYNCS[0] += 1


class Event:
    def __init__(self, block=False, disable_timing=False):
        self.recorded_on = None
        self._polls = 0

    def record(self, stream=None):
        self.recorded_on = stream
        self._polls = LAG[0]
        self._syncs = _SYNCS[0]

    @property
    def done(self):  # work is synchronous; with LAG set, completion is seen late, as on a GPU
        if self._polls > 0 and self._syncs == _SYNCS[0]:
            self._polls -= 1
            return False
        return True

    def synchronize(self):
        self._polls = 0


class Device:
    def __init__(self, i=0):
        self.id = i

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class OutOfMemoryError(MemoryError):
    pass


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int):
        self.status = status
        super().__init__(f"cudaError {status}")


_HOST_PAGES: list = []  # hostAlloc's memory (pinned and mapped: the device's address is the host's)


def _host_alloc(size: int, flags: int = 0) -> int:
    buf = ctypes.create_string_buffer(size)
    _HOST_PAGES.append(buf)
    return ctypes.addressof(buf)


runtime = types.SimpleNamespace(
    CUDARuntimeError=CUDARuntimeError,
    hostAlloc=_host_alloc,
    malloc=_host_alloc,  # (device memory is the host's)
    # (the stream runs nothing: a copy is done when it is enqueued)
    memcpyAsync=lambda dst, src, size, kind, stream: ctypes.memmove(dst, src, size),
    getDeviceCount=lambda: 1,
    getDevice=lambda: 0,
    setDevice=lambda device: None,
    deviceSynchronize=_synchronized,
    memGetInfo=lambda: (TOTAL // 2, TOTAL),
    getDeviceProperties=lambda i=0: {"name": b"Fake GPU", "totalGlobalMem": TOTAL, "major": 9,
                                     "minor": 0, "uuid": bytes(range(16)),
                                     "multiProcessorCount": 132, "clockRate": 1980000},
)
cuda = types.SimpleNamespace(
    Stream=Stream, Event=Event, Device=Device, runtime=runtime,
    get_current_stream=get_current_stream, set_allocator=lambda f=None: None,
    get_elapsed_time=lambda a, b: ELAPSED_MS[0],
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
)


def install() -> None:
    """Make ``import cupy`` give this module (call before tapescope asks for a GPU)."""
    sys.modules["cupy"] = sys.modules[__name__]


# the array-module functions the rules call
def __getattr__(name):
    fn = getattr(np, name)
    if not callable(fn) or isinstance(fn, (type, np.ufunc)) or isinstance(fn, types.ModuleType):
        return fn  # ufuncs keep subclass arrays themselves

    def wrapped(*args, **kw):
        args = [a.view(np.ndarray) if isinstance(a, ndarray) else a for a in args]
        out = fn(*args, **kw)
        return out.view(ndarray) if type(out) is np.ndarray else out
    return wrapped
