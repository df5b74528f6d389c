"""``mx.metal``: Metal availability, and the deprecated aliases of the memory API.

The aliases (``mx.metal.get_active_memory`` ...) work, printing MLX's deprecation message to
stderr once per name.
"""

from __future__ import annotations

import functools
import sys

from . import memory as _memory
from .device import DeviceType

_warned: set[str] = set()


def is_available() -> bool:
    """Whether the Metal backend is available: tapescope's Metal runtime is registered
    (macOS, PyObjC's Metal, ``TAPESCOPE_METAL=1`` while it is opt-in)."""
    from tapescope.kernels.backends import metal_runtime_available

    return metal_runtime_available()


def _deprecated(name: str):
    target = getattr(_memory, name)

    @functools.wraps(target)
    def alias(*args, **kwargs):
        if name not in _warned:
            _warned.add(name)
            print(f"mx.metal.{name} is deprecated and will be removed in a future version. "
                  f"Use mx.{name} instead.", file=sys.stderr)
        return target(*args, **kwargs)

    return alias


for _name in ("get_active_memory", "get_peak_memory", "reset_peak_memory", "get_cache_memory",
              "set_memory_limit", "set_cache_limit", "set_wired_limit", "clear_cache"):
    globals()[_name] = _deprecated(_name)


def device_info() -> dict[str, str | int]:
    """The Metal device's information (deprecated: ``mx.device_info``); empty without Metal."""
    if "device_info" not in _warned:
        _warned.add("device_info")
        print("mx.metal.device_info is deprecated and will be removed in a future version. "
              "Use mx.device_info instead.", file=sys.stderr)
    return _memory.device_info(DeviceType.gpu) if is_available() else {}


def start_capture(path: str) -> None:
    """Start a Metal GPU capture into ``path`` (nothing to capture without Metal, as in MLX)."""


def stop_capture() -> None:
    """Stop a Metal GPU capture (nothing to stop without Metal, as in MLX)."""
