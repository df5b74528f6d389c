"""``export_to_dot`` in ``tapescope.core`` (the implementation lives in ``core/export.py``)."""

from ..export import export_to_dot

__all__ = ["export_to_dot"]
