"""The matmul family beyond ``matmul``: ``gather_mm`` (``GatherMM``), ``block_masked_mm``
(``BlockMaskedMM``), ``segmented_mm`` (``SegmentedMM``), complex ``addmm`` and
``mx.fast.gated_delta_update`` against MLX itself over hypothesis inputs (shapes, batch
broadcasting, indices, block sizes, masks, dtypes), gradients against MLX's, MLX's errors, the
recorded primitives, and the JAX check of each primitive."""

from __future__ import annotations

import io
import re
from collections import Counter

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import tapescope
import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import primitive_names, same_error

needs_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
      "float64": np.float64}
# Rounding relative to the products' scale (|a| @ |b|): float32 sums in different orders;
# half types accumulate in float32 and round once to the result's dtype.
REL = {"float32": 2e-6, "float64": 2e-6, "float16": 2 ** -10, "bfloat16": 2 ** -7}


def _outcome(module, fn, args):
    try:
        out = fn(module, *[None if a is None else module.array(a) for a in args])
        module.eval(out)
        return out
    except Exception as e:  # noqa: BLE001
        return e


def _np(x, module):
    return np.array(x.astype(module.float32))


def _against_mlx(fn, args, dtype="float32", scale_args=None):
    """``fn(M, *arrays)`` in both libraries: the same error, or the same shape and dtype and
    values within ``REL[dtype]`` of ``fn`` over ``scale_args`` (|inputs|, bounding the
    rounding); returns our result."""
    want, got = _outcome(mlx_ref, fn, args), _outcome(mx, fn, args)
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want), (got, want)
        return None
    assert not isinstance(got, Exception), got
    assert got.shape == tuple(want.shape)
    assert got.dtype.name == str(want.dtype).split(".")[-1]
    scale = 1.0
    if scale_args is not None:
        scale = _np(_outcome(mlx_ref, fn, scale_args), mlx_ref)
    g, w = _np(got, mx), _np(want, mlx_ref)
    np.testing.assert_array_less(np.abs(g - w), REL[dtype] * (scale + np.abs(w)) + 1e-6)
    return got


def _abs(args):
    return [a if a is None or a.dtype.kind not in "fV" else np.abs(a) for a in args]


def _mlx_primitives(*outs) -> Counter:
    """Primitive names in MLX's own graph of ``outs`` (from ``export_to_dot``)."""
    f = io.StringIO()
    mlx_ref.export_to_dot(f, *outs)
    return Counter(re.findall(r'label ="([A-Za-z]+)"', f.getvalue()))


# -- gather_mm ---------------------------------------------------------------------------------
@st.composite
def gather_cases(draw):
    m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
    a_batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    b_batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    a_shape = a_batch + (m, k) if draw(st.booleans()) or a_batch else (k,)
    b_shape = b_batch + (k, n) if draw(st.booleans()) or b_batch else (k,)
    na, nb = int(np.prod(a_batch)), int(np.prod(b_batch))
    which = draw(st.sampled_from(["both", "lhs", "rhs"]))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 999)))
    sort = draw(st.booleans())

    def idx(size, shp):
        i = rng.integers(0, size, shp).astype(draw(st.sampled_from(["int32", "uint32", "int64"])))
        return np.sort(i, axis=None).reshape(shp) if sort else i

    # an index array broadcasts against the other one's default (the other operand's batch)
    lhs = idx(na, shape if which != "rhs" else ()) if which != "rhs" else None
    rhs = idx(nb, shape if which == "both" else b_batch) if which != "lhs" else None
    if which == "lhs":
        lhs = idx(na, draw(st.sampled_from([b_batch, (1,) * len(b_batch)])) if b_batch else shape)
    if which == "rhs":
        rhs = idx(nb, draw(st.sampled_from([a_batch, (1,) * len(a_batch)])) if a_batch else shape)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    return a, b, lhs, rhs, sort


def _gather(M, a, b, lhs, rhs, sort=False):
    return M.gather_mm(a, b, lhs, rhs, sorted_indices=sort)


@needs_mlx
@settings(max_examples=60, deadline=None)
@given(gather_cases())
def test_gather_mm_matches_mlx(case):
    a, b, lhs, rhs, sort = case
    fn = lambda M, a, b, l, r: _gather(M, a, b, l, r, sort)  # noqa: E731
    _against_mlx(fn, [a, b, lhs, rhs], scale_args=_abs([a, b, lhs, rhs]))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_gather_mm_other_floats_are_the_float32_product_rounded(dtype):
    """MLX's CPU backend runs GatherMM in float32 only; its GPU backends (and tapescope)
    take every float: the float32 product of the same values, rounded once."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 2, 4)).astype(NP[dtype])
    b = rng.standard_normal((2, 4, 5)).astype(NP[dtype])
    lhs, rhs = np.array([2, 0, 1, 1]), np.array([1, 1, 0, 1])
    got = mx.gather_mm(mx.array(a, getattr(mx, dtype)), mx.array(b, getattr(mx, dtype)),
                       mx.array(lhs), mx.array(rhs))
    assert got.dtype.name == dtype and got.shape == (4, 2, 5)
    want = a.astype(np.float64)[lhs] @ b.astype(np.float64)[rhs]
    scale = np.abs(a.astype(np.float64))[lhs] @ np.abs(b.astype(np.float64))[rhs]
    err = np.abs(np.array(got.astype(mx.float64)) - want)
    assert np.all(err <= REL[dtype] * (scale + np.abs(want)) + 1e-12)


@needs_mlx
@settings(max_examples=25, deadline=None)
@given(gather_cases())
def test_gather_mm_gradients_match_mlx(case):
    a, b, lhs, rhs, sort = case
    assume(a.ndim > 2)  # MLX's VJP flattens a's batch axes: a 2-D (or 1-D) a raises there
    # MLX 0.32.4's sorted shortcut assumes a's rows are the output's (only rhs given):
    # with sorted lhs it is wrong (tested against JAX below)
    assume(not (sort and rhs is None))
    cot = None

    def grads(M):
        nonlocal cot
        l, r = (None if x is None else M.array(x) for x in (lhs, rhs))
        out = _gather(M, M.array(a), M.array(b), l, r, sort)
        if cot is None:
            cot = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
        return M.vjp(lambda x, y: _gather(M, x, y, l, r, sort), [M.array(a), M.array(b)],
                     [M.array(cot)])[1]

    want, got = grads(mlx_ref), grads(mx)
    for w, g in zip(want, got):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lhs,rhs,sort", [([0, 0, 1, 3], None, True),
                                          ([0, 0, 1, 3], [2, 2, 0, 1], True),
                                          (None, [0, 0, 1, 2], True),
                                          (None, [0, 2, 1, 2], False)])
def test_gather_mm_gradients_match_jax(lhs, rhs, sort):
    """Against jax.vjp of the JAX forward graph, including the sorted-lhs case MLX 0.32.4
    gets wrong and a 2-D ``b`` (one matrix, every index 0 by default)."""
    rng = np.random.default_rng(0)
    a = mx.array(rng.standard_normal((4, 3, 5)).astype(np.float32))
    b = mx.array(rng.standard_normal((3, 5, 6) if rhs else (5, 6)).astype(np.float32))
    l, r = (None if x is None else mx.array(x) for x in (lhs, rhs))
    f = lambda x, y: mx.sum(mx.sin(mx.gather_mm(x, y, l, r, sorted_indices=sort)))  # noqa: E731
    report = tapescope.check(mx.grad(f, argnums=(0, 1)), a, b)
    assert report.passed, report


def test_gather_mm_records_one_primitive_and_its_sorted_flags():
    a, b = mx.ones((3, 2, 4)), mx.ones((2, 4, 5))
    out = mx.gather_mm(a, b, mx.array([0, 1]), None, sorted_indices=True)
    assert out._d.node.primitive.name == "GatherMM"
    assert dict(out._d.node.primitive.params) == {"left_sorted": True, "right_sorted": False}
    assert "GatherMM" not in primitive_names(mx.gather_mm(a[:2], b))  # no indices: a matmul


@needs_mlx
def test_gather_mm_compiles_shapeless_as_mlx():
    """GatherMM has MLX's output_shapes: a shapeless compile replays on indices of new
    shapes (broadcast again) and new operand shapes."""
    rng = np.random.default_rng(2)
    calls = [((4, 2, 3), (2, 3, 5), [0, 1, 1, 0], [0, 1, 1, 0]),
             ((3, 4, 3), (2, 3, 6), [[1], [2]], [1, 0, 1])]
    outs = {}
    for M in (mlx_ref, mx):
        f = M.compile(lambda a, b, i, j: M.gather_mm(a, b, i, j), shapeless=True)
        outs[M] = [f(M.array(rng.standard_normal(sa).astype(np.float32)),
                     M.array(rng.standard_normal(sb).astype(np.float32)), M.array(i), M.array(j))
                   for sa, sb, i, j in calls]
        rng = np.random.default_rng(2)
    for w, g in zip(outs[mlx_ref], outs[mx]):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-5, atol=1e-5)


# -- block_masked_mm ---------------------------------------------------------------------------
@st.composite
def block_cases(draw):
    bs = draw(st.sampled_from([32, 64]))
    m, k, n = (draw(st.integers(1, 2 * bs + 3)) for _ in range(3))
    batch_a = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    batch_b = batch_a[len(batch_a) - draw(st.integers(0, len(batch_a))):]
    one_d = draw(st.sampled_from(["", "a", "b"])) if not batch_a else ""
    a_shape = (k,) if one_d == "a" else batch_a + (m, k)
    b_shape = (k,) if one_d == "b" else batch_b + (k, n)
    m, n = (1 if one_d == "a" else m), (1 if one_d == "b" else n)
    tm, tn, tk = (-(-x // bs) for x in (m, n, k))
    rng = np.random.default_rng(draw(st.integers(0, 999)))

    def mask(rows, cols, drop=None):
        kind = draw(st.sampled_from(["bool", "float"]))
        shape = batch_a + (rows, cols)
        if drop is not None:  # a 1-D operand's masks lose that axis
            shape = tuple(s for i, s in enumerate(shape) if i != len(shape) + drop)
        if kind == "bool":
            return rng.random(shape) > 0.3
        return rng.uniform(0, 2, shape).astype(np.float32)

    with_out, with_ops = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    mo = mask(tm, tn, -2 if one_d == "a" else (-1 if one_d == "b" else None)) if with_out else None
    ml = mask(tm, tk, -2 if one_d == "a" else None) if with_ops else None
    mr = mask(tk, tn, -1 if one_d == "b" else None) if with_ops else None
    if with_ops and draw(st.booleans()):  # one operand mask left out: MLX's default True
        ml, mr = (None, mr) if draw(st.booleans()) else (ml, None)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    return a, b, bs, mo, ml, mr


@needs_mlx
@settings(max_examples=50, deadline=None)
@given(block_cases())
def test_block_masked_mm_matches_mlx(case):
    a, b, bs, mo, ml, mr = case
    fn = lambda M, a, b, mo, ml, mr: M.block_masked_mm(a, b, bs, mo, ml, mr)  # noqa: E731
    _against_mlx(fn, [a, b, mo, ml, mr], scale_args=_abs([a, b, mo, ml, mr]))


@needs_mlx
@settings(max_examples=15, deadline=None)
@given(block_cases(), st.data())
def test_block_masked_mm_gradients_match_mlx(case, data):
    """Gradients of a, b and of float masks (MLX refuses boolean ones, stop_gradient'ed here)."""
    a, b, bs, mo, ml, mr = case
    assume(a.ndim > 1 and b.ndim > 1)
    args = [a, b, mo, ml, mr]
    diff = [i for i, x in enumerate(args) if x is not None and x.dtype == np.float32]
    argnums = tuple(data.draw(st.lists(st.sampled_from(diff), min_size=1, max_size=5,
                                       unique=True)))

    def grads(M):
        def f(*xs):
            xs = [x if x is None or x.dtype != M.bool_ else M.stop_gradient(x) for x in xs]
            return M.sum(M.sin(M.block_masked_mm(xs[0], xs[1], bs, *xs[2:])))
        g = M.grad(f, argnums=argnums)(*[None if x is None else M.array(x) for x in args])
        return g if isinstance(g, tuple) else (g,)

    want, got = grads(mlx_ref), grads(mx)
    for w, g in zip(want, got):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_block_masked_mm_half_floats_against_float32(dtype):
    """MLX's CPU backend runs BlockMaskedMM in float32 only: the half-float product is the
    float32 one of the same values, rounded once."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 70)).astype(NP[dtype])
    b = rng.standard_normal((70, 33)).astype(NP[dtype])
    mo, ml, mr = rng.random((2, 2)) > 0.3, rng.random((2, 3)) > 0.3, rng.random((3, 2)) > 0.3
    args = [mx.array(x) for x in (mo, ml, mr)]
    got = mx.block_masked_mm(mx.array(a), mx.array(b), 32, *args)
    ref = mx.block_masked_mm(mx.array(a.astype(np.float32)), mx.array(b.astype(np.float32)), 32,
                             *args)
    assert got.dtype.name == dtype
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)),
                                  np.array(ref.astype(getattr(mx, dtype)).astype(mx.float32)))


def test_block_masked_mm_bool_mask_zeroes_nan_float_mask_scales():
    """A false boolean block is set to zero (a NaN in it too); a float block is scaled."""
    a = np.full((40, 40), 1.0, np.float32)
    a[0, 0] = np.nan
    b = np.eye(40, dtype=np.float32)
    out = mx.block_masked_mm(mx.array(a), mx.array(b), 32, None,
                             mx.array([[False, True], [True, True]]), mx.array([[True] * 2] * 2))
    res = np.array(out)
    assert np.all(res[:32, :32] == 0) and np.all(res[32:, :] == 1)
    out = mx.block_masked_mm(mx.array(np.ones((40, 40), np.float32)), mx.array(b), 32,
                             mx.array([[0.5, 2.0], [1.0, 0.0]]))
    res = np.array(out)
    assert res[0, 0] == 0.5 and res[0, 39] == 2.0 and res[39, 0] == 1.0 and res[39, 39] == 0.0


# -- segmented_mm ------------------------------------------------------------------------------
@needs_mlx
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(0, 12), st.integers(1, 5),
       st.lists(st.integers(1, 3), max_size=2), st.sampled_from(list(NP)), st.integers(0, 999))
def test_segmented_mm_matches_mlx(m, k, n, seg_batch, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(NP[dtype])
    b = rng.standard_normal((k, n)).astype(NP[dtype])
    # segments inside [0, K] (MLX reads out of bounds past K); empty and reversed ones too
    segs = rng.integers(0, k + 1, tuple(seg_batch) + (2,)).astype(np.int32)
    fn = lambda M, a, b, s: M.segmented_mm(a, b, s)  # noqa: E731
    if dtype in ("float32", "float64"):
        _against_mlx(fn, [a, b, segs], dtype, scale_args=_abs([a, b, segs]))
        return
    # MLX 0.32.4's CPU SegmentedMM reads float16 / bfloat16 rows of ``a`` with the segment's
    # width as their stride (wrong values for a strict sub-range): the reference is MLX's
    # float32 product of the same values, rounded once to the half type
    got = mx.segmented_mm(mx.array(a), mx.array(b), mx.array(segs))
    f32 = lambda x: mlx_ref.array(x.astype(np.float32))  # noqa: E731
    want = mlx_ref.segmented_mm(f32(a), f32(b), mlx_ref.array(segs))
    scale = np.array(mlx_ref.segmented_mm(f32(np.abs(a)), f32(np.abs(b)), mlx_ref.array(segs)))
    assert got.dtype.name == dtype and got.shape == tuple(want.shape)
    err = np.abs(np.array(got.astype(mx.float32)) - np.array(want))
    np.testing.assert_array_less(err, REL[dtype] * (scale + np.abs(np.array(want))) + 1e-6)


# -- complex addmm -----------------------------------------------------------------------------
@needs_mlx
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.sampled_from(
    [("c", "c", "c"), ("f", "c", "c"), ("c", "f", "f"), ("c", "c", "f")]),
    st.sampled_from([(1.0, 1.0), (2.0, 0.5), (-1.5, 0.0)]), st.booleans(), st.integers(0, 99))
def test_complex_addmm_matches_mlx(m, k, n, kinds, ab, batched, seed):
    rng = np.random.default_rng(seed)

    def make(kind, shape):
        x = rng.standard_normal(shape)
        if kind == "c":
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(np.complex64 if kind == "c" else np.float32)

    batch = (2,) if batched else ()
    c, a, b = make(kinds[0], (n,)), make(kinds[1], batch + (m, k)), make(kinds[2], (k, n))
    fn = lambda M, c, a, b: M.addmm(c, a, b, *ab)  # noqa: E731
    got = _against_mlx(lambda M, *x: M.real(fn(M, *x)), [c, a, b], scale_args=None)
    _against_mlx(lambda M, *x: M.imag(fn(M, *x)), [c, a, b])
    assert got is not None and "AddMM" not in primitive_names(fn(mx, *map(mx.array, (c, a, b))))


# -- gated_delta_update ------------------------------------------------------------------------
@st.composite
def delta_cases(draw):
    b, t, hk, dk, dv = (draw(st.integers(1, 3)) for _ in range(5))
    hv = hk * draw(st.sampled_from([1, 2]))
    rng = np.random.default_rng(draw(st.integers(0, 999)))
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    f = lambda shape, lo=None: (rng.standard_normal(shape) if lo is None  # noqa: E731
                                else rng.uniform(lo, 1, shape)).astype(NP[dtype])
    gamma_shape = (b, t, hv, dk) if draw(st.booleans()) else (b, t, hv)
    args = [f((b, t, hk, dk)) * 0.5, f((b, t, hk, dk)) * 0.5, f((b, t, hv, dv)),
            f(gamma_shape, 0.5), f((b, t, hv), 0.0)]
    state = rng.standard_normal((b, hv, dv, dk)).astype(np.float32) if draw(st.booleans()) \
        else None
    mask = None
    if draw(st.booleans()):
        mask = rng.random((b, t)) > 0.3
        if draw(st.booleans()):
            mask = mask.astype(np.float32)
    return args + [state, mask], dtype


@needs_mlx
@settings(max_examples=30, deadline=None)
@given(delta_cases())
def test_gated_delta_update_matches_mlx(case):
    args, dtype = case
    for i in range(2):
        fn = lambda M, *x: M.fast.gated_delta_update(*x)[i]  # noqa: E731
        _against_mlx(fn, args, dtype if i == 0 else "float32")


@needs_mlx
def test_gated_delta_update_records_mlx_s_graph():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in
            [(1, 2, 1, 2), (1, 2, 1, 2), (1, 2, 2, 2), (1, 2, 2), (1, 2, 2)]]
    mask = np.array([[1.0, 0.5]], np.float32)
    want = _mlx_primitives(*mlx_ref.fast.gated_delta_update(*map(mlx_ref.array, args), None,
                                                            mlx_ref.array(mask)))
    got = Counter(primitive_names(
        *mx.fast.gated_delta_update(*map(mx.array, args), None, mx.array(mask))))
    assert got == want


@needs_mlx
@pytest.mark.parametrize("case", [
    lambda M: M.gather_mm(M.ones((3, 2, 4)), M.ones((4,)), M.array([0, 2]), None,
                          sorted_indices=True),
    lambda M: M.gather_mm(M.ones((3, 2, 4), M.float16), M.ones((2, 4, 5)), None,
                          M.array([[1], [0]], M.uint8)),
    lambda M: M.block_masked_mm(M.ones((2, 40, 70)), M.ones((70, 33), M.float16), 32,
                                M.ones((2, 2), M.bool_), M.ones((2, 3)), None),
    lambda M: M.block_masked_mm(M.ones((40,)), M.ones((40, 33)), 64, M.ones((1,)),
                                M.ones((1,), M.bool_), M.ones((1, 1), M.bool_)),
    lambda M: M.segmented_mm(M.ones((3, 4), M.float16), M.ones((4, 2)), M.array([[0, 3]])),
    lambda M: M.addmm(M.ones((2,)), M.ones((3, 4), M.complex64), M.ones((4, 2)), 2.0, 0.5),
])
def test_recorded_graph_is_mlx_s(case):
    """The same primitives, as many times, as MLX records (export_to_dot's nodes)."""
    assert Counter(primitive_names(case(mx))) == _mlx_primitives(case(mlx_ref))


@needs_mlx
@settings(max_examples=8, deadline=None)
@given(delta_cases())
def test_gated_delta_update_gradients_match_mlx(case):
    args, dtype = case
    assume(dtype == "float32")
    # the mask is cast to bool: MLX refuses a gradient through that cast
    diff = tuple(i for i, x in enumerate(args[:6]) if x is not None)

    def grads(M):
        def f(*xs):
            y, s = M.fast.gated_delta_update(*xs)
            return M.sum(M.sin(y)) + M.sum(M.cos(s))
        return M.grad(f, argnums=diff)(*[None if x is None else M.array(x) for x in args])

    for w, g in zip(grads(mlx_ref), grads(mx)):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-4, atol=1e-5)


# -- errors, transformations MLX lacks, the JAX check ------------------------------------------
A3, B3 = (lambda M: M.ones((4, 3, 5))), (lambda M: M.ones((2, 5, 6)))


@needs_mlx
@pytest.mark.parametrize("case", [
    lambda M: M.gather_mm(A3(M), B3(M)),
    lambda M: M.gather_mm(A3(M), B3(M), M.array([0, 3, 1]), None),
    lambda M: M.gather_mm(A3(M), B3(M), M.array([0.0, 1.0]), None),
    lambda M: M.gather_mm(A3(M), B3(M), M.array([0, 1]), M.array([0, 1, 1])),
    lambda M: M.gather_mm(A3(M).astype(M.int32), B3(M).astype(M.int32), M.array([0]), None),
    lambda M: M.gather_mm(A3(M).astype(M.complex64), B3(M), M.array([0]), None),
    lambda M: M.gather_mm(M.array(1.0), B3(M), M.array([0]), None),
    lambda M: M.gather_mm(A3(M), M.ones((2, 4, 6)), M.array([0]), None),
    lambda M: M.gather_mm(1.0, B3(M), M.array([0])),
    lambda M: M.gather_mm(A3(M), B3(M), [0, 1]),
    lambda M: M.gather_mm(A3(M), B3(M), M.array([0]), sorted_indices=1),
    lambda M: M.block_masked_mm(M.ones((70, 40)), M.ones((40, 33)), 16,
                                M.ones((5, 2), dtype=M.bool_)),
    lambda M: M.block_masked_mm(M.ones((70, 40)), M.ones((40, 33)), 32,
                                M.ones((3, 3), dtype=M.bool_)),
    lambda M: M.block_masked_mm(M.ones((70, 40)), M.ones((33, 40)), 32,
                                M.ones((3, 2), dtype=M.bool_)),
    lambda M: M.block_masked_mm(M.ones((4, 4), M.int32), M.ones((4, 4), M.int32), 32,
                                M.ones((1, 1), dtype=M.bool_)),
    lambda M: M.block_masked_mm(M.ones((40,)), M.ones((40, 33)), 32, None,
                                M.ones((1, 2), dtype=M.bool_), None),
    lambda M: M.block_masked_mm(M.ones((40, 40)), M.ones((40, 33)), 32.0),
    lambda M: M.block_masked_mm(M.ones((40, 40)), M.ones((40, 33)), 32, [1]),
    lambda M: M.block_masked_mm(M.ones((), M.float32), M.ones((40, 33)), 32, M.ones((1, 1))),
    lambda M: M.segmented_mm(M.ones((3, 4)), M.ones((4, 2)), M.array([0, 3, 4])),
    lambda M: M.segmented_mm(M.ones((3, 4)), M.ones((4, 2)), M.array(3)),
    lambda M: M.segmented_mm(M.ones((3, 4)), M.ones((4, 2)), M.array([[0.0, 3.0]])),
    lambda M: M.segmented_mm(M.ones((1, 3, 4)), M.ones((4, 2)), M.array([[0, 3]])),
    lambda M: M.segmented_mm(M.ones((3, 4), M.int32), M.ones((4, 2), M.int32),
                             M.array([[0, 3]])),
    lambda M: M.segmented_mm(M.ones((3, 4)), M.ones((4, 2)), [[0, 3]]),
    lambda M: M.addmm(M.ones((3,)), M.ones((3, 4), M.complex64), M.ones((5, 3))),
    lambda M: M.addmm(M.ones((2,)), M.ones((3, 4), M.complex64), M.ones((4, 3))),
    lambda M: M.addmm(M.ones((2,)), M.array(1j), M.ones((4, 3))),
    lambda M: M.vmap(lambda x: M.gather_mm(x, B3(M), M.array([0]), M.array([1])))(
        M.ones((2, 4, 3, 5))),
    lambda M: M.vmap(lambda x: M.block_masked_mm(x, M.ones((5, 6)), 32, M.ones((1, 1))))(
        M.ones((2, 3, 5))),
    lambda M: M.vmap(lambda x: M.segmented_mm(x, M.ones((5, 6)), M.array([[0, 2]])))(
        M.ones((2, 3, 5))),
    lambda M: M.jvp(lambda x: M.gather_mm(x, B3(M), M.array([0]), M.array([1])),
                    [A3(M)], [A3(M)])[1],
    lambda M: M.jvp(lambda x: M.block_masked_mm(x, M.ones((5, 6)), 32, M.ones((1, 1))),
                    [M.ones((3, 5))], [M.ones((3, 5))])[1],
    lambda M: M.compile(lambda a, b: M.block_masked_mm(a, b, 32, M.ones((1, 1))),
                        shapeless=True)(M.ones((3, 4)), M.ones((4, 5))),
    lambda M: M.compile(lambda a, b: M.segmented_mm(a, b, M.array([[0, 2]])),
                        shapeless=True)(M.ones((3, 4)), M.ones((4, 5))),
    lambda M: M.grad(lambda x: M.segmented_mm(x, M.ones((5, 6)), M.array([[0, 2]])).sum())(
        M.ones((3, 5))),
    lambda M: M.grad(lambda m: M.block_masked_mm(M.ones((3, 5)), M.ones((5, 6)), 32, None, m,
                                                 M.ones((1, 1), M.bool_)).sum())(
        M.ones((1, 1), M.bool_)),
    lambda M: M.fast.gated_delta_update(M.ones((2, 3, 2, 3)), M.ones((2, 3, 2, 4)),
                                        M.ones((2, 3, 4, 3)), M.ones((2, 3, 4)),
                                        M.ones((2, 3, 4))),
    lambda M: M.fast.gated_delta_update(M.ones((2, 3, 2, 4)), M.ones((2, 3, 2, 4)),
                                        M.ones((2, 3, 3, 3)), M.ones((2, 3, 4)),
                                        M.ones((2, 3, 4))),
    lambda M: M.fast.gated_delta_update(M.ones((2, 3, 2, 4)), M.ones((2, 3, 2, 4)),
                                        M.ones((2, 3, 4, 3)), M.ones((2, 3, 4)),
                                        M.ones((2, 3, 3))),
    lambda M: M.fast.gated_delta_update(M.ones((2, 3, 2, 4)), M.ones((2, 2, 2, 4)),
                                        M.ones((2, 3, 4, 3)), M.ones((2, 3, 4)),
                                        M.ones((2, 3, 4))),
    lambda M: M.fast.gated_delta_update(M.ones((2, 3, 2, 4)), M.ones((2, 3, 2, 4)),
                                        M.ones((2, 3, 4, 3)), M.ones((3, 4)), M.ones((2, 3, 4))),
    lambda M: M.fast.gated_delta_update(M.ones((2, 3, 2, 4)), M.ones((2, 3, 2, 4)),
                                        M.ones((3, 4, 3)), M.ones((2, 3, 4)), M.ones((2, 3, 4))),
    lambda M: M.fast.gated_delta_update(M.ones((2, 3, 2, 4)), M.ones((2, 3, 2, 4)),
                                        M.ones((2, 3, 4, 3)), M.ones((2, 3, 4)),
                                        M.ones((2, 3, 4)), None, M.ones((2,))),
    lambda M: M.fast.gated_delta_update(M.ones((2, 0, 2, 4)), M.ones((2, 0, 2, 4)),
                                        M.ones((2, 0, 4, 3)), M.ones((2, 0, 4)),
                                        M.ones((2, 0, 4))),
    lambda M: M.fast.gated_delta_update(1.0, M.ones((2, 3, 2, 4)), M.ones((2, 3, 4, 3)),
                                        M.ones((2, 3, 4)), M.ones((2, 3, 4))),
])
def test_errors_match_mlx(case):
    same_error(case)


@pytest.mark.parametrize("fn", [
    lambda: mx.gather_mm(mx.array(np.arange(24, dtype=np.float32).reshape(2, 3, 4)),
                         mx.array(np.arange(40, dtype=np.float32).reshape(2, 4, 5)),
                         mx.array([1, 0, 1]), mx.array([0, 0, 1])),
    lambda: mx.block_masked_mm(mx.array(np.linspace(-1, 1, 70 * 40, dtype=np.float32)
                                        .reshape(70, 40)), mx.ones((40, 33)), 32,
                               mx.array([[True, False]] * 3), mx.array([[0.5, 1.0]] * 3),
                               mx.array([[1.0, 2.0], [0.0, 1.0]])),
    lambda: mx.segmented_mm(mx.array(np.linspace(-1, 1, 30, dtype=np.float32).reshape(3, 10)),
                            mx.ones((10, 4)), mx.array([[0, 3], [3, 10], [7, 2]])),
])
def test_jax_check_passes(fn):
    report = tapescope.check(fn)
    assert report.passed, report
