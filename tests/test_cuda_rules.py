"""Every rule with CuPy on a GPU, against numpy's results (skipped without CuPy and a GPU).

The same replay as ``test_cupy_like_rules.py`` (``rule_replay``), with real CuPy: inputs
copied to the device, results copied back. Integer, boolean, index and layout results must
be exact; floating-point ones agree within a stated number of ulps (CUDA's libm, cuBLAS,
cuFFT and cuSOLVER round differently from numpy's), and decompositions whose factors are
defined only up to signs / phases / order (QRF, SVD, Eig, Eigh) and partitions are
checked by their defining properties against the inputs. Results that CuPy cannot hold
(bfloat16 when CuPy has no such dtype) are counted as skipped and reported.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import rule_replay
from tapescope.kernels.primitives import REGISTRY

pytestmark = [pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def _cupy_reason():
    if os.environ.get("TAPESCOPE_DISABLE_GPU"):
        return None, "TAPESCOPE_DISABLE_GPU is set"
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - any import failure means no CuPy here
        return None, f"CuPy is not importable ({type(e).__name__}: {e})"
    if getattr(cupy, "__fake__", False):
        return None, "cupy is tests/fake_cupy.py (the backend's plumbing only), not CuPy"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return None, f"CuPy finds no CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return None, "CuPy finds no CUDA device"
    return cupy, None


cupy, _REASON = _cupy_reason()
if cupy is None:
    pytest.skip(f"no GPU for the CUDA rule replay: {_REASON}", allow_module_level=True)

# floating-point agreement, in ulps of the result dtype, relative to max(1, |value|)
# (reductions, products and transforms: relative to the largest magnitude involved)
ULPS = {"float16": 2, "bfloat16": 2, "float32": 64, "float64": 4096, "complex64": 64,
        "complex128": 4096}
ACCUMULATING = {"Sum", "Prod", "LogSumExp", "Softmax", "CumSum", "CumProd", "CumLogAddExp",
                "Matmul", "AddMM", "FFT", "Hadamard", "Inverse", "Cholesky", "LUF",
                "Scatter", "ScatterAxis", "Compiled", "BlockMaskedMM", "GatherMM",
                "SegmentedMM", "QuantizedMatmul", "GatherQMM", "QQMatmul", "GatherQQMM"}
DECOMPOSITIONS = {"QRF", "SVD", "Eigh", "Eig"}


@functools.lru_cache(maxsize=None)
def _holds(dtype: np.dtype) -> bool:
    try:
        cupy.asarray(np.zeros(0, dtype))
        return True
    except Exception:  # noqa: BLE001 - CuPy refuses the dtype
        return False


def _to_host(x):
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"not a CuPy array: {type(x)}")
    return cupy.asnumpy(x)


def _close(ref, got, scale=None, name=""):
    assert got.shape == ref.shape, f"shape {got.shape} != {ref.shape}"
    assert got.dtype == ref.dtype, f"dtype {got.dtype} != {ref.dtype}"
    if ref.dtype.kind not in "fc" and ref.dtype.name != "bfloat16":
        np.testing.assert_array_equal(got, ref)
        return
    wide = np.complex128 if ref.dtype.kind == "c" else np.float64
    r, g = ref.astype(wide), got.astype(wide)
    for part in ((lambda z: z.real, lambda z: z.imag) if ref.dtype.kind == "c" else (lambda z: z,)):
        rp, gp = part(r), part(g)
        assert (np.isnan(rp) == np.isnan(gp)).all(), f"NaN at different places: {gp} vs {rp}"
        inf = np.isinf(rp)
        assert (gp[inf] == rp[inf]).all() and not np.isinf(gp[~inf]).any(), "infinities differ"
    fin = np.isfinite(r)
    eps = float(np.finfo(np.float32 if ref.dtype.name == "bfloat16" else ref.dtype).eps)
    if ref.dtype.name == "bfloat16":
        eps = 2.0 ** -7
    size = np.maximum(1.0, np.abs(r[fin]))
    if scale is not None:
        size = np.maximum(size, scale)
    err = np.abs(g[fin] - r[fin])
    allowed = ULPS[ref.dtype.name] * eps * size
    bad = err > allowed
    assert not bad.any(), (f"{name}: {int(bad.sum())} values beyond {ULPS[ref.dtype.name]} ulps: "
                           f"{g[fin][bad][:4]} vs {r[fin][bad][:4]}")


def _scale(ins) -> float:
    m = 1.0
    for x in ins:
        x = np.asarray(x)
        if x.dtype.kind in "fc" or x.dtype.name == "bfloat16":
            v = np.abs(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64))
            v = v[np.isfinite(v)]
            if v.size:
                m = max(m, float(v.max()) * max(1, int(np.sqrt(x.size))))
    return m


def _partition(name, refs, gots, ins, kw):
    a, axis, kth = np.asarray(ins[0]), kw["axis"], kw["kth"]
    got = gots[0]
    if name == "ArgPartition":
        assert (np.sort(got, axis=axis) == np.sort(refs[0], axis=axis)).all(), "not a permutation"
        got = np.take_along_axis(a, got.astype(np.int64), axis=axis)
    srt = np.sort(a, axis=axis)
    kv = np.take(srt, [kth], axis=axis)
    gk = np.take(got, [kth], axis=axis)
    assert np.array_equal(gk, kv, equal_nan=True), "wrong kth element"
    left = np.take(got, np.arange(kth), axis=axis)
    right = np.take(got, np.arange(kth + 1, a.shape[axis]), axis=axis)
    assert (left <= kv).all() and (right >= kv).all(), "not partitioned at kth"
    assert np.array_equal(np.sort(got, axis=axis), srt, equal_nan=True), "values changed"


def _decomposition(name, refs, gots, ins, kw):
    a = np.asarray(ins[0]).astype(np.complex128)
    scale = _scale(ins)
    for r, g in zip(refs, gots):
        assert g.shape == r.shape and g.dtype == r.dtype, f"{g.shape} {g.dtype} != {r.shape} {r.dtype}"
    h = lambda x: np.swapaxes(x, -1, -2).conj()  # noqa: E731
    g = [x.astype(np.complex128) for x in gots]
    eps = float(np.finfo(gots[0].dtype).eps)
    tol = ULPS.get(gots[0].dtype.name, 64) * eps * scale
    if name == "QRF":
        q, r = g
        np.testing.assert_allclose(q @ r, a, atol=tol)
        np.testing.assert_allclose(h(q) @ q, np.eye(q.shape[-1]), atol=tol)
        assert np.allclose(np.tril(r, -1), 0), "R is not upper triangular"
    elif name == "SVD":
        if len(g) == 1:
            _close(refs[0], gots[0], scale, name)
            return
        u, s, vt = g
        _close(refs[1], gots[1], scale, name)
        k = s.shape[-1]
        recon = (u[..., :, :k] * s[..., None, :]) @ vt[..., :k, :]
        np.testing.assert_allclose(recon, a, atol=tol)
    elif name == "Eigh":
        _close(refs[0], gots[0], scale, name)
        if len(g) == 2:
            w, v = g
            np.testing.assert_allclose(_herm(a, kw) @ v, v * w[..., None, :], atol=tol)
    elif name == "Eig":
        w = g[0]
        key = lambda x: np.sort_complex(np.round(x, 3))  # noqa: E731
        np.testing.assert_allclose(key(w), key(refs[0].astype(np.complex128)), atol=tol)
        if len(g) == 2:
            v = g[1]
            np.testing.assert_allclose(a @ v, v * w[..., None, :], atol=tol)


def _herm(a, kw):
    tri = np.tril(a) if kw.get("uplo", "L") == "L" else np.triu(a)
    d = np.diagonal(a, axis1=-2, axis2=-1)
    return tri + np.swapaxes(tri, -1, -2).conj() - d[..., None] * np.eye(a.shape[-1])


def _astype_defined(ref, got, ins):
    """Float-to-integer casts of NaN, infinities and out-of-range values are undefined in C:
    numpy (x86) gives the integer's minimum, CUDA saturates (NaN to 0), as MLX's CPU and
    CUDA backends do in turn. Compared where the cast is defined; None when it always is."""
    a = np.asarray(ins[0])
    if not (a.dtype.kind == "f" or a.dtype.name == "bfloat16") or ref.dtype.kind not in "iu":
        return None
    info = np.iinfo(ref.dtype)
    x = a.astype(np.float64)
    return np.isfinite(x) & (np.trunc(x) >= info.min) & (np.trunc(x) <= info.max)


def _compare(name, refs, gots, ins, kw):
    if name == "AsType":
        defined = _astype_defined(refs[0], gots[0], ins)
        if defined is not None:
            assert gots[0].dtype == refs[0].dtype and gots[0].shape == refs[0].shape
            np.testing.assert_array_equal(gots[0][defined], refs[0][defined])
            return
    if name in ("Partition", "ArgPartition"):
        return _partition(name, refs, gots, ins, kw)
    if name in DECOMPOSITIONS:
        return _decomposition(name, refs, gots, ins, kw)
    scale = _scale(ins) if name in ACCUMULATING else None
    for k, (r, g) in enumerate(zip(refs, gots)):
        try:
            _close(r, g, scale, name)
        except AssertionError as e:
            raise AssertionError(f"output {k}: {e}") from None


GPU = rule_replay.Device(
    xp=cupy, to_device=cupy.asarray, to_host=_to_host,
    empty=lambda shape, dtype: cupy.empty(shape, dtype), compare=_compare,
    supports=lambda a: _holds(a.dtype))


@pytest.fixture(scope="module")
def report():
    rep = rule_replay.replay(GPU)
    cupy.cuda.Device().synchronize()
    return rep


def test_every_rule_agrees_with_numpy_on_the_gpu(report):
    if report.skipped:
        print("skipped (inputs CuPy cannot hold):", dict(report.skipped))
    assert not report.failures, "\n".join(report.failures)


def test_every_primitive_ran_on_the_gpu(report):
    missing = set(REGISTRY) - set(report.calls) - set(rule_replay.NOT_REPLAYED)
    only_skipped = missing & set(report.skipped)
    assert not missing - only_skipped, f"never replayed: {sorted(missing - only_skipped)}"
    assert not only_skipped, f"replayed only with inputs CuPy cannot hold: {sorted(only_skipped)}"
