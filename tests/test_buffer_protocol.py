"""memoryview(x) on every supported Python (3.10 / 3.11 through the C base type in
interactive/core/_buffer.c, 3.12+ through __buffer__), against MLX's buffers."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from conftest import requires_mlx, mlx_ref

NAMES = ["bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
         "float16", "float32", "float64", "complex64"]


def _make(m, name, shape, transpose):
    x = m.reshape(m.arange(int(np.prod(shape))) * 3 - 5, shape).astype(getattr(m, name))
    return m.transpose(x) if transpose else x


def _described(mv: memoryview) -> tuple:
    """What a consumer sees; numpy spells a strided int64 'l' (LP64), MLX 'q': the same type."""
    return ({"l": "q", "L": "Q"}.get(mv.format, mv.format), mv.itemsize, mv.shape, mv.strides,
            mv.tobytes())


def test_the_c_base_type_is_built_before_python_3_12():
    array_module = sys.modules["tapescope.core.array"]
    if sys.version_info >= (3, 12):
        assert mx.array.__buffer__ is not None
    else:
        assert array_module._BufferBase.__name__ == "BufferBase", "build the C extension (make test)"


@requires_mlx
@settings(max_examples=40)
@given(name=st.sampled_from(NAMES), shape=st.lists(st.integers(1, 4), min_size=0, max_size=3),
       transpose=st.booleans())
def test_memoryview_matches_mlx(name, shape, transpose):
    ours, theirs = memoryview(_make(mx, name, shape, transpose)), memoryview(_make(mlx_ref, name, shape, transpose))
    assert _described(ours) == _described(theirs)
    assert ours.readonly  # MLX's is writable; tapescope's buffers are recycled by the runtime


def test_a_view_keeps_its_buffer_after_the_array_is_gone(young_heap):
    x = mx.arange(1000) * 2
    mv = memoryview(x)
    del x
    gc.collect()
    _ = [mx.zeros((1000,), mx.int32) + 7 for _ in range(4)]  # would reuse a freed buffer
    assert mv.tolist() == list(range(0, 2000, 2))
    mv.release()


def test_numpy_and_struct_read_through_the_buffer():
    x = mx.array([[1.5, 2.5], [3.5, 4.5]])
    assert np.frombuffer(x, np.float32).tolist() == [1.5, 2.5, 3.5, 4.5]
    assert memoryview(mx.transpose(x)).tolist() == [[1.5, 3.5], [2.5, 4.5]]
    with pytest.raises(TypeError):
        memoryview(x)[0, 0] = 1.0  # read-only
    with pytest.raises(ValueError, match="bfloat16"):
        memoryview(x.astype(mx.bfloat16))
