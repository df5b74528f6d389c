"""``tapescope.check``: tapescope's results against JAX, output by output and node by node."""

from .check import check
from .report import CheckReport, Comparison, default_tolerance

__all__ = ["check", "CheckReport", "Comparison", "default_tolerance"]
