"""MLX's memory API: active / peak / cache memory, limits, and ``clear_cache``.

Every figure is exact to the byte: it is read from the allocator that every array's
storage comes from (``tapescope.kernels.allocator``).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import threading
from typing import Union

from tapescope.kernels import stream_workers
from tapescope.kernels.allocator import Allocator
from tapescope.kernels.backends import backend, gpu_available

from .device import Device, DeviceType, cpu, default_device, incompatible, streams

__all__ = [
    "get_active_memory", "get_peak_memory", "reset_peak_memory", "get_cache_memory",
    "set_memory_limit", "get_memory_limit", "set_cache_limit", "set_wired_limit",
    "clear_cache", "device_info",
]


def _allocator() -> Allocator:
    """The allocator of the default device's backend (MLX's memory API is the default
    device's)."""
    return backend(default_device()).allocator


def get_active_memory() -> int:
    """The bytes held by arrays now (cached buffers are not included). A GPU's buffers
    freed while its kernels read them count until those kernels have finished, as in MLX."""
    a = _allocator()
    a.settle()
    return a.active


def get_peak_memory() -> int:
    """The most active memory seen since start or the last ``reset_peak_memory()``."""
    return _allocator().peak


def reset_peak_memory() -> None:
    """Set the peak memory to zero."""
    _allocator().reset_peak_memory()


def get_cache_memory() -> int:
    """The bytes held in the buffer cache (freed, kept for reuse, not returned to the system)."""
    a = _allocator()
    a.settle()
    return a.get_cache_memory()


def set_memory_limit(limit: int) -> int:
    """Set the memory limit (a guideline: reaching it evicts the cache); returns the previous one."""
    return _allocator().set_memory_limit(_check_limit(limit, "set_memory_limit"))


def get_memory_limit() -> int:
    """The memory limit (CPU default: 0.8 x RAM, as mlx/backend/no_gpu/allocator.cpp)."""
    return _allocator().memory_limit


def set_cache_limit(limit: int) -> int:
    """Set the cache limit (CPU default 32 MiB; 0 disables the cache); the cache is trimmed
    to it at once. Returns the previous limit."""
    limit = _check_limit(limit, "set_cache_limit")
    _synchronize_cpu_streams()  # as MLX's CPU allocator: pending frees land first
    return _allocator().set_cache_limit(limit)


def set_wired_limit(limit: int) -> int:
    """Set the wired limit (unsupported on the CPU: always returns 0, as MLX)."""
    return _allocator().set_wired_limit(_check_limit(limit, "set_wired_limit"))


def clear_cache() -> None:
    """Release every cached buffer to the system (after the CPU streams finish, as MLX)."""
    a = _allocator()
    if a.get_cache_memory() == 0:
        return
    _synchronize_cpu_streams()
    a.clear_cache()


def device_info(d: Union[None, Device, DeviceType] = None) -> dict:
    """Information about a device (default: the default device); MLX's keys for the CPU,
    an empty dict for a GPU, which has no backend info here."""
    t = _device_type(d)
    if t != cpu:
        return backend("gpu").info() if gpu_available() else {}
    return dict(_cpu_info())


def _device_type(d: object) -> DeviceType:
    """The device type of ``device_info``'s argument, with nanobind's conversions."""
    if d is None:
        return default_device().type
    if isinstance(d, Device):
        return d.type
    if isinstance(d, DeviceType):
        return d
    if isinstance(d, int) and d in (0, 1):  # nanobind converts 0 / 1 (and bools) to the enum
        return DeviceType(int(d))
    raise incompatible("device_info",
                       "device_info(d: None | Device | DeviceType = None) -> dict[str, str | int]", d)


def _synchronize_cpu_streams() -> None:
    """Wait for every CPU stream's queued work (MLX's synchronize_cpu_streams in
    mlx/backend/no_gpu/allocator.cpp), except the calling worker's own."""
    me = threading.get_ident()
    for s in streams():
        if s.device.type == cpu:
            w = stream_workers.existing_worker(s.index)
            if w is not None and w.thread_id != me:
                w.synchronize()


def _check_limit(limit: int, op: str) -> int:
    """MLX takes a size_t: non-integers and numbers outside [0, 2**64) are rejected with a
    TypeError (nanobind finds no overload)."""
    if not isinstance(limit, int) or not 0 <= limit < 2**64:
        raise TypeError(
            f"{op}(): incompatible function arguments. The following argument types are "
            f"supported:\n    1. {op}(limit: int) -> int\n\nInvoked with types: {type(limit).__name__}")
    return int(limit)


@functools.lru_cache(maxsize=None)
def _cpu_info() -> tuple:
    """MLX's CPU device info (mlx/backend/cpu/device_info.cpp), read once."""
    return (("architecture", _cpu_architecture()), ("device_name", _cpu_name()))


def _cpu_architecture() -> str:
    """uname's machine, as MLX's get_cpu_architecture."""
    try:
        return os.uname().machine
    except AttributeError:  # Windows
        return platform.machine() or "unknown"


def _cpu_name() -> str:
    """The CPU's brand string, as MLX's get_cpu_name; the architecture when unknown."""
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=5)
            if out.returncode == 0:
                return out.stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            pass
    else:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        _, sep, name = line.rstrip("\n").partition(": ")
                        if sep:
                            return name
        except OSError:
            pass
    return _cpu_architecture()
