"""Pytrees of arrays: nested lists, tuples and dicts whose leaves may be arrays (MLX's trees)."""

from __future__ import annotations

from typing import Any, Iterator

from .array import array


def tree_arrays(tree: Any, out: list | None = None) -> list:
    """The arrays of a pytree, in order (lists, tuples, dict values; other leaves skipped)."""
    if out is None:
        out = []
    if isinstance(tree, array):
        out.append(tree)
    elif isinstance(tree, (list, tuple)):
        for t in tree:
            tree_arrays(t, out)
    elif isinstance(tree, dict):
        for t in tree.values():
            tree_arrays(t, out)
    return out


def tree_unflatten(tree: Any, it: Iterator) -> Any:
    """``tree`` with its arrays replaced, in order, by the next items of ``it``."""
    if isinstance(tree, array):
        return next(it)
    if isinstance(tree, list):
        return [tree_unflatten(x, it) for x in tree]
    if isinstance(tree, tuple):
        return tuple(tree_unflatten(x, it) for x in tree)
    if isinstance(tree, dict):
        return {k: tree_unflatten(v, it) for k, v in tree.items()}
    return tree
