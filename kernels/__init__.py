"""tapescope.kernels: the runtimes below the array API.

Buffers and allocators, streams, the timeline, array-module-generic primitive rules and
(later) code generation. Knows nothing of arrays or notebooks: imports only the standard
library, numpy, ml_dtypes and, lazily, CuPy / PyObjC.
"""
