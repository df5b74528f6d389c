"""Creation ops against numpy (values) and MLX (dtypes, primitives, errors)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from mlx_compare import primitive_names, same_error
from conftest import mlx_ref

SETTINGS = settings(max_examples=40, deadline=None)
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
DTYPES = ["bool_", "uint8", "int16", "int32", "int64", "float16", "float32", "bfloat16",
          "complex64"]



def prims(*outs) -> list:
    return sorted(primitive_names(*outs))

def check(out, expected, dtype=None):
    expected = np.asarray(expected)
    assert out.shape == expected.shape
    if dtype is not None:
        assert out.dtype == dtype
    if out.dtype == mx.bfloat16:
        out, expected = out.astype(mx.float32), expected.astype(np.float32)
    np.testing.assert_array_equal(np.array(out), expected)


def same_dtype(a, b) -> bool:
    return repr(a.dtype) == str(b.dtype)


@SETTINGS
@given(shapes, st.sampled_from(DTYPES))
def test_zeros_ones_full_match_numpy(shape, dname):
    dt = getattr(mx, dname)
    check(mx.zeros(shape, dt), np.zeros(shape, dt.np), dt)
    check(mx.ones(shape, dt), np.ones(shape, dt.np), dt)
    check(mx.full(shape, mx.array(3, dt)), np.full(shape, 3, dt.np), dt)
    check(mx.zeros(shape), np.zeros(shape, np.float32), mx.float32)
    z = mx.zeros(shape, dt)
    check(mx.zeros_like(z), np.zeros(shape, dt.np), dt)
    check(mx.ones_like(z, mx.int8), np.ones(shape, np.int8), mx.int8)


def test_full_broadcasts_array_values():
    row = np.arange(3, dtype=np.float32)
    check(mx.full((2, 3), mx.array(row)), np.broadcast_to(row, (2, 3)), mx.float32)
    check(mx.full(4, 2), np.full(4, 2, np.int32), mx.int32)


@pytest.mark.parametrize("case", [
    lambda m: m.full((2,), 1), lambda m: m.full((2,), 1.5), lambda m: m.full((2,), True),
    lambda m: m.full((2,), 1, m.float32), lambda m: m.full((2,), 1, dtype=m.float16),
    lambda m: m.full((2,), 1.5, dtype=m.int32), lambda m: m.full((2,), 2**40),
    lambda m: m.full((2,), 1 + 2j), lambda m: m.full((2,), m.array([1, 2]), dtype=m.float16),
    lambda m: m.full((2,), m.array(1.0), m.int32), lambda m: m.zeros((2,), None),
    lambda m: m.zeros_like(m.array([1, 2])), lambda m: m.ones_like(m.array([1, 2]), m.float16),
    lambda m: m.arange(5), lambda m: m.arange(1, 5), lambda m: m.arange(1, 5, 2),
    lambda m: m.arange(5, dtype=m.float16), lambda m: m.arange(0, 5, step=2),
    lambda m: m.arange(stop=5), lambda m: m.arange(start=1, stop=5),
    lambda m: m.arange(0, 2**40, 2**38), lambda m: m.arange(5.0), lambda m: m.arange(0, 1, 0.3),
    lambda m: m.arange(0, 5, 1.0), lambda m: m.arange(5, step=2), lambda m: m.arange(-3),
    lambda m: m.arange(0, 5, dtype=m.uint8), lambda m: m.arange(0.5, 5, dtype=m.int32),
    lambda m: m.arange(10, 0, -3), lambda m: m.arange(0, 3, dtype=m.complex64),
    lambda m: m.linspace(0, 1, 1), lambda m: m.linspace(0, 1, 5, endpoint=False),
    lambda m: m.linspace(0, 10, 5, dtype=m.int32), lambda m: m.linspace(-2, 3, 7),
    lambda m: m.linspace(0, 1, 0), lambda m: m.eye(3), lambda m: m.eye(2, 3, k=-1, dtype=m.int32),
    lambda m: m.eye(3, 4, 1), lambda m: m.eye(0), lambda m: m.eye(2, 2, 5),
    lambda m: m.identity(3, m.int8), lambda m: m.tri(3), lambda m: m.tri(2, 3, 1),
    lambda m: m.tri(2, dtype=m.int32), lambda m: m.tri(-1), lambda m: m.tri(3, 2, -1, m.bool_),
])
def test_values_and_dtypes_match_mlx(mlx, case):
    got, want = case(mx), case(mlx)
    assert got.shape == tuple(want.shape)
    assert same_dtype(got, want)
    if got.dtype == mx.bfloat16:
        got, want = got.astype(mx.float32), want.astype(mlx.float32)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, atol=1e-6)


@SETTINGS
@given(st.integers(-20, 20), st.integers(-20, 20), st.integers(-5, 5).filter(bool))
def test_integer_arange_matches_numpy(start, stop, step):
    check(mx.arange(start, stop, step), np.arange(start, stop, step, dtype=np.int32), mx.int32)


@SETTINGS
@given(st.floats(-10, 10), st.floats(-10, 10), st.floats(0.1, 3), st.booleans())
def test_float_arange_matches_numpy(start, stop, step, neg):
    step = -step if neg else step
    want = np.arange(start, stop, step).astype(np.float32)
    got = mx.arange(start, stop, step)
    assert got.dtype == mx.float32
    if got.shape == want.shape:
        np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-4)
    else:  # float rounding at the end point: MLX's length is ceil((stop - start) / step)
        assert got.shape[0] == max(0, int(np.ceil((stop - start) / step)))


@SETTINGS
@given(st.floats(-10, 10), st.floats(-10, 10), st.integers(0, 20), st.booleans())
def test_linspace_matches_numpy(start, stop, num, endpoint):
    want = np.linspace(start, stop, num, endpoint=endpoint).astype(np.float32)
    got = mx.linspace(start, stop, num, endpoint)
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(st.floats(-10, 10), st.floats(-10, 10), st.integers(2, 20), st.booleans())
def test_float64_linspace_computes_in_float64_as_mlx(start, stop, num, endpoint):
    """MLX's inner type is float64 for a float64 linspace: numpy's float64 values to a few
    ulps (its formula differs), and the end point exactly."""
    want = np.linspace(start, stop, num, endpoint=endpoint)
    with mx.stream(mx.cpu):
        got = mx.linspace(start, stop, num, endpoint, dtype=mx.float64)
        assert got.dtype == mx.float64
        np.testing.assert_allclose(np.array(got), want, rtol=1e-14, atol=1e-14)
        if endpoint:
            assert got.tolist()[-1] == float(stop)


@SETTINGS
@given(st.integers(0, 5), st.integers(0, 5), st.integers(-6, 6))
def test_eye_and_tri_match_numpy(n, m, k):
    check(mx.eye(n, m, k), np.eye(n, m, k, dtype=np.float32), mx.float32)
    check(mx.tri(n, m, k), np.tri(n, m, k, dtype=np.float32), mx.float32)


@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple), st.integers(-4, 4))
def test_tril_triu_match_numpy(shape, k):
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape) + 1
    check(mx.tril(mx.array(x), k), np.tril(x, k), mx.int32)
    check(mx.triu(mx.array(x), k), np.triu(x, k), mx.int32)


@SETTINGS
@given(st.lists(st.integers(0, 4), min_size=0, max_size=4), st.sampled_from(["xy", "ij"]),
       st.booleans())
def test_meshgrid_matches_numpy(sizes, indexing, sparse):
    xs = [np.arange(n, dtype=np.int32) + 10 * i for i, n in enumerate(sizes)]
    got = mx.meshgrid(*[mx.array(x) for x in xs], sparse=sparse, indexing=indexing)
    want = np.meshgrid(*xs, sparse=sparse, indexing=indexing)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        check(g, w)


def _mlx_prims(out) -> list:
    import re
    import tempfile

    outs = out if isinstance(out, (list, tuple)) else [out]
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mlx_ref.export_to_dot(f.name, *outs)
        return sorted(re.findall(r'label ="([A-Za-z ]+)", shape=rectangle', open(f.name).read()))


@pytest.mark.parametrize("case", [
    lambda m: m.zeros((2, 3)), lambda m: m.ones((2, 3)), lambda m: m.full((2, 3), 2.0),
    lambda m: m.full((2, 3), m.array([1, 2, 3])), lambda m: m.zeros(()),
    lambda m: m.arange(5), lambda m: m.arange(0.0, 1.0, 0.25), lambda m: m.eye(3),
    lambda m: m.tri(3), lambda m: m.meshgrid(m.array([1, 2]), m.array([3, 4, 5])),
    lambda m: m.linspace(0, 1, 5),
])
def test_records_the_primitives_mlx_records(mlx, case):
    out = case(mx)
    assert prims(*(out if isinstance(out, (list, tuple)) else [out])) == _mlx_prims(case(mlx))


def test_full_materialises_its_own_buffer():
    v = mx.array([1.0, 2.0])
    out = mx.full((3, 2), v)
    mx.eval(out)
    assert out._d.data.flags.c_contiguous
    assert not np.shares_memory(out._d.data, v._d.data)


@pytest.mark.parametrize("case", [
    lambda m: m.zeros((-1,)), lambda m: m.zeros(-1), lambda m: m.ones((2, -2)),
    lambda m: m.full((-1, 2), 1.0), lambda m: m.ones((2,), dtype=int),
    lambda m: m.full((2,), "a"), lambda m: m.full((3,), m.zeros((2,))),
    lambda m: m.arange(0, 10, 0), lambda m: m.arange(0.0, 10, 0),
    lambda m: m.arange(0, 1e20, 1), lambda m: m.arange(0, 3, dtype=m.bool_),
    lambda m: m.arange(float("inf")), lambda m: m.arange(float("nan")), lambda m: m.arange(),
    lambda m: m.linspace(0, 1, -1), lambda m: m.eye(-1), lambda m: m.eye(2, -1),
    lambda m: m.identity(-1), lambda m: m.tril(m.arange(5)), lambda m: m.triu(m.array(1.0)),
    lambda m: m.meshgrid(m.array([1]), indexing="foo"),
    # argument types MLX's bindings refuse: nanobind's message lists the positional and the
    # keyword arguments' types apart, and comes before any check of the values
    lambda m: m.ones((2,), int), lambda m: m.zeros(2, dtype="float32"),
    lambda m: m.zeros((-1,), int), lambda m: m.zeros(None), lambda m: m.full((2,), None),
    lambda m: m.full((2,), 1, dtype=int, stream=m.cpu), lambda m: m.full((2,), 1, int),
    lambda m: m.zeros_like(m.zeros(2), int), lambda m: m.ones_like(m.zeros(2), dtype=int),
    lambda m: m.arange(3, dtype=int), lambda m: m.arange(0, 3, 1, int),
    lambda m: m.arange(dtype=m.int32), lambda m: m.arange(None), lambda m: m.arange("a"),
    lambda m: m.arange(np.int64(3)), lambda m: m.eye(2.0), lambda m: m.eye(2, k=1.0),
    lambda m: m.eye(2, dtype=int), lambda m: m.identity(2, int), lambda m: m.identity(2.0),
    lambda m: m.tri(2, None, 1.5), lambda m: m.tri(2, dtype=int),
    lambda m: m.linspace(0, 1, None), lambda m: m.linspace(0, 1, 2.0),
    lambda m: m.linspace(0j, 1), lambda m: m.linspace("a", 1), lambda m: m.linspace(0, 1, 3, 1),
    lambda m: m.linspace(0, 1, -1, dtype=int),
])
def test_errors_match_mlx(case):
    same_error(case)


@pytest.mark.parametrize("case", [
    lambda m: m.eye(np.int64(2)), lambda m: m.tri(2, k=np.int64(1)), lambda m: m.eye(m.array(2)),
    lambda m: m.linspace(0, 1, np.int64(3)), lambda m: m.linspace(m.array(0), 1, 3),
    lambda m: m.identity(True),
])
def test_integer_like_arguments_are_accepted_as_mlx_accepts_them(mlx, case):
    got, want = case(mx), case(mlx)
    assert repr(got.dtype) == str(want.dtype)
    np.testing.assert_array_equal(np.array(got), np.array(want))


@pytest.mark.parametrize("shape", [
    (2.5,), 2.5, 2.0, (np.float64(2.0),), ("a",), np.int64(2), [2, 2.0], (np.array(2.0),),
])
@pytest.mark.parametrize("op", ["zeros", "ones", "full"])
def test_shapes_that_are_not_integers_raise_as_mlx(op, shape):
    # nanobind converts std::variant<int, Shape> by __index__: a float is std::bad_cast
    args = (shape, 1.0) if op == "full" else (shape,)
    same_error(lambda m: getattr(m, op)(*args))


@pytest.mark.parametrize("shape", [(np.int32(2), True), np.array([2, 3]), (np.array(2),), True])
def test_index_like_dimensions_are_taken_as_mlx(shape):
    want = np.zeros(np.asarray(shape, dtype=np.int64).tolist() if not isinstance(shape, bool)
                    else (1,))
    got = mx.zeros(shape)
    assert got.shape == want.shape
    if mlx_ref is not None:
        assert mlx_ref.zeros(shape).shape == got.shape
