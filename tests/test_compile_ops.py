"""Compiled C spellings of the ops with involved MLX semantics: compiled == uncompiled == numpy.

Per dtype, one compiled function applies every op that dtype supports to the same inputs
and joins the results (``r == r`` or-ed together), so the whole set fuses into one tape with
every op's result as an output, and one C kernel per layout is built. The numpy references
below are written out here (MLX's semantics: integer division and remainder by zero,
``INT_MIN // -1``, shifts past the width as on MLX's x86 CPU, negative integer powers, the
sign of NaN, round half to even; float16 computed step by step in float16, bfloat16 in
float32 and rounded once). Exact for integers, bools and exactly rounded float ops; within
4 ulp for the transcendental ones, with NaN / ±inf / signed zeros as numpy.
"""

from __future__ import annotations

import math
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapescope
import tapescope.core as mx
from tapescope.core.fusion import tapes

from conftest import sweep

BF16 = np.dtype(ml_dtypes.bfloat16)
INTS = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
ALL = ["bool_"] + INTS + FLOATS


def npdt(name: str) -> np.dtype:
    """The numpy dtype of a dtype name."""
    return BF16 if name == "bfloat16" else np.dtype(name.rstrip("_"))


def wrap(v: int, dt: np.dtype) -> int:
    """``v`` wrapped into integer dtype ``dt`` (two's complement)."""
    bits = dt.itemsize * 8
    v &= (1 << bits) - 1
    return v - (1 << bits) if dt.kind == "i" and v >= 1 << (bits - 1) else v


def per_int(fn):
    """An integer reference computed element by element on Python ints, wrapped to the dtype."""
    def ref(a, b):
        dt = a.dtype
        out = [wrap(fn(int(x), int(y), dt), dt) for x, y in zip(a.ravel(), b.ravel())]
        return np.array(out, dtype=object).astype(dt).reshape(a.shape)

    return ref


def _shift(x: int, c: int, dt: np.dtype, left: bool) -> int:
    c &= 31 if dt.itemsize < 4 else dt.itemsize * 8 - 1  # MLX's x86 CPU: count modulo max(32, bits)
    return x << c if left else x >> c


def in_float(fn):
    """A float reference: float16 computed in float16 by numpy, bfloat16 in float32 and rounded."""
    def ref(*args):
        dt = args[0].dtype
        wide = [a.astype(np.float32) for a in args] if dt == BF16 else list(args)
        with np.errstate(all="ignore"):
            return np.asarray(fn(*wide)).astype(dt)

    return ref


def _fl_remainder(a, b):
    r = np.fmod(a, b)
    return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def _sign(a):
    return (a > 0).astype(a.dtype) - (a < 0).astype(a.dtype)


# op -> (mx function, arity, {kind: reference}, exact for floats)
# kinds: "b" bool, "i" integers, "f" floats; a missing kind means the op does not take it
OPS = {
    "ceil": (mx.ceil, 1, {"b": lambda a: a, "i": lambda a: a, "f": in_float(np.ceil)}, True),
    "floor": (mx.floor, 1, {"b": lambda a: a, "i": lambda a: a, "f": in_float(np.floor)}, True),
    "round": (mx.round, 1, {"b": lambda a: a, "i": lambda a: a, "f": in_float(np.rint)}, True),
    "sign": (mx.sign, 1, {"b": lambda a: a, "i": _sign, "f": in_float(_sign)}, True),
    "stop_gradient": (mx.stop_gradient, 1, {k: (lambda a: a) for k in "bif"}, True),
    "bitwise_invert": (mx.bitwise_invert, 1, {"b": np.logical_not, "i": np.invert}, True),
    "rsqrt": (mx.rsqrt, 1, {"f": in_float(lambda a: 1 / np.sqrt(a))}, True),
    "sigmoid": (mx.sigmoid, 1, {"f": in_float(lambda a: 1 / (1 + np.exp(-a)))}, False),
    "bitwise_and": (mx.bitwise_and, 2, {"b": np.logical_and, "i": np.bitwise_and}, True),
    "bitwise_or": (mx.bitwise_or, 2, {"b": np.logical_or, "i": np.bitwise_or}, True),
    "bitwise_xor": (mx.bitwise_xor, 2, {"b": np.logical_xor, "i": np.bitwise_xor}, True),
    "floor_divide": (mx.floor_divide, 2, {
        "b": np.logical_and,
        "i": per_int(lambda x, y, dt: 0 if y == 0 else x // y),
        "f": in_float(lambda a, b: np.floor(a / b))}, True),
    "remainder": (mx.remainder, 2, {
        "b": lambda a, b: a & ~b,
        "i": per_int(lambda x, y, dt: x if y == 0 else x % y),
        "f": in_float(_fl_remainder)}, True),
    "power": (mx.power, 2, {
        "b": lambda a, b: a | ~b,
        "i": per_int(lambda x, y, dt: 0 if y < 0 else pow(x, y, 1 << (dt.itemsize * 8))),
        "f": in_float(np.power)}, False),
    "left_shift": (mx.left_shift, 2, {"i": per_int(lambda x, y, dt: _shift(x, y, dt, True))}, True),
    "right_shift": (mx.right_shift, 2, {"i": per_int(lambda x, y, dt: _shift(x, y, dt, False))}, True),
    "arctan2": (mx.arctan2, 2, {"f": in_float(np.arctan2)}, False),
    "logaddexp": (mx.logaddexp, 2, {"f": in_float(np.logaddexp)}, False),
}


def kind(name: str) -> str:
    return "b" if name == "bool_" else ("f" if name in FLOATS else "i")


def ops_for(name: str) -> list:
    return [op for op, (_, _, refs, _) in OPS.items() if kind(name) in refs]


def program(name: str):
    """Every op of dtype ``name`` on (x, y), plus the join that makes them one fused tape."""
    names = ops_for(name)

    def fn(x, y):
        outs = [OPS[op][0](*((x,) if OPS[op][1] == 1 else (x, y))) for op in names]
        level = [mx.equal(r, r) for r in outs]
        while len(level) > 1:  # a balanced tree keeps the tape within the depth limit
            level = [mx.logical_or(*level[i:i + 2]) if i + 1 < len(level) else level[i]
                     for i in range(0, len(level), 2)]
        return (*outs, level[0])

    return names, fn


# -- values ----------------------------------------------------------------------------------

def edges(name: str) -> list:
    """Edge values of a dtype: zeros, ±1, int min/max, shift counts around the widths, ±inf, NaN."""
    dt = npdt(name)
    if name == "bool_":
        return [False, True]
    if dt.kind in "iu":
        info = np.iinfo(dt)
        bits = dt.itemsize * 8
        vals = [0, 1, 2, 3, -1, -2, -3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100,
                bits - 1, bits, bits + 1, info.min, info.min + 1, info.max, info.max - 1]
        return sorted({int(e) for e in vals if info.min <= e <= info.max})
    return [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -3.0, np.inf, -np.inf, np.nan,
            1e-3, 7.0, -7.0, 100.0, 6e4, 1e30]


def elements(name: str):
    dt = npdt(name)
    if name == "bool_":
        return st.booleans()
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return st.one_of(st.sampled_from(edges(name)), st.integers(-40, 40).filter(
            lambda v: info.min <= v <= info.max), st.integers(int(info.min), int(info.max)))
    width = 64 if name == "float64" else 32  # float16 values are rounded from float32
    return st.one_of(st.sampled_from(edges(name)), st.floats(-8, 8, width=width),
                     st.floats(width=width, allow_nan=True, allow_infinity=True))


@st.composite
def operands(draw, name: str):
    rows, cols = draw(st.integers(2, 6)), draw(st.integers(2, 6))
    el = elements(name)
    dt = npdt(name)
    vals = [draw(st.lists(el, min_size=rows * cols, max_size=rows * cols)) for _ in range(2)]
    if dt.kind in "iu":
        return tuple(np.array(v, dtype=object).astype(dt).reshape(rows, cols) for v in vals)
    with np.errstate(over="ignore"):  # large float32 values become float16 infinities
        return tuple(np.array(v).astype(np.float64 if name == "float64" else np.float32)
                     .astype(dt).reshape(rows, cols) for v in vals)


# -- comparison ------------------------------------------------------------------------------

def ulp(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    """One unit in the last place of |v| in dtype ``dt`` (float64 values)."""
    v = np.minimum(np.abs(v), float(ml_dtypes.finfo(dt).max))
    with np.errstate(over="ignore"):  # the spacing above the largest finite value
        if dt == BF16:
            return np.spacing(v.astype(np.float32)).astype(np.float64) * 65536.0
        return np.spacing(v.astype(dt)).astype(np.float64)


def check(got: np.ndarray, want: np.ndarray, exact: bool, what: str) -> None:
    """Exact for integers, bools and exact ops (signed zeros included); else within 4 ulp."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
    dt = want.dtype
    if dt.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=what)
    m = ~np.isnan(w)
    g, w = g[m], w[m]
    np.testing.assert_array_equal(np.isinf(g), np.isinf(w), err_msg=what)
    np.testing.assert_array_equal(np.signbit(g[w == 0]), np.signbit(w[w == 0]), err_msg=what)
    if exact:
        np.testing.assert_array_equal(g, w, err_msg=what)
    else:
        f = np.isfinite(w)
        err = np.abs(g[f] - w[f]) / ulp(w[f], dt)
        assert err.size == 0 or err.max() <= 4.0, (what, err.max())


def to_mx(v: np.ndarray) -> mx.array:
    """A numpy array as a tapescope array of the same dtype (float64 stays float64)."""
    return mx.array(v, dtype=mx.float64) if v.dtype == np.float64 else mx.array(v)


def as_np(a: mx.array) -> np.ndarray:
    return np.array(a)


def built_variants(fn) -> dict:
    """variant suffix -> runtime of the kernels of ``fn``'s one fused tape."""
    (lib,) = {t.lib_name for p in fn.programs() for t in tapes(p)}  # every trace: one tape
    return {e["name"][len(lib) + 1:]: e["runtime"] for e in tapescope.kernel_cache()
            if e["name"].startswith(lib + "_")}


_COMPILED: dict = {}


def run_and_check(name: str, x: np.ndarray, y: np.ndarray) -> None:
    """The compiled program on (x, y) and on a transposed x against the eager run and numpy."""
    names, fn = program(name)
    if name not in _COMPILED:
        _COMPILED[name] = mx.compile(fn)
    cfn = _COMPILED[name]
    xt = to_mx(np.ascontiguousarray(x.T)).T  # the same values through a strided view
    mx.eval(xt)
    for layout, xa, variant in (("contiguous", to_mx(x), "contiguous"),
                                ("transposed", xt, "strided_2")):
        got = cfn(xa, to_mx(y))
        eager = fn(xa, to_mx(y))
        mx.eval(*got, *eager)
        assert built_variants(cfn).get(variant) == "cpu", (name, layout, built_variants(cfn))
        for op, g, u in zip(names, got, eager):
            _, arity, refs, exact = OPS[op]
            args = (x,) if arity == 1 else (x, y)
            with np.errstate(all="ignore"):
                want = np.asarray(refs[kind(name)](*args)).astype(npdt(name))
            what = f"{op} {name} {layout}"
            g, u = (as_np(v.astype(mx.float32) if v.dtype == mx.bfloat16 else v) for v in (g, u))
            if name == "bfloat16":
                g, u = g.astype(BF16), u.astype(BF16)
            check(g, u, exact, what + " compiled vs uncompiled")
            check(g, want, exact, what + " compiled vs numpy")


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=sweep(30, 12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compiled_equals_uncompiled_equals_numpy(name, data):
    x, y = data.draw(operands(name))
    run_and_check(name, x, y)


@pytest.mark.parametrize("name", ALL)
def test_every_pair_of_edge_values(name):
    """Every (x, y) pair of edge values: INT_MIN // -1, x % 0, shifts past the width,
    negative powers, inf - inf in logaddexp, NaN signs, ..."""
    e = edges(name)
    with np.errstate(over="ignore"):
        v = np.array(e, dtype=object if name not in FLOATS else None).astype(
            npdt(name) if name not in FLOATS else (np.float64 if name == "float64" else np.float32))
        v = v.astype(npdt(name))
    x, y = np.meshgrid(v, v, indexing="ij")
    run_and_check(name, np.ascontiguousarray(x), np.ascontiguousarray(y))


@pytest.mark.parametrize("name", FLOATS)
@settings(max_examples=sweep(30, 12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_nan_equal_compiled(name, data):
    """``array_equal(..., equal_nan=True)`` fuses its NaNEqual with the op before it."""
    x, y = data.draw(operands(name))
    same = data.draw(st.lists(st.booleans(), min_size=x.size, max_size=x.size))
    y = np.where(np.array(same).reshape(x.shape), x, y)
    fn = mx.compile(lambda a, b: mx.array_equal(mx.maximum(a, a), b, equal_nan=True))
    for xa in (to_mx(x), to_mx(np.ascontiguousarray(x.T)).T):
        got = fn(xa, to_mx(y)).item()
        assert got == mx.array_equal(mx.maximum(xa, xa), to_mx(y), equal_nan=True).item()
        assert got == bool(np.array_equal(x.astype(np.float64), y.astype(np.float64), equal_nan=True))
    runtimes = {e["runtime"] for e in tapescope.kernel_cache() if "NaNEqual" in e["name"]}
    assert runtimes == {"cpu"}


def test_every_spelled_op_is_covered():
    """The ops this file tests are all spelled in C (none is left to the numpy fallback)."""
    from tapescope.kernels.codegen.render import C_OPS

    prims = {"ceil": "Ceil", "floor": "Floor", "round": "Round", "sign": "Sign",
             "stop_gradient": "StopGradient", "bitwise_invert": "BitwiseInvert", "rsqrt": "Rsqrt",
             "sigmoid": "Sigmoid", "bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr",
             "bitwise_xor": "BitwiseXor", "floor_divide": "FloorDivide", "remainder": "Remainder",
             "power": "Power", "left_shift": "LeftShift", "right_shift": "RightShift",
             "arctan2": "ArcTan2", "logaddexp": "LogAddExp"}
    assert set(prims) == set(OPS)
    assert all(p in C_OPS for p in prims.values()) and "NaNEqual" in C_OPS


def test_op_without_c_spelling_is_a_fusion_boundary_and_the_rest_runs_in_c():
    """ErfInv has no C spelling: fusion stops at it (the boundary says why), the chains before
    and after it become two C kernels, and nothing falls back to numpy."""
    x = np.array([0.1, -0.2, 0.4], np.float32)

    def f(a):
        y = mx.sin(a) * 2.0 + 0.25
        return mx.exp(mx.erfinv(y * 0.5)) * 3.0 - 1.0

    with tapescope.record() as rec:
        out = mx.compile(f)(to_mx(x))
        mx.eval(out)
    y = (np.sin(x.astype(np.float64)) * 2.0 + 0.25) * 0.5
    z = np.log((np.array(out).astype(np.float64) + 1.0) / 3.0)  # erfinv(y), inverted by erf
    np.testing.assert_allclose([math.erf(v) for v in z], y, rtol=1e-5, atol=1e-6)
    assert not [r for r in rec.records if r.kind == "kernel_fallback"]
    g = tapescope.trace(f, to_mx(x))
    assert [op.primitive for op in g.ops] == ["Compiled", "ErfInv", "Compiled"]
    assert len(g.kernels) == 2
    (edge,) = [i for i in g.kernels[1].inputs if i.producer == "ErfInv"]
    assert edge.reason == "no C spelling for ErfInv"
    assert all("ErfInv" not in src for k in g.kernels for src in k.sources.values())
    dot = g.to_dot()
    assert "no C spelling for ErfInv" in dot
