"""The matmul family beyond ``matmul``: ``gather_mm``, ``block_masked_mm`` and
``segmented_mm`` (MLX's ``GatherMM``, ``BlockMaskedMM`` and ``SegmentedMM``; rules in
``kernels/rules/masked_mm.py``). Checks, messages and the graph recorded around each primitive
follow ``gather_mm`` / ``block_masked_mm`` / ``segmented_mm`` in ``mlx/ops.cpp``.

Unlike MLX's CPU backend (float32 only for GatherMM and BlockMaskedMM: "[GatherMM::eval]
Currently only supports float32."), every floating dtype runs, as on MLX's GPU backends.
"""

from __future__ import annotations

from typing import Optional

from .. import dtypes as _dt
from ..array import array
from ..device import BadArgs, StreamOrDevice, binding, resolve_stream
from ..primitive import Primitive
from .convert import broadcast, broadcast_arrays, broadcast_shapes, cast, _fmt_shape
from .products import matmul
from .reduction import op

__all__ = ["gather_mm", "block_masked_mm", "segmented_mm"]

_S = "stream: StreamOrDevice = None) -> array"
_SIG = {
    "gather_mm": "gather_mm(a: array, b: array, /, lhs_indices: array | None = None, "
                 "rhs_indices: array | None = None, *, sorted_indices: bool = False, " + _S,
    "block_masked_mm": "block_masked_mm(a: array, b: array, /, block_size: int = 64, "
                       "mask_out: array | None = None, mask_lhs: array | None = None, "
                       "mask_rhs: array | None = None, *, " + _S,
    "segmented_mm": "segmented_mm(a: array, b: array, /, segments: array, *, " + _S,
}


def _arrays(*xs) -> None:
    if not all(isinstance(x, array) for x in xs):
        raise BadArgs("array")


def _optional_arrays(*xs) -> None:
    _arrays(*(x for x in xs if x is not None))


def _operands(fname: str, a: array, b: array, s) -> tuple[array, array, _dt.Dtype]:
    """MLX's shared prologue: 0-D refused, 1-D promoted to a matrix, inner sizes checked, the
    promoted type a real float; both operands cast to it."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"[{fname}] Got 0 dimension input. Inputs must have at least one "
                         "dimension.")
    if a.ndim == 1:
        a = op("expand_dims")(a, 0, stream=s)
    if b.ndim == 1:
        b = op("expand_dims")(b, 1, stream=s)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"[{fname}] Last dimension of first input with shape "
                         f"{_fmt_shape(a.shape)} must match second to last dimension of second "
                         f"input with shape {_fmt_shape(b.shape)}.")
    out_type = _dt.promote_types(a.dtype, b.dtype)
    _real_float(fname, out_type, a, b)
    return cast(a, out_type, s), cast(b, out_type, s), out_type


def _real_float(fname: str, out_type: _dt.Dtype, a: array, b: array) -> None:
    if not _dt.is_floating(out_type):
        raise ValueError(f"[{fname}] Only real floating point types are supported but "
                         f"{a.dtype.name} and {b.dtype.name} were provided which results in "
                         f"{out_type.name}, which is not a real floating point type.")


def _squeeze_promoted(out: array, a_ndim: int, b_ndim: int, s) -> array:
    axes = ([out.ndim - 2] if a_ndim == 1 else []) + ([out.ndim - 1] if b_ndim == 1 else [])
    return op("squeeze")(out, axes, stream=s) if axes else out


def _indices_or_default(fname: str, indices: Optional[array], x: array, s) -> array:
    """The given indices as uint32, or every matrix of ``x`` in order (``indices_or_default``
    in mlx/ops.cpp)."""
    if x.ndim < 2:
        raise ValueError(f"{fname} Input must have at least two dimensions but got input with "
                         f"shape {_fmt_shape(x.shape)}.")
    if indices is not None:
        if not _dt.is_integer(indices.dtype):
            raise ValueError(f"{fname} Got indices with invalid dtype. Indices must be "
                             "integral.")
        return cast(indices, _dt.uint32, s)
    batch = x.shape[:-2]
    total = 1
    for n in batch:
        total *= n
    return op("reshape")(op("arange")(total, dtype=_dt.uint32, stream=s), batch, stream=s)


@binding(_SIG["gather_mm"])
def gather_mm(a: array, b: array, /, lhs_indices: Optional[array] = None,
              rhs_indices: Optional[array] = None, *, sorted_indices: bool = False,
              stream: StreamOrDevice = None) -> array:
    """Matrix multiplication with matrix-level gather: ``A[lhs_indices] @ B[rhs_indices]``
    over the flattened batch axes of ``a`` and ``b`` (every matrix in order where an index
    array is not given; a plain ``matmul`` when neither is)."""
    _arrays(a, b)
    _optional_arrays(lhs_indices, rhs_indices)
    if not isinstance(sorted_indices, bool):
        raise BadArgs("sorted_indices")
    if lhs_indices is None and rhs_indices is None:
        return matmul(a, b, stream=stream)
    s = resolve_stream(stream)
    a_ndim, b_ndim = a.ndim, b.ndim
    x, y, out_type = _operands("gather_mm", a, b, s)
    lhs = _indices_or_default("[gather_mm]", lhs_indices, x, s)
    rhs = _indices_or_default("[gather_mm]", rhs_indices, y, s)
    lhs, rhs = broadcast_arrays(lhs, rhs, stream=s)
    prim = Primitive("GatherMM", s, left_sorted=bool(sorted_indices and rhs_indices is None),
                     right_sorted=bool(sorted_indices and lhs_indices is None))
    out = array._make1(tuple(lhs.shape) + (x.shape[-2], y.shape[-1]), out_type, prim,
                       [x, y, lhs, rhs])
    return _squeeze_promoted(out, a_ndim, b_ndim, s)


def _int_arg(v) -> int:
    if isinstance(v, float) or isinstance(v, array):
        raise BadArgs("block_size")
    try:
        return int(v.__index__())
    except (AttributeError, TypeError):
        raise BadArgs("block_size") from None


@binding(_SIG["block_masked_mm"])
def block_masked_mm(a: array, b: array, /, block_size: int = 64,
                    mask_out: Optional[array] = None, mask_lhs: Optional[array] = None,
                    mask_rhs: Optional[array] = None, *, stream: StreamOrDevice = None) -> array:
    """Matrix multiplication with blocks of ``block_size x block_size`` (32 or 64) of the
    output (``mask_out``) and of the operands (``mask_lhs``, ``mask_rhs``) masked: a boolean
    mask zeroes a block, a float mask scales it."""
    _arrays(a, b)
    block_size = _int_arg(block_size)
    _optional_arrays(mask_out, mask_lhs, mask_rhs)
    if mask_out is None and mask_lhs is None and mask_rhs is None:
        return matmul(a, b, stream=stream)
    if block_size not in (32, 64):
        raise ValueError("[block_masked_mm] Only block_sizes 32, 64 are supported."
                         f"Got block size {block_size}.")
    s = resolve_stream(stream)
    a_ndim, b_ndim = a.ndim, b.ndim
    x, y, out_type = _operands("block_masked_mm", a, b, s)
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2])
    m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
    x = broadcast(x, batch + (m, k), stream=s)
    y = broadcast(y, batch + (k, n), stream=s)
    tm, tn, tk = (-(-m // block_size), -(-n // block_size), -(-k // block_size))

    def grid(mask: array, rows: int, cols: int, dtype: _dt.Dtype) -> array:
        return broadcast(cast(mask, dtype, s), batch + (rows, cols), stream=s)

    inputs = [x, y]
    if mask_out is not None:
        mo = mask_out
        ex = ([-2] if a_ndim == 1 else []) + ([-1] if b_ndim == 1 else [])
        if ex:
            mo = op("expand_dims")(mo, ex, stream=s)
        inputs.append(grid(mo, tm, tn, _dt.bool_ if mo.dtype == _dt.bool_ else out_type))
    if mask_lhs is not None or mask_rhs is not None:
        ml = mask_lhs if mask_lhs is not None else array([True])
        mr = mask_rhs if mask_rhs is not None else array([True])
        dtype = _dt.bool_ if ml.dtype == _dt.bool_ and mr.dtype == _dt.bool_ else out_type
        if a_ndim == 1:
            ml = op("expand_dims")(ml, -2, stream=s)
        inputs.append(grid(ml, tm, tk, dtype))
        if b_ndim == 1:
            mr = op("expand_dims")(mr, -1, stream=s)
        inputs.append(grid(mr, tk, tn, dtype))
    prim = Primitive("BlockMaskedMM", s, block_size=block_size)
    out = array._make1(batch + (m, n), out_type, prim, inputs)
    return _squeeze_promoted(out, a_ndim, b_ndim, s)


@binding(_SIG["segmented_mm"])
def segmented_mm(a: array, b: array, /, segments: array, *,
                 stream: StreamOrDevice = None) -> array:
    """One matrix product per segment ``[start, end)`` of the inner dimension:
    ``a[:, start:end] @ b[start:end, :]`` for ``a`` (M, K), ``b`` (K, N) and ``segments``
    (..., 2); the result is ``segments.shape[:-1] + (M, N)``."""
    _arrays(a, b, segments)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError("[segmented_mm] Batched matmul not supported")
    if segments.ndim < 1 or segments.shape[-1] != 2:
        raise ValueError("[segmented_mm] The segments should have shape (..., 2) but "
                         f"{_fmt_shape(segments.shape)} was provided.")
    out_type = _dt.promote_types(a.dtype, b.dtype)
    _real_float("segmented_mm", out_type, a, b)
    if not _dt.is_integer(segments.dtype):
        raise ValueError("[segmented_mm] Got segments with invalid dtype. Segments must be "
                         "integral.")
    s = resolve_stream(stream)
    x, y = cast(a, out_type, s), cast(b, out_type, s)
    seg = cast(segments, _dt.uint32, s)
    shape = tuple(segments.shape[:-1]) + (a.shape[0], b.shape[1])
    return array._make1(shape, out_type, Primitive("SegmentedMM", s), [x, y, seg])
