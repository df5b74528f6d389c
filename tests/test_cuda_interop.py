"""A GPU array handed to a consumer that asks DLPack for the CPU (``dl_device=(1, 0)``, as
MLX's test_array ``test_dlpack`` / ``test_dlpack_cpu_dtype_mapping`` do through numpy): its
host copy, every dtype MLX exports, strided views too, as MLX's CUDA arrays export host
memory (python/src/convert.cpp ``mlx_to_nd_array``). numpy is the reference. A consumer that
asks for nothing gets the device memory (``tests/test_cuda_runtime.py``: CuPy, JAX).

Runs on a GPU (``TAPESCOPE_CUDA=1``) and over the stand-in CuPy
(``tests/test_cuda_backend_fake.py``).
"""

from __future__ import annotations


import numpy as np
import pytest

import tapescope.core as mx
from conftest import needs_cuda

# the CUDA runtime needed (skips without it); the GPU the default device for each test
pytestmark = [needs_cuda, pytest.mark.usefixtures("gpu_default_device")]


class OnTheCpu:
    """A consumer's request for host memory (DLPack 1.0's ``dl_device``)."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, *args, **kwargs):
        kwargs["dl_device"] = (1, 0)
        return self.array.__dlpack__(*args, **kwargs)


DTYPES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
          "float16", "float32", "complex64"]


@pytest.mark.parametrize("name", DTYPES)
def test_numpy_reads_a_gpu_array_through_dlpack_on_the_cpu(name):
    host = (np.arange(12).reshape(3, 4) % 5).astype(getattr(np, name))
    x = mx.array(host) * 1 if name != "bool_" else mx.array(host) & True  # computed on the GPU
    got = np.from_dlpack(OnTheCpu(x))
    assert got.dtype == host.dtype
    np.testing.assert_array_equal(got, host)
    np.testing.assert_array_equal(np.from_dlpack(OnTheCpu(x[::2, ::3])), host[::2, ::3])
    np.testing.assert_array_equal(np.from_dlpack(OnTheCpu(mx.array(host)[1, 2])), host[1, 2])


def test_the_host_copy_is_the_values_at_export_and_the_array_stays_on_the_device():
    x = mx.arange(6, dtype=mx.float32) + 1
    got = np.from_dlpack(OnTheCpu(x))
    assert type(x._d.data) is not np.ndarray  # still device memory
    np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32) + 1)
    assert not got.flags.writeable or got.base is not None  # a read-only export or a copy


def test_torch_copies_a_gpu_array_through_its_cuda_array_interface():
    """MLX's test_fft_grads takes ``torch.tensor(x)`` of a GPU array: torch refuses an
    interface flagged read-only, so the interface is not flagged."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = mx.arange(12, dtype=mx.float32).reshape(3, 4) * 3
    assert x.__cuda_array_interface__["data"][1] is False
    t = torch.tensor(x, device="cpu")
    np.testing.assert_array_equal(t.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4) * 3)
