"""Dtypes, categories, promotion, finfo / iinfo and isdtype, checked against MLX and numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tapescope.core as mx
from tapescope.core import dtypes as D

NAMES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
         "float16", "float32", "float64", "bfloat16", "complex64"]
CATS = ["complexfloating", "floating", "inexact", "signedinteger", "unsignedinteger", "integer",
        "number", "generic"]


def test_dtype_sizes_reprs_and_numpy_types_match_numpy():
    for n in NAMES:
        d = getattr(mx, n)
        np_t = ml_dtypes.bfloat16 if n == "bfloat16" else np.dtype(n.rstrip("_"))
        assert d.size == np.dtype(np_t).itemsize
        assert repr(d) == f"mlx.core.{n.rstrip('_')}"
        assert d == getattr(mx, n) and hash(d) == hash(getattr(mx, n))
    assert mx.float32 != "float32"


def test_dtypes_match_mlx(mlx):
    for n in NAMES:
        assert repr(getattr(mx, n)) == repr(getattr(mlx, n))
        assert getattr(mx, n).size == getattr(mlx, n).size
    for c in CATS:
        assert repr(getattr(mx, c)) == repr(getattr(mlx, c))
        assert str(getattr(mx, c)) == str(getattr(mlx, c))


def test_promote_types_match_mlx_for_every_pair(mlx):
    for a in NAMES:
        for b in NAMES:
            x = mlx.zeros((1,), dtype=getattr(mlx, a)) + mlx.zeros((1,), dtype=getattr(mlx, b))
            got = D.promote_types(getattr(mx, a), getattr(mx, b))
            assert repr(got) == repr(x.dtype), (a, b)


def test_promote_types_is_symmetric_and_idempotent():
    for a in D.ALL_DTYPES:
        assert D.promote_types(a, a) == a
        for b in D.ALL_DTYPES:
            assert D.promote_types(a, b) == D.promote_types(b, a)


def test_issubdtype_matches_mlx_for_every_pair(mlx):
    things = NAMES + CATS
    for a in things:
        for b in things:
            assert mx.issubdtype(getattr(mx, a), getattr(mx, b)) == \
                mlx.issubdtype(getattr(mlx, a), getattr(mlx, b)), (a, b)


def test_issubdtype_errors_match_mlx(mlx):
    for args in [(1, mx.inexact), (mx.float32, 1), (mx.floating, "x")]:
        margs = tuple(getattr(mlx, repr(v).split(".")[-1]) if isinstance(v, (D.Dtype, D.DtypeCategory)) else v
                      for v in args)
        with pytest.raises(ValueError) as ref:
            mlx.issubdtype(*margs)
        with pytest.raises(ValueError) as got:
            mx.issubdtype(*args)
        assert str(got.value) == str(ref.value)


def test_isdtype_matches_mlx_for_every_kind(mlx):
    kinds = ["bool", "signed integer", "unsigned integer", "integral", "real floating",
             "complex floating", "numeric"]
    for n in NAMES:
        for k in kinds:
            assert mx.isdtype(getattr(mx, n), k) == mlx.isdtype(getattr(mlx, n), k), (n, k)
        assert mx.isdtype(getattr(mx, n), (mx.int8, "bool")) == \
            mlx.isdtype(getattr(mlx, n), (mlx.int8, "bool"))
        assert mx.isdtype(getattr(mx, n), getattr(mx, n))


def test_isdtype_errors():
    with pytest.raises(ValueError, match=r"\[isdtype\] Unknown data type kind: 'foo'\."):
        mx.isdtype(mx.float32, "foo")
    with pytest.raises(ValueError, match=r"\[isdtype\] `kind` must be a dtype"):
        mx.isdtype(mx.float32, 1)
    with pytest.raises(ValueError, match=r"\[isdtype\] `kind` must be a dtype"):
        mx.isdtype(mx.float32, mx.floating)
    with pytest.raises(TypeError, match=r"isdtype\(\): incompatible function arguments"):
        mx.isdtype(1, "bool")


@pytest.mark.parametrize("name", ["float16", "float32", "float64", "bfloat16", "complex64"])
def test_finfo_matches_mlx(mlx, name):
    got, ref = mx.finfo(getattr(mx, name)), mlx.finfo(getattr(mlx, name))
    assert repr(got) == repr(ref)
    for attr in ("min", "max", "eps", "smallest_normal", "bits"):
        assert getattr(got, attr) == getattr(ref, attr), attr
    assert repr(got.dtype) == repr(ref.dtype)


@pytest.mark.parametrize("name", ["uint8", "uint16", "uint32", "uint64", "int8", "int16",
                                  "int32", "int64"])
def test_iinfo_matches_numpy_and_mlx(mlx, name):
    got, ref = mx.iinfo(getattr(mx, name)), mlx.iinfo(getattr(mlx, name))
    assert (got.min, got.max) == (int(np.iinfo(name).min), int(np.iinfo(name).max))
    assert (got.min, got.max) == (ref.min, ref.max)
    assert repr(got) == repr(ref)
    assert repr(got.dtype) == repr(ref.dtype)


def test_finfo_iinfo_errors():
    with pytest.raises(ValueError, match=r"^\[finfo\] dtype int32 is not inexact\.$"):
        mx.finfo(mx.int32)
    with pytest.raises(ValueError, match=r"^\[iinfo\] Only integer types supported but float32 was provided$"):
        mx.iinfo(mx.float32)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        mx.finfo(mx.floating)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        mx.iinfo(mx.integer)


@pytest.mark.parametrize("name", ["uint8", "uint16", "uint32", "int8", "int16", "int32"])
def test_bfloat16_to_an_integer_converts_through_float_as_mlx_does(name):
    """MLX's cast converts the bfloat16's float value (wrapping out of range as float32's
    cast does: -1 -> 255 for uint8); ml_dtypes' own cast saturates since 0.7, so the
    reference here is numpy's float32 cast, whatever ml_dtypes is installed."""
    # -1 is the one negative whose wrapped and saturated-to-all-ones results agree on every
    # x86-64 (with or without AVX-512's unsigned conversions)
    h = np.array([-1.0, 3.7, -0.5, 100.0, 0.0], np.float32)
    x = mx.array(h).astype(mx.bfloat16)
    want = np.asarray(x.astype(mx.float32)).astype(name)
    np.testing.assert_array_equal(np.asarray(x.astype(getattr(mx, name))), want)
    try:
        import mlx.core as mlx
    except ImportError:
        return
    ref = mlx.array(h).astype(mlx.bfloat16).astype(getattr(mlx, name))
    np.testing.assert_array_equal(np.asarray(x.astype(getattr(mx, name))), np.array(ref))
