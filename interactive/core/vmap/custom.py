"""Batching ``CustomTransforms`` (``mx.custom_function``): the user's ``vmap`` function, called
as MLX's Python binding calls it (python/src/transforms.cpp ``InnerVmapFunction``), or, without
one, the function's body batched again (mlx/transforms.cpp ``custom_function``: every output
mapped on axis 0)."""

from __future__ import annotations

from typing import Any, Callable

from ..array import array
from ..tree import tree_unflatten
from .engine import vmap_flat
from .registry import defvmap


def _custom(inputs, vaxes, primals, outputs, *, num_outputs, vmap, **_):
    n = len(inputs) - num_outputs
    outs, axes = vmap(list(inputs[:n]), list(vaxes[:n]))
    return list(outs), [int(a) for a in axes]


defvmap("CustomTransforms", _custom)


def default_vmap(fun_flat: Callable, num_outputs: int) -> Callable:
    """MLX's default: ``vmap(fun, in_axes, out_axes=0...)`` of the function on flat arrays."""

    def rule(inputs: list, axes: list):
        out_axes = [0] * num_outputs
        return vmap_flat(fun_flat, inputs, axes, out_axes), out_axes

    return rule


def python_vmap(user_fn: Callable, structure: Any) -> Callable:
    """The flat rule calling ``@f.vmap``'s function: ``(args, axes)`` (or the lone argument and
    its axis), axes None for unmapped arrays; it returns ``(outputs, out_axes)``."""

    def rule(inputs: list, axes: list):
        args, kwargs = tree_unflatten(structure, iter(inputs))
        if kwargs:
            raise ValueError("[custom vmap] Function should only accept positional arguments")
        it = iter(axes)

        def axis_tree(t: Any) -> Any:
            if isinstance(t, array):
                a = next(it)
                return a if a >= 0 else None
            if isinstance(t, (list, tuple)):
                return type(t)(axis_tree(x) for x in t)
            if isinstance(t, dict):
                return {k: axis_tree(v) for k, v in t.items()}
            return None

        new_axes = tuple(axis_tree(a) for a in args)
        if len(args) == 1:
            result = user_fn(args[0], new_axes[0])
        else:
            result = user_fn(args, new_axes)
        if not isinstance(result, tuple) or len(result) != 2:
            raise ValueError("[custom vmap] Vmap function should return a tuple with 2 items.")
        outs: list = []
        out_axes: list = []

        def visit(leaves: list) -> None:
            if isinstance(leaves[0], array):
                outs.append(leaves[0])
                out_axes.append(-1 if leaves[1] is None else int(leaves[1]))

        from .api import tree_visit

        tree_visit([result[0], result[1]], visit)
        return outs, out_axes

    return rule
