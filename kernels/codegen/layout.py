"""Layout helpers for fused kernels: contiguity, broadcast strides, dim collapsing, index width.

These follow MLX's ``backend/common/compiled.cpp`` and ``utils.cpp``. Arrays are numpy (or
cupy) arrays, or a ``Layout`` (an array's metadata before it has data); strides here are in
elements, not bytes.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1


class Layout:
    """An array's shape, dtype and strides without its data: what a launch plan reads.

    MLX plans a kernel from an array's metadata (shape, strides, flags); a picture of a
    program plans before any input exists. It has the attributes the helpers here read
    from an ndarray (``shape``, ``ndim``, ``size``, ``dtype``, byte ``strides``, ``flags``)."""

    __slots__ = ("shape", "ndim", "size", "dtype", "strides", "flags")

    def __init__(self, shape: Sequence[int], dtype, estrides: Optional[Sequence[int]] = None):
        self.shape = tuple(int(s) for s in shape)
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.dtype = np.dtype(dtype)
        row = row_strides(self.shape)
        st = tuple(int(s) for s in estrides) if estrides is not None else row
        self.strides = tuple(s * self.dtype.itemsize for s in st)
        self.flags = _Flags(_contiguous_as(self.shape, st, row),
                            _contiguous_as(self.shape, st, row_strides(self.shape[::-1])[::-1]))

    @classmethod
    def of(cls, a) -> "Layout":
        """The layout of an array (numpy, cupy, or a ``Layout``)."""
        return a if isinstance(a, cls) else cls(a.shape, a.dtype, elem_strides(a))

    def __repr__(self) -> str:
        return f"Layout({self.shape}, {self.dtype}, {tuple(s // self.dtype.itemsize for s in self.strides)})"


class _Flags:
    __slots__ = ("c_contiguous", "f_contiguous")

    def __init__(self, c: bool, f: bool):
        self.c_contiguous, self.f_contiguous = c, f


def _contiguous_as(shape: tuple, st: tuple, want: tuple) -> bool:
    """Whether strides ``st`` are ``want`` on every dimension that has more than one element."""
    if any(s == 0 for s in shape):
        return True
    return all(a == b for n, a, b in zip(shape, st, want) if n != 1)


def elem_strides(a) -> tuple:
    """An array's strides in elements."""
    item = a.dtype.itemsize
    return tuple(s // item for s in a.strides)


def row_strides(shape: Sequence[int]) -> tuple:
    """Row-major (C order) strides in elements for ``shape``."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def is_row_contiguous(a) -> bool:
    return bool(a.flags.c_contiguous)


def is_col_contiguous(a) -> bool:
    return bool(a.flags.f_contiguous)


def check_contiguity(arrays: Sequence, shape: Sequence[int]) -> bool:
    """MLX's ``compiled_check_contiguity``: can the contiguous kernel run (scalars ignored)?"""
    shape = tuple(shape)
    nonscalar = [a for a in arrays if a.ndim > 0]
    if not nonscalar:
        return len(shape) == 0
    if len(nonscalar) == 1:
        a = nonscalar[0]
        return (is_row_contiguous(a) or is_col_contiguous(a)) and tuple(a.shape) == shape
    if all(is_row_contiguous(a) and tuple(a.shape) == shape for a in nonscalar):
        return True
    return all(is_col_contiguous(a) and tuple(a.shape) == shape for a in nonscalar)


def broadcast_strides(shape: Sequence[int], out_strides: Sequence[int],
                      in_shape: Sequence[int], in_strides: Sequence[int]) -> list:
    """An input's strides against the output shape, by MLX's broadcast-stride rule.

    Broadcast dims get stride 0, except where the output dim is 1 too: there the output's
    stride is borrowed so the dim stays collapsible.
    """
    nd, d = len(shape), len(shape) - len(in_shape)
    xs = [out_strides[j] if shape[j] == 1 else 0 for j in range(d)]
    for i in range(len(in_shape)):
        j = i + d
        if in_shape[i] == 1:
            xs.append(out_strides[j] if shape[j] == 1 else 0)
        else:
            xs.append(in_strides[i])
    assert len(xs) == nd
    return xs


def collapse_contiguous_dims(shape: Sequence[int], strides: Sequence[Sequence[int]],
                             size_cap: int = INT32_MAX) -> tuple:
    """Merge adjacent dims that are contiguous in every stride vector (MLX's rule).

    Dim i joins dim i-1 when ``st[i] * shape[i] == st[i-1]`` for all stride vectors and the
    merged size stays <= ``size_cap``; size-1 dims drop out; all-size-1 gives ([1], [0]).
    Returns ``(shape, [strides per vector])``.
    """
    shape = list(shape)
    to_collapse: list[int] = []
    if shape:
        if shape[0] != 1:
            to_collapse.append(0)
        size = shape[0]
        for i in range(1, len(shape)):
            contiguous = True
            size *= shape[i]
            for st in strides:
                if st[i] * shape[i] != st[i - 1] or size > size_cap:
                    contiguous = False
                    size = shape[i]
                    break
            if not contiguous:
                to_collapse.append(-1)
            if shape[i] != 1:
                to_collapse.append(i)
        to_collapse.append(-1)
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    i = 0
    while True:
        while i < len(to_collapse) and to_collapse[i] == -1:
            i += 1
        if i == len(to_collapse):
            break
        cur = shape[to_collapse[i]]
        k = i + 1
        while to_collapse[k] != -1:
            cur *= shape[to_collapse[k]]
            k += 1
        out_shape.append(cur)
        for j, st in enumerate(strides):
            out_strides[j].append(st[to_collapse[k - 1]])
        i = k + 1
    if shape and not out_shape:
        out_shape = [1]
        out_strides = [[0] for _ in strides]
    return out_shape, out_strides


def data_size(a) -> int:
    """Elements in an array's underlying data (its size for contiguous arrays)."""
    if a.ndim == 0:
        return 1
    if is_row_contiguous(a) or is_col_contiguous(a):
        return int(a.size)
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(a.shape, elem_strides(a)) if n > 0)
    return int(span)


def use_large_index(inputs: Sequence, out_sizes: Sequence[int], contiguous: bool) -> bool:
    """MLX's ``compiled_use_large_index``: 64-bit indexing once sizes pass UINT32_MAX."""
    if contiguous:
        return max((data_size(a) for a in inputs), default=0) > UINT32_MAX
    return max(out_sizes, default=0) > UINT32_MAX


def plan(tape, inputs: Sequence[np.ndarray], shape: Sequence[int],
         row_major: bool = False) -> tuple:
    """``(contiguous, collapsed shape, strides per non-scalar input, large)`` for a call;
    ``row_major``: its output is row-major whatever the inputs' order (column-major inputs
    then take the strided path, which reads them by their strides)."""
    shape = tuple(int(s) for s in shape)
    nc = [(x, a) for x, a in zip(tape.inputs, inputs) if not x.is_constant]
    arrays = [a for _, a in nc]
    contiguous = check_contiguity(arrays, shape)
    if contiguous and row_major and not all(a.ndim == 0 or is_row_contiguous(a) for a in arrays):
        contiguous = False
    size = int(np.prod(shape, dtype=np.int64))
    if contiguous:
        cshape, strides = list(shape), []
    else:
        out_st = row_strides(shape)
        vecs = [list(out_st)] + [broadcast_strides(shape, out_st, a.shape, elem_strides(a))
                                 for x, a in nc if not x.scalar]
        cshape, cst = collapse_contiguous_dims(shape, vecs)
        strides = cst[1:]
    large = use_large_index(arrays, [size], contiguous)
    return contiguous, cshape, strides, large


def output_order(tape, inputs: Sequence[np.ndarray], shape: tuple, contiguous: bool) -> str:
    """The memory order new outputs take: the first full-size input's (F for column-major
    inputs on the contiguous path), else C."""
    size = int(np.prod(shape, dtype=np.int64))
    rep = next((a for x, a in zip(tape.inputs, inputs) if not x.is_constant and a.size == size), None)
    if contiguous and rep is not None and rep.ndim > 1 and is_col_contiguous(rep) and not is_row_contiguous(rep):
        return "F"
    return "C"


def variant(tape, layouts: Sequence, shape: Sequence[int]) -> str:
    """The name of the kernel variant a call of ``tape`` with inputs of these layouts
    (arrays or ``Layout``) runs, MLX's choice on every device (mlx/backend/common/compiled.cpp
    ``compiled_check_contiguity`` / ``compiled_use_large_index``): for pictures and reports."""
    contiguous, cshape, _, large = plan(tape, layouts, shape)
    name = "contiguous" if contiguous else f"strided_{len(cshape)}"
    return name + "_large" if large else name
