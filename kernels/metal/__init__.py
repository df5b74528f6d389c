"""The Metal runtime (``mx.gpu`` on a Mac with Apple silicon) and its verification on Linux.

- ``kernels.py``: tapescope's MSL kernels (fused tapes, eager elementwise ops) and how each
  is launched (variant, buffers by index, grid), as plain numpy;
- ``custom.py``: ``mx.fast.metal_kernel``'s source generation (MLX's signature rules);
- ``shim.py`` with ``shim/metal_shim.h``: a test tool that compiles MSL with the system C++
  compiler and runs it on the CPU over its launch grid (verification, not a runtime);
- ``runtime.py``: the PyObjC runtime (device, queues, command buffers, shared buffers,
  pipelines, shared events), imported only on macOS with ``pyobjc-framework-Metal``.
"""
