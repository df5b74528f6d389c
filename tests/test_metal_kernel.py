"""``mx.fast.metal_kernel``: MLX 0.32's signature, call, errors and generated source, and the
kernels run through the Metal shim (tapescope's opt-in Linux path) against numpy: MLX's
documented examples (myexp, its strided form, grid_sample forward and its VJP with
``simd_sum``, atomic outputs and ``init_value``), templates of every kind, scalar inputs.

Without the shim, tapescope answers as MLX 0.32.4 does without Metal: "No Metal back-end".
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels.metal import custom, shim

sys.path.insert(0, str(Path(__file__).parent))
from mlx_compare import same_error  # noqa: E402

needs_cxx = pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler on PATH")

EXP = """
    uint elem = thread_position_in_grid.x;
    T tmp = inp[elem];
    out[elem] = metal::exp(tmp);
"""
EXP_STRIDED = """
    uint elem = thread_position_in_grid.x;
    uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
    T tmp = inp[loc];
    out[elem] = metal::exp(tmp);
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
def test_docs_myexp_and_its_strided_form(on_shim):
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


GRID_SAMPLE = """
    uint elem = thread_position_in_grid.x;
    int H = x_shape[1];
    int W = x_shape[2];
    int C = x_shape[3];
    int gH = grid_shape[1];
    int gW = grid_shape[2];
    int w_stride = C;
    int h_stride = W * w_stride;
    int b_stride = H * h_stride;
    uint grid_idx = elem / C * 2;
    float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
    float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;
    int ix_nw = floor(ix);
    int iy_nw = floor(iy);
    int ix_ne = ix_nw + 1;
    int iy_ne = iy_nw;
    int ix_sw = ix_nw;
    int iy_sw = iy_nw + 1;
    int ix_se = ix_nw + 1;
    int iy_se = iy_nw + 1;
    T nw = (ix_se - ix)    * (iy_se - iy);
    T ne = (ix    - ix_sw) * (iy_sw - iy);
    T sw = (ix_ne - ix)    * (iy    - iy_ne);
    T se = (ix    - ix_nw) * (iy    - iy_nw);
    int batch_idx = elem / C / gH / gW * b_stride;
    int channel_idx = elem % C;
    int base_idx = batch_idx + channel_idx;
    T I_nw = x[base_idx + iy_nw * h_stride + ix_nw * w_stride];
    T I_ne = x[base_idx + iy_ne * h_stride + ix_ne * w_stride];
    T I_sw = x[base_idx + iy_sw * h_stride + ix_sw * w_stride];
    T I_se = x[base_idx + iy_se * h_stride + ix_se * w_stride];
    I_nw = iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1 ? I_nw : 0;
    I_ne = iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1 ? I_ne : 0;
    I_sw = iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1 ? I_sw : 0;
    I_se = iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1 ? I_se : 0;
    out[elem] = nw * I_nw + ne * I_ne + sw * I_sw + se * I_se;
"""

GRID_SAMPLE_GRAD = """
    uint elem = thread_position_in_grid.x;
    int H = x_shape[1];
    int W = x_shape[2];
    int C = x_shape[3];
    // Pad C to the nearest larger simdgroup size multiple
    int C_padded = ceildiv(C, threads_per_simdgroup) * threads_per_simdgroup;
    int gH = grid_shape[1];
    int gW = grid_shape[2];
    int w_stride = C;
    int h_stride = W * w_stride;
    int b_stride = H * h_stride;
    uint grid_idx = elem / C_padded * 2;
    float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
    float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;
    int ix_nw = floor(ix);
    int iy_nw = floor(iy);
    int ix_ne = ix_nw + 1;
    int iy_ne = iy_nw;
    int ix_sw = ix_nw;
    int iy_sw = iy_nw + 1;
    int ix_se = ix_nw + 1;
    int iy_se = iy_nw + 1;
    T nw = (ix_se - ix)    * (iy_se - iy);
    T ne = (ix    - ix_sw) * (iy_sw - iy);
    T sw = (ix_ne - ix)    * (iy    - iy_ne);
    T se = (ix    - ix_nw) * (iy    - iy_nw);
    int batch_idx = elem / C_padded / gH / gW * b_stride;
    int channel_idx = elem % C_padded;
    int base_idx = batch_idx + channel_idx;
    T gix = T(0);
    T giy = T(0);
    if (channel_idx < C) {
        int cot_index = elem / C_padded * C + channel_idx;
        T cot = cotangent[cot_index];
        if (iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1) {
            int offset = base_idx + iy_nw * h_stride + ix_nw * w_stride;
            atomic_fetch_add_explicit(&x_grad[offset], nw * cot, memory_order_relaxed);
            T I_nw = x[offset];
            gix -= I_nw * (iy_se - iy) * cot;
            giy -= I_nw * (ix_se - ix) * cot;
        }
        if (iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1) {
            int offset = base_idx + iy_ne * h_stride + ix_ne * w_stride;
            atomic_fetch_add_explicit(&x_grad[offset], ne * cot, memory_order_relaxed);
            T I_ne = x[offset];
            gix += I_ne * (iy_sw - iy) * cot;
            giy -= I_ne * (ix - ix_sw) * cot;
        }
        if (iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1) {
            int offset = base_idx + iy_sw * h_stride + ix_sw * w_stride;
            atomic_fetch_add_explicit(&x_grad[offset], sw * cot, memory_order_relaxed);
            T I_sw = x[offset];
            gix -= I_sw * (iy - iy_ne) * cot;
            giy += I_sw * (ix_ne - ix) * cot;
        }
        if (iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1) {
            int offset = base_idx + iy_se * h_stride + ix_se * w_stride;
            atomic_fetch_add_explicit(&x_grad[offset], se * cot, memory_order_relaxed);
            T I_se = x[offset];
            gix += I_se * (iy - iy_nw) * cot;
            giy += I_se * (ix - ix_nw) * cot;
        }
    }
    T gix_mult = W / 2;
    T giy_mult = H / 2;
    // Reduce across each simdgroup first.
    // This is much faster than relying purely on atomics.
    gix = simd_sum(gix);
    giy = simd_sum(giy);
    if (thread_index_in_simdgroup == 0) {
        atomic_fetch_add_explicit(&grid_grad[grid_idx], gix * gix_mult, memory_order_relaxed);
        atomic_fetch_add_explicit(&grid_grad[grid_idx + 1], giy * giy_mult, memory_order_relaxed);
    }
"""


def _grid_sample_ref(x, grid):
    """The docs' reference implementation with standard ops."""
    N, H_in, W_in, _ = x.shape
    ix = ((grid[..., 0] + 1) * W_in - 1) / 2
    iy = ((grid[..., 1] + 1) * H_in - 1) / 2
    ix_nw = mx.floor(ix).astype(mx.int32)
    iy_nw = mx.floor(iy).astype(mx.int32)
    ix_ne, iy_ne, ix_sw, iy_sw = ix_nw + 1, iy_nw, ix_nw, iy_nw + 1
    ix_se, iy_se = ix_nw + 1, iy_nw + 1
    nw = (ix_se - ix) * (iy_se - iy)
    ne = (ix - ix_sw) * (iy_sw - iy)
    sw = (ix_ne - ix) * (iy - iy_ne)
    se = (ix - ix_nw) * (iy - iy_nw)
    b = mx.arange(N)[:, None, None]

    def pick(iy_, ix_):
        mask = (iy_ >= 0) & (iy_ <= H_in - 1) & (ix_ >= 0) & (ix_ <= W_in - 1)
        v = x[b, mx.clip(iy_, 0, H_in - 1), mx.clip(ix_, 0, W_in - 1), :]
        return v * mask[..., None]

    return (nw[..., None] * pick(iy_nw, ix_nw) + ne[..., None] * pick(iy_ne, ix_ne)
            + sw[..., None] * pick(iy_sw, ix_sw) + se[..., None] * pick(iy_se, ix_se))


@needs_cxx
def test_docs_grid_sample_forward_and_vjp(on_shim):
    fwd = mx.fast.metal_kernel(name="grid_sample", input_names=["x", "grid"],
                               output_names=["out"], source=GRID_SAMPLE)
    bwd = mx.fast.metal_kernel(name="grid_sample_grad", input_names=["x", "grid", "cotangent"],
                               output_names=["x_grad", "grid_grad"], source=GRID_SAMPLE_GRAD,
                               atomic_outputs=True)

    @mx.custom_function
    def grid_sample(x, grid):
        B, _, _, C = x.shape
        _, gN, gM, D = grid.shape
        out_shape = (B, gN, gM, C)
        return fwd(inputs=[x, grid], template=[("T", x.dtype)], output_shapes=[out_shape],
                   output_dtypes=[x.dtype], grid=(np.prod(out_shape), 1, 1),
                   threadgroup=(256, 1, 1))[0]

    @grid_sample.vjp
    def grid_sample_vjp(primals, cotangent, _):
        x, grid = primals
        B, _, _, C = x.shape
        _, gN, gM, D = grid.shape
        C_padded = (C + 31) // 32 * 32
        outs = bwd(inputs=[x, grid, cotangent], template=[("T", x.dtype)],
                   output_shapes=[x.shape, grid.shape], output_dtypes=[x.dtype, x.dtype],
                   grid=(B * gN * gM * C_padded, 1, 1), threadgroup=(256, 1, 1), init_value=0)
        return outs[0], outs[1]

    rng = np.random.default_rng(2)
    x = mx.array(rng.standard_normal((2, 6, 7, 5)).astype(np.float32))
    g = mx.array(rng.uniform(-1.1, 1.1, (2, 4, 3, 2)).astype(np.float32))
    np.testing.assert_allclose(np.array(grid_sample(x, g)), np.array(_grid_sample_ref(x, g)),
                               rtol=1e-5, atol=1e-5)
    cot = mx.array(rng.standard_normal((2, 4, 3, 5)).astype(np.float32))
    _, (gx, gg) = mx.vjp(grid_sample, [x, g], [cot])
    _, (rx, rg) = mx.vjp(_grid_sample_ref, [x, g], [cot])
    np.testing.assert_allclose(np.array(gx), np.array(rx), rtol=1e-4, atol=1e-4)
    # the docs' kernel scales the grid gradient by the integer W / 2, H / 2 (int division)
    W, H = 7, 6
    scale = np.array([(W // 2) / (W / 2), (H // 2) / (H / 2)], np.float32)
    np.testing.assert_allclose(np.array(gg), np.array(rg) * scale, rtol=1e-4, atol=1e-4)
