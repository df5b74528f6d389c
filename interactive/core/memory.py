"""MLX's memory API: active / peak / cache memory, limits, and ``clear_cache``.

Every figure is exact to the byte: it is read from the allocator that every array's
storage comes from (``tapescope.kernels.allocator``).
"""

from __future__ import annotations

import platform

from tapescope.kernels.allocator import Allocator, allocator

__all__ = [
    "get_active_memory", "get_peak_memory", "reset_peak_memory", "get_cache_memory",
    "set_memory_limit", "get_memory_limit", "set_cache_limit", "set_wired_limit",
    "clear_cache", "device_info",
]


def _allocator() -> Allocator:
    """The allocator of the default device's backend (the CPU allocator here)."""
    return allocator("cpu")


def get_active_memory() -> int:
    """The bytes held by arrays now (cached buffers are not included)."""
    return _allocator().active


def get_peak_memory() -> int:
    """The most active memory seen since start or the last ``reset_peak_memory()``."""
    return _allocator().peak


def reset_peak_memory() -> None:
    """Set the peak memory to zero."""
    _allocator().reset_peak_memory()


def get_cache_memory() -> int:
    """The bytes held in the buffer cache (freed, kept for reuse, not returned to the system)."""
    return _allocator().get_cache_memory()


def set_memory_limit(limit: int) -> int:
    """Set the memory limit (a guideline: reaching it evicts the cache); returns the previous one."""
    return _allocator().set_memory_limit(_check_limit(limit, "set_memory_limit"))


def get_memory_limit() -> int:
    """The memory limit (default 0.8 x RAM)."""
    return _allocator().memory_limit


def set_cache_limit(limit: int) -> int:
    """Set the cache limit (0 disables the cache; reclaimed on the next allocation); returns
    the previous one."""
    return _allocator().set_cache_limit(_check_limit(limit, "set_cache_limit"))


def set_wired_limit(limit: int) -> int:
    """Set the wired limit; returns the previous one (no effect on this backend)."""
    return _allocator().set_wired_limit(_check_limit(limit, "set_wired_limit"))


def clear_cache() -> None:
    """Release every cached buffer to the system."""
    _allocator().clear_cache()


def device_info() -> dict:
    """Information about the default device (MLX's keys for the CPU)."""
    return {"architecture": platform.machine(), "device_name": _cpu_name()}


def _check_limit(limit: int, op: str) -> int:
    """MLX takes a size_t: non-integers and negative numbers are rejected with a TypeError."""
    if not isinstance(limit, int) or limit < 0:
        raise TypeError(
            f"{op}(): incompatible function arguments. The following argument types are "
            f"supported:\n    1. {op}(limit: int) -> int\n\nInvoked with types: {type(limit).__name__}")
    return int(limit)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
