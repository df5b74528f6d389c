"""Rules for linear-algebra primitives (MLX names): Inverse, Cholesky, QRF, SVD, Eigh, Eig, LUF.

Each works on a batch of matrices in the last two axes and uses only ``xp.linalg``
functions that numpy and cupy share, plus a batched partial-pivoting LU written with
array ops (neither numpy nor cupy has ``linalg.lu``).
"""

from __future__ import annotations

from ..primitives import LINALG, define
from .forms import sequential


def lu_batched(xp, a):
    """Partial-pivoting LU of ``a`` (..., M, N), as LAPACK's getrf.

    Returns ``(lu, pivots, perm, info)``: the packed factors (unit-lower L below the
    diagonal, U on and above it), the 0-based row swapped with each row (getrf's ipiv - 1),
    the resulting row permutation (``a[perm] == L @ U``) and, per matrix, the 1-based index
    of the first exactly-zero pivot (0 when there is none).
    """
    lu = xp.array(a, copy=True)
    m, n = lu.shape[-2], lu.shape[-1]
    batch = lu.shape[:-2]
    k = min(m, n)
    lu = lu.reshape((-1, m, n))
    nb = lu.shape[0]
    rows = xp.arange(nb)
    pivots = xp.zeros((nb, k), dtype=xp.int64)
    perm = xp.broadcast_to(xp.arange(m), (nb, m)).copy()
    info = xp.zeros((nb,), dtype=xp.int64)
    for j in range(k):
        p = j + xp.argmax(xp.abs(lu[:, j:, j]), axis=1)
        pivots[:, j] = p
        rj, rp = lu[rows, j, :].copy(), lu[rows, p, :].copy()
        lu[rows, j, :], lu[rows, p, :] = rp, rj
        pj, pp = perm[rows, j].copy(), perm[rows, p].copy()
        perm[rows, j], perm[rows, p] = pp, pj
        piv = lu[:, j, j]
        zero = piv == 0
        info = xp.where((info == 0) & zero, j + 1, info)
        safe = xp.where(zero, 1, piv)
        if j + 1 < m:
            factors = xp.where(zero[:, None], 0, lu[:, j + 1:, j] / safe[:, None])
            lu[:, j + 1:, j] = factors
            lu[:, j + 1:, j + 1:] -= factors[:, :, None] * lu[:, j:j + 1, j + 1:]
    return (lu.reshape(batch + (m, n)), pivots.reshape(batch + (k,)),
            perm.reshape(batch + (m,)), info.reshape(batch))


@define("Inverse", family=LINALG)
def inverse(xp, a, *, tri=False, upper=False):
    """Matrix inverse; with ``tri`` only the lower (or ``upper``) triangle of ``a`` is read."""
    if a.shape[-1] == 0:
        return xp.array(a, copy=True)
    if tri:
        a = xp.triu(a) if upper else xp.tril(a)
    _, _, _, info = lu_batched(xp, a)
    bad = info.reshape(-1)
    if bad.size and int(bad.max()) > 0:
        code = int(bad[bad > 0][0])
        raise RuntimeError(f"[Inverse::eval_cpu] LU factorization failed with error code {code}")
    out = xp.linalg.inv(a)
    if tri:
        out = xp.triu(out) if upper else xp.tril(out)
    return out


@define("Cholesky", family=LINALG)
def cholesky(xp, a, *, upper=False):
    """Cholesky factor from the lower triangle (``upper``: U with a = U^T U, from the upper
    triangle, as MLX's LAPACK call reads it).

    MLX does not check positive definiteness; where the factorization fails the result is
    NaN here (LAPACK leaves a partial factor in MLX).
    """
    if a.shape[-1] == 0:
        return xp.array(a, copy=True)
    if upper:
        a = xp.swapaxes(a, -1, -2)
    sym = xp.tril(a) + xp.swapaxes(xp.tril(a, -1), -1, -2)
    try:
        low = xp.linalg.cholesky(sym)
    except Exception:  # numpy raises for a stack where one matrix is not positive definite
        low = _each_or_nan(xp, sym)
    else:
        if not sequential(xp):
            # a module without numpy's forms may not raise (CuPy: cupyx.errstate(linalg=
            # "ignore") by default): potrf's partial factor comes back; NaN for those
            # matrices, as numpy's path gives
            low = xp.where(_factored(xp, sym, low)[..., None, None], low,
                           xp.asarray(xp.nan, dtype=low.dtype))
    return xp.swapaxes(low, -1, -2) if upper else low


def _each_or_nan(xp, sym):
    """Cholesky of each matrix of ``sym`` alone: NaN only for those that fail."""
    flat = sym.reshape((-1,) + sym.shape[-2:])
    out = xp.empty_like(flat)
    for i in range(flat.shape[0]):
        try:
            out[i] = xp.linalg.cholesky(flat[i])
        except Exception:
            out[i] = xp.nan
    return out.reshape(sym.shape)


def _factored(xp, sym, low):
    """Per matrix of ``sym`` (a boolean array of the batch shape): whether ``low`` is its
    Cholesky factor: finite, with a positive diagonal, and ``low @ low^H`` within
    Cholesky's backward error (a few n eps of the largest entry). A failed factorization
    leaves part of the input unfactored, far outside that."""
    n = sym.shape[-1]
    diag = xp.diagonal(low, axis1=-2, axis2=-1).real
    rec = xp.matmul(low, xp.conj(xp.swapaxes(low, -1, -2)))
    eps = xp.finfo(low.dtype).eps
    tol = 32 * n * eps * xp.max(xp.abs(sym), axis=(-2, -1))
    return (xp.isfinite(low).all(axis=(-2, -1)) & (diag > 0).all(axis=-1)
            & (xp.max(xp.abs(rec - sym), axis=(-2, -1)) <= tol))


@define("QRF", family=LINALG)
def qrf(xp, a):
    """Reduced QR: Q (..., M, K) and R (..., K, N) with K = min(M, N)."""
    q, r = xp.linalg.qr(a, mode="reduced")
    return q, r


@define("SVD", family=LINALG)
def svd(xp, a, *, compute_uv=True):
    """Singular values (descending), and with ``compute_uv`` the full U and Vt."""
    m, n = a.shape[-2], a.shape[-1]
    if m == 0 or n == 0:
        batch = a.shape[:-2]
        s = xp.zeros(batch + (0,), dtype=xp.float32)
        if not compute_uv:
            return s
        return (xp.broadcast_to(xp.eye(m, dtype=a.dtype), batch + (m, m)), s,
                xp.broadcast_to(xp.eye(n, dtype=a.dtype), batch + (n, n)))
    if not compute_uv:
        return xp.linalg.svd(a, compute_uv=False)
    u, s, vt = xp.linalg.svd(a, full_matrices=True)
    return u, s, vt


@define("Eigh", family=LINALG)
def eigh(xp, a, *, uplo="L", compute_eigenvectors=True):
    """Eigenvalues (ascending) and eigenvectors of the Hermitian matrix in triangle ``uplo``."""
    if a.shape[-1] == 0:
        w = xp.zeros(a.shape[:-1], dtype=xp.float32)
        return (w, xp.array(a, copy=True)) if compute_eigenvectors else w
    if compute_eigenvectors:
        w, v = xp.linalg.eigh(a, UPLO=uplo)
        return w, v
    return xp.linalg.eigvalsh(a, UPLO=uplo)


@define("Eig", family=LINALG)
def eig(xp, a, *, compute_eigenvectors=True):
    """Eigenvalues and right eigenvectors of a general square matrix (complex)."""
    if a.shape[-1] == 0:
        w = xp.zeros(a.shape[:-1], dtype=xp.complex64)
        return (w, xp.zeros(a.shape, dtype=xp.complex64)) if compute_eigenvectors else w
    w, v = xp.linalg.eig(a)
    # numpy returns real arrays when every eigenvalue is real, CuPy complex ones: complex here
    cdt = xp.result_type(w.dtype, xp.complex64)
    w, v = w.astype(cdt, copy=False), v.astype(cdt, copy=False)
    return (w, v) if compute_eigenvectors else w


@define("LUF", family=LINALG)
def luf(xp, a):
    """Packed LU factors, getrf's 0-based pivots, and the row permutation (a[perm] = L U)."""
    lu, pivots, perm, _ = lu_batched(xp, a)
    return lu, pivots.astype(xp.uint32), perm.astype(xp.uint32)
