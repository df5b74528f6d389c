"""where / clip / nan_to_num / isclose / allclose / array_equal, the array operators
(reflected and in-place) and the elementwise method forms, against numpy and MLX."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import tapescope.core as mx

from elementwise_util import as_np, values


@settings(max_examples=40, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4),
       xt=st.sampled_from(["int32", "float32", "uint8"]), yt=st.sampled_from(["int16", "float16"]),
       seed=st.integers(0, 2**16))
def test_where_matches_numpy_with_broadcasting_and_promotion(shapes, xt, yt, seed):
    rng = np.random.default_rng(seed)
    sc, sx, sy = shapes.input_shapes
    c, x, y = rng.integers(0, 2, sc).astype(bool), values(rng, xt, sx), values(rng, yt, sy)
    got = mx.where(mx.array(c), mx.array(x), mx.array(y))
    assert got._d.node.primitive.name == "Select"
    want = np.where(c, x, y)  # (numpy promotes differently; the dtype is checked against MLX)
    assert got.shape == shapes.result_shape
    np.testing.assert_allclose(np.array(got).astype(np.float64), want.astype(np.float64),
                               rtol=1e-3)


def test_where_dtypes_match_mlx(mlx):
    for xt in ["bool_", "uint8", "int32", "float16", "bfloat16", "complex64"]:
        for yt in ["int8", "uint64", "float32", "bfloat16"]:
            got = mx.where(mx.array([True, False]), mx.zeros((2,), getattr(mx, xt)),
                           mx.ones((1,), getattr(mx, yt)))
            ref = mlx.where(mlx.array([True, False]), mlx.zeros((2,), getattr(mlx, xt)),
                            mlx.ones((1,), getattr(mlx, yt)))
            assert repr(got.dtype) == repr(ref.dtype)
            np.testing.assert_array_equal(as_np(got), as_np(ref))


def test_where_scalars_and_errors_match_mlx(mlx):
    assert repr(mx.where(True, 1, 2.0).dtype) == repr(mlx.where(True, 1, 2.0).dtype)
    got = mx.where(mx.array([1, 0, 2]), mx.array([1, 2, 3], mx.int8), 100)
    ref = mlx.where(mlx.array([1, 0, 2]), mlx.array([1, 2, 3], mlx.int8), 100)
    assert repr(got.dtype) == repr(ref.dtype)
    np.testing.assert_array_equal(np.array(got), np.array(ref))
    with pytest.raises(ValueError, match=r"\[broadcast_shapes\] Shapes \(2\) and \(3\) cannot"):
        mx.where(mx.array([True, False]), mx.array([1, 2, 3]), 1)
    with pytest.raises(ValueError, match="Invalid type str"):
        mx.where(True, "a", 1)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["int32", "float32", "int8"]), lo=st.one_of(st.none(), st.integers(-5, 0)),
       hi=st.one_of(st.none(), st.integers(1, 5)), seed=st.integers(0, 2**16))
def test_clip_matches_numpy(name, lo, hi, seed):
    if lo is None and hi is None:
        return
    a = values(np.random.default_rng(seed), name, (3, 4))
    got = mx.clip(mx.array(a), lo, hi)
    want = np.clip(a, lo, hi)
    assert np.array(got).dtype == a.dtype
    np.testing.assert_array_equal(np.array(got), want)


def test_clip_promotes_broadcasts_and_errors_like_mlx(mlx):
    got = mx.clip(mx.array([1, 2, 3]), 0.5, 2)
    ref = mlx.clip(mlx.array([1, 2, 3]), 0.5, 2)
    assert repr(got.dtype) == repr(ref.dtype)
    np.testing.assert_array_equal(np.array(got), np.array(ref))
    got = mx.clip(mx.array([1.0, 5.0]), mx.zeros((2, 1)), 3)
    assert got.shape == (2, 2)
    with pytest.raises(ValueError, match="^At most one of a_min and a_max may be None$"):
        mx.clip(mx.array([1]), None, None)
    with pytest.raises(ValueError, match="Converting -1 to uint8 would result in overflow"):
        mx.clip(mx.array([1], mx.uint8), -1, 3)


@pytest.mark.parametrize("name", ["float16", "float32", "bfloat16"])
def test_nan_to_num_matches_mlx(mlx, name):
    data = [np.nan, np.inf, -np.inf, 1.5]
    got = mx.nan_to_num(mx.array(data, getattr(mx, name)))
    ref = mlx.nan_to_num(mlx.array(data, getattr(mlx, name)))
    assert repr(got.dtype) == repr(ref.dtype)
    np.testing.assert_array_equal(as_np(got), as_np(ref))
    got = mx.nan_to_num(mx.array(data, getattr(mx, name)), 1.0, 2.0, -3.0)
    np.testing.assert_array_equal(as_np(got), [1.0, 2.0, -3.0, 1.5])


def test_nan_to_num_defaults_numpy_and_errors():
    np.testing.assert_array_equal(np.array(mx.nan_to_num(mx.array([np.nan, np.inf, -np.inf]))),
                                  np.nan_to_num(np.array([np.nan, np.inf, -np.inf], np.float32)))
    i = mx.array([1, 2])
    assert mx.nan_to_num(i) is not i and mx.nan_to_num(i).tolist() == [1, 2]  # MLX: a new handle
    with pytest.raises(ValueError, match=r"^\[nan_to_num\] Does not yet support given type: float64\.$"):
        mx.nan_to_num(mx.array([1.0], mx.float64))
    with pytest.raises(ValueError, match=r"Does not yet support given type: complex64\."):
        mx.nan_to_num(mx.array([1j]))


@settings(max_examples=40, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=4),
       seed=st.integers(0, 2**16), equal_nan=st.booleans())
def test_isclose_matches_numpy_including_infs_and_nans(shapes, seed, equal_nan):
    rng = np.random.default_rng(seed)
    pool = np.array([0.0, 1.0, 1.0 + 1e-6, 1.0 + 1e-3, np.inf, -np.inf, np.nan, -2.0], np.float32)
    a = rng.choice(pool, shapes.input_shapes[0])
    b = rng.choice(pool, shapes.input_shapes[1])
    got = mx.isclose(mx.array(a), mx.array(b), equal_nan=equal_nan)
    np.testing.assert_array_equal(np.array(got), np.isclose(a, b, equal_nan=equal_nan))
    assert mx.allclose(mx.array(a), mx.array(b), equal_nan=equal_nan).item() == \
        np.allclose(a, b, equal_nan=equal_nan)


def test_isclose_allclose_on_integers_and_tolerances():
    assert mx.allclose(mx.array([1.0]), mx.array([1.1]), rtol=0.2).item() is True
    assert mx.allclose(mx.array([1.0]), mx.array([1.1])).item() is False
    np.testing.assert_array_equal(np.array(mx.isclose(mx.array([1, 2]), mx.array([1, 3]))), [True, False])


def test_array_equal_matches_numpy():
    a = mx.array([1.0, np.nan])
    assert mx.array_equal(a, a).item() is False
    assert mx.array_equal(a, a, equal_nan=True).item() is True
    assert mx.array_equal(mx.array([1, 2]), mx.array([1.0, 2.0])).item() is True
    assert mx.array_equal(mx.array([1, 2]), mx.array([1])).item() is False
    assert mx.array_equal(mx.array([1, 2]), mx.array([1])).dtype == mx.bool_
    assert mx.array_equal(mx.zeros((2, 2)), mx.zeros((2, 2))).shape == ()


# -- operators -------------------------------------------------------------------------------
OPS = [("+", np.add), ("-", np.subtract), ("*", np.multiply), ("/", np.true_divide),
       ("//", np.floor_divide), ("%", np.remainder), ("**", np.power), ("<", np.less),
       ("<=", np.less_equal), (">", np.greater), (">=", np.greater_equal), ("==", np.equal),
       ("!=", np.not_equal), ("&", np.bitwise_and), ("|", np.bitwise_or), ("^", np.bitwise_xor),
       ("<<", np.left_shift), (">>", np.right_shift)]


@pytest.mark.parametrize("sym,ref", OPS)
def test_operators_match_numpy(sym, ref):
    a = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    b = np.array([3, 1, 2], np.int32)
    got = eval(f"x {sym} y", {"x": mx.array(a), "y": mx.array(b)})
    want = ref(a, b) if sym != "/" else ref(a, b).astype(np.float32)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-6)
    got_scalar = eval(f"x {sym} 2", {"x": mx.array(a)})
    np.testing.assert_allclose(np.array(got_scalar), ref(a, np.int32(2)), rtol=1e-6)


@pytest.mark.parametrize("sym", ["+", "-", "*", "/", "//", "%", "**"])
def test_reflected_operators_match_mlx(mlx, sym):
    got = eval(f"3 {sym} x", {"x": mx.array([1, 2, 4])})
    ref = eval(f"3 {sym} x", {"x": mlx.array([1, 2, 4])})
    assert repr(got.dtype) == repr(ref.dtype)
    np.testing.assert_allclose(np.array(got), np.array(ref), rtol=1e-6)


def test_no_reflected_bitwise_operators_nor_divmod_as_mlx():
    a = mx.array([1, 2])
    for expr in ["1 & a", "1 | a", "1 ^ a", "1 << a", "1 >> a", "divmod(a, 2)", "round(a)"]:
        with pytest.raises(TypeError):
            eval(expr, {"a": a})


def test_unary_operators():
    np.testing.assert_array_equal(np.array(-mx.array([1, -2])), [-1, 2])
    np.testing.assert_array_equal(np.array(abs(mx.array([1, -2]))), [1, 2])
    np.testing.assert_array_equal(np.array(~mx.array([0, 5], mx.uint8)), [255, 250])
    np.testing.assert_array_equal(np.array(~mx.array([True, False])), [False, True])
    a = mx.array([1])
    assert np.array(+a)[0] == 1
    with pytest.raises(ValueError, match="^Floating point types not allowed with bitwise inversion.$"):
        ~mx.array([1.0])
    with pytest.raises(ValueError, match=r"\[negative\] Not supported for bool"):
        -mx.array([True])


def test_operator_errors_match_mlx_messages():
    a = mx.array([1])
    cases = [("a + 'x'", ValueError, "Cannot perform addition on an mlx.core.array and str"),
             ("'x' * a", ValueError, "Cannot perform multiplication on an mlx.core.array and str"),
             ("a + [1]", ValueError, "Cannot perform addition on an mlx.core.array and list"),
             ("a < 'x'", ValueError, "Cannot perform less than on an mlx.core.array and str"),
             ("a // 'x'", ValueError, "Cannot perform floor division on an mlx.core.array and str"),
             ("a & 1.5", ValueError, "Floating point types not allowed with bitwise and."),
             ("mx.array([1.0]) << 1", ValueError, "Floating point types not allowed with left shift."),
             ("a + 2**31", ValueError, "Converting 2147483648 to int32 would result in overflow.")]
    for expr, exc, msg in cases:
        with pytest.raises(exc) as e:
            eval(expr, {"a": a, "mx": mx})
        assert str(e.value) == msg, expr
    for expr in ["a + None", "a < None", "a == None", "a != None"]:
        with pytest.raises(TypeError, match="incompatible function arguments"):
            eval(expr, {"a": a})


def test_equality_with_non_array_types_is_a_python_bool():
    a = mx.array([1, 2, 3])
    assert (a == "x") is False and (a != "x") is True
    assert (a == [1, 2, 3]) is False and (a == mx.float32) is False
    assert np.array(a == 2).tolist() == [False, True, False]
    assert np.array(2 == a).tolist() == [False, True, False]


def test_inplace_operators_overwrite_the_array_for_every_handle():
    x = mx.array([1, 2])
    y = x
    x += 1
    assert x is y and np.array(y).tolist() == [2, 3]
    x *= 1.5
    assert x.dtype == mx.float32 and np.array(y).tolist() == [3.0, 4.5]
    z = mx.array([6, 7])
    z //= 2
    z <<= 1
    z |= 1
    assert np.array(z).tolist() == [7, 7]
    w = mx.array([1.0])
    with pytest.raises(ValueError, match="Floating point types not allowed with bitwise and"):
        w &= 1
    with pytest.raises(ValueError, match="^Cannot perform inplace addition on an mlx.core.array and str$"):
        w += "x"
    i8 = mx.array([1], mx.int8)
    with pytest.raises(ValueError, match="Converting 1000 to int8"):
        i8 += 1000


def test_matmul_operator_dispatches_to_matmul():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(np.array(mx.array(a) @ mx.array(b)), a @ b)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        mx.array(a) @ "x"


def test_method_forms_match_functions_and_mlx_names(mlx):
    x = mx.array([0.5, 1.5, 2.25])
    for name in ["abs", "conj", "cos", "exp", "log", "log10", "log1p", "log2", "reciprocal",
                 "rsqrt", "sin", "sqrt", "square"]:
        assert hasattr(mlx.array, name)
        np.testing.assert_allclose(np.array(getattr(x, name)()),
                                   np.array(getattr(mlx.array([0.5, 1.5, 2.25]), name)()), rtol=1e-6)
    np.testing.assert_allclose(np.array(x.round(1)), np.array(mlx.array([0.5, 1.5, 2.25]).round(1)))
    np.testing.assert_allclose(np.array(x.round(decimals=1)), [0.5, 1.5, 2.2], rtol=1e-6)
    c = mx.array([1 + 2j])
    assert np.array(c.real).tolist() == [1.0] and np.array(c.imag).tolist() == [2.0]
    assert x.astype(mx.int32).dtype == mx.int32


def test_reflected_commutative_operators_keep_the_array_first_as_mlx():
    y = mx.array([1.0, 2.0])
    for expr in (2 * y, 2 + y):
        node = expr._d.node
        assert node.inputs[0] is y._d  # Multiply(y, 2) / Add(y, 2), as MLX records
    node = (2 - y)._d.node
    assert node.inputs[1] is y._d  # Subtract(2, y): order matters
    np.testing.assert_array_equal(np.array(2 * y), np.array([2.0, 4.0], np.float32))
