"""``mx.vmap``: MLX 0.32's Python API and errors (python/src/transforms.cpp ``py_vmap``, the
prefix-tree walk of python/src/trees.cpp) over the graph batching of ``engine``."""

from __future__ import annotations

import functools
from typing import Any, Callable

from ..array import array
from ..device import BadArgs, binding
from ..transform_tracers import placeholders
from ..tree import tree_arrays, tree_unflatten
from . import engine

__all__ = ["vmap"]


_PREFIX = "[tree_map] Additional input tree is not a valid prefix of the first tree."


def _validate(subtrees: list, kind: type, others: tuple) -> None:
    n = len(subtrees[0])
    for t in subtrees:
        if (isinstance(t, kind) and len(t) != n) or isinstance(t, others):
            raise ValueError(_PREFIX)


def tree_visit(trees: list, visitor: Callable) -> None:
    """MLX's ``tree_visit`` of several trees: the later ones are prefixes of the first (a
    leaf stands for every leaf below it)."""
    first = trees[0]
    if isinstance(first, list):
        _validate(trees, list, (tuple, dict))
        for i in range(len(first)):
            tree_visit([t[i] if isinstance(t, list) else t for t in trees], visitor)
    elif isinstance(first, tuple):
        _validate(trees, tuple, (list, dict))
        for i in range(len(first)):
            tree_visit([t[i] if isinstance(t, tuple) else t for t in trees], visitor)
    elif isinstance(first, dict):
        _validate(trees, dict, (list, tuple))
        for k in first:
            items = []
            for t in trees:
                if isinstance(t, dict):
                    if k not in t:
                        raise ValueError("[tree_visit] Tree is not a valid prefix tree of the "
                                         "first tree.")
                    items.append(t[k])
                else:
                    items.append(t)
            tree_visit(items, visitor)
    else:
        visitor(trees)


def _shape(shape: tuple) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


def _int(v: Any) -> int:
    """nanobind's cast of a Python int to a C int."""
    if not -2**31 <= v < 2**31:
        raise RuntimeError("std::bad_cast")
    return int(v)


def flat_axes(tree: Any, axes: Any, output: bool) -> list[int]:
    """MLX's ``axes_to_flat_tree``: one axis per array of ``tree`` (-1: not mapped), negative
    axes counted from the end (of the batched array, for outputs)."""
    flat: list[int] = []
    tuple_seen = [False]

    def axis_of(x: array, v: Any) -> int:
        ax = _int(v)
        n = x.ndim + int(output)
        if ax < 0:
            ax += n
        if ax < 0 or ax >= n:
            raise IndexError(f"[vmap] Invalid{' output ' if output else ' '}vectorization axis "
                             f"{ax} for array with shape {_shape(x.shape)}")
        return ax

    def visit(leaves: list) -> None:
        x, v = leaves
        if not isinstance(x, array):
            raise ValueError("[vmap] The arguments should contain only arrays")
        if v is None:
            flat.append(-1)
        elif isinstance(v, int):
            flat.append(axis_of(x, v))
        elif isinstance(v, tuple):
            tuple_seen[0] = True
            if len(v) == 1 and isinstance(v[0], int):
                flat.append(axis_of(x, v[0]))
            elif len(v) == 1 and v[0] is None:
                flat.append(-1)
            else:
                raise ValueError("[vmap] axis must be int or None.")
        else:
            raise ValueError("[vmap] axis must be int or None.")

    tree_visit([tree, axes], visit)
    if tuple_seen[0] and not isinstance(tree, array):
        raise ValueError("[vmap] axis must be int or None.")
    return flat


@binding("vmap(fun: Callable[P, R], in_axes: object = 0, out_axes: object = 0) -> "
         "Callable[P, R]")
def vmap(fun: Callable, in_axes: Any = 0, out_axes: Any = 0) -> Callable:
    """A vectorized version of ``fun``: mapped over axis ``in_axes`` of its arguments (a prefix
    tree of them; None: not mapped), with the mapped axis of its outputs at ``out_axes``."""
    if not callable(fun) or in_axes is None or out_axes is None:
        raise BadArgs

    def vfun(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError("[vmap] Keyword arguments are not supported.")
        inputs = tree_arrays(args, strict=True)
        axes_in = flat_axes(args[0] if len(args) == 1 else args, in_axes, False)
        engine.check_sizes(inputs, axes_in)
        tracers = engine.make_tracers(inputs, axes_in)
        descs = [t._d for t in tracers]
        with placeholders():
            out = fun(*tree_unflatten(args, iter(tracers)))
        outs = tree_arrays(out, strict=True)
        axes_out = flat_axes(out, out_axes, True)
        return tree_unflatten(out, iter(engine.replace(inputs, descs, outs, axes_in, axes_out)))

    return functools.wraps(fun, updated=())(vfun)
