"""The generated quantized-product kernels (``kernels/codegen/quantized.py``: qmv_t, qmv_n,
dequant on the CPU; qmv and the dequantized tile in CUDA) against float64 numpy: packed weights
made directly (random codes, scales, biases; not through ``quantize``), unpacked here from the
bit stream with ``np.unpackbits``, e2m1 / e4m3 through ml_dtypes, over hypothesis shapes (rows
1..8 and many, K at group boundaries, odd N), bits, group sizes, transpose, float32 / float16
/ bfloat16, broadcast batches and gather indices; each call is checked to have run a kernel.
The CUDA kernels run where CuPy and a GPU are (``TAPESCOPE_CUDA=1``), their sources are
syntax-checked by the host's C++ compiler everywhere. The affine ``Quantize`` kernel equals
the array-module rule bit for bit (codes, scales, biases), NaN / inf / constant groups
included. ``TAPESCOPE_HEAVY_QUANT=1`` widens the examples."""

from __future__ import annotations

import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from conftest import mlx_ref
from tapescope.kernels import backends
from tapescope.kernels.codegen.quantized import FORMS, QuantSpec
from tapescope.kernels.cpu import compiler
from tapescope.kernels.cpu import quantized as cpu_quantized

HEAVY = os.environ.get("TAPESCOPE_HEAVY_QUANT") == "1"
EXAMPLES = 60 if HEAVY else 12
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
EPS = {"float32": 2 ** -23, "float16": 2 ** -10, "bfloat16": 2 ** -7}
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
# (mode, group size, bits)
CONFIGS = ([("affine", g, b) for g in (32, 64, 128) for b in (2, 3, 4, 5, 6, 8)]
           + [("affine", 64, 1), ("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)])
needs_cc = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")


# -- the reference -----------------------------------------------------------------------------
def codes64(w: np.ndarray, bits: int) -> np.ndarray:
    """uint32 words (..., W) -> codes (..., W * 32 / bits) as float64: the little-endian stream."""
    b = np.unpackbits(np.ascontiguousarray(w).view(np.uint8), axis=-1, bitorder="little")
    b = b.reshape(*w.shape[:-1], -1, bits).astype(np.int64)
    return (b << np.arange(bits)).sum(-1).astype(np.float64)


def reference_weight(w, scales, biases, gs: int, bits: int, mode: str) -> np.ndarray:
    q = codes64(w, bits)
    q = q.reshape(*q.shape[:-1], -1, gs)
    if mode == "affine":
        v = q * scales.astype(np.float64)[..., None] + biases.astype(np.float64)[..., None]
    else:
        qi = q.astype(np.int64)
        v = (E2M1[qi] if bits == 4 else
             qi.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64))
        s = (scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64) if gs == 16
             else np.ldexp(1.0, scales.astype(np.int64) - 127))
        v = v * s[..., None]
    return v.reshape(*v.shape[:-2], -1)


def packed(rng, lead: tuple, rows: int, cols: int, gs: int, bits: int, mode: str, dtype: str):
    """Random packed weight (lead, rows, cols codes), its scales and biases (MLX's formats)."""
    w = rng.integers(0, 2 ** 32, size=(*lead, rows, cols * bits // 32), dtype=np.uint64)
    w = w.astype(np.uint32)
    g = (*lead, rows, cols // gs)
    if mode == "affine":
        s = (rng.uniform(0.5, 1.5, g) / 2 ** bits).astype(NP[dtype])
        b = rng.uniform(-0.5, 0.5, g).astype(NP[dtype])
        return w, s, b
    if mode == "mxfp8":  # keep e4m3 codes finite (0x7F / 0xFF are nan)
        w8 = w.view(np.uint8)
        w8[(w8 & 0x7F) == 0x7F] = 0x11
    s = (rng.integers(122, 130, g) if gs == 32 else rng.integers(0x20, 0x40, g)).astype(np.uint8)
    return w, s, None


def close(got: np.ndarray, ref: np.ndarray, x64: np.ndarray, w64: np.ndarray, transpose: bool,
          dtype: str) -> None:
    """Within the output type's rounding plus float32 accumulation, relative to |x| @ |w|."""
    mag = np.abs(x64) @ (np.abs(np.swapaxes(w64, -1, -2)) if transpose else np.abs(w64))
    tol = mag * (4 * EPS[dtype] + x64.shape[-1] * 2 ** -23) + 1e-30
    assert got.shape == ref.shape
    bad = np.abs(got.astype(np.float64) - ref) > tol
    assert not bad.any(), (np.abs(got - ref)[bad][:5], tol[bad][:5])


def kernel_hits() -> dict:
    return {e.name: e.hits for e in compiler.entries()}


def ran_kernel(before: dict, form: str) -> bool:
    after = kernel_hits()
    return any(f"_{form}_" in n and after[n] > before.get(n, 0) for n in after)


# -- quantized_matmul ----------------------------------------------------------------------------
@needs_cc
@settings(max_examples=EXAMPLES, deadline=None)
@given(cfg=st.sampled_from(CONFIGS), dtype=st.sampled_from(sorted(NP)), transpose=st.booleans(),
       m=st.one_of(st.integers(1, 8), st.sampled_from([9, 17, 40])),
       groups=st.integers(1, 3), n=st.integers(1, 41), batch=st.sampled_from(["", "x", "xw", "bx"]),
       seed=st.integers(0, 2 ** 16))
def test_quantized_matmul_kernels_equal_float64(cfg, dtype, transpose, m, groups, n, batch, seed):
    mode, gs, bits = cfg
    rng = np.random.default_rng(seed)
    K = gs * groups
    if not transpose:
        n = gs * (1 + n % 2)  # the packed axis is N: whole groups
    xlead = {"": (), "x": (2,), "xw": (2,), "bx": (3, 2)}[batch]
    wlead = {"": (), "x": (), "xw": (2,), "bx": (1, 2)}[batch]
    rows, cols = (n, K) if transpose else (K, n)
    w, s, b = packed(rng, wlead, rows, cols, gs, bits, mode, dtype)
    x = rng.standard_normal((*xlead, m, K)).astype(NP[dtype])
    before = kernel_hits()
    got = mx.quantized_matmul(mx.array(x), mx.array(w), mx.array(s),
                              None if b is None else mx.array(b), transpose, gs, bits, mode,
                              stream=mx.cpu)  # the CPU's kernels (the GPU is default there)
    got = np.array(got.astype(mx.float32))
    w64 = reference_weight(w, s, b, gs, bits, mode)
    x64 = x.astype(np.float64)
    ref = x64 @ (np.swapaxes(w64, -1, -2) if transpose else w64)
    close(got, ref, x64, w64, transpose, dtype)
    form = ("qmv_t" if transpose else "qmv_n") if m <= 8 else "dequant"
    assert ran_kernel(before, form)


@needs_cc
@pytest.mark.parametrize("transpose", [True, False])
def test_vector_x_and_unbatched_x_of_a_batched_weight(transpose):
    """A 1-D x (one row, the output 1-D) and a 2-D x with a batched w (MLX's kernel reads
    w's first matrix)."""
    rng = np.random.default_rng(1)
    w, s, b = packed(rng, (3,), 64, 64, 32, 4, "affine", "float32")
    x = rng.standard_normal(64).astype(np.float32)
    w64 = reference_weight(w, s, b, 32, 4, "affine")[0]
    ref = x.astype(np.float64) @ (w64.T if transpose else w64)
    got = mx.quantized_matmul(mx.array(x[None]), mx.array(w), mx.array(s), mx.array(b),
                              transpose, 32, 4)
    assert got.shape == (1, 64)
    np.testing.assert_allclose(np.array(got)[0], ref, rtol=1e-5, atol=1e-5)


# -- gather_qmm ------------------------------------------------------------------------------------
@needs_cc
@settings(max_examples=EXAMPLES, deadline=None)
@given(cfg=st.sampled_from(CONFIGS), transpose=st.booleans(),
       m=st.sampled_from([1, 3, 8, 12]), n_idx=st.integers(1, 9), sort=st.booleans(),
       lhs=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gather_qmm_kernels_equal_float64(cfg, transpose, m, n_idx, sort, lhs, seed):
    mode, gs, bits = cfg
    rng = np.random.default_rng(seed)
    E, K, n = 4, 2 * gs, gs
    B = 3 if lhs else 1  # lhs_indices' default (every matrix of x) broadcasts from one
    rows, cols = (n, K) if transpose else (K, n)
    w, s, b = packed(rng, (E,), rows, cols, gs, bits, mode, "float32")
    x = rng.standard_normal((B, m, K)).astype(np.float32)
    ri = rng.integers(0, E, n_idx).astype(np.uint32)
    li = rng.integers(0, B, n_idx).astype(np.uint32) if lhs else None
    if sort:
        ri.sort()
    before = kernel_hits()
    got = mx.gather_qmm(mx.array(x), mx.array(w), mx.array(s), None if b is None else mx.array(b),
                        None if li is None else mx.array(li), mx.array(ri), transpose, gs, bits,
                        mode, sorted_indices=sort and not lhs, stream=mx.cpu)
    got = np.array(got)
    w64 = reference_weight(w, s, b, gs, bits, mode)
    x64 = x.astype(np.float64)
    xs = x64[li.astype(np.int64) if lhs else np.zeros(n_idx, np.int64)]
    ws = w64[ri.astype(np.int64)]
    ref = xs @ (np.swapaxes(ws, -1, -2) if transpose else ws)
    close(got, ref, xs, ws, transpose, "float32")
    form = ("qmv_t" if transpose else "qmv_n") if m <= 8 else "dequant"
    assert ran_kernel(before, form)


@needs_cc
def test_gather_qmm_index_outside_the_batch_runs_the_rule():
    """An index past the batch never reaches the CPU's kernel (it would read outside w): the
    rule runs instead and raises numpy's IndexError, and the next call is unaffected."""
    with mx.stream(mx.cpu):
        _gather_qmm_index_outside_the_batch()


@needs_cc
def test_gather_qmm_index_outside_the_batch_raises_numpys_error_on_the_default_device():
    """The same on the default device: on a GPU the gather-qmv kernel notes the index in its
    stream's bounds record and the eval raises numpy's error at its wait
    (``cuda/bounds.py``); the next call is unaffected."""
    _gather_qmm_index_outside_the_batch()


def _gather_qmm_index_outside_the_batch():
    rng = np.random.default_rng(2)
    w, s, b = packed(rng, (2,), 32, 64, 64, 4, "affine", "float32")
    x = mx.array(rng.standard_normal((1, 1, 64)).astype(np.float32))
    bad = mx.gather_qmm(x, mx.array(w), mx.array(s), mx.array(b), None,
                        mx.array(np.array([5], np.uint32)))
    with pytest.raises(IndexError) as info:
        mx.eval(bad)
    assert str(info.value) == "index 5 is out of bounds for axis 0 with size 2"  # numpy's w[5]
    ok = mx.gather_qmm(x, mx.array(w), mx.array(s), mx.array(b), None,
                       mx.array(np.array([1], np.uint32)))
    w64 = reference_weight(w, s, b, 64, 4, "affine")[1]
    np.testing.assert_allclose(np.array(ok)[0, 0], np.array(x)[0, 0] @ w64.T, rtol=1e-5,
                               atol=1e-5)


@needs_cc
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("m", [2, 20])
def test_a_group_size_without_a_kernel_runs_the_rule(transpose, m):
    """The kernels have a copy per group size MLX's CPU templates take (affine 32 / 64 / 128)
    and none other: group size 16 (which MLX's CPU rejects at eval) runs the rule, recorded
    as a fallback with why, and still equals float64."""
    import tapescope

    rng = np.random.default_rng(5)
    rows, cols = (24, 64) if transpose else (64, 32)
    w, s, b = packed(rng, (), rows, cols, 16, 4, "affine", "float32")
    x = rng.standard_normal((m, 64)).astype(np.float32)
    with tapescope.record() as tl:
        got = np.array(mx.quantized_matmul(mx.array(x), mx.array(w), mx.array(s), mx.array(b),
                                           transpose, 16, 4, stream=mx.cpu))
    reasons = [r.detail.get("reason", "") for r in tl.records if r.kind == "kernel_fallback"]
    assert any("group size 16" in r for r in reasons), reasons
    w64 = reference_weight(w, s, b, 16, 4, "affine")
    ref = x.astype(np.float64) @ (w64.T if transpose else w64)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@needs_cc
def test_without_a_compiler_the_rule_computes_and_the_fallback_is_recorded(monkeypatch):
    import tapescope

    rng = np.random.default_rng(3)
    w, s, b = packed(rng, (), 16, 64, 32, 4, "affine", "float32")
    x = rng.standard_normal((2, 64)).astype(np.float32)
    compiler.clear()
    cpu_quantized._entries.clear()
    monkeypatch.setattr(compiler, "toolchain", lambda: None)
    try:
        with tapescope.record() as tl:
            got = np.array(mx.quantized_matmul(mx.array(x), mx.array(w), mx.array(s),
                                               mx.array(b), True, 32, 4, stream=mx.cpu))
        reasons = [r.detail.get("reason", "") for r in tl.records if r.kind == "kernel_fallback"]
        assert any("no C compiler" in r for r in reasons), reasons
    finally:
        monkeypatch.undo()
        compiler.clear()
        cpu_quantized._entries.clear()
    ref = x.astype(np.float64) @ reference_weight(w, s, b, 32, 4, "affine").T
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@needs_cc
@pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")
@pytest.mark.parametrize("mode,gs,bits", [("affine", 64, 4), ("affine", 32, 3), ("mxfp4", 32, 4),
                                          ("nvfp4", 16, 4), ("mxfp8", 32, 8)])
@pytest.mark.parametrize("m", [1, 5, 20])
def test_kernels_agree_with_mlx(mode, gs, bits, m):
    rng = np.random.default_rng(4)
    w, s, b = packed(rng, (), 96, 128, gs, bits, mode, "float32")
    x = rng.standard_normal((m, 128)).astype(np.float32)
    ours = mx.quantized_matmul(mx.array(x), mx.array(w), mx.array(s),
                               None if b is None else mx.array(b), True, gs, bits, mode)
    theirs = mlx_ref.quantized_matmul(mlx_ref.array(x), mlx_ref.array(w), mlx_ref.array(s),
                                      None if b is None else mlx_ref.array(b), True, gs, bits,
                                      mode, stream=mlx_ref.cpu)
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=1e-4, atol=1e-4)


@needs_cc
@pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")
@pytest.mark.parametrize("mode,gs,bits", [("affine", 32, 4), ("affine", 64, 8), ("affine", 64, 3),
                                          ("mxfp4", 32, 4), ("mxfp8", 32, 8)])
@pytest.mark.parametrize("transpose", [True, False])
def test_planned_calls_agree_with_mlx_into_a_donated_input(mode, gs, bits, transpose):
    """A decoding step's products: the plan made at the first call (kernels/kernel_call.py)
    and called by the eval loop from then on, its output the buffer of a dying x of the
    same shape (N == K: the loop donates it, the kernel reads x to the end), repeated over
    fresh x's as MLX's own results."""
    rng = np.random.default_rng(7)
    K = 128
    w, s, b = packed(rng, (), K, K, gs, bits, mode, "float32")
    ours_w = [mx.array(a) for a in (w, s) + (() if b is None else (b,))]
    theirs_w = [mlx_ref.array(a) for a in (w, s) + (() if b is None else (b,))]
    if b is None:
        ours_w.insert(2, None)
        theirs_w.insert(2, None)
    rule = cpu_quantized.RULES["QuantizedMatmul"]
    for step in range(3):
        x = rng.standard_normal((1, 1, K)).astype(np.float32)
        before = kernel_hits()
        ours = mx.quantized_matmul(mx.exp(mx.array(x)), *ours_w, transpose, gs, bits, mode)
        mx.eval(ours)
        theirs = mlx_ref.quantized_matmul(mlx_ref.exp(mlx_ref.array(x)), *theirs_w, transpose,
                                          gs, bits, mode, stream=mlx_ref.cpu)
        np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=1e-4, atol=1e-4)
        assert ran_kernel(before, "qmv_t" if transpose else "qmv_n")
    assert any(p is not None for p in rule.plans.values())  # the call was planned


# -- quantize -------------------------------------------------------------------------------------
@needs_cc
@settings(max_examples=2 * EXAMPLES, deadline=None)
@given(gs=st.sampled_from([32, 64, 128]), bits=st.sampled_from([1, 2, 3, 4, 5, 6, 8]),
       dtype=st.sampled_from(sorted(NP)), rows=st.integers(1, 9), groups=st.integers(1, 3),
       lead=st.sampled_from([(), (2,)]), special=st.booleans(), exp=st.integers(-30, 30),
       seed=st.integers(0, 2 ** 16))
def test_quantize_kernel_equals_the_rule_bit_for_bit(gs, bits, dtype, rows, groups, lead,
                                                      special, exp, seed):
    from tapescope.kernels.primitives import REGISTRY

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((*lead, rows, groups * gs)) * 2.0 ** exp).astype(np.float32)
    if special:  # NaN, infinities, a constant group, zeros of both signs
        flat = w.reshape(-1, gs)
        flat[0, rng.integers(0, gs)] = np.nan
        flat[-1, rng.integers(0, gs)] = rng.choice([np.inf, -np.inf])
        if len(flat) > 2:
            flat[1] = flat[1, 0]
            flat[2, ::2] = -0.0
    w = w.astype(NP[dtype])
    with np.errstate(invalid="ignore"):
        ref = REGISTRY["Quantize"].rule(np, w, group_size=gs, bits=bits)
    before = kernel_hits()
    got = cpu_quantized.quantize(np, w, group_size=gs, bits=bits)
    assert ran_kernel(before, "quantize")
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert np.array_equal(g.view(np.uint32), r.view(np.uint32))


@needs_cc
def test_mx_quantize_runs_the_kernel():
    w = np.random.default_rng(5).standard_normal((4, 128)).astype(np.float32)
    before = kernel_hits()
    wq, s, b = mx.quantize(mx.array(w), 64, 4, stream=mx.cpu)  # the CPU's kernel, whatever
    mx.eval(wq, s, b)  # the default device (a GPU under TAPESCOPE_CUDA=1)
    assert ran_kernel(before, "quantize")
    w64 = reference_weight(np.array(wq), np.array(s), np.array(b), 64, 4, "affine")
    # within a scale of the input (the bound of MLX's test_quantize_dequantize)
    assert (np.abs(w64 - w) <= np.abs(np.array(s)).repeat(64, -1) + 1e-6).all()


# -- CUDA ------------------------------------------------------------------------------------------
_CU_PRELUDE = """
struct dim3_ { unsigned x, y, z; };
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
extern dim3_ blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
inline float __shfl_down_sync(unsigned, float v, int) { return v; }
inline void __syncthreads() {}
extern "C" float fmaf(float, float, float);
unsigned __float_as_uint(float);
float __uint_as_float(unsigned);
"""


_QMV_PRELUDE = _CU_PRELUDE + """
#define __launch_bounds__(...)
#define __restrict__
#define __noinline__
unsigned atomicCAS(unsigned*, unsigned, unsigned); unsigned atomicExch(unsigned*, unsigned);
void __threadfence(); void __threadfence_system();
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };
float __half2float(__half); __half __float2half_rn(float); __half __ushort_as_half(unsigned short);
float __bfloat162float(__nv_bfloat16); __nv_bfloat16 __float2bfloat16_rn(float);
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
unsigned short __half_as_ushort(__half); unsigned short __bfloat16_as_ushort(__nv_bfloat16);
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_qmv_sources_are_valid_code(tmp_path, dtype):
    """The qmv kernel's CUDA (``codegen/qmv_cuda.py``: one generator over the modes and
    widths) parses as C++ with CUDA's builtins declared and its headers empty, for each
    mode, width and group size, a few row counts and the gather form (the GPU compiles and
    runs it in ``test_cuda_fast.py``)."""
    from tapescope.kernels.codegen.qmv_cuda import MODES, QmvSpec, cuda_source

    inc = tmp_path / "inc"
    inc.mkdir()
    for h in ("cuda_fp16.h", "cuda_bf16.h"):
        (inc / h).write_text("")
    srcs = []
    for mode, (widths, groups, _, _) in MODES.items():
        for bits in widths:
            for gs in groups:
                for rows, index in ((0, ""), (1, ""), (8, ""), (2, "int64")):  # (0: dequant)
                    spec = QmvSpec(dtype, bits, gs, rows, mode, index)
                    srcs.append(f"namespace k{len(srcs)} {{\n" + cuda_source(spec).replace(
                        'extern "C" ', "") + "\n}\n")
    src = tmp_path / "q.cpp"
    src.write_text("typedef unsigned int uint32_t;\n" + _QMV_PRELUDE + "".join(s.replace("#include <cuda_fp16.h>", "").replace(
        "#include <cuda_bf16.h>", "").replace("typedef unsigned int uint32_t;", "")
        for s in srcs))
    r = subprocess.run(["g++", "-fsyntax-only", "-w", f"-I{inc}", str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:4000]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler")
def test_cuda_qmv_sources_compile_for_an_h100(tmp_path):
    """Where nvcc is installed: the decoding qmv and the dequant form compile for sm_90 with
    no local-memory arrays (ptxas's stack frame stays within a spilled word or two)."""
    import re

    from tapescope.kernels.codegen.qmv_cuda import QmvSpec, cuda_source

    for spec in (QmvSpec("float32", 4, 64, 1), QmvSpec("bfloat16", 8, 64, 8),
                 QmvSpec("float16", 4, 64, 0), QmvSpec("bfloat16", 3, 64, 1),
                 QmvSpec("float16", 6, 128, 1), QmvSpec("bfloat16", 4, 32, 1, "mxfp4"),
                 QmvSpec("bfloat16", 4, 16, 1, "nvfp4", "uint32")):
        src = tmp_path / f"{spec.name}.cu"
        src.write_text(cuda_source(spec))
        r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
                            str(tmp_path / "q.cubin"), str(src)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        frames = [int(v) for v in re.findall(r"(\d+) bytes stack frame", r.stderr)]
        assert frames and max(frames) <= 16, r.stderr


def test_every_c_source_renders():
    from tapescope.kernels.codegen.quantized import c_source

    for form in FORMS:
        for kind, bits in [("affine", b) for b in (1, 2, 3, 4, 5, 6, 8)] + [("table", 4),
                                                                           ("table", 8)]:
            src = c_source(QuantSpec(form, kind, bits))
            assert f"void {kind}_{form}_b{bits}(void** args)" in src


needs_cuda = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="the CUDA runtime needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")


@needs_cuda
@settings(max_examples=EXAMPLES, deadline=None)
@given(cfg=st.sampled_from(CONFIGS), transpose=st.booleans(),
       m=st.sampled_from([1, 3, 8, 20, 65]), groups=st.integers(1, 3), n=st.integers(1, 70),
       dtype=st.sampled_from(["float32", "float16"]), seed=st.integers(0, 2 ** 16))
def test_cuda_quantized_matmul_equals_float64(cfg, transpose, m, groups, n, dtype, seed):
    mode, gs, bits = cfg
    rng = np.random.default_rng(seed)
    K = gs * groups
    if not transpose:
        n = gs * (1 + n % 2)
    rows, cols = (n, K) if transpose else (K, n)
    w, s, b = packed(rng, (), rows, cols, gs, bits, mode, dtype)
    x = rng.standard_normal((m, K)).astype(NP[dtype])
    g = mx.gpu
    args = [mx.array(a) for a in (x, w, s)] + ([] if b is None else [mx.array(b)])
    args = [mx.add(a, 0, stream=g) if a.dtype != mx.uint32 else a for a in args]
    got = mx.quantized_matmul(args[0], args[1], args[2], args[3] if b is not None else None,
                              transpose, gs, bits, mode, stream=g)
    got = np.array(got.astype(mx.float32, stream=g))
    w64 = reference_weight(w, s, b, gs, bits, mode)
    x64 = x.astype(np.float64)
    ref = x64 @ (w64.T if transpose else w64)
    close(got, ref, x64, w64, transpose, dtype)


@needs_cuda
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("m", [1, 16])
def test_cuda_gather_qmm_equals_float64(transpose, m):
    rng = np.random.default_rng(5)
    E, K, n, gs = 4, 128, 64, 64
    rows, cols = (n, K) if transpose else (K, n)
    w, s, b = packed(rng, (E,), rows, cols, gs, 4, "affine", "float32")
    x = rng.standard_normal((2, m, K)).astype(np.float32)
    li = np.array([0, 1, 1, 0, 1], np.uint32)
    ri = np.array([3, 0, 2, 2, 1], np.uint32)
    g = mx.gpu
    got = mx.gather_qmm(mx.add(mx.array(x), 0, stream=g), mx.array(w),
                        mx.add(mx.array(s), 0, stream=g), mx.add(mx.array(b), 0, stream=g),
                        mx.array(li), mx.array(ri), transpose, gs, 4, stream=g)
    w64 = reference_weight(w, s, b, gs, 4, "affine")[ri.astype(np.int64)]
    xs = x.astype(np.float64)[li.astype(np.int64)]
    ref = xs @ (np.swapaxes(w64, -1, -2) if transpose else w64)
    close(np.array(got), ref, xs, w64, transpose, "float32")


@needs_cc
def test_cuda_qmv_code_and_scale_decoders_equal_ml_dtypes_for_every_byte():
    """The CUDA qmv kernels' decoders (``codegen/qmv_cuda.py``'s e2m1 / e4m3 codes and e8m0
    / e4m3 scales by integer arithmetic, rendered here for the host) for every code against
    ml_dtypes' formats, bit for bit (e4m3's 0x7F / 0xFF nan; e8m0's 255 as inf, 0 as 2^-127,
    rules/quantized.py's fp_scale)."""
    import ctypes

    from tapescope.kernels.codegen.qmv_cuda import _FORMATS

    src = ("#include <stdint.h>\n#include <string.h>\nstatic inline float u32_float(uint32_t u) "
           "{ float f; memcpy(&f, &u, 4); return f; }\n#define FBITS(u) u32_float(u)\n"
           "#define DEVFN static inline\n" + _FORMATS +
           "void decode_all(void** args) { float* o = (float*)args[0];\n"
           "  for (int i = 0; i < 16; i++) o[i] = e2m1_value(i);\n"
           "  for (int i = 0; i < 256; i++) { o[16 + i] = e4m3_value(i); o[272 + i] = e8m0_value(i); }\n}\n")
    entry = compiler.get_kernel("decode_all", "qmv decoders", lambda tc: src, key="qmv_decoders:" +
                                str(hash(src)))
    out = np.zeros(528, np.float32)
    argv = (ctypes.c_void_p * 1)(out.ctypes.data)
    entry.fast_fn(gil=True)(argv)
    codes = np.arange(256, dtype=np.uint8)
    e2m1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(out[:16].view(np.uint32), e2m1.view(np.uint32))
    e4m3 = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(np.isnan(out[16:272]), np.isnan(e4m3))
    fin = ~np.isnan(e4m3)
    assert np.array_equal(out[16:272][fin].view(np.uint32), e4m3[fin].view(np.uint32))
    e8m0 = 2.0 ** (codes[:255].astype(np.float64) - 127)
    assert np.array_equal(out[272:527], e8m0.astype(np.float32)) and np.isinf(out[527])
