"""The arguments of a fused reduction tape's kernel (extended fusion), on any runtime:
each input seen as ``rows x cols`` (its element strides collapsed over the kept and the
reduced axes, or a contiguous copy when they do not collapse), the integers the kernel
takes (``rows``, ``cols``, the full outputs' ``o_sr`` / ``o_sc``, per array input its
``_sr`` / ``_sc``), in the order of ``codegen/reduction.py``'s C and
``codegen/fused_reduce.py``'s GPU kernels."""

from __future__ import annotations

from typing import Any

import numpy as np

from .strides import one_stride


def view_strides(a: Any, target: tuple, mode: str, k: int, xp: Any = np) -> tuple:
    """(array, row stride, column stride) in elements of ``a`` broadcast to ``target``; ``a``
    is replaced by a contiguous copy when its strides do not collapse."""
    b = xp.broadcast_to(a, target)
    for _ in range(2):
        st = tuple(s // b.itemsize for s in b.strides)
        n = len(target)
        red = slice(0, k) if mode == "first" else slice(n - k, n)
        kept = slice(k, n) if mode == "first" else slice(0, n - k)
        sr, sc = one_stride(target[kept], st[kept]), one_stride(target[red], st[red])
        if sr is not None and sc is not None and all(s % b.itemsize == 0 for s in b.strides):
            return b, sr, sc
        b = xp.ascontiguousarray(b)
    raise AssertionError("a contiguous array always collapses")


def kernel_arguments(tape: Any, inputs: list, full: tuple, xp: Any = np) -> tuple:
    """(the non-constant inputs as the kernel reads them, the integers by name)."""
    red = tape.reduction
    rows, cols = red.split(full)
    ints = {"rows": rows, "cols": cols, "o_sr": 1 if red.mode == "first" else cols,
            "o_sc": rows if red.mode == "first" else 1}
    arrays = []
    for x, a in zip(tape.inputs, inputs):
        if x.is_constant:
            continue
        if x.scalar or a.ndim == 0:
            arrays.append(xp.ascontiguousarray(a).reshape(1))
            if not x.scalar:
                ints[f"{x.name}_sr"], ints[f"{x.name}_sc"] = 0, 0
            continue
        b, sr, sc = view_strides(a, red.shape_of(x.name, full), red.mode, red.naxes, xp)
        arrays.append(b)
        ints[f"{x.name}_sr"], ints[f"{x.name}_sc"] = sr, sc
    return arrays, ints
