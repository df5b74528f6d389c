"""Every op of ``tapescope.core``, grouped by family in the modules of this package."""

from .convert import astype, broadcast_arrays, broadcast_shapes, broadcast_to  # noqa: F401
from .elementwise import add, divide, exp, multiply, negative, subtract  # noqa: F401
