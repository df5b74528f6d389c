"""Element strides, as every runtime's kernel planners read a layout: an array's strides
in whole elements, and dimensions collapsed where one stride walks two neighbours (MLX's
``collapse_contiguous_dims``, mlx/backend/common/utils.cpp), down to one stride where a
kernel takes a single one (a batch of matrices, a fused reduction's rows or columns), or
each matrix's offset where it takes a table of them (the quantized products)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def elem_strides(a) -> Optional[tuple]:
    """An array's strides in elements (None: not whole elements)."""
    it = a.itemsize
    if any(s % it for s in a.strides):
        return None
    return tuple(s // it for s in a.strides)


def collapse(dims: Sequence[tuple]) -> list:
    """(size, stride) pairs, size-1 dims dropped, neighbours merged where one stride walks
    both (row-major order kept)."""
    out: list = []
    for n, s in dims:
        if n == 1:
            continue
        if out and out[-1][1] == s * n:
            out[-1] = (out[-1][0] * n, s)
        else:
            out.append((n, s))
    return out


def one_stride(shape: Sequence[int], strides: Sequence[int]) -> Optional[int]:
    """The one element stride that walks ``shape`` (row-major order) with ``strides``: 0
    where every dimension has size 1, None when no single stride does."""
    dims = collapse(zip(shape, strides))
    return 0 if not dims else dims[0][1] if len(dims) == 1 else None


def batch_offsets(a, unit: int) -> np.ndarray:
    """The offset (in ``unit`` bytes) of each matrix of ``a``'s batch (its leading axes),
    flattened in order: int64, on the host."""
    if a.ndim <= 2:  # one matrix (the common call)
        return np.zeros(1, np.int64)
    offs = np.zeros(a.shape[:-2], np.int64)
    for d, (n, st) in enumerate(zip(a.shape[:-2], a.strides[:-2])):
        shape = [1] * (a.ndim - 2)
        shape[d] = n
        offs = offs + (np.arange(n, dtype=np.int64) * (st // unit)).reshape(shape)
    return offs.reshape(-1)
