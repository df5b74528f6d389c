"""``RandomBits`` and ``ErfInv`` as generated C (``kernels/cpu/random_kernels.py``): the bits
equal the array-module rule's (MLX's layout) and MLX's own for every width, shape and key
count; erfinv equals the rule bit for bit in float32 / float16 / bfloat16 (one thread's loop
and the threaded one) and inverts
``math.erf`` in float64, special values included, also written over its own input."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from conftest import mlx_ref
from tapescope.kernels.cpu import compiler
from tapescope.kernels.cpu import random_kernels as rk
from tapescope.kernels.primitives import REGISTRY

needs_cc = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")


@needs_cc
@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3), width=st.sampled_from([1, 2, 4]),
       nk=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2 ** 32 - 1))
def test_random_bits_equal_the_rule(shape, width, nk, seed):
    shape = [nk] + shape  # each key fills its own chunk
    keys = np.random.default_rng(seed).integers(0, 2 ** 32, (nk, 2), dtype=np.uint64)
    keys = keys.astype(np.uint32)
    got = rk.random_bits(np, keys, shape=tuple(shape), width=width)
    ref = REGISTRY["RandomBits"].rule(np, keys, shape=tuple(shape), width=width)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


@needs_cc
@pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")
@pytest.mark.parametrize("shape", [(7,), (3, 5), (1000, 3)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_uniform_through_the_kernel_equals_mlx(shape, dtype):
    """uniform's bits (4- and 2-byte widths) through the kernel: MLX's values exactly."""
    ours = mx.random.uniform(shape=shape, dtype=getattr(mx, dtype), key=mx.random.key(7))
    theirs = mlx_ref.random.uniform(shape=shape, dtype=getattr(mlx_ref, dtype),
                                    key=mlx_ref.random.key(7))
    np.testing.assert_array_equal(np.array(ours.astype(mx.float32)),
                                  np.array(theirs.astype(mlx_ref.float32)))


Y = np.concatenate([np.linspace(-1, 1, 20001), [1.0, -1.0, 1.5, -2.0, np.nan, 0.0, -0.0,
                                                 0.9999999, -0.99999994]])


@needs_cc
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("every", [1, 7])  # 20010 values: the threaded loop; 2867: one thread's
def test_erfinv_equals_the_rule_in_narrow_types(dtype, every):
    a = np.concatenate([Y[:20001:every], Y[20001:]]).astype(dtype)
    got = rk.erfinv(np, a)
    ref = REGISTRY["ErfInv"].rule(np, a)
    assert got.dtype == ref.dtype
    g, r = got.astype(np.float64), ref.astype(np.float64)
    assert ((g == r) | (np.isnan(g) & np.isnan(r))).all()
    zero = a.astype(np.float64) == 0
    assert np.signbit(g[zero]).tolist() == np.signbit(r[zero]).tolist()


@needs_cc
def test_erfinv_float64_inverts_math_erf():
    got = rk.erfinv(np, Y.copy())
    inside = np.abs(Y) < 1
    np.testing.assert_allclose([math.erf(v) for v in got[inside]], Y[inside], rtol=0,
                               atol=1e-14)
    assert got[Y == 1.0].tolist() == [math.inf] * int((Y == 1.0).sum())
    assert np.isnan(got[np.isnan(Y) | (np.abs(Y) > 1)]).all()


@needs_cc
def test_erfinv_written_over_its_input():
    """The evaluator may give the input's own memory as ``out`` (a donation)."""
    a = Y.astype(np.float32)
    want = REGISTRY["ErfInv"].rule(np, a.copy())
    got = rk.erfinv(np, a, out=a)
    assert got is a
    assert ((got == want) | (np.isnan(got) & np.isnan(want))).all()


@needs_cc
def test_normal_through_the_kernels_is_the_rules():
    """mx.random.normal runs both kernels (on the timeline) and gives MLX's values (MLX's
    float32 erfinv is an approximation: within 1e-6)."""
    import tapescope

    with tapescope.record() as tl:
        x = np.array(mx.random.normal((300, 7), key=mx.random.key(3)))
    names = {r.name for r in tl.records if r.kind == "kernel_launch"}
    assert {"random_bits_threefry", "erfinv_float_float"} <= names, names
    assert np.isfinite(x).all()
    if mlx_ref is not None:
        ref = np.array(mlx_ref.random.normal((300, 7), key=mlx_ref.random.key(3)))
        np.testing.assert_allclose(x, ref, rtol=0, atol=1e-6)
