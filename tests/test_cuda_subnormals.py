"""Subnormal floats on the GPU keep their value where MLX's CUDA kernels keep it: a cast to
bool of a subnormal is true (MLX's test_ops ``test_subnormal_bool_cast``), as ``any`` / ``all``
of one, for float32, float16, bfloat16 and complex64, and ±0 stays false. CuPy's own kernels
flush subnormals (``-ftz=true``): ``kernels/cuda/casts.py`` casts by the bits. numpy (and
ml_dtypes) on the host is the reference.

Runs on a GPU (``TAPESCOPE_CUDA=1``) and over the stand-in CuPy
(``tests/test_cuda_backend_fake.py``: there numpy computes, so only the plumbing is checked).
"""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

import tapescope.core as mx
from conftest import needs_cuda

# the CUDA runtime needed (skips without it); the GPU the default device for each test
pytestmark = [needs_cuda, pytest.mark.usefixtures("gpu_default_device")]


# bit patterns: the smallest and largest subnormals of each sign, ±0, a normal, inf, NaN
BITS = {
    "float32": (np.uint32, np.float32, [0x00000001, 0x807FFFFF, 0x00000000, 0x80000000,
                                        0x3F800000, 0x7F800000, 0x7FC00000]),
    "float16": (np.uint16, np.float16, [0x0001, 0x83FF, 0x0000, 0x8000, 0x3C00, 0x7C00, 0x7E00]),
    "bfloat16": (np.uint16, ml_dtypes.bfloat16, [0x0001, 0x807F, 0x0000, 0x8000, 0x3F80,
                                                 0x7F80, 0x7FC0]),
}


@pytest.mark.parametrize("name", sorted(BITS))
def test_a_subnormal_cast_to_bool_is_true_and_a_zero_false(name):
    uint, host_dtype, bits = BITS[name]
    host = np.array(bits, dtype=uint).view(host_dtype)
    x = mx.array(np.array(bits, dtype=uint)).view(getattr(mx, name))
    np.testing.assert_array_equal(np.array(x.astype(mx.bool_)), host.astype(np.float32) != 0)
    sub = mx.array(np.array(bits[:1], dtype=uint)).view(getattr(mx, name))
    assert sub.astype(mx.bool_).item() is True
    assert mx.any(sub).item() is True and mx.all(sub).item() is True
    # a strided view casts as well
    np.testing.assert_array_equal(np.array(x[::2].astype(mx.bool_)), (host.astype(np.float32) != 0)[::2])


def test_a_complex_is_true_when_either_part_is_nonzero_subnormals_included():
    tiny = np.array([1], np.uint32).view(np.float32)[0]
    host = np.array([complex(tiny, 0), complex(0, -tiny), 0j, complex(-0.0, -0.0), 1 + 0j],
                    dtype=np.complex64)
    got = np.array(mx.array(host).astype(mx.bool_))
    np.testing.assert_array_equal(got, host != 0)
    np.testing.assert_array_equal(got, [True, True, False, False, True])


def test_other_casts_are_unchanged():
    host = np.array([-1.5, 0.0, 2.25, 7.0], np.float32)
    x = mx.array(host)
    np.testing.assert_array_equal(np.array(x.astype(mx.int32)), host.astype(np.int32))
    np.testing.assert_array_equal(np.array(x.astype(mx.float16)), host.astype(np.float16))
    np.testing.assert_array_equal(np.array(mx.array([0, 3, -1]).astype(mx.bool_)), [False, True, True])
