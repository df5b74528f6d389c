"""``mx.fast.cuda_kernel`` / ``precompiled_cuda_kernel``: MLX's errors where there is no CUDA
runtime (compared with MLX itself), MLX's generated signature, and on a GPU
(``TAPESCOPE_CUDA=1``) the documented example and kernels using shapes and strides, templates,
atomics with ``init_value``, ``verbose`` and the kernel cache."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tapescope.core as mx
from conftest import mlx_ref
from tapescope.kernels import backends

GPU = os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0
on_gpu = pytest.mark.skipif(not GPU, reason="needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")
no_gpu = pytest.mark.skipif(GPU, reason="the CUDA runtime is on: kernels are made")

EXP_SOURCE = """
    auto elem = cooperative_groups::this_grid().thread_rank();
    T tmp = inp[elem];
    out[elem] = exp(tmp);
"""


def _outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None


@no_gpu
def test_without_a_cuda_runtime_making_a_kernel_raises_mlxs_error():
    def make(m):
        return lambda: m.fast.cuda_kernel(name="myexp", input_names=["inp"],
                                          output_names=["out"], source=EXP_SOURCE)

    got = _outcome(make(mx))
    assert got == (RuntimeError, "[cuda_kernel] No CUDA back-end.")
    if mlx_ref is not None:
        assert got == _outcome(make(mlx_ref))


@no_gpu
@pytest.mark.parametrize("scalars", [[], [1, 2.0, True], ["x"]])
def test_without_a_cuda_runtime_precompiled_kernels_raise_mlxs_errors(scalars):
    def call(m):
        return lambda: m.fast.precompiled_cuda_kernel(
            name="k", compiled_source=b"", inputs=[m.ones(3)], output_shapes=[(3,)],
            output_dtypes=[m.float32], scalars=scalars, grid=(3, 1, 1), threadgroup=(3, 1, 1))

    got = _outcome(call(mx))
    if scalars == ["x"]:
        assert got == (ValueError, "[precompiled_cuda_kernel] Invalid scalar argument type. "
                                   "Received str but must be one of bool, int or float")
    else:
        assert got == (RuntimeError, "[cuda_kernel] No CUDA back-end.")
    if mlx_ref is not None:
        assert got == _outcome(call(mlx_ref))


def test_generated_signature_follows_mlxs_build_kernel():
    from tapescope.kernels.cuda import custom

    src = "out[0] = a[a_strides[0]] + b[0] * a_ndim;"
    name, text = custom.write_source(
        "k", ["a", "b"], ["out"], src, "// my header\n",
        [(np.dtype(np.float16), 2), (np.dtype(np.int32), 0)], [np.dtype(np.float32)],
        [("T", np.dtype(np.float32)), ("N", 3), ("B", False)])
    assert name == "custom_kernel_k_float_3_f"  # MLX's template hash
    body = text[text.index("// my header"):]
    assert body == (
        "// my header\n"
        "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
        "__global__ void custom_kernel_k_float_3_f(\n"
        "    const __half* a,\n"
        "    const __grid_constant__ Strides a_strides,\n"
        "    const __grid_constant__ int a_ndim,\n"
        "    const int32_t* b,\n"
        "    float* out) {\n"
        "  using T = float;\n  constexpr int N = 3;\n  constexpr bool B = false;\n\n"
        + src + "\n}\n\n} // namespace mlx::core::cu\n")
    # a 0-d input passes no shape even when the source names it; shape infos per input
    assert custom.shape_infos("x_shape y_ndim", ["x", "y"]) == [(True, False, False),
                                                               (False, False, True)]


# -- on the GPU ------------------------------------------------------------------------------
@pytest.fixture
def gpu(gpu_default_device):
    yield


@on_gpu
def test_the_documented_example_runs_and_prints_its_source(gpu, capsys):
    kernel = mx.fast.cuda_kernel(name="myexp", input_names=["inp"], output_names=["out"],
                                 source=EXP_SOURCE)
    a = mx.random.normal(shape=(16, 16)).astype(mx.float16)
    (b,) = kernel(inputs=[a], template=[("T", mx.float32)], grid=(a.size, 1, 1),
                  threadgroup=(256, 1, 1), output_shapes=[a.shape], output_dtypes=[a.dtype],
                  verbose=True)
    assert mx.allclose(b, mx.exp(a)).item()
    printed = capsys.readouterr().out
    assert "Generated source code for `custom_kernel_myexp_float`" in printed
    import tapescope

    rows = [e for e in tapescope.kernel_cache() if e["name"] == "custom_kernel_myexp_float"]
    assert rows and rows[0]["runtime"] == "cuda" and "exp(tmp)" in rows[0]["source"]


@on_gpu
def test_strided_inputs_with_shape_and_strides_arguments(gpu):
    src = """
        uint32_t elem = blockIdx.x * blockDim.x + threadIdx.x;
        if (elem >= out_size) return;
        int64_t loc = 0;
        uint32_t rem = elem;
        for (int d = inp_ndim - 1; d >= 0; --d) {
          loc += (rem % inp_shape[d]) * inp_strides[d];
          rem /= inp_shape[d];
        }
        out[elem] = inp[loc] * (T)2;
    """
    kernel = mx.fast.cuda_kernel(name="strided", input_names=["inp"], output_names=["out"],
                                 source=src, ensure_row_contiguous=False,
                                 header="constexpr uint32_t out_size = 12;\n")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = mx.transpose(mx.array(x))  # (4, 3) with strides (1, 4)
    (b,) = kernel(inputs=[a], template=[("T", mx.float32)], grid=(12, 1, 1),
                  threadgroup=(32, 1, 1), output_shapes=[(4, 3)], output_dtypes=[mx.float32])
    np.testing.assert_array_equal(np.array(b), x.T * 2)


@on_gpu
def test_atomic_row_sums_from_an_init_value(gpu):
    src = """
        uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= R * C) return;
        atomicAdd(&out[i / C], inp[i]);
    """
    kernel = mx.fast.cuda_kernel(name="rowsum", input_names=["inp"], output_names=["out"],
                                 source=src)
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    (s,) = kernel(inputs=[mx.array(x)], template=[("R", 5), ("C", 7)], grid=(35, 1, 1),
                  threadgroup=(64, 1, 1), output_shapes=[(5,)], output_dtypes=[mx.float32],
                  init_value=1.0)
    np.testing.assert_allclose(np.array(s), x.sum(1) + 1, rtol=1e-5)


@on_gpu
def test_call_errors_are_mlxs(gpu):
    kernel = mx.fast.cuda_kernel(name="e", input_names=["a", "b"], output_names=["o"],
                                 source="")
    with pytest.raises(ValueError, match=r"^\[custom_kernel\] Expected `inputs` to have size 2 "
                                         r"but got size 1\.\n$"):
        kernel(inputs=[mx.ones(3)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(3,)], output_dtypes=[mx.float32])
    with pytest.raises(ValueError, match=r"^\[custom_kernel\] Only supports the GPU\.$"):
        kernel(inputs=[mx.ones(3), mx.ones(3)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(3,)], output_dtypes=[mx.float32], stream=mx.cpu)
    with pytest.raises(ValueError, match=r"Invalid template argument"):
        kernel(inputs=[mx.ones(3), mx.ones(3)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(3,)], output_dtypes=[mx.float32], template=[("T", 1.5)])
    with pytest.raises(ValueError, match=r"Must specify at least one output"):
        mx.fast.cuda_kernel(name="e", input_names=["a"], output_names=[], source="")


@on_gpu
def test_a_precompiled_cubin_with_scalars(gpu):
    from tapescope.kernels.cuda.compiled import nvrtc_compile

    cubin, _ = nvrtc_compile("axpb", r"""
        extern "C" __global__ void axpb(const float* x, float* y, float a, int n) {
          int i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < n) y[i] = a * x[i] + 1.0f;
        }""")
    x = np.arange(100, dtype=np.float32)
    (y,) = mx.fast.precompiled_cuda_kernel(
        name="axpb", compiled_source=cubin, inputs=[mx.array(x)], output_shapes=[(100,)],
        output_dtypes=[mx.float32], scalars=[3.0, 100], grid=(100, 1, 1),
        threadgroup=(32, 1, 1))
    np.testing.assert_array_equal(np.array(y), 3 * x + 1)
