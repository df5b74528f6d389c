"""The CPU's eager elementwise ops as one-op kernels (``kernels/cpu/eager.py``): from
``MIN_SIZE`` elements on an eager unary / binary / ternary op runs its generated kernel
(the ``eager_kernel`` dispatch path) into the buffer the eval loop chose (a dying input's,
donated, or the allocator's), below it numpy's ufunc; the values against numpy in float64
over shapes, dtypes and layouts (broadcast, transposed, sliced, 0-d scalars) at sizes
around the threshold, through the loop's C part and its Python path."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope
import tapescope.core as mx
from tapescope.core import evaluate
from tapescope.kernels.cpu import eager, tiered

from conftest import sweep

MIN = eager.MIN_SIZE
# shapes around the threshold (and the renderer's OpenMP one, the same): 65535, 65536,
# 65600 and 196610 elements
SHAPES = ((255, 257), (256, 256), (64, 1025), (5, 39322))


def _counts(fn):
    """fn's value evaluated once its kernels are loaded, and the dispatch counts of that eval
    (a first eval with tiered first calls on may run the rules while a kernel builds)."""
    mx.eval(fn())
    tiered.wait()
    evaluate.reset_dispatch_counts()
    out = fn()
    mx.eval(out)
    return np.asarray(out), evaluate.dispatch_counts()


def _layout(rng, shape: tuple, kind: str, dtype):
    """An operand for an output of ``shape`` in the layout ``kind``: (numpy's, ours)."""
    def vals(sh):
        if np.dtype(dtype).kind == "f":
            return rng.standard_normal(sh).astype(dtype)
        return rng.integers(-1000, 1000, sh).astype(dtype)
    r, c = shape
    if kind == "contiguous":
        v = vals(shape)
        return v, mx.array(v)
    if kind == "sliced":  # every other column of a wider array
        v = vals((r, 2 * c))
        return v[:, ::2], mx.array(v)[:, ::2]
    if kind == "transposed":  # read column-major
        v = vals((c, r))
        return v.T, mx.array(v).T
    if kind == "row":  # broadcast along the first axis
        v = vals((c,))
        return v, mx.array(v)
    if kind == "scalar":  # a 0-d array
        v = np.asarray(vals(()), dtype)
        return v, mx.array(v)
    raise AssertionError(kind)


BINARY = {"add": np.add, "multiply": np.multiply, "subtract": np.subtract,
          "maximum": np.maximum}
KINDS = ["contiguous", "sliced", "transposed", "row", "scalar"]


@settings(max_examples=sweep(30, 14))  # (each example a kernel built: a compiler run)
@given(op=st.sampled_from(sorted(BINARY)), dtype=st.sampled_from([np.float32, np.int32]),
       shape=st.sampled_from(SHAPES), kinds=st.tuples(st.sampled_from(KINDS[:3]),
                                                      st.sampled_from(KINDS)),
       swap=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_binary_ops_match_numpy_over_layouts(op, dtype, shape, kinds, swap, seed):
    rng = np.random.default_rng(seed)
    (a_np, a), (b_np, b) = (_layout(rng, shape, k, dtype) for k in kinds)
    if swap:
        (a_np, a), (b_np, b) = (b_np, b), (a_np, a)
    got, counts = _counts(lambda: getattr(mx, op)(a, b))
    ref = BINARY[op](a_np.astype(np.float64), b_np.astype(np.float64))
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(got, ref.astype(dtype), rtol=1e-6, atol=0)
    else:
        assert np.array_equal(got, ref.astype(np.int64).astype(dtype))
    assert got.dtype == dtype and got.shape == shape
    # a kernel from the threshold on, except where both operands are column-major (its
    # kernel writes a column-major output: the rule writes the loop's row-major one; a
    # broadcast operand, a 0-d one's included, makes the kernel strided, row-major)
    column = all(x.shape == shape and x.flags.f_contiguous and not x.flags.c_contiguous
                 for x in (a_np, b_np))
    kernel = int(np.prod(shape)) >= MIN and not column
    assert counts["eager_kernel"] == int(kernel), counts
    assert counts["rule_out"] == int(not kernel), counts


UNARY = {"exp": (np.exp, 4e-7), "negative": (np.negative, 0), "sqrt": (np.sqrt, 2e-7),
         "abs": (np.abs, 0)}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("size", [MIN - 1, MIN])
def test_unary_ops_match_numpy(op, size):
    rng = np.random.default_rng(size)
    v = (np.abs(rng.standard_normal(size)) if op == "sqrt" else rng.standard_normal(size) * 4)
    v = v.astype(np.float32)
    got, counts = _counts(lambda: getattr(mx, op)(mx.array(v)))
    fn, rtol = UNARY[op]
    np.testing.assert_allclose(got, fn(v.astype(np.float64)).astype(np.float32),
                               rtol=max(rtol, 1e-7), atol=0)
    assert counts["eager_kernel"] == (size >= MIN), counts


@settings(max_examples=12, deadline=None)
@given(size=st.sampled_from([MIN - 1, MIN, MIN + 1, MIN + 63, MIN + 65, 2 * MIN + 1]),
       busy=st.booleans(), seed=st.integers(0, 2**16))
def test_a_kernel_split_over_the_free_cores_matches_numpy(size, busy, seed):
    """Around the threading threshold, and with another of this process's threads runnable
    (which the kernels' thread count does not take for another process's load), every
    element of a multiply-add is numpy's float64 result within float32's rounding."""
    import threading

    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal(size).astype(np.float32) for _ in range(2))
    stop = threading.Event()
    spin = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    if busy:
        spin.start()
    try:
        got, counts = _counts(lambda: mx.array(x) * mx.array(y) + mx.array(x))
    finally:
        stop.set()
        if busy:
            spin.join()
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    bound = 2.0**-22 * (np.abs(x64 * y64) + np.abs(x64))  # two float32 roundings, or one fused
    assert np.all(np.abs(got.astype(np.float64) - (x64 * y64 + x64)) <= bound)
    assert counts["eager_kernel"] >= (size >= MIN), counts


def test_a_ternary_op_and_a_cast_through_their_kernels():
    rng = np.random.default_rng(3)
    c = rng.random(MIN) > 0.5
    x, y = rng.standard_normal(MIN).astype(np.float32), rng.standard_normal(MIN).astype(np.float32)
    got, counts = _counts(lambda: mx.where(mx.array(c), mx.array(x), mx.array(y)))
    assert np.array_equal(got, np.where(c, x, y))
    assert counts["eager_kernel"] == 1, counts
    i = (rng.standard_normal(MIN) * 100).astype(np.float32)
    got, counts = _counts(lambda: mx.array(i).astype(mx.int32))
    assert np.array_equal(got, i.astype(np.float64).astype(np.int32))


def test_a_chain_writes_into_its_dying_inputs():
    """A 20-op chain on two held arrays allocates one buffer (the first op's); every later op
    writes into its dying input's buffer, as MLX donates (the kernels read each element
    before they write it)."""
    rng = np.random.default_rng(5)
    a_np = rng.random(MIN * 2, dtype=np.float32)
    b_np = rng.random(MIN * 2, dtype=np.float32)
    a, b = mx.array(a_np), mx.array(b_np)

    def chain():
        x = a
        for _ in range(10):
            x = mx.multiply(x, b)
            x = mx.add(x, a)
        return x

    mx.eval(chain())
    tiered.wait()
    mx.eval(chain())
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    evaluate.reset_dispatch_counts()
    got = chain()
    mx.eval(got)
    assert evaluate.dispatch_counts()["eager_kernel"] == 20
    assert mx.get_peak_memory() - base == a_np.nbytes  # one new buffer for 20 ops
    ref = a_np.astype(np.float64)
    for _ in range(10):
        ref = ref * b_np + a_np
    np.testing.assert_allclose(np.asarray(got), ref.astype(np.float32), rtol=1e-5)


def test_the_setting_off_runs_the_rules():
    rng = np.random.default_rng(6)
    v = rng.standard_normal(MIN).astype(np.float32)
    _counts(lambda: mx.array(v) * 2.0)
    with tapescope.settings(eager_kernels=False):
        evaluate.reset_dispatch_counts()
        out = mx.array(v) * 2.0
        mx.eval(out)
        assert evaluate.dispatch_counts()["eager_kernel"] == 0
        assert np.array_equal(np.asarray(out), v * np.float32(2.0))


_WORKLOAD = r"""
import json, numpy as np
import tapescope
import tapescope.core as mx
from tapescope.core import evaluate
from tapescope.kernels.cpu import eager, tiered
n = eager.MIN_SIZE + 3
rng = np.random.default_rng(0)
a = mx.array(rng.standard_normal(n).astype(np.float32))
b = mx.array(rng.standard_normal((n // 3 + 1, 3)).astype(np.float32).T.reshape(-1)[:n])
def f():
    return mx.maximum(a * b + 1.0, mx.exp(-a)) - b[::1]
mx.eval(f()); tiered.wait()
evaluate.reset_dispatch_counts()
out = f(); mx.eval(out)
print(json.dumps({"counts": evaluate.dispatch_counts(), "sum": float(np.asarray(out, np.float64).sum())}))
"""


def test_the_python_path_runs_the_same_kernels():
    """With core/_call.c off (``TAPESCOPE_C_CALL=0``) the Python loop takes the same
    dispatch paths and gives the same values."""
    from conftest import with_and_without_c_call

    runs = with_and_without_c_call(_WORKLOAD)
    assert runs[0]["counts"] == runs[1]["counts"]
    assert runs[0]["counts"]["eager_kernel"] >= 5, runs[0]["counts"]
    assert runs[0]["sum"] == runs[1]["sum"]


def test_with_tiered_first_calls_the_rule_runs_while_the_kernel_builds():
    """``settings.tiered``: a kernel neither loaded nor on disk builds in the background and
    the op's rule runs meanwhile (the same values); once loaded the kernel runs."""
    from tapescope.kernels.cpu import compiler

    rng = np.random.default_rng(8)
    v = rng.standard_normal(MIN + 11).astype(np.float32)
    w = rng.standard_normal(MIN + 11).astype(np.float32)
    compiler.clear()  # nothing loaded in memory: the disk cache may still hold it
    with tapescope.settings(tiered=True):
        evaluate.reset_dispatch_counts()
        first = mx.subtract(mx.array(v), mx.array(w))
        mx.eval(first)
        tiered.wait()
        out = mx.subtract(mx.array(v), mx.array(w))
        mx.eval(out)
    counts = evaluate.dispatch_counts()
    assert counts["eager_kernel"] >= 1 and counts["eager_kernel"] + counts["rule_out"] == 2
    assert np.array_equal(np.asarray(first), v - w) and np.array_equal(np.asarray(out), v - w)
