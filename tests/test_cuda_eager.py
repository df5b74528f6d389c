"""Eager elementwise ops on a GPU stream as one-op kernels (``kernels/cuda/eager.py``):
values against the CPU backend (bit for bit where the op is exactly rounded) and numpy
float64, over random shapes, broadcasts, strided views, dtypes (float16 and bfloat16 as
16-bit storage) and Python scalars taken as kernel parameters; the first call of each
kernel included (a new plan must read correct shapes and strides at once).

On a GPU the kernels launch (the ``eager_kernel_device`` dispatch path); over
``tests/fake_cupy.py`` (``test_cuda_backend_fake.py``) NVRTC is absent, so the same cases
check the fallback to the CuPy rules and the host scalars' plumbing.
"""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import needs_cuda

import tapescope.core as mx
from tapescope.core import evaluate
from tapescope.kernels import timeline

pytestmark = [needs_cuda, pytest.mark.usefixtures("gpu_default_device")]

BF16 = np.dtype(ml_dtypes.bfloat16)


def _fake() -> bool:
    import cupy

    return getattr(cupy, "__fake__", False)


# exactly rounded ops: the GPU's bits are the CPU's
EXACT_BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
                "divide": np.divide, "maximum": np.maximum, "minimum": np.minimum}
COMPARE = {"less": np.less, "greater_equal": np.greater_equal, "equal": np.equal}
UNARY = {"exp": np.exp, "sin": np.sin, "tanh": np.tanh, "sqrt": np.sqrt, "abs": np.abs,
         "negative": np.negative, "square": np.square}
DTYPES = ["float32", "float16", "bfloat16", "int32"]


def _host(x, dtype: str, rng) -> np.ndarray:
    v = rng.standard_normal(x) * 4
    if dtype == "int32":
        return np.rint(v).astype(np.int32)
    return v.astype(np.float32).astype(BF16 if dtype == "bfloat16" else np.dtype(dtype))


def _gpu_and_cpu(fn, *hosts, view=None):
    """``fn`` of the arrays on the GPU and on the CPU (each made there from the same host
    data, ``view`` applied to the first operand on both), evaluated; numpy results."""
    outs = []
    for dev in (mx.gpu, mx.cpu):
        with mx.stream(dev):
            arrs = [mx.array(h) for h in hosts]
            mx.eval(*arrs)
            if view is not None:
                arrs[0] = view(arrs[0])
            r = fn(*arrs)
            mx.eval(r)
            outs.append(_np(r))
    return outs


def _np(r) -> np.ndarray:
    """An array's values on the host (bfloat16 through its bits: no buffer format)."""
    if r.dtype == mx.bfloat16:
        return np.array(r.view(mx.uint16)).view(BF16)
    return np.array(r)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8 if a.dtype.itemsize == 1
                  else np.uint32 if a.dtype.itemsize == 4 else np.uint64)


def _same(gpu: np.ndarray, cpu: np.ndarray) -> None:
    assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape
    if gpu.dtype.kind == "f" or gpu.dtype == BF16:
        g, c = gpu.astype(np.float64), cpu.astype(np.float64)
        nan = np.isnan(c)
        assert np.array_equal(np.isnan(g), nan)
        assert np.array_equal(_bits(gpu)[~nan], _bits(cpu)[~nan])
    else:
        assert np.array_equal(gpu, cpu)


shapes = st.sampled_from([(), (1,), (7,), (16,), (33, 5), (4, 1, 6), (2, 3, 4, 5), (1025,)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(sorted(EXACT_BINARY)), dtype=st.sampled_from(DTYPES), shape=shapes,
       bcast=st.sampled_from(["none", "row", "col", "scalar_array", "python_scalar"]),
       seed=st.integers(0, 2**31 - 1))
def test_binary_ops_on_the_gpu_are_the_cpus_bits(op, dtype, shape, bcast, seed):
    if op == "divide" and dtype == "int32":
        dtype = "float32"
    rng = np.random.default_rng(seed)
    a = _host(shape, dtype, rng)
    fn = getattr(mx, op)
    if bcast == "python_scalar":
        s = float(np.float32(rng.standard_normal() * 3)) if dtype != "int32" else int(rng.integers(-9, 9))
        g, c = _gpu_and_cpu(lambda x: fn(x, s), a)
        gr, cr = _gpu_and_cpu(lambda x: fn(s, x), a)
        _same(gr, cr)
    else:
        bshape = {"none": shape, "row": shape[-1:], "col": shape[:-1] + (1,) if shape else (),
                  "scalar_array": ()}[bcast]
        b = _host(bshape, dtype, rng)
        g, c = _gpu_and_cpu(fn, a, b)
    _same(g, c)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(sorted(EXACT_BINARY)), dtype=st.sampled_from(DTYPES),
       view=st.sampled_from(["transpose", "step", "reverse", "slice"]), seed=st.integers(0, 2**31 - 1))
def test_binary_ops_on_strided_views_are_the_cpus_bits(op, dtype, view, seed):
    if op == "divide" and dtype == "int32":
        dtype = "float32"
    rng = np.random.default_rng(seed)
    a = _host((6, 10, 4), dtype, rng)
    views = {"transpose": lambda x: mx.transpose(x, (2, 0, 1)), "step": lambda x: x[:, ::3],
             "reverse": lambda x: x[::-1], "slice": lambda x: x[1:5, 2:9, 1:]}
    shape = np.empty((6, 10, 4))
    shape = {"transpose": shape.transpose(2, 0, 1), "step": shape[:, ::3], "reverse": shape[::-1],
             "slice": shape[1:5, 2:9, 1:]}[view].shape
    b = _host(shape[-1:], dtype, rng)
    g, c = _gpu_and_cpu(getattr(mx, op), a, b, view=views[view])
    _same(g, c)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(sorted(COMPARE)), dtype=st.sampled_from(DTYPES), shape=shapes,
       seed=st.integers(0, 2**31 - 1))
def test_comparisons_on_the_gpu_are_the_cpus(op, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    a, b = _host(shape, dtype, rng), _host(shape, dtype, rng)
    b.reshape(-1)[: b.size // 2] = a.reshape(-1)[: a.size // 2]  # some equal pairs
    g, c = _gpu_and_cpu(getattr(mx, op), a, b)
    assert g.dtype == np.bool_ and np.array_equal(g, c)
    assert np.array_equal(g, COMPARE[op](a.astype(np.float64), b.astype(np.float64)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(sorted(UNARY)), dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
       shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_unary_ops_on_the_gpu_match_float64(op, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    a = _host(shape, dtype, rng)
    if op == "sqrt":
        a = np.abs(a)
    g, c = _gpu_and_cpu(getattr(mx, op), a)
    ref = UNARY[op](a.astype(np.float64))
    tol = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    assert g.dtype == c.dtype and g.shape == ref.shape
    np.testing.assert_allclose(g.astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_eager_ops_on_column_major_operands_are_the_cpus_bits(dtype):
    """Transposed (column-major) operands, as a matmul gradient's transpose: each op's
    column-major result (the contiguous kernel in column order, on a GPU) is the CPU's bit
    for bit."""
    rng = np.random.default_rng(11)
    a, b = _host((7, 33), dtype, rng), _host((7, 33), dtype, rng)
    fns = [lambda x, y: x * y, lambda x, y: mx.square(x), lambda x, y: x * 0.375 + y,
           lambda x, y: mx.maximum(x, y).astype(mx.float32)]
    for fn in fns:
        outs = []
        for dev in (mx.gpu, mx.cpu):
            with mx.stream(dev):
                x, y = mx.array(a), mx.array(b)
                mx.eval(x, y)
                r = fn(x.T, y.T)
                mx.eval(r)
                outs.append(_np(r))
        _same(*outs)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_compiled_calls_host_scalars_are_taken_by_value_and_are_the_cpus_bits(dtype):
    """A compiled function's scalar array arguments (on a GPU a Python scalar's array stays
    on the host) are its kernel's parameters: every call, with a new value each time, is the
    CPU's bits; on a GPU the later calls launch from C (``fused_kernel_device``)."""
    rng = np.random.default_rng(12)
    a = _host((9, 17), dtype, rng)
    dt = getattr(mx, dtype)
    fn = mx.compile(lambda x, s, t: (x * s + t) * x)
    vals = [(0.3, -1.5), (-2.75, 1e-3), (7.0, 0.0)]
    outs = {}
    for dev in (mx.gpu, mx.cpu):
        with mx.stream(dev):
            x = mx.array(a)
            mx.eval(x)
            evaluate.reset_dispatch_counts()
            rs = []
            for s, t in vals:
                r = fn(x, mx.array(s, dtype=dt), mx.array(t, dtype=dt))
                mx.eval(r)
                rs.append(_np(r))
            outs[dev] = rs
            if dev == mx.gpu and not _fake():
                assert evaluate.dispatch_counts()["fused_kernel_device"] == len(vals)
    for g, c in zip(outs[mx.gpu], outs[mx.cpu]):
        _same(g, c)


CAST_DTYPES = ["float32", "float16", "bfloat16", "int32", "int8", "uint8", "bool"]
_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(1 << 26), 1 << 26)}


def _cast_source(shape, src: str, dst: str, rng) -> np.ndarray:
    """Values of ``src`` to cast to ``dst``: specials (zeros of both signs, infinities, NaN,
    float32 / float16 subnormals, bfloat16 ties) where both are floats, finite values in
    the target's range where it is an integer (outside it the conversion is undefined in C:
    CUDA saturates, the host does not), integers past float32's and float16's exact range."""
    if src == "bool":
        return rng.random(shape) < 0.5
    if src in _RANGE:
        lo, hi = _RANGE[src]
        if dst in _RANGE:
            lo, hi = max(lo, _RANGE[dst][0]), min(hi, _RANGE[dst][1])
        v = rng.integers(lo, hi + 1, shape).astype(src)
        if src == "int32" and v.size and dst not in _RANGE:
            v.reshape(-1)[:3] = [0x1008001, -70001, 0][: v.size]  # two roundings to bfloat16
        return v
    v = rng.standard_normal(shape) * 40
    if dst in _RANGE:
        lo, hi = _RANGE[dst]
        v = np.clip(v, lo, hi)
    elif v.size:
        special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 6e-8, 1 + 2 ** -8, 70000.0]
        flat = v.reshape(-1)
        k = min(flat.size, len(special))
        flat[:k] = rng.permutation(special)[:k]
    v = v.astype(np.float32)
    return v.astype(BF16) if src == "bfloat16" else v.astype(src)


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from(CAST_DTYPES), dst=st.sampled_from(CAST_DTYPES), shape=shapes,
       transpose=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_casts_on_the_gpu_are_the_cpus_bits(src, dst, shape, transpose, seed):
    """``astype`` between bfloat16, float16, float32, integers and bool, of a row-major or
    transposed array: the GPU's bits are the CPU's (one rounding to nearest even into a
    16-bit float, a float to bool by value: a subnormal is true, NaN is true); on a GPU each
    cast is its one-op kernel launched by the eval loop (``eager_kernel_device``)."""
    rng = np.random.default_rng(seed)
    a = _cast_source(shape, src, dst, rng)
    want = mx.bfloat16 if dst == "bfloat16" else getattr(mx, dst if dst != "bool" else "bool_")
    view = (lambda x: x.T) if transpose else None
    evaluate.reset_dispatch_counts()
    g, c = _gpu_and_cpu(lambda x: x.astype(want), a, view=view)
    _same(g, c)
    counts = evaluate.dispatch_counts()
    if not _fake() and src != dst and a.size:
        assert counts["eager_kernel_device"] >= 1, counts


def test_where_with_broadcast_and_a_python_scalar_is_the_cpus():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 8)).astype(np.float32)
    m = rng.standard_normal((8,)) > 0
    g, c = _gpu_and_cpu(lambda x, k: mx.where(k, x, 2.5), a, m)
    _same(g, c)
    assert np.array_equal(g, np.where(m, a, np.float32(2.5)))


def test_the_chain_of_the_benchmark_is_numpys_and_runs_as_kernels():
    """``v * 1.0001 + 0.5`` x25 in float32: each op rounded as numpy float32 rounds it;
    on a GPU every op is a one-op kernel (no CuPy rule), the scalars taken as values."""
    v0 = np.linspace(-1, 1, 1 << 14, dtype=np.float32)
    v = mx.array(v0)
    mx.eval(v)
    evaluate.reset_dispatch_counts()
    for _ in range(25):
        v = v * 1.0001 + 0.5
    mx.eval(v)
    ref = v0
    for _ in range(25):
        ref = ref * np.float32(1.0001) + np.float32(0.5)
    assert np.array_equal(np.array(v), ref)
    counts = evaluate.dispatch_counts()
    if not _fake():
        assert counts["eager_kernel_device"] == 50, counts
        assert counts["rule_out"] == counts["rule"] == 0, counts


def test_a_planned_eager_op_is_found_by_the_loop_in_c_without_plan_for(monkeypatch):
    """An eager op's second call with the same layouts (any scalar values) takes the plan
    its first call made (``eager.plans``) in the loop's C part: ``plan_for`` is not called;
    the values are numpy's; switching the one-op kernels off drops the plans."""
    from tapescope.kernels import backends as bk
    from tapescope.kernels.cuda import eager

    c_launch = not _fake() and bk.backend("gpu").device_api is not None
    x0 = np.linspace(-2, 2, 77, dtype=np.float32)
    x = mx.array(x0)
    mx.eval(mx.exp(x * 1.5 + x), mx.maximum(x, 0.25))
    called = []
    real = eager.plan_for
    monkeypatch.setattr(eager, "plan_for", lambda *a: called.append(a[0].name) or real(*a))
    evaluate.reset_dispatch_counts()
    y, z = mx.exp(x * -0.75 + x), mx.maximum(x, -3.0)  # other scalar values, same layouts
    mx.eval(y, z)
    if c_launch:  # no NVRTC over the stand-in CuPy: the rules ran, the values are checked
        assert called == [], called
        assert evaluate.dispatch_counts()["eager_kernel_device"] == 4
        assert eager.plans
    np.testing.assert_allclose(np.array(y), np.exp((x0 * np.float32(-0.75) + x0).astype(np.float64)),
                               rtol=2e-6)
    assert np.array_equal(np.array(z), np.maximum(x0, np.float32(-3.0)))
    with tapescope_settings(eager_kernels=False):
        assert not eager.plans
        w = x * 2.0
        mx.eval(w)
        assert np.array_equal(np.array(w), x0 * 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_an_eager_op_of_a_transposed_array_is_a_column_order_kernel_launched_from_c(dtype, monkeypatch):
    """An op of column-contiguous operands (a matmul's transposed gradient, an Adam update of
    it) writes its output in column order, as MLX's copies the operands' strides: the one-op
    kernel writes into a column-order buffer (a fresh one, or the dying operand's), found in
    the loop's plans from the second call on, and the values are the CPU's bits."""
    from tapescope.kernels import backends as bk
    from tapescope.kernels.cuda import eager

    rng = np.random.default_rng(3)
    x0, y0 = _host((33, 70), dtype, rng), _host((33, 70), dtype, rng)

    def fn(x, y):
        t = mx.transpose(x)
        return mx.sqrt(mx.square(t * 0.9 + 0.1)) - mx.transpose(y) * 2.0

    g, c = _gpu_and_cpu(fn, x0, y0)
    _same(g, c)
    c_launch = not _fake() and bk.backend("gpu").device_api is not None
    called = []
    real = eager.plan_for
    monkeypatch.setattr(eager, "plan_for", lambda *a: called.append(a[0].name) or real(*a))
    evaluate.reset_dispatch_counts()
    g2, _ = _gpu_and_cpu(fn, x0, y0)
    _same(g2, c)
    if c_launch:
        assert called == [], called
        assert evaluate.dispatch_counts()["eager_kernel_device"] == 6


def test_a_device_view_that_never_copies_runs_in_the_loops_c_part(monkeypatch):
    """A transpose, broadcast, size-1 axes added or dropped (a reduction without keepdims'
    Squeeze) of a device array (a definition with ``view_strides``) is the array module's
    view in the input's buffer, run by the loop's C part (no Python node): the values are
    numpy's, the buffer stays alive while the view does."""
    x0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = mx.array(x0) * 1.0
    mx.eval(a)
    ran = []
    real = evaluate._run
    monkeypatch.setattr(evaluate, "_run", lambda node, prim, be, fn=None: (
        ran.append(prim.name), real(node, prim, be, fn))[1])
    t, b = mx.transpose(a), mx.broadcast_to(a, (2, 3, 4))
    e = mx.expand_dims(t, (0, 2))  # of a transposed (strided) view
    q = mx.squeeze(e)
    s = mx.sum(a, axis=1)  # Sum (keepdims) and its Squeeze
    mx.eval(t, b, e, q, s)
    assert not {"Transpose", "Broadcast", "ExpandDims", "Squeeze"} & set(ran), ran
    del a
    assert np.array_equal(np.array(t), x0.T) and np.array_equal(np.array(b), np.broadcast_to(x0, (2, 3, 4)))
    assert np.array_equal(np.array(e), x0.T[None, :, None]) and np.array_equal(np.array(q), x0.T)
    assert np.array_equal(np.array(s), x0.sum(axis=1))
    assert np.array_equal(np.array(t * 2.0), x0.T * 2)


def tapescope_settings(**kw):
    import tapescope

    return tapescope.settings(**kw)


def test_a_python_scalar_on_the_gpu_stays_on_the_host_and_is_not_uploaded():
    import cupy

    s = mx.array(1.5)
    assert type(s._d.data) is np.ndarray  # no device copy, no upload
    x = mx.array(np.arange(4, dtype=np.float32))
    y = x * s
    mx.eval(y)
    assert isinstance(y._d.data, cupy.ndarray)
    assert np.array_equal(np.array(y), np.arange(4, dtype=np.float32) * 1.5)
    assert s.item() == 1.5 and np.array(s + 1).item() == 2.5


def test_an_op_without_a_kernel_falls_back_to_the_cupy_rule_visibly():
    """An op the CUDA dialect cannot spell on these types (complex) runs its CuPy rule, and
    the timeline says why (``kernel_fallback``)."""
    a = mx.array(np.array([1 + 2j, 3 - 1j], dtype=np.complex64))
    mx.eval(a)
    with timeline.record() as rec:
        b = a * a
        mx.eval(b)
    assert np.allclose(np.array(b), np.array([1 + 2j, 3 - 1j]) ** 2)
    assert any(r.kind == "kernel_fallback" for r in rec.records), [r.kind for r in rec.records]


def test_a_device_scalar_and_an_array_operand_get_kernels_of_their_own():
    """A device 0-d operand (a kernel's result) is read through its pointer, an array
    operand element by element: the same op and dtypes with each must not share a kernel
    (``isclose``'s ``rtol * abs(b)`` then ``abs(a - b)`` once gave wrong answers)."""
    x = np.array([1.0, -2.0, 3.5, 4.0], np.float32)
    h = mx.array(np.float32(-3.0))
    d0 = mx.abs(h)  # a device 0-d: a kernel's result
    mx.eval(d0)
    r0 = mx.multiply(mx.array(2.0), d0)
    r1 = mx.multiply(mx.array(2.0), mx.array(x))
    r2 = mx.multiply(mx.array(x), d0)
    mx.eval(r0, r1, r2)
    assert np.array(r0).item() == 6.0
    assert np.array_equal(np.array(r1), 2 * x) and np.array_equal(np.array(r2), 3 * x)
    a = np.array([np.nan, -np.inf, np.inf, 1.000001], np.float32)
    b = np.float32(1.000001)
    assert np.array_equal(np.array(mx.isclose(mx.array(a), mx.array(b))), np.isclose(a, b))


def test_a_launch_packs_shape_strides_and_scalars_as_the_kernels_parameters(monkeypatch):
    """The plan's argument words are the rendered kernel's parameters, in order: pointers,
    the strides and shape of a static variant by value (int64 / int32 arrays), a by-value
    scalar's bits; one pointer per parameter. (What a launch reads is all in its
    parameters: no device array of shapes that a copy must have written first.)"""
    import re
    import types

    from tapescope.kernels.codegen.layout import Layout, plan
    from tapescope.kernels.cuda import compiled
    from tapescope.kernels.cuda.bfloat16 import elementwise_tape

    tape = elementwise_tape("Add", [np.float32, np.float32, np.float32], np.float32,
                            [False, False, True], by_value=(False, False, True))
    a = Layout((3, 5, 4), np.float32, (40, 4, 1))  # a sliced array: strided
    b = Layout((4,), np.float32)
    shape = (3, 5, 4)
    contiguous, cshape, strides, large = plan(tape, [a, b, Layout((), np.float32)], shape)
    assert not contiguous
    src = compiled._dialect().render(tape, "k", contiguous, len(cshape), large)
    params = re.search(r"k\(\n(.*?)\) \{", src, re.S).group(1).split(",\n")
    entry = types.SimpleNamespace(fn=types.SimpleNamespace(ptr=1))  # no kernel: not launched
    monkeypatch.setattr(compiled, "_block_size", lambda fn, limit: limit)  # (asks the driver)
    ln = compiled.Launch(tape, [a, b, Layout((), np.float32)], shape, entry, contiguous,
                         cshape, strides, large, "k", "strided")
    assert len(ln.offsets) == len(params)
    words = np.array(ln.packed, dtype=np.uint64)

    def arg(k, n_words, dt):
        o = ln.offsets[k]
        return np.frombuffer(words[o:o + n_words].tobytes(), dtype=dt)

    nd = len(cshape)
    assert "ts_arr<int64_t, %d> A_strides" % nd in params[1]
    assert list(arg(1, nd, np.int64)) == list(strides[0])
    assert "ts_arr<int64_t, %d> B_strides" % nd in params[3]
    assert list(arg(3, nd, np.int64)) == list(strides[1])
    assert params[4].strip() == "const float C" and ln.values == ((2, ln.offsets[4], 4),)
    assert "ts_arr<int32_t, %d> shape" % nd in params[6]
    assert list(arg(6, (nd + 1) // 2, np.int32)[:nd]) == list(cshape)
    assert compiled.value_bits(np.float32(1.5)) == 0x3FC00000
    assert compiled.value_bits(np.array([7, 7], np.int8)[:1].repeat(1)) == 7
