"""``repr``/``str`` of arrays in MLX's format: ``array([1, 2], dtype=int32)``."""

from __future__ import annotations

import numpy as np

from . import dtypes as _dt


def _fmt_scalar(v, dtype: _dt.Dtype) -> str:
    if dtype == _dt.bool_:
        return "True" if v else "False"
    if _dt.is_integer(dtype):
        return str(int(v))
    if dtype == _dt.complex64:
        re, im = float(v.real), float(v.imag)
        sign = "+" if im >= 0 or np.isnan(im) else "-"
        return f"{_fmt_float(re)}{sign}{_fmt_float(abs(im))}j"
    return _fmt_float(float(v))


def _fmt_float(x: float) -> str:
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:g}"


def _fmt_nested(data: np.ndarray, dtype: _dt.Dtype, indent: int) -> str:
    if data.ndim == 0:
        return _fmt_scalar(data[()], dtype)
    if data.ndim == 1:
        return "[" + ", ".join(_fmt_scalar(v, dtype) for v in data) + "]"
    sep = ",\n" + "\n" * (data.ndim - 2) + " " * (indent + 1)
    return "[" + sep.join(_fmt_nested(sub, dtype, indent + 1) for sub in data) + "]"


def format_array(a, repr_: bool) -> str:
    """MLX's printed form of an array (evaluates it)."""
    data = a._numpy()
    if a.dtype == _dt.bfloat16:
        data = data.astype(np.float32)
    if not repr_:
        return _fmt_nested(data, a.dtype, 0)
    body = _fmt_nested(data, a.dtype, len("array("))
    return f"array({body}, dtype={a.dtype.name})"
