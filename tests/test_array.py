"""The array's Python protocol against MLX: construction, conversions, numpy, buffers, pickling."""

from __future__ import annotations

import copy
import operator
import pickle

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tapescope.core as mx

from conftest import mlx_ref, requires_mlx

pytestmark = requires_mlx

DTYPES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
          "float16", "float32", "float64", "bfloat16", "complex64"]


def outcome(fn):
    """What ``fn()`` gives: ('ok', dtype name, shape, values) or ('err', type, message)."""
    try:
        a = fn()
    except Exception as e:  # noqa: BLE001 (we compare exceptions)
        return ("err", type(e).__name__, str(e))
    vals = repr(np.array(a.astype(_f32_or_same(a)), copy=True).tolist())  # repr: nan == nan
    return ("ok", str(a.dtype).split(".")[-1], tuple(a.shape), vals)


def _f32_or_same(a):
    """float32 for bfloat16 arrays (numpy cannot take those through the buffer), else a's dtype."""
    mod = mx if isinstance(a, mx.array) else mlx_ref
    return mod.float32 if a.dtype == mod.bfloat16 else a.dtype


def same(make):
    """Assert ``make(module)`` behaves identically with tapescope and MLX."""
    ours, ref = outcome(lambda: make(mx)), outcome(lambda: make(mlx_ref))
    assert ours == ref


# -- construction -----------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, 1, -1, True, False, 1.5, -0.0, 1 + 2j, 2**31 - 1, 2**31, -2**31,
                                   -2**31 - 1, 2**40, 2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64,
                                   float("inf"), float("nan")])
def test_python_scalars(value):
    same(lambda m: m.array(value))


@pytest.mark.parametrize("value", [
    [], [[]], [[], []], [1, 2.0], [True, 2], [True, 1.5], [1, 1j], [1.5, 1 + 1j], (1, 2), [(1, 2), [3, 4]],
    [2**40, 1], [2**40, 1.0], [1, 2**63 - 1], [1, 2**64], [1, [2]], [[1], 2], [[1, 2], [3]],
    [[1], [2, 3]], [[[1]], [2]], [1, [2, 3]], [[1, 2], [3, [4]]], [[], [1]], [[], 1], [[1], []],
    [1, "a"], "a", range(3), [None], [np.float64(1.5)], [np.int64(2)], [np.bool_(True)],
    [np.float32(1)], [np.complex128(1 + 1j)],
])
def test_lists_and_invalid_values(value):
    same(lambda m: m.array(value))


def test_lists_holding_arrays():
    same(lambda m: m.array([m.array(1), m.array(2)]))
    same(lambda m: m.array([m.array([1, 2]), [3, 4]]))
    same(lambda m: m.array([m.array(1.5), 2]))
    same(lambda m: m.array([m.array([1]), 2]))
    same(lambda m: m.array([1, m.array(2.5, m.float16)]))


SCALAR = st.one_of(st.booleans(), st.integers(-2**40, 2**40), st.floats(width=32),
                   st.complex_numbers(allow_nan=False, allow_infinity=False, width=64))


@settings(max_examples=80, deadline=None)
@given(st.recursive(SCALAR, lambda kids: st.lists(kids, max_size=4), max_leaves=12))
def test_random_nested_lists(value):
    same(lambda m: m.array(value))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), src=st.sampled_from(["bool", "uint8", "uint16", "uint32", "uint64", "int8",
                                            "int16", "int32", "int64", "float16", "float32",
                                            "float64", "complex64", "complex128"]))
def test_numpy_arrays_keep_or_narrow_their_dtype(data, src):
    arr = data.draw(hnp.arrays(np.dtype(src), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0,
                                                               max_side=4)), label="arr")
    with np.errstate(all="ignore"):
        same(lambda m: m.array(arr))
        target = data.draw(st.sampled_from(DTYPES), label="dtype")
        if arr.dtype.kind in "fc" and target[0] in "iu" and arr.size:
            # a float out of the integer type's range converts as C's undefined behaviour
            # leaves it (MLX and numpy differ, and so do CPUs): compare in-range values only
            info = np.iinfo(np.dtype(target))
            real = arr.real.astype(np.float64)
            assume(bool(np.all(np.isfinite(real) & (real >= info.min) & (real <= info.max))))
        same(lambda m: m.array(arr, dtype=getattr(m, target)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [[1.5, -2.7, 0.0], [True, False], [3, 255, -1], 1.7, 7])
def test_dtype_argument(value, dtype):
    with np.errstate(all="ignore"):
        same(lambda m: m.array(value, dtype=getattr(m, dtype)))


def test_numpy_scalars_and_special_arrays():
    for v in (np.float64(1.5), np.int64(3), np.int16(2), np.float16(1.5), np.uint64(2**63), np.bool_(True),
              np.complex128(1 + 1j), np.array(2**62), np.zeros((2, 0, 3)), np.asfortranarray(np.ones((2, 3))),
              np.arange(6)[::2]):
        same(lambda m: m.array(v))


def test_numpy_arrays_that_mlx_refuses():
    same(lambda m: m.array(np.array([1, 2])[::-1]))
    same(lambda m: m.array(np.array(["a"])))
    same(lambda m: m.array(np.array([1], dtype=object)))


def test_bytes_like_values():
    for v in (b"ab", bytearray(b"\x00\xff"), memoryview(b"xyz")):
        same(lambda m: m.array(v))


def test_array_from_array_shares_or_casts():
    a = mx.array([1, 2])
    assert mx.array(a)._d is a._d
    same(lambda m: m.array(m.array([1.5, 2.5]), dtype=m.int32))
    same(lambda m: m.array(m.array(1.5, m.bfloat16), dtype=m.float32))


@pytest.mark.parametrize("kwargs", [{"dtype": "int32"}, {"dtype": np.int32}])
def test_dtype_must_be_a_dtype(kwargs):
    same(lambda m: m.array([1, 2], **kwargs))


def test_none_is_not_a_value():
    same(lambda m: m.array(None))


# -- item / tolist ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_item_and_tolist_types(dtype):
    for value in ([1.5], [[2.0, 3.0]], 1.25, [[]]):
        ours = mx.array(value, dtype=getattr(mx, dtype))
        ref = mlx_ref.array(value, dtype=getattr(mlx_ref, dtype))
        got, want = ours.tolist(), ref.tolist()
        assert got == want and repr(got) == repr(want)
        if ref.size == 1:
            assert repr(ours.item()) == repr(ref.item()) and type(ours.item()) is type(ref.item())


def test_item_errors():
    for value in ([1, 2], [], [[1], [2]]):
        same(lambda m: m.array([m.array(value).item()]))


# -- numpy --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_np_array_of_an_array(dtype):
    ours = mx.array([[1, 0], [3, 4]], dtype=getattr(mx, dtype))
    ref = mlx_ref.array([[1, 0], [3, 4]], dtype=getattr(mlx_ref, dtype))
    to_f64 = (lambda x: np.array(x).real.astype(np.float64)) if dtype == "complex64" else \
        (lambda x: np.array(x, dtype=np.float64))
    for conv in (np.array, np.asarray, to_f64,
                 lambda x: np.array(x, copy=True), lambda x: np.asarray(x, copy=False)):
        got, want = conv(ours), conv(ref)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_dunder_array_ignores_dtype_like_mlx():
    ref = mlx_ref.array([1, 2])
    ours = mx.array([1, 2])
    assert ours.__array__(np.float32).dtype == ref.__array__(np.float32).dtype == np.int32
    assert ours.__array__(dtype=np.float32, copy=True).dtype == np.int32


def test_np_array_copies_unless_copy_false():
    x = mx.array([1, 2, 3])
    a = np.array(x)
    a[0] = 100
    assert x.tolist() == [1, 2, 3]
    view = np.asarray(x, copy=False)
    assert not view.flags.writeable  # tapescope: read-only, so numpy cannot write into our buffers
    np.testing.assert_array_equal(view, [1, 2, 3])


def test_np_array_of_bfloat16_fails_as_in_mlx():
    same(lambda m: m.array(np.array(m.array([1.5], m.bfloat16)).tolist()))


def test_numpy_on_the_left_gives_numpy():
    ours = np.array([1, 2]) + mx.array([1, 2])
    ref = np.array([1, 2]) + mlx_ref.array([1, 2])
    assert type(ours) is type(ref) is np.ndarray
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_memoryview_matches_mlx(dtype):
    ours = memoryview(mx.array([[1, 2]], dtype=getattr(mx, dtype)))
    ref = memoryview(mlx_ref.array([[1, 2]], dtype=getattr(mlx_ref, dtype)))
    assert (ours.format, ours.shape, ours.itemsize, ours.tobytes()) == \
        (ref.format, ref.shape, ref.itemsize, ref.tobytes())
    assert bytes(mx.array([1, 2], mx.uint8)) == b"\x01\x02"


# -- Python protocols ---------------------------------------------------------------------
def test_len_and_iter():
    same(lambda m: m.array([len(m.array([[1, 2], [3, 4], [5, 6]]))]))
    same(lambda m: m.array([len(m.array(1))]))
    same(lambda m: m.array(list(m.array([[1, 2], [3, 4]]))))
    same(lambda m: m.array(list(m.array(np.zeros((0, 2))))))
    with pytest.raises(TypeError, match=r"iter\(\) 0-dimensional array."):
        iter(mx.array(1))
    parts = list(mx.array([[1, 2], [3, 4]]))
    assert [p.shape for p in parts] == [(2,), (2,)]


@pytest.mark.parametrize("value", [1, 0, 1.7, -2.5, True, [1], [[0]], [2.5], [1, 2], [], 1 + 2j, [1 + 0j]])
@pytest.mark.parametrize("conv", ["bool", "int", "float", "complex", "index"])
def test_scalar_conversions(value, conv):
    fn = {"bool": bool, "int": int, "float": float, "complex": complex, "index": operator.index}[conv]
    same(lambda m: m.array([fn(m.array(value))]))


def test_index_in_python_sequences():
    same(lambda m: m.array([[10, 20, 30][m.array(1)]]))
    same(lambda m: m.array([[10, 20, 30][m.array(1, m.uint8)]]))
    same(lambda m: m.array([[10, 20, 30][m.array(1.0)]]))
    same(lambda m: m.array([[10, 20, 30][m.array(True)]]))
    same(lambda m: m.array(list(range(m.array(3)))))


def test_hash_is_identity_and_arrays_are_dict_keys():
    a, b = mx.array([1, 2]), mx.array([1, 2])
    assert hash(a) == hash(a) and hash(a) != hash(b)
    assert hash(a) == object.__hash__(a)
    d = {a: "a", b: "b"}
    assert d[a] == "a" and d[b] == "b" and d.get(mx.array([1, 2])) is None


# -- pickling and copying -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_pickle_state_matches_mlx_and_round_trips(dtype):
    value = [[1.5, 0], [-2, 3]]
    ours = mx.array(value, dtype=getattr(mx, dtype))
    ref = mlx_ref.array(value, dtype=getattr(mlx_ref, dtype))
    (od, oc), (rd, rc) = ours.__getstate__(), ref.__getstate__()
    assert oc == rc and od.dtype == rd.dtype and od.shape == rd.shape
    np.testing.assert_array_equal(od, rd)
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(ours, protocol=proto))
        assert isinstance(back, mx.array) and back.dtype == ours.dtype
        assert back.tolist() == ref.tolist()


def test_pickle_of_a_lazy_array_evaluates_it():
    y = mx.array([1.0, 2.0]) * 3
    assert pickle.loads(pickle.dumps(y)).tolist() == [3.0, 6.0]


def test_pickle_zero_d_and_empty():
    for value in (7, [], np.zeros((2, 0))):
        back = pickle.loads(pickle.dumps(mx.array(value)))
        ref = pickle.loads(pickle.dumps(mlx_ref.array(value)))
        assert back.shape == tuple(ref.shape) and back.tolist() == ref.tolist()


def test_copy_and_deepcopy_give_new_handles_with_equal_values():
    a = mx.array([1, 2]) + 1
    for fn in (copy.copy, copy.deepcopy):
        b = fn(a)
        assert b is not a and isinstance(b, mx.array)
        assert b.tolist() == [2, 3] and b.dtype == a.dtype
        ref = fn(mlx_ref.array([1, 2]) + 1)
        assert b.tolist() == ref.tolist()


@pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")
@pytest.mark.parametrize("op", ["method", "function"])
def test_astype_to_the_same_dtype_is_a_new_handle(op):
    """MLX's astype returns a new handle even when the dtype matches, so an in-place operator
    on it leaves the original (mlx.optimizers' Muon relies on it)."""
    for M in (mx, mlx_ref):
        a = M.array([1.0, 2.0])
        b = a.astype(M.float32) if op == "method" else M.astype(a, M.float32)
        b *= 3
        assert a.tolist() == [1.0, 2.0] and b.tolist() == [3.0, 6.0]


@pytest.mark.parametrize("src", ["M.array([M.array([1.0]), 1.0])", "M.array([1.0, M.array([1.0])])",
                                 "M.array([[1.0, 2.0], M.array([1.0])])",
                                 "M.array([M.array(1.0), [1.0]])", "M.array([2.0, [1.0]])"])
def test_lists_mixing_arrays_raise_mlx_errors(src):
    """A nested array of the wrong shape is a length mismatch to MLX ("non-uniform length"),
    wherever it sits; a list one level too deep is an "extra dimension"."""
    from mlx_compare import same_error

    same_error(lambda M: eval(src, {"M": M}))


def test_a_list_holding_arrays_stacks_them_and_keeps_the_graph():
    """MLX builds ``array([x, y])`` by stacking the elements made arrays, so a gradient flows
    through an array in a list; the dtypes promote as in a list of scalars."""
    x = mx.array([1.0])
    g = mx.grad(lambda x: (2 * mx.array([x, mx.array([2.0])])).sum())(x)
    assert g.tolist() == [2.0]
    z = mx.array([mx.array([1], mx.int32), [2.5]])
    assert z.dtype == mx.float32 and z.tolist() == [[1.0], [2.5]]
    w = mx.array([[mx.array(True), 1]], mx.float16)
    assert w.dtype == mx.float16 and w.tolist() == [[1.0, 1.0]]
    from mlx_compare import same_error

    same_error(lambda M: M.array([M.array([1.0]), [1.0, 2.0]]))
