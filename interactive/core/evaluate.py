"""Evaluating the lazy graph: topological order, running each node's rule, detaching."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from tapescope.kernels import rules, timeline

from . import dtypes as _dt
from .array import ArrayDesc
from .primitive import ASTYPE, BINARY, TERNARY, UNARY, Node

_HALF = (_dt.bfloat16.np,)
_ELEMENTWISE = (UNARY, BINARY, TERNARY)


def topo_order(descs: Iterable[ArrayDesc]) -> list[Node]:
    """The unevaluated nodes the given arrays depend on, inputs before users."""
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = []
    for d in descs:
        if d.node is not None and id(d.node) not in seen:
            stack.append((d.node, False))
            while stack:
                node, done = stack.pop()
                if done:
                    order.append(node)
                    continue
                if id(node) in seen:
                    continue
                seen.add(id(node))
                stack.append((node, True))
                for inp in reversed(node.inputs):
                    if inp.node is not None and id(inp.node) not in seen:
                        stack.append((inp.node, False))
    return order


def _coerce(value, desc: ArrayDesc) -> np.ndarray:
    """Make a rule's result exactly the array's dtype and shape."""
    out = np.asarray(value)
    if out.dtype != desc.dtype.np:
        out = out.astype(desc.dtype.np)
    if out.shape != desc.shape:
        out = out.reshape(desc.shape)
    return out


def run_node(node: Node) -> None:
    """Compute a node's outputs with the CPU rule for its primitive and detach it."""
    prim = node.primitive
    ins = [d.data for d in node.inputs]
    if prim.kind in _ELEMENTWISE and any(x.dtype in _HALF for x in ins):
        # bfloat16 math is done in float32 and rounded back, as MLX's CPU backend does.
        ins = [x.astype(np.float32) if x.dtype in _HALF else x for x in ins]
    t0 = timeline.now() if timeline.enabled else 0
    with np.errstate(all="ignore"):
        res = rules.get(prim.name)(np, *ins, **prim.kwargs())
    if not isinstance(res, (tuple, list)):
        res = (res,)
    nbytes = 0
    for ref, value in zip(node.outputs, res):
        d = ref()
        if d is not None:
            data = _coerce(value, d)
            nbytes += data.nbytes
            d.set_data(data)
    node.inputs = []
    if t0:
        timeline.add("primitive", t0, timeline.now(), name=prim.name, node=node.id,
                     stream=prim.stream.index, device=prim.stream.device.type.name,
                     nbytes=nbytes)


def evaluate(descs: list[ArrayDesc]) -> None:
    """Evaluate every unevaluated array in ``descs`` (and what they depend on)."""
    order = topo_order(descs)
    if not order:
        return
    t0 = timeline.now() if timeline.enabled else 0
    for node in order:
        run_node(node)
    if t0:
        timeline.add("eval", t0, timeline.now(), detail={"nodes": len(order)})
