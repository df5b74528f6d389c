"""VJP rules of GatherMM and BlockMaskedMM, after ``GatherMM::vjp`` / ``BlockMaskedMM::vjp``
and ``gather_mm_grad`` in ``mlx/primitives.cpp``; MLX has no JVP for either, and neither a
VJP nor a JVP for SegmentedMM.

One difference: MLX 0.32.4 takes the sorted shortcut (the cotangent as is for ``a``, a
segmented product for ``b``) whenever ``sorted_indices`` was passed, which is only right when
the rows of ``a`` are the output's rows (only ``rhs_indices`` given, nothing broadcast): with
sorted ``lhs_indices`` it returns wrong gradients, and a 2-D ``a`` raises "[flatten]
start_axis must be less than or equal to end_axis". Here the shortcut is taken only where it
is right; elsewhere the gather-then-scatter-add path gives the gradient.
"""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as mx
from .registry import defvjp, without


def _t(x):
    return mx.swapaxes(x, -1, -2)


def _scatter_add(n: int, indices, updates):
    """``zeros((n, *updates.shape[1:])).at[indices].add(updates)``: each update matrix added
    into the stack slot its index names."""
    zeros = mx.zeros((n,) + tuple(updates.shape[1:]), dtype=updates.dtype)
    return zeros.at[indices].add(updates)


def _stack_size(x) -> int:
    n = 1
    for d in x.shape[:-2]:
        n *= d
    return n


def _segments(rhs, num: int, rows: int):
    """``[start, end)`` rows of each of ``num`` matrices of ``b`` when the (sorted) ``rhs``
    indices hand ``rows`` consecutive rows to each use of a matrix (``gather_mm_grad``)."""
    counts = _scatter_add(num, mx.flatten(rhs), mx.full((rhs.size,), rows, dtype=_dt.uint32))
    ends = mx.cumsum(counts, 0)
    starts = mx.concatenate([mx.zeros((1,), dtype=_dt.uint32), ends[:-1]])
    return mx.stack([starts, ends], axis=-1)


def _gather_mm_vjp(p, c, argnums, o, *, left_sorted, right_sorted):
    a, b, lhs, rhs = p
    cot = c[0]
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    # the rows of ``a`` are the output's rows: only rhs_indices were given, none broadcast
    aligned = right_sorted and rhs.size * m * k == a.size
    out = []
    for i in argnums:
        if i == 0:
            g = mx.gather_mm(cot, _t(b), None, rhs, sorted_indices=left_sorted or right_sorted)
            if aligned:
                out.append(mx.reshape(g, a.shape))
            else:
                flat = mx.reshape(g, (-1, m, k))
                out.append(mx.reshape(_scatter_add(_stack_size(a), mx.flatten(lhs), flat),
                                      a.shape))
        elif i == 1:
            nb = _stack_size(b)
            if aligned:
                dw = mx.segmented_mm(mx.swapaxes(mx.reshape(cot, (-1, n)), 0, 1),
                                     mx.reshape(a, (-1, k)), _segments(rhs, nb, m))
            else:
                dw = mx.gather_mm(_t(cot), a, None, lhs)
                dw = _scatter_add(nb, mx.flatten(rhs), mx.reshape(dw, (-1, n, k)))
            out.append(_t(mx.reshape(dw, tuple(b.shape[:-2]) + (n, k))))
        else:
            raise ValueError("[GatherMM] Cannot calculate VJP with respect to indices. Use "
                             "stop_gradient on indices to stop gradients from being computed.")
    return out


def _expand_mask(mask, rows: int, cols: int, bs: int):
    """A block grid mask as a (..., rows, cols) elementwise mask."""
    full = mx.repeat(mx.repeat(mask, bs, axis=-2), bs, axis=-1)
    return full[..., :rows, :cols]


def _multiply_pad_reduce(p, q, rows_pad: int, cols_pad: int, bs: int):
    """``p * q`` summed over each ``bs x bs`` block (zero-padded to whole blocks)."""
    r = mx.multiply(p, q)
    if rows_pad or cols_pad:
        r = mx.pad(r, [(0, 0)] * (r.ndim - 2) + [(0, rows_pad), (0, cols_pad)])
    shape = tuple(r.shape[:-2]) + (r.shape[-2] // bs, bs, r.shape[-1] // bs, bs)
    return mx.sum(mx.reshape(r, shape), axis=(-3, -1))


def _block_masked_mm_vjp(p, c, argnums, o, *, block_size):
    bs = block_size
    cot = c[0]
    has_op = len(p) > 3
    has_out = len(p) in (3, 5)
    op_idx = 3 if has_out else 2
    out_mask = p[2] if has_out else None
    lhs_mask, rhs_mask = (p[op_idx], p[op_idx + 1]) if has_op else (None, None)
    needs_lhs_mask, needs_rhs_mask = has_op and op_idx in argnums, has_op and op_idx + 1 in argnums
    if ((needs_lhs_mask and lhs_mask.dtype == _dt.bool_)
            or (needs_rhs_mask and rhs_mask.dtype == _dt.bool_)):
        raise ValueError("[BlockMaskedMM] Cannot calculate VJP with respect to boolean masks. "
                         "Use stop_gradient on masks to stop gradients from being computed.")
    m, n, k = cot.shape[-2], cot.shape[-1], p[0].shape[-1]
    pad_m, pad_n, pad_k = (-m) % bs, (-n) % bs, (-k) % bs
    lhs_t = _t(lhs_mask) if has_op else None
    rhs_t = _t(rhs_mask) if has_op else None
    unmasked = {}

    def lhs_grad():  # dA before the lhs mask: (out_mask * cot) @ (rhs_mask * b)^T
        if "lhs" not in unmasked:
            unmasked["lhs"] = mx.block_masked_mm(cot, _t(p[1]), bs, None, out_mask, rhs_t)
        return unmasked["lhs"]

    def rhs_grad():  # dB before the rhs mask: (lhs_mask * a)^T @ (out_mask * cot)
        if "rhs" not in unmasked:
            unmasked["rhs"] = mx.block_masked_mm(_t(p[0]), cot, bs, None, lhs_t, out_mask)
        return unmasked["rhs"]

    out = []
    for i in argnums:
        if i == 0:
            if needs_lhs_mask:
                out.append(mx.multiply(lhs_grad(), _expand_mask(lhs_mask, m, k, bs)))
            else:
                out.append(mx.block_masked_mm(cot, _t(p[1]), bs, lhs_mask, out_mask, rhs_t))
        elif i == 1:
            if needs_rhs_mask:
                out.append(mx.multiply(rhs_grad(), _expand_mask(rhs_mask, k, n, bs)))
            else:
                out.append(mx.block_masked_mm(_t(p[0]), cot, bs, rhs_mask, lhs_t, out_mask))
        elif i == 2 and has_out:  # the forward result, recomputed as MLX does
            fwd = mx.block_masked_mm(p[0], p[1], bs, out_mask, lhs_mask, rhs_mask)
            out.append(_multiply_pad_reduce(cot, fwd, pad_m, pad_n, bs))
        elif i == op_idx and has_op:
            out.append(_multiply_pad_reduce(p[0], lhs_grad(), pad_m, pad_k, bs))
        elif i == op_idx + 1 and has_op:
            out.append(_multiply_pad_reduce(p[1], rhs_grad(), pad_k, pad_n, bs))
        else:
            raise ValueError("[BlockMaskedMM] Cannot calculate VJP with respect to masks. Use "
                             "stop_gradient on masks to stop gradients from being computed.")
    return out


defvjp("GatherMM", _gather_mm_vjp)
defvjp("BlockMaskedMM", _block_masked_mm_vjp)

_NO_MLX = "MLX has no {mode} for {name}: raises [Primitive::{low}] Not implemented for {name}."
for _name in ("GatherMM", "BlockMaskedMM", "SegmentedMM"):
    without(_name, jvp=_NO_MLX.format(mode="JVP", low="jvp", name=_name))
without("SegmentedMM", vjp=_NO_MLX.format(mode="VJP", low="vjp", name="SegmentedMM"))
