"""``mx.linalg``: factorizations as MLX primitives (Inverse, Cholesky, QRF, SVD, Eigh, Eig, LUF)
and the composite routines MLX builds from them (norm, solve, pinv, lu, cross, ...).

As in MLX these run on the CPU: a GPU stream is refused with MLX's message.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

from . import dtypes as _dt
from .array import array
from .device import DeviceType, StreamOrDevice, resolve_stream
from .ops.convert import broadcast_shapes, cast, to_array
from .primitive import Primitive

__all__ = ["norm", "inv", "tri_inv", "cholesky", "cholesky_inv", "qr", "svd", "eigh",
           "eigvalsh", "eig", "eigvals", "pinv", "solve", "solve_triangular", "lu",
           "lu_factor", "cross"]


_INF = math.inf


def _ops():
    """The op namespace, imported at call time (other op families land independently)."""
    from . import ops

    return ops


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(int(s)) for s in shape) + ")"


def _cpu_stream(stream: StreamOrDevice, op: str):
    """The stream to run on; MLX refuses GPU streams for these ops."""
    s = resolve_stream(stream)
    if s.device.type == DeviceType.gpu:
        raise ValueError(f"[linalg::{op}] This op is not yet supported on the GPU. "
                         "Explicitly pass a CPU stream to run it.")
    return s


def _check_matrix(a: array, op: str, complex_ok: bool = False, square: Optional[str] = None,
                  ndim_msg: str = "Arrays must have") -> None:
    """MLX's dtype / ndim / squareness checks for the factorizations."""
    if a.ndim < 2:
        raise ValueError(f"[linalg::{op}] {ndim_msg} >= 2 dimensions. Received array with "
                         f"{a.ndim} dimensions.")
    ok = (_dt.float32, _dt.float64) + ((_dt.complex64,) if complex_ok else ())
    if a.dtype not in ok:
        kinds = "float32, float64 or complex64" if complex_ok else "float32 or float64"
        raise ValueError(f"[linalg::{op}] Arrays must have type {kinds}. Received array with "
                         f"type {a.dtype.name}.")
    if square is not None and a.shape[-1] != a.shape[-2]:
        raise ValueError(f"[linalg::{op}] {square}")


def _make(name: str, shapes, dtypes, s, inputs, **params) -> list:
    return array._make(shapes, dtypes, Primitive(name, s, **params), inputs)


def _real(d: _dt.Dtype) -> _dt.Dtype:
    return _dt.float32 if d == _dt.complex64 else d


def inv(a: array, *, stream: StreamOrDevice = None) -> array:
    """Inverse of a square matrix (batched over leading axes)."""
    s = _cpu_stream(stream, "inv")
    a = to_array(a)
    _check_matrix(a, "inv", square="Inverses are only defined for square matrices.")
    return _make("Inverse", [a.shape], [a.dtype], s, [a], tri=False, upper=False)[0]


def tri_inv(a: array, upper: bool = False, *, stream: StreamOrDevice = None) -> array:
    """Inverse of a triangular matrix (only the lower, or ``upper``, triangle is read)."""
    s = _cpu_stream(stream, "inv")
    a = to_array(a)
    _check_matrix(a, "inv", square="Inverses are only defined for square matrices.")
    return _make("Inverse", [a.shape], [a.dtype], s, [a], tri=True, upper=bool(upper))[0]


def cholesky(a: array, upper: bool = False, *, stream: StreamOrDevice = None) -> array:
    """Cholesky factor of a symmetric positive-definite matrix (lower, or upper U with A = U^T U)."""
    s = _cpu_stream(stream, "cholesky")
    a = to_array(a)
    _check_matrix(a, "cholesky",
                  square="Cholesky decomposition is only defined for square matrices.")
    return _make("Cholesky", [a.shape], [a.dtype], s, [a], upper=bool(upper))[0]


def cholesky_inv(a: array, upper: bool = False, *, stream: StreamOrDevice = None) -> array:
    """Inverse of ``A`` given its Cholesky factor ``a`` (lower L, or upper U)."""
    ops = _ops()
    s = _cpu_stream(stream, "cholesky_inv")
    a = to_array(a)
    _check_matrix(a, "cholesky_inv", square="Cholesky inverse is only defined for square matrices.")
    l_inv = tri_inv(a, upper, stream=s)
    t = ops.swapaxes(l_inv, -1, -2, stream=s)
    return ops.matmul(l_inv, t, stream=s) if upper else ops.matmul(t, l_inv, stream=s)


def qr(a: array, *, stream: StreamOrDevice = None) -> tuple:
    """Reduced QR factorization: Q (..., M, K), R (..., K, N), K = min(M, N)."""
    s = _cpu_stream(stream, "qr")
    a = to_array(a)
    _check_matrix(a, "qr")
    m, n = a.shape[-2:]
    k = min(m, n)
    b = a.shape[:-2]
    q, r = _make("QRF", [b + (m, k), b + (k, n)], [a.dtype, a.dtype], s, [a])
    return q, r


def svd(a: array, compute_uv: bool = True, *, stream: StreamOrDevice = None):
    """Singular value decomposition: ``(U, S, Vt)``, or ``S`` alone without ``compute_uv``."""
    s = _cpu_stream(stream, "svd")
    a = to_array(a)
    _check_matrix(a, "svd", complex_ok=True, ndim_msg="Input array must have")
    m, n = a.shape[-2:]
    b = a.shape[:-2]
    sv_shape, sv_dtype = b + (min(m, n),), _real(a.dtype)
    if not compute_uv:
        return _make("SVD", [sv_shape], [sv_dtype], s, [a], compute_uv=False)[0]
    u, sv, vt = _make("SVD", [b + (m, m), sv_shape, b + (n, n)], [a.dtype, sv_dtype, a.dtype], s,
                      [a], compute_uv=True)
    return u, sv, vt


def _check_uplo(uplo: str, op: str) -> str:
    if not isinstance(uplo, str) or len(uplo) != 1:
        raise ValueError(f"[linalg::{op}] UPLO must be 'L' or 'U'.")
    return "U" if uplo.upper() == "U" else "L"


def eigh(a: array, UPLO: str = "L", *, stream: StreamOrDevice = None) -> tuple:
    """Eigenvalues (ascending) and eigenvectors of a Hermitian matrix, read from triangle UPLO."""
    s = _cpu_stream(stream, "eigh")
    a = to_array(a)
    _check_matrix(a, "eigh", complex_ok=True, square="Only defined for square matrices.")
    uplo = _check_uplo(UPLO, "eigh")
    w, v = _make("Eigh", [a.shape[:-1], a.shape], [_real(a.dtype), a.dtype], s, [a],
                 uplo=uplo, compute_eigenvectors=True)
    return w, v


def eigvalsh(a: array, UPLO: str = "L", *, stream: StreamOrDevice = None) -> array:
    """Eigenvalues (ascending) of a Hermitian matrix."""
    s = _cpu_stream(stream, "eigvalsh")
    a = to_array(a)
    _check_matrix(a, "eigvalsh", complex_ok=True, square="Only defined for square matrices.")
    uplo = _check_uplo(UPLO, "eigvalsh")
    return _make("Eigh", [a.shape[:-1]], [_real(a.dtype)], s, [a], uplo=uplo,
                 compute_eigenvectors=False)[0]


def eig(a: array, *, stream: StreamOrDevice = None) -> tuple:
    """Eigenvalues and right eigenvectors of a general square matrix (complex64)."""
    s = _cpu_stream(stream, "eig")
    a = to_array(a)
    _check_matrix(a, "eig", complex_ok=True, square="Only defined for square matrices.")
    w, v = _make("Eig", [a.shape[:-1], a.shape], [_dt.complex64, _dt.complex64], s, [a],
                 compute_eigenvectors=True)
    return w, v


def eigvals(a: array, *, stream: StreamOrDevice = None) -> array:
    """Eigenvalues of a general square matrix (complex64)."""
    s = _cpu_stream(stream, "eigvals")
    a = to_array(a)
    _check_matrix(a, "eigvals", complex_ok=True, square="Only defined for square matrices.")
    return _make("Eig", [a.shape[:-1]], [_dt.complex64], s, [a], compute_eigenvectors=False)[0]


def _luf(a: array, s) -> list:
    m, n = a.shape[-2:]
    b = a.shape[:-2]
    return _make("LUF", [a.shape, b + (min(m, n),), b + (m,)], [a.dtype, _dt.uint32, _dt.uint32],
                 s, [a])


def lu_factor(a: array, *, stream: StreamOrDevice = None) -> tuple:
    """Packed LU factorization and LAPACK-style (0-based) pivot indices."""
    s = _cpu_stream(stream, "lu_factor")
    a = to_array(a)
    _check_matrix(a, "lu_factor")
    lu_, piv, _ = _luf(a, s)
    return lu_, piv


def lu(a: array, *, stream: StreamOrDevice = None) -> tuple:
    """LU factorization ``(P, L, U)`` with row permutation P such that ``A = L[P] @ U``."""
    ops = _ops()
    s = _cpu_stream(stream, "lu")
    a = to_array(a)
    _check_matrix(a, "lu")
    m, n = a.shape[-2:]
    k = min(m, n)
    packed, _, perm = _luf(a, s)
    idx = [slice(None)] * (a.ndim - 2)
    l_part = packed[tuple(idx + [slice(None), slice(0, k)])]
    u_part = packed[tuple(idx + [slice(0, k), slice(None)])]
    l_mat = ops.add(ops.tril(l_part, -1, stream=s), ops.eye(m, k, dtype=a.dtype, stream=s), stream=s)
    u_mat = ops.triu(u_part, 0, stream=s)
    # perm lists which row of A each row of L @ U is; P is its inverse, A = (L @ U)[P].
    p_inv = ops.argsort(perm, axis=-1, stream=s)
    return cast(p_inv, _dt.uint32, s), l_mat, u_mat


def _check_solve(a: array, b: array, op: str) -> _dt.Dtype:
    if a.ndim < 2:
        raise ValueError(f"[linalg::{op}] First input must have >= 2 dimensions. Received array "
                         f"with {a.ndim} dimensions.")
    if b.ndim < 1:
        raise ValueError(f"[linalg::{op}] Second input must have >= 1 dimensions. Received array "
                         f"with {b.ndim} dimensions.")
    if a.shape[-1] != a.shape[-2]:
        raise ValueError(f"[linalg::{op}] First input must be a square matrix. Received array "
                         f"with shape {_fmt_shape(a.shape)}.")
    rows = b.shape[-1] if b.ndim == 1 else b.shape[-2]
    if a.shape[-1] != rows:
        raise ValueError(f"[linalg::{op}] Last dimension of first input with shape "
                         f"{_fmt_shape(a.shape)} must match second to last dimension of second "
                         f"input with shape {_fmt_shape(b.shape)}.")
    dt = _dt.promote_types(a.dtype, b.dtype)
    if dt not in (_dt.float32, _dt.float64):
        raise ValueError(f"[linalg::{op}] Input arrays must promote to float32 or float64.  "
                         f"Received arrays with type {a.dtype.name} and {b.dtype.name}.")
    return dt


def solve_triangular(a: array, b: array, *, upper: bool = False,
                     stream: StreamOrDevice = None) -> array:
    """Solve ``a @ x = b`` for triangular ``a`` (lower, or ``upper``)."""
    ops = _ops()
    s = _cpu_stream(stream, "solve_triangular")
    a, b = to_array(a), to_array(b)
    dt = _check_solve(a, b, "solve_triangular")
    a_inv = tri_inv(cast(a, dt, s), upper, stream=s)
    return ops.matmul(a_inv, cast(b, dt, s), stream=s)


def solve(a: array, b: array, *, stream: StreamOrDevice = None) -> array:
    """Solve the square system ``a @ x = b`` through an LU factorization."""
    ops = _ops()
    s = _cpu_stream(stream, "solve")
    a, b = to_array(a), to_array(b)
    dt = _check_solve(a, b, "solve")
    a, b = cast(a, dt, s), cast(b, dt, s)
    vector = b.ndim == 1
    if vector:
        b = ops.expand_dims(b, -1, stream=s)
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = ops.broadcast_to(a, batch + a.shape[-2:], stream=s)
    b = ops.broadcast_to(b, batch + b.shape[-2:], stream=s)
    n = a.shape[-1]
    packed, _, perm = _luf(a, s)
    pb = ops.take_along_axis(b, ops.expand_dims(perm, -1, stream=s), -2, stream=s)
    l_mat = ops.add(ops.tril(packed, -1, stream=s), ops.eye(n, dtype=dt, stream=s), stream=s)
    y = ops.matmul(tri_inv(l_mat, False, stream=s), pb, stream=s)
    x = ops.matmul(tri_inv(packed, True, stream=s), y, stream=s)
    return ops.squeeze(x, -1, stream=s) if vector else x


def pinv(a: array, *, stream: StreamOrDevice = None) -> array:
    """Moore-Penrose pseudo-inverse through the SVD (small singular values are dropped)."""
    ops = _ops()
    s = _cpu_stream(stream, "pinv")
    a = to_array(a)
    _check_matrix(a, "pinv")
    m, n = a.shape[-2:]
    k = min(m, n)
    if k == 0:  # as MLX: the (n, m) pseudo-inverse of an empty matrix is empty
        return ops.zeros(a.shape[:-2] + (n, m), a.dtype, stream=s)
    u, sv, vt = svd(a, True, stream=s)
    idx = [slice(None)] * (a.ndim - 2)
    u = u[tuple(idx + [slice(None), slice(0, k)])]
    vt = vt[tuple(idx + [slice(0, k), slice(None)])]
    # Cut-off as numpy / MLX: rcond = max(m, n) * eps, relative to the largest singular value.
    rcond = max(m, n) * _dt.finfo(a.dtype).eps
    cutoff = ops.expand_dims(ops.multiply(ops.max(sv, -1, False, stream=s), array(rcond, a.dtype),
                                          stream=s), -1, stream=s)
    keep = ops.greater(sv, cutoff, stream=s)
    inv_s = ops.where(keep, ops.reciprocal(sv, stream=s), array(0.0, a.dtype), stream=s)
    vs = ops.multiply(ops.swapaxes(vt, -1, -2, stream=s), ops.expand_dims(inv_s, -2, stream=s),
                      stream=s)
    return ops.matmul(vs, ops.swapaxes(u, -1, -2, stream=s), stream=s)


def _norm_axes(axis, ndim: int) -> list:
    if axis is None:
        return list(range(ndim))
    if isinstance(axis, int):
        return [axis]
    return [int(x) for x in axis]


def _at_least_float(d: _dt.Dtype) -> _dt.Dtype:
    return d if _dt.is_inexact(d) else _dt.promote_types(d, _dt.float32)


def _l2(a: array, axes: list, keepdims: bool, s) -> array:
    ops = _ops()
    if a.dtype == _dt.complex64:
        m = ops.abs(a, stream=s)
        return ops.sqrt(ops.sum(ops.multiply(m, m, stream=s), axes, keepdims, stream=s), stream=s)
    return ops.sqrt(ops.sum(ops.square(a, stream=s), axes, keepdims, stream=s), stream=s)


def _check_axes(axes: list, ndim: int) -> None:
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise IndexError(f"Invalid axis {ax} for array with {ndim} dimensions.")


def _vector_norm(a: array, ord: float, axes: list, keepdims: bool, s) -> array:
    ops = _ops()
    dt = _at_least_float(a.dtype)
    if ord == 0.0:
        nz = ops.not_equal(a, array(0, a.dtype), stream=s)
        return cast(ops.sum(nz, axes, keepdims, stream=s), dt, s)
    if ord == 1.0:
        return cast(ops.sum(ops.abs(a, stream=s), axes, keepdims, stream=s), dt, s)
    if ord == 2.0:
        return _l2(a, axes, keepdims, s)
    if ord == _INF:
        return cast(ops.max(ops.abs(a, stream=s), axes, keepdims, stream=s), dt, s)
    if ord == -_INF:
        return cast(ops.min(ops.abs(a, stream=s), axes, keepdims, stream=s), dt, s)
    p = ops.power(ops.abs(a, stream=s), array(ord, dt), stream=s)
    return ops.power(ops.sum(p, axes, keepdims, stream=s), array(1.0 / ord, dt), stream=s)


def _fmt_ord(ord: float) -> str:
    return str(int(ord)) if float(ord).is_integer() else f"{ord:g}"


def _matrix_norm(a: array, ord, axes: list, keepdims: bool, s) -> array:
    ops = _ops()
    dt = _at_least_float(a.dtype)
    row, col = (ax + a.ndim if ax < 0 else ax for ax in axes)  # MLX normalises them first
    if isinstance(ord, str):
        if ord in ("f", "fro"):
            return _l2(a, axes, keepdims, s)
        if ord != "nuc":
            raise ValueError(f"[linalg::norm] Invalid ord value '{ord}' for matrix norm.")
    elif ord in (1.0, -1.0):
        col -= (not keepdims and col > row and col > 0)
        red = ops.max if ord == 1.0 else ops.min
        return cast(red(ops.sum(ops.abs(a, stream=s), row, keepdims, stream=s), col, keepdims,
                          stream=s), dt, s)
    elif ord in (_INF, -_INF):
        row -= (not keepdims and row > col and row > 0)
        red = ops.max if ord == _INF else ops.min
        return cast(red(ops.sum(ops.abs(a, stream=s), col, keepdims, stream=s), row, keepdims,
                          stream=s), dt, s)
    elif ord not in (2.0, -2.0):
        raise ValueError(f"[linalg::norm] Invalid ord {_fmt_ord(ord)} for matrix norm.")
    # Singular-value norms: move the two axes last, then reduce the singular values.
    nd = a.ndim
    r, c = row % nd, col % nd
    m = ops.moveaxis(ops.moveaxis(a, r, -1, stream=s), c if c < r else c - 1, -1, stream=s) \
        if r > c else ops.moveaxis(ops.moveaxis(a, c, -1, stream=s), r, -2, stream=s)
    sv = svd(m, False, stream=s)
    if ord == "nuc":
        out = ops.sum(sv, -1, False, stream=s)
    else:
        out = (ops.max if ord == 2.0 else ops.min)(sv, -1, False, stream=s)
    if keepdims:
        out = ops.expand_dims(out, sorted((r, c)), stream=s)
    return out if ord == "nuc" else cast(out, dt, s)  # as MLX (mlx/linalg.cpp): only ord 2 casts


def norm(a: array, /, ord: Union[None, int, float, str] = None,
         axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False, *,
         stream: StreamOrDevice = None) -> array:
    """Vector or matrix norm (MLX's ``ord`` / ``axis`` forms)."""
    ops = _ops()
    s = resolve_stream(stream)
    a = to_array(a)
    if ord is None:
        if axis is None:
            return _l2(ops.flatten(a, stream=s), [0], keepdims, s) if not keepdims else \
                ops.reshape(_l2(ops.flatten(a, stream=s), [0], False, s), (1,) * a.ndim, stream=s)
        axes = _norm_axes(axis, a.ndim)
        if len(axes) > 2:
            raise ValueError("[linalg::norm] Received too many axes for norm.")
        _check_axes(axes, a.ndim)
        return _l2(a, axes, keepdims, s)
    axes = _norm_axes(axis, a.ndim)
    if isinstance(ord, str):
        if len(axes) != 2:
            raise ValueError(f"[linalg::norm] Norm '{ord}' only supported for matrices, but "
                             f"received {len(axes)} axis/axes.")
        _check_axes(axes, a.ndim)
        return _matrix_norm(a, ord, axes, keepdims, s)
    ord = float(ord)
    if len(axes) == 1:
        _check_axes(axes, a.ndim)
        return _vector_norm(a, ord, axes, keepdims, s)
    if len(axes) == 2:
        if ord not in (1.0, -1.0, 2.0, -2.0, _INF, -_INF):  # MLX checks ord before the axes
            raise ValueError(f"[linalg::norm] Invalid ord {_fmt_ord(ord)} for matrix norm.")
        _check_axes(axes, a.ndim)
        return _matrix_norm(a, ord, axes, keepdims, s)
    raise ValueError("[linalg::norm] Received too many axes for norm.")


def cross(a: array, b: array, axis: int = -1, *, stream: StreamOrDevice = None) -> array:
    """Cross product of 3-vectors (2-vectors are padded with a zero z) along ``axis``."""
    ops = _ops()
    s = resolve_stream(stream)
    a, b = to_array(a), to_array(b)
    for x in (a, b):
        if not -x.ndim <= axis < x.ndim:
            raise IndexError(f"[linalg::cross] Axis {axis} is out of bounds for array with "
                             f"{x.ndim} dimensions.")
    ax_a, ax_b = axis % a.ndim, axis % b.ndim
    if a.shape[ax_a] not in (2, 3) or b.shape[ax_b] not in (2, 3):
        raise ValueError("[linalg::cross] The specified axis must have size 2 or 3.")
    sa = a.shape[:ax_a] + (3,) + a.shape[ax_a + 1:]
    sb = b.shape[:ax_b] + (3,) + b.shape[ax_b + 1:]
    out_shape = broadcast_shapes(sa, sb)
    dt = _dt.promote_types(a.dtype, b.dtype)
    a, b = cast(a, dt, s), cast(b, dt, s)
    ax = axis % len(out_shape)

    def comps(x: array, xa: int) -> list:
        parts = ops.split(x, x.shape[xa], xa, stream=s)
        if len(parts) == 2:
            parts.append(ops.zeros_like(parts[0], stream=s))
        return parts

    a1, a2, a3 = comps(a, ax_a)
    b1, b2, b3 = comps(b, ax_b)
    mul, sub = ops.multiply, ops.subtract
    c1 = sub(mul(a2, b3, stream=s), mul(a3, b2, stream=s), stream=s)
    c2 = sub(mul(a3, b1, stream=s), mul(a1, b3, stream=s), stream=s)
    c3 = sub(mul(a1, b2, stream=s), mul(a2, b1, stream=s), stream=s)
    out = ops.concatenate([c1, c2, c3], ax, stream=s)
    return ops.broadcast_to(out, out_shape, stream=s)


# -- det / slogdet (appended by the MLX-surface gap filler) ----------------------------------
__all__ += ["det", "slogdet"]


def _det_input(a: array, op: str) -> array:
    """MLX's checks for det / slogdet (complex, then ndim, then square); ints become float32."""
    if not isinstance(a, array):
        raise TypeError(f"{op}(): incompatible function arguments. The following argument types "
                        f"are supported:\n    1. {op}(a: array, *, stream: StreamOrDevice = None) "
                        f"-> {'array' if op == 'det' else 'tuple[array, array]'}\n\n"
                        f"Invoked with types: {type(a).__name__}")
    if a.dtype == _dt.complex64:
        raise ValueError(f"[linalg::{op}] Complex inputs are not supported.")
    if a.ndim < 2:
        raise ValueError(f"[linalg::{op}] Arrays must have >= 2 dimensions. Received array with "
                         f"{a.ndim} dimensions.")
    if a.shape[-1] != a.shape[-2]:
        raise ValueError(f"[linalg::{op}] Only defined for square matrices.")
    return a if _dt.is_inexact(a.dtype) else cast(a, _dt.float32)


def _det_small(a: array, s) -> array:
    """det of matrices up to 3 x 3 by cofactor expansion, recording MLX's Slice/Squeeze nodes."""
    ops = _ops()
    n = a.shape[-1]
    batch = a.shape[:-2]
    if n == 0:
        one = array(1.0, a.dtype)
        return ops.broadcast_to(one, batch, stream=s) if batch else one
    cache: dict = {}

    def e(i: int, j: int) -> array:
        if (i, j) not in cache:
            cache[(i, j)] = _elem(a, i, j, s)
        return cache[(i, j)]

    mul, sub = ops.multiply, ops.subtract
    if n == 1:
        return e(0, 0)
    if n == 2:
        return sub(mul(e(0, 0), e(1, 1), stream=s), mul(e(0, 1), e(1, 0), stream=s), stream=s)
    a00 = e(0, 0)
    c0 = sub(mul(e(1, 1), e(2, 2), stream=s), mul(e(1, 2), e(2, 1), stream=s), stream=s)
    t0 = mul(a00, c0, stream=s)
    c1 = sub(mul(e(1, 0), e(2, 2), stream=s), mul(e(1, 2), e(2, 0), stream=s), stream=s)
    t1 = sub(t0, mul(e(0, 1), c1, stream=s), stream=s)
    c2 = sub(mul(e(1, 0), e(2, 1), stream=s), mul(e(1, 1), e(2, 0), stream=s), stream=s)
    return ops.add(t1, mul(e(0, 2), c2, stream=s), stream=s)


def _elem(a: array, i: int, j: int, s) -> array:
    """``a[..., i, j]`` as MLX takes it: a Slice of the 1 x 1 window, then two Squeezes."""
    from .ops.indexing import _slice

    nb = a.ndim - 2
    x = _slice(a, (0,) * nb + (i, j), a.shape[:-2] + (i + 1, j + 1), (1,) * a.ndim, s)
    ops = _ops()
    return ops.squeeze(ops.squeeze(x, -1, stream=s), -1, stream=s)


def _slogdet_lu(a: array, s) -> tuple:
    """sign and log|det| from the LU factorization (MLX's graph for n >= 4)."""
    ops = _ops()
    _check_matrix(a, "lu_factor")
    n = a.shape[-1]
    lu_, piv, _ = _luf(a, s)
    diag = ops.diagonal(lu_, 0, -2, -1, stream=s)
    singular = ops.any(ops.equal(diag, array(0, a.dtype), stream=s), -1, stream=s)
    swaps = ops.sum(ops.not_equal(piv, ops.arange(0, n, dtype=_dt.uint32, stream=s), stream=s),
                    -1, stream=s)
    negs = ops.sum(ops.less(diag, array(0, a.dtype), stream=s), -1, stream=s)
    parity = ops.remainder(ops.add(swaps, negs, stream=s), array(2), stream=s)
    sign = ops.subtract(array(1), ops.multiply(array(2), parity, stream=s), stream=s)
    sign = ops.where(singular, array(0, a.dtype), cast(sign, a.dtype, s), stream=s)
    logabs = ops.sum(ops.log(ops.abs(diag, stream=s), stream=s), -1, stream=s)
    logabs = ops.where(singular, array(-_INF, a.dtype), logabs, stream=s)
    return sign, logabs


def det(a: array, *, stream: StreamOrDevice = None) -> array:
    """The determinant of each matrix in the last two axes (closed form up to 3 x 3, else LU)."""
    a = _det_input(a, "det")
    if a.shape[-1] <= 3:
        return _det_small(a, resolve_stream(stream))
    s = _cpu_stream(stream, "lu_factor")
    sign, logabs = _slogdet_lu(a, s)
    ops = _ops()
    return ops.multiply(sign, ops.exp(logabs, stream=s), stream=s)


def slogdet(a: array, *, stream: StreamOrDevice = None) -> tuple:
    """``(sign, log|det|)`` of each matrix in the last two axes; singular gives (0, -inf)."""
    a = _det_input(a, "slogdet")
    if a.shape[-1] <= 3:
        s = resolve_stream(stream)
        d = _det_small(a, s)
        ops = _ops()
        return ops.sign(d, stream=s), ops.log(ops.abs(d, stream=s), stream=s)
    return _slogdet_lu(a, _cpu_stream(stream, "lu_factor"))
