"""Which runtimes this process can use, probed once and lazily (CuPy is imported only here)."""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=None)
def cuda_device_count() -> int:
    """The number of CUDA devices CuPy can reach (0 when CuPy or a GPU is missing)."""
    if os.environ.get("TAPESCOPE_DISABLE_GPU"):
        return 0
    try:
        import cupy  # noqa: F401

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def cuda_runtime_available() -> bool:
    """Whether tapescope's CUDA runtime evaluates arrays here (``mx.cuda.is_available``).

    Not yet: the CUDA runtime (kernels, allocator, streams through CuPy) is not built, so a
    GPU that CuPy reaches does not make any op run on it."""
    return False


def gpu_available() -> bool:
    """Whether some GPU runtime of tapescope evaluates arrays here. A GPU that CuPy reaches
    is not enough: until the CUDA runtime exists, ``mx.gpu`` stays unavailable and the CPU
    is the default device, rather than a "gpu" label over numpy on the host."""
    return cuda_runtime_available()


def gpu_count() -> int:
    """GPUs that tapescope's GPU runtime can use (0 without one)."""
    return cuda_device_count() if cuda_runtime_available() else 0
