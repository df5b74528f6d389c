"""VJP / JVP rules of slicing, gathering and scattering: Slice, SliceUpdate, DynamicSlice,
DynamicSliceUpdate, Gather, Scatter, GatherAxis, ScatterAxis. A gather's VJP scatter-adds
(``Scatter`` / ``ScatterAxis`` with reduce "sum"); a scatter's VJP gathers. A gradient with
respect to indices raises MLX's error (mlx/primitives.cpp): indices computed from a primal
need ``stop_gradient``."""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from .registry import defjvp, defvjp, record1
from .shape import linear_jvp

_USE_STOP_GRADIENT = "Use stop_gradient on indices to stop gradients from being computed."


def _indices_error(op: str, what: str) -> ValueError:
    return ValueError(f"[{op}] Cannot calculate {what} with respect to indices. {_USE_STOP_GRADIENT}")


def _index_jvp(name: str, op: str, data: tuple) -> callable:
    """A linear JVP whose inputs other than ``data`` are indices: one of those raises."""
    linear = linear_jvp(name)

    def jvp(p, t, argnums, *args, **params):
        if any(i not in data for i in argnums):
            raise _indices_error(op, "JVP")
        return linear(p, t, argnums, *args, **params)

    return jvp


def _slice_vjp(p, c, argnums, o, **params):
    z = mx.zeros_like(p[0])
    return [record1("SliceUpdate", [z, c[0]], p[0].shape, p[0].dtype, **params)]


defvjp("Slice", _slice_vjp)
defjvp("Slice", linear_jvp("Slice"))


def _slice_update_vjp(p, c, argnums, o, *, reduce="none", **params):
    """MLX's SliceUpdate::vjp for each reduce: the source's cotangent is the cotangent with
    the window zeroed (none), kept (sum), where the source won (max / min) or times the
    update (prod); the update's is the window's cotangent, where it won, or times the
    source."""
    values, upd, cot = p[0], p[1], c[0]
    window = lambda x: record1("Slice", [x], upd.shape, x.dtype, **params)  # noqa: E731
    zero = mx.zeros_like(cot)
    out = []
    for i in argnums:
        if i == 0:
            if reduce == "none":
                out.append(record1("SliceUpdate", [cot, mx.zeros_like(upd)], values.shape,
                                   values.dtype, **params))
            elif reduce == "sum":
                out.append(cot)
            elif reduce == "prod":
                out.append(record1("SliceUpdate", [cot, upd], values.shape, values.dtype,
                                   reduce="prod", **params))
            else:
                out.append(mx.where(mx.equal(o[0], values), cot, zero))
        elif reduce in ("none", "sum"):
            out.append(window(cot))
        elif reduce == "prod":
            out.append(mx.multiply(window(cot), window(values)))
        else:
            out.append(mx.where(mx.equal(window(o[0]), upd), window(cot), mx.zeros_like(upd)))
    return out


def _slice_update_jvp(p, t, argnums, o, *, reduce="none", **params):
    if reduce not in ("none", "sum"):
        raise RuntimeError("[SliceUpdate] JVP for product, minimum and maximum not implemented.")
    return linear_jvp("SliceUpdate")(p, t, argnums, o, **params,
                                     **({} if reduce == "none" else {"reduce": reduce}))


defvjp("SliceUpdate", _slice_update_vjp)
defjvp("SliceUpdate", _slice_update_jvp)


def _dynamic_slice_vjp(p, c, argnums, o, *, axes, slice_size):
    if list(argnums) != [0]:
        raise ValueError("[DynamicSlice::vjp] Not supported for start indices.")
    return [record1("DynamicSliceUpdate", [mx.zeros_like(p[0]), c[0], p[1]], p[0].shape,
                    p[0].dtype, axes=axes)]


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
            raise ValueError("[DynamicSliceUpdate::vjp] Not supported for start indices")
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
            raise _indices_error("gather", "VJP")
    return out


defvjp("Gather", _gather_vjp)
defjvp("Gather", _index_jvp("Gather", "gather", (0,)))


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
            raise _indices_error("scatter", "VJP")
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
            raise _indices_error("gather_axis", "VJP")
    return out


defvjp("GatherAxis", _gather_axis_vjp)
defjvp("GatherAxis", _index_jvp("GatherAxis", "gather_axis", (0,)))


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
            raise _indices_error("scatter_axis", "VJP")
    return out


defvjp("ScatterAxis", _scatter_axis_vjp)
defjvp("ScatterAxis", _index_jvp("ScatterAxis", "scatter_axis", (0, 2)))

def _masked_scatter_vjp(p, c, argnums, o, **_):
    """MLX's MaskedScatter::vjp: the destination's cotangent where the mask is off; the
    source's, each selected element's cotangent added at its rank among the selected
    (``mask`` is already broadcast to the destination's shape here)."""
    mask, src = p[1], p[2]
    out = []
    for i in argnums:
        if i == 0:
            out.append(mx.where(mask, mx.zeros_like(c[0]), c[0]))
        elif i == 2:
            flat_mask, flat_cot = mx.flatten(mask), mx.flatten(c[0])
            rank = mx.cumsum(mx.astype(flat_mask, _dt.int32), 0, inclusive=False)
            rank = mx.where(flat_mask, rank, 0)  # off elements add zero at rank 0
            upd = mx.where(flat_mask, flat_cot, mx.zeros_like(flat_cot))
            g = mx.zeros((src.size,), upd.dtype)
            if src.size:
                g = record1("Scatter", [g, rank, mx.reshape(upd, (rank.size, 1))], g.shape,
                            g.dtype, axes=(0,), reduce="sum")
            out.append(mx.reshape(g, src.shape))
        else:
            raise ValueError("[masked_scatter] Cannot calculate VJP with respect to mask. "
                             "Use stop_gradient on mask to stop gradients from being computed.")
    return out


def _masked_scatter_jvp(p, t, argnums, o, **_):
    """MLX's MaskedScatter::jvp: zeros, the destination's tangent where the mask is off,
    then the source's tangent scattered into the selected elements."""
    out = mx.zeros_like(p[0])
    for i, ti in zip(argnums, t):
        if i == 0:
            out = mx.where(p[1], out, ti)
        elif i == 2:
            out = record1("MaskedScatter", [out, p[1], ti], out.shape, out.dtype)
        else:
            raise ValueError("[masked_scatter] invalid arg index in JVP")
    return [out]


defvjp("MaskedScatter", _masked_scatter_vjp)
defjvp("MaskedScatter", _masked_scatter_jvp)
