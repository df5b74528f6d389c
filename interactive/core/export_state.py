"""A primitive as MLX's ``export_function`` callback shows it: the name MLX serializes it
under and its ``state()`` (mlx/export.cpp's PrimitiveFactory, mlx/primitives.h).

tapescope's primitives carry MLX's printed names (``Sum``, ``Log2``, ``CumSum``,
``BitwiseAnd``, ...) and parameters of their own (a Squeeze's output shape beside its axes);
MLX's callback gives the class each serializes as (``Reduce``, ``Log``, ``Scan``,
``BitwiseBinary``, ...) with its enum codes and its state's vectors as lists: the
definition's ``export`` facet says how. Other primitives keep their name and their
parameters' values in order; numpy dtypes become Dtypes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as _dt
from .primitive import Primitive


def _value(v: Any) -> Any:
    if isinstance(v, np.dtype):
        return _dt.from_numpy(v)
    if isinstance(v, tuple):
        return tuple(_value(x) for x in v)
    if isinstance(v, list):
        return [_value(x) for x in v]
    return v


def mlx_state(prim: Primitive) -> tuple[str, list]:
    """(MLX's serialized name, MLX's state as a list) of ``prim``: its definition's
    ``export`` where MLX serializes it differently (kernels/rules/), else its name and values."""
    export = prim.defn.export
    if export is None:
        return prim.name, [_value(v) for v in prim.kw.values()]
    name, state = export(prim.name, prim.kw)
    return name, [_value(v) for v in state]
