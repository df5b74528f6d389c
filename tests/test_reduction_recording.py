"""A reduction's recording in C (core/_reduce.c) against its Python reference
(ops/reduction.py ``_reduce_py`` / ``_arg_reduce_py``): the same graph (primitives, their
parameters, every node's output shapes and dtypes) and the same errors for every argument,
values against numpy in float64, shapes / dtypes / errors against MLX; and a device's
reshape views made in C (Squeeze, Flatten, Reshape of a contiguous input) over the
stand-in CUDA stack against numpy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from tapescope.core.ops import reduction as red

from conftest import mlx_ref, requires_mlx

SETTINGS = settings(max_examples=60, deadline=None)
REDUCE = {"sum": "Sum", "prod": "Prod", "max": "Max", "min": "Min", "all": "And", "any": "Or",
          "logsumexp": "LogSumExp"}  # (the op, the primitive it records)
DTYPES = ["bool_", "uint8", "int8", "int16", "int32", "uint32", "float16", "float32",
          "bfloat16", "complex64"]

in_c = pytest.mark.skipif(red._reduce is red._reduce_py, reason="core/_reduce.c not built")


def graph(out) -> list:
    """Every node the result recorded, outputs first: (primitive, parameters, output shapes
    and dtypes, input shapes)."""
    rows, stack, seen = [], [out._d], set()
    while stack:
        d = stack.pop()
        node = d.node
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        kw = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in node.primitive.kw.items()}
        rows.append((node.primitive.name, list(kw.items()), (d.shape, d.dtype.name),
                     [i.shape for i in node.inputs]))
        stack.extend(node.inputs)
    return rows


def recorded(fn):
    """(graph, None) of ``fn()``'s result, or (None, (type, message)) of its error."""
    try:
        return graph(fn()), None
    except Exception as e:  # noqa: BLE001 (the error itself is compared)
        return None, (type(e), str(e))


axis_values = st.one_of(st.none(), st.integers(-5, 4), st.booleans(), st.floats(-1, 1),
                        st.lists(st.integers(-4, 3), max_size=3),
                        st.tuples(st.integers(-3, 2)), st.just("x"))


@st.composite
def cases(draw):
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    dtype = draw(st.sampled_from(DTYPES))
    keepdims = draw(st.sampled_from([False, True, 0, 1]))
    return shape, dtype, draw(axis_values), keepdims


def _input(shape, dtype):
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    return mx.array(x).astype(getattr(mx, dtype))


@in_c
@SETTINGS
@given(cases(), st.sampled_from(sorted(REDUCE)))
def test_reduce_records_what_the_python_reference_records(case, fname):
    shape, dtype, axis, keepdims = case
    a = _input(shape, dtype)
    name = REDUCE[fname]
    if fname == "logsumexp":
        got = recorded(lambda: red._last_reduce(name, a, axis, keepdims, None))
        want = recorded(lambda: red._last_reduce_py(name, a, axis, keepdims, None))
    else:
        got = recorded(lambda: red._reduce(name, fname, a, axis, keepdims, None))
        want = recorded(lambda: red._reduce_py(name, fname, a, axis, keepdims, None))
    assert got == want


@in_c
@SETTINGS
@given(cases(), st.sampled_from(["argmax", "argmin"]))
def test_arg_reduce_records_what_the_python_reference_records(case, fname):
    shape, dtype, axis, keepdims = case
    a = _input(shape, dtype)
    got = recorded(lambda: red._arg_reduce(fname, a, axis, keepdims, None))
    want = recorded(lambda: red._arg_reduce_py(fname, a, axis, keepdims, None))
    assert got == want


@in_c
@SETTINGS
@given(cases(), st.sampled_from([False, True, 0, 1, None]))
def test_softmax_records_what_the_python_reference_records(case, precise):
    """core/_reduce.c's softmax: the same node (Softmax, precise, the input's shape and
    dtype) or the same error as ``_softmax_py`` for every axis, dtype and shape."""
    shape, dtype, axis, _ = case
    a = _input(shape, dtype)
    got = recorded(lambda: red._softmax(a, axis, precise, None))
    want = recorded(lambda: red._softmax_py(a, axis, precise, None))
    assert got == want


@in_c
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32", "bool_"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 1, 5), (1, 1)])
def test_softmax_common_cases_record_what_the_python_reference_records(shape, dtype):
    a = _input(shape, dtype)
    for axis in (-1, len(shape) - 1, 0):
        for precise in (False, True):
            got = recorded(lambda: red._softmax(a, axis, precise, None))
            assert got == recorded(lambda: red._softmax_py(a, axis, precise, None)), (axis, precise)


@in_c
def test_the_c_recording_takes_the_common_cases():
    """The common cases are C's (no Python frame of the reference runs), the others the
    reference's: the C's declines call it."""
    calls = []
    py, arg_py, last_py, soft_py = (red._reduce_py, red._arg_reduce_py, red._last_reduce_py,
                                    red._softmax_py)
    from tapescope.core import _call

    def spy(f, tag=None):
        def g(*args):
            calls.append(tag or args[0])
            return f(*args)
        return g

    a = _input((3, 4), "float32")
    try:
        _call.configure_reduce({**red._reduce_config, "reduce_py": spy(py),
                                "arg_reduce_py": spy(arg_py), "last_reduce_py": spy(last_py),
                                "softmax_py": spy(soft_py, "softmax")})
        mx.sum(a, -1), mx.max(a, axis=0, keepdims=True), mx.sum(a), mx.argmax(a, 1)
        mx.logsumexp(a, -1), mx.mean(a, -1), mx.all(a, 1)
        mx.softmax(a, -1), mx.softmax(a, axis=1, precise=True)
        assert calls == []
        for f, first in [(lambda: mx.sum(a, [0, 1]), "Sum"), (lambda: mx.argmax(a), "argmax"),
                         (lambda: mx.logsumexp(a, 0), "LogSumExp"),
                         (lambda: mx.softmax(a, 0), "softmax"),
                         (lambda: mx.softmax(a.astype(mx.int8), -1), "softmax"),
                         (lambda: mx.sum(a.astype(mx.int8), 0), "Sum")]:
            del calls[:]
            f()
            assert calls[:1] == [first]
    finally:
        _call.configure_reduce(red._reduce_config)


@SETTINGS
@given(cases(), st.sampled_from(["softmax", "mean", "logsumexp", "sum", "argmax"]),
       st.booleans())
def test_an_int_axis_records_what_its_list_records(case, fname, precise):
    """softmax / mean / logsumexp / sum / argmax over an int axis (their common cases) record
    the graph that the same axis given as a one-element list records (the general path)."""
    shape, dtype, axis, keepdims = case
    if not isinstance(axis, int) or isinstance(axis, bool):
        axis = -1
    a = _input(shape, dtype)
    if fname == "softmax":
        call = lambda ax: mx.softmax(a, ax, precise=precise)  # noqa: E731
    elif fname == "argmax":  # (its general path: axis as an __index__ object)
        call = lambda ax: mx.argmax(a, ax if ax == axis else np.int64(axis), bool(keepdims))  # noqa: E731
    else:
        call = lambda ax: getattr(mx, fname)(a, ax, bool(keepdims))  # noqa: E731
    assert recorded(lambda: call(axis)) == recorded(lambda: call([axis] if fname != "argmax" else None))


def _ref(fname, x, axis, keepdims):
    x64 = x.astype(np.float64)
    if fname == "softmax":
        e = np.exp(x64 - np.max(x64, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)
    if fname == "logsumexp":
        m = np.max(x64, axis=axis, keepdims=True)
        out = np.log(np.sum(np.exp(x64 - m), axis=axis, keepdims=True)) + m
        return out if keepdims else np.squeeze(out, axis=axis)
    return getattr(np, fname)(x64, axis=axis, keepdims=keepdims)


@SETTINGS
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.data(), st.booleans(),
       st.sampled_from(["sum", "prod", "max", "min", "mean", "logsumexp", "argmax", "argmin",
                        "softmax"]))
def test_values_match_numpy_float64(shape, data, keepdims, fname):
    nd = len(shape)
    last = fname in ("logsumexp", "softmax")
    axis = data.draw(st.one_of(st.integers(-nd, nd - 1), st.none()) if not last
                     else st.sampled_from([-1, nd - 1]))
    x = np.random.default_rng(sum(shape)).uniform(-2, 2, shape).astype(np.float32)
    got = (mx.softmax(mx.array(x), axis=axis) if fname == "softmax"
           else getattr(mx, fname)(mx.array(x), axis=axis, keepdims=keepdims))
    want = _ref(fname, x, axis, keepdims)
    assert got.shape == np.shape(want)
    if fname.startswith("arg"):
        assert got.dtype == mx.uint32
        np.testing.assert_array_equal(np.array(got), want)
    else:
        assert got.dtype == mx.float32
        np.testing.assert_allclose(np.array(got), want, rtol=2e-6, atol=2e-6)


@requires_mlx
@SETTINGS
@given(cases(), st.sampled_from(sorted(REDUCE) + ["argmax", "argmin", "mean"]))
def test_shapes_dtypes_and_errors_match_mlx(case, fname):
    shape, dtype, axis, keepdims = case
    keepdims = bool(keepdims)  # (MLX's binding refuses an int keepdims; tapescope takes it)

    def run(m):
        x = m.array(np.ones(shape, np.float32)).astype(getattr(m, dtype))
        return getattr(m, fname)(x, axis=axis, keepdims=keepdims)

    try:
        want = run(mlx_ref)
        mlx_ref.eval(want)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            mx.eval(run(mx))
        return
    got = run(mx)
    assert got.shape == tuple(want.shape) and str(got.dtype) == str(want.dtype)


@requires_mlx
@SETTINGS
@given(cases(), st.booleans())
def test_softmax_shapes_dtypes_and_errors_match_mlx(case, precise):
    shape, dtype, axis, _ = case

    def run(m):
        x = m.array(np.ones(shape, np.float32)).astype(getattr(m, dtype))
        return m.softmax(x, axis=axis, precise=precise)

    try:
        want = run(mlx_ref)
        mlx_ref.eval(want)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            mx.eval(run(mx))
        return
    got = run(mx)
    assert got.shape == tuple(want.shape) and str(got.dtype) == str(want.dtype)


DEVICE = r"""
import json, sys
sys.path.insert(0, %r)
import fake_cupy; fake_cupy.install()
import fake_cuda_driver; fake_cuda_driver.install()
import numpy as np
import tapescope.core as mx
from tapescope.core import evaluate as ev

mx.set_default_device(mx.gpu)
x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
a = mx.array(x)
mx.eval(a)
ops = {"flatten": lambda: mx.flatten(a), "reshape": lambda: mx.reshape(a, (3, 8)),
       "expand": lambda: mx.expand_dims(a, 1), "squeeze": lambda: mx.squeeze(mx.expand_dims(a, 0)),
       "transposed": lambda: mx.reshape(mx.transpose(a), (24,)),
       "sum": lambda: mx.sum(a, axis=-1), "argmax_all": lambda: mx.argmax(a)}
out = {"type": type(a._d.data).__module__}
for name, f in ops.items():
    ev.reset_dispatch_counts()
    y = f()
    mx.eval(y)
    out[name] = {"paths": {k: v for k, v in ev.dispatch_counts().items() if v},
                 "shape": list(y.shape), "shares": y._d.buffer is a._d.buffer, "value": None if name in ("sum", "argmax_all")
                 else np.array(y).astype(np.float64).ravel().tolist()}
# a Python scalar's 0-d array on the GPU stream, made in C (core/_binary.c), against the
# Python path's desc (convert.py _scalar: ArrayDesc over numpy's 0-d array, import_host)
from tapescope.core.array import ArrayDesc
from tapescope.core.ops import convert
from tapescope.kernels.allocator import allocator
from tapescope.core import _call
made = _call.scalar(0.25, mx.float32)  # (None: declined, convert.py's Python makes it)
out["c_made"] = made is not None
c = (made if made is not None else convert._scalar(0.25, mx.float32))._d
py = ArrayDesc((), mx.float32, mx.default_stream(mx.gpu), data=np.array(0.25, np.float32))
y = a * 0.25
w = y._d.node.inputs[1].node.inputs[0]  # the weak float under its Broadcast
out["scalar"] = [[type(d.data).__name__, d.data.shape, float(d.data), str(d.stream),
                  d.buffer.allocator is allocator("cpu"), d.node is None] for d in (c, py, w)]
mx.eval(y)
out["times"] = np.array(y).astype(np.float64).ravel().tolist()
print("RESULT" + json.dumps(out))
"""


@in_c
def test_device_reshape_views_are_made_in_c_and_match_numpy():
    """Over the stand-in CUDA stack (its kernels run nothing: the views' values are the
    device copy's): Squeeze, ExpandDims, and Flatten / Reshape of a contiguous array are
    views made by the eval loop in C (the 'view' path, no Python rule); a Reshape of a
    transposed array copies (the Python path's rule, its own buffer), as before; a Python
    scalar's 0-d array on the GPU stream is made in C as the Python path makes it."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler for the stand-in driver")
    env = dict(os.environ, TAPESCOPE_CUDA="1")
    env.pop("TAPESCOPE_DISABLE_GPU", None)
    here = Path(__file__).parent
    r = subprocess.run([sys.executable, "-c", DEVICE % str(here)], env=env, capture_output=True,
                       text=True, timeout=300, cwd=here.parent)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert r.returncode == 0 and line, r.stdout[-4000:] + r.stderr[-4000:]
    got = json.loads(line[-1][len("RESULT"):])
    assert got["type"].startswith("fake_cupy") or "cupy" in got["type"]
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32).astype(np.float64)
    want = {"flatten": x.ravel(), "reshape": x.reshape(3, 8), "expand": x[:, None],
            "squeeze": x, "transposed": x.T.reshape(24)}
    for k, v in want.items():
        assert got[k]["shape"] == list(v.shape), k
        np.testing.assert_array_equal(np.array(got[k]["value"]), v.ravel(), err_msg=k)
    for k in ("flatten", "reshape", "expand"):
        assert got[k]["paths"] == {"view": 1}, (k, got[k])
    assert got["squeeze"]["paths"] == {"view": 2}
    assert got["sum"]["shape"] == [4] and got["sum"]["paths"] == {"rule_out": 1, "view": 1}
    # Flatten and Squeeze views, the ArgReduce's kernel
    assert got["argmax_all"]["shape"] == [] and got["argmax_all"]["paths"] == {"rule_out": 1, "view": 2}
    for k in ("flatten", "reshape", "expand", "squeeze"):
        assert got[k]["shares"], k  # the input's buffer
    assert not got["transposed"]["shares"]  # a copy of its own: the Python path's
    # a Python scalar on the GPU stream: C's desc is the Python path's (host data, adopted
    # by the CPU's allocator, on the GPU stream); the product's values need a real kernel
    assert got["c_made"]
    c, py, weak = got["scalar"]
    assert c == py == weak == ["ndarray", [], 0.25, "Stream(Device(gpu, 0), 0)", True, True]
    assert len(got["times"]) == 24
