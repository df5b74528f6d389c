"""tapescope.kernels: the runtimes below the array API.

The primitive definitions (``primitives.py``: one record per primitive, registered beside
its array-module-generic rule in ``rules/``), buffers and allocators, streams, the timeline
and code generation. Knows nothing of arrays or notebooks: imports only the standard
library, numpy, ml_dtypes and, lazily, CuPy / PyObjC.
"""
