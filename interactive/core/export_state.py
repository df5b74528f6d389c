"""A primitive as MLX's ``export_function`` callback shows it: the name MLX serializes it
under and its ``state()`` (mlx/export.cpp's PrimitiveFactory, mlx/primitives.h).

tapescope's primitives carry MLX's printed names (``Sum``, ``Log2``, ``CumSum``,
``BitwiseAnd``, ...) and parameters of their own (a Squeeze's output shape beside its axes);
MLX's callback gives the class each serializes as (``Reduce``, ``Log``, ``Scan``,
``BitwiseBinary``, ...) with its enum codes and its state's vectors as lists. Other
primitives keep their name and their parameters' values in order, numpy dtypes as Dtypes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as _dt
from .primitive import Primitive

# mlx/primitives.h's enums, in their declaration order
_REDUCE = {"And": 0, "Or": 1, "Sum": 2, "Prod": 3, "Min": 4, "Max": 5}  # Reduce::ReduceType
_SCAN = {"max": 0, "min": 1, "sum": 2, "prod": 3, "logaddexp": 4}  # Scan::ReduceType
_ARG = {"argmin": 0, "argmax": 1}  # ArgReduce::ReduceType
_LOG = {"Log2": 0, "Log10": 1, "Log": 2}  # Log::Base
_BITWISE = {"BitwiseAnd": 0, "BitwiseOr": 1, "BitwiseXor": 2, "LeftShift": 3, "RightShift": 4}
_SHAPE_KEPT = ("Squeeze", "ExpandDims", "Flatten", "Unflatten")  # tapescope's output shape


def _value(v: Any) -> Any:
    if isinstance(v, np.dtype):
        return _dt.from_numpy(v)
    if isinstance(v, tuple):
        return tuple(_value(x) for x in v)
    return v


def mlx_state(prim: Primitive) -> tuple[str, list]:
    """(MLX's serialized name, MLX's state as a list) of ``prim``."""
    name, kw = prim.name, prim.kw
    if name in _REDUCE:
        return "Reduce", [_REDUCE[name], list(kw["axes"])]
    if name in _LOG:
        return "Log", [_LOG[name]]
    if name in _BITWISE:
        return "BitwiseBinary", [_BITWISE[name]]
    if name in ("Equal", "NaNEqual"):
        return "Equal", [name == "NaNEqual"]
    if name in ("Sqrt", "Rsqrt"):
        return "Sqrt", [name == "Rsqrt"]
    if name.startswith("Cum") and "reduce_type" in kw:
        return "Scan", [_SCAN[kw["reduce_type"]], kw["axis"], kw["reverse"], kw["inclusive"]]
    if name == "ArgReduce":
        return name, [_ARG[kw["reduce_type"]], kw["axis"]]
    if name in ("Squeeze", "ExpandDims", "Transpose"):  # std::vector<int> axes
        return name, [list(kw["axes"])]
    args = [_value(v) for k, v in kw.items() if not (k == "shape" and name in _SHAPE_KEPT)]
    if name == "Convolution":  # its five std::vector<int>, then groups and flip
        args = [list(a) for a in args[:5]] + args[5:]
    elif name in ("Gather", "Pad") and args:  # axes (std::vector<int>), then Shapes
        args = [list(args[0])] + args[1:]
    return name, args
