"""``repr``/``str`` of arrays in MLX's format, and MLX's print options.

MLX prints with C++ ``std::ostream``: floats in the default format (``%g``, six significant
digits, ``-0``, ``inf``, ``nan``, ``-nan``) or, after ``set_printoptions(precision=p)``,
in fixed notation with ``p`` decimals; ``True``/``False``; complex as ``re+imj``. Every axis
longer than 6 is summarised to its first and last three entries around ``...``; nested
rows are indented by 7 + depth spaces with no blank lines. ``str`` equals ``repr``.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from . import dtypes as _dt

__all__ = ["PrintOptions", "get_printoptions", "printoptions", "set_printoptions"]

_NUM_PRINT = 3  # MLX's print_subarray: edge items on each side of "..."


class PrintOptions:
    """The format options used for printing arrays (``precision=-1``: the default format)."""

    __slots__ = ("precision",)

    def __init__(self, precision: int = -1):
        self.precision = precision


_lock = threading.Lock()
_options = PrintOptions()


def _check_precision(fn: str, sig: str, precision: Any) -> int:
    if not isinstance(precision, int) or isinstance(precision, bool):
        from .device import incompatible

        raise incompatible(fn, sig, precision=precision)
    return precision


def set_printoptions(precision: int = -1) -> None:
    """Set global printing precision for array formatting (-1: the default format)."""
    p = _check_precision("set_printoptions", "set_printoptions(precision: int = -1) -> None", precision)
    with _lock:
        _options.precision = p


def get_printoptions() -> PrintOptions:
    """Get (a copy of) the global print options."""
    return PrintOptions(_options.precision)


class _PrintOptionsContext:
    """Sets print options inside a ``with`` block and restores the previous ones on exit."""

    def __init__(self, precision: int = -1):
        self._precision = precision
        self._saved: list[int] = []

    def __enter__(self) -> "_PrintOptionsContext":
        self._saved.append(_options.precision)
        set_printoptions(self._precision)
        return self

    def __exit__(self, *exc: Any) -> bool:
        set_printoptions(self._saved.pop())
        return False


def printoptions(precision: int = -1) -> _PrintOptionsContext:
    """Context manager for setting print options temporarily."""
    p = _check_precision("printoptions",
                         "printoptions(precision: int = -1) -> mlx.core._PrintOptionsContext", precision)
    return _PrintOptionsContext(p)


# -- scalars ----------------------------------------------------------------------------
def format_float(x: float, precision: int = -1) -> str:
    """One float as ``std::ostream`` prints it (``%g``, or fixed with ``precision`` decimals)."""
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if precision == -1:
        return f"{x:g}"
    return f"{x:.{precision if precision >= 0 else 6}f}"


def format_scalar(v: Any, dtype: _dt.Dtype, precision: int = -1) -> str:
    """One element of an array of ``dtype`` as MLX prints it."""
    if dtype == _dt.bool_:
        return "True" if v else "False"
    if _dt.is_integer(dtype):
        return str(int(v))
    if dtype == _dt.complex64:
        re, im = float(v.real), float(v.imag)
        if im >= 0 or math.isnan(im):
            return f"{format_float(re, precision)}+{format_float(im, precision)}j"
        return f"{format_float(re, precision)}-{format_float(-im, precision)}j"
    return format_float(float(v), precision)


# -- arrays -----------------------------------------------------------------------------
def _subarray(data: np.ndarray, dtype: _dt.Dtype, dim: int, precision: int, out: list) -> None:
    """Append the text of ``data`` (one sub-array at depth ``dim``) to ``out``."""
    n = data.shape[0]
    is_last = data.ndim == 1
    prefix = "" if is_last else " " * (7 + dim)
    postfix = ", " if is_last else ",\n"
    out.append("[")
    i = 0
    while i < n:
        if i:
            out.append(prefix)
        if i == _NUM_PRINT and n > 2 * _NUM_PRINT:
            out.append("...")
            i = n - _NUM_PRINT - 1
        elif is_last:
            out.append(format_scalar(data[i], dtype, precision))
        else:
            _subarray(data[i], dtype, dim + 1, precision, out)
        if i != n - 1:
            out.append(postfix)
        i += 1
    out.append("]")


def format_data(data: np.ndarray, dtype: _dt.Dtype, precision: int | None = None) -> str:
    """MLX's ``array(..., dtype=...)`` text for numpy ``data`` holding values of ``dtype``."""
    p = _options.precision if precision is None else precision
    if dtype == _dt.bfloat16:
        data = data.astype(np.float32)
    if data.ndim == 0:
        body = format_scalar(data[()], dtype, p)
    else:
        parts: list[str] = []
        _subarray(data, dtype, 0, p, parts)
        body = "".join(parts)
    return f"array({body}, dtype={dtype.name})"


def format_array(a: Any, repr_: bool = True) -> str:
    """MLX's printed form of an array (evaluates it); ``str`` and ``repr`` are the same."""
    return format_data(a._numpy(), a.dtype)
