"""Extended fusion's reduction tapes as the CUDA runtime builds them (``codegen/fused_reduce.py``:
one kernel per tape, the ``unit`` variant reading its row by 16-byte vectors, the row kept in
registers between passes, a written softmax's max and sum of exp folded in one online pass)
run on the host: the CUDA text compiled by g++ against ``tests/cuda_host_shim.h`` (a block's
threads as fibers) and checked against float64 numpy over row lengths around the vector and
block thresholds, rows that start off a 16-byte boundary (a sliced input), infinities and
NaN, float32 and bfloat16 (the host's ``expf`` stands for ``__expf``)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import sweep
from cuda_host import CXX, build, launch

import tapescope
import tapescope.core as mx
from tapescope.kernels.codegen.fused_reduce import (fused_reduction_kernel, fused_reduction_source,
                                                    online_pairs, unit_input)
from tapescope.kernels.codegen.reduction import interpret, lower
from tapescope.kernels.codegen.render import renderer
from tapescope.kernels.common.fused_reduction import kernel_arguments

pytestmark = pytest.mark.skipif(CXX is None, reason="no g++ to build the CUDA source for the host")

BF16 = np.dtype(ml_dtypes.bfloat16)
# (a row of 1 is no reduction: MLX's no-op reductions leave no reduction tape)
# around 16-byte vectors (4 floats, 8 halves), a warp of them, the register cache's
# 4 vectors a thread (row_threads' groups), a length just past a power of two
COLS = [2, 3, 4, 5, 8, 9, 33, 127, 129, 1000, 1025, 4096, 4099, 8193, 16389, 20000]
# make test's sample of them (each length is a tape of its own: a g++ build): scalars only,
# a vector and a tail, whole vectors, a warp's and past it, no tail at 4096, past a power of
# two, past the row's register cache
SAMPLED_COLS = sweep(COLS, [2, 3, 5, 8, 33, 129, 1025, 4096, 8193, 16389])


def softmax(x):
    e = mx.exp(x - mx.max(x, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)


def logsumexp(x):
    m = mx.max(x, axis=-1, keepdims=True)
    return mx.log(mx.sum(mx.exp(x - m), axis=-1, keepdims=True)) + m


def xent(v, t):
    """The soft-label cross-entropy of ``benchmarks/reductions.py``."""
    m = mx.max(v, axis=-1, keepdims=True)
    lse = mx.log(mx.sum(mx.exp(v - m), axis=-1, keepdims=True)) + m
    return mx.sum(t * (lse - v), axis=-1)


def primitives(x):
    """mx.softmax and mx.logsumexp inside one compiled function (their expansions)."""
    return mx.softmax(x, axis=-1) * 2.0 + mx.logsumexp(x, axis=-1, keepdims=True)


def layernorm(x):
    mu = mx.mean(x, axis=-1, keepdims=True)
    v = mx.mean(mx.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * mx.rsqrt(v + 1e-5)


def softmax64(x):
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def lse64(x):
    with np.errstate(all="ignore"):
        m = x.max(-1, keepdims=True)
        return np.log(np.exp(x - m).sum(-1, keepdims=True)) + m


def want64(f, args):
    a = [x.astype(np.float64) for x in args]
    if f is softmax:
        return softmax64(a[0])
    if f is logsumexp:
        return lse64(a[0])
    if f is xent:
        return (a[1] * (lse64(a[0]) - a[0])).sum(-1)
    if f is primitives:
        m = a[0].max(-1, keepdims=True)
        safe = np.where(np.isinf(m), 0, m)
        with np.errstate(all="ignore"):
            lse = np.where(np.isinf(m), m, safe + np.log(np.exp(a[0] - safe).sum(-1, keepdims=True)))
        return softmax64(a[0]) * 2.0 + lse
    mu = a[0].mean(-1, keepdims=True)
    return (a[0] - mu) / np.sqrt(((a[0] - mu) ** 2).mean(-1, keepdims=True) + 1e-5)


_tapes: dict = {}


def tape_of(f, dtype, n_args, shape=(2, 6)):
    """The tape's Broadcasts name the traced shape (``interpret`` follows them): one per shape."""
    key = (f, dtype, shape)
    if key not in _tapes:
        old = tapescope.fusion_mode()
        tapescope.set_fusion("extended")
        try:
            x = mx.array(np.ones(shape, np.float32)).astype(dtype)
            g = tapescope.trace(f, *([x] * n_args))
            (t,), = [[k.tape for k in g.kernels if k.tape.reduction is not None]]
        finally:
            tapescope.set_fusion(old)
        _tapes[key] = t
    return _tapes[key]


def run(tape, inputs, full):
    """The tape's outputs through its CUDA kernel (the variant the runtime picks), on the host."""
    d = renderer("cuda")
    arrays, ints = kernel_arguments(tape, list(inputs), full)
    unit = unit_input(tape)
    unit = unit if unit is not None and ints.get(f"{unit}_sc") == 1 else None
    name = f"{tape.lib_name}_reduce_{tape.reduction.mode}" + ("_vec" if unit else "")
    k = fused_reduction_kernel(tape, name, d, unit)
    bufs = {x.name: a for x, a in zip(tape.non_constant_inputs, arrays)}
    outs = [np.full(tape.reduction.shape_of(n, full), 7, tape.dtype_of(n)) for n in tape.outputs]
    bufs.update({f"out{j}": o for j, o in enumerate(outs)})
    grid, block = k.launch(ints)
    args = [bufs[p.name] if p.kind in ("in", "out") else ints[p.name] for p in k.params]
    launch(build(fused_reduction_source(tape, name, d, unit), [name]), name, grid, block, args)
    return outs


def check(f, dtype, xs, tol=None):
    n = xs[0].shape[-1]
    tape = tape_of(f, dtype, len(xs), xs[0].shape)
    it = iter(xs)  # the tape's inputs in order, its constants by position
    ins = [np.asarray(x.constant, x.dtype) if x.is_constant else next(it) for x in tape.inputs]
    got = run(tape, ins, xs[0].shape)[0]
    want = want64(f, xs).reshape(got.shape)
    interp = np.asarray(interpret(tape, [np.ascontiguousarray(x) for x in ins], xs[0].shape)[0])
    # NaN where the tape's own float32 semantics gives NaN (inf - inf in a written softmax)
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), np.isnan(interp.astype(np.float64)))
    t = tol or (2e-2 if dtype == mx.bfloat16 else 3e-6 * max(1.0, np.log2(max(n, 2))))
    scale = 1.0 if f in (softmax, layernorm) else max(1.0, float(np.nanmax(np.abs(np.where(
        np.isfinite(want), want, 0)))))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=t, atol=t * scale, equal_nan=True)


def test_a_written_softmax_and_logsumexp_fold_max_and_sum_in_one_pass():
    """The pairs found: the written max / sum(exp(x - max)) and the kernels' expansions."""
    d = renderer("cuda")
    for f, n_args in ((softmax, 1), (logsumexp, 1), (xent, 2), (primitives, 1)):
        tape = tape_of(f, mx.float32, n_args)
        items = lower(tape, d)
        pairs = online_pairs(items, {it.name: it for it in items})
        assert len(pairs) == (2 if f is primitives else 1), f.__name__
        src = fused_reduction_source(tape, "k", d, unit_input(tape))
        assert "__expf" in src, f.__name__  # the online fold's exps of values <= 0
    # a rounded chain (bfloat16 subtract / exp) is the tape's own: not paired
    tape = tape_of(softmax, mx.bfloat16, 1)
    items = lower(tape, d)
    assert online_pairs(items, {it.name: it for it in items}) == {}


@pytest.mark.parametrize("cols", SAMPLED_COLS)
@pytest.mark.parametrize("f", [softmax, logsumexp, primitives, layernorm])
def test_row_tapes_match_float64(f, cols):
    rng = np.random.default_rng(cols)
    rows = 1 if cols > 8193 else 2 if cols > 4096 else 3
    x = (rng.standard_normal((rows, cols)) * 6).astype(np.float32)
    check(f, mx.float32, [x])
    up = np.linspace(-40, 40, cols, dtype=np.float32)[None]  # a new max at every vector
    check(f, mx.float32, [up])


@pytest.mark.parametrize("cols", sweep([2, 5, 33, 1025, 4097, 8193, 16389], [2, 33, 4097, 16389]))
@pytest.mark.parametrize("off", [1, 2, 3])
def test_rows_off_a_16_byte_boundary_match_float64(cols, off):
    """A sliced input: each row starts ``off`` elements past a 16-byte boundary (a scalar
    head, the vectors, a scalar tail; the output row aligned differently from the input's)."""
    rows = 1 if cols > 8193 else 3
    x = (np.random.default_rng(cols + off).standard_normal((rows, cols + off)) * 5).astype(np.float32)
    v = x[:, off:]
    for f in (softmax, logsumexp, layernorm):
        check(f, mx.float32, [v])
    t = np.abs(np.random.default_rng(1).standard_normal((rows, cols))).astype(np.float32)
    check(xent, mx.float32, [v, t])


@pytest.mark.parametrize("cols", [2, 4, 5, 1025, 8193])
def test_infinities_and_nan_follow_the_tape(cols):
    """+inf in a row (inf - inf: NaN in a written softmax), rows of -inf, NaN: the online
    fold gives the tape's NaN where its max is not finite."""
    rng = np.random.default_rng(cols + 9)
    x = rng.standard_normal((5, cols)).astype(np.float32)
    x[0, rng.integers(0, cols)] = np.inf
    x[1, :] = -np.inf
    x[2, rng.integers(0, cols)] = np.nan
    x[3, : cols // 2] = -np.inf
    for f in (softmax, logsumexp, primitives):
        check(f, mx.float32, [x])


@pytest.mark.parametrize("cols", [7, 9, 1025, 8193])
def test_bfloat16_rows_match_float64(cols):
    """bfloat16 rows read 8 values a vector; the chain rounds to bfloat16 as the tape does."""
    x = (np.random.default_rng(cols).standard_normal((3, cols + 3)) * 3).astype(BF16)
    for v in (x[:, :cols], x[:, 3:]):
        for f in (softmax, logsumexp, primitives):
            check(f, mx.bfloat16, [v])


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(2, 2100), off=st.integers(0, 7),
       scale=st.sampled_from([0.1, 1.0, 20.0]), seed=st.integers(0, 2 ** 16))
def test_random_rows_match_float64(rows, cols, off, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols + off)) * scale).astype(np.float32)
    v = x[:, off:]
    check(softmax, mx.float32, [v])
    t = np.abs(rng.standard_normal((rows, cols))).astype(np.float32)
    check(xent, mx.float32, [v, t])
