"""float16 and bfloat16 in the CPU's generated kernels: the loop IR's kernels hold float16 as
its bits and convert in vectorisable C (``render.py``'s ``CLoopDialect``: ``ts_f16_to_f32`` /
``ts_f32_to_f16``), so every float16 value must load exactly and every float32 must store
rounded to nearest even, as numpy's ``astype`` does; the reductions over them (sum, max, min,
argmax, softmax, logsumexp over the last axis, sum over the first) accumulate in float32 as
MLX does and must match float64 numpy for rows around the vector widths and the row tile,
with subnormals, infinities and NaN anywhere (a NaN in a row makes its max / sum / softmax /
logsumexp NaN, argmax its first NaN's index, as MLX's)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from tapescope.kernels.cpu import compiler

from conftest import kernel_launches as launched

pytestmark = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")

BF16 = np.dtype(ml_dtypes.bfloat16)
NP = {"float16": np.dtype(np.float16), "bfloat16": BF16, "float32": np.dtype(np.float32)}
MXD = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def _same_bits_or_nan(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit patterns, except that any NaN matches a NaN of the same sign."""
    gn, wn = np.isnan(got), np.isnan(want)
    np.testing.assert_array_equal(gn, wn)
    np.testing.assert_array_equal(np.signbit(got[gn]), np.signbit(want[wn]))
    ui = np.uint32 if got.dtype.itemsize == 4 else np.uint16
    bad = np.flatnonzero(got[~gn].view(ui) != want[~wn].view(ui))
    assert bad.size == 0, (got[~gn][bad[:5]], want[~wn][bad[:5]])


def test_every_float16_loads_exactly():
    """All 65536 float16 bit patterns (zeros, subnormals, normals, infinities, NaNs) through
    a kernel's load into float32: numpy's exact widening."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    with launched("cpu") as rec:
        got = mx.array(h).astype(mx.float32) * 1.0
        mx.eval(got)
    assert rec.primitives, rec.fallbacks
    _same_bits_or_nan(np.asarray(got), h.astype(np.float32))


def _float32_patterns(rng) -> np.ndarray:
    """Random float32 bit patterns and every pattern around float16's boundaries: the
    smallest subnormal and its half, the smallest normal, the largest finite and the
    overflow threshold (65520, the tie rounding to inf), and halfway points (ties to even)."""
    edges = [0x33000000, 0x33800000, 0x387FC000, 0x38800000, 0x477FE000, 0x477FF000,
             0x47800000, 0x3F801000, 0x3F803000, 0x7F800000]
    near = np.concatenate([np.arange(e - 3000, e + 3000, dtype=np.int64) for e in edges])
    bits = np.concatenate([rng.integers(0, 1 << 32, 200_000, dtype=np.uint64), near.astype(np.uint64)])
    bits = bits.astype(np.uint32)
    return np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)


def _conversions(tmp_path):
    """The C prelude's float16 conversions as two loops, built with the kernels' toolchain
    and flags (so vectorised as in a kernel), through ctypes."""
    import ctypes
    import subprocess

    from tapescope.kernels.codegen import render

    tc = compiler.toolchain()
    src = tmp_path / "conv.c"
    src.write_text(render._C_PRELUDE + """
void load16(const uint16_t* h, float* f, long n) {
  #pragma omp simd
  for (long i = 0; i < n; ++i) f[i] = ts_f16_to_f32(h[i]);
}
void store16(const float* f, uint16_t* h, long n) {
  #pragma omp simd
  for (long i = 0; i < n; ++i) h[i] = ts_f32_to_f16(f[i]);
}
""")
    lib = tmp_path / "conv.so"
    subprocess.run([tc.path, *tc.flags, str(src), "-o", str(lib), *tc.libs], check=True)
    c = ctypes.CDLL(str(lib))
    for fn in (c.load16, c.store16):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    return c


@pytest.mark.parametrize("seed", [0, 1])
def test_float32_stores_to_float16_rounded_to_nearest_even(seed, tmp_path):
    """The store conversion (every float16 output of a kernel) over random float32 bit
    patterns and those around float16's boundaries: numpy's astype, ties to even, overflow
    to inf at 65520, subnormals, NaN kept NaN with its sign; the load of all 65536 float16
    patterns exact."""
    c = _conversions(tmp_path)
    x = _float32_patterns(np.random.default_rng(seed))
    got = np.empty(x.size, np.uint16)
    c.store16(x.ctypes.data, got.ctypes.data, x.size)
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
    _same_bits_or_nan(got.view(np.float16), want)
    h = np.arange(1 << 16, dtype=np.uint16)
    f = np.empty(h.size, np.float32)
    c.load16(h.ctypes.data, f.ctypes.data, h.size)
    _same_bits_or_nan(f, h.view(np.float16).astype(np.float32))


def test_float16_stores_of_a_kernel_keep_every_value(tmp_path):
    """A fused elementwise kernel's float16 output (``_Float16`` there: a product rounded by
    AsType, then stored) holds every float16 value exactly: zeros, subnormals, inf, NaN."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    f = mx.compile(lambda v: (v * 1.0).astype(mx.float16))
    with launched("cpu") as rec:
        got = f(mx.array(h))
        mx.eval(got)
    assert rec.primitives, rec.fallbacks
    _same_bits_or_nan(np.asarray(got), h.astype(np.float16))


LENGTHS = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 257, 1000]
ROWS = [1, 3, 4, 5, 7, 8, 9, 12, 13, 17]


@st.composite
def half_rows(draw):
    """(x as float32 holding dtype's values, dtype): rows around the row tile (4) and its
    two-tile threshold, lengths around 8 / 16 / 32 / 64 lanes, values over the dtype's range
    (subnormals included), and infinities / NaNs at drawn places."""
    dtype = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
    rows, cols = draw(st.sampled_from(ROWS)), draw(st.sampled_from(LENGTHS))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    # each row of one of four scales (1e-6 and 3e-5: float16 subnormals), a row in three
    # of all four mixed
    scales = np.array([1.0, 1e-6, 3e-5, 1e3])
    scale = np.where(rng.random((rows, 1)) < 1 / 3, rng.choice(scales, (rows, cols)),
                     rng.choice(scales, (rows, 1)))
    x = (rng.standard_normal((rows, cols)) * scale).astype(NP[dtype])
    specials = draw(st.lists(st.tuples(st.integers(0, 16), st.integers(0, 999),
                                       st.sampled_from([np.nan, np.inf, -np.inf])), max_size=4))
    for r, c, v in specials:
        x[r % rows, c % cols] = v
    return x.astype(np.float32), dtype


def _want(op: str, x64: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op == "sum":
            return x64.sum(-1)
        if op == "sum_first":
            return x64.sum(0)
        if op in ("max", "min"):
            return getattr(np, op)(x64, axis=-1)
        m = x64.max(-1, keepdims=True)
        mz = np.where(np.isinf(m), 0.0, m)
        s = np.exp(x64 - mz).sum(-1, keepdims=True)
        if op == "logsumexp":
            return np.where(np.isinf(m), m, mz + np.log(s))[:, 0]
        e = np.exp(x64 - m)  # softmax: a row whose max is inf holds NaN (inf - inf), as MLX's
        return e / e.sum(-1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(half_rows(), st.sampled_from(["sum", "max", "min", "softmax", "logsumexp", "sum_first"]))
def test_half_reductions_match_float64(case, op):
    x32, dtype = case
    x64 = x32.astype(np.float64)
    a = mx.array(x32).astype(MXD[dtype])
    mx.eval(a)
    fn = {"sum": lambda: mx.sum(a, axis=-1), "sum_first": lambda: mx.sum(a, axis=0),
          "max": lambda: mx.max(a, axis=-1), "min": lambda: mx.min(a, axis=-1),
          "softmax": lambda: mx.softmax(a, axis=-1), "logsumexp": lambda: mx.logsumexp(a, axis=-1)}[op]
    with launched("cpu") as rec:
        got = fn()
        mx.eval(got)
    if x32.shape[-1 if op != "sum_first" else 0] > 1:
        assert rec.primitives, rec.fallbacks
    assert got.dtype == MXD[dtype]
    want = _want(op, x64)
    g = np.asarray(got.astype(mx.float32)).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
    if op in ("max", "min"):  # exact: the extreme is one of the elements
        np.testing.assert_array_equal(g, want)
        return
    with np.errstate(all="ignore"):
        # the result rounded to dtype; float32 accumulation over at most 1000 terms
        rounded = want.astype(NP[dtype]).astype(np.float64)
    n = x32.shape[0] if op == "sum_first" else x32.shape[-1]
    if op.startswith("sum"):
        bound = np.abs(x64).sum(0 if op == "sum_first" else -1)
        tol = np.abs(rounded - want) + 1e-6 * n * bound
        ok = np.isfinite(want) & np.isfinite(bound)
        assert (np.abs(g - want)[ok] <= tol[ok] * 1.01 + 1e-45).all(), (g[ok], want[ok])
        np.testing.assert_array_equal(g[~ok & ~np.isnan(want)], want[~ok & ~np.isnan(want)])
        return
    np.testing.assert_allclose(g, want, rtol=TOL[dtype], atol=TOL[dtype] * (op == "softmax"),
                               equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(half_rows(), st.sampled_from(["argmax", "argmin"]))
def test_half_arg_reductions_take_the_first_extreme(case, op):
    """ArgMax / ArgMin over float16 / bfloat16 rows: numpy's index on the float64 values
    (the first extreme; the first NaN where a row holds one)."""
    x32, dtype = case
    a = mx.array(x32).astype(MXD[dtype])
    mx.eval(a)
    with launched("cpu") as rec:
        got = getattr(mx, op)(a, axis=-1)
        mx.eval(got)
    if x32.shape[-1] > 1:
        assert rec.primitives, rec.fallbacks
    np.testing.assert_array_equal(np.asarray(got), getattr(np, op)(x32.astype(np.float64), axis=-1))
