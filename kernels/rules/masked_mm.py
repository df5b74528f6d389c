"""Rules for MLX's matmul family beyond Matmul / AddMM (``mlx/backend/cpu/masked_mm.cpp``):
``GatherMM`` (a product per pair of gathered matrices), ``BlockMaskedMM`` (blocks of the
operands and of the output masked) and ``SegmentedMM`` (one product per slice of the inner
axis). Half-precision floats multiply-accumulate in float32, as in ``products.py``; MLX's CPU
backend runs GatherMM / BlockMaskedMM in float32 only (its GPU backend takes every float)."""

from __future__ import annotations

from ..primitives import MATMUL, broadcast_shapes, define
from .forms import on_host
from .products import _wide


def _matrices(xp, x, rows: int, cols: int):
    """``x`` (..., rows, cols) as one stack of matrices (a copy when ``x`` is a broadcast view)."""
    return xp.reshape(x, (-1, rows, cols))


def _gathered(xp, stack, indices):
    """``stack[indices]`` over the flattened indices; an index past the end is clipped (MLX
    reads out of bounds there: its docs require indices within the batch)."""
    flat = xp.reshape(indices, (-1,)).astype(xp.int64)
    return stack[xp.clip(flat, 0, stack.shape[0] - 1)]


def _gather_mm_shape(shapes: list, **_) -> list:
    """MLX's ``GatherMM::output_shapes``: the indices' shape, then (M, N) (the indices are
    broadcast again, for compile(shapeless=True) on indices of new shapes)."""
    a, b, lhs, rhs = shapes
    return [broadcast_shapes(tuple(lhs), tuple(rhs)) + (a[-2], b[-1])]


@define("GatherMM", family=MATMUL, shape=_gather_mm_shape)
def gather_mm(xp, a, b, lhs_indices, rhs_indices, *, left_sorted, right_sorted):
    """``out[i] = A[lhs[i]] @ B[rhs[i]]``, A / B the batch-flattened stacks of ``a`` / ``b``;
    the indices are uint32, broadcast to one shape (the output's batch shape)."""
    lhs_indices, rhs_indices = xp.broadcast_arrays(lhs_indices, rhs_indices)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out_shape = tuple(lhs_indices.shape) + (m, n)
    stack_a, stack_b = _matrices(xp, a, m, k), _matrices(xp, b, k, n)
    if lhs_indices.size == 0 or stack_a.shape[0] == 0 or stack_b.shape[0] == 0:
        return xp.zeros(out_shape, dtype=_wide(xp, a).dtype)
    left = _wide(xp, _gathered(xp, stack_a, lhs_indices))
    host = on_host(xp)
    if host or rhs_indices.size > stack_b.shape[0]:
        # one product per distinct matrix of b, read where it lies (MLX's CPU GatherMM
        # multiplies each pair in place, mlx/backend/cpu/masked_mm.cpp): no gathered copy of
        # the matrices (a mixture of experts' weights, each selected expert's whole matrix)
        flat = xp.clip(xp.reshape(rhs_indices, (-1,)).astype(xp.int64), 0, stack_b.shape[0] - 1)
        out = xp.empty((flat.size, m, n), dtype=left.dtype)
        for r in (xp.unique(flat).tolist() if host else range(stack_b.shape[0])):
            sel = xp.nonzero(flat == r)[0]
            if sel.size:
                out[sel] = xp.matmul(left[sel], _wide(xp, stack_b[r]))
        return xp.reshape(out, out_shape)
    out = xp.matmul(left, _wide(xp, _gathered(xp, stack_b, rhs_indices)))
    return xp.reshape(out, out_shape)


def _block_mask(xp, mask, rows: int, cols: int, block_size: int):
    """A (..., ceil(rows / bs), ceil(cols / bs)) block mask as a (..., rows, cols) mask."""
    full = xp.repeat(xp.repeat(mask, block_size, axis=-2), block_size, axis=-1)
    return full[..., :rows, :cols]


def _masked(xp, x, mask, block_size: int):
    """``x`` with each block masked as MLX's ``mask_matrix`` does: a false boolean block is set
    to zero (NaN included), a float block is multiplied by its mask value."""
    full = _block_mask(xp, mask, x.shape[-2], x.shape[-1], block_size)
    if full.dtype == xp.bool_:
        return xp.where(full, x, xp.zeros((), dtype=x.dtype))
    if on_host(xp):  # in x's memory order: a transposed operand stays one, so the BLAS call
        # gets the layout (and gives the bits) of the unmasked product's (the VJP's products)
        return xp.multiply(x, full.astype(x.dtype), order="K")
    return x * full.astype(x.dtype)


@define("BlockMaskedMM", family=MATMUL)
def block_masked_mm(xp, a, b, *masks, block_size):
    """``mask_out * ((mask_lhs * a) @ (mask_rhs * b))`` with each mask a grid of
    ``block_size`` blocks. The inputs are ``a, b[, mask_out][, mask_lhs, mask_rhs]``: three
    inputs carry an output mask, four the operand masks, five both (MLX's order)."""
    has_out = len(masks) in (1, 3)
    x, y = _wide(xp, a), _wide(xp, b)
    if len(masks) >= 2:
        x = _masked(xp, x, masks[-2], block_size)
        y = _masked(xp, y, masks[-1], block_size)
    out = xp.matmul(x, y)
    if has_out:
        out = _masked(xp, out, masks[0], block_size)
    return out


@define("SegmentedMM", family=MATMUL)
def segmented_mm(xp, a, b, segments):
    """One product per segment ``[start, end)`` of the inner axis: ``a[:, start:end] @
    b[start:end, :]`` (zeros when ``end <= start``); ``segments`` is uint32 (..., 2) and the
    output is ``segments.shape[:-1] + (M, N)``."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    seg = xp.reshape(segments, (-1, 2)).astype(xp.int64)
    inner = xp.arange(k, dtype=xp.int64)
    inside = (inner >= seg[:, :1]) & (inner < seg[:, 1:])  # (segments, K)
    x, y = _wide(xp, a), _wide(xp, b)
    zero = xp.zeros((), dtype=x.dtype)
    xs = xp.where(inside[:, None, :], x[None], zero)  # (segments, M, K)
    ys = xp.where(inside[:, :, None], y[None], zero)  # (segments, K, N): no inf * 0 outside
    return xp.reshape(xp.matmul(xs, ys), tuple(segments.shape[:-1]) + (m, n))
