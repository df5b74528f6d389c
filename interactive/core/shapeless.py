"""Output shapes of a primitive on inputs of new shapes, for ``compile(shapeless=True)``:
MLX's ``Primitive::output_shapes`` (mlx/primitives.cpp).

A definition whose ``shape`` facet is a function (kernels/primitives.py: the reductions,
elementwise families, Hadamard) answers itself; the rules below are MLX's for primitives
whose op computes its shape in core (their definitions name the op module). A primitive
with neither cannot run shapeless: MLX raises when it is traced, and so does ``infer``.
Elementwise ops, Broadcast and fused tapes are handled by the tracer (core/tracing.py).
"""

from __future__ import annotations

from typing import Callable

from .primitive import Primitive

Shapes = list


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _fmt(shape) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


def _with(prim: Primitive, **changes) -> Primitive:
    kw = prim.kwargs()
    kw.update(changes)
    return Primitive(prim.name, prim.stream, **kw)


def _reshape(prim: Primitive, ins: list):
    """MLX's Reshape::output_shape: the requested shape (its -1 inferred again)."""
    spec = prim.kw.get("spec", prim.kw["shape"])
    size = _prod(ins[0])
    out = list(spec)
    if -1 in spec:
        rest = _prod(d for d in spec if d != -1)
        out[spec.index(-1)] = size // rest if rest else 0
    out = tuple(out)
    if _prod(out) != size:
        raise ValueError(f"[reshape] Cannot reshape array of size {size} into shape {_fmt(out)}.")
    return [out], _with(prim, shape=out)


def _flatten(prim: Primitive, ins: list):
    shape = ins[0]
    if not shape:
        return [(1,)], _with(prim, shape=(1,))
    lo, hi = prim.kw["start_axis"] % len(shape), prim.kw["end_axis"] % len(shape)
    out = shape[:lo] + (_prod(shape[lo:hi + 1]),) + shape[hi + 1:]
    return [out], _with(prim, shape=out)


def _unflatten(prim: Primitive, ins: list):
    """MLX's Unflatten::output_shape: axis ``axis`` split into the requested ``spec`` (its
    -1 inferred again)."""
    shape, ax, spec = ins[0], prim.kw["axis"], prim.kw["spec"]
    sub = list(spec)
    if -1 in spec:
        rest = _prod(d for d in spec if d != -1)
        sub[spec.index(-1)] = shape[ax] // rest if rest else 0
    if _prod(sub) != shape[ax]:
        raise ValueError(f"[Unflatten] Cannot unflatten axis {ax} with size {shape[ax]} into "
                         f"shape {_fmt(spec)}.")
    out = shape[:ax] + tuple(sub) + shape[ax + 1:]
    return [out], _with(prim, shape=out)


def _gather_qmm(prim: Primitive, ins: list):
    """MLX's GatherQMM::output_shapes: the indices' shape, x's rows, w's outer size."""
    x, w = ins[0], ins[1]
    lhs = ins[4] if prim.kw["mode"] == "affine" else ins[3]
    outer = w[-2] if prim.kw["transpose"] else w[-1] * 32 // prim.kw["bits"]
    return [tuple(lhs) + (x[-2], outer)], prim


def _quantized_matmul(prim: Primitive, ins: list):
    """MLX's QuantizedMatmul::output_shapes: x's shape with w's outer size last."""
    x, w = ins[0], ins[1]
    outer = w[-2] if prim.kw["transpose"] else w[-1] * 32 // prim.kw["bits"]
    return [x[:-1] + (outer,)], prim


def _expand_dims(prim: Primitive, ins: list):
    out = list(ins[0])
    for ax in sorted(prim.kw["axes"]):
        out.insert(ax, 1)
    return [tuple(out)], _with(prim, shape=tuple(out))


def _squeeze(prim: Primitive, ins: list):
    axes = set(prim.kw["axes"])
    out = tuple(d for i, d in enumerate(ins[0]) if i not in axes)
    return [out], _with(prim, shape=out)


def _arg_reduce(prim: Primitive, ins: list):
    out = list(ins[0])
    out[prim.kw["axis"]] = 1
    return [tuple(out)], prim


def _last_to_one(prim: Primitive, ins: list):
    return [ins[0][:-1] + (1,)], prim


def _same(prim: Primitive, ins: list):
    return [ins[0]], prim


def _transpose(prim: Primitive, ins: list):
    return [tuple(ins[0][a] for a in prim.kw["axes"])], prim


def _concatenate(prim: Primitive, ins: list):
    ax = prim.kw["axis"]
    out = list(ins[0])
    out[ax] = sum(s[ax] for s in ins)
    return [tuple(out)], prim


def _gather(prim: Primitive, ins: list):
    idx = ins[1] if len(ins) > 1 else ()
    return [tuple(idx) + tuple(prim.kw["slice_sizes"])], prim


def _second(prim: Primitive, ins: list):
    return [ins[1]], prim


def _matmul(prim: Primitive, ins: list):
    """Matmul and AddMM: the first input's shape with the second's last dimension."""
    return [ins[0][:-1] + ins[1][-1:]], prim


RULES: dict[str, Callable] = {
    "Reshape": _reshape, "Flatten": _flatten, "ExpandDims": _expand_dims, "Squeeze": _squeeze,
    "Unflatten": _unflatten, "GatherQMM": _gather_qmm, "QuantizedMatmul": _quantized_matmul,
    "Transpose": _transpose, "Concatenate": _concatenate, "Gather": _gather,
    "GatherAxis": _second, "Matmul": _matmul, "AddMM": _matmul, "ArgReduce": _arg_reduce,
    "LogSumExp": _last_to_one, "NumberOfElements": lambda prim, ins: ([()], prim),
    **{n: _same for n in ("Softmax", "Sort", "ArgSort", "CumSum", "CumProd", "CumMax", "CumMin",
                          "CumLogAddExp", "SliceUpdate", "Scatter", "ScatterAxis", "Copy",
                          "Contiguous", "Full", "StopGradient")},
}


def infer(prim: Primitive, in_shapes: list) -> tuple:
    """(output shapes, primitive to record) for inputs of ``in_shapes``, or MLX's error."""
    in_shapes = [tuple(s) for s in in_shapes]
    if callable(prim.defn.shape):
        return [tuple(o) for o in prim.defn.shape(in_shapes, **prim.kw)], prim
    rule = RULES.get(prim.name)
    if rule is None:
        raise ValueError(f"[Primitive::output_shapes] {prim.name} cannot infer output shapes.")
    return rule(prim, in_shapes)
