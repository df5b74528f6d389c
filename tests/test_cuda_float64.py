"""float64 on a GPU stream: MLX's array constructor with a primitive (mlx/array.cpp) refuses
it, for an input and for an output (``ValueError: float64 is not supported on the GPU``),
before anything is recorded; the same ops on a CPU stream compute in float64 (numpy float64
is the reference). MLX's test_double.py checks the refusals with DEVICE=gpu.

Runs on a GPU (``TAPESCOPE_CUDA=1``) and over the stand-in CuPy
(``tests/test_cuda_backend_fake.py`` runs this file in a process whose ``import cupy`` is
``tests/fake_cupy.py``: the check is host logic), with the C recorder (core/_call.c) and
with the Python one (``TAPESCOPE_C_CALL=0`` in a child process).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tapescope.core as mx
from conftest import needs_cuda

# the CUDA runtime needed (skips without it); the GPU the default device for each test
pytestmark = [needs_cuda, pytest.mark.usefixtures("gpu_default_device")]

MSG = "float64 is not supported on the GPU"
RNG = np.random.default_rng(7)
A = RNG.standard_normal((3, 3))
B = RNG.standard_normal((3, 3))


def doubles():
    return (mx.array(A, dtype=mx.float32).astype(mx.float64, stream=mx.cpu),
            mx.array(B, dtype=mx.float32).astype(mx.float64, stream=mx.cpu))


REFUSED = {
    "astype to float64": lambda a, b: mx.array(A, dtype=mx.float32).astype(mx.float64),
    "unary": lambda a, b: mx.exp(a),
    "binary": lambda a, b: a + b,
    "comparison (bool out)": lambda a, b: a < b,
    "where": lambda a, b: mx.where(mx.array(A > 0), a, b),
    "reduction": lambda a, b: mx.sum(a, axis=0),
    "matmul": lambda a, b: a @ b,
    "gather": lambda a, b: a[mx.array([0, 2]), mx.array([0, 2])],
    "multi-output": lambda a, b: mx.divmod(a, b),
    "creation": lambda a, b: mx.zeros((2,), dtype=mx.float64),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_gpu_op_with_a_float64_input_or_output_is_refused_as_in_mlx(name):
    a, b = doubles()
    with pytest.raises(ValueError, match=MSG):
        REFUSED[name](a, b)


def test_a_refused_setitem_leaves_the_array_as_it_was():
    a, b = doubles()
    before = a._d
    with pytest.raises(ValueError, match=MSG):
        a[mx.array([0, 2]), mx.array([0, 2])] = mx.array([1.0, 2.0]).astype(mx.float64, stream=mx.cpu)
    assert a._d is before
    np.testing.assert_array_equal(np.array(a), A.astype(np.float32).astype(np.float64))


def test_the_same_ops_on_a_cpu_stream_compute_in_float64():
    a, b = doubles()
    a32, b32 = A.astype(np.float32).astype(np.float64), B.astype(np.float32).astype(np.float64)
    with mx.stream(mx.cpu):
        got = {"exp": mx.exp(a), "add": a + b, "sum": mx.sum(a, axis=0), "matmul": a @ b}
    want = {"exp": np.exp(a32), "add": a32 + b32, "sum": a32.sum(axis=0), "matmul": a32 @ b32}
    for k, v in got.items():
        assert v.dtype == mx.float64, k
        np.testing.assert_allclose(np.array(v), want[k], rtol=1e-12, err_msg=k)


def test_float64_data_may_live_on_the_gpu_device_and_be_read_back():
    """No primitive, nothing refused (MLX: an array made from data has no stream check)."""
    x = mx.array([1.0, 2.0], mx.float64)
    assert x.dtype == mx.float64
    np.testing.assert_array_equal(np.array(x), [1.0, 2.0])
    assert x.tolist() == [1.0, 2.0]


def test_the_python_recorder_refuses_as_the_c_one():
    code = ("import sys, tapescope.core as mx; mx.set_default_device(mx.gpu);"
            "from tapescope.core.array import array;"
            "assert array._make1.__class__.__name__ == 'function';"
            "a = mx.array([1.0, 2.0]).astype(mx.float64, stream=mx.cpu)\n"
            "for f in (lambda: mx.exp(a), lambda: mx.divmod(a, a), lambda: mx.ones((2,)).astype(mx.float64)):\n"
            "    try:\n        f()\n    except ValueError as e:\n        assert str(e) == %r, e\n"
            "    else:\n        sys.exit('not refused')\n"
            "print('refused')" % MSG)
    env = dict(os.environ, TAPESCOPE_C_CALL="0")
    r = subprocess.run([sys.executable, "-c", _preamble() + code], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "refused" in r.stdout, r.stdout + r.stderr


def _preamble() -> str:
    """In the stand-in CuPy's process, the child gets the stand-in too."""
    import cupy

    if getattr(cupy, "__fake__", False):
        here = os.path.dirname(os.path.abspath(__file__))
        return "import sys; sys.path.insert(0, %r); import fake_cupy; fake_cupy.install()\n" % here
    return ""
