"""mx.vecdot against MLX 0.32.4: values, dtypes, recorded primitives and errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from conftest import mlx_ref, requires_mlx

DTYPES = ["float32", "float16", "int32", "bool_", "complex64", "bfloat16"]


def _arr(m, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape) * 3
    if dtype == "complex64":
        v = v + 1j * rng.standard_normal(shape)
    x = m.array(v.astype(np.complex64 if dtype == "complex64" else np.float32))
    return x.astype(getattr(m, dtype))


def _outcome(m, sa, sb, da, db, axis, seed):
    try:
        r = m.vecdot(_arr(m, sa, da, seed), _arr(m, sb, db, seed + 1), axis=axis)
        return ("ok", r.shape, str(r.dtype).split(".")[-1],
                np.array(r.astype(m.complex64 if r.dtype == m.complex64 else m.float32)))
    except Exception as e:  # noqa: BLE001 - compared with MLX's exception
        return ("raises", type(e).__name__, str(e))


shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


@requires_mlx
@settings(max_examples=120, deadline=None)
@given(shapes, shapes, st.sampled_from(DTYPES), st.sampled_from(DTYPES), st.integers(-4, 3),
       st.integers(0, 100), st.booleans())
def test_vecdot_matches_mlx(sa, sb, da, db, axis, seed, same_shape):
    if same_shape:
        sb = sa
    got, want = _outcome(mx, sa, sb, da, db, axis, seed), _outcome(mlx_ref, sa, sb, da, db, axis, seed)
    assert got[:3] == want[:3]
    if got[0] == "ok":
        tol = {"float16": 3e-2, "bfloat16": 2e-1}.get(got[2], 1e-5)
        np.testing.assert_allclose(got[3], want[3], rtol=tol, atol=tol)


@requires_mlx
def test_vecdot_records_mlxs_primitives():
    import io
    import re

    def prims(m, x):
        f = io.StringIO()
        m.export_to_dot(f, x)
        return sorted(re.findall(r'label ="(\w+)"', f.getvalue()))

    for dt in ("float32", "complex64"):
        a = mx.zeros((2, 3), getattr(mx, dt))
        b = mx.zeros((1, 3), getattr(mx, dt))
        ra = mlx_ref.zeros((2, 3), getattr(mlx_ref, dt))
        rb = mlx_ref.zeros((1, 3), getattr(mlx_ref, dt))
        assert prims(mx, mx.vecdot(a, b)) == prims(mlx_ref, mlx_ref.vecdot(ra, rb))


def test_vecdot_needs_arrays():
    with pytest.raises(TypeError, match=r"^vecdot\(\): incompatible function arguments"):
        mx.vecdot([1.0], mx.array([1.0]))


def test_matrix_norm_is_linalg_norm():
    assert mx.matrix_norm is mx.linalg.norm  # as in MLX 0.32
    if mlx_ref is not None:
        assert mlx_ref.matrix_norm is mlx_ref.linalg.norm
