"""mx.unique against MLX 0.32 itself (values, dtypes, shapes and the recorded primitives, over
hypothesis arrays, sizes, flags and fill values), against numpy's np.unique where the output
is not truncated, and MLX's errors."""

from __future__ import annotations

import collections
import io
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import primitive_names, same_error

needs_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")

_DTYPES = ["int32", "uint8", "int64", "float32", "float16", "bool"]


@st.composite
def _inputs(draw):
    dtype = draw(st.sampled_from(_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    if dtype == "bool":
        elems = st.booleans()
    elif dtype.startswith("float"):  # few distinct values, so repeats happen; NaNs, signed zeros
        elems = st.sampled_from([0.0, -0.0, 1.5, -2.0, 3.0, float("nan"), float("inf")])
    else:
        elems = st.integers(0 if dtype == "uint8" else -3, 4)
    a = draw(hnp.arrays(np.dtype(dtype), shape, elements=elems))
    size = draw(st.integers(0, a.size + 3))
    flags = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    fill = draw(st.sampled_from([None, None, 0, 2, 1.5, "array"]))
    if fill == "array":
        fill = np.array([[3]], np.int32)
    if a.size == 0 and size and fill is None:
        fill = 1
    return a, size, flags, fill


def _fill(module, fill):
    return module.array(fill) if isinstance(fill, np.ndarray) else fill


def _mlx_names(outs) -> list:
    """MLX's recorded primitives from its DOT export (``Scatter Max`` is our ``Scatter``)."""
    buf = io.StringIO()
    mlx_ref.export_to_dot(buf, *outs)
    return sorted(n.split()[0] for n in re.findall(r'label ="([\w ]+)", shape=rectangle', buf.getvalue()))


@needs_mlx
@settings(max_examples=80)
@given(_inputs())
def test_unique_matches_mlx(case):
    a, size, flags, fill = case
    ours = mx.unique(mx.array(a), size, *flags, fill_value=_fill(mx, fill))
    ref = mlx_ref.unique(mlx_ref.array(a), size, *flags, fill_value=_fill(mlx_ref, fill))
    assert isinstance(ours, tuple) == isinstance(ref, tuple)
    ours, ref = (ours, ref) if isinstance(ref, tuple) else ((ours,), (ref,))
    assert len(ours) == len(ref) == 1 + sum(flags)
    assert collections.Counter(primitive_names(*ours)) == collections.Counter(_mlx_names(ref))
    for o, r in zip(ours, ref):
        assert o.dtype.name == str(r.dtype).rsplit(".", 1)[-1]
        assert o.shape == tuple(r.shape)
        np.testing.assert_array_equal(np.array(o), np.array(r))


@settings(max_examples=40)
@given(_inputs())
def test_unique_is_numpys_when_not_truncated(case):
    """The independent reference: np.unique (NaNs apart, as np.unique(equal_nan=False))."""
    a, _, _, _ = case
    want, index, inverse, counts = np.unique(a.reshape(-1), True, True, True, equal_nan=False)
    if a.size == 0:
        return
    size = len(want) + 2
    values, i, inv, c = mx.unique(mx.array(a), size, True, True, True, fill_value=0)
    values = np.array(values)
    np.testing.assert_array_equal(values[:len(want)], want)
    assert (values[len(want):] == 0).all()
    np.testing.assert_array_equal(np.array(i)[:len(want)], index)
    np.testing.assert_array_equal(np.array(inv), inverse.reshape(a.shape))
    np.testing.assert_array_equal(np.array(c), np.concatenate([counts, [0, 0]]))
    assert inv.dtype == mx.uint32 and i.dtype == mx.uint32 and c.dtype == mx.int32


def test_unique_docstring_example():
    a = mx.array([2, 1, 2, 3, 1])
    assert mx.unique(a, 3).tolist() == [1, 2, 3]
    assert mx.unique(a, 5).tolist() == [1, 2, 3, 1, 1]
    values, index, inverse, counts = mx.unique(a, 4, True, True, True, fill_value=0)
    assert values.tolist() == [1, 2, 3, 0]
    assert index.tolist() == [1, 0, 3, 1]
    assert inverse.tolist() == [1, 0, 1, 2, 0]
    assert counts.tolist() == [2, 2, 1, 0]
    # truncated: the dropped value's inverse is clamped to the last entry
    _, inverse, counts = mx.unique(a, 2, False, True, True)
    assert inverse.tolist() == [1, 0, 1, 1, 0] and counts.tolist() == [2, 2]


def test_unique_does_not_evaluate_its_input():
    a = mx.arange(6) % 3
    out = mx.unique(a, 3)
    assert a._d.node is not None and out._d.node is not None
    assert out.tolist() == [0, 1, 2]


@needs_mlx
@pytest.mark.parametrize("call", [
    "M.unique(M.array([2, 1]), -1)",
    "M.unique(M.array([2, 1]), -1, fill_value=M.array([1, 2]))",
    "M.unique(M.array([2, 1]), 2, fill_value=M.array([1, 2]))",
    "M.unique(M.array([2, 1]), 2, fill_value=M.zeros((0,)))",
    "M.unique(M.zeros((0,)), 3)",
    "M.unique(M.zeros((0,)), 0, fill_value=M.array([1, 2]))",
    "M.unique(M.array([2, 1]), 3.0)",
    "M.unique(M.array([2, 1]), 2 ** 31)",
    "M.unique([2, 1], 2)",
    "M.unique(M.array([2, 1]), 2, 1)",
    "M.unique(M.array([2, 1]), size=2, return_counts=1)",
    "M.unique(M.array([2, 1]), 2, fill_value=2 ** 40)",
    "M.unique(M.array([2, 1], M.uint8), 2, fill_value=-1)",
    "M.unique(M.array([2, 1]), 2, fill_value='x')",
    "M.unique(M.array([2, 1]), 3, fill_value=[[7]])",
    "M.unique(M.array([2, 1]), 3, fill_value=[7, 8])",
])
def test_unique_errors_match_mlx(call):
    same_error(lambda M: eval(call, {"M": M}))
