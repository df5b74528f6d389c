"""Output shapes of a primitive on inputs of new shapes, for ``compile(shapeless=True)``:
MLX's ``Primitive::output_shapes`` (mlx/primitives.cpp), answered by the definition's
``shape`` rule (kernels/rules/). A primitive whose definition has none cannot run shapeless:
MLX raises when it is traced, and so does ``infer``. Elementwise ops, Broadcast and fused
tapes are handled by the tracer (core/compile_trace.py).
"""

from __future__ import annotations

from .primitive import Primitive


def infer(prim: Primitive, in_shapes: list) -> tuple:
    """(output shapes, primitive to record) for inputs of ``in_shapes``, or MLX's error. A
    primitive whose ``shape`` parameter is its output shape (Reshape, Squeeze, ...) is
    recorded again with the new one."""
    rule = prim.defn.shape
    if not callable(rule):
        raise ValueError(f"[Primitive::output_shapes] {prim.name} cannot infer output shapes.")
    outs = [tuple(o) for o in rule([tuple(s) for s in in_shapes], **prim.kw)]
    if "shape" in prim.kw and len(outs) == 1 and tuple(prim.kw["shape"]) != outs[0]:
        prim = Primitive(prim.name, prim.stream, **{**prim.kw, "shape": outs[0]})
    return outs, prim
