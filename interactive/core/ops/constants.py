"""MLX's module-level constants: ``pi``, ``e``, ``inf``, ``nan``, ``newaxis``, ``euler_gamma``.

Plain Python values, exactly as ``mlx.core`` exposes them (floats, and ``None`` for newaxis).
"""

from __future__ import annotations

import math

__all__ = ["pi", "e", "inf", "nan", "newaxis", "euler_gamma"]

pi: float = math.pi
e: float = math.e
inf: float = math.inf
nan: float = math.nan
newaxis = None
euler_gamma: float = 0.5772156649015329
