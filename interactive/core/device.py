"""Devices and streams: ``mx.cpu``, ``mx.gpu``, ``mx.Device``, ``mx.Stream`` and the defaults.

As in MLX (checked against mlx 0.32): the default *device* is global; the default *stream*
of each device is per thread (a thread's first use of a device makes it a new stream);
stream indices are numbered process-wide. A stream belongs to the thread that made it:
evaluating its work on another thread raises RuntimeError, except for streams made by
``new_thread_unsafe_stream``; a ``ThreadLocalStream`` is a different stream in each thread.
``with mx.stream(s):`` saves the current default device's default stream on entry and
restores that device and stream on exit.
"""

from __future__ import annotations

import enum
import functools
import threading
from typing import Any, Callable, Optional, Sequence, Union


class DeviceType(enum.Enum):
    """The kind of a device; ``mx.cpu`` and ``mx.gpu`` are its members."""

    cpu = 0
    gpu = 1

    def __repr__(self) -> str:
        return f"DeviceType.{self.name}"

    __str__ = __repr__


cpu = DeviceType.cpu
gpu = DeviceType.gpu


def nb_type_name(obj: Any) -> str:
    """A value's type as nanobind names it in MLX's 'incompatible function arguments' errors:
    a static type (builtins, numpy scalars) by its name, a heap type as ``module.name``."""
    t = type(obj)
    if t.__module__.startswith("tapescope.core"):
        return f"mlx.core.{t.__name__}"
    if t.__flags__ & _HEAPTYPE:
        return f"{t.__module__}.{t.__name__}"
    return t.__name__


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE


def incompatible(fn: str, signature: Union[str, Sequence[str]], *args: Any,
                 **kwargs: Any) -> TypeError:
    """MLX's (nanobind's) TypeError for arguments of the wrong type; ``signature``: the one
    signature, or every overload's."""
    sigs = [signature] if isinstance(signature, str) else list(signature)
    listed = "\n".join(f"    {i}. {sig}" for i, sig in enumerate(sigs, 1))
    types = ", ".join(nb_type_name(a) for a in args)
    if kwargs:
        kw = ", ".join(f"{k}: {nb_type_name(v)}" for k, v in kwargs.items())
        types = f"{types}, kwargs = {{ {kw} }}" if types else f"kwargs = {{ {kw} }}"
    return TypeError(f"{fn}(): incompatible function arguments. The following argument types "
                     f"are supported:\n{listed}\n\nInvoked with types: {types}")


class BadArgs(TypeError):
    """An argument of a type the op's MLX binding refuses: raised by the op's checks, and
    reported by ``binding`` as nanobind does, from the arguments as they were passed."""


def binding(*signatures: str) -> Callable:
    """Decorate an op whose checks raise ``BadArgs``: the caller gets MLX's
    ``incompatible(name, signatures, *args, **kwargs)`` for the call as it was made
    (positional and keyword arguments are listed apart, as nanobind lists them)."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def op(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except BadArgs:
                raise incompatible(fn.__name__, signatures, *args, **kwargs) from None

        return op

    return deco


def _as_type(t: Any) -> Optional[DeviceType]:
    """A DeviceType from a DeviceType or its integer value (nanobind converts ints), else None."""
    if isinstance(t, DeviceType):
        return t
    if isinstance(t, int) and not isinstance(t, bool) and t in (0, 1):
        return DeviceType(t)
    return None


class Device:
    """A device to run operations on."""

    __slots__ = ("_type", "index", "_hash")

    def __init__(self, type: DeviceType, index: int = 0):
        t = _as_type(type)
        if t is None or not isinstance(index, int):
            passed_index = not (isinstance(index, int) and index == 0)
            shown = (type, index) if passed_index else (type,)  # nanobind lists what was passed
            raise incompatible("__init__", "__init__(self, type: mlx.core.DeviceType, index: int = 0) "
                               "-> None", self, *shown)
        self._type = t
        self.index = int(index)  # not an attribute in MLX's Python API; kept for the runtime
        # made once: every op looks its thread's default stream up by device, and hashing
        # an enum member in Python costs ~1 us
        self._hash = hash((t, self.index))

    @property
    def type(self) -> DeviceType:
        """The device's type (read-only, as MLX's)."""
        return self._type

    def __repr__(self) -> str:
        return f"Device({self.type.name}, {self.index})"

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, DeviceType):
            other = Device(other)
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:  # MLX hashes by identity; value hashing keeps hash/eq consistent
        return self._hash


class Stream:
    """A stream for running operations on a given device (made by ``new_stream``)."""

    __slots__ = ("device", "index", "_owner", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("mlx.core.Stream: no constructor defined!")

    @classmethod
    def _new(cls, device: Device, index: int, thread: Optional[int]) -> "Stream":
        s = object.__new__(cls)
        s.device = device
        s.index = index  # not an attribute in MLX's Python API; kept for the runtime
        s._owner = thread  # the owning thread's ident; None: usable on any thread
        return s

    def __repr__(self) -> str:
        return f"Stream({self.device!r}, {self.index})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Stream) and other.index == self.index

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.index)


class ThreadLocalStream:
    """A stream that is a different ``Stream`` in each thread (made there on first use)."""

    __slots__ = ("device", "_index", "_key", "__weakref__")
    _count = 0

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("mlx.core.ThreadLocalStream: no constructor defined!")

    @classmethod
    def _new(cls, device: Device) -> "ThreadLocalStream":
        t = object.__new__(cls)
        t.device = device
        with _lock:
            t._index = cls._count
            cls._count += 1
        t._key = ("thread-local", t._index)
        return t

    def _stream(self) -> Stream:
        """This thread's stream."""
        defaults = _thread_defaults()
        s = defaults.get(self._key)
        if s is None:
            s = defaults[self._key] = _make_stream(self.device)
        return s

    def __repr__(self) -> str:
        return f"ThreadLocalStream({self.device!r}, {self._index})"


DeviceLike = Union[Device, DeviceType]
StreamOrDevice = Optional[Union[Stream, ThreadLocalStream, Device, DeviceType]]

_lock = threading.RLock()
_streams: list[Stream] = []
_tls = threading.local()  # .defaults: {Device: Stream}, this thread's default streams
_default_device: Optional[Device] = None
# moved on by every change of a default device or stream: core/_stream.c's resolve_stream
# remembers each thread's default stream beside the generation it was found in
_stream_generation = 0


def _defaults_changed() -> None:
    global _stream_generation
    _stream_generation += 1


def _on_worker() -> bool:
    """Work nested in a node runs on the stream's worker thread, on the owner's behalf."""
    from tapescope.kernels import stream_workers

    return stream_workers.on_worker()


def _gpu_backend_available() -> bool:
    """Whether a GPU runtime (CUDA through CuPy, or Metal) works in this process."""
    from tapescope.kernels import backends

    return backends.gpu_available()


def _as_device(d: Any, fn: str, signature: str) -> Device:
    if isinstance(d, Device):
        return d
    t = _as_type(d)
    if t is None:
        raise incompatible(fn, signature, d)
    return Device(t)


def _thread_defaults() -> dict:
    defaults = getattr(_tls, "defaults", None)
    if defaults is None:
        defaults = _tls.defaults = {}
    return defaults


def _check_index(d: Device) -> None:
    """MLX indexes its per-device tables with the device index (a C++ vector range check)."""
    n = device_count(d.type)
    i = d.index % 2**64
    if i >= n:
        raise IndexError(f"vector::_M_range_check: __n (which is {i}) >= this->size() (which is {n})")


def _make_stream(d: Device, owned: bool = True) -> Stream:
    """A new stream on ``d``, owned by the calling thread unless ``owned`` is False."""
    with _lock:
        s = Stream._new(d, len(_streams), threading.get_ident() if owned else None)
        _streams.append(s)
        return s


def check_thread(s: Stream) -> None:
    """MLX 0.32's RuntimeError for evaluating work on a stream another thread owns."""
    t = s._owner
    if t is not None and t != threading.get_ident() and not _on_worker():
        raise RuntimeError(f"There is no Stream({s.device.type.name}, {s.index}) in current thread.")


def is_available(device: DeviceLike) -> bool:
    """Whether the device is available."""
    d = _as_device(device, "is_available", "is_available(device: Device | DeviceType) -> bool")
    if d.type == gpu and not _gpu_backend_available():
        return False
    return d.index < device_count(d.type)


def device_count(device_type: DeviceType) -> int:
    """The number of available devices of the given type."""
    t = _as_type(device_type)
    if t is None:
        raise incompatible("device_count", "device_count(device_type: mlx.core.DeviceType) -> int",
                           device_type)
    if t == cpu:
        return 1
    if not _gpu_backend_available():
        return 0
    from tapescope.kernels import backends

    return backends.gpu_count()


def new_stream(device: DeviceLike) -> Stream:
    """Make a new stream on the given device."""
    d = _as_device(device, "new_stream", "new_stream(device: Device | DeviceType) -> Stream")
    if d.type == gpu and not _gpu_backend_available():
        raise ValueError("[new_stream] Cannot make gpu stream without gpu backend.")
    return _make_stream(d)


def new_thread_local_stream(device: DeviceLike) -> ThreadLocalStream:
    """Make a new stream that will be unique per thread."""
    d = _as_device(device, "new_thread_local_stream",
                   "new_thread_local_stream(device: Device | DeviceType) -> ThreadLocalStream")
    return ThreadLocalStream._new(d)


def new_thread_unsafe_stream(device: DeviceLike) -> Stream:
    """Make a new stream that can be used in any thread (the caller keeps its uses in order)."""
    d = _as_device(device, "new_thread_unsafe_stream",
                   "new_thread_unsafe_stream(device: Device | DeviceType) -> Stream")
    if d.type == gpu and not _gpu_backend_available():
        raise ValueError("[new_thread_unsafe_stream] Cannot make gpu stream without gpu backend.")
    return _make_stream(d, owned=False)


def default_stream(device: DeviceLike) -> Stream:
    """Get the device's default stream (this thread's)."""
    d = _as_device(device, "default_stream", "default_stream(device: Device | DeviceType) -> Stream")
    if d.type == gpu and not _gpu_backend_available():
        raise ValueError("[default_stream] Cannot get gpu stream without gpu backend.")
    _check_index(d)
    defaults = _thread_defaults()
    s = defaults.get(d)
    if s is None:
        s = defaults[d] = _make_stream(d)
    return s


def set_default_stream(stream: Stream) -> None:
    """Set the default stream of the stream's device (for this thread); the default device
    does not change."""
    if not isinstance(stream, Stream):
        raise incompatible("set_default_stream", "set_default_stream(stream: mlx.core.Stream) -> None",
                           stream)
    _check_index(stream.device)
    _thread_defaults()[stream.device] = stream
    _defaults_changed()


def default_device() -> Device:
    """Get the default device: the GPU where a GPU backend is available, else the CPU."""
    global _default_device
    if _default_device is None:
        _default_device = Device(gpu) if _gpu_backend_available() else Device(cpu)
    return _default_device


def set_default_device(device: DeviceLike) -> None:
    """Set the default device (for every thread)."""
    global _default_device
    d = _as_device(device, "set_default_device", "set_default_device(device: Device | DeviceType) -> None")
    if d.type == gpu and not _gpu_backend_available():
        raise ValueError("[set_default_device] Cannot set gpu device without gpu backend.")
    _default_device = d
    _defaults_changed()


def streams() -> list[Stream]:
    """Every stream made so far (``mx.synchronize`` and the memory API walk them)."""
    with _lock:
        return list(_streams)


def _resolve_stream(s: StreamOrDevice) -> Stream:
    """The stream an op runs on, from its ``stream=`` argument (MLX's ``to_stream``)."""
    if s is None:
        d = _default_device if _default_device is not None else default_device()
        defaults = getattr(_tls, "defaults", None)
        if defaults is not None:  # the hot path: this thread's default stream, already made
            st = defaults.get(d)
            if st is not None:
                return st
        return default_stream(d)
    if isinstance(s, Stream):
        return s
    if isinstance(s, ThreadLocalStream):
        return s._stream()
    if isinstance(s, Device) or _as_type(s) is not None:
        return default_stream(s)
    raise TypeError(f"Expected stream to be a Stream, Device or DeviceType, got {type(s).__name__}.")


def _c_resolve_stream():
    """``_resolve_stream`` in C (core/_stream.c: ``stream=None`` remembered per thread), where
    the extension is built and ``settings.c_call`` is on; the Python function otherwise."""
    from tapescope.kernels.settings import settings

    if not settings.c_call:
        return _resolve_stream
    try:
        from . import _call
    except ImportError:
        return _resolve_stream
    _call.configure_stream({"resolve": _resolve_stream, "globals": globals(),
                            "stream_type": Stream})
    return _call.resolve_stream


resolve_stream = _c_resolve_stream()


class StreamContext:
    """Makes a stream (or a device's default stream) the default inside a ``with`` block."""

    def __init__(self, s: Union[Stream, Device, DeviceType]):
        self._target = s
        self._saved: list[Stream] = []

    def __enter__(self) -> None:
        saved = default_stream(default_device())
        target = resolve_stream(self._target)
        set_default_device(target.device)
        set_default_stream(target)
        self._saved.append(saved)
        return None

    def __exit__(self, *exc: Any) -> bool:
        saved = self._saved.pop()
        set_default_device(saved.device)
        set_default_stream(saved)
        return False


def stream(s: Union[Stream, Device, DeviceType]) -> StreamContext:
    """Create a context manager to set the default device and stream."""
    if not (isinstance(s, (Stream, ThreadLocalStream, Device)) or _as_type(s) is not None):
        raise incompatible("stream", "stream(s: mlx.core.Stream | mlx.core.ThreadLocalStream | "
                           "mlx.core.Device | mlx.core.DeviceType) -> mlx.core.StreamContext", s)
    return StreamContext(s)
