"""The CPU's generated reduction kernels (codegen/reduce_kernels.py through cpu/primitive_kernels.py)
against float64 numpy: Reduce (sum, prod, max, min, all, any), ArgReduce, Softmax (and precise),
LogSumExp, the scans; hypothesis shapes, axes, keepdims, dtypes and layouts (transposed,
sliced, broadcast), and sizes around each kernel's thresholds. Every case checks that a
generated kernel ran (a ``kernel_launch`` on the timeline), not the numpy rule.

``make test`` runs a sample; ``TAPESCOPE_REDUCTION_SWEEP=1`` (``make test-fuzz``) the full sweep.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope
import tapescope.core as mx
from tapescope.kernels import timeline
from tapescope.kernels.cpu import compiler

from conftest import kernel_launches as launched

SWEEP = os.environ.get("TAPESCOPE_REDUCTION_SWEEP") == "1"
EXAMPLES = 300 if SWEEP else 25
pytestmark = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = ["float32", "float16", "bfloat16", "int32", "int8", "uint8", "int64", "uint16", "bool",
          "float64"]
MXD = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16, "int32": mx.int32,
       "int8": mx.int8, "uint8": mx.uint8, "int64": mx.int64, "uint16": mx.uint16,
       "bool": mx.bool_, "float64": mx.float64}
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-12}


def host(a) -> np.ndarray:
    """A tapescope array's values in float64 (bfloat16 through float32)."""
    if a.dtype == mx.bfloat16:
        a = a.astype(mx.float32)
    return np.asarray(a).astype(np.float64)


def values(rng, shape, dtype: str, small: bool = False) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int8", "uint8", "uint16", "int32", "int64"):
        lo = 0 if dtype.startswith("u") else -3
        return rng.integers(lo, 4, shape).astype(dtype)
    x = rng.standard_normal(shape) * (0.5 if small else 2.0)
    return x.astype(BF16 if dtype == "bfloat16" else dtype)


def layout(x: np.ndarray, kind: str):
    """``x`` as a tapescope view of another layout with the same values: the transpose of
    its transposed copy, or the first half of a larger array's last axis."""
    if kind == "transposed" and x.ndim >= 2:
        perm = list(range(x.ndim))[::-1]
        return mx.transpose(array(np.ascontiguousarray(np.transpose(x, perm))), perm)
    if kind == "sliced":
        return array(np.concatenate([x, x], axis=-1))[..., : x.shape[-1]]
    return array(x)


def array(x: np.ndarray):
    """A tapescope array of ``x``'s values and dtype (float64 stays float64)."""
    name = "bool" if x.dtype == np.bool_ else x.dtype.name
    return mx.array(x, dtype=MXD[name])


def check(got, want, dtype: str, rel: float = 1.0):
    g = host(got)
    assert g.shape == want.shape, (g.shape, want.shape)
    if dtype in TOL:
        tol = TOL[dtype] * rel
        np.testing.assert_allclose(g, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max(initial=0)),
                                   equal_nan=True)
    else:
        np.testing.assert_array_equal(g, want)


@st.composite
def reduce_case(draw):
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 5, 7, 16, 31, 33]), min_size=nd,
                                max_size=nd)))
    axes = draw(st.lists(st.integers(0, nd - 1), unique=True, min_size=1, max_size=nd))
    return shape, sorted(axes)


OPS = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "all": np.all, "any": np.any}


@settings(max_examples=EXAMPLES, deadline=None)
@given(reduce_case(), st.sampled_from(DTYPES), st.sampled_from(sorted(OPS)), st.booleans(),
       st.sampled_from(["contiguous", "transposed", "sliced", "broadcast"]), st.integers(0, 2**31))
def test_reduce_matches_float64_numpy(case, dtype, op, keepdims, kind, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    if op == "prod" and dtype in ("int8", "uint8", "int32", "uint16", "int64"):
        x = rng.integers(0, 2, shape).astype(dtype)  # products that do not wrap
    else:
        x = values(rng, shape, dtype, small=op == "prod")
    if kind == "broadcast":
        base = x[(slice(None),) * (len(shape) - 1) + (slice(0, 1),)]
        x = np.broadcast_to(base, shape)
        a = mx.broadcast_to(array(np.ascontiguousarray(base)), shape)
    else:
        a = layout(x, kind)
    with launched() as rec:
        got = getattr(mx, op)(a, axes, keepdims)
        mx.eval(got)
    ref = x.astype(np.float64) if dtype != "bool" or op in ("all", "any") else x
    want = OPS[op](ref, axis=tuple(axes), keepdims=keepdims)
    if op in ("sum", "prod") and dtype in ("int8", "uint8", "uint16", "int32", "int64", "bool"):
        want = OPS[op](x.astype(np.int64), axis=tuple(axes), keepdims=keepdims)
    if dtype == "bool" and op in ("max", "min"):
        want = OPS[op](x, axis=tuple(axes), keepdims=keepdims)
    n = int(np.prod([shape[i] for i in axes]))
    check(got, np.asarray(want, dtype=np.float64), dtype, rel=max(1.0, n / 8))
    if x.size:
        prim = {"sum": "Sum", "prod": "Prod", "max": "Max", "min": "Min", "all": "And",
                "any": "Or"}[op]
        assert prim in rec.primitives or n == 1, rec.fallbacks


@settings(max_examples=EXAMPLES, deadline=None)
@given(reduce_case(), st.sampled_from(DTYPES), st.sampled_from(["argmax", "argmin"]),
       st.sampled_from(["contiguous", "transposed"]), st.integers(0, 2**31))
def test_arg_reduce_matches_numpy(case, dtype, op, kind, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    x = values(rng, shape, dtype)
    axis = axes[0]
    a = layout(x, kind)
    with launched() as rec:
        got = getattr(mx, op)(a, axis=axis)
        mx.eval(got)
    ref = x.astype(np.float32) if dtype == "bfloat16" else x
    want = getattr(np, op)(ref, axis=axis)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert got.dtype == mx.uint32 and ("ArgReduce" in rec.primitives or shape[axis] == 1)


def test_nan_is_the_extreme_and_propagates():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 1.0, 5.0, 0.0]] * 20, np.float32)
    a = mx.array(x)
    np.testing.assert_array_equal(np.asarray(mx.argmax(a, axis=-1)), np.argmax(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(mx.argmin(a, axis=0)), np.argmin(x, axis=0))
    np.testing.assert_array_equal(np.asarray(mx.max(a, axis=-1)), np.max(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(mx.min(a, axis=0)), np.min(x, axis=0))
    assert np.isnan(float(mx.sum(a)))


@st.composite
def row_case(draw):
    rows = draw(st.sampled_from([1, 2, 3, 17, 64]))
    cols = draw(st.sampled_from([1, 2, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000]))
    return rows, cols


@settings(max_examples=EXAMPLES, deadline=None)
@given(row_case(), st.sampled_from(["float32", "float16", "bfloat16", "float64"]),
       st.sampled_from(["softmax", "precise", "logsumexp"]), st.booleans(), st.integers(0, 2**31))
def test_softmax_and_logsumexp_match_float64(case, dtype, op, transposed, seed):
    rows, cols = case
    x = values(np.random.default_rng(seed), (rows, cols), dtype)
    a = array(x)
    if transposed:  # a strided input: MLX's backends copy it first
        a = mx.transpose(array(np.ascontiguousarray(x.T)))
    x64 = x.astype(np.float64)
    m = x64.max(-1, keepdims=True)
    with launched() as rec:
        if op == "logsumexp":
            got = mx.logsumexp(a, axis=-1, keepdims=True)
            want = m + np.log(np.exp(x64 - m).sum(-1, keepdims=True))
        else:
            got = mx.softmax(a, axis=-1, precise=op == "precise")
            e = np.exp(x64 - m)
            want = e / e.sum(-1, keepdims=True)
        mx.eval(got)
    check(got, want, dtype, rel=4)
    assert {"LogSumExp" if op == "logsumexp" else "Softmax"} <= rec.primitives


def test_softmax_rows_of_infinities_follow_the_rule():
    x = np.array([[-np.inf] * 5, [np.inf, 0, 0, 0, 0], [1, 2, 3, 4, np.nan]], np.float32)
    a = mx.array(x)
    lse = np.asarray(mx.logsumexp(a, axis=-1))
    assert lse[0] == -np.inf and lse[1] == np.inf and np.isnan(lse[2])
    sm = np.asarray(mx.softmax(a, axis=-1))
    assert np.isnan(sm[0]).all() and np.isnan(sm[2]).all()


def _around(v: float, n: int = 3) -> list:
    """float32 values within ``n`` ulps of ``v``."""
    f = np.float32(v)
    out = [f]
    lo = hi = f
    for _ in range(n):
        lo, hi = np.nextafter(lo, np.float32(-np.inf)), np.nextafter(hi, np.float32(np.inf))
        out += [lo, hi]
    return out


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([1, 7, 64, 1000]))
def test_softmax_exp_near_underflow_matches_float64(seed, rows):
    """A row [0, x] with x <= -17 has softmax [1, exp(x)] exactly in float32 (the sum is 1):
    the CPU's exp of x - max seen alone, around its thresholds (the clamp at -88, k = -127
    from -87.68, the smallest normal result at -87.3365) and over [-87.33, -17]: within
    1.04 ulp where exp(x) is a normal float, 0 or a value below the smallest normal under
    it, 0 below -87.68, 0 for -inf."""
    rng = np.random.default_rng(seed)
    edges = sum((_around(v) for v in (-88.0, -87.6832, -87.33654, -103.28, -17.0)), [])
    x = np.concatenate([np.array(edges, np.float32), [-np.inf, -1e30],
                        rng.uniform(-87.33, -17.0, 64).astype(np.float32),
                        rng.uniform(-104.0, -87.0, 64).astype(np.float32)]).astype(np.float32)
    x = np.resize(x, max(rows, 1))[:, None]
    a = mx.array(np.concatenate([np.zeros_like(x), x], 1))
    with launched() as rec:
        got = mx.softmax(a, axis=-1)
        mx.eval(got)
    assert "Softmax" in rec.primitives
    g = np.asarray(got)
    assert (g[:, 0] == 1).all()
    e = np.exp(x[:, 0].astype(np.float64))
    tiny = np.finfo(np.float32).tiny
    normal = e >= tiny
    ulp = np.spacing(e[normal].astype(np.float32)).astype(np.float64)
    assert (np.abs(g[normal, 1] - e[normal]) / ulp <= 1.04).all()
    sub = g[~normal, 1]
    assert ((sub >= 0) & (sub < tiny)).all()
    assert (g[x[:, 0] < -87.6832, 1] == 0).all()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 17])
@pytest.mark.parametrize("cols", [3, 1000, 2**13 + 1])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_logsumexp_rows_around_the_row_tile(rows, cols, dtype):
    """The CPU's LogSumExp folds ROW_TILE (4) rows per loop from 8 rows on (both passes),
    the rest one by one (threaded from PAR_MIN_EXP elements on): every row's result against
    float64, a NaN in a tiled row and in the last row, rows of -inf and +inf, a row stride
    wider than the row (a slice)."""
    from tapescope.kernels.codegen.reduce_kernels import PAR_MIN_EXP, ROW_TILE

    assert ROW_TILE == 4 and (rows * cols >= PAR_MIN_EXP) == (cols > 1000 and rows >= 4)
    rng = np.random.default_rng(rows * cols)
    wide = values(rng, (rows, cols + 5), dtype)
    wide[rows // 2, cols // 2] = np.nan
    wide[-1, 0] = np.nan
    if rows > 3:
        wide[1, :] = -np.inf
        wide[2, cols // 3] = np.inf
    for sliced in (False, True):
        x = wide[:, :cols] if sliced else np.ascontiguousarray(wide[:, :cols])
        a = array(np.ascontiguousarray(wide))[:, :cols] if sliced else array(x)
        x64 = x.astype(np.float64)
        with launched() as rec:
            got = mx.logsumexp(a, axis=-1)
            mx.eval(got)
        assert "LogSumExp" in rec.primitives
        with np.errstate(invalid="ignore"):
            m = x64.max(-1, keepdims=True)
            z = np.where(np.isinf(m), 0, m)
            want = (z + np.log(np.exp(x64 - z).sum(-1, keepdims=True)))[:, 0]
            want = np.where(np.isinf(m[:, 0]), m[:, 0], want)
        g = host(got)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
        fin = ~np.isnan(want)
        check_close = np.isclose(g[fin], want[fin], rtol=TOL[dtype] * 4, atol=TOL[dtype] * 4)
        assert check_close.all(), (sliced, g[fin][~check_close], want[fin][~check_close])


@pytest.mark.parametrize("cols", [1, 7, 8, 9, 33, 1000])
def test_logsumexp_rows_with_a_nan_anywhere_are_nan(cols):
    """LogSumExp's exp pass does not carry NaN (a NaN makes the row's max, and so its
    result, NaN): a NaN at every position of a row, beside +inf / -inf, gives NaN, and the
    other rows their float64 value."""
    rng = np.random.default_rng(cols)
    rows = []
    for j in range(cols):
        for other in (0.0, np.inf, -np.inf):
            r = rng.standard_normal(cols).astype(np.float32)
            r[(j + 1) % cols] = other if cols > 1 else r[0]
            r[j] = np.nan
            rows.append(r)
    x = np.concatenate([np.stack(rows), rng.standard_normal((3, cols)).astype(np.float32)])
    with launched() as rec:
        got = mx.logsumexp(mx.array(x), axis=-1)
        mx.eval(got)
    assert "LogSumExp" in rec.primitives
    g = np.asarray(got)
    assert np.isnan(g[:-3]).all()
    x64 = x[-3:].astype(np.float64)
    m = x64.max(-1)
    np.testing.assert_allclose(g[-3:], m + np.log(np.exp(x64 - m[:, None]).sum(-1)), rtol=1e-6)


SCANS = {"cumsum": np.cumsum, "cumprod": np.cumprod, "cummax": np.maximum.accumulate,
         "cummin": np.minimum.accumulate}


@pytest.mark.parametrize("cols", [1, 7, 8, 9, 33, 1000])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_softmax_rows_with_a_nan_anywhere_are_nan(cols, dtype):
    """Softmax's CPU max pass skips NaN and its exp pass carries it: a NaN at every position
    of a row, beside +inf / -inf / a row of NaN, makes every output of that row NaN (as
    MLX's NaN max does: exp(x - NaN)), and the other rows their float64 value; float16 /
    bfloat16 outputs recompute the exp in the last pass, float32 ones store it."""
    rng = np.random.default_rng(cols)
    rows = []
    for j in range(cols):
        for other in (0.0, np.inf, -np.inf, np.nan):
            r = rng.standard_normal(cols)
            r[(j + 1) % cols] = other if cols > 1 else r[0]
            r[j] = np.nan
            rows.append(r)
    rows.append(np.full(cols, np.nan))
    x = np.concatenate([np.stack(rows), rng.standard_normal((3, cols))]).astype(
        BF16 if dtype == "bfloat16" else dtype)
    for precise in (False, True):
        with launched() as rec:
            got = mx.softmax(array(x), axis=-1, precise=precise)
            mx.eval(got)
        assert "Softmax" in rec.primitives
        g = host(got)
        assert np.isnan(g[:-3]).all()
        x64 = host(array(x[-3:]))
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        check(got[-3:], e / e.sum(-1, keepdims=True), dtype, rel=4)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sampled_from([8, 9, 12, 13, 36, 64]), st.sampled_from([9, 16, 17, 63, 129, 1000, 4099]),
       st.sampled_from(["float32", "float16", "bfloat16", "float64"]), st.sampled_from(["max", "min"]),
       st.sampled_from(["plain", "sliced", "transposed"]), st.booleans(),
       st.lists(st.tuples(st.integers(0, 63), st.integers(0, 4098)), max_size=4),
       st.lists(st.sampled_from([np.inf, -np.inf, 0.0, -0.0]), max_size=4), st.integers(0, 2**16))
def test_row_tiles_flag_a_nan_before_other_elements(rows, cols, dtype, op, kind, keepdims, nans,
                                                    others, seed):
    """The row tile folds ``m > v ? m : v`` (a NaN element enters the extreme and leaves at
    the next one) and multiplies the new extremes into its NaN witness: a NaN anywhere in a row,
    followed by larger, smaller, infinite or zero elements, still gives that row NaN and
    only that row; the threaded tiles (64 x 4099: past PAR_MIN) too; against float64 numpy
    (zeros of either sign compare equal)."""
    rng = np.random.default_rng(seed)
    x = values(rng, (rows, cols), dtype)
    for v in others:
        x[rng.integers(0, rows), rng.integers(0, cols)] = v
    for r, c in nans:
        x[r % rows, c % cols] = np.nan
    with launched() as rec:
        got = getattr(mx, op)(layout(x, kind), axis=-1, keepdims=keepdims)
        mx.eval(got)
    assert {"Max", "Min"} & rec.primitives, rec.fallbacks
    x64 = host(array(x))
    check(got, getattr(np, op)(x64, axis=-1, keepdims=keepdims), dtype)


def np_scan(name, x, axis, reverse, inclusive):
    if reverse:
        x = np.flip(x, axis)
    out = SCANS[name](x, axis=axis)
    if not inclusive:
        ident = {"cumsum": 0, "cumprod": 1, "cummax": -np.inf, "cummin": np.inf}[name]
        out = np.concatenate([np.full_like(np.take(out, [0], axis), ident),
                              np.take(out, np.arange(x.shape[axis] - 1), axis)], axis)
    return np.flip(out, axis) if reverse else out


@settings(max_examples=EXAMPLES, deadline=None)
@given(reduce_case(), st.sampled_from(["float32", "float16", "int32", "int8", "bfloat16"]),
       st.sampled_from(sorted(SCANS)), st.booleans(), st.booleans(), st.booleans(),
       st.integers(0, 2**31))
def test_scan_matches_numpy(case, dtype, name, reverse, inclusive, transposed, seed):
    shape, axes = case
    axis = axes[0]
    x = values(np.random.default_rng(seed), shape, dtype, small=name == "cumprod")
    if name == "cumprod" and dtype in ("int32", "int8"):
        x = np.random.default_rng(seed).integers(-1, 2, shape).astype(dtype)
    a = layout(x, "transposed" if transposed else "contiguous")
    with launched() as rec:
        got = getattr(mx, name)(a, axis=axis, reverse=reverse, inclusive=inclusive)
        mx.eval(got)
    x64 = x.astype(np.float64)
    want = np_scan(name, x64, axis, reverse, inclusive)
    if dtype in ("int8",) and name in ("cumsum", "cumprod"):  # wraps in int8, as MLX's does
        want = np_scan(name, x.astype(np.int64), axis, reverse, inclusive).astype(np.int8)
    if dtype in ("int32", "int8") and name in ("cummax", "cummin") and not inclusive:
        info = np.iinfo(dtype)
        want = np.where(np.isinf(want), np.where(want > 0, info.max, info.min), want)
    check(got, np.asarray(want, np.float64), dtype, rel=max(4.0, shape[axis] / 4))
    assert {"CumSum": "cumsum", "CumProd": "cumprod", "CumMax": "cummax",
            "CumMin": "cummin"}.keys() & rec.primitives


THRESHOLDS = [1, 31, 32, 33, 255, 256, 257, 1023, 1024, 1025, 2**15 - 1, 2**15 + 1, 2**16 + 3]


@pytest.mark.parametrize("n", THRESHOLDS if SWEEP else [1, 33, 257, 2**16 + 3])
def test_sizes_around_every_threshold(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    a = mx.array(x)
    x64 = x.astype(np.float64)
    check(mx.sum(a), np.asarray(x64.sum()), "float32", rel=max(1, n / 64))  # all / row
    check(mx.max(a), np.asarray(x64.max()), "float32")
    m = mx.array(x.reshape(1, n))
    check(mx.logsumexp(m, axis=-1), np.log(np.exp(x64).sum()).reshape(1), "float32", rel=8)
    check(mx.argmax(a, axis=0), np.asarray(np.argmax(x)), "int")
    check(mx.cumsum(a), np.cumsum(x64), "float32", rel=max(4, n / 64))
    col = mx.array(x.reshape(-1, 1) * np.ones((1, 3), np.float32))  # rows of 3, n of them
    check(mx.sum(col, axis=0), (x64.reshape(-1, 1) * np.ones((1, 3))).sum(0), "float32",
          rel=max(1, n / 64))


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 9, 11, 12, 13] if SWEEP else [3, 7, 8, 9, 13])
@pytest.mark.parametrize("cols", [3, 2**15 + 1])
def test_rows_around_the_row_tile(rows, cols):
    """The CPU's row kernel folds ROW_TILE (4) rows per loop from 8 rows on, the rest one
    by one (threaded from PAR_MIN elements on): every row's result, a NaN in a tiled row
    and in the last (a tail) row, the row-contiguous, strided and general layouts."""
    from tapescope.kernels.codegen.reduce_kernels import PAR_MIN, ROW_TILE

    assert ROW_TILE == 4 and (rows * cols >= PAR_MIN) == (cols > 3 and rows >= 8)
    rng = np.random.default_rng(rows * cols)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[rows // 2, cols // 2] = np.nan
    x[-1, 0] = np.nan
    x64 = x.astype(np.float64)
    for kind in ("plain", "sliced", "transposed"):
        a = layout(x, kind)
        with launched() as rec:
            got = {"sum": mx.sum(a, axis=-1), "max": mx.max(a, axis=-1), "min": mx.min(a, axis=-1),
                   "any": mx.any(a > 1.0, axis=-1)}
            mx.eval(*got.values())
        assert {"Sum", "Max", "Min", "Or"} <= set(rec.primitives), (kind, rec.fallbacks)
        check(got["sum"], x64.sum(-1), "float32", rel=max(1, cols / 64))
        check(got["max"], x64.max(-1), "float32")
        check(got["min"], x64.min(-1), "float32")
        np.testing.assert_array_equal(np.asarray(got["any"]), (x > 1.0).any(-1))
    # the general layout: 9 kept rows (a tile and one more), each over two strided axes
    with launched() as rec:
        g = mx.sum(mx.array(x.reshape(rows, 1, cols)) * mx.ones((1, 9, 1)), axis=(0, 2))
        mx.eval(g)
    assert "Sum" in rec.primitives, rec.fallbacks
    check(g, np.full(9, x64.sum()), "float32", rel=max(1, rows * cols / 64))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sampled_from([8, 9, 11, 12, 13, 33]), st.sampled_from([1, 3, 16, 17, 129]),
       st.sampled_from(["float32", "float16", "bfloat16", "float64"]), st.sampled_from(["max", "min"]),
       st.sampled_from(["plain", "sliced", "general"]),
       st.lists(st.tuples(st.integers(0, 32), st.integers(0, 128)), max_size=3),
       st.sampled_from([None, np.inf, -np.inf]), st.integers(0, 2**16))
def test_row_tiles_share_a_nan_flag(rows, cols, dtype, op, kind, nans, inf, seed):
    """The CPU's float max / min over the last axis folds ROW_TILE rows with a NaN witness
    per row pair (a product of the pair's new extremes); a tile whose witness turns NaN
    folds its rows again exactly: only the rows holding a NaN give NaN (any row of a tile,
    the tail rows past the last tile, infinities beside them), in the row, strided and
    general layouts."""
    rng = np.random.default_rng(seed)
    x = values(rng, (rows, cols), dtype)
    if inf is not None:
        x[rng.integers(0, rows), rng.integers(0, cols)] = inf
    for r, c in nans:
        x[r % rows, c % cols] = np.nan
    if kind == "general":  # two reduced axes that do not collapse: (rows, cols, 2)[..., :1]
        a = array(np.repeat(x[..., None], 2, axis=-1))[..., :1]
        axes = (1, 2)
    else:
        a, axes = layout(x, kind), (1,)
    with launched() as rec:
        got = getattr(mx, op)(a, axis=axes)
        mx.eval(got)
    if cols > 1:  # (an axis of one element is no reduction: MLX gives the input)
        assert {"Max", "Min"} & rec.primitives, rec.fallbacks
    x64 = host(array(x))
    check(got, getattr(np, op)(x64, axis=-1), dtype)


@pytest.mark.parametrize("cols", [2, 3, 16, 17, 33, 1000, 1001])
@pytest.mark.parametrize("kind", ["plain", "sliced", "shifted"])
def test_bfloat16_row_sums_read_as_word_pairs(cols, kind):
    """The CPU's bfloat16 row-tile sum reads two elements a 32-bit word where the rows start
    on a word (an even row stride, x 4-byte aligned): even lengths (words only), odd ones
    of an even stride (a slice: the last element after the words), odd strides and a view
    one element in (not aligned: the element loop); rows of tiles and the tail rows; against
    float64 numpy."""
    rng = np.random.default_rng(cols)
    rows = 13  # three tiles of four and a tail row
    x = rng.standard_normal((rows, cols + 1)).astype(BF16)
    if kind == "plain":
        v, a = x[:, :cols].copy(), array(x[:, :cols].copy())
    elif kind == "sliced":
        big = np.concatenate([x[:, :cols], x[:, :cols]], -1)  # row stride 2 * cols: even
        v, a = x[:, :cols], array(big)[:, :cols]
    else:
        v, a = x[:, 1:], array(x)[:, 1:]  # one element in: x + 1 is not 4-byte aligned
    with launched() as rec:
        got = mx.sum(a, axis=-1)
        mx.eval(got)
    assert "Sum" in rec.primitives, rec.fallbacks
    check(got, v.astype(np.float64).sum(-1), "bfloat16", rel=max(1, cols / 64))


LANE_COLS = [2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 1000]  # around 4 / 8 / 16 / 32 lanes


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_row_tiles_catch_a_nan_in_every_lane(dtype, op):
    """A NaN at every column of a row's first 72 and last 40 (every lane of the first and
    last vectors and every element of the scalar tail, for lengths around 8 / 16 / 32
    lanes), in each row of a tile in turn, followed by
    elements beyond it (a NaN element lives in the extreme for one step only, so the
    witness must take it at that step): that row and only that row gives NaN."""
    big = -1e4 if op == "min" else 1e4
    for cols in LANE_COLS:
        rows = 12  # three tiles of ROW_TILE = 4 rows, no tail
        x = np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) % 7 - 3
        at = sorted(set(range(min(cols, 72))) | set(range(max(0, cols - 40), cols)))  # every
        # lane of the first vectors, the last vectors and the scalar tail
        x = np.repeat(x[None], len(at), axis=0)  # one matrix per NaN column
        for i, k in enumerate(at):
            for r in range(rows):
                if (r + k) % 3 == 0:
                    x[i, r, k] = np.nan
                    x[i, r, k + 1:] = big  # larger (for max) elements after the NaN
        xt = x.reshape(len(at) * rows, cols).astype(BF16 if dtype == "bfloat16" else dtype)
        with launched() as rec:
            got = getattr(mx, op)(array(xt), axis=-1)
            mx.eval(got)
        if cols > 1:  # (an axis of one element is no reduction: MLX gives the input)
            assert {"Max", "Min"} & rec.primitives, rec.fallbacks
        check(got, getattr(np, op)(host(array(xt)), axis=-1), dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("cols", [9, 33, 1024])
def test_half_row_tiles_of_every_bit_pattern(dtype, op, cols):
    """float16 / bfloat16 max / min over rows of tiles fold the bits' order keys, never
    converted: every one of the 65536 patterns (both zeros, subnormals, infinities, NaNs of
    either sign and every payload) in rows with NaNs and rows where each NaN was replaced by
    a zero; against float64 numpy, NaN exactly where a row holds one."""
    rng = np.random.default_rng(cols)
    bits = rng.permutation(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
    bits = np.concatenate([bits, bits[: (-bits.size) % cols]])  # whole rows
    x = bits.view(BF16 if dtype == "bfloat16" else np.float16).reshape(-1, cols).copy()
    nan = np.isnan(x.astype(np.float32))
    x[::2][nan[::2]] = 0  # even rows: no NaN
    with launched() as rec:
        got = getattr(mx, op)(array(x), axis=-1)
        mx.eval(got)
    assert {"Max", "Min"} & rec.primitives, rec.fallbacks
    want = getattr(np, op)(x.astype(np.float64), axis=-1)
    g = host(got)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
    np.testing.assert_array_equal(g[~np.isnan(want)], want[~np.isnan(want)])
    assert np.isnan(want[1::2]).any() and not np.isnan(want[::2]).any()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("cols", [5, 17, 1000])
def test_row_tiles_witness_turning_nan_without_a_nan_gives_the_extremes(dtype, op, cols):
    """The witness multiplies a row pair's extremes, so it turns NaN without any NaN where
    one extreme is 0 and the other infinite, where the pair's extremes are +inf and -inf,
    or where the products overflow and change sign: such a tile folds its rows again and
    gives their exact extremes, never NaN."""
    huge = {"float32": 1e30, "bfloat16": 1e30, "float64": 1e200, "float16": 6e4}[dtype]
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((16, cols)).astype(np.float64)
    x[0] = 0.0  # row 0 extremes 0, row 1 all +inf then -inf: 0 * inf
    x[1] = np.inf if op == "max" else -np.inf
    x[2] = -np.inf  # row 2 -inf (max) against row 3 +inf
    x[3] = np.inf
    x[2], x[3] = (x[2], x[3]) if op == "max" else (-x[2], -x[3])
    x[4] = np.where(np.arange(cols) % 2 == 0, -huge, huge)  # products of +-huge, signs mixed
    x[5] = np.where(np.arange(cols) % 3 == 0, huge, -huge)
    x[6] = np.where(np.arange(cols) < cols // 2, -np.inf, 1.0)  # -inf lanes, then finite
    x[7] = np.where(np.arange(cols) < cols // 2, 0.0, -1.0)
    xt = x.astype(BF16 if dtype == "bfloat16" else dtype)
    with launched() as rec:
        got = getattr(mx, op)(array(xt), axis=-1)
        mx.eval(got)
    assert {"Max", "Min"} & rec.primitives, rec.fallbacks
    g = host(got)
    assert not np.isnan(g).any(), g
    np.testing.assert_array_equal(g, getattr(np, op)(host(array(xt)), axis=-1))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sampled_from([1, 2, 3, 5]), st.sampled_from([1, 2, 15, 31, 32, 33, 63, 64, 65, 1000]),
       st.sampled_from(["float32", "float16", "bfloat16", "float64", "int32", "int8", "uint8",
                        "int64"]),
       st.sampled_from(["argmax", "argmin"]), st.sampled_from(["row", "sliced", "col"]),
       st.sampled_from(["ties", "extremes", "nans", "random"]), st.integers(0, 2**16))
def test_arg_reduce_takes_the_first_extreme(rows, cols, dtype, op, kind, fill, seed):
    """The CPU's ArgReduce folds each lane in index order, an element replacing the lane's
    state only when strictly better, and merges the lanes by value then index: the first
    extreme wins against numpy's argmax / argmin over rows of ties (few distinct values),
    rows that are all the identity (-inf for argmax, the integer minimum) with the extreme
    anywhere or nowhere, and NaNs (the first NaN is the extreme), at lengths around the
    lane count and its tails."""
    rng = np.random.default_rng(seed)
    np_dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    flt = np_dt.kind == "f" or dtype == "bfloat16"
    lo, hi = (-np.inf, np.inf) if flt else (np.iinfo(np_dt).min, np.iinfo(np_dt).max)
    ident = lo if op == "argmax" else hi
    if fill == "ties":
        x = rng.integers(0, 3, (rows, cols)).astype(np_dt)
    elif fill == "extremes":
        x = np.full((rows, cols), ident, np_dt)
        for r in range(rows):
            if rng.random() < 0.7:
                x[r, rng.integers(0, cols, rng.integers(1, 3))] = hi if op == "argmax" else lo
    else:
        x = values(rng, (rows, cols), dtype)
        if fill == "nans" and flt:
            x[rng.integers(0, rows, 3), rng.integers(0, cols, 3)] = np.nan
    if kind == "col":  # the reduced axis first: the column kernel
        a = layout(np.ascontiguousarray(x.T), "contiguous")
        axis = 0
    else:
        a, axis = layout(x, "sliced" if kind == "sliced" else "contiguous"), -1
    with launched() as rec:
        got = getattr(mx, op)(a, axis=axis)
        mx.eval(got)
    ref = x.astype(np.float32) if dtype == "bfloat16" else x
    np.testing.assert_array_equal(np.asarray(got), getattr(np, op)(ref, axis=-1))
    assert "ArgReduce" in rec.primitives or cols == 1, rec.fallbacks


def _col_names(seq) -> set:
    return {r.name for r in timeline.records_since(seq) if r.kind == "kernel_launch"}


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sampled_from([1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 300]),
       st.sampled_from([1, 2, 3, 5, 17, 2049, 4099]),
       st.sampled_from(["float32", "float16", "int32", "float64"]),
       st.sampled_from(["sum", "max", "min", "prod", "argmax", "argmin"]),
       st.booleans(), st.integers(0, 3), st.integers(0, 2**16))
def test_columns_around_the_register_block(kept, red, dtype, op, sliced, nans, seed):
    """The CPU's column kernel (a reduction over the first axis of a row-contiguous array)
    runs a block of exactly COL_REG kept elements with its accumulators in registers and
    every other block (longer, or the last, shorter one) as before: kept lengths around
    COL_REG and its multiples, reduced lengths on both sides of PAR_MIN (threaded), a
    sliced row (a stride past the kept run), NaNs at random places (max / min propagate
    them; argmax / argmin take the first extreme, NaN counting as one), against numpy."""
    from tapescope.kernels.codegen.reduce_kernels import COL_REG

    assert COL_REG == 64
    rng = np.random.default_rng(seed)
    x = values(rng, (red, kept), dtype, small=op == "prod")
    if dtype.startswith("float"):
        for _ in range(nans):
            x[rng.integers(0, red), rng.integers(0, kept)] = np.nan
    wide = np.concatenate([x, x[:, :3]], axis=1) if sliced else x
    a = array(wide)[:, :kept] if sliced else array(x)
    timeline.set_recording(True)
    seq = timeline.next_seq()
    try:
        fn = {"argmax": mx.argmax, "argmin": mx.argmin}.get(op) or getattr(mx, op)
        got = fn(a, axis=0)
        mx.eval(got)
    finally:
        names = _col_names(seq)
        timeline.set_recording(False)
    if kept > 1 and red > 1:
        assert any(n.startswith("col_") for n in names), names
    x64 = x.astype(np.float64)
    if op in ("argmax", "argmin"):
        ref = (np.nanargmax if op == "argmax" else np.nanargmin)
        first_nan = np.isnan(x64).argmax(0)
        want = np.where(np.isnan(x64).any(0), first_nan,
                        ref(np.where(np.isnan(x64), -np.inf if op == "argmax" else np.inf, x64), axis=0))
        np.testing.assert_array_equal(np.asarray(got), want)
        return
    want = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[op](x64, axis=0)
    check(got, want, dtype, rel=max(1, red / 64))


@pytest.mark.skipif(not SWEEP, reason="TAPESCOPE_REDUCTION_SWEEP=1 (make test-fuzz)")
def test_rows_of_two_to_the_twenty():
    x = np.random.default_rng(1).standard_normal((3, 1 << 20)).astype(np.float32)
    a = mx.array(x)
    x64 = x.astype(np.float64)
    check(mx.sum(a, axis=-1), x64.sum(-1), "float32", rel=1 << 12)
    check(mx.softmax(a, axis=-1), np.exp(x64 - x64.max(-1, keepdims=True)) / np.exp(
        x64 - x64.max(-1, keepdims=True)).sum(-1, keepdims=True), "float32", rel=64)
    check(mx.sum(a.T, axis=0), x64.sum(-1), "float32", rel=1 << 12)


def test_kernels_are_in_the_cache_with_three_sources():
    a = mx.array(np.ones((4, 8), np.float32))
    mx.eval(mx.softmax(a, axis=-1), mx.sum(a, axis=0))
    from tapescope.kernels.cache_entries import entry_sources

    got = {e["name"]: e for e in tapescope.kernel_cache()}
    for name in ("block_softmax_float32", "col_reduce_sum_float32_float32"):
        e = got[name]
        assert e["runtime"] == "cpu" and name in e["source"]
        src = entry_sources(e)
        assert set(src) == {"cpu", "cuda", "metal"}
        assert "__global__" in src["cuda"] and "[[kernel]]" in src["metal"]


def test_complex_falls_back_to_the_rule_visibly():
    a = mx.array(np.array([[1 + 2j, 3 - 1j]], np.complex64))
    with launched() as rec:
        got = mx.sum(a, axis=-1)
        mx.eval(got)
    assert np.asarray(got)[0] == 4 + 1j
    assert "Sum" not in rec.primitives
    assert any(f.get("primitive") == "Sum" and "complex" in f["reason"] for f in rec.fallbacks)


def test_the_kernels_tab_shows_a_reduction_kernels_three_sources():
    from tapescope.viz.report import kernels_section

    a = mx.array(np.ones((3, 5), np.float32))
    timeline.set_recording(True)
    seq = timeline.next_seq()
    try:
        mx.eval(mx.logsumexp(a, axis=-1))
    finally:
        recs = timeline.records_since(seq)
        timeline.set_recording(False)
    html = kernels_section([], recs, tapes=False, sources=True)
    assert "block_logsumexp_float32" in html
    assert "__global__" in html and "threadgroup" in html  # the CUDA and MSL columns


def test_trace_names_each_reductions_kernel_and_its_sources():
    def f(x):
        return mx.softmax(x, axis=-1) + mx.sum(x, axis=0) + mx.cumsum(x, axis=1)

    g = tapescope.trace(f, mx.array(np.ones((4, 8), np.float32)))
    got = {op.primitive: spec for op, spec in g.generated_kernels}
    assert got["Softmax"].name == "block_softmax_float32"
    assert got["Sum"].name == "col_reduce_sum_float32_float32"
    assert got["CumSum"].name == "contig_scan_inclusive_sum_float32_float32"
    assert "kernel block_softmax_float32 [generated]" in g.summary()
    src = got["Sum"].sources()
    assert "col_reduce_sum_float32_float32(void** args)" in src["cpu"]
    # a GPU's column kernel: a thread per kept element, no lane exchanges
    assert "ts_shfl_xor(" not in src["cuda"].split("col_reduce_sum_float32_float32(")[1]
    assert "ts_shfl_xor(" in got["Softmax"].sources()["cuda"].split("block_softmax_float32(")[1]
    from tapescope.viz.report import kernels_section

    html = kernels_section([("f", g)], [], tapes=False, sources=True)
    assert "contig_scan_inclusive_sum_float32_float32" in html
