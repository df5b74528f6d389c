"""Devices and streams: ``mx.cpu``, ``mx.gpu``, ``mx.Device``, ``mx.Stream`` and the defaults."""

from __future__ import annotations

import enum
import threading
from typing import Optional, Union


class DeviceType(enum.Enum):
    """The kind of a device; ``mx.cpu`` and ``mx.gpu`` are its members."""

    cpu = 0
    gpu = 1

    def __repr__(self) -> str:
        return f"DeviceType.{self.name}"

    __str__ = __repr__


cpu = DeviceType.cpu
gpu = DeviceType.gpu


class Device:
    """A device to run on: ``Device(type, index=0)``."""

    __slots__ = ("type", "index")

    def __init__(self, type: DeviceType, index: int = 0):
        if isinstance(type, Device):
            type, index = type.type, type.index
        if not isinstance(type, DeviceType) or not isinstance(index, int):
            raise TypeError(
                "__init__(): incompatible function arguments. The following argument types "
                "are supported:\n    1. __init__(self, type: mlx.core.DeviceType, index: int = 0) -> None")
        self.type = type
        self.index = index

    def __repr__(self) -> str:
        return f"Device({self.type.name}, {self.index})"

    def __eq__(self, other) -> bool:
        if isinstance(other, DeviceType):
            other = Device(other)
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


class Stream:
    """An in-order queue of work on one device (``Stream(Device(cpu, 0), 0)``)."""

    __slots__ = ("device", "index", "__weakref__")

    def __init__(self, device: Device, index: int):
        self.device = device
        self.index = index

    def __repr__(self) -> str:
        return f"Stream({self.device!r}, {self.index})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.index == self.index

    def __hash__(self) -> int:
        return hash(self.index)


DeviceLike = Union[Device, DeviceType]
StreamOrDevice = Optional[Union[Stream, Device, DeviceType]]

_lock = threading.RLock()
_streams: list[Stream] = []
_default_streams: dict[Device, Stream] = {}
_default_device: Optional[Device] = None


def _gpu_backend_available() -> bool:
    """Whether a GPU runtime (CUDA through CuPy, or Metal) works in this process."""
    from tapescope.kernels import backends

    return backends.gpu_available()


def _as_device(d: DeviceLike) -> Device:
    if isinstance(d, Device):
        return d
    if isinstance(d, DeviceType):
        return Device(d)
    raise TypeError(f"Expected a Device or DeviceType, got {type(d).__name__}.")


def is_available(device: DeviceLike) -> bool:
    """Whether the device's backend is available."""
    d = _as_device(device)
    if d.type == cpu:
        return d.index == 0
    return d.index < device_count(gpu)


def device_count(device_type: DeviceType) -> int:
    """The number of devices of this type."""
    if device_type == cpu:
        return 1
    if not _gpu_backend_available():
        return 0
    from tapescope.kernels import backends

    return backends.gpu_count()


def _check_device(d: Device, op: str, verb: str) -> None:
    if d.type == gpu and not _gpu_backend_available():
        raise ValueError(f"[{op}] Cannot {verb} gpu {'device' if op == 'set_default_device' else 'stream'} without gpu backend.")
    if not is_available(d):
        raise ValueError(f"[{op}] Device {d!r} is not available.")


def new_stream(device: DeviceLike) -> Stream:
    """Make a new stream on the given device."""
    d = _as_device(device)
    _check_device(d, "new_stream", "make")
    with _lock:
        s = Stream(d, len(_streams))
        _streams.append(s)
        return s


def default_stream(device: DeviceLike) -> Stream:
    """The default stream of the given device."""
    d = _as_device(device)
    _check_device(d, "default_stream", "get")
    with _lock:
        s = _default_streams.get(d)
        if s is None:
            s = Stream(d, len(_streams))
            _streams.append(s)
            _default_streams[d] = s
        return s


def set_default_stream(stream: Stream) -> None:
    """Make ``stream`` the default for its device; the default device does not change."""
    if not isinstance(stream, Stream):
        raise TypeError("[set_default_stream] Expected a Stream.")
    with _lock:
        _default_streams[stream.device] = stream


def default_device() -> Device:
    """The default device: the GPU where a GPU backend is available, else the CPU."""
    global _default_device
    if _default_device is None:
        _default_device = Device(gpu) if _gpu_backend_available() else Device(cpu)
    return _default_device


def set_default_device(device: DeviceLike) -> None:
    """Set the default device."""
    global _default_device
    d = _as_device(device)
    _check_device(d, "set_default_device", "set")
    _default_device = d


def streams() -> list[Stream]:
    """Every stream made so far (for the scheduler and the widgets)."""
    with _lock:
        return list(_streams)


def resolve_stream(s: StreamOrDevice) -> Stream:
    """The stream an op runs on, from its ``stream=`` argument (MLX's ``to_stream``)."""
    if s is None:
        return default_stream(default_device())
    if isinstance(s, Stream):
        return s
    d = _as_device(s)
    if d.type == gpu and not _gpu_backend_available():
        raise ValueError("[default_stream] Cannot get gpu stream without gpu backend.")
    return default_stream(d)


class stream:
    """Context manager that makes a stream (or a device's default stream) the default.

    ``with mx.stream(s):`` sets both the default device and that device's default stream,
    and restores both on exit.
    """

    def __init__(self, s: Union[Stream, Device, DeviceType]):
        self._target = s

    def __enter__(self):
        self._old_device = default_device()
        s = resolve_stream(self._target)
        self._old_stream = default_stream(s.device)
        set_default_device(s.device)
        set_default_stream(s)
        return None

    def __exit__(self, *exc):
        set_default_stream(self._old_stream)
        set_default_device(self._old_device)
        return False
