"""``mx.export_to_dot``: the lazy graph above some arrays in MLX's DOT format.

MLX walks the graph depth first from the outputs (inputs before the array, siblings
visited together) and writes, per array: an evaluated array as ``{ rank=source; "A"; }``;
an array with a primitive as a rectangle labelled with the primitive's printed name, an
edge from each input's name to it, then each sibling output as a node (``rank=sink`` when
nothing in the exported graph consumes it) and an edge from the primitive to it. Arrays are
named A, B, ... (MLX's NodeNamer: the next name is the letters of ``len(names) + 1``) unless
a keyword argument names them. Primitive ids here are graph-local numbers (MLX prints
memory addresses), so the same graph always exports the same text.
"""

from __future__ import annotations

import os
from typing import Any

from .array import ArrayDesc, array
from .primitive import COMPILED, PLACEHOLDER, Node
from .tree import tree_arrays
from .walk import topological

__all__ = ["export_to_dot"]



def _letters(n: int) -> str:
    """MLX's NodeNamer sequence: 1 -> A, 26 -> Z, 27 -> AA, ..."""
    out = []
    while n > 0:
        out.append(chr(ord("A") + (n - 1) % 26))
        n = (n - 1) // 26
    return "".join(reversed(out))


class _Namer:
    """Names per array (keyed by desc identity, or by node and index for a dead sibling)."""

    def __init__(self) -> None:
        self.names: dict = {}

    def set(self, key: Any, name: str) -> None:
        self.names[key] = name

    def get(self, key: Any) -> str:
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = _letters(len(self.names) + 1)
        return name


def _label(node: Node) -> str:
    """The primitive as MLX prints it (``Compiled`` appends its tape's primitives)."""
    prim = node.primitive
    if prim.kind == COMPILED:
        tape = prim.kw.get("tape")
        return "Compiled" + "".join(op.primitive for op in getattr(tape, "ops", ()))
    label = prim.defn.label  # MLX's "SliceUpdate Sum", ...
    return prim.name if label is None else label(prim.name, prim.kw)


def _is_leaf(d: ArrayDesc) -> bool:
    """An array without a primitive to show: evaluated, or a trace placeholder."""
    return d.node is None or d.node.primitive.kind == PLACEHOLDER


def _siblings(node: Node) -> list:
    """(key, desc or None) for each output of ``node``, in sibling order."""
    out = []
    for i, ref in enumerate(node.outputs):
        d = ref()
        out.append((id(d) if d is not None else ("dead", id(node), i), d))
    return out


def dot_text(outputs: list, names: dict) -> str:
    """The DOT text MLX writes for ``outputs`` (descs) with ``names`` ({id(desc): name})."""
    keep: list = []  # holds every visited desc so ids stay unique during the walk
    order: list = []  # leaf descs and nodes, in MLX's callback order
    leaf_ids: set = set()

    def leaf(d: ArrayDesc) -> None:
        if id(d) not in leaf_ids:
            leaf_ids.add(id(d))
            keep.append(d)
            order.append(d)

    def placeholder(d: ArrayDesc) -> bool:  # a trace placeholder is drawn as a leaf
        if _is_leaf(d):
            keep.append(d)
            order.append(d)
            return True
        keep.extend(s for _, s in _siblings(d.node) if s is not None)
        return False

    topological(outputs, placeholder, leaf, order.append)
    consumed = {id(x) for n in order if isinstance(n, Node) for x in n.inputs}
    namer = _Namer()
    for k, v in names.items():
        namer.set(k, v)
    lines = ["digraph {"]
    prim_ids: dict = {}
    for item in order:
        if not isinstance(item, Node):  # a leaf
            lines.append(f'{{ rank=source; "{namer.get(id(item))}"; }}')
            continue
        pid = prim_ids.setdefault(id(item), len(prim_ids) + 1)
        lines.append(f'{{ {pid} [label ="{_label(item)}", shape=rectangle]; }}')
        for x in item.inputs:
            lines.append(f'"{namer.get(id(x))}" -> {pid}')
        for key, s in _siblings(item):
            sink = "rank=sink; " if key not in consumed else ""
            name = namer.get(key)
            lines.append(f'{{ {sink}"{name}"; }}')
            lines.append(f'{pid} -> "{name}"')
    keep.clear()
    return "\n".join(lines) + "\n}"


def export_to_dot(file: object, *args: Any, **kwargs: Any) -> None:
    """Export the graph above the given arrays to DOT (a file path or an object with ``write``)."""
    outs: list = []
    tree_arrays(args, outs, strict=True)
    named: list = []
    tree_arrays(kwargs, named, strict=True)
    names: dict = {}
    for k, v in kwargs.items():
        if not isinstance(v, array):
            raise RuntimeError("std::bad_cast")
        names[id(v._d)] = str(k)
    if isinstance(file, str):
        writer = None
    elif hasattr(file, "write"):
        writer = file.write
    else:
        raise ValueError("[export_to_dot] Accepts file-like objects or strings to be used as filenames.")
    keep = [v._d for v in kwargs.values()]  # named descs stay alive (their ids are keys)
    # the named arrays are outputs too (MLX flattens (args, kwargs): python/src/export.cpp)
    text = dot_text([a._d for a in outs] + keep, names)
    del keep
    if writer is not None:
        writer(text)
        return
    try:  # as MLX's std::ofstream: a path that cannot be opened writes nothing, silently
        with open(os.fspath(file), "w") as f:
            f.write(text)
    except OSError:
        pass
