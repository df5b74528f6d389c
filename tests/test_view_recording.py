"""The layout ops' recording in C (core/_layout.c: reshape, transpose, expand_dims, squeeze,
swapaxes, moveaxis, their method forms, ``.T`` / ``.mT``, ``astype``) against the Python
reference (ops/shape.py ``python_ops``, array_methods.py ``python_methods``): the same graph
(primitive, parameters in order, output shape and dtype, the input's desc) and the same
errors for every argument; values and strides after eval against numpy; errors (type and
message) against MLX; vmap / grad / compile through the C-recorded ops against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import tapescope.core as mx
from tapescope.core import array_methods as am
from tapescope.core.ops import shape as sh

from conftest import mlx_ref, requires_mlx

SETTINGS = settings(max_examples=80, deadline=None)
in_c = pytest.mark.skipif(sh.reshape is sh.python_ops["reshape"], reason="core/_layout.c not built")


def node_of(out, a):
    """Every node from ``out`` back to ``a``: (primitive, parameters in order, shape, dtype,
    whether its input is ``a``'s desc, stream), or ("handle", shape, whether ``out`` is a new
    handle on ``a``'s desc)."""
    d = out._d
    if d is a._d:
        return ("handle", d.shape, out is not a)
    rows = []
    while d is not a._d and d.node is not None:
        n = d.node
        kw = [(k, v.str if isinstance(v, np.dtype) else v) for k, v in n.primitive.kw.items()]
        rows.append((n.primitive.name, kw, d.shape, d.dtype, [i is a._d for i in n.inputs],
                     n.primitive.stream, len(n.inputs)))
        d = n.inputs[0]
    return rows


def recorded(fn, a):
    try:
        return node_of(fn(), a), None
    except Exception as e:  # noqa: BLE001 (the error itself is compared)
        return None, (type(e), str(e))


def _array(shape, dtype="float32"):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return mx.array(x).astype(getattr(mx, dtype)), x


shapes = st.lists(st.integers(0, 4), max_size=4).map(tuple)
ints = st.integers(-6, 6)
odd = st.one_of(st.booleans(), st.floats(-2, 2), st.just("x"), st.none(), st.just(2**40),
                st.just(np.int64(1)), st.lists(st.floats(0, 2), max_size=2))
int_seq = st.lists(ints, max_size=5)
seq_arg = st.one_of(int_seq, int_seq.map(tuple), ints, odd,
                    st.lists(st.one_of(ints, odd), max_size=3))


@st.composite
def reshape_cases(draw):
    shape = draw(shapes)
    n = int(np.prod(shape))
    pick = draw(st.integers(0, 3))
    if pick == 0:  # a valid one, -1 somewhere perhaps
        dims = [d for d in draw(st.permutations(list(shape))) if True]
        if dims and draw(st.booleans()):
            dims[draw(st.integers(0, len(dims) - 1))] = -1
        arg = dims if draw(st.booleans()) else tuple(dims)
    elif pick == 1:
        arg = draw(st.sampled_from([n, -1, (n,), (1, n), (n, 1, -1), (-1, -1), (0,), (-2, -n)]))
    else:
        arg = draw(seq_arg)
    return shape, arg


def perm_or(draw, nd):
    if draw(st.booleans()):
        p = draw(st.permutations(list(range(nd))))
        return [ax - nd if draw(st.booleans()) else ax for ax in p]
    return draw(seq_arg)


@in_c
@SETTINGS
@given(reshape_cases(), st.booleans())
def test_reshape_records_what_the_python_reference_records(case, method):
    shape, arg = case
    a, _ = _array(shape)
    py = sh.python_ops["reshape"]
    if method:
        args = arg if isinstance(arg, tuple) else (arg,)
        got = recorded(lambda: a.reshape(*args), a)
        want = recorded(lambda: am.python_methods["reshape"](a, *args), a)
    else:
        got = recorded(lambda: mx.reshape(a, arg), a)
        want = recorded(lambda: py(a, arg), a)
    assert got == want


@in_c
@SETTINGS
@given(st.data(), shapes, st.sampled_from(["fn", "method", "none"]))
def test_transpose_records_what_the_python_reference_records(data, shape, form):
    a, _ = _array(shape)
    axes = perm_or(data.draw, len(shape))
    if form == "none":
        got = [recorded(lambda: mx.transpose(a), a), recorded(lambda: a.T, a),
               recorded(lambda: a.mT, a), recorded(lambda: a.transpose(), a)]
        want = [recorded(lambda: sh.python_ops["transpose"](a), a),
                recorded(lambda: am.python_methods["T"](a), a),
                recorded(lambda: am.python_methods["mT"](a), a),
                recorded(lambda: am.python_methods["transpose"](a), a)]
    elif form == "method":
        args = axes if isinstance(axes, (list, tuple)) and data.draw(st.booleans()) else (axes,)
        got = recorded(lambda: a.transpose(*args), a)
        want = recorded(lambda: am.python_methods["transpose"](a, *args), a)
    else:
        got = recorded(lambda: mx.transpose(a, axes), a)
        want = recorded(lambda: sh.python_ops["transpose"](a, axes), a)
    assert got == want


@in_c
@SETTINGS
@given(shapes, seq_arg, st.booleans())
def test_expand_dims_and_squeeze_record_what_the_python_reference_records(shape, axis, method):
    a, _ = _array(shape)
    for name in ("expand_dims", "squeeze"):
        if method and name == "squeeze":
            got = recorded(lambda: a.squeeze(axis), a)
            want = recorded(lambda: am.python_methods["squeeze"](a, axis), a)
        else:
            got = recorded(lambda: getattr(mx, name)(a, axis), a)
            want = recorded(lambda: sh.python_ops[name](a, axis), a)
        assert got == want, name
    if method:  # squeeze of every size-1 axis
        assert recorded(lambda: a.squeeze(), a) == recorded(
            lambda: sh.python_ops["squeeze"](a), a)


@in_c
@SETTINGS
@given(shapes, st.one_of(ints, odd), st.one_of(ints, odd), st.booleans())
def test_swapaxes_and_moveaxis_record_what_the_python_reference_records(shape, x, y, method):
    a, _ = _array(shape)
    for name in ("swapaxes", "moveaxis"):
        if method:
            got = recorded(lambda: getattr(a, name)(x, y), a)
            want = recorded(lambda: am.python_methods[name](a, x, y), a)
        else:
            got = recorded(lambda: getattr(mx, name)(a, x, y), a)
            want = recorded(lambda: sh.python_ops[name](a, x, y), a)
        assert got == want, name


@in_c
@pytest.mark.parametrize("src", ["float32", "float16", "int32", "bool_"])
@pytest.mark.parametrize("dst", ["float32", "bfloat16", "int8", "bool_", "complex64"])
def test_astype_records_what_the_python_reference_records(src, dst):
    a, _ = _array((2, 3), src)
    for dtype in (getattr(mx, dst), getattr(mx, dst).np if dst != "bool_" else "x"):
        got = recorded(lambda: a.astype(dtype), a)
        want = recorded(lambda: am.python_methods["astype"](a, dtype), a)
        assert got == want
    got = recorded(lambda: a.astype(getattr(mx, dst), stream=mx.cpu), a)
    assert got == recorded(lambda: am.python_methods["astype"](a, getattr(mx, dst), mx.cpu), a)


@in_c
def test_keyword_and_odd_arguments_take_the_python_path():
    """Keywords the C parses (shape=, axes=, axis=, stream=) give the same node; a keyword it
    does not know, a duplicate, a subclass of array or a non-array go to the reference, whose
    TypeError / result is the one the caller gets."""
    a, _ = _array((2, 3))
    py = sh.python_ops
    assert recorded(lambda: mx.reshape(a, shape=(3, 2), stream=mx.cpu), a) == recorded(
        lambda: py["reshape"](a, shape=(3, 2), stream=mx.cpu), a)
    assert recorded(lambda: mx.transpose(a, axes=[1, 0]), a) == recorded(
        lambda: py["transpose"](a, axes=[1, 0]), a)
    assert recorded(lambda: a.reshape(6, stream=mx.cpu), a) == recorded(
        lambda: am.python_methods["reshape"](a, 6, stream=mx.cpu), a)
    for call in (lambda f: f(a, (6,), shape=(6,)), lambda f: f(a, (6,), bogus=1),
                 lambda f: f(a), lambda f: f(), lambda f: f(a, (6,), (6,))):
        assert recorded(lambda: call(mx.reshape), a)[1] is not None
        assert recorded(lambda: call(mx.reshape), a) == recorded(lambda: call(py["reshape"]), a)
    assert np.array_equal(np.array(mx.reshape(np.array([[1, 2], [3, 4]]), (4,))), [1, 2, 3, 4])


@SETTINGS
@given(reshape_cases())
def test_reshape_values_and_strides_against_numpy(case):
    shape, arg = case
    assume(isinstance(arg, (list, tuple)) and all(type(v) is int and v >= -1 for v in arg))
    a, x = _array(shape)
    try:
        want = np.reshape(x, arg)
    except Exception:  # noqa: BLE001 (numpy refuses: so does tapescope, its message MLX's)
        with pytest.raises((ValueError, TypeError, OverflowError)):
            mx.reshape(a, arg)
        return
    got = mx.reshape(a, arg)
    mx.eval(got)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.array(got), want)


@SETTINGS
@given(st.data(), shapes)
def test_transpose_and_friends_values_and_strides_against_numpy(data, shape):
    a, x = _array(shape)
    nd = len(shape)
    perm = data.draw(st.permutations(list(range(nd))))
    outs = [(mx.transpose(a, perm), np.transpose(x, perm)), (a.T, x.T)]
    if nd >= 2:
        outs.append((a.mT, np.swapaxes(x, -1, -2)))
    if nd:
        i, j = data.draw(st.integers(-nd, nd - 1)), data.draw(st.integers(-nd, nd - 1))
        outs += [(mx.swapaxes(a, i, j), np.swapaxes(x, i, j)),
                 (mx.moveaxis(a, i, j), np.moveaxis(x, i, j))]
    k = data.draw(st.integers(-nd - 1, nd))
    outs.append((mx.expand_dims(a, k), np.expand_dims(x, k)))
    outs.append((mx.squeeze(a), np.squeeze(x)))
    for got, want in outs:
        mx.eval(got)
        assert got.shape == want.shape
        np.testing.assert_array_equal(np.array(got), want)
        data_np = got._d.data
        if data_np is not None and want.size > 1 and isinstance(data_np, np.ndarray):
            # a view of the input's buffer, as numpy's (element strides)
            isz = x.itemsize
            assert [s // isz for s, n in zip(data_np.strides, want.shape) if n > 1] == \
                [s // isz for s, n in zip(want.strides, want.shape) if n > 1]


def _mlx_error(fn_mx, fn_ts):
    got = want = None
    try:
        fn_ts()
    except Exception as e:  # noqa: BLE001
        got = (type(e).__name__, str(e))
    try:
        fn_mx()
    except Exception as e:  # noqa: BLE001
        want = (type(e).__name__, str(e))
    return got, want


@requires_mlx
@SETTINGS
@given(shapes, st.one_of(int_seq, int_seq.map(tuple), ints), st.sampled_from(
    ["reshape", "transpose", "expand_dims", "squeeze", "swapaxes", "moveaxis"]))
def test_errors_are_mlx_s(shape, arg, name):
    a, x = _array(shape)
    b = mlx_ref.array(x)
    if name in ("swapaxes", "moveaxis"):
        i, j = (arg[:2] + [0, 0])[:2] if isinstance(arg, list) else (arg, -1) \
            if isinstance(arg, int) else ((list(arg) + [0, 0])[:2])
        got, want = _mlx_error(lambda: getattr(mlx_ref, name)(b, i, j),
                               lambda: getattr(mx, name)(a, i, j))
    else:
        got, want = _mlx_error(lambda: getattr(mlx_ref, name)(b, arg),
                               lambda: getattr(mx, name)(a, arg))
    assert got == want


@requires_mlx
@pytest.mark.parametrize("call", [
    lambda m, a: m.reshape(a, (4,)), lambda m, a: m.reshape(a, (-1, -1)),
    lambda m, a: m.reshape(a, (0, -1)), lambda m, a: m.reshape(a, (-2, 3)),
    lambda m, a: m.transpose(a, (0, 0)), lambda m, a: m.transpose(a, (0, 2)),
    lambda m, a: m.transpose(a, (0,)), lambda m, a: a.transpose(1, 1),
    lambda m, a: m.expand_dims(a, 3), lambda m, a: m.expand_dims(a, (0, 0)),
    lambda m, a: m.squeeze(a, 0), lambda m, a: m.squeeze(a, 5), lambda m, a: m.swapaxes(a, 0, 2),
    lambda m, a: m.moveaxis(a, -3, 0), lambda m, a: a.mT.T.reshape(3, 2).squeeze(1),
])
def test_bad_arguments_raise_mlx_s_errors(call):
    a = mx.zeros((2, 3))
    got, want = _mlx_error(lambda: call(mlx_ref, mlx_ref.zeros((2, 3))), lambda: call(mx, a))
    assert got == want and got is not None


def test_transformations_through_the_c_recorded_ops():
    """grad, vmap and compile of a function of reshape / transpose / expand_dims / squeeze /
    swapaxes / .T: values and gradients against numpy's."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    w = rng.standard_normal((8, 5)).astype(np.float32)

    def f(a, b):
        y = a.transpose(1, 0, 2).reshape(4, -1)          # (4, 6)
        y = mx.expand_dims(y, 0).squeeze(0)
        z = mx.swapaxes(y, 0, 1) @ b.T[:, :4].T           # (6, 4) @ (4, 5)... b.T (5, 8)
        return (mx.moveaxis(z.reshape(2, 3, 5), 0, 2) ** 2).sum()

    def f_np(a, b):
        y = a.transpose(1, 0, 2).reshape(4, -1)
        z = y.T @ b.T[:, :4].T
        return float((np.moveaxis(z.reshape(2, 3, 5), 0, 2) ** 2).sum())

    a, b = mx.array(x), mx.array(w)
    np.testing.assert_allclose(f(a, b).item(), f_np(x, w), rtol=1e-5)
    np.testing.assert_allclose(mx.compile(f)(a, b).item(), f_np(x, w), rtol=1e-5)
    g = mx.grad(f)(a, b)
    eps, num = 1e-3, np.zeros_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        xp, xm = x.astype(np.float64), x.astype(np.float64)
        xp[idx] += eps
        xm[idx] -= eps
        num[idx] = (f_np(xp, w) - f_np(xm, w)) / (2 * eps)
    np.testing.assert_allclose(np.array(g), num, rtol=2e-2, atol=2e-2)
    v = mx.vmap(lambda r: r.reshape(2, 4).T.reshape(-1), in_axes=0)(a.reshape(3, 8))
    np.testing.assert_array_equal(np.array(v), np.stack([r.reshape(2, 4).T.reshape(-1)
                                                         for r in x.reshape(3, 8)]))


bound = st.one_of(st.none(), st.integers(-7, 7), st.just(2**31), st.booleans())
index_entry = st.one_of(
    st.integers(-5, 5), st.none(), st.just(Ellipsis),
    st.builds(slice, bound, bound, st.one_of(st.none(), st.integers(-3, 3))),
    st.just(np.int32(1)), st.just(1.5), st.just([0]))


@in_c
@settings(max_examples=200, deadline=None)
@given(shapes, st.one_of(index_entry, st.lists(index_entry, max_size=5).map(tuple)))
def test_basic_indexing_records_what_the_python_reference_records(shape, idx):
    a, x = _array(shape)
    got = recorded(lambda: a[idx], a)
    want = recorded(lambda: am.python_methods["__getitem__"](a, idx), a)
    assert got == want
    if got[1] is None:  # and numpy's values
        out = a[idx]
        mx.eval(out)
        np.testing.assert_array_equal(np.array(out), x[idx])


def _update_graph(a_shape, idx, v_shape, v_dtype, setter):
    """The nodes ``a[idx] = v`` recorded (each: primitive, parameters, shape, dtype, its
    inputs' shapes, whether the first is ``a``'s old desc), or the error."""
    a, _ = _array(a_shape)
    v = mx.array(np.full(v_shape, 7, np.float32)).astype(getattr(mx, v_dtype))
    old = a._d
    try:
        setter(a, idx, v)
    except Exception as e:  # noqa: BLE001
        return None, (type(e), str(e))
    rows, stack = [], [a._d]
    while stack:
        d = stack.pop()
        if d is old or d is v._d or d.node is None:
            continue
        n = d.node
        rows.append((n.primitive.name, list(n.primitive.kw.items()), d.shape, d.dtype,
                     [i.shape for i in n.inputs], [i is old for i in n.inputs],
                     [i is v._d for i in n.inputs]))
        stack.extend(n.inputs)
    return rows, a._d is v._d


@in_c
@settings(max_examples=200, deadline=None)
@given(shapes.filter(lambda s: len(s) > 0),
       st.one_of(index_entry, st.lists(index_entry, max_size=4).map(tuple)),
       st.sampled_from(["float32", "float16"]), st.booleans())
def test_basic_update_records_what_the_python_reference_records(shape, idx, v_dtype, fit):
    a, x = _array(shape)
    try:
        want_shape = x[idx].shape if fit else (1,)
    except Exception:  # noqa: BLE001 (numpy refuses the index: compare the errors)
        want_shape = (1,)
    got = _update_graph(shape, idx, want_shape, v_dtype, lambda a, i, v: a.__setitem__(i, v))
    want = _update_graph(shape, idx, want_shape, v_dtype, am.python_methods["__setitem__"])
    assert got == want
    if got[0] is not None and fit:  # numpy's values
        a, x = _array(shape)
        v = np.full(want_shape, 7, np.float32)
        a[idx] = mx.array(v).astype(getattr(mx, v_dtype))
        x[idx] = v
        np.testing.assert_array_equal(np.array(a.astype(mx.float32)), x)
