"""Indexing against numpy (values, shapes, view-vs-copy) and MLX (semantics, errors):
``a[idx]``, ``a[idx] = v``, ``a.at[idx].add(...)``, take, take_along_axis, put_along_axis,
slice, slice_update, diag, diagonal, trace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from mlx_compare import check, data, host, shares_memory, primitive_names, same_error

SETTINGS = settings(max_examples=50, deadline=None)
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)



def prims(*outs) -> list:
    return sorted(primitive_names(*outs))

def ref(shape, dtype=np.int32):
    return (np.arange(int(np.prod(shape))) - 5).astype(dtype).reshape(shape)


@st.composite
def slices(draw, n):
    lo = draw(st.none() | st.integers(-n - 2, n + 2))
    hi = draw(st.none() | st.integers(-n - 2, n + 2))
    step = draw(st.none() | st.integers(-3, 3).filter(bool))
    return slice(lo, hi, step)


@st.composite
def basic_index(draw, shape):
    """A tuple of in-bounds ints, slices (any step), None and at most one Ellipsis."""
    out = []
    for n in shape[:draw(st.integers(0, len(shape)))]:
        kind = draw(st.sampled_from(["int", "slice", "slice", "none", "ellipsis"]))
        if kind == "none":
            out.append(None)
        if kind == "ellipsis":  # the remaining dimensions
            out.append(Ellipsis)
            break
        out.append(draw(st.integers(-n, n - 1)) if kind == "int" and n else draw(slices(n)))
    return tuple(out)


@st.composite
def advanced_index(draw, shape):
    """Integer arrays (in bounds, negative too) and lists mixed with ints, slices, None."""
    ishape = draw(st.lists(st.integers(1, 3), max_size=2).map(tuple))
    out = []
    for n in shape[:draw(st.integers(1, len(shape)))]:
        kind = draw(st.sampled_from(["array", "array", "list", "int", "slice", "none"]))
        if kind == "none":  # a new axis, then a full slice over this dimension
            out += [None, slice(None)]
        elif kind == "array":
            vals = draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(ishape)),
                                 max_size=int(np.prod(ishape))))
            out.append(np.array(vals, dtype=np.int32).reshape(ishape))
        elif kind == "list":
            k = ishape[-1] if ishape else 2  # broadcasts against the arrays' shape
            out.append(draw(st.lists(st.integers(-n, n - 1), min_size=k, max_size=k)))
        elif kind == "int":
            out.append(draw(st.integers(-n, n - 1)))
        else:
            out.append(draw(slices(n)))
    if not any(isinstance(e, (np.ndarray, list)) for e in out):
        out[next(i for i, e in enumerate(out) if e is not None)] = np.array([0], dtype=np.int32)
    return tuple(out)


def to_mx(idx):
    return tuple(mx.array(e) if isinstance(e, np.ndarray) else e for e in idx)


def np_index(idx):
    return tuple(np.array(e) if isinstance(e, list) else e for e in idx)


# -- __getitem__ ---------------------------------------------------------------------------
@SETTINGS
@given(shapes, st.data())
def test_basic_indexing_matches_numpy(shape, d):
    x = ref(shape)
    idx = d.draw(basic_index(shape))
    check(mx.array(x)[idx], x[idx])
    if len(idx) == 1:
        check(mx.array(x)[idx[0]], x[idx[0]])


@SETTINGS
@given(shapes, st.data())
def test_basic_indexing_of_views_of_views_matches_numpy(shape, d):
    x = ref(shape)
    i1 = d.draw(basic_index(shape))
    y = x[i1]
    i2 = d.draw(basic_index(y.shape)) if y.ndim else ()
    a = mx.array(x)[i1]
    check(a[i2], y[i2])


@SETTINGS
@given(shapes, st.data())
def test_integer_array_indexing_matches_numpy_placement(shape, d):
    x = ref(shape)
    idx = d.draw(advanced_index(shape))
    check(mx.array(x)[to_mx(idx)], x[np_index(idx)])


def test_single_int_and_list_indexing():
    x = ref((3, 4))
    a = mx.array(x)
    for i in range(-3, 3):
        check(a[i], x[i])
    check(a[[2, 0, -1]], x[[2, 0, -1]])
    check(a[mx.array([[1, 2], [0, 0]])], x[np.array([[1, 2], [0, 0]])])
    check(a[np.int64(1)], x[1])
    check(a[...], x)
    check(a[()], x)
    check(mx.array(np.float32(2))[None], np.float32(2)[None])
    check(mx.array(np.float32(2))[...], np.float32(2))


def test_slices_are_views_and_gathers_are_copies():
    base = mx.array(ref((4, 5)))
    b = data(base)
    for v in (base[1:], base[:, ::-2], base[1:3, None, ::2], base[..., 2], base[1, 2:]):
        assert shares_memory(data(v), b)
    for c in (base[mx.array([0, 1])], base[[3, 1], 1:]):
        assert not shares_memory(data(c), b)


@pytest.mark.parametrize("idx", [
    lambda m: 1, lambda m: (slice(1, None),), lambda m: (Ellipsis, 0), lambda m: (slice(None), 0),
    lambda m: (0, 1), lambda m: -1, lambda m: [0, 1], lambda m: None,
    lambda m: (m.array([0, 1]), m.array([0, 1])), lambda m: (slice(None, None, -1),),
])
def test_getitem_records_the_primitives_mlx_records(mlx, idx):
    import re
    import tempfile

    x = [[1.0, 2, 3], [4, 5, 6]]
    out = mx.array(x)[idx(mx)]
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mlx.export_to_dot(f.name, mlx.array(x)[idx(mlx)])
        want = re.findall(r'label ="([A-Za-z ]+)", shape=rectangle', open(f.name).read())
    assert prims(out) == sorted(want)


@pytest.mark.parametrize("case", [
    lambda m: m.zeros((2, 3))[0, 0, 0], lambda m: m.zeros((2, 3))[..., ...],
    lambda m: m.zeros((2, 3))[m.array([0.5])], lambda m: m.zeros((2, 3))[1.5],
    lambda m: m.zeros((2, 3))["x"], lambda m: m.zeros((2, 3))[m.array(True)],
    lambda m: m.zeros((2, 3))[[True, False]], lambda m: m.zeros((2, 3))[True],
    lambda m: m.array(1.0)[0], lambda m: m.array(1.0)[:],
])
def test_getitem_errors_match_mlx(case):
    same_error(case)


# -- __setitem__ ---------------------------------------------------------------------------
@SETTINGS
@given(shapes, st.data())
def test_setitem_basic_matches_numpy(shape, d):
    x = ref(shape)
    idx = d.draw(basic_index(shape))
    target = x[idx].shape
    vshape = target[d.draw(st.integers(0, len(target))):]
    val = np.arange(int(np.prod(vshape)), dtype=np.int32).reshape(vshape) + 100
    a = mx.array(x)
    a[idx] = mx.array(val)
    x[idx] = val
    check(a, x)


@SETTINGS
@given(shapes, st.data())
def test_setitem_with_unique_integer_arrays_matches_numpy(shape, d):
    x = ref(shape)
    n = shape[0]
    rows = d.draw(st.lists(st.integers(0, n - 1), unique=True, min_size=1))
    rows = [r - n if d.draw(st.booleans()) else r for r in rows]
    rest = d.draw(st.sampled_from([(), (slice(None, None, -1),), (0,)])) if len(shape) > 1 else ()
    idx = (np.array(rows, np.int32),) + rest
    val = np.arange(x[idx].size, dtype=np.int32).reshape(x[idx].shape) + 100
    a = mx.array(x)
    a[to_mx(idx)] = mx.array(val)
    x[idx] = val
    check(a, x)
    a[to_mx(idx)] = 7
    x[idx] = 7
    check(a, x)


def test_setitem_semantics_match_mlx(mlx):
    def run(m):
        a = m.array([[1, 2, 3], [4, 5, 6]])
        alias, view = a, a[0]
        a[0, 1:] = 2.7            # float scalar cast to int32
        a[:, 0] = m.array([9.5, 8.5])
        a[m.array([1]), 2] = -1
        a[None, 1] = m.array([[[7, 7, 7]]])  # extra leading size-1 axes
        b = m.array([1.0, 2.0, 3.0], m.float16)
        b[::2] = 1e-3
        c = m.arange(5)
        c[:] = 7
        return [a, alias, view, b, c]

    for got, want in zip(run(mx), run(mlx)):
        assert repr(got.dtype) == str(want.dtype)
        np.testing.assert_array_equal(np.array(got), np.array(want))


@pytest.mark.parametrize("holder", ["array", "numpy view"])
def test_setitem_does_not_touch_the_old_data(holder):
    """The old array, held by another array or a numpy view of it, keeps its values (an
    update writes into its input's buffer only when nobody else holds it, as MLX donates)."""
    x = ref((3, 3))
    a = mx.array(x)
    mx.eval(a)
    old = mx.array(a) if holder == "array" else np.array(a, copy=False)
    a[1] = 0
    a[mx.array([0, 2]), 0] = 5
    mx.eval(a)
    np.testing.assert_array_equal(np.array(old), ref((3, 3)))
    want = ref((3, 3))
    want[1] = 0
    want[[0, 2], 0] = 5
    check(a, want)


@pytest.mark.parametrize("case", [
    lambda m: m.zeros((2, 3)).__setitem__((0, 0, 0), 1),
    lambda m: m.zeros((2, 3)).__setitem__(slice(None), m.zeros((3, 3))),
    lambda m: m.zeros((2, 3)).__setitem__(m.array([True, False, True]), 1),
    lambda m: m.zeros((2, 3)).__setitem__(m.array([True, True]), m.array([1, 2])),
    lambda m: m.zeros((2, 3)).__setitem__("x", 1),
    lambda m: m.zeros((2, 3)).__setitem__(0, "x"),
])
def test_setitem_errors_match_mlx(case):
    same_error(case)


@pytest.mark.parametrize("case", [
    "b[m.array([True, False])] = 7", "b[[True, False]] = 7", "b[True] = 7", "b[False] = 7",
    "b[m.array(True)] = 7", "b[m.array([[True, False, True], [False, False, True]])] = 7",
    "b[m.array([[True, False, True], [False, False, True]])] = m.array([10, 20, 30])",
    "b[m.array([True, False])] = m.array([10, 20, 30])",
    "b[m.array([True, True])] = m.array([[1], [2]])",
    "b[m.array([True, False])] = m.array([[1.5, 2, 3], [4, 5, 6]])",
])
def test_setitem_with_boolean_masks_matches_mlx(mlx, case):
    def run(m):
        b = m.arange(6).reshape(2, 3)
        exec(case, {"b": b, "m": m})
        return b

    got, want = run(mx), run(mlx)
    assert repr(got.dtype) == str(want.dtype)
    np.testing.assert_array_equal(np.array(got), np.array(want))


# -- .at[] ---------------------------------------------------------------------------------
UFUNCS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
          "maximum": np.maximum, "minimum": np.minimum}


@SETTINGS
@given(shapes, st.sampled_from(sorted(UFUNCS)), st.data())
def test_at_updates_accumulate_repeats_like_numpy_ufunc_at(shape, op, d):
    x = ref(shape, np.float32)
    n = shape[0]
    rows = np.array(d.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=6)), np.int32)
    rest = d.draw(st.sampled_from([(), (slice(None, None, 2),), (-1,)])) if len(shape) > 1 else ()
    idx = (rows,) + rest
    vals = (np.arange(x[idx].size, dtype=np.float32).reshape(x[idx].shape) % 3) + 1
    got = getattr(mx.array(x).at[to_mx(idx)], op)(mx.array(vals))
    want = x.copy()
    UFUNCS[op].at(want, idx, vals)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-6)


def test_at_divide_and_scalar_updates_match_mlx(mlx):
    def run(m):
        a = m.array([[1.0, 2.0], [4.0, 8.0]])
        i = m.array([0, 0, 1])
        return [a.at[i].divide(2.0), a.at[i].add(1), a.at[1:].multiply(3),
                m.array([1, 2, 3]).at[m.array([0, 0])].add(1.5),
                m.array([1, 2, 3]).at[m.array([0, 0])].divide(2),
                a.at[i, 1].maximum(5.0), a.at[..., 0].minimum(3.0), a]

    for got, want in zip(run(mx), run(mlx)):
        assert repr(got.dtype) == str(want.dtype)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6)


# -- take / take_along_axis / put_along_axis -----------------------------------------------
@SETTINGS
@given(shapes, st.data())
def test_take_matches_numpy(shape, d):
    x = ref(shape)
    ax = d.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[ax]
    ishape = d.draw(st.lists(st.integers(0, 3), max_size=2).map(tuple))
    ind = np.array(d.draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(ishape)),
                                   max_size=int(np.prod(ishape)))), np.int32).reshape(ishape)
    check(mx.take(mx.array(x), mx.array(ind), axis=ax), np.take(x, ind, axis=ax))
    check(mx.take(mx.array(x), mx.array(ind) % x.size), np.take(x, ind % x.size))
    i = d.draw(st.integers(0, n - 1))
    check(mx.take(mx.array(x), i, axis=ax), np.take(x, i, axis=ax))
    if i - n != -1:  # MLX takes the slice [i, i + 1): negative ints but -1 count from the end
        check(mx.take(mx.array(x), i - n, axis=ax), np.take(x, i, axis=ax))


@pytest.mark.parametrize("case", [
    lambda m: m.take(m.arange(6), -2), lambda m: m.take(m.arange(6).reshape(2, 3), -2, axis=1),
    lambda m: m.take(m.arange(6).reshape(2, 3), -3, axis=1),
    lambda m: m.take_along_axis(m.arange(6).reshape(2, 3), m.array([2, 5]), None),
    lambda m: m.put_along_axis(m.arange(6).reshape(2, 3), m.array([4, 0]), m.array(9)),
    # indices and values broadcast against the array on the other axes
    lambda m: m.put_along_axis(m.arange(6).reshape(2, 3), m.array([[0]]), m.array(9), 0),
    lambda m: m.put_along_axis(m.arange(6).reshape(2, 3), m.array([[1]]), m.array([7, 8, 9]), 0),
    lambda m: m.put_along_axis(m.zeros((2, 3)), m.array([[1], [0]]), m.array([[[7], [8]]]), 1),
    lambda m: m.put_along_axis(m.zeros((2, 1)), m.array([[0, 0, 0]]), m.array(1.0), 1),
])
def test_take_forms_match_mlx(mlx, case):
    got, want = case(mx), case(mlx)
    check(got, np.array(want))


@SETTINGS
@given(shapes, st.data())
def test_take_and_put_along_axis_match_numpy(shape, d):
    x = ref(shape)
    ax = d.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[ax]
    ishape = [1 if d.draw(st.booleans()) else s for s in shape]
    ishape[ax] = d.draw(st.integers(1, 3))
    ind = np.array(d.draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(ishape)),
                                   max_size=int(np.prod(ishape)))), np.int32).reshape(ishape)
    check(mx.take_along_axis(mx.array(x), mx.array(ind), axis=ax), np.take_along_axis(x, ind, ax))
    flat = ind.reshape(-1) % x.size
    check(mx.take_along_axis(mx.array(x), mx.array(flat), None), np.take_along_axis(x, flat, None))
    # put_along_axis with unique indices along the axis (numpy keeps the last repeat)
    uind = np.broadcast_to(np.arange(n, dtype=np.int32).reshape(
        [n if i == ax % len(shape) else 1 for i in range(len(shape))]), shape)[...]
    uind = np.flip(uind, ax % len(shape)).copy()
    want = x.copy()
    np.put_along_axis(want, uind, 99, ax)
    check(mx.put_along_axis(mx.array(x), mx.array(uind), mx.array(99), ax), want)
    vals = np.arange(uind.size, dtype=np.int32).reshape(uind.shape)
    want = x.copy()
    np.put_along_axis(want, uind, vals, ax)
    check(mx.put_along_axis(mx.array(x), mx.array(uind), mx.array(vals), ax), want)


def test_put_along_axis_without_axis_matches_mlx(mlx):
    x = [[1, 2, 3], [4, 5, 6]]
    got = mx.put_along_axis(mx.array(x), mx.array([4, 0]), mx.array([9, 8]))
    want = mlx.put_along_axis(mlx.array(x), mlx.array([4, 0]), mlx.array([9, 8]))
    check(got, np.array(want))


# -- slice / slice_update ------------------------------------------------------------------
@SETTINGS
@given(shapes, st.data())
def test_dynamic_slice_and_slice_update_match_numpy(shape, d):
    x = ref(shape)
    axes = d.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1))
    size = [d.draw(st.integers(1, s)) for s in shape]
    start = [d.draw(st.integers(0, shape[a] - size[a])) for a in axes]
    window = [slice(None)] * len(shape)
    for a, s in zip(axes, start):
        window[a] = slice(s, s + size[a])
    full = tuple(slice(0, z) if i not in axes else window[i] for i, z in enumerate(size))
    got = mx.slice(mx.array(x), mx.array(start), axes, size)
    check(got, x[full])
    upd = -np.ones([size[i] if i in axes else shape[i] for i in range(len(shape))], np.int32)
    want = x.copy()
    want[tuple(window)] = upd
    base = mx.array(x)
    check(mx.slice_update(base, mx.array(upd), mx.array(start), axes), want)
    np.testing.assert_array_equal(host(data(base)), x)  # the input is not written


@pytest.mark.parametrize("case", [
    lambda m: m.slice(m.zeros((2, 3)), m.array([0]), (0,), (1,)),
    lambda m: m.slice(m.zeros((2, 3)), m.array([0]), (0,), (3, 3)),
    lambda m: m.slice(m.zeros((2, 3)), m.array([0]), (2,), (1, 3)),
    lambda m: m.slice(m.zeros((2, 3)), m.array([0.0]), (0,), (1, 3)),
    lambda m: m.slice_update(m.zeros((2, 3)), m.zeros((3, 3)), m.array([0]), (0,)),
    lambda m: m.take(m.zeros((2, 3)), m.array([0.5])),
    lambda m: m.take(m.zeros((2, 3)), 1, axis=2),
    lambda m: m.take(m.zeros((2, 3)), -1, axis=0),
    lambda m: m.take_along_axis(m.zeros((2, 3)), m.array([[0], [2]]), None),
    lambda m: m.put_along_axis(m.zeros((2, 3)), m.array([[0], [2]]), m.array(9.0)),
    lambda m: m.take_along_axis(m.zeros((2, 3)), m.array([0]), axis=1),
    lambda m: m.take_along_axis(m.zeros((2, 3)), m.array([[0]]), axis=2),
    lambda m: m.take_along_axis(m.zeros((2, 3)), m.array([[0.0]]), axis=1),
    lambda m: m.put_along_axis(m.zeros((2, 3)), m.array([[0]]), m.array(1.0), axis=3),
    lambda m: m.put_along_axis(m.zeros((2, 3)), m.array([0]), m.array(1.0), axis=1),
    lambda m: m.take_along_axis(m.zeros((2, 3)), m.array([[0], [1], [0]]), axis=1),
    lambda m: m.put_along_axis(m.zeros((2, 3)), m.array([[0], [1], [0]]), m.array(1.0), axis=1),
    lambda m: m.put_along_axis(m.zeros((2, 3)), m.array([[0], [1]]),
                               m.array([[1.0, 2], [3, 4], [5, 6]]), 1),
    lambda m: m.put_along_axis(m.zeros((2, 3)), m.array([[0], [1]]),
                               m.array([[[1.0], [2]], [[3], [4]]]), 1),
    lambda m: m.diag(m.zeros((2, 2, 2))), lambda m: m.diag(m.array(1.0)),
    lambda m: m.diagonal(m.arange(5)), lambda m: m.diagonal(m.zeros((2, 3)), 0, 0, 0),
    lambda m: m.diagonal(m.zeros((2, 3)), 0, 0, 2), lambda m: m.diagonal(m.zeros((2, 3)), 0, 3, 1),
    lambda m: m.trace(m.arange(5)),
])
def test_errors_match_mlx(case):
    same_error(case)


# -- diag / diagonal / trace ---------------------------------------------------------------
@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple), st.data())
def test_diagonal_and_trace_match_numpy(shape, d):
    x = ref(shape)
    n = len(shape)
    a1 = d.draw(st.integers(-n, n - 1))
    a2 = d.draw(st.integers(-n, n - 1).filter(lambda a: a % n != a1 % n))
    k = d.draw(st.integers(-4, 4))
    check(mx.diagonal(mx.array(x), k, a1, a2), np.diagonal(x, k, a1, a2))
    check(mx.array(x).diagonal(k, a1, a2), np.diagonal(x, k, a1, a2))
    check(mx.trace(mx.array(x), k, a1, a2), np.trace(x, k, a1, a2))


@SETTINGS
@given(st.integers(0, 4), st.integers(1, 4), st.integers(-4, 4))
def test_diag_matches_numpy(n, m, k):
    v = ref((n,))
    check(mx.diag(mx.array(v), k), np.diag(v, k))
    x = ref((n or 1, m))
    check(mx.diag(mx.array(x), k), np.diag(x, k))
    check(mx.array(x).diag(k), np.diag(x, k))


def test_trace_dtypes_match_mlx(mlx):
    for dt, out in (("int8", None), ("float16", None), ("int32", "float32")):
        x = [[1, 2], [3, 4]]
        got = mx.trace(mx.array(x, getattr(mx, dt)), dtype=getattr(mx, out) if out else None)
        want = mlx.trace(mlx.array(x, getattr(mlx, dt)), dtype=getattr(mlx, out) if out else None)
        assert repr(got.dtype) == str(want.dtype)
        assert got.item() == want.item()


# -- mixed index forms, read / assign / .at, against MLX ------------------------------------
@pytest.mark.parametrize("idx", [
    "(Ellipsis, None)", "(None, Ellipsis, 0)", "(slice(None), None, m.array([0, 1]))",
    "(m.array([0, 1]), None, m.array([1, 2]))", "(m.array([[0], [1]]), m.array([0, 2, 3]))",
    "(1, m.array([0, 2]))", "(m.array([1]), 2)", "(slice(1, None), m.array([[1], [2]]))",
    "(slice(None, None, -1), m.array([3, 0]))", "[1, 0]", "(m.array([0, 1]), Ellipsis)",
    "(Ellipsis, m.array([0, 1]))", "m.array([[0, 1], [1, 0]])", "(slice(5, None),)",
    "(slice(None, -5),)", "(0, 0)", "(-1, -1)", "(np.int64(1),)", "(m.array(-1),)",
    "(m.array([-1, -2]), -1)", "(m.array(1, m.uint8), 1)", "(0, Ellipsis, 1)",
    "(Ellipsis, slice(None, None, -2))", "(None, 1, Ellipsis, None, slice(3, 0, -1))",
])
def test_mixed_indices_read_assign_and_at_match_mlx(mlx, idx):
    def run(m):
        a = m.arange(12).reshape(3, 4)
        g = a[eval(idx)]
        b = m.arange(12).reshape(3, 4)
        b[eval(idx)] = -1
        c = m.arange(12).reshape(3, 4).astype(m.float32).at[eval(idx)].add(0.5)
        d = m.arange(12).reshape(3, 4)
        d[eval(idx)] = m.zeros(g.shape, m.float32) - 7.9
        return g, b, c, d

    for got, want in zip(run(mx), run(mlx)):
        assert repr(got.dtype) == str(want.dtype)
        check(got, np.array(want))


# -- out-of-range indices -------------------------------------------------------------------
# numpy raises IndexError("index -4 is out of bounds for axis 0 with size 3") for any index
# outside [-n, n), and so do we, for every indexing form. MLX itself does not: it reads or
# writes out of bounds (x[3] gives garbage, x[-4] can crash the process, x[3] = 9 is
# ignored), or fails in a later Squeeze (X[0, -4], take(x, -4)); MLX is therefore only run
# on in-range indices here.
def _outcome(call):
    """("value", the evaluated result as numpy) or (exception type, message) of ``call()``."""
    try:
        return "value", np.array(call())
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)


def _agree(case, x, in_range, mlx=None):
    """``case(m, a, arr)`` (m a module, a the array, arr making index arrays) gives numpy's
    IndexError and message when out of range; in range, MLX's error where MLX raises one,
    and numpy's values otherwise. ``in_range=None``: MLX alone is the reference (skipped
    without MLX)."""
    if in_range is None:
        if mlx is None:
            return
        in_range = True
    want = _outcome(lambda: case(np, x.copy(), np.asarray))
    if not in_range:
        assert want[0] is IndexError
    if in_range and mlx is not None:
        ref_mlx = _outcome(lambda: case(mlx, mlx.array(x), mlx.array))
        if ref_mlx[0] != "value":
            want = ref_mlx
    if in_range and mlx is None and want[0] != "value":
        return  # MLX's own error decides here (mx.take out of range); without MLX, no reference
    got = _outcome(lambda: case(mx, mx.array(x), mx.array))
    lazy = _outcome(lambda: case(mx, mx.array(x), lambda v: mx.array(v) + 0))
    for out in (got, lazy):
        assert out[0] == want[0]
        if out[0] == "value":
            np.testing.assert_array_equal(out[1], want[1])
        else:
            assert out[1] == want[1]


def _assign(m, a, idx):
    a[idx] = 7
    return a


def _add_at(m, a, idx):
    if m is np:
        np.add.at(a, idx, 1)
        return a
    return a.at[idx].add(1)


def _put_along(m, a, ind, ax):
    if m is np:
        np.put_along_axis(a, ind, 7, ax)
        return a
    return m.put_along_axis(a, ind, m.array(7, a.dtype), ax)


@pytest.mark.parametrize("case", [
    lambda m, a, arr: a[-4], lambda m, a, arr: a[-5], lambda m, a, arr: a[3],
    lambda m, a, arr: a[arr([-4])], lambda m, a, arr: a[[0, -4]], lambda m, a, arr: a[None, -4],
    lambda m, a, arr: m.take(a, arr([1, -4])),
    lambda m, a, arr: m.take_along_axis(a, arr([-4]), axis=0),
    lambda m, a, arr: _put_along(m, a, arr([-4]), 0),
    lambda m, a, arr: _assign(m, a, -4), lambda m, a, arr: _assign(m, a, arr([-4])),
    lambda m, a, arr: _add_at(m, a, -4), lambda m, a, arr: _add_at(m, a, arr([2, -4])),
])
def test_negative_out_of_range_on_a_vector_raises_numpys_index_error(case):
    _agree(case, np.array([1, 2, 3], np.int32), in_range=False)


@pytest.mark.parametrize("case", [
    lambda m, a, arr: a[-3], lambda m, a, arr: a[0, -4], lambda m, a, arr: a[-3, 0],
    lambda m, a, arr: a[:, -4], lambda m, a, arr: a[..., -4], lambda m, a, arr: a[0, None, -4],
    lambda m, a, arr: a[arr([-3]), 0], lambda m, a, arr: a[arr([0]), arr([-4])],
    lambda m, a, arr: m.take(a, arr([[-4]]), axis=1),
    lambda m, a, arr: m.take_along_axis(a, arr([[0], [-4]]), axis=1),
    lambda m, a, arr: _put_along(m, a, arr([[-3, 0, 0]]), 0),
    lambda m, a, arr: _assign(m, a, (0, -4)), lambda m, a, arr: _assign(m, a, -3),
    lambda m, a, arr: _assign(m, a, (slice(None), -4)),
    lambda m, a, arr: _add_at(m, a, (0, -4)), lambda m, a, arr: _add_at(m, a, -3),
])
def test_negative_out_of_range_on_a_matrix_raises_numpys_index_error(case):
    _agree(case, np.array([[1, 2, 3], [4, 5, 6]], np.int32), in_range=False)


def test_out_of_range_lazy_index_array_raises_when_evaluated():
    x = mx.array([1, 2, 3])
    # values known: a host index is checked by the indexing itself, as numpy does; a
    # device-resident one (the GPU default) at its eval, without a copy to the host at the op
    with pytest.raises(IndexError, match="index -4 is out of bounds for axis 0 with size 3"):
        mx.eval(x[mx.array([0, -4])])
    idx = mx.array([0, 1]) - 5  # values unknown until evaluated: [-5, -4]
    y = x[idx]  # recorded; the Gather raises when it runs
    with pytest.raises(IndexError) as info:
        mx.eval(y)
    assert str(info.value) == "index -5 is out of bounds for axis 0 with size 3"
    with pytest.raises(IndexError, match="index 4 is out of bounds for axis 0 with size 3"):
        mx.eval(x[mx.array([4], mx.uint8) + 0])
    with pytest.raises(IndexError, match="index -4 is out of bounds for axis 0 with size 3"):
        mx.eval(x.at[mx.array([-4]) + 0].add(1))
    check(x[mx.array([-3, -1]) + 0], [1, 3])  # in range: counted from the end


@SETTINGS
@given(shapes, st.data())
def test_indices_in_and_out_of_range_match_numpy(shape, d):
    from conftest import mlx_ref

    x = ref(shape)
    ax = d.draw(st.integers(0, len(shape) - 1))
    n = shape[ax]
    i = d.draw(st.integers(-n - 3, n + 2))
    lead = (slice(None),) * ax
    ishape = d.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple))
    vals = d.draw(st.lists(st.integers(-n - 3, n + 2), min_size=int(np.prod(ishape)),
                           max_size=int(np.prod(ishape))))
    ind = np.array(vals, np.int32).reshape(ishape)
    # take_along_axis: indices of the array's rank, ``ishape[0]`` long on ``ax``
    along = np.resize(ind, [ishape[0] if k == ax else 1 for k in range(len(shape))])
    int_ok, ind_ok = -n <= i < n, bool(((ind >= -n) & (ind < n)).all())
    along_ok = bool(((along >= -n) & (along < n)).all())
    for case, ok in [
        (lambda m, a, arr: a[lead + (i,)], int_ok),
        (lambda m, a, arr: a[lead + (i, Ellipsis)], int_ok),
        (lambda m, a, arr: _assign(m, a, lead + (i,)), int_ok),
        (lambda m, a, arr: _add_at(m, a, lead + (i,)), int_ok),
        # an int take is MLX's one-wide slice, which raises for i < 0 (and past the end)
        # where numpy gives a value: only MLX can say what is right
        (lambda m, a, arr: m.take(a, i, axis=ax), None),
        (lambda m, a, arr: a[lead + (arr(ind),)], ind_ok),
        (lambda m, a, arr: _assign(m, a, lead + (arr(ind),)), ind_ok),
        (lambda m, a, arr: _add_at(m, a, lead + (arr(ind),)), ind_ok),
        (lambda m, a, arr: m.take(a, arr(ind), axis=ax), ind_ok),
        (lambda m, a, arr: m.take_along_axis(a, arr(along), axis=ax), along_ok),
        (lambda m, a, arr: _put_along(m, a, arr(along), ax), along_ok),
    ]:
        _agree(case, x, ok, mlx_ref)


@pytest.mark.parametrize("case", [
    lambda m: m.take(m.array([1, 2, 3]), -4), lambda m: m.take(m.array([1, 2, 3]), 3),
    lambda m: m.take(m.reshape(m.arange(6), (2, 3)), -7),
    lambda m: m.take(m.reshape(m.arange(6), (2, 3)), -3, axis=0),
    lambda m: m.take(m.zeros((0, 3)), 0, axis=0),
])
def test_take_of_an_int_out_of_range_raises_mlxs_error(case):
    """An int index is a one-wide slice in MLX: out of range, the slice is empty and MLX's
    Squeeze raises (a defined error, unlike an out-of-range index array)."""
    same_error(case)


@pytest.mark.parametrize("shape, n", [((4, 3, 4), 2), ((4, 3, 4), 3), ((4, 4, 4), 2),
                                      ((4, 4, 4), 3)])
def test_setitem_checks_the_update_shape_before_the_index_bounds_as_mlx(shape, n):
    """``a[i, None, j] = v``: None adds an axis without using one, so j indexes axis 1; MLX
    checks that ``v`` fits the indexed shape (2, 1, 4) before anything else."""
    def case(M):
        a = M.zeros(shape)
        a[M.array([2, 3]), None, M.array([2, 3])] = M.arange(n)
        return a

    same_error(case)


def test_setitem_with_none_between_index_arrays():
    a = mx.zeros((4, 4, 4))
    a[mx.array([2, 3]), None, mx.array([2, 3])] = mx.arange(4)
    want = np.zeros((4, 4, 4))
    want[[2, 3], None, [2, 3]] = np.arange(4)
    check(a, want)
    b = mx.zeros((4, 3, 4))  # a fitting update, an index past the axis
    if mx.default_device() == mx.cpu:  # host index values: checked at the op, numpy's error
        with pytest.raises(IndexError, match="index 3 is out of bounds for axis 1 with size 3"):
            b[mx.array([2, 3]), None, mx.array([2, 3])] = mx.arange(4)
    else:  # device-resident values: checked when the scatter runs, naming the array's axis
        b[mx.array([2, 3]), None, mx.array([2, 3])] = mx.arange(4)
        with pytest.raises(IndexError, match="index 3 is out of bounds for axis 2 with size 3"):
            mx.eval(b)
