"""The CUDA runtime through CuPy (``mx.gpu`` on an NVIDIA GPU).

- ``device.py``: the GPU's facts (name, memory, compute capability) and one non-blocking
  CUDA stream per ``mx`` GPU stream;
- ``memory.py``: ``CudaAllocator``, device memory from plain ``cudaMalloc`` under MLX's CUDA
  policy, with stream-ordered reuse of freed buffers;
- ``events.py``: ``CudaEvent``, an ``mx`` event whose GPU-stream signals are CUDA events, so
  a GPU stream waits for another on the device, without blocking the host;
- ``backend.py``: ``CudaBackend``, the ``Backend`` the core evaluates GPU primitives with.

Nothing here is imported unless CuPy is installed and asked for (``kernels.backends``).
"""
