"""repr/str of arrays and the print options, compared character for character with MLX."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tapescope.core as mx
from tapescope.core import printing

from conftest import mlx_ref, requires_mlx

pytestmark = requires_mlx

DTYPES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
          "float16", "float32", "float64", "bfloat16", "complex64"]


@pytest.fixture(autouse=True)
def _default_precision():
    """Every test starts and ends with the default print options in both libraries."""
    mlx_ref.set_printoptions(precision=-1)
    printing.set_printoptions(precision=-1)
    yield
    mlx_ref.set_printoptions(precision=-1)
    printing.set_printoptions(precision=-1)


def both(mlx, data: np.ndarray, dtype: str):
    """The same values as a tapescope array and an MLX array of dtype ``dtype``."""
    ours = mx.array(data, dtype=getattr(mx, dtype))
    ref = mlx.array(data, dtype=getattr(mlx, dtype))
    return ours, ref


def assert_prints_like(mlx, data, dtype):
    ours, ref = both(mlx, np.asarray(data), dtype)
    assert repr(ours) == repr(ref)
    assert str(ours) == str(ref)


# -- values -----------------------------------------------------------------------------
FLOATS = [0.0, -0.0, 1.0, -1.5, 0.1, 1 / 3, 2 / 3, 1e-5, 1e-4, 123456.0, 1234567.0, 12345678.0,
          1e10, 1e16, 3.4e38, 1e-7, 2.0 ** -149, 1e-40, 65504.0, 100000.0, 123456.7,
          math.inf, -math.inf, math.nan, -math.nan, 0.30000001, 999999.5, 9.999995e-5]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_special_floats_each_alone_and_together(mlx, dtype):
    for v in FLOATS:
        assert_prints_like(mlx, np.array(v), dtype)
    assert_prints_like(mlx, np.array(FLOATS[:6]), dtype)


def test_negative_nan_prints_with_sign(mlx):
    assert_prints_like(mlx, np.array([-math.nan, math.nan]), "float32")


COMPLEX = [1 + 2j, -1 - 2j, 0.5j, -0.5j, complex(0, -0.0), complex(-0.0, 0.0), complex(math.nan, 1),
           complex(1, math.nan), complex(1, -math.nan), complex(math.inf, -math.inf), 1e10 + 1e-10j]


def test_complex_values(mlx):
    for v in COMPLEX:
        assert_prints_like(mlx, np.array(v, dtype=np.complex64), "complex64")
    assert_prints_like(mlx, np.array(COMPLEX, dtype=np.complex64), "complex64")


def test_bool_and_integer_extremes(mlx):
    assert_prints_like(mlx, np.array([True, False]), "bool_")
    assert_prints_like(mlx, np.array(True), "bool_")
    for name in ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]:
        info = np.iinfo(getattr(np, name))
        assert_prints_like(mlx, np.array([info.min, 0, info.max], dtype=info.dtype), name)


# -- shapes: empty, 0-d, high rank, summarisation ----------------------------------------
@pytest.mark.parametrize("shape", [(), (0,), (1,), (0, 3), (3, 0), (2, 0, 3), (1, 1, 1, 0), (8, 0),
                                   (6,), (7,), (2, 7), (7, 7), (2, 7, 2), (1, 2, 1, 2, 1), (3, 1, 2, 2)])
def test_shapes(mlx, shape):
    data = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    assert_prints_like(mlx, data, "int32")
    assert_prints_like(mlx, data.astype(np.float32) / 3, "float32")


def test_large_arrays_are_summarised(mlx):
    assert_prints_like(mlx, np.arange(1000), "int64")
    assert_prints_like(mlx, np.arange(2000).reshape(2, 1000), "int64")
    assert_prints_like(mlx, np.arange(8 * 9 * 10).reshape(8, 9, 10) / 7, "float32")
    assert "..." in repr(mx.array(np.arange(7)))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_random_arrays_print_like_mlx(data, dtype):
    mlx = mlx_ref
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=8), label="shape")
    if dtype == "bool_":
        elements = st.booleans()
        np_dtype = np.bool_
    elif dtype.startswith(("uint", "int")):
        info = np.iinfo(getattr(np, dtype))
        elements = st.integers(int(info.min), int(info.max))
        np_dtype = getattr(np, dtype)
    elif dtype == "complex64":
        elements = st.complex_numbers(allow_nan=True, allow_infinity=True, width=64)
        np_dtype = np.complex64
    else:
        elements = st.floats(allow_nan=True, allow_infinity=True, width=32)
        np_dtype = np.float32
    values = data.draw(hnp.arrays(np_dtype, shape, elements=elements), label="values")
    with np.errstate(all="ignore"):
        assert_prints_like(mlx, values, dtype)


@settings(max_examples=40, deadline=None)
@given(values=hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=2, max_side=5),
                         elements=st.floats(-1e12, 1e12)),
       precision=st.integers(-3, 8))
def test_precision_option_matches_mlx(values, precision):
    mlx = mlx_ref
    mlx.set_printoptions(precision=precision)
    printing.set_printoptions(precision=precision)
    for dtype in ("float32", "float16", "bfloat16", "float64", "int32", "complex64"):
        with np.errstate(all="ignore"):
            assert_prints_like(mlx, values, dtype)


# -- print options ----------------------------------------------------------------------
def test_get_printoptions_is_a_copy(mlx):
    printing.set_printoptions(precision=3)
    opts = printing.get_printoptions()
    assert opts.precision == 3 == (mlx.set_printoptions(precision=3), mlx.get_printoptions().precision)[1]
    opts.precision = 1
    assert printing.get_printoptions().precision == 3
    printing.set_printoptions()
    assert printing.get_printoptions().precision == -1 == mlx.PrintOptions().precision


def test_printoptions_context_restores(mlx):
    x, r = both(mlx, np.array([1 / 3]), "float32")
    printing.set_printoptions(precision=4)
    mlx.set_printoptions(precision=4)
    with printing.printoptions(precision=1) as ctx, mlx.printoptions(precision=1):
        assert isinstance(ctx, printing._PrintOptionsContext)
        assert repr(x) == repr(r) == "array([0.3], dtype=float32)"
    assert repr(x) == repr(r) == "array([0.3333], dtype=float32)"
    with pytest.raises(KeyError):
        with printing.printoptions(precision=2):
            raise KeyError("x")
    assert printing.get_printoptions().precision == 4


def test_printoptions_argument_errors(mlx):
    for fn in ("set_printoptions", "printoptions"):
        with pytest.raises(TypeError) as ours:
            getattr(printing, fn)(precision="a")
        with pytest.raises(TypeError) as ref:
            getattr(mlx, fn)(precision="a")
        assert str(ours.value) == str(ref.value)


# -- format() and print() -----------------------------------------------------------------
@pytest.mark.parametrize("value,spec", [(1, ""), (1, "d"), (1.5, ".2f"), (1.5, ""), (True, ""),
                                        (1 + 2j, ""), ([1, 2], ""), ([[1.5]], "")])
def test_format_matches_mlx(mlx, value, spec):
    assert format(mx.array(value), spec) == format(mlx.array(value), spec)
    assert f"{mx.array(value)}" == f"{mlx.array(value)}"


@pytest.mark.parametrize("value,spec", [([1.5], ".2f"), ([[1]], "5")])
def test_format_spec_on_non_scalar_is_an_error(mlx, value, spec):
    with pytest.raises(TypeError) as ours:
        format(mx.array(value), spec)
    with pytest.raises(TypeError) as ref:
        format(mlx.array(value), spec)
    assert str(ours.value) == str(ref.value)


def test_print_writes_the_repr(mlx, capsys):
    x, r = both(mlx, np.arange(6).reshape(2, 3) / 2, "float32")
    print(x)
    ours = capsys.readouterr().out
    print(r)
    assert ours == capsys.readouterr().out
