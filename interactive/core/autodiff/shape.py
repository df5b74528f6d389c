"""VJP / JVP rules of the layout primitives: Reshape, ExpandDims, Squeeze, Flatten, Unflatten,
Transpose, Concatenate, Split, Pad, AsStrided. Every one is linear: its JVP is the op itself
applied to the tangents, its VJP the transposed layout (a reshape back, the inverse
permutation, slices, a concatenation, an index-scatter)."""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from ..array import array
from ..ops.shape import reshape_known
from .registry import defjvp, defvjp, record1, same_op, without


def linear_jvp(name: str):
    """JVP of a linear primitive: the same primitive on the tangents (zeros for inputs
    without one; non-differentiable inputs such as indices keep their primal)."""

    def jvp(p, t, argnums, o, **params):
        ins = list(p)
        for i in range(len(ins)):
            if i not in argnums and _dt.is_inexact(ins[i].dtype):
                ins[i] = mx.zeros_like(ins[i])
        for i, ti in zip(argnums, t):
            ins[i] = ti
        return same_op(name, ins, o, **params)

    return jvp


def _reshape_vjp(p, c, argnums, o, **_):
    return [reshape_known(c[0], p[0]._d.shape)]  # (mx.reshape's node, without its checks)


for _n in ("Reshape", "ExpandDims", "Squeeze", "Flatten", "Unflatten"):
    defvjp(_n, _reshape_vjp)
    defjvp(_n, linear_jvp(_n))


def _transpose_vjp(p, c, argnums, o, *, axes):
    inv = [0] * len(axes)
    for i, a in enumerate(axes):
        inv[a] = i
    return [mx.transpose(c[0], inv)]


defvjp("Transpose", _transpose_vjp)
defjvp("Transpose", linear_jvp("Transpose"))


def _concatenate_vjp(p, c, argnums, o, *, axis):
    starts = [0]
    for x in p:
        starts.append(starts[-1] + x.shape[axis])
    out = []
    nd = c[0].ndim
    for i in argnums:
        lo, hi = [0] * nd, list(c[0].shape)
        lo[axis], hi[axis] = starts[i], starts[i + 1]
        out.append(record1("Slice", [c[0]], p[i].shape, c[0].dtype, start_indices=tuple(lo),
                           end_indices=tuple(hi), strides=(1,) * nd))
    return out


defvjp("Concatenate", _concatenate_vjp)
defjvp("Concatenate", linear_jvp("Concatenate"))


def _split_vjp(p, c, argnums, o, *, indices, axis):
    x = p[0]
    bounds = [0] + list(indices) + [x.shape[axis]]
    parts = []
    for k, ck in enumerate(c):
        if ck is None:
            shape = list(x.shape)
            shape[axis] = max(0, min(bounds[k + 1], x.shape[axis]) - min(bounds[k], x.shape[axis]))
            ck = mx.zeros(tuple(shape), x.dtype)
        parts.append(ck)
    return [mx.concatenate(parts, axis=axis)]


def _split_jvp(p, t, argnums, o, *, indices, axis):
    return mx.split(t[0], list(indices), axis=axis)


defvjp("Split", _split_vjp)
defjvp("Split", _split_jvp)


def _pad_vjp(p, c, argnums, o, *, axes, low_pad_size, high_pad_size):
    x = p[0]
    lo, hi = [0] * x.ndim, list(c[0].shape)
    for ax, l in zip(axes, low_pad_size):
        lo[ax] = l
        hi[ax] = l + x.shape[ax]
    inner = record1("Slice", [c[0]], x.shape, c[0].dtype, start_indices=tuple(lo),
                    end_indices=tuple(hi), strides=(1,) * x.ndim)
    out = []
    for i in argnums:
        if i == 0:
            out.append(inner)
        else:  # the padding value: every padded element's cotangent
            out.append(mx.subtract(mx.sum(c[0]), mx.sum(inner)))
    return out


defvjp("Pad", _pad_vjp)
defjvp("Pad", linear_jvp("Pad"))


def _as_strided_vjp(p, c, argnums, o, *, shape, strides, offset):
    """Scatter-add each output element's cotangent to the flat input element it reads."""
    idx = array(offset, _dt.int64)
    for ax, (n, st) in enumerate(zip(shape, strides)):
        r = mx.multiply(mx.arange(n, dtype=_dt.int64), st)
        r = mx.reshape(r, tuple(n if k == ax else 1 for k in range(len(shape))))
        idx = mx.add(idx, r)
    flat_idx = mx.reshape(mx.broadcast_to(idx, tuple(shape)), (-1,))
    flat_c = mx.reshape(c[0], (-1,))
    z = mx.zeros(p[0].shape, p[0].dtype)
    g = record1("Scatter", [mx.reshape(z, (-1,)), flat_idx, mx.reshape(flat_c, (-1, 1))],
                (p[0].size,), p[0].dtype, axes=(0,), reduce="sum")
    return [mx.reshape(g, p[0].shape)]


defvjp("AsStrided", _as_strided_vjp)
defjvp("AsStrided", linear_jvp("AsStrided"))

without("View", vjp="MLX has no VJP for View (a bit cast): raises [Primitive::vjp] Not "
        "implemented for View <dtype>.",
        jvp="MLX has no JVP for View (a bit cast): raises [Primitive::jvp] Not implemented for "
        "View <dtype>.")


# -- Depends ---------------------------------------------------------------------------------
def _depends_vjp(p, c, argnums, o, *, count):
    """MLX's Depends::vjp: an output's cotangent goes to its input; a dependency gets zeros."""
    return [c[i] if i < count and c[i] is not None else mx.zeros_like(p[i]) for i in argnums]


defvjp("Depends", _depends_vjp)
without("Depends", jvp="MLX has no JVP for Depends: raises [Primitive::jvp] Not implemented for "
        "Depends.")
