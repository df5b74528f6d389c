"""``mx.fast.metal_kernel``: MLX 0.32's signature, call, errors and generated source, and our
own kernels run through the Metal shim (tapescope's opt-in Linux path) against numpy: exp
(contiguous and strided through ``elem_to_loc``), templates of every kind, scalar inputs,
atomic outputs with ``init_value``, ``simd_sum``, and a ``custom_function`` whose forward and
VJP are kernels. MLX's own documented examples are run by tests/test_mlx_metal_sources.py
(from an MLX checkout; they are not copied here).

Without the shim, tapescope answers as MLX 0.32.4 does without Metal: "No Metal back-end".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels.metal import custom, shim

sys.path.insert(0, str(Path(__file__).parent))
from conftest import mlx_ref  # noqa: E402
from mlx_compare import same_error  # noqa: E402

needs_cxx = pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler on PATH")

EXP = """
    uint i = thread_position_in_grid.x;
    out[i] = metal::exp(T(inp[i]));
"""
EXP_STRIDED = """
    uint i = thread_position_in_grid.x;
    out[i] = metal::exp(T(inp[elem_to_loc(i, inp_shape, inp_strides, inp_ndim)]));
"""


@pytest.fixture
def on_shim():
    old = shim.enable(True)
    yield
    shim.enable(old)


def _call(M, kernel=None, **kw):
    k = kernel or M.fast.metal_kernel(name="myexp", input_names=["inp"], output_names=["out"],
                                      source=EXP)
    a = M.ones((4, 16))
    args = dict(inputs=[a], template=[("T", M.float32)], grid=(a.size, 1, 1),
                threadgroup=(256, 1, 1), output_shapes=[a.shape], output_dtypes=[a.dtype])
    args.update(kw)
    return k(**args)


# -- MLX's behaviour without Metal ----------------------------------------------------------
def test_without_metal_the_call_raises_mlx_error():
    shim.enable(False)
    same_error(lambda M: _call(M))
    same_error(lambda M: _call(M, stream=M.cpu))


def _export_outcomes(M, path):
    """Per ``stream=`` of a kernel call: what exporting it does without Metal (None: written,
    else (exception type name, message)), then the callback form's primitives."""
    out = {}
    for label, st in (("default", None), ("gpu", M.gpu), ("Device(gpu)", M.Device(M.gpu)),
                      ("cpu", M.cpu), ("cpu stream", M.default_stream(M.cpu))):
        for shapeless in (False, True):
            try:
                M.export_function(path, lambda a: _call(M, inputs=[a], stream=st)[0],
                                  M.ones((4, 16)), shapeless=shapeless)
                out[label, shapeless] = os.path.getsize(path) > 0 or "empty file"
            except Exception as e:  # noqa: BLE001
                out[label, shapeless] = (type(e).__name__, str(e))
    parts = []
    M.export_function(parts.append, lambda a: _call(M, inputs=[a], stream=M.gpu)[0], M.ones((4, 16)))
    out["callback"] = [(p["type"], p.get("name"), [tuple(s) for _, s, _ in p.get("outputs", [])])
                       for p in parts if p["type"] == "primitive"]
    return out


def test_without_metal_export_records_the_call_on_a_gpu_placeholder(tmp_path):
    shim.enable(False)
    ours = _export_outcomes(mx, str(tmp_path / "ours"))
    only_gpu = ("ValueError", "[metal_kernel] Only supports the GPU.")
    assert ours == {**{(k, s): True for k in ("default", "gpu", "Device(gpu)") for s in (0, 1)},
                    **{(k, s): only_gpu for k in ("cpu", "cpu stream") for s in (0, 1)},
                    "callback": [("primitive", "CustomKernel", [(4, 16)])]}
    if mlx_ref is not None:
        assert ours == _export_outcomes(mlx_ref, str(tmp_path / "theirs"))
    same_error(lambda M: _call(M, stream=M.gpu))  # outside an export: still MLX's error


@pytest.mark.parametrize("case", [
    lambda M: _call(M, template=[("T", 1.5)]),
    lambda M: _call(M, template=[("T", "float")]),
    lambda M: _call(M, inputs=[M.ones(3), M.ones(3)]),
    lambda M: _call(M, output_shapes=[(4,), (4,)]),
    lambda M: _call(M, output_dtypes=[M.float32, M.float32]),
    lambda M: M.fast.metal_kernel(name="k", input_names=["a"], output_names=[], source=""),
    lambda M: M.fast.metal_kernel(name="k", input_names=["a"], output_names=["b"], source="",
                                  compile_options=3),
    lambda M: M.fast.metal_kernel(name="k", input_names=["a"], output_names=["b"], source="",
                                  compile_options={"math_mode": "exact"}),
    lambda M: M.fast.metal_kernel(name="k", input_names=["a"], output_names=["b"], source="",
                                  compile_options={"opt": 1}),
    lambda M: M.fast.metal_kernel(name="k", input_names=["a"], output_names=["b"], source=3),
    lambda M: _call(M, grid=(4, 1)),
    lambda M: M.fast.metal_kernel(name="k", input_names=["a"], output_names=["b"],
                                  source="")(inputs=[M.ones(2)]),
])
def test_errors_are_mlx_errors(case):
    shim.enable(False)
    same_error(case)


def test_the_call_takes_mlx_keywords_only():
    k = mx.fast.metal_kernel(name="k", input_names=["a"], output_names=["b"], source="")
    with pytest.raises(TypeError, match="incompatible function arguments"):
        k([mx.ones(2)])


# -- the generated source (MLX's rules) -----------------------------------------------------
def test_signature_rules():
    src = "uint i = thread_position_in_grid.x; out[i] = a[i] * b + c_shape[0] + c[0]" \
          " + threads_per_simdgroup;"
    name, text = custom.write_source(
        "k", ["a", "b", "c"], ["out"], src, "// header\n", False,
        [custom.Input(np.dtype(np.float32), 2, 64), custom.Input(np.dtype(np.float16), 0, 1),
         custom.Input(np.dtype(np.int32), 1, 3)],
        [np.dtype(np.float32)], [("T", np.dtype(np.float32)), ("N", 3), ("B", True)])
    assert name == "custom_kernel_k__float_3_1_float_float16_ts_int32_tc_float"
    assert text.startswith("// header\ntemplate <typename T, int N, bool B>\n"
                           f"[[kernel]] void {name}(\n")
    assert ("  const device float* a [[buffer(0)]],\n"
            "  const constant float16_t& b [[buffer(1)]],\n"
            "  const constant int32_t* c [[buffer(2)]],\n"
            "  const constant int* c_shape [[buffer(3)]],\n"
            "  device float* out [[buffer(4)]],\n"
            "  uint3 thread_position_in_grid [[thread_position_in_grid]],\n"
            "  uint threads_per_simdgroup [[threads_per_simdgroup]]) {\n") in text
    assert "a_shape" not in text and "c_strides" not in text and "c_ndim" not in text
    assert text.endswith(f'template [[host_name("{name}")]] [[kernel]] decltype({name}'
                         f'<float, 3, 1>) {name}<float, 3, 1>;\n')
    _, atomic = custom.write_source("k", ["a"], ["o"], "o[0];", "", True,
                                    [custom.Input(np.dtype(np.float32), 1, 8)],
                                    [np.dtype(np.int32)], [])
    assert "  device atomic<int32_t>* o [[buffer(1)]]) {\n" in atomic
    assert "template" not in atomic


@needs_cxx
def test_verbose_prints_the_generated_source(on_shim, capsys):
    out = _call(mx, verbose=True)[0]
    mx.eval(out)
    text = capsys.readouterr().out
    assert text.startswith("Generated source code for `myexp`:\n```\ntemplate <typename T>\n")
    assert "custom_kernel_myexp__float_float_float" in text


# -- run through the shim -------------------------------------------------------------------
@needs_cxx
def test_exp_and_its_strided_form(on_shim):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16)).astype(np.float16)
    a = mx.array(x)
    out = _call(mx, inputs=[a], output_shapes=[a.shape], output_dtypes=[a.dtype])[0]
    assert out.dtype == mx.float16 and out.shape == (4, 16)
    np.testing.assert_allclose(np.array(out, np.float32), np.exp(x.astype(np.float32)),
                               rtol=1e-3)
    assert mx.allclose(out, mx.exp(a)).item()
    k = mx.fast.metal_kernel(name="myexp_strided", input_names=["inp"], output_names=["out"],
                             source=EXP_STRIDED, ensure_row_contiguous=False)
    for view in (a[::2], a[1:, ::3], mx.transpose(a)):
        got = _call(mx, kernel=k, inputs=[view], output_shapes=[view.shape],
                    output_dtypes=[view.dtype], grid=(view.size, 1, 1))[0]
        np.testing.assert_allclose(np.array(got, np.float32),
                                   np.exp(np.array(view, np.float32)), rtol=1e-3)


@needs_cxx
def test_templates_scalars_and_init_value(on_shim):
    src = """
        uint i = thread_position_in_grid.x;
        if (FLIP) { out[i] = (T)(N * x[i] - s); } else { out[i] = (T)(x[i] + s); }
        if (i == 0) { first[0] = x_ndim; }
    """
    k = mx.fast.metal_kernel(name="tmpl", input_names=["x", "s"], output_names=["out", "first"],
                             source=src)
    x = np.arange(10, dtype=np.int32).reshape(2, 5)
    for flip, n, dt in ((True, 3, mx.int16), (False, 7, mx.float32)):
        out, first = k(inputs=[mx.array(x), 2], template=[("T", dt), ("N", n), ("FLIP", flip)],
                       grid=(10, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(2, 5), (3,)],
                       output_dtypes=[dt, mx.int32], init_value=-1)
        want = n * x - 2 if flip else x + 2
        assert out.dtype == dt
        np.testing.assert_array_equal(np.array(out), want)
        np.testing.assert_array_equal(np.array(first), [2, -1, -1])  # init_value elsewhere


def test_float64_is_refused_as_on_the_gpu(on_shim):
    k = mx.fast.metal_kernel(name="f64", input_names=["a"], output_names=["b"], source="b[0] = a[0];")
    for ins, out in (([mx.ones(3, dtype=mx.float64)], mx.float32), ([mx.ones(3)], mx.float64)):
        with pytest.raises(ValueError, match="^float64 is not supported on the GPU$"):
            k(inputs=ins, output_shapes=[(1,)], output_dtypes=[out], grid=(1, 1, 1),
              threadgroup=(1, 1, 1))


@needs_cxx
def test_atomic_outputs_histogram(on_shim):
    src = """
        uint i = thread_position_in_grid.x;
        atomic_fetch_add_explicit(&hist[bins[i]], 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&total[0], w[i], memory_order_relaxed);
    """
    k = mx.fast.metal_kernel(name="hist", input_names=["bins", "w"], output_names=["hist", "total"],
                             source=src, atomic_outputs=True)
    rng = np.random.default_rng(1)
    bins = rng.integers(0, 8, 300).astype(np.uint32)
    w = rng.random(300).astype(np.float32)
    h, t = k(inputs=[mx.array(bins), mx.array(w)], grid=(300, 1, 1), threadgroup=(64, 1, 1),
             output_shapes=[(8,), (1,)], output_dtypes=[mx.int32, mx.float32], init_value=0)
    np.testing.assert_array_equal(np.array(h), np.bincount(bins, minlength=8))
    np.testing.assert_allclose(np.array(t), [w.sum()], rtol=1e-5)


ROW_SUM = """
    uint elem = thread_position_in_grid.x;
    int C = x_shape[1];
    int row = elem / 32, col = elem % 32;
    T v = col < C ? x[row * C + col] : T(0);
    T total = simd_sum(v);
    if (thread_index_in_simdgroup == 0) {
        out[row] = total;
    }
"""

INTERP = """
    uint i = thread_position_in_grid.x;
    int n = table_shape[0];
    float p = clamp(float(pos[i]), 0.0f, float(n - 1));
    int k = min(int(floor(p)), n - 2);
    float f = p - k;
    out[i] = T((1 - f) * table[k] + f * table[k + 1]);
"""

INTERP_GRAD = """
    uint i = thread_position_in_grid.x;
    int n = table_shape[0];
    float p = clamp(float(pos[i]), 0.0f, float(n - 1));
    int k = min(int(floor(p)), n - 2);
    float f = p - k;
    float c = cot[i];
    atomic_fetch_add_explicit(&table_grad[k], T((1 - f) * c), memory_order_relaxed);
    atomic_fetch_add_explicit(&table_grad[k + 1], T(f * c), memory_order_relaxed);
    bool inside = pos[i] > 0 && pos[i] < n - 1;
    atomic_store_explicit(&pos_grad[i], inside ? T((table[k + 1] - table[k]) * c) : T(0),
                          memory_order_relaxed);
"""


@needs_cxx
def test_simd_sum_reduces_each_simdgroup(on_shim):
    k = mx.fast.metal_kernel(name="row_sum", input_names=["x"], output_names=["out"],
                             source=ROW_SUM)
    rng = np.random.default_rng(4)
    for C in (1, 17, 32):
        x = rng.standard_normal((9, C)).astype(np.float32)
        (out,) = k(inputs=[mx.array(x)], template=[("T", mx.float32)], grid=(9 * 32, 1, 1),
                   threadgroup=(64, 1, 1), output_shapes=[(9,)], output_dtypes=[mx.float32])
        np.testing.assert_allclose(np.array(out), x.sum(axis=1), rtol=1e-5, atol=1e-6)


TREE_SUM = """
    threadgroup float partial[64];
    uint t = thread_position_in_threadgroup.x;
    uint i = thread_position_in_grid.x;
    partial[t] = i < n ? float(x[i]) : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 32; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[threadgroup_position_in_grid.x] = partial[0];
"""


@needs_cxx
def test_threadgroup_memory_and_barriers(on_shim):
    k = mx.fast.metal_kernel(name="tree_sum", input_names=["x", "n"], output_names=["out"],
                             source=TREE_SUM)
    x = np.random.default_rng(6).standard_normal(300).astype(np.float32)
    (out,) = k(inputs=[mx.array(x), mx.array(300, dtype=mx.uint32)], grid=(320, 1, 1),
               threadgroup=(64, 1, 1), output_shapes=[(5,)], output_dtypes=[mx.float32])
    want = np.pad(x, (0, 20)).reshape(5, 64).sum(axis=1)
    np.testing.assert_allclose(np.array(out), want, rtol=1e-5, atol=1e-5)


@needs_cxx
def test_custom_function_with_kernel_forward_and_atomic_vjp(on_shim):
    fwd = mx.fast.metal_kernel(name="interp", input_names=["table", "pos"], output_names=["out"],
                               source=INTERP)
    bwd = mx.fast.metal_kernel(name="interp_grad", input_names=["table", "pos", "cot"],
                               output_names=["table_grad", "pos_grad"], source=INTERP_GRAD,
                               atomic_outputs=True)

    @mx.custom_function
    def interp(table, pos):
        return fwd(inputs=[table, pos], template=[("T", table.dtype)], grid=(pos.size, 1, 1),
                   threadgroup=(32, 1, 1), output_shapes=[pos.shape],
                   output_dtypes=[table.dtype])[0]

    @interp.vjp
    def interp_vjp(primals, cotangent, _):
        table, pos = primals
        return tuple(bwd(inputs=[table, pos, cotangent], template=[("T", table.dtype)],
                         grid=(pos.size, 1, 1), threadgroup=(32, 1, 1),
                         output_shapes=[table.shape, pos.shape],
                         output_dtypes=[table.dtype, pos.dtype], init_value=0))

    rng = np.random.default_rng(5)
    table = rng.standard_normal(11).astype(np.float32)
    pos = rng.uniform(0.05, 9.95, 70).astype(np.float32)
    out = interp(mx.array(table), mx.array(pos))
    np.testing.assert_allclose(np.array(out), np.interp(pos, np.arange(11), table), rtol=1e-5,
                               atol=1e-6)
    cot = rng.standard_normal(70).astype(np.float32)
    _, (gt, gp) = mx.vjp(interp, [mx.array(table), mx.array(pos)], [mx.array(cot)])
    k = np.minimum(np.floor(pos).astype(int), 9)
    f = pos - k
    want_t = np.zeros(11, np.float64)
    np.add.at(want_t, k, (1 - f) * cot)
    np.add.at(want_t, k + 1, f * cot)
    np.testing.assert_allclose(np.array(gt), want_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(gp), (table[k + 1] - table[k]) * cot, rtol=1e-5, atol=1e-6)
