"""``mx.cuda``: whether the CUDA back-end is available, as in MLX (``mlx.core.cuda``).

MLX code asks ``mx.cuda.is_available()`` at import time to pick its device. tapescope has no
CUDA runtime yet (arrays are computed on the CPU even where CuPy sees a GPU), so the
answer is False everywhere until that runtime is registered in ``tapescope.kernels.backends``.
"""

__all__ = ["is_available"]


def is_available() -> bool:
    """Check if the CUDA back-end is available."""
    from tapescope.kernels import backends

    return backends.cuda_runtime_available()
