"""MLX's one-index ``Gather`` (``a[idx]``, ``take``, an embedding's lookup) on CUDA as the
gather_axis kernel's launch (``kernels/cuda/indexing.py``: ``gather_walk``), run on the host:
the CUDA source the runtime gives NVRTC built by g++ against ``tests/cuda_host_shim.h``
(``cuda_host.py``), launched with the walk's strides, against numpy's ``take`` over shapes,
gathered axes, windows narrower than the array, index shapes (a scalar index too), negative
indices, transposed inputs and index dtypes; an index out of bounds lowers the bad-position
word at its walk position, whose index position and the array's axis name numpy's error. The GPU runs the same
rule in ``test_cuda_indexing.py``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import fake_cupy
from conftest import sweep
from cuda_host import CXX, build, launch
from tapescope.kernels.codegen import bounds_text

pytestmark = pytest.mark.skipif(CXX is None, reason="no g++ to build the CUDA source for the host")


@pytest.fixture(scope="module")
def indexing():
    fake_cupy.install()  # (the module imports CuPy; only its pure parts run here)
    from tapescope.kernels.cuda import indexing as ix

    return ix


def _gather(ix, a: np.ndarray, idx: np.ndarray, axis: int, sizes: tuple):
    """(out in Gather's shape, (the first bad index position, the axis it names) or None)."""
    sa = tuple(s // a.itemsize for s in a.strides)
    si = tuple(s // idx.itemsize for s in idx.strides)
    walk, moved, istr, window = ix.gather_walk(sa, idx.shape, si, axis, sizes)
    elem, index = ix._MOVE[a.itemsize], ix._INDEX[idx.dtype.name]
    name = f"g_{a.itemsize}_{idx.dtype.name}_{len(walk)}"
    lib = build(ix._source(name, False, elem, index, len(walk), 0, axis), [name])
    out = np.full(walk, 77, a.dtype)
    record = np.zeros(bounds_text.WORDS, np.uint64)  # (bounds_text's layout)
    word = np.array([0, record.ctypes.data], np.uint64)  # (a free lock, the record)
    n = int(np.prod(walk))
    args = [a, idx, out, word, n, a.shape[axis]]
    for d in range(len(walk)):
        args += [walk[d], moved[d], istr[d]]
    launch(lib, name, max(1, -(-n // 64)), 64, args)
    if not record[bounds_text.STATE]:
        return out.reshape(idx.shape + tuple(sizes)), None
    return None, (int(record[bounds_text.POS]) // window, int(record[bounds_text.AXIS]))


@st.composite
def case(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 5, 33]), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(0, ndim - 1))
    sizes = tuple(1 if d == axis else draw(st.integers(1, shape[d])) for d in range(ndim))
    ishape = tuple(draw(st.lists(st.sampled_from([1, 2, 4]), min_size=0, max_size=2)))
    return (shape, axis, sizes, ishape, draw(st.sampled_from(["int32", "int64", "uint8", "int16"])),
            draw(st.sampled_from([np.float32, np.float16, np.int8, np.float64])),
            draw(st.booleans()), draw(st.integers(0, 2 ** 16)))


@settings(max_examples=sweep(60, 20), deadline=None)  # (each example a g++ build)
@given(case())
@example(((3, 5, 2), 1, (3, 1, 2), (2, 2), "int16", np.float16, True, 11))  # (the sample's int16)
def test_one_index_gather_equals_numpy(indexing, c):
    shape, axis, sizes, ishape, idt, dt, transposed, seed = c
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape[::-1]).T if transposed else rng.standard_normal(shape))
    a = a.astype(dt)
    lo = 0 if idt.startswith("u") else -shape[axis]
    idx = rng.integers(lo, shape[axis], ishape).astype(idt)
    got, bad = _gather(indexing, a, idx, axis, sizes)
    assert bad is None
    window = tuple(slice(None) if d == axis else slice(0, s) for d, s in enumerate(sizes))
    want = np.take(a[window], idx.astype(np.int64), axis=axis)
    want = np.moveaxis(want, list(range(axis, axis + idx.ndim)), list(range(idx.ndim)))
    np.testing.assert_array_equal(got, want.reshape(got.shape))


def test_an_index_out_of_bounds_names_its_position(indexing):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 2], [3, -4]], np.int32)
    _, bad = _gather(indexing, a, idx, 0, (1, 4))
    assert bad == (2, 0)  # the first bad index in the indices' order: idx[1, 0] = 3
    _, bad = _gather(indexing, a, np.array([-3, 1], np.int32), 0, (1, 4))
    assert bad is None
    _, bad = _gather(indexing, a, np.array([[1], [4]], np.int32), 1, (3, 1))
    assert bad == (1, 1)  # the array's axis named, not the walk's first
