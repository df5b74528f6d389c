"""The Metal runtime (``mx.gpu`` on a Mac with Apple silicon) and its verification on Linux.

- ``kernels.py``: tapescope's MSL kernels (fused tapes, eager elementwise ops) and how each
  is launched (variant, buffers by index, grid), as plain numpy;
- ``custom.py``: ``mx.fast.metal_kernel``'s source generation (MLX's signature rules) and run;
- ``shim.py`` with ``shim/metal_shim.h``: a test tool that compiles MSL with the system C++
  compiler and runs it on the CPU over its launch grid (verification, not a runtime);
- ``runtime.py`` and ``backend.py``: the PyObjC runtime (device, a queue per stream, command
  buffers, shared buffers, pipelines, shared events) and ``MetalBackend``; imported only on
  macOS with ``pyobjc-framework-Metal`` and ``TAPESCOPE_METAL=1``; not yet run on Apple
  hardware.
"""
