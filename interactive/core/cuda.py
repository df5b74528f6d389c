"""``mx.cuda``: whether the CUDA back-end is available, as in MLX (``mlx.core.cuda``).

MLX code asks ``mx.cuda.is_available()`` at import time to pick its device. The answer is
True where tapescope's CUDA runtime (``kernels/cuda``, through CuPy) evaluates arrays: a CUDA
GPU is present, ``settings.cuda`` is on and ``TAPESCOPE_DISABLE_GPU`` is not set
(``backends.cuda_runtime_available``); False elsewhere, as MLX built without CUDA.
"""

__all__ = ["is_available"]


def is_available() -> bool:
    """Check if the CUDA back-end is available."""
    from tapescope.kernels import backends

    return backends.cuda_runtime_available()
