"""VJP / JVP rules of slicing, gathering and scattering: Slice, SliceUpdate, DynamicSlice,
DynamicSliceUpdate, Gather, Scatter, GatherAxis, ScatterAxis. A gather's VJP scatter-adds
(``Scatter`` / ``ScatterAxis`` with reduce "sum"); a scatter's VJP gathers. Index inputs get
zero cotangents, as MLX gives them."""

from __future__ import annotations

from .. import ops as mx
from .registry import defjvp, defvjp, record1, without
from .shape import linear_jvp


def _slice_vjp(p, c, argnums, o, **params):
    z = mx.zeros_like(p[0])
    return [record1("SliceUpdate", [z, c[0]], p[0].shape, p[0].dtype, **params)]


defvjp("Slice", _slice_vjp)
defjvp("Slice", linear_jvp("Slice"))


def _slice_update_vjp(p, c, argnums, o, **params):
    out = []
    for i in argnums:
        if i == 0:
            out.append(record1("SliceUpdate", [c[0], mx.zeros_like(p[1])], p[0].shape,
                               p[0].dtype, **params))
        else:
            out.append(record1("Slice", [c[0]], p[1].shape, p[1].dtype, **params))
    return out


defvjp("SliceUpdate", _slice_update_vjp)
defjvp("SliceUpdate", linear_jvp("SliceUpdate"))


def _dynamic_slice_vjp(p, c, argnums, o, *, axes, slice_size):
    out = []
    for i in argnums:
        if i == 0:
            out.append(record1("DynamicSliceUpdate", [mx.zeros_like(p[0]), c[0], p[1]],
                               p[0].shape, p[0].dtype, axes=axes))
        else:
            out.append(mx.zeros_like(p[i]))
    return out


defvjp("DynamicSlice", _dynamic_slice_vjp)
defjvp("DynamicSlice", linear_jvp("DynamicSlice"))


def _dynamic_slice_update_vjp(p, c, argnums, o, *, axes):
    out = []
    for i in argnums:
        if i == 0:
            out.append(record1("DynamicSliceUpdate", [c[0], mx.zeros_like(p[1]), p[2]],
                               p[0].shape, p[0].dtype, axes=axes))
        elif i == 1:
            out.append(record1("DynamicSlice", [c[0], p[2]], p[1].shape, p[1].dtype, axes=axes,
                               slice_size=tuple(p[1].shape)))
        else:
            out.append(mx.zeros_like(p[i]))
    return out


defvjp("DynamicSliceUpdate", _dynamic_slice_update_vjp)
defjvp("DynamicSliceUpdate", linear_jvp("DynamicSliceUpdate"))


def _gather_vjp(p, c, argnums, o, *, axes, slice_sizes):
    a, idx = p[0], list(p[1:])
    out = []
    for i in argnums:
        if i == 0:
            out.append(record1("Scatter", [mx.zeros_like(a)] + idx + [c[0]], a.shape, a.dtype,
                               axes=axes, reduce="sum"))
        else:
            out.append(mx.zeros_like(p[i]))
    return out


defvjp("Gather", _gather_vjp)
defjvp("Gather", linear_jvp("Gather"))


def _gather(c, idx, axes, upd):
    sizes = tuple(upd.shape[upd.ndim - c.ndim:])
    return record1("Gather", [c] + idx, upd.shape, c.dtype, axes=axes, slice_sizes=sizes)


def _scatter_vjp(p, c, argnums, o, *, axes, reduce):
    a, idx, upd = p[0], list(p[1:-1]), p[-1]
    n = len(p) - 1
    if reduce not in ("none", "sum", "max", "min"):
        raise RuntimeError(f"[scatter] VJP not implemented for scatter_{reduce}")
    out = []
    for i in argnums:
        if i == 0:
            if reduce == "none":
                out.append(record1("Scatter", [c[0]] + idx + [mx.zeros_like(upd)], a.shape,
                                   a.dtype, axes=axes, reduce="none"))
            elif reduce == "sum":
                out.append(c[0])
            else:  # max / min: the cotangent goes where the input survived
                out.append(mx.multiply(c[0], mx.astype(mx.equal(a, o[0]), a.dtype)))
        elif i == n:
            g = _gather(c[0], idx, axes, upd)
            if reduce in ("max", "min"):
                won = mx.equal(upd, _gather(o[0], idx, axes, upd))
                g = mx.multiply(g, mx.astype(won, g.dtype))
            out.append(g)
        else:
            out.append(mx.zeros_like(p[i]))
    return out


def _scatter_jvp(*_, **__):
    raise RuntimeError("[scatter] JVP not yet implemented")


defvjp("Scatter", _scatter_vjp)
defjvp("Scatter", _scatter_jvp)


def _gather_axis_vjp(p, c, argnums, o, *, axis):
    out = []
    for i in argnums:
        if i == 0:
            out.append(record1("ScatterAxis", [mx.zeros_like(p[0]), p[1], c[0]], p[0].shape,
                               p[0].dtype, axis=axis, reduce="sum"))
        else:
            out.append(mx.zeros_like(p[i]))
    return out


defvjp("GatherAxis", _gather_axis_vjp)
defjvp("GatherAxis", linear_jvp("GatherAxis"))


def _scatter_axis_vjp(p, c, argnums, o, *, axis, reduce):
    if reduce not in ("none", "sum"):
        raise RuntimeError(f"[scatter_axis] VJP not implemented for reduction {reduce}")
    out = []
    for i in argnums:
        if i == 0:
            if reduce == "none":
                out.append(record1("ScatterAxis", [c[0], p[1], mx.zeros_like(p[2])], p[0].shape,
                                   p[0].dtype, axis=axis, reduce="none"))
            else:
                out.append(c[0])
        elif i == 2:
            out.append(record1("GatherAxis", [c[0], p[1]], p[1].shape, c[0].dtype, axis=axis))
        else:
            out.append(mx.zeros_like(p[i]))
    return out


defvjp("ScatterAxis", _scatter_axis_vjp)
defjvp("ScatterAxis", linear_jvp("ScatterAxis"))

without("MaskedScatter",
        vjp="MLX 0.32 has no working VJP for MaskedScatter (its binding fails: "
        "nb_func_error_except): raises [Primitive::vjp] Not implemented for MaskedScatter.",
        jvp="MLX has no JVP for MaskedScatter: raises [Primitive::jvp] Not implemented for "
        "MaskedScatter.")
