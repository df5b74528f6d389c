"""DLPack both ways, __array_namespace__, bytes(x), get_array_buffer_size and __version__,
against MLX itself."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from conftest import mlx_ref, requires_mlx
from mlx_compare import outcome

NP_DTYPES = [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
             np.int64, np.float16, np.float32, np.float64, np.complex64, np.complex128]
MX_NAMES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
            "float16", "bfloat16", "float32", "float64", "complex64"]
shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3)


def _strided(np_x: np.ndarray, step: int, transpose: bool) -> np.ndarray:
    x = np_x[::step] if np_x.ndim else np_x
    return x.T if transpose else x


@requires_mlx
@settings(max_examples=30)
@given(dt=st.sampled_from(NP_DTYPES), shape=shapes, step=st.integers(1, 2), tr=st.booleans())
def test_from_dlpack_of_numpy_matches_mlx(dt, shape, step, tr):
    src = _strided((np.arange(int(np.prod(shape))).reshape(shape) * 7 - 3).astype(dt), step, tr)
    want, got = mlx_ref.from_dlpack(src), mx.from_dlpack(src)
    assert str(got.dtype) == str(want.dtype)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.array(got), np.array(want))


@requires_mlx
@settings(max_examples=30)
@given(name=st.sampled_from(MX_NAMES), shape=shapes, transpose=st.booleans())
def test_numpy_from_dlpack_of_array_matches_mlx(name, shape, transpose):
    def make(m):
        x = m.reshape(m.arange(int(np.prod(shape))) * 5 - 7, shape).astype(getattr(m, name))
        return m.transpose(x) if transpose else x

    assert outcome(mlx_ref, "M.__dlpack_device__()", M=make) is None
    assert make(mx).__dlpack_device__() == make(mlx_ref).__dlpack_device__()
    want = outcome(mlx_ref, "np.from_dlpack(x)", x=make, np=lambda m: np)
    got = outcome(mx, "np.from_dlpack(x)", x=make, np=lambda m: np)
    assert got == want
    if want is None:
        a, b = np.from_dlpack(make(mx)), np.from_dlpack(make(mlx_ref))
        assert a.dtype == b.dtype and not a.flags.writeable
        np.testing.assert_array_equal(a, b)
        assert bytes(make(mx)) == bytes(make(mlx_ref))


def test_from_dlpack_round_trip_and_errors():
    x = mx.array([[1.5, 2.5], [3.5, 4.5]])
    y = mx.from_dlpack(x)
    assert y.tolist() == x.tolist() and y.dtype == mx.float32
    assert mx.from_dlpack(np.arange(3), copy=True).tolist() == [0, 1, 2]
    if mlx_ref is not None:
        for src in ("M.from_dlpack([1, 2])", "M.from_dlpack(3)"):
            assert outcome(mx, src) == outcome(mlx_ref, src)


def test_from_dlpack_copies_so_the_source_can_change():
    src = np.arange(4, dtype=np.float32)
    y = mx.from_dlpack(src)
    src[0] = 99
    assert y.tolist() == [0, 1, 2, 3]


def test_from_dlpack_without_a_copy_raises_as_mlx_does_where_it_cannot_adopt():
    """``copy=False`` must never copy; tapescope never adopts outside memory, so it raises
    MLX's error for a buffer it cannot adopt (MLX adopts a plain numpy array)."""
    src = np.arange(3, dtype=np.float32)
    with pytest.raises(ValueError, match=r"^\[convert\] Cannot import a CPU array without a "
                                         r"copy\.$"):
        mx.from_dlpack(src, copy=False)
    assert mx.from_dlpack(src, copy=None).tolist() == [0, 1, 2]


def test_array_namespace_is_the_module():
    x = mx.array([1, 2])
    assert x.__array_namespace__() is mx
    assert x.__array_namespace__(api_version="2023.12") is mx


@requires_mlx
def test_get_array_buffer_size_counts_each_buffer_once_as_mlx():
    def case(m):
        # sizes are of the buffers handed out: none reused from the cache (which buffer an
        # allocation reuses within one eval depends on the order the eval runs its nodes)
        m.clear_cache()
        a = m.reshape(m.arange(6), (2, 3))
        s, t, z, u = a[:, 1:], a.T, m.zeros((1000,)), m.zeros((3,), m.uint8)
        for x in ((a, s, t), (z,), (u,)):
            m.eval(*x)
            m.clear_cache()
        f = m.get_array_buffer_size
        return [f(a), f(s), f(a, t, {"x": [a, 3]}, "leaf"), f(z), f(u), f(), f(a, z, u)]

    assert case(mx) == case(mlx_ref)
    for src in ("M.get_array_buffer_size(M.arange(3) + 1)",):
        assert outcome(mx, src) == outcome(mlx_ref, src)


@requires_mlx
def test_version_is_mlx_release_followed():
    assert mx.__version__ == mlx_ref.__version__


@pytest.mark.parametrize("name", MX_NAMES)
def test_bytes_is_row_major_data(name):
    x = mx.transpose(mx.reshape(mx.arange(6), (2, 3))).astype(getattr(mx, name))
    host = np.asarray(x._numpy())
    assert bytes(x) == np.ascontiguousarray(host).tobytes()


@pytest.mark.parametrize("src", ["np.arange(12, dtype=np.float32).reshape(3, 4).T",
                                 "np.arange(20, dtype=np.int32)[2:10:2]",
                                 "np.broadcast_to(np.array([7], dtype=np.int32), (3,))",
                                 "np.arange(24, dtype=np.int16).reshape(2, 3, 4)[:, ::2, 1:]"])
def test_from_dlpack_of_a_strided_source_keeps_its_strides_as_mlx(src):
    """MLX adopts a strided host buffer, so ``memoryview(y)`` has the source's strides;
    tapescope copies the bytes the view spans and keeps that layout (read-only, as a
    broadcast view is), and ops read it as any strided array."""
    x = eval(src, {"np": np})
    y = mx.from_dlpack(x)
    assert y.tolist() == x.tolist()
    assert memoryview(y).strides == x.strides and not memoryview(y).c_contiguous
    np.testing.assert_array_equal(np.array(y * 2 + 1), x * 2 + 1)
    np.testing.assert_array_equal(np.array(mx.compile(lambda a: a * 3)(y)), x * 3)
    if mlx_ref is not None:
        assert memoryview(mlx_ref.from_dlpack(x)).strides == x.strides
    with pytest.raises(ValueError, match="negative strides"):
        mx.from_dlpack(np.arange(5, dtype=np.float32)[::-1])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "scalar", "empty"])
def test_a_bfloat16_producer_numpy_cannot_read_is_read_through_its_dlpack_capsule(layout):
    """``mx.array(torch.tensor(..., dtype=torch.bfloat16))`` (MLX's test_bf16
    test_conversion): numpy has no bfloat16, so the array reads the producer's DLPack capsule
    (interactive/core/dlpack_import.py); MLX's own bfloat16 arrays are such a producer here."""
    mlx = pytest.importorskip("mlx.core")
    base = mlx.arange(-11, 13).reshape(2, 3, 4).astype(mlx.bfloat16) * 0.375
    src = {"contiguous": base, "transposed": base.transpose(2, 0, 1),
           "sliced": base[:, ::2, 1:], "scalar": base[1, 2, 3],
           "empty": mlx.zeros((0, 3), mlx.bfloat16)}[layout]
    with pytest.raises((TypeError, ValueError)):
        np.asarray(src)  # the path under test is taken only where numpy refuses
    got = mx.array(src)
    want = np.array(src.astype(mlx.float32)).astype(np.float64)
    assert got.dtype == mx.bfloat16 and got.shape == tuple(src.shape)
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)).astype(np.float64), want)


def test_a_producer_without_a_host_capsule_keeps_numpy_s_error():
    class Opaque:
        def __array__(self, dtype=None, copy=None):
            raise TypeError("no numpy form")

    with pytest.raises(TypeError, match="no numpy form"):
        mx.array(Opaque())


class _DLPackOnly:
    """A producer with DLPack and nothing else (as a torch tensor is to MLX's bindings)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@requires_mlx
@pytest.mark.parametrize("left,right", [("float16", "float64"), ("int32", "int8"),
                                        ("float32", "float32"), ("bool", "float32")])
def test_a_dlpack_producer_is_an_operand_as_in_mlx(left, right):
    """MLX's ops take any nb::ndarray where they take ``scalar | array`` (MLX's test_fft_grads
    subtracts a torch tensor from an array), cast to the array operand's dtype."""
    import mlx.core as mlx

    a = np.arange(1, 7).reshape(2, 3).astype(left)
    b = (np.arange(6).reshape(2, 3) % 3).astype(right)
    want = mlx.array(a) - _DLPackOnly(b) if left != "bool" else mlx.add(mlx.array(a), _DLPackOnly(b))
    got = mx.array(a) - _DLPackOnly(b) if left != "bool" else mx.add(mx.array(a), _DLPackOnly(b))
    assert str(got.dtype) == str(want.dtype)
    np.testing.assert_array_equal(np.array(got), np.array(want))
    alone = mx.array(_DLPackOnly(b))
    assert alone.shape == (2, 3) and np.array_equal(np.array(alone), b)
