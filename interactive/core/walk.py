"""The one graph walker: the nodes some arrays need, each once, inputs before their consumers.

Depth first from the arrays in order, each node's inputs left to right (MLX's order: the
order ``export_to_dot`` numbers arrays in and ``eval`` runs nodes in). Scheduling, compile's
tracing, ``tapescope.check``, ``export_to_dot`` and ``graph_of`` all walk through here; what
differs between them is said by two callbacks:

- ``leaf(desc)``: called for an array without a node (evaluated data), at the point of the
  walk where it is reached, once per time it is reached (a callback that cares dedupes);
- ``cut(desc) -> bool``: called once per node, on the first array reached of it; True leaves
  that node out of the order and its inputs unvisited (a node another eval is running, a
  trace placeholder, ...), and the callback records it;
- ``visit(node)``: called as each node joins the order, in sequence with ``leaf`` calls (for
  a walk that interleaves leaves and nodes, as ``export_to_dot`` numbers them).

With ``kept=True`` an evaluated array that keeps its node (a tracer evaluated inside a
transformation) is walked through like a lazy one: transformations and their checks see it.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from .primitive import Node


def topological(descs: Iterable, cut: Optional[Callable] = None,
                leaf: Optional[Callable] = None, visit: Optional[Callable] = None,
                kept: bool = False) -> list[Node]:
    """The nodes ``descs`` (ArrayDescs) depend on, in topological order (see the module);
    ``kept``: also through the graphs evaluated tracers keep (``core/transform_tracers.py``)."""
    order: list[Node] = []
    seen: set = set()
    stack: list = []  # arrays to visit, and (a Node) markers: its inputs are done
    for d in descs:
        stack.append(d)
        while stack:
            item = stack.pop()
            if item.__class__ is Node:
                order.append(item)
                if visit is not None:
                    visit(item)
                continue
            node = item.node
            if node is None and kept:
                node = item.kept
            if node is None:
                if leaf is not None:
                    leaf(item)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            if cut is not None and cut(item):
                continue
            stack.append(node)
            for x in reversed(node.inputs):
                n = x.node
                if n is None and kept:
                    n = x.kept
                if n is None:
                    if leaf is not None:
                        stack.append(x)
                elif id(n) not in seen:
                    stack.append(x)
    return order
