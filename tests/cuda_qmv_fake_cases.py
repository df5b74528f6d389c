"""``quantized_matmul`` and ``gather_qmm`` on CUDA (``kernels/cuda/quantized.py``: the qmv
kernel's ``KernelPlan``, its gather form, ``QmmPlan``'s dequant tile and cuBLAS GEMM) for
every quantization MLX's CUDA backend takes (affine 2, 3, 4, 5, 6, 8 bits in groups of 32,
64, 128; mxfp4, mxfp8, nvfp4), over the stand-in CuPy, cuBLAS and driver
(``fake_cupy.py``, ``fake_cublas.py``, ``fake_cuda_driver.py``: kernels load without NVRTC,
launches run nothing), collected by ``test_cuda_sdpa_fake.py`` in a fresh process. A call's
first run makes the plan (the rule, a launch from Python); later calls are launched by the
eval loop from C, no rule run. The values: a qmv plan's packed launch words (pointers,
integer arguments) after each call are given to the C build of the same ``QmvSpec``
(``codegen/qmv_cuda.py``: the CUDA kernel's text with its blocks, warps and lanes walked in
order); a dequant launch's words are given to its C build as it is launched, so the GEMM
reads the tile it filled. Each result is checked against float64 numpy over the weight
dequantized here (its own decoding of the codes and scales) and against MLX's CPU
(``mx.quantized_matmul`` / ``mx.gather_qmm`` of the same packed arrays): a wrong stride,
pointer, index or fold of the batch in the packed words gives a wrong answer."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fake_cuda_driver
import tapescope.core as mx
from tapescope.kernels.codegen import qmv_cuda
from tapescope.kernels.cpu import compiler
from tapescope.kernels.cuda import quantized
from tapescope.kernels.cuda.primitive_plans import KernelPlan

from sdpa_inputs import NPD

try:
    import mlx.core as mlx
except ImportError:  # pragma: no cover - the venv has MLX
    mlx = None

PRIM = "QuantizedMatmul"
MXD = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
TOL = {"float32": 2e-5, "float16": 3e-3, "bfloat16": 2e-2}
# MLX's CPU accumulates the half types in their own type: a looser bound against it
MLX_TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 8e-2}
QUANTS = [("affine", b, g) for b in qmv_cuda.BITS for g in qmv_cuda.GROUP_SIZES] + [
    ("mxfp4", 4, 32), ("mxfp8", 8, 32), ("nvfp4", 4, 16)]
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])

pytestmark = pytest.mark.usefixtures("gpu_default_device")  # (conftest.py's)


def _e4m3(c):
    """e4m3 bytes -> float64 (the OCP format: 4 exponent bits, bias 7, no inf)."""
    c = np.asarray(c, np.int64)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    return np.where(c & 0x80, -v, v)


def _packed(rng, bits, shape):
    """Random codes of ``shape`` (.., K) and their uint32 packing: a little-endian stream of
    ``bits``-wide codes (codes straddle words for 3, 5, 6 bits)."""
    codes = rng.integers(0, 2 ** bits, shape).astype(np.uint64)
    if bits == 8:  # no e4m3 nan codes (MLX's and ours differ in the nan's bits only)
        codes = np.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    lead, k = shape[:-1], shape[-1]
    bitv = ((codes[..., None] >> np.arange(bits, dtype=np.uint64)) & 1).reshape(*lead, k * bits)
    words = bitv.reshape(*lead, k * bits // 32, 32) << np.arange(32, dtype=np.uint64)
    return codes, words.sum(-1).astype(np.uint32)


def _weights(rng, mode, bits, gs, wb, R, C, t):
    """(w, scales, biases or None, the float64 weight (.., R, C)) of one quantization."""
    codes, w = _packed(rng, bits, wb + (R, C))
    sshape = wb + (R, C // gs)
    if mode == "affine":
        s = (rng.standard_normal(sshape) * 0.1).astype(t)
        b = (rng.standard_normal(sshape) * 0.1).astype(t)
        wd = (codes * np.repeat(s.astype(np.float64), gs, -1)
              + np.repeat(b.astype(np.float64), gs, -1))
        return w, s, b, wd
    if mode == "nvfp4":  # e4m3 scales of moderate size (exponent fields 4..9)
        s = rng.integers(4 << 3, 10 << 3, sshape).astype(np.uint8)
        sv = _e4m3(s)
    else:  # e8m0: 2^(s - 127), 2^-9 .. 2^-1 (e4m3 codes reach 448: float16 keeps the sums)
        s = rng.integers(118, 127, sshape).astype(np.uint8)
        sv = 2.0 ** (s.astype(np.float64) - 127)
    v = FP4[codes.astype(np.int64)] if bits == 4 else _e4m3(codes)
    return w, s, None, v * np.repeat(sv, gs, -1)


@st.composite
def decode(draw):
    dtype = draw(st.sampled_from(list(qmv_cuda.TYPES)))
    mode, bits, gs = draw(st.sampled_from(QUANTS))
    K = gs * draw(st.sampled_from([1, 3, 8]))
    N = draw(st.sampled_from([1, 8, 20]))
    M = draw(st.sampled_from([1, 2, 7, 8]))
    # x's batch: none; x batched over one weight (rows folded); both batched; a weight
    # broadcast over x's batch; x a column slice (unaligned rows: element loads); x 1-D
    batch = draw(st.sampled_from(["none", "x", "both", "w_bcast", "strided", "vector"]))
    if batch in ("x", "w_bcast"):
        M = min(M, 4)  # (two entries folded: at most MAX_ROWS rows)
    return dtype, mode, bits, gs, K, N, M, batch, draw(st.integers(0, 2 ** 16))


def _inputs(c, transpose=True):
    dtype, mode, bits, gs, K, N, M, batch, seed = c
    rng = np.random.default_rng(seed)
    t = NPD[dtype]
    wb = (2,) if batch in ("both", "w_bcast") else ()
    xb = (2,) if batch in ("x", "both", "w_bcast") else ()
    if batch == "w_bcast":
        wb = (1,)
    R, C = (N, K) if transpose else (K, N)
    w, s, b, wd = _weights(rng, mode, bits, gs, wb, R, C, t)
    xs = xb + ((M, K) if batch != "vector" else (K,))
    x = rng.standard_normal(xs).astype(t)
    want = np.matmul(x.astype(np.float64), np.swapaxes(wd, -1, -2) if transpose else wd)
    return x, w, s, b, want


def _gpu(a, t, strided=False):
    if strided:  # a slice of a wider buffer: rows start 3 elements in (no 16-byte alignment)
        wide = np.zeros(a.shape[:-1] + (a.shape[-1] + 5,), a.dtype)
        wide[..., 3:3 + a.shape[-1]] = a
        return mx.array(wide, dtype=t)[..., 3:3 + a.shape[-1]]
    return mx.array(a, dtype=t)


def _operands(x, w, s, b, dtype, strided=False):
    t = MXD[dtype]
    ops = [_gpu(x, t, strided=strided), mx.array(w),
           mx.array(s) if s.dtype == np.uint8 else _gpu(s, t)]
    if b is not None:
        ops.append(_gpu(b, t))
    mx.eval(*ops)
    return ops


def _mlx(a):
    """A host array as MLX's (bfloat16 through float32: exact)."""
    if a.dtype == NPD["bfloat16"]:
        return mlx.array(a.astype(np.float32)).astype(mlx.bfloat16)
    return mlx.array(a)


def _mlx_result(fn, x, w, s, b, *rest, **kw):
    out = fn(_mlx(x), mlx.array(w), _mlx(s), *([] if b is None else [_mlx(b)]), *rest, **kw)
    return np.array(out.astype(mlx.float32)).astype(np.float64)


def _check(got, want, dtype, mlx_got=None, err=""):
    tol = TOL[dtype]
    scale = max(1.0, np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=err)
    if mlx_got is not None:
        mt = MLX_TOL[dtype]
        np.testing.assert_allclose(got, mlx_got, rtol=mt, atol=mt * scale, err_msg="mlx " + err)


def _ptr(a) -> int:
    return int(a._d.data.data.ptr)


def _plan_writing(rule, out_ptr: int) -> KernelPlan:
    tid = threading.get_ident()
    for p in rule.plans.values():
        if isinstance(p, KernelPlan) and tid in p.packs and p.n_out_at >= 0 \
                and p.packs[tid][0][p.n_out_at] == out_ptr:
            return p
    raise AssertionError("no qmv plan wrote this call's output")


def _decoded(plan, spec) -> tuple:
    vals = plan.packs[threading.get_ident()][0]
    ptrs, words = {}, []
    for i, (kind, name) in enumerate(spec.params()):
        w = int(vals[plan.offsets[i]])
        if kind == "int":
            words.append(w)
        else:
            ptrs[name] = w
    return ptrs, words


def _run_on_cpu(spec, ptrs: dict, words: list) -> None:
    """The C build of ``spec`` over the launch's pointers (the stand-in's device pointers are
    host addresses) and its integer words, as packed."""
    entry = compiler.get_kernel(spec.name, spec.layout, lambda tc: qmv_cuda.c_source(spec),
                                key="qmv_c:" + spec.name)
    args = [ptrs[n] for k, n in spec.params() if k != "int"] + words
    argv = (ctypes.c_void_p * len(args))(*args)
    entry.fast_fn(gil=True)(argv)


def _host(a) -> np.ndarray:
    d = a._d.data
    if a.dtype == mx.bfloat16:
        return np.asarray(d.raw.get()).view(NPD["bfloat16"]).astype(np.float64)
    return np.asarray(d.get()).astype(np.float64)


@pytest.fixture
def c_runs(monkeypatch):
    """Every launch from Python (a dequant: ``QmmPlan``'s first step; a rule's launch over
    copies it then drops) also run by its C build on the words it was launched with, so
    what reads its result next reads it filled; the specs launched."""
    seen = []
    orig = KernelPlan._launch_one

    def launch(self, inputs, out, scratch, stream, hit):
        orig(self, inputs, out, scratch, stream, hit)
        spec = self.entry.tape
        if isinstance(spec, qmv_cuda.QmvSpec):
            seen.append(spec)
            _run_on_cpu(spec, *_decoded(self, spec))

    monkeypatch.setattr(KernelPlan, "_launch_one", launch)
    return seen


@settings(max_examples=20, deadline=None)
@given(decode())
def test_qmv_is_one_planned_launch_from_c_and_matches_float64_numpy_and_mlx(c):
    dtype, mode, bits, gs, K, N, M, batch, _ = c
    x, w, s, b, want = _inputs(c)
    ops = _operands(x, w, s, b, dtype, strided=batch == "strided")
    rule = quantized.RULES[PRIM]
    rule.plans.clear()  # (an earlier example's plan may own this output's memory)
    kw = dict(transpose=True, group_size=gs, bits=bits, mode=mode)
    ref = _mlx_result(mlx.quantized_matmul, x, w, s, b, **kw) if mlx else None
    seen = set()
    for run in range(3):  # the first makes the plan (Python), the others from C
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = mx.quantized_matmul(*ops, **kw)
        mx.eval(out)
        assert out.dtype == MXD[dtype] and out.shape == want.shape
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        if run:
            assert (c1 - c0, p1 - p0) == (1, 0), (c1 - c0, p1 - p0)
        else:
            assert c1 - c0 + p1 - p0 == 1
        plan = _plan_writing(rule, _ptr(out))
        spec = plan.entry.tape
        rows = 1 if batch == "vector" else M * (2 if batch in ("x", "w_bcast") else 1)
        assert (spec.dtype, spec.mode, spec.bits, spec.group_size, spec.rows) == (
            dtype, mode, bits, gs, rows)
        ptrs, words = _decoded(plan, spec)
        names = ["x", "w", "scales"] + (["biases"] if b is not None else [])
        assert ptrs == dict({n: _ptr(a) for n, a in zip(names, ops)}, out=_ptr(out))
        _run_on_cpu(spec, ptrs, words)
        _check(_host(out), want, dtype, ref, str((c, run)))
        seen.add(id(plan))
    assert len(seen) == 1  # one plan for the layout, made once


@st.composite
def prefill(draw):
    dtype, mode, bits, gs, K, N, _, batch, seed = draw(decode())
    transpose = draw(st.booleans())
    # an untransposed weight takes the GEMM at any row count (MLX's qmm_naive); its N is
    # the packed side: a multiple of the group size
    M = draw(st.sampled_from([qmv_cuda.MAX_ROWS + 1, 512])) if transpose else \
        draw(st.sampled_from([1, 7, 9]))
    if not transpose:
        N = gs * draw(st.sampled_from([1, 2]))
    if M == 512:
        K, N = gs, min(N, 8)
    return (dtype, mode, bits, gs, K, N, M, "strided" if batch == "vector" else batch,
            seed), transpose


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # (one patch for all)
@given(prefill())
def test_qmm_is_a_dequant_launch_and_one_gemm_and_matches_float64_numpy_and_mlx(c_runs, ct):
    """More rows, or an untransposed weight (``QmmPlan``): the dequant kernel's launch (its
    words given to its C build, which fills the call's tile) and one cuBLAS GEMM (the
    stand-in's, in float64 from the pointers, leading dimensions and strides it is given) a
    call; the calls after the first launched by the eval loop (``launch_fused``), no rule
    run; the tile given back to the allocator each call."""
    import fake_cublas
    from tapescope.kernels.backends import backend

    c, transpose = ct
    dtype, mode, bits, gs, K, N, M, batch, _ = c
    x, w, s, b, want = _inputs(c, transpose)
    ops = _operands(x, w, s, b, dtype, strided=batch == "strided")
    rule = quantized.RULES[PRIM]
    rule.plans.clear()
    kw = dict(transpose=transpose, group_size=gs, bits=bits, mode=mode)
    ref = _mlx_result(mlx.quantized_matmul, x, w, s, b, **kw) if mlx else None
    alloc = backend("gpu").allocator
    alloc.settle()
    before = alloc.active
    for run in range(3):
        c0, p0, g0 = (fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0],
                      fake_cublas.CALLS[0])
        del c_runs[:]
        out = mx.quantized_matmul(*ops, **kw)
        mx.eval(out)
        assert out.dtype == MXD[dtype] and out.shape == want.shape
        kernels = fake_cuda_driver.launches() - c0 + fake_cuda_driver.PY_LAUNCHES[0] - p0
        assert (kernels, fake_cublas.CALLS[0] - g0) == (1, 1)
        plans = [p for p in rule.plans.values() if isinstance(p, quantized.QmmPlan)]
        assert len(plans) == 1
        assert [(d.form, d.dtype, d.mode, d.bits, d.group_size) for d in c_runs] == [
            ("dequant", dtype, mode, bits, gs)]
        _check(_host(out), want, dtype, ref, str((c, transpose, run)))
    del out
    mx.synchronize()
    alloc.settle()
    assert alloc.active == before  # (no tile kept past its call)


@st.composite
def gathered(draw):
    dtype = draw(st.sampled_from(list(qmv_cuda.TYPES)))
    mode, bits, gs = draw(st.sampled_from(QUANTS))
    K = gs * draw(st.sampled_from([1, 4]))
    N = draw(st.sampled_from([8, 20]))
    M = draw(st.sampled_from([1, 3, 8]))
    E = draw(st.sampled_from([1, 4]))  # w's matrices (experts)
    nx = draw(st.sampled_from([1, 3]))  # x's matrices
    # the indices: both given; top-k experts per x matrix (lhs broadcast over k: a mixture
    # of experts' step); an outer grid (lhs (2, 1, 3), rhs (1, 2, 3): three strided dims)
    form = draw(st.sampled_from(["both", "rhs_topk", "grid"]))
    itype = draw(st.sampled_from(["uint32", "int32", "int64"]))
    return dtype, mode, bits, gs, K, N, M, E, nx, form, itype, draw(st.integers(0, 2 ** 16))


def gather_inputs(c) -> tuple:
    """(the call's operands, its index arrays, its parameters, the float64 result, MLX's)."""
    dtype, mode, bits, gs, K, N, M, E, nx, form, itype, seed = c
    rng = np.random.default_rng(seed)
    t = NPD[dtype]
    w, s, b, wd = _weights(rng, mode, bits, gs, (E,), N, K, t)
    x = rng.standard_normal((nx, M, K)).astype(t)
    if form == "both":
        li = rng.integers(0, nx, (5,)).astype(itype)
        ri = rng.integers(0, E, (5,)).astype(itype)
        idx = (mx.array(li), mx.array(ri))
    elif form == "grid":  # the op broadcasts them to (2, 2, 3)
        li = rng.integers(0, nx, (2, 1, 3)).astype(itype)
        ri = rng.integers(0, E, (1, 2, 3)).astype(itype)
        idx = (mx.array(li), mx.array(ri))
        li, ri = np.broadcast_arrays(li, ri)
    else:  # top-2 experts per x matrix: lhs broadcast (nx, 2), strides (1, 0)
        ri = rng.integers(0, E, (nx, 2)).astype(itype)
        li = np.broadcast_to(np.arange(nx).astype(itype)[:, None], (nx, 2))
        idx = (mx.broadcast_to(mx.array(np.ascontiguousarray(li[:, :1])), (nx, 2)), mx.array(ri))
    lf, rf = li.reshape(-1).astype(np.int64), ri.reshape(-1).astype(np.int64)
    want = np.matmul(x.astype(np.float64)[lf], np.swapaxes(wd[rf], -1, -2)).reshape(
        li.shape + (M, N))
    ops = _operands(x, w, s, b, dtype)
    kw = dict(transpose=True, group_size=gs, bits=bits, mode=mode)
    ref = None
    if mlx is not None:
        mi = [mlx.array(np.ascontiguousarray(i)) for i in (li, ri)]
        ref = _mlx_result(mlx.gather_qmm, x, w, s, b, lhs_indices=mi[0], rhs_indices=mi[1], **kw)
    return ops, idx, kw, want, ref


def gather_case(c) -> tuple:
    """(the result, float64 numpy's, MLX's, the dtype) of ``c``'s gather_qmm, three calls."""
    ops, idx, kw, want, ref = gather_inputs(c)
    for _ in range(3):
        out = mx.gather_qmm(*ops, lhs_indices=idx[0], rhs_indices=idx[1], **kw)
        mx.eval(out)
    return _host(out), want, ref, c[0]


@settings(max_examples=12, deadline=None)
@given(gathered())
def test_gather_qmm_is_one_gather_qmv_launch_from_c_and_matches_float64_numpy_and_mlx(c):
    """``gather_qmm`` of up to ``MAX_ROWS`` rows an entry: the qmv kernel's gather form, the
    index arrays two more inputs of one launch (their broadcast strides in its integers),
    launched from C after the first call."""
    dtype, mode, bits, gs, K, N, M = c[:7]
    ops, idx, kw, want, ref = gather_inputs(c)
    rule = quantized.RULES["GatherQMM"]
    rule.plans.clear()
    for run in range(3):
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        out = mx.gather_qmm(*ops, lhs_indices=idx[0], rhs_indices=idx[1], **kw)
        mx.eval(out)
        assert out.shape == want.shape and out.dtype == MXD[dtype]
        c1, p1 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        if run:
            assert (c1 - c0, p1 - p0) == (1, 0), (c1 - c0, p1 - p0)
        plan = _plan_writing(rule, _ptr(out))
        spec = plan.entry.tape
        assert (spec.form, spec.mode, spec.bits, spec.rows) == ("gather_qmv", mode, bits, M)
        ptrs, words = _decoded(plan, spec)
        _run_on_cpu(spec, ptrs, words)
        _check(_host(out), want, dtype, ref, str((c, run)))


def test_calls_no_plan_takes_as_they_come_run_a_contiguous_copys_plan_or_the_composition(c_runs):
    """A batch no one stride walks (a transposed view of x's batch) runs the plan of its
    row-contiguous copy; a gather of more than ``MAX_ROWS`` rows an entry runs the
    definitions' composition; both against float64 numpy."""
    rng = np.random.default_rng(3)
    w, s, b, wd = _weights(rng, "affine", 4, 32, (), 16, 64, np.float32)
    xh = rng.standard_normal((3, 2, 1, 64)).astype(np.float32)
    x = mx.swapaxes(mx.array(xh), 0, 1)  # (2, 3, 1, 64): batch strides (64, 128)
    ops = [mx.array(w), mx.array(s), mx.array(b)]
    rule = quantized.RULES[PRIM]
    rule.plans.clear()
    out = mx.quantized_matmul(x, *ops, transpose=True, group_size=32, bits=4)
    mx.eval(out)
    plans = [p for p in rule.plans.values() if p is not None]
    assert len(plans) == 1 and plans[0].entry.tape.rows == 6  # the copy's: 6 rows folded
    assert c_runs == [plans[0].entry.tape]  # (its C build run as it was launched)
    want = np.swapaxes(xh, 0, 1).astype(np.float64) @ wd.T
    _check(_host(out), want, "float32")

    ew, es, eb, ewd = _weights(rng, "affine", 8, 64, (3,), 8, 64, np.float32)
    xg = rng.standard_normal((2, qmv_cuda.MAX_ROWS + 1, 64)).astype(np.float32)
    li, ri = np.array([1, 0, 1], np.uint32), np.array([2, 2, 0], np.uint32)
    quantized.RULES["GatherQMM"].plans.clear()
    got = mx.gather_qmm(mx.array(xg), mx.array(ew), mx.array(es), mx.array(eb),
                        mx.array(li), mx.array(ri), transpose=True, group_size=64, bits=8)
    mx.eval(got)
    want = xg.astype(np.float64)[li] @ np.swapaxes(ewd[ri], -1, -2)
    assert all(p is None for p in quantized.RULES["GatherQMM"].plans.values())
    _check(np.asarray(got), want, "float32")


def test_the_kernels_tab_shows_the_qmv_kernel_in_cuda_and_c():
    """The qmv kernel's cache entry renders its CUDA (the source built), its C build and a
    Metal line saying why there is none (``kernel_cache()``, ``entry_sources``)."""
    import tapescope
    from tapescope.kernels.cache_entries import entry_sources

    c = ("bfloat16", "affine", 4, 64, 128, 8, 1, "none", 1)
    x, w, s, b, _ = _inputs(c)
    mx.eval(mx.quantized_matmul(*_operands(x, w, s, b, "bfloat16"), transpose=True,
                                group_size=64, bits=4))
    name = qmv_cuda.QmvSpec("bfloat16", 4, 64, 1).name
    entry = next(e for e in tapescope.kernel_cache() if e["name"] == name)
    src = entry_sources(entry)
    assert f"void __launch_bounds__(256, 4) {name}(" in src["cuda"]
    assert f"void {name}(void** args)" in src["cpu"]
    assert "no MSL" in src["metal"]
