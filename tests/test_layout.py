"""codegen.layout.Layout: an array's metadata without its data plans a launch exactly as the
array itself does (the picture of a program plans before its inputs exist)."""

import numpy as np
from hypothesis import given, settings, strategies as st

from tapescope.kernels.codegen import layout as L


@st.composite
def views(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int64, np.bool_]))
    big = tuple(s * 2 for s in shape)
    a = np.arange(int(np.prod(big, dtype=np.int64))).astype(dtype).reshape(big)[
        tuple(slice(None, None, 2) for _ in shape)]
    kind = draw(st.sampled_from(["view", "contiguous", "transposed", "broadcast"]))
    if kind == "contiguous":
        a = np.ascontiguousarray(a)
    elif kind == "transposed":
        a = np.ascontiguousarray(a).T
    elif kind == "broadcast" and ndim:
        a = np.broadcast_to(np.ascontiguousarray(a)[..., :1], shape)
    return a


@settings(max_examples=60)
@given(views())
def test_layout_reads_like_the_array(a):
    lay = L.Layout.of(a)
    assert lay.shape == a.shape and lay.ndim == a.ndim and lay.size == a.size
    assert lay.strides == a.strides and lay.dtype == a.dtype
    assert lay.flags.c_contiguous == a.flags.c_contiguous
    assert lay.flags.f_contiguous == a.flags.f_contiguous
    assert L.data_size(lay) == L.data_size(a)
    assert L.check_contiguity([lay], a.shape) == L.check_contiguity([a], a.shape)


@settings(max_examples=40)
@given(views(), views())
def test_variant_from_layouts_is_the_variant_from_arrays(a, b):
    import tapescope
    import tapescope.core as mx

    a = a.astype(np.float32)
    b = b.astype(np.float32) if _broadcasts_to(b.shape, a.shape) else a
    tape = tapescope.trace(lambda x, y: mx.exp(x) * y + 1, mx.array(a), mx.array(b)).kernels[0].tape
    want = L.variant(tape, [a, b], a.shape)
    assert L.variant(tape, [L.Layout.of(a), L.Layout.of(b)], a.shape) == want


def _broadcasts_to(s1, s2):
    try:
        return np.broadcast_shapes(s1, s2) == tuple(s2)
    except ValueError:
        return False
