"""Random elementwise DAGs: compiled == uncompiled == numpy (hypothesis)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapescope.core as mx

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float32": (mx.float32, np.float32), "float16": (mx.float16, np.float16),
          "bfloat16": (mx.bfloat16, BF16), "int32": (mx.int32, np.int32)}
TOL = {"float32": 2e-4, "float16": 2e-2, "bfloat16": 6e-2, "int32": 0}

# (name, tapescope fn, numpy fn computed in float32 / int, allowed for ints)
UNARY = [("exp", mx.exp, np.exp, False), ("sin", mx.sin, np.sin, False),
         ("tanh", mx.tanh, np.tanh, False), ("neg", mx.negative, np.negative, True),
         ("abs", mx.abs, np.abs, True), ("square", mx.square, np.square, True)]
BINARY = [("add", mx.add, np.add, True), ("sub", mx.subtract, np.subtract, True),
          ("mul", mx.multiply, np.multiply, True), ("max", mx.maximum, np.maximum, True),
          ("min", mx.minimum, np.minimum, True)]
SHAPES = [(3, 4), (4,), (3, 1), (1, 4), ()]
CONSTS = [2.0, -0.5, float("inf"), float("-inf"), float("nan"), 0.0, -0.0]


def _np_round(x, ndt):
    return np.asarray(x, dtype=np.float32 if ndt == BF16 or ndt == np.float16 else ndt).astype(ndt)


@st.composite
def dags(draw):
    dname = draw(st.sampled_from(sorted(DTYPES)))
    is_int = dname == "int32"
    n_in = draw(st.integers(1, 3))
    layouts = [draw(st.sampled_from(["plain", "transposed", "sliced"])) for _ in range(n_in)]
    shapes = [(3, 4) if lay != "plain" else draw(st.sampled_from(SHAPES)) for lay in layouts]
    steps = []
    n = n_in
    for _ in range(draw(st.integers(2, 7))):
        kind = draw(st.sampled_from(["unary", "binary", "const"]))
        a = draw(st.integers(0, n - 1))
        if kind == "unary":
            ops = [u for u in UNARY if u[3] or not is_int]
            steps.append(("unary", draw(st.sampled_from(ops)), a))
        elif kind == "binary":
            ops = [b for b in BINARY if b[3] or not is_int]
            steps.append(("binary", draw(st.sampled_from(ops)), a, draw(st.integers(0, n - 1))))
        else:
            c = draw(st.sampled_from([1, 2, -3] if is_int else CONSTS))
            steps.append(("const", draw(st.sampled_from(BINARY[:3])), a, c))
        n += 1
    n_out = draw(st.integers(1, 2))
    seed = draw(st.integers(0, 2**16))
    return dname, layouts, shapes, steps, n_out, seed


def _inputs(dname, layouts, shapes, seed):
    rng = np.random.default_rng(seed)
    mdt, ndt = DTYPES[dname]
    xs, ns = [], []
    for lay, shp in zip(layouts, shapes):
        if dname == "int32":
            base = rng.integers(-50, 50, size=(4, 3) if lay == "transposed" else (6, 4) if lay == "sliced" else shp)
        else:
            base = rng.uniform(-2, 2, size=(4, 3) if lay == "transposed" else (6, 4) if lay == "sliced" else shp)
        base = np.asarray(base).astype(ndt)
        a = mx.array(base, dtype=mdt)
        if lay == "transposed":
            a, base = mx.transpose(a), base.T
        elif lay == "sliced":
            a, base = a[::2], base[::2]
        xs.append(a)
        ns.append(base)
    return xs, ns


def _program(steps, n_out, weak):
    def f(*xs):
        vals = list(xs)
        for s in steps:
            if s[0] == "unary":
                vals.append(s[1][1](vals[s[2]]))
            elif s[0] == "binary":
                vals.append(s[1][1](vals[s[2]], vals[s[3]]))
            else:
                vals.append(s[1][1](vals[s[2]], weak(s[3])))
        return tuple(vals[-n_out:])
    return f


def _numpy(steps, n_out, ns, ndt):
    vals = list(ns)
    with np.errstate(all="ignore"):
        for s in steps:
            if s[0] == "unary":
                r = s[1][2](vals[s[2]].astype(np.float32) if ndt == BF16 else vals[s[2]])
            elif s[0] == "binary":
                r = s[1][2](*(v.astype(np.float32) if ndt == BF16 else v for v in (vals[s[2]], vals[s[3]])))
            else:
                v = vals[s[2]]
                r = s[1][2](v.astype(np.float32) if ndt == BF16 else v, np.asarray(s[3]).astype(
                    np.float32 if ndt == BF16 else ndt))
            vals.append(_np_round(r, ndt))
    return vals[-n_out:]


def _np(a):
    """An mx array as numpy (bfloat16 through an exact cast to float32)."""
    return np.array(a.astype(mx.float32)) if a.dtype == mx.bfloat16 else np.array(a)


def _close(a, b, dname):
    a = np.asarray(a, dtype=np.float64) if dname != "int32" else np.asarray(a)
    b = np.asarray(b, dtype=np.float64) if dname != "int32" else np.asarray(b)
    assert a.shape == b.shape
    if dname == "int32":
        np.testing.assert_array_equal(a, b)
        return
    tol = TOL[dname]
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    fin = np.isfinite(a) & np.isfinite(b)
    np.testing.assert_array_equal(a[~fin & ~np.isnan(a)], b[~fin & ~np.isnan(a)])
    scale = np.maximum(1.0, np.maximum(np.abs(a[fin]), np.abs(b[fin])))
    assert np.all(np.abs(a[fin] - b[fin]) <= tol * scale), (a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_elementwise_dag_compiled_equals_uncompiled_equals_numpy(dag):
    dname, layouts, shapes, steps, n_out, seed = dag
    xs, ns = _inputs(dname, layouts, shapes, seed)
    f = _program(steps, n_out, lambda c: c)
    compiled = mx.compile(f)(*xs)
    plain = f(*xs)
    ref = _numpy(steps, n_out, ns, DTYPES[dname][1])
    for c, p, r in zip(compiled, plain, ref):
        assert c.dtype == p.dtype
        _close(_np(c), _np(p), dname)
        _close(_np(c), r, dname)


def test_compiled_int_overflow_wraps_like_numpy():
    x = mx.array(np.array([2**31 - 1, -(2**31), 7], dtype=np.int32))
    out = mx.compile(lambda a: (a + 1) * 3 - a)(x)
    with np.errstate(all="ignore"):
        xn = np.array([2**31 - 1, -(2**31), 7], dtype=np.int32)
        ref = (xn + np.int32(1)) * np.int32(3) - xn
    np.testing.assert_array_equal(np.array(out), ref)


def test_compiled_signed_zero_inf_nan_follow_numpy():
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e38, -1e-45], dtype=np.float32)
    x = mx.array(vals)
    out = mx.compile(lambda a: (mx.negative(a) * 2 + a * 1e38, mx.maximum(a, -0.0), mx.exp(a) * a))(x)
    with np.errstate(all="ignore"):
        ref = (np.negative(vals) * np.float32(2) + vals * np.float32(1e38),
               np.maximum(vals, np.float32(-0.0)), np.exp(vals) * vals)
    for o, r in zip(out, ref):
        o = np.array(o)
        np.testing.assert_array_equal(np.isnan(o), np.isnan(r))
        m = ~np.isnan(r)
        np.testing.assert_array_equal(o[m], r[m])
        np.testing.assert_array_equal(np.signbit(o[m]), np.signbit(r[m]))
