"""``mx.eval`` and ``mx.async_eval``: realise arrays (and pytrees of arrays)."""

from __future__ import annotations

from typing import Any

from .array import ArrayDesc, array
from .evaluate import evaluate


def tree_flatten_arrays(tree: Any, out: list[ArrayDesc]) -> list[ArrayDesc]:
    """Collect the descs of every array in a pytree of lists, tuples and dicts."""
    if isinstance(tree, array):
        out.append(tree._d)
    elif isinstance(tree, (list, tuple)):
        for t in tree:
            tree_flatten_arrays(t, out)
    elif isinstance(tree, dict):
        for t in tree.values():
            tree_flatten_arrays(t, out)
    return out


def eval(*args: Any) -> None:
    """Evaluate the arrays (or pytrees of arrays) given, and everything they depend on."""
    evaluate(tree_flatten_arrays(args, []))


def async_eval(*args: Any) -> None:
    """Start evaluating the given arrays and return (the CPU runtime completes them inline)."""
    evaluate(tree_flatten_arrays(args, []))
