"""Argument checks as MLX 0.32.4 makes them, compared with MLX itself (type and whole
message, or the result): 32-bit shape dimensions computed by an op (concatenate, repeat,
kron) or given by numpy data, 32-bit int and slice indices, nanobind's int caster for shape
entries (numpy ints yes; floats and strings no), arange's overloads and its infinite steps,
and put_along_axis's index dtype on an empty array (MLX never runs an empty scatter)."""

from __future__ import annotations

import numpy as np
import pytest

import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import same_error

ERRORS = [
    "M.concatenate([M.zeros(2**30)] * 3)",
    "M.repeat(M.zeros(2**30), 2)",
    "M.kron(M.zeros(2**16), M.zeros(2**16))",
    "M.array([0, 1, 2])[: 2**32]",
    "M.array([0, 1, 2])[2**32]",
    "M.array([0, 1, 2])[-(2**31) - 1]",
    "M.array([0, 1, 2])[::2**31]",
    "M.reshape(M.arange(4), [np.float32(2), 2])",
    "M.reshape(M.arange(4), ['2', 2])",
    "M.reshape(M.arange(4), (2.5, 2))",
    "M.broadcast_to(M.arange(2), [2.0, 2])",
    "M.arange(start=1, step=2)",
    "M.arange(float('nan'), 1, 5)",
    "M.arange(0, float('inf'), float('inf'))",
    "M.arange(float('inf'), 1, 5)",
    "M.arange(0, 0, 0)",
    "M.arange(0, 2**31, 1)",
    "M.take_along_axis(M.array([1.0, 2.0]), M.array([1.0, 0.0]), axis=0)",
    "M.put_along_axis(M.array([1.0, 2.0]), M.array([1.0, 0.0]), M.array([1.0, 0.0]), axis=0)",
]


@pytest.mark.parametrize("src", ERRORS)
def test_errors_match_mlx(src):
    same_error(lambda M: eval(src, {"M": M, "np": np}))


def test_numpy_data_with_a_dimension_past_32_bits_is_refused():
    big = np.empty(2**31, dtype=np.bool_)  # untouched pages: nothing is allocated
    with pytest.raises(OverflowError) as e:
        mx.array(big)
    assert str(e.value) == ("Shape dimension 2147483648 is outside the supported range "
                            "[-2147483648, 2147483647]. MLX currently uses 32-bit integers for "
                            "shape dimensions.")


RESULTS = [
    "M.arange(0, 10, float('inf'))", "M.arange(0, -10, float('-inf'))",
    "M.arange(10, 0, float('inf'))", "M.arange(0, 10, float('-inf'))",
    "M.arange(2, step=0.5)", "M.arange(stop=3)", "M.arange(start=1, stop=3)",
    "M.reshape(M.arange(4), [np.int32(2), 2])",
    "M.put_along_axis(M.array([], M.float32), M.array([], M.float32), M.array([], M.float32), "
    "axis=None)",
    "M.array([0, 1, 2])[2**31 - 3:]",
]


@pytest.mark.parametrize("src", RESULTS)
def test_results_match_mlx(src):
    got = eval(src, {"M": mx, "np": np})
    if mlx_ref is None:
        pytest.skip("mlx is not installed")
    want = eval(src, {"M": mlx_ref, "np": np})
    assert got.tolist() == want.tolist() and got.shape == want.shape
    assert got.dtype.name == str(want.dtype).split(".")[-1]


def test_infinite_steps_give_the_start_alone_or_nothing():
    assert mx.arange(0, 10, float("inf")).tolist() == [0.0]
    assert mx.arange(3, -10, float("-inf")).tolist() == [3.0]
    assert mx.arange(10, 0, float("inf")).tolist() == []
