"""The reduction primitives' CUDA kernels run on the host: each call's launches as the CUDA
runtime plans them (``common/reductions.py``: the kernel, its integer arguments, grid and
block from ``Kernel.launch``), the CUDA source the runtime gives NVRTC compiled by g++
against ``tests/cuda_host_shim.h`` (``cuda_host.py``: a block's threads as fibers, warp
shuffles and ``__syncthreads`` as a GPU orders them), checked against float64 numpy over
row lengths around the kernels' thresholds (a warp and a block of threads +-1, 16-byte
vectors, 8193, a 1024-thread block's 16 elements each), rows of 1, rows that start off a
16-byte boundary, ties, NaN and infinities. The GPU itself runs the same cases in
``test_cuda_reductions.py``; here the CUDA text's logic is checked without one (the host's
``expf`` stands for ``__expf``)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cuda_host import CXX, build, launch
from tapescope.kernels.codegen.render import renderer
from tapescope.kernels.common import reductions as plan

pytestmark = pytest.mark.skipif(CXX is None, reason="no g++ to build the CUDA source for the host")

BF16 = np.dtype(ml_dtypes.bfloat16)
# 16-byte vectors of float32 are 4 elements: the head / body / tail splits around 4, a warp
# (32 threads x 4), blocks of 256 and 1024 threads (row_threads' 16 elements a thread)
COLS = [1, 2, 3, 4, 5, 31, 32, 33, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 1025,
        4095, 4096, 4097, 8193, 16383, 16385, 32768]


def run(name: str, x: np.ndarray, **kw) -> np.ndarray:
    """Primitive ``name`` of ``x`` through its CUDA launches, run on the host."""
    call = plan.plan_for(name, x.dtype, x.shape, tuple(s // x.itemsize for s in x.strides), kw)
    assert not isinstance(call, str), call
    if call.copy:
        x = np.ascontiguousarray(x)
    out = np.full(call.out_shape, 7, call.out_dtype)
    bufs = {"x": x, "out": out}
    if plan.gpu_part_size(call):
        bufs["part"] = np.empty(plan.gpu_part_size(call), call.part_dtype)
    d = renderer("cuda")
    for spec, ints, src, dst in plan.gpu_launches(call):
        k = spec.kernel(gpu=True)
        grid, block = k.launch(ints)
        b = {**bufs, "x": bufs[src], "out": bufs[dst]}
        args = [b[p.name] if p.kind in ("in", "out") else call.arrays[p.name] if p.kind == "ints"
                else ints[p.name] for p in k.params]
        launch(build(spec.source(d), [k.name]), k.name, grid, block, args)
    return out


def argmax(x, axis):
    return run("ArgReduce", x, reduce_type="argmax", axis=axis)


def argmin(x, axis):
    return run("ArgReduce", x, reduce_type="argmin", axis=axis)


def lse64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    safe = np.where(np.isinf(m), 0, m)
    with np.errstate(all="ignore"):
        r = safe + np.log(np.exp(x - safe).sum(-1, keepdims=True))
    return np.where(np.isinf(m), m, r)


def softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def close(got, want, n):
    t = 2e-6 * max(1.0, np.log2(max(n, 2)))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=t, atol=t, equal_nan=True)


@pytest.mark.parametrize("cols", COLS)
def test_argmax_and_argmin_over_the_last_axis_match_numpy(cols):
    rng = np.random.default_rng(cols)
    rows = 1 if cols >= 16383 else 3
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    np.testing.assert_array_equal(argmax(x, 1)[:, 0], x.argmax(1))
    np.testing.assert_array_equal(argmin(x, 1)[:, 0], x.argmin(1))
    # ties everywhere (a few distinct values): the first index of the extreme
    t = rng.integers(0, 3, (rows, cols)).astype(np.float32)
    np.testing.assert_array_equal(argmax(t, 1)[:, 0], t.argmax(1))
    np.testing.assert_array_equal(argmin(t, 1)[:, 0], t.argmin(1))


@pytest.mark.parametrize("cols", [5, 33, 257, 1025, 8193])
def test_argmax_rows_off_a_16_byte_boundary_match_numpy(cols):
    """Rows of a sliced input start at any element: a scalar head before the vectors."""
    x = np.random.default_rng(cols).standard_normal((4, cols + 3)).astype(np.float32)
    for off in (1, 2, 3):
        v = x[:, off:off + cols]
        np.testing.assert_array_equal(argmax(v, 1)[:, 0], v.argmax(1))
        np.testing.assert_array_equal(argmin(v, 1)[:, 0], v.argmin(1))


@pytest.mark.parametrize("cols", [1, 4, 33, 1025, 8193])
def test_argmax_with_nan_and_infinities_follows_mlx(cols):
    """NaN counts as the extreme (its first index, as MLX's CPU and numpy give); a row of
    the identity value only (-inf for argmax) gives 0."""
    rng = np.random.default_rng(cols + 1)
    x = rng.standard_normal((6, cols)).astype(np.float32)
    x[1, rng.integers(0, cols, 3)] = np.nan
    x[2, :] = -np.inf
    x[3, :] = np.inf
    x[4, rng.integers(0, cols, 2)] = np.inf
    x[5, :] = np.nan
    np.testing.assert_array_equal(argmax(x, 1)[:, 0], x.argmax(1))
    np.testing.assert_array_equal(argmin(x, 1)[:, 0], x.argmin(1))


@pytest.mark.parametrize("rows", [1, 31, 32, 33, 257])
def test_argmax_over_the_first_axis_matches_numpy(rows):
    x = np.random.default_rng(rows).integers(0, 4, (rows, 70)).astype(np.float32)
    x[rows // 2, 3] = np.nan
    np.testing.assert_array_equal(argmax(x, 0)[0], x.argmax(0))
    np.testing.assert_array_equal(argmin(x, 0)[0], x.argmin(0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int32", "uint8", "int64"])
@pytest.mark.parametrize("cols", [7, 33, 1025])
def test_argmax_dtypes_match_numpy(dtype, cols):
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.random.default_rng(cols).integers(0, 9, (3, cols)).astype(dt)
    want = x.astype(np.float64)
    np.testing.assert_array_equal(argmax(x, 1)[:, 0], want.argmax(1))
    np.testing.assert_array_equal(argmin(x, 1)[:, 0], want.argmin(1))


@pytest.mark.parametrize("cols", COLS)
def test_logsumexp_and_softmax_match_float64(cols):
    rng = np.random.default_rng(cols + 2)
    rows = 1 if cols >= 16383 else 3
    x = (rng.standard_normal((rows, cols)) * 8).astype(np.float32)
    close(run("LogSumExp", x)[:, 0], lse64(x)[:, 0], cols)
    close(run("Softmax", x, precise=False), softmax64(x), cols)
    # a rising row: every vector has a new max (the sum rescaled at each)
    up = np.linspace(-50, 50, cols, dtype=np.float32)[None]
    close(run("LogSumExp", up)[:, 0], lse64(up)[:, 0], cols)
    close(run("Softmax", up, precise=False), softmax64(up), cols)


@pytest.mark.parametrize("cols", [1, 3, 4, 33, 1025, 8193])
def test_logsumexp_of_infinities_and_nan_follows_mlx(cols):
    """+inf in a row gives +inf, a row of -inf gives -inf, NaN gives NaN (MLX: the max
    itself where it is infinite)."""
    rng = np.random.default_rng(cols + 3)
    x = rng.standard_normal((5, cols)).astype(np.float32)
    x[0, rng.integers(0, cols)] = np.inf
    x[1, :] = -np.inf
    x[2, rng.integers(0, cols)] = np.nan
    x[3, : cols // 2] = -np.inf
    got = run("LogSumExp", x)[:, 0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(lse64(x)[:, 0]))
    close(got, lse64(x)[:, 0], cols)


@pytest.mark.parametrize("cols", [5, 33, 1025, 8193])
def test_logsumexp_rows_off_a_16_byte_boundary_match_float64(cols):
    x = (np.random.default_rng(cols).standard_normal((3, cols + 3)) * 4).astype(np.float32)
    for off in (1, 3):
        v = x[:, off:off + cols]
        close(run("LogSumExp", v)[:, 0], lse64(v)[:, 0], cols)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("cols", [9, 1025])
def test_logsumexp_dtypes_match_float64(dtype, cols):
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.random.default_rng(cols).standard_normal((3, cols)).astype(dt)
    want = lse64(x.astype(np.float64))[:, 0]
    tol = 1e-12 if dtype == "float64" else 1e-2 if dtype == "bfloat16" else 2e-3
    np.testing.assert_allclose(run("LogSumExp", x)[:, 0].astype(np.float64), want, rtol=tol, atol=tol)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 3000), off=st.integers(0, 3),
       scale=st.sampled_from([0.1, 1.0, 30.0]), seed=st.integers(0, 2 ** 16))
def test_random_rows_match_float64(rows, cols, off, scale, seed):
    x = (np.random.default_rng(seed).standard_normal((rows, cols + off)) * scale).astype(np.float32)
    v = x[:, off:]
    np.testing.assert_array_equal(argmax(v, 1)[:, 0], v.argmax(1))
    close(run("LogSumExp", v)[:, 0], lse64(v)[:, 0], cols)
    close(run("Softmax", v, precise=False), softmax64(v), cols)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cols", [1, 5, 33, 1024, 1025, 4097, 16384, 16389])
def test_attention_score_softmax_matches_float64(cols, causal):
    """The prefill's score softmax (``codegen/attention_softmax.py``: the same online fold,
    the row's vectors kept in registers between its two passes where the row is aligned and
    fits, else read twice): a causal block's rows see keys ``c <= l + qoff``."""
    from tapescope.kernels.codegen.attention_softmax import ScoresSoftmaxSpec

    spec = ScoresSoftmaxSpec("float32", causal=causal)
    bl, heads = 3, 1
    rows, qoff = bl * heads, cols - bl
    x = (np.random.default_rng(cols).standard_normal((rows, cols)) * 6).astype(np.float32)
    out = np.full_like(x, 7)
    k = spec.kernel(gpu=True)
    ints = {"rows": rows, "cols": cols, "bl": bl, "heads": heads, "qoff": qoff}
    grid, block = k.launch(ints)
    args = [{"x": x, "out": out}[p.name] if p.kind in ("in", "out") else ints[p.name] for p in k.params]
    launch(build(spec.source(renderer("cuda")), [k.name]), k.name, grid, block, args)
    x64 = x.astype(np.float64)
    if causal:
        seen = np.arange(cols)[None, :] <= (np.arange(rows) % bl)[:, None] + qoff
        x64 = np.where(seen, x64, -3.4028234663852886e38)
    close(out, softmax64(x64), cols)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cols", [3, 5, 9, 33, 1025, 4099, 8193])
def test_norms_rows_off_a_16_byte_boundary_match_float64(cols, dtype):
    """RMSNorm / LayerNorm keep the row in registers between passes from its first 16-byte
    boundary (a scalar head and tail beside the cached vectors), the weight / bias read by
    vectors where they are aligned as the row is: rows and weights sliced off a boundary."""
    from tapescope.kernels.codegen.norm_kernels import NormSpec

    dt = BF16 if dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((3, cols + 7)) * 3).astype(dt)
    wb = rng.standard_normal((2, cols + 7)).astype(dt)
    d = renderer("cuda")
    eps = np.array([1e-5], np.float32)
    for off, woff in ((0, 0), (1, 1), (3, 0), (5, 2)):
        v, w, b = x[:, off:off + cols], wb[0, woff:woff + cols], wb[1, woff:woff + cols]
        v64, w64, b64 = (a.astype(np.float64) for a in (v, w, b))
        for fam in ("rms", "layer_norm"):
            spec = NormSpec(fam, dtype, "row", has_w=True, has_b=fam == "layer_norm")
            k = spec.kernel(gpu=True)
            out = np.full((3, cols), 7, dt)
            ints = {"rows": 3, "cols": cols, "sr": x.shape[1], "sc": 1, "ws": 1, "bs": 1}
            bufs = {"x": v, "w": w, "b": b, "fp": eps, "out": out}
            args = [bufs[p.name] if p.kind in ("in", "out") else ints[p.name] for p in k.params]
            grid, block = k.launch(ints)
            launch(build(spec.source(d), [k.name]), k.name, grid, block, args)
            if fam == "rms":
                want = w64 * v64 / np.sqrt((v64 ** 2).mean(-1, keepdims=True) + 1e-5)
            else:
                mu = v64.mean(-1, keepdims=True)
                want = w64 * (v64 - mu) / np.sqrt(((v64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) + b64
            tol = 2e-2 if dtype == "bfloat16" else 2e-5
            np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol,
                                       err_msg=f"{fam} off {off} woff {woff}")


def _bf16_close(got, want, scale, n):
    """Within one rounding to bfloat16 of the float64 result (a half-step: 2^-8 relative)
    plus float32 accumulation (2^-22 x n of the terms' magnitude ``scale``)."""
    got = got.astype(np.float64)
    bound = 2.0 ** -8 * np.abs(want) + 2.0 ** -22 * max(n, 1) * np.asarray(scale)
    bad = ~(np.abs(got - want) <= bound)
    assert not bad.any(), (got[bad][:5], np.broadcast_to(want, got.shape)[bad][:5])


def _bf16_six(v: np.ndarray) -> None:
    """The grid's six ops (benchmarks/reductions.py) of bfloat16 rows ``v`` through their
    CUDA launches against float64 numpy of the same values."""
    w = v.astype(np.float64)
    rows, cols = v.shape
    mag = np.abs(w).sum(-1, keepdims=True)
    _bf16_close(run("Sum", v, axes=(1,)).reshape(rows, 1), w.sum(-1, keepdims=True), mag, cols)
    np.testing.assert_array_equal(run("Max", v, axes=(1,)).reshape(-1).astype(np.float64), w.max(-1))
    _bf16_close(run("Sum", v, axes=(0,)).reshape(-1), w.sum(0), np.abs(w).sum(0), rows)
    np.testing.assert_array_equal(argmax(v, 1).reshape(-1), w.argmax(1))
    lse = lse64(w)
    _bf16_close(run("LogSumExp", v).reshape(rows, 1), lse, np.maximum(np.abs(lse), 1.0), cols)
    _bf16_close(run("Softmax", v, precise=False), softmax64(w), 1.0, cols)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 2100), off=st.integers(0, 7),
       scale=st.sampled_from([0.25, 1.0, 8.0]), seed=st.integers(0, 2 ** 16))
def test_bfloat16_rows_of_the_six_ops_match_float64(rows, cols, off, scale, seed):
    """bfloat16 storage read directly (8 values a 16-byte vector, a scalar head for a row
    starting off a boundary: ``off``), float32 accumulation, one rounding of the result:
    Sum / Max over the last axis, Sum over the first, argmax, LogSumExp, Softmax."""
    x = (np.random.default_rng(seed).standard_normal((rows, cols + off)) * scale).astype(BF16)
    _bf16_six(x[:, off:])


@pytest.mark.parametrize("cols", [7, 8, 9, 255, 257, 1025, 4096, 8193])
def test_bfloat16_rows_around_the_vectors_match_float64(cols):
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((3, cols + 5)) * 3).astype(BF16)
    for off in (0, 1, 5):
        _bf16_six(x[:, off:off + cols])


def test_bfloat16_sums_accumulate_in_float32():
    """Ones: a bfloat16 accumulator stops at 256 (256 + 1 rounds back to 256), a float32
    one gives the count: rows of 2^19 give each of a block's 1024 threads 512 of them."""
    got = run("Sum", np.ones((2, 1 << 19), BF16), axes=(1,)).reshape(-1)
    np.testing.assert_array_equal(got.astype(np.float64), [float(1 << 19)] * 2)
    got = run("LogSumExp", np.zeros((2, 1 << 19), BF16)).reshape(-1).astype(np.float64)
    np.testing.assert_allclose(got, [np.log(1 << 19)] * 2, rtol=2.0 ** -8)


@pytest.mark.parametrize("name,kw", [("Sum", {"axes": (1,)}), ("Max", {"axes": (1,)}),
                                     ("ArgReduce", {"reduce_type": "argmax", "axis": 1}),
                                     ("LogSumExp", {}), ("Softmax", {"precise": False})])
def test_bfloat16_row_kernels_load_16_bytes_and_fold_in_float32(name, kw):
    """The CUDA text of a bfloat16 row kernel (MLX's: reduce/row_reduce.cuh, logsumexp.cu,
    softmax.cu, arg_reduce.cu read N_READS = 16 / sizeof(T) a load, accumulate in float):
    its row loop loads 8 bfloat16 at a time from the 16-bit storage, its state is float,
    its result rounded once."""
    call = plan.plan_for(name, BF16, (64, 4096), (4096, 1), kw)
    [(spec, ints, _, _)] = plan.gpu_launches(call)
    src = spec.source(renderer("cuda"))
    assert "*reinterpret_cast<const ts_vec<__nv_bfloat16, 8>*>" in src
    assert "const __nv_bfloat16* __restrict__ x" in src
    states = [ln.split("=")[0].split()[0] for ln in src.splitlines()
              if ln.strip().startswith(("float a_", "__nv_bfloat16 a_"))]
    assert states and set(states) == {"float"}, states
    if name != "ArgReduce":
        assert "__float2bfloat16_rn(" in src


def test_bfloat16_column_lanes_keep_16_bytes_in_flight():
    """Sum over the first axis: a lane's loop unrolled 16 bytes' worth (8 bfloat16, 4
    float32), as MLX's col_reduce reads N_READS = 16 / sizeof(T)."""
    for dt, n in ((BF16, 8), (np.dtype(np.float32), 4)):
        call = plan.plan_for("Sum", dt, (32768, 4096), (4096, 1), {"axes": (0,)})
        spec = plan.gpu_launches(call)[0][0]
        assert f"#pragma unroll {n}\n" in spec.source(renderer("cuda"))
