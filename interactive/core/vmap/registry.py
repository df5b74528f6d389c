"""Registering batching (vmap) rules onto the primitive definitions (``tapescope.kernels``).

A batching rule is ``vmap(inputs, vaxes, primals, outputs, **params) -> (outputs, out_axes)``,
MLX's ``Primitive::vmap`` (mlx/primitives.cpp): ``inputs`` are the node's inputs with the
mapped axis in them (``vaxes[i]``; ``-1`` for an input that is not mapped, as MLX marks it:
every input of a node can be -1 when a custom vmap rule said None for what it returns),
``primals`` / ``outputs`` the node's own (unbatched) inputs and outputs, ``params`` its
parameters. It records the batched primitive(s) with core ops and says where the mapped axis
of each output is. A primitive without a rule keeps the reason in its definition's ``why``.
"""

from __future__ import annotations

from typing import Callable

from tapescope.kernels import primitives

from .. import ops as mx


def defvmap(name: str, rule: Callable) -> Callable:
    """Set ``rule`` as the batching rule of primitive ``name``."""
    primitives.set_facet(name, "vmap", rule)
    return rule


def without(name: str, vmap: str) -> None:
    """State why primitive ``name`` has no batching rule."""
    primitives.state_absent(name, "vmap", vmap)


def move_to(x, ax: int, to: int):
    """``x`` with its axis ``ax`` moved to ``to`` (no node when it is there already)."""
    return x if ax == to else mx.moveaxis(x, ax, to)


def shift(axis: int, ax: int) -> int:
    """An unbatched axis's place once mapped axis ``ax`` (-1: none) is in the array."""
    return axis + 1 if 0 <= ax <= axis else axis
