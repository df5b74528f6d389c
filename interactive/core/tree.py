"""Pytrees of arrays: nested lists, tuples and dicts whose leaves may be arrays (MLX's trees,
python/src/trees.cpp).

Subclasses count as their base: a ``NamedTuple`` or other tuple subclass is rebuilt as its
own type (``type(*items)`` where it has ``_fields``, else ``type(items)``), a dict subclass
(``mlx.nn.Module``) is walked as a dict and rebuilt as a plain dict, as MLX's ``tree_map``
does; ``tree_update`` updates lists and dicts in place, as MLX's ``tree_visit_update``.
``mx.random.state`` (one object for every thread) stands for the calling thread's key: the
flattening walks read it and ``tree_update`` writes it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from .array import array
from .random_state import set_thread_key, state as _RANDOM_STATE, thread_key


def tree_arrays_py(tree: Any, out: list | None = None, strict: bool = False) -> list:
    """The arrays of a pytree, in order (lists, tuples, dict values); other leaves are
    skipped, or with ``strict`` an error (MLX's ``tree_flatten(tree, strict=True)``).
    (``tree_arrays`` is core/_tree.c's where built: the same walk in C.)"""
    if out is None:
        out = []
    if tree.__class__ is array or isinstance(tree, array):
        out.append(tree)
    else:
        _arrays_of(tree, out, strict)
    return out


def _arrays_of(tree: Any, out: list, strict: bool) -> None:
    """``tree_arrays`` of a tree that is not an array: its children's arrays appended (an
    array child without a call: an optimizer's state is mostly arrays in dicts)."""
    if tree is _RANDOM_STATE:
        out.append(thread_key())
        return
    if isinstance(tree, (list, tuple)):
        items = tree
    elif isinstance(tree, dict):
        items = tree.values()
    elif strict:
        raise ValueError("[tree_flatten] The argument should contain only arrays")
    else:
        return
    for t in items:
        if t.__class__ is array:
            out.append(t)
        elif isinstance(t, array):
            out.append(t)
        else:
            _arrays_of(t, out, strict)


def _tuple_like(tree: tuple, items: list) -> tuple:
    """``items`` as a tuple of ``tree``'s type (a NamedTuple takes them as fields)."""
    cls = type(tree)
    if cls is tuple:
        return tuple(items)
    return cls(*items) if hasattr(cls, "_fields") else cls(items)


def tree_map(tree: Any, leaf: Callable[[Any], Any]) -> Any:
    """A new tree of ``tree``'s structure with ``leaf(x)`` at each leaf (MLX's ``tree_map``)."""
    if isinstance(tree, list):
        return [tree_map(x, leaf) for x in tree]
    if isinstance(tree, tuple):
        return _tuple_like(tree, [tree_map(x, leaf) for x in tree])
    if isinstance(tree, dict):
        return {k: tree_map(v, leaf) for k, v in tree.items()}
    return leaf(tree)


def tree_unflatten(tree: Any, it: Iterator) -> Any:
    """``tree`` with its arrays replaced, in order, by the next items of ``it``."""
    return tree_map(tree, lambda x: next(it) if isinstance(x, array) else x)


def tree_update(tree: Any, visit: Callable[[array], Any]) -> Any:
    """``tree`` with each array ``a`` replaced by ``visit(a)``, lists and dicts in place
    (tuples rebuilt); MLX's ``tree_visit_update``. Returns the updated tree."""
    if tree.__class__ is array or isinstance(tree, array):
        return visit(tree)
    if tree is _RANDOM_STATE:
        set_thread_key(visit(thread_key()))
        return tree
    if isinstance(tree, list):
        for i, x in enumerate(tree):
            tree[i] = visit(x) if x.__class__ is array else tree_update(x, visit)
        return tree
    if isinstance(tree, tuple):
        return _tuple_like(tree, [tree_update(x, visit) for x in tree])
    if isinstance(tree, dict):
        for k, v in tree.items():
            tree[k] = visit(v) if v.__class__ is array else tree_update(v, visit)
        return tree
    return tree


def tree_fill_py(tree: Any, values: list) -> Any:
    """``tree`` with its arrays replaced, in order, by ``values`` (a list), lists and dicts
    in place: ``tree_update`` with the next value at each array (``tree_fill`` is
    core/_tree.c's where built)."""
    it = iter(values)
    return tree_update(tree, lambda a: next(it))


def _c_walks():
    """core/_tree.c's ``tree_arrays`` and ``tree_fill`` (the same walks in C) where that
    extension is built and ``settings.c_call`` is on, else the Python walks above."""
    from tapescope.kernels.settings import settings

    if not settings.c_call:
        return tree_arrays_py, tree_fill_py
    try:
        from . import _tree
    except ImportError:
        return tree_arrays_py, tree_fill_py
    _tree.configure({"array": array, "random_state": _RANDOM_STATE, "thread_key": thread_key,
                     "set_thread_key": set_thread_key, "tuple_like": _tuple_like})
    return _tree.tree_arrays, _tree.tree_fill


tree_arrays, tree_fill = _c_walks()
