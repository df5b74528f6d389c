"""Compiled kernels give exactly what the ops give one by one: reproducers of the cases that once differed,
a sample of random graphs and a sample of every variant at every output alignment phase
(``make test-fuzz`` and ``make test-ub`` run the large versions; see tests/compile_fuzz.py)."""

from __future__ import annotations

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels.cpu import compiler

import compile_fuzz as fz

needs_cc = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")


@needs_cc
def test_int8_sin_past_the_streaming_cut_is_the_correctly_rounded_sine():
    """Was NaN and garbage at >= 2^21 elements (strict-aliasing in the streaming stores).
    numpy's own float32 sin is 1 ulp off at +-1, so the reference is float64's, rounded."""
    a = (np.arange(2**21) % 7 - 3).astype(np.int8)
    got = np.array(mx.compile(mx.sin)(mx.array(a)))
    want = np.sin(a.astype(np.float64)).astype(np.float32)
    assert fz.mismatches(got, want) == 0
    eager = np.array(mx.sin(mx.array(a)))
    assert np.max(np.abs(got.view(np.int32).astype(np.int64) - eager.view(np.int32))) <= 1


@needs_cc
def test_int8_to_int32_times_three_past_the_streaming_cut_equals_uncompiled():
    x = mx.ones(2**21, dtype=mx.int8)
    f = lambda v: v.astype(mx.int32) * 3  # noqa: E731
    got, want = np.array(mx.compile(f)(x)), np.array(f(x))
    assert fz.mismatches(got, want) == 0 and (want == 3).all()


@needs_cc
def test_float16_two_output_chain_past_the_streaming_cut_equals_uncompiled():
    rng = np.random.default_rng(5)
    n = 2**21 + 5
    x = mx.array(rng.uniform(-4, 4, n).astype(np.float16))
    y = mx.array(rng.uniform(-4, 4, n).astype(np.float16))
    f = lambda a, b: (a * b + a, a * b + a - b)  # noqa: E731
    for got, want in zip(mx.compile(f)(x, y), f(x, y)):
        assert fz.mismatches(np.array(got), np.array(want)) == 0


@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_of_equal_zeros_give_the_second_operand_as_mlx(dt, op):
    """MLX: ``x < y ? x : y`` (after NaN), so a tie between 0.0 and -0.0 gives ``y``; numpy's
    float16 ufunc gives ``x``. Eager and compiled both follow MLX."""
    a = mx.zeros(64, dtype=getattr(mx, dt))
    b = mx.full(64, -0.0, dtype=getattr(mx, dt))
    fn = getattr(mx, op)
    for x, y, neg in ((a, b, True), (b, a, False)):
        for res in (fn(x, y), mx.compile(lambda u, v: fn(u * 1, v))(x, y)):
            bits = np.array(res.astype(mx.float32))
            assert np.signbit(bits).all() == neg and np.signbit(bits).any() == neg


@needs_cc
def test_random_compiled_graphs_equal_uncompiled_bit_for_bit():
    tot = fz.run_graphs(40, seed=11)
    assert tot["graphs"] == 40 and tot["elements"] > 0
    assert tot["mismatches"] == 0, "\n".join(tot["failures"])


@needs_cc
@pytest.mark.parametrize("case", fz.variant_cases(False, sample=24), ids=str)
def test_kernel_variant_equals_interpreter_at_every_output_phase(case):
    assert fz.check_variant(case) == []


def test_threshold_sizes_straddle_every_kernel_cut():
    from tapescope.kernels.codegen.render import CDialect as D

    sizes = set(fz.threshold_sizes())
    for cut in (D.omp_min_size, D.stream_block, D.tile, D.stream_min_bytes // 4):
        assert cut - 1 in sizes and cut in sizes, cut  # the last size below and the first at
    assert max(sizes) == 3 * 2**21


@needs_cc
def test_sampled_kernels_have_no_undefined_behaviour_under_the_sanitizers(tmp_path):
    """A sample of ``make test-ub``: random graphs and variants with kernels built under
    ASan + UBSan (any report aborts the run)."""
    import os
    import subprocess
    import sys

    import run_sanitized

    env = run_sanitized.sanitizer_env(str(tmp_path / "kernels"))
    if env is None:
        pytest.skip("the C compiler has no sanitizer runtimes")
    here = os.path.dirname(__file__)
    r = subprocess.run([sys.executable, os.path.join(here, "compile_fuzz.py"), "--graphs", "8",
                        "--variants", "sample", "--sample", "6", "--seed", "3", "--max-size", str(2**21 + 5)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "0 mismatching elements" in r.stdout and "0 failing" in r.stdout


@needs_cc
@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("it", ["int8", "int32", "int64", "uint32"])
def test_float_to_int_and_back_gives_plus_zero_for_values_in_minus_one_to_zero(dt, it):
    """gcc -fno-trapping-math folds (float)(int)x into trunc(x), which keeps the sign of -0.5;
    an integer 0 converts to +0.0 (numpy, MLX, the uncompiled path)."""
    vals = np.array([-0.75, -0.5, -0.0, 0.0, 0.25, -1.0, 1.5, -2.5] * 9, dtype=np.float32)
    x = mx.array(vals).astype(getattr(mx, dt))
    if it.startswith("u"):
        x = mx.abs(x)
    f = lambda v: (v * 1).astype(getattr(mx, it)).astype(getattr(mx, dt))  # noqa: E731
    got, want = fz.to_numpy(mx.compile(f)(x)), fz.to_numpy(f(x))
    assert fz.mismatches(got, want) == 0
    assert not np.signbit(want.astype(np.float32)[want.astype(np.float32) == 0]).any()


@needs_cc
def test_float64_to_float16_rounds_once_as_numpy():
    """1 + 2^-11 + 2^-40 is just above a float16 midpoint: one rounding gives 1 + 2^-10, but
    through float32 it lands on the midpoint and ties to 1.0 (found by the variant sweep)."""
    base = np.array([1 + 2.0**-11 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40), 3 + 2.0**-9 + 2.0**-35,
                     1 + 2.0**-11 - 2.0**-40, 0.1, 65519.99], dtype=np.float64)
    vals = np.tile(base, 11)
    f = lambda v: (v * 1).astype(mx.float16)  # noqa: E731
    x = mx.array(vals, dtype=mx.float64)  # (float64 numpy data alone becomes float32, as in MLX)
    got = fz.to_numpy(mx.compile(f)(x))
    assert fz.mismatches(got, vals.astype(np.float16)) == 0
    assert fz.mismatches(fz.to_numpy(f(x)), vals.astype(np.float16)) == 0
