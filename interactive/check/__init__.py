"""``tapescope.check``: tapescope's results against JAX, output by output and node by node
(the report's records, ``CheckReport`` and ``Comparison``, are ``tapescope.viz.check``'s)."""

from .check import check
from .compare import default_tolerance

__all__ = ["check", "CheckReport", "Comparison", "default_tolerance"]


def __getattr__(name: str):
    """``CheckReport`` / ``Comparison`` from ``viz/check.py``, imported on first use
    (importing tapescope imports no part of viz)."""
    if name in ("CheckReport", "Comparison"):
        from tapescope.viz import check as records

        return getattr(records, name)
    raise AttributeError(f"module 'tapescope.check' has no attribute {name!r}")
