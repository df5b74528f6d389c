"""The CUDA device and its streams: what ``mlx/backend/cuda/device.cpp`` keeps per GPU.

MLX has one ``cu::Device`` per GPU index, and per ``mx`` stream one ``DeviceStream`` over a
``cudaStreamNonBlocking`` stream. Here: ``cuda_stream(index)`` is the CuPy
``Stream(non_blocking=True)`` of the ``mx`` stream with that index (made on first use);
``is_gpu_stream(index)`` says whether an index has one.
"""

from __future__ import annotations

import functools
import threading

import cupy

_lock = threading.Lock()
_streams: dict[int, "cupy.cuda.Stream"] = {}


@functools.lru_cache(maxsize=None)
def properties(device: int = 0) -> dict:
    """``cudaGetDeviceProperties`` of a GPU, as a dict."""
    return cupy.cuda.runtime.getDeviceProperties(device)


def info(device: int = 0) -> dict:
    """``mx.device_info(mx.gpu)``: MLX's keys for a CUDA device."""
    p = properties(device)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    free, total = memory_info(device)
    return {
        "device_name": name,
        "architecture": f"sm_{p['major']}{p['minor']}",
        "compute_capability_major": int(p["major"]),
        "compute_capability_minor": int(p["minor"]),
        "memory_size": int(total),
        "free_memory": int(free),
        "total_memory": int(total),
        "uuid": _uuid(p),
    }


def _uuid(p: dict) -> str:
    raw = p.get("uuid")
    if isinstance(raw, (bytes, bytearray)) and len(raw) == 16:
        h = raw.hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return ""


def memory_info(device: int = 0) -> tuple:
    """``cudaMemGetInfo``: (free, total) bytes of the GPU."""
    with cupy.cuda.Device(device):
        return cupy.cuda.runtime.memGetInfo()


def cuda_stream(index: int) -> "cupy.cuda.Stream":
    """The non-blocking CUDA stream of the ``mx`` stream ``index``."""
    s = _streams.get(index)
    if s is None:
        with _lock:
            s = _streams.get(index)
            if s is None:
                s = _streams[index] = cupy.cuda.Stream(non_blocking=True)
    return s


def is_gpu_stream(index) -> bool:
    return index in _streams


def gpu_streams() -> list:
    """Every CUDA stream made so far."""
    return list(_streams.values())
