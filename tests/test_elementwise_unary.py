"""Unary elementwise ops: dtypes, values and errors against numpy / math and MLX."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import array_shapes

import tapescope.core as mx
from conftest import float64_stream

from elementwise_util import NAMES, NP, as_np, assert_close, name_of, values

FLOAT_OPS = ["sqrt", "rsqrt", "exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos",
             "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh",
             "arctanh", "sigmoid", "erf", "erfinv", "degrees", "radians", "reciprocal"]
SAME_OPS = ["abs", "negative", "sign", "square", "floor", "ceil", "round", "stop_gradient",
            "real", "imag", "conjugate", "conj", "bitwise_invert"]
PRED_OPS = ["logical_not", "isnan", "isinf", "isposinf", "isneginf", "isfinite"]
ALL_OPS = FLOAT_OPS + SAME_OPS + PRED_OPS


def _mx_input(mlx, name, data):
    return mlx.array(data.astype(np.float32), dtype=mlx.bfloat16) if name == "bfloat16" \
        else mlx.array(data, dtype=getattr(mlx, name))


@pytest.mark.parametrize("op", ALL_OPS)
def test_output_dtype_or_error_matches_mlx_for_every_dtype(mlx, op):
    rng = np.random.default_rng(0)
    for name in NAMES:
        data = values(rng, name, (3,), positive=True)
        ours = mx.array(data, getattr(mx, name)) if name != "bfloat16" else \
            mx.array(data.astype(np.float32), mx.bfloat16)
        try:
            ref = getattr(mlx, op)(_mx_input(mlx, name, data), stream=mlx.cpu)
            mlx.eval(ref)
        except Exception as e:  # MLX refuses this dtype: so must we, the same way
            with pytest.raises(type(e)) as got:
                getattr(mx, op)(ours)
            assert str(got.value) == str(e), (op, name)
            continue
        got = getattr(mx, op)(ours)
        assert repr(got.dtype) == repr(ref.dtype), (op, name)
        assert got.shape == ref.shape
        out_name = name_of(got.dtype)
        if op == "erfinv" or (op in ("sigmoid", "tan") and out_name == "float16"):
            rtol = {"float16": 4e-3, "bfloat16": 3e-2}.get(out_name, 1e-5)
            assert_close(as_np(got), as_np(ref), out_name, rtol=rtol)
        elif out_name == "float64":  # MLX's CPU computes some float64 math in float precision
            assert_close(as_np(got), as_np(ref), out_name, rtol=1e-6)
        else:
            assert_close(as_np(got), as_np(ref), out_name)


NUMPY_REF = {
    "sqrt": np.sqrt, "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p,
    "log2": np.log2, "log10": np.log10, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "arctan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
    "arcsinh": np.arcsinh, "abs": np.abs, "negative": np.negative, "square": np.square,
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "degrees": np.degrees, "radians": np.radians, "isnan": np.isnan, "isinf": np.isinf,
    "isfinite": np.isfinite, "isposinf": np.isposinf, "isneginf": np.isneginf,
}


@settings(max_examples=40, deadline=None)
@given(op=st.sampled_from(sorted(NUMPY_REF)),
       name=st.sampled_from(["float16", "float32", "float64"]),
       shape=array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
       seed=st.integers(0, 2**16))
def test_float_values_match_numpy(op, name, shape, seed):
    data = values(np.random.default_rng(seed), name, shape, positive=True)
    with float64_stream(name):
        got = getattr(mx, op)(mx.array(data, getattr(mx, name)))
        mx.eval(got)
    want = NUMPY_REF[op](data.astype(np.float64))
    assert got.shape == shape
    if got.dtype == mx.bool_:
        np.testing.assert_array_equal(np.array(got), want)
    else:
        assert got.dtype == getattr(mx, name)
        assert_close(np.array(got), want, name)


@settings(max_examples=30, deadline=None)
@given(op=st.sampled_from(["abs", "negative", "sign", "square", "floor", "ceil", "round",
                           "bitwise_invert", "logical_not"]),
       name=st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint32"]),
       shape=array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
       seed=st.integers(0, 2**16))
def test_integer_ops_keep_dtype_and_are_exact(op, name, shape, seed):
    data = values(np.random.default_rng(seed), name, shape)
    ref = {"abs": np.abs, "negative": np.negative, "sign": np.sign, "square": np.square,
           "floor": lambda x: x, "ceil": lambda x: x, "round": lambda x: x,
           "bitwise_invert": np.invert, "logical_not": np.logical_not}[op]
    got = getattr(mx, op)(mx.array(data))
    want = ref(data)
    assert np.array(got).dtype == want.dtype
    np.testing.assert_array_equal(np.array(got), want)


def test_integer_inputs_compute_in_float32():
    for op in FLOAT_OPS:
        assert getattr(mx, op)(mx.array([1, 2], mx.int16)).dtype == mx.float32, op


def test_half_precision_stays_half():
    for op in FLOAT_OPS:
        assert getattr(mx, op)(mx.array([0.5], mx.float16)).dtype == mx.float16, op
        assert getattr(mx, op)(mx.array([0.5], mx.bfloat16)).dtype == mx.bfloat16, op


def test_erf_matches_math_erf_to_float32_ulps():
    x = np.concatenate([np.linspace(-6, 6, 4001), [0.0, 1e-30, -1e-8, 3.0, -3.0]]).astype(np.float32)
    got = np.array(mx.erf(mx.array(x)))
    want = np.array([math.erf(float(v)) for v in x])
    np.testing.assert_allclose(got, want, rtol=1.2e-7, atol=1e-37)
    x64 = np.linspace(-5, 5, 1001)
    with float64_stream("float64"):
        got64 = np.array(mx.erf(mx.array(x64, mx.float64)))
    np.testing.assert_allclose(got64, [math.erf(v) for v in x64], rtol=5e-15, atol=1e-300)


def test_erf_special_values():
    got = np.array(mx.erf(mx.array([np.inf, -np.inf, np.nan, 0.0])))
    assert got[0] == 1 and got[1] == -1 and np.isnan(got[2]) and got[3] == 0


def test_erfinv_inverts_math_erf():
    y = np.linspace(-0.9999, 0.9999, 2001)
    with float64_stream("float64"):
        x = np.array(mx.erfinv(mx.array(y, mx.float64)))
    np.testing.assert_allclose([math.erf(v) for v in x], y, rtol=0, atol=1e-14)
    y32 = y.astype(np.float32)
    x32 = np.array(mx.erfinv(mx.array(y32)))
    assert x32.dtype == np.float32
    np.testing.assert_allclose([math.erf(float(v)) for v in x32], y32, rtol=0, atol=2e-7)


def test_erfinv_special_values():
    got = np.array(mx.erfinv(mx.array([1.0, -1.0, 1.5, -2.0, np.nan, 0.0])))
    assert got[0] == np.inf and got[1] == -np.inf
    assert np.isnan(got[2:5]).all() and got[5] == 0


def test_erf_and_erfinv_match_mlx(mlx):
    x = np.linspace(-4, 4, 801).astype(np.float32)
    # MLX's float32 erf is a cheaper approximation (errors of a few 1e-7); ours is within
    # an ulp of math.erf (tested above), so the two agree to MLX's accuracy
    np.testing.assert_allclose(np.array(mx.erf(mx.array(x))), np.array(mlx.erf(mlx.array(x))),
                               rtol=1e-5, atol=1e-6)
    y = np.linspace(-0.999, 0.999, 801).astype(np.float32)
    np.testing.assert_allclose(np.array(mx.erfinv(mx.array(y))),
                               np.array(mlx.erfinv(mlx.array(y))), rtol=2e-6, atol=1e-7)


def test_mlx_numerics_where_numpy_differs():
    # sign of NaN is 0; complex sign is z / |z|
    np.testing.assert_array_equal(np.array(mx.sign(mx.array([np.nan, -2.0, 0.0]))), [0, -1, 0])
    np.testing.assert_allclose(np.array(mx.sign(mx.array([3 + 4j, 0j]))), [0.6 + 0.8j, 0])
    # round half to even, with decimals through scale / round / unscale
    np.testing.assert_array_equal(np.array(mx.round(mx.array([0.5, 1.5, 2.5, -0.5]))),
                                  [0.0, 2.0, 2.0, -0.0])
    np.testing.assert_array_equal(np.array(mx.round(mx.array([15, 25, 14]), -1)), [20, 20, 10])
    # sigmoid saturates; abs of complex is its float32 magnitude
    np.testing.assert_array_equal(np.array(mx.sigmoid(mx.array([-np.inf, np.inf]))), [0, 1])
    a = mx.abs(mx.array([3 + 4j]))
    assert a.dtype == mx.float32 and np.array(a)[0] == 5
    # real / imag / conj of non-complex arrays
    i = mx.array([1, 2])
    # MLX: a new handle on the same array (an in-place operator on one must not reach the other)
    assert mx.real(i) is not i and mx.conj(i) is not i
    assert mx.real(i).tolist() == i.tolist() == mx.conj(i).tolist()
    np.testing.assert_array_equal(np.array(mx.imag(i)), [0, 0])
    assert mx.imag(i).dtype == mx.int32


def test_primitive_names_match_mlx_graph():
    def prim(a):
        return a._d.node.primitive.name

    x = mx.array([1.0, 2.0])
    for op, name in [("abs", "Abs"), ("sqrt", "Sqrt"), ("rsqrt", "Rsqrt"), ("log2", "Log2"),
                     ("arcsin", "ArcSin"), ("erfinv", "ErfInv"), ("sigmoid", "Sigmoid"),
                     ("stop_gradient", "StopGradient"), ("round", "Round"), ("floor", "Floor")]:
        assert prim(getattr(mx, op)(x)) == name
    assert prim(mx.logical_not(x)) == "LogicalNot"
    assert prim(mx.bitwise_invert(mx.array([1]))) == "BitwiseInvert"
    assert prim(mx.reciprocal(x)) == "Divide"
    assert prim(mx.isnan(x)) == "NotEqual"
    e = mx.exp(mx.array([1, 2]))
    assert prim(e) == "Exp" and e._d.node.inputs[0].node.primitive.name == "AsType"


def test_errors_match_mlx_messages():
    cases = [
        (lambda: mx.negative(mx.array([True])), ValueError,
         "[negative] Not supported for bool, use logical_not instead."),
        (lambda: mx.floor(mx.array([1j])), ValueError, "[floor] Not supported for complex64."),
        (lambda: mx.ceil(mx.array([1j])), ValueError, "[ceil] Not supported for complex64."),
        (lambda: mx.expm1(mx.array([1j])), ValueError, "[expm1] Not supported for complex64."),
        (lambda: mx.sigmoid(mx.array([1j])), ValueError, "[sigmoid] Not supported for complex64."),
        (lambda: mx.erf(mx.array([1j])), ValueError, "[erf] Not supported for complex64."),
        (lambda: mx.erfinv(mx.array([1j])), ValueError, "[erfinv] Not supported for complex64."),
        (lambda: mx.bitwise_invert(mx.array([1.0])), ValueError,
         "[bitwise_invert] Bitwise inverse only allowed on integer types."),
        (lambda: mx.exp([1, 2]), ValueError, "Invalid type list received in array initialization."),
        (lambda: mx.exp("a"), ValueError, "Invalid type str received in array initialization."),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc) as e:
            fn()
        assert str(e.value) == msg
    with pytest.raises(TypeError, match=r"^exp\(\): incompatible function arguments"):
        mx.exp(None)
    with pytest.raises(TypeError, match=r"^round\(\): incompatible function arguments"):
        mx.round(mx.array([1.0]), 1.5)
