"""Batching the recorded graph: MLX's ``vmap_trace`` / ``vmap_replace`` (mlx/transforms.cpp).

The function runs once on *tracers*: placeholder arrays shaped like one slice of each mapped
argument (the mapped axis removed; a ``Placeholder`` node, so evaluating one raises MLX's
error). The ops it records form the unbatched graph. ``replace`` walks that graph from the
outputs (``walk.topological``, stopping at the tracers), keeps the nodes with an input that
depends on a tracer, and runs them forwards with each definition's batching rule: the rule
records the batched primitive on the batched inputs and says where the mapped axis of each
output lies (-1: not mapped). Nothing is evaluated and nothing loops over the mapped axis:
the result is one batched graph, which ``eval`` runs and ``compile`` fuses.
"""

from __future__ import annotations

import weakref
from typing import Sequence

from ..array import ArrayDesc, array
from ..autodiff.engine import printed_name
from ..device import StreamContext, resolve_stream
from ..primitive import Node, Primitive
from ..compile_trace import noted_partners
from ..walk import topological


def make_tracers(inputs: Sequence[array], in_axes: Sequence[int]) -> list[array]:
    """MLX's ``vmap_trace`` inputs: a tracer of each mapped input with its mapped axis
    removed; unmapped inputs stand for themselves."""
    s = resolve_stream(None)
    out = []
    for i, (x, ax) in enumerate(zip(inputs, in_axes)):
        if ax == -1:
            out.append(x)
            continue
        shape = x.shape[:ax] + x.shape[ax + 1:]
        node = Node(Primitive("Placeholder", s, index=i), [])
        d = ArrayDesc(tuple(shape), x.dtype, s, node=node, index=0)
        node.outputs.append(weakref.ref(d))
        out.append(array._wrap(d))
    return out


def batch_graph(outputs: Sequence[ArrayDesc], tmap: dict) -> None:
    """Batch every node between the sources in ``tmap`` (id(desc) -> (batched array, axis),
    grown in place) and ``outputs``: each node with a mapped input gets its rule's outputs."""
    needs = set(tmap)
    cut = lambda d: id(d) in needs  # noqa: E731
    order = topological(outputs, cut=cut)
    # a shapeless trace's Broadcasts with noted partners (matmul's batch broadcasts): their
    # partners are batched first, so the Broadcast's rule finds them (they are not inputs)
    noted = {id(n): got for n in order if (got := noted_partners(n)) is not None}
    if noted:
        order = topological([p for ps, _ in noted.values() for p in ps] + list(outputs), cut=cut)
    keep = []  # the descs whose ids are keys: alive until the walk is done
    for node in order:
        got = noted.get(id(node))
        if got is not None:
            if any(id(x) in needs for x in list(node.inputs) + got[0]):
                _broadcast_axes(node, got, tmap, needs, keep)
            continue
        if not any(id(x) in needs for x in node.inputs):
            continue
        prim = node.primitive
        rule = prim.defn.vmap
        if rule is None:
            raise ValueError(f"[Primitive::vmap] Not implemented for {printed_name(prim)}.")
        v_inputs, v_axes = [], []
        for x in node.inputs:
            hit = tmap.get(id(x))
            if hit is not None:
                v_inputs.append(hit[0])
                v_axes.append(hit[1])
            else:
                v_inputs.append(array._wrap(x))
                v_axes.append(-1)
        outs = [r() for r in node.outputs]
        with StreamContext(prim.stream):
            v_outs, v_out_axes = rule(v_inputs, v_axes, [array._wrap(x) for x in node.inputs],
                                      [array._wrap(o) if o is not None else None for o in outs],
                                      **prim.kw)
        for o, v, ax in zip(outs, v_outs, v_out_axes):
            if o is not None:
                tmap[id(o)] = (v, int(ax))
                needs.add(id(o))
                keep.append(o)


def _batched(d: ArrayDesc, tmap: dict) -> tuple:
    hit = tmap.get(id(d))
    return hit if hit is not None else (array._wrap(d), -1)


def _broadcast_axes(node: Node, noted: tuple, tmap: dict, needs: set, keep: list) -> None:
    """A Broadcast whose shape follows noted partners, batched as MLX's BroadcastAxes::vmap
    (mlx/primitives.cpp), whose partners are inputs: each mapped one of the input and the
    partners gets the leading axes up to the widest rank and its mapped axis first; the
    output broadcasts the input with all of them (the last ``kept`` axes the input's) and
    is mapped at axis 0 (a mapped partner maps it too). The batched Broadcast notes the
    batched partners, so a replay on new shapes broadcasts with them again."""
    from .. import ops as mx
    from ..compile_trace import note_partners
    from ..ops.convert import broadcast_shape_of

    partners, kept = noted
    vals = [_batched(d, tmap) for d in [node.inputs[0]] + list(partners)]
    ndim = max(v.ndim for v, _ in vals)
    new = []
    for v, ax in vals:
        if ax >= 0:
            extra = ndim - v.ndim
            if extra:
                v, ax = mx.expand_dims(v, list(range(extra))), ax + extra
            if ax > 0:
                v = mx.moveaxis(v, ax, 0)
        new.append(v)
    x = new[0]
    lead = [tuple(v.shape[:v.ndim - kept]) for v in new]
    shape = tuple(broadcast_shape_of(lead)) + tuple(x.shape[x.ndim - kept:])
    with StreamContext(node.primitive.stream):
        out = mx.broadcast_to(x, shape)
    note_partners(out, new[1:], keep=kept)
    o = node.outputs[0]()
    if o is not None:
        tmap[id(o)] = (out, 0 if any(ax >= 0 for _, ax in vals) else -1)
        needs.add(id(o))
        keep.append(o)


def replace(inputs: Sequence[array], tracers: Sequence[ArrayDesc], outputs: Sequence[array],
            in_axes: Sequence[int], out_axes: Sequence[int]) -> list[array]:
    """MLX's ``vmap_replace``: the batched outputs, each mapped axis moved to ``out_axes``.
    ``tracers`` are the tracers' descs as made (``a[i] = v`` inside the function gives the
    handle a new desc, which must be batched, not taken for the argument)."""
    from .. import ops as mx

    if len(out_axes) != len(outputs):
        raise ValueError(f"[vmap] The number of out axes ({len(out_axes)}) must match the "
                         f"number of outputs ({len(outputs)}).")
    size = -1
    for x, ax in zip(inputs, in_axes):
        if ax >= 0:
            size = x.shape[ax]
            break
    if size == -1:
        raise ValueError("At least one of in_axes must be non-None.")
    tmap = {id(t): (x, ax) for x, t, ax in zip(inputs, tracers, in_axes) if ax != -1}
    batch_graph([o._d for o in outputs], tmap)
    res = []
    for o, want in zip(outputs, out_axes):
        hit = tmap.get(id(o._d))
        if hit is not None:
            out, vdim = hit
            if vdim != want:
                if want < 0 or want >= out.ndim:
                    raise ValueError(f"[vmap] Axis {want} invalid for output with {out.ndim} "
                                     "dimensions.")
                out = mx.moveaxis(out, vdim, want)
            res.append(out)
        else:  # no input dependency: the same value for every slice
            res.append(mx.repeat(mx.expand_dims(o, want), size, want))
    return res


def vmap_flat(fun, inputs: Sequence[array], in_axes: Sequence[int],
              out_axes: Sequence[int]) -> list[array]:
    """MLX's C++ ``vmap(fun, in_axes, out_axes)(inputs)`` on flat lists (what a custom
    function's default batching rule runs)."""
    check_sizes(inputs, in_axes)
    tracers = make_tracers(inputs, in_axes)
    descs = [t._d for t in tracers]
    return replace(inputs, descs, fun(tracers), in_axes, out_axes)


def check_sizes(inputs: Sequence[array], in_axes: Sequence[int]) -> None:
    """``vmap_trace``'s checks: every mapped axis exists and all have one size."""
    if len(in_axes) != len(inputs):
        raise ValueError(f"[vmap] The number of in axes ({len(in_axes)}) must match the number "
                         f"of inputs ({len(inputs)}).")
    size = None
    for x, ax in zip(inputs, in_axes):
        if ax != -1:
            if x.ndim == 0:
                raise ValueError("[vmap] Cannot vmap an input with zero dimensions.")
            if ax > x.ndim:
                raise ValueError(f"[vmap] Axis {ax} invalid for input with {x.ndim} dimensions.")
            size = x.shape[ax]
    for x, ax in zip(inputs, in_axes):
        if ax != -1 and x.shape[ax] != size:
            raise ValueError(f"[vmap] Inconsistent axis sizes: {x.shape[ax]} and {size}.")
