"""``GatherAxis`` and ``ScatterAxis`` (sum) as CUDA kernels (``kernels/cuda/indexing.py``):
``take_along_axis`` and its VJP on the GPU against numpy, over shapes, axes, negative and
repeated indices, index dtypes, transposed inputs and the element dtypes; an index out of
bounds raises numpy's IndexError at the eval's wait (the deferred check, ``cuda/bounds.py``),
and the failed eval's arrays raise it again when read."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from tapescope.kernels import backends, timeline

from conftest import kernel_launches

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="the CUDA runtime needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")

DTYPES = {"float32": (mx.float32, np.float32), "float16": (mx.float16, np.float16),
          "int32": (mx.int32, np.int32), "bfloat16": (mx.bfloat16, np.float32),
          "bool": (mx.bool_, np.bool_)}
INDEX = {"int32": (mx.int32, np.int32), "int64": (mx.int64, np.int64),
         "uint8": (mx.uint8, np.uint8), "int16": (mx.int16, np.int16)}


@st.composite
def case(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 7, 33]), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(-ndim, ndim - 1))
    n_ax = draw(st.sampled_from([1, 2, 5, 40]))
    return shape, axis, n_ax, draw(st.sampled_from(sorted(DTYPES))), \
        draw(st.sampled_from(sorted(INDEX))), draw(st.booleans()), draw(st.integers(0, 2 ** 16))


def _inputs(c):
    shape, axis, n_ax, dt, it, transposed, seed = c
    rng = np.random.default_rng(seed)
    ax = axis % len(shape)
    a = rng.standard_normal(shape) * 4
    ishape = list(shape)
    ishape[ax] = n_ax
    size = shape[ax]
    lo = 0 if INDEX[it][1](0).dtype.kind == "u" else -size
    idx = rng.integers(lo, size, ishape)
    return a, idx, ax


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=40, deadline=None)
@given(case())
def test_take_along_axis_on_the_gpu_matches_numpy(c):
    shape, axis, n_ax, dt, it, transposed, seed = c
    a, idx, ax = _inputs(c)
    t, npt = DTYPES[dt]
    host = a.astype(npt)
    h = np.ascontiguousarray(np.swapaxes(host, 0, -1)) if transposed else host
    ma = mx.array(h).astype(t)
    if transposed:  # the same values through strides that are not row-major
        ma = mx.swapaxes(ma, 0, -1)
    mi = mx.array(idx.astype(INDEX[it][1]), dtype=INDEX[it][0])
    mx.eval(ma, mi)
    with kernel_launches("cuda") as rec:
        out = mx.take_along_axis(ma, mi, axis=axis)
        mx.eval(out)
    wide = dt in ("bfloat16", "float16")  # compared as the float32 of the same bits
    values = np.array(ma.astype(mx.float32)) if wide else np.array(ma)
    want = np.take_along_axis(values, np.where(idx < 0, idx + shape[ax], idx), axis=ax)
    got = np.array(out.astype(mx.float32)) if wide else np.array(out)
    np.testing.assert_array_equal(got, want)
    assert "GatherAxis" in rec.primitives, rec.fallbacks


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=30, deadline=None)
@given(case())
def test_take_along_axis_vjp_scatters_on_the_gpu_as_numpy_adds(c):
    """The VJP of ``take_along_axis`` is ``ScatterAxis`` with ``reduce="sum"``: repeated
    indices add (float32, float16 and bfloat16 kernels, bfloat16 on its storage; the other
    dtypes are not differentiable)."""
    shape, axis, n_ax, dt, it, transposed, seed = c
    a, idx, ax = _inputs(c)
    ft = {"float16": mx.float16, "bfloat16": mx.bfloat16}.get(dt, mx.float32)
    npt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}.get(dt, np.float32)
    rng = np.random.default_rng(seed + 1)
    ct = rng.standard_normal(idx.shape).astype(npt)
    ma, mi = mx.array(a.astype(npt), dtype=ft), mx.array(idx.astype(INDEX[it][1]), dtype=INDEX[it][0])
    with kernel_launches("cuda") as rec:
        _, (g,) = mx.vjp(lambda x: mx.take_along_axis(x, mi, axis=axis), [ma], [mx.array(ct, dtype=ft)])
        mx.eval(g)
    want = np.zeros(shape, np.float64)
    pos = np.where(idx < 0, idx + shape[ax], idx)
    grid = list(np.indices(idx.shape, sparse=True))
    grid[ax] = pos
    np.add.at(want, tuple(grid), ct.astype(np.float64))
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2}.get(dt, 1e-5)  # (a rounding per add)
    np.testing.assert_allclose(np.array(g.astype(mx.float32)), want, rtol=tol, atol=tol * max(1, n_ax))
    assert "ScatterAxis" in rec.primitives, rec.fallbacks


@pytest.mark.usefixtures("gpu_default_device")
def test_a_bfloat16_scatter_is_the_cpus_bits_and_takes_no_float32_copies():
    """bfloat16 ``ScatterAxis`` (sum: the VJP of ``take_along_axis``) adds into its 16-bit
    storage, one rounding per add: two updates per position give the CPU's bits in any
    order (one rounding of their sum), more are the float64 sum within a rounding per add;
    no ``AsType`` widens or narrows it."""
    rng = np.random.default_rng(5)
    upd = rng.standard_normal((6, 80)).astype(ml_dtypes.bfloat16)
    two = np.concatenate([np.stack([rng.permutation(40) for _ in range(6)]) for _ in range(2)],
                         axis=1).astype(np.int32)  # each position twice
    many = rng.integers(0, 3, (6, 80)).astype(np.int32)  # ~27 updates on each of three
    for idx, exact in ((two, True), (many, False)):
        outs = []
        for dev in (mx.gpu, mx.cpu):
            with mx.stream(dev):
                x, u, i = mx.zeros((6, 40), dtype=mx.bfloat16), mx.array(upd), mx.array(idx)
                mx.eval(x, u, i)
                with timeline.record() as rec:
                    _, (g,) = mx.vjp(lambda v: mx.take_along_axis(v, i, axis=1), [x], [u])
                    mx.eval(g)
                if dev == mx.gpu:  # (a cast's kernel is named ew_AsType_...)
                    names = [r.name for r in rec.records if r.kind == "kernel_launch"]
                    assert any(n.startswith("scatter_axis_sum___nv_bfloat16") for n in names), names
                    assert not any("AsType" in n for n in names), names
                outs.append(np.array(g.view(mx.uint16)))
        if exact:
            np.testing.assert_array_equal(outs[0], outs[1])
        want = np.zeros((6, 40))
        np.add.at(want, (np.arange(6)[:, None], idx), upd.astype(np.float64))
        got = outs[0].view(ml_dtypes.bfloat16).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2 ** -8 * 30, atol=2 ** -8 * 30)


@pytest.mark.usefixtures("gpu_default_device")
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_an_index_out_of_bounds_on_the_gpu_raises_at_the_eval_and_its_arrays_raise_again(dtype):
    """numpy's IndexError (its message: the first bad index in the walk, here 4 before 5)
    from the eval, for the gather, its plan's launch from C and the VJP's scatter; the
    failed eval's arrays raise it again when read; the next eval is right."""
    a = mx.array(np.arange(12, dtype=np.float32).reshape(3, 4))
    i_np = np.array([[0, 1], [2, 4], [5, 0]], dtype)
    i = mx.array(i_np)
    want = "index 4 is out of bounds for axis 1 with size 4"
    with pytest.raises(IndexError) as info:
        np.take_along_axis(np.zeros((3, 4)), i_np, axis=1)
    assert str(info.value) == want
    for _ in range(3):  # the rule's first call, then the plan launched from C
        out = mx.take_along_axis(a, i, axis=1)
        with pytest.raises(IndexError) as info:
            mx.eval(out)
        assert type(info.value) is IndexError and str(info.value) == want
        with pytest.raises(IndexError, match=want):
            np.array(out)
        upd = mx.ones((3, 2))
        g = mx.vjp(lambda v: mx.take_along_axis(v, i, axis=1), [a], [upd])[1][0]
        with pytest.raises(IndexError, match=want):
            mx.eval(g)
        ok = mx.take_along_axis(a, mx.array(np.array([[3], [-4], [0]], np.int32)), axis=1)
        np.testing.assert_array_equal(np.array(ok), [[3], [4], [8]])


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=30, deadline=None)
@given(case())
def test_one_index_gather_on_the_gpu_matches_numpy(c):
    """``a[idx]`` and ``take`` (MLX's ``Gather`` with one index array, an embedding's lookup)
    run the gather_axis kernel (``cuda/indexing.py``'s ``gather``) for every element dtype,
    bfloat16's bits too, and strided inputs."""
    shape, axis, n_ax, dt, it, transposed, seed = c
    a, _, ax = _inputs(c)
    rng = np.random.default_rng(seed + 2)
    lo = 0 if INDEX[it][1](0).dtype.kind == "u" else -shape[ax]
    idx = rng.integers(lo, shape[ax], (n_ax, 2)[: 1 + seed % 2])
    t, npt = DTYPES[dt]
    host = a.astype(npt)
    ma = mx.array(np.ascontiguousarray(np.swapaxes(host, 0, -1)) if transposed else host).astype(t)
    if transposed:
        ma = mx.swapaxes(ma, 0, -1)
    mi = mx.array(idx.astype(INDEX[it][1]), dtype=INDEX[it][0])
    mx.eval(ma, mi)
    with kernel_launches("cuda") as rec:
        out = mx.take(ma, mi, axis=axis)
        mx.eval(out)
    wide = dt in ("bfloat16", "float16")
    values = np.array(ma.astype(mx.float32)) if wide else np.array(ma)
    want = np.take(values, np.where(idx < 0, idx + shape[ax], idx), axis=ax)
    got = np.array(out.astype(mx.float32)) if wide else np.array(out)
    np.testing.assert_array_equal(got, want)
    assert "Gather" in rec.primitives, rec.fallbacks


@pytest.mark.usefixtures("gpu_default_device")
def test_a_gathers_index_out_of_bounds_on_the_gpu_raises_numpys_error():
    """The one-index Gather's check names the array's axis, not its walk's; the rule's first
    call and the plan launched from C alike."""
    w = mx.array(np.arange(12, dtype=np.float32).reshape(3, 4))
    for axis, size in ((0, 3), (1, 4)):
        for _ in range(2):
            out = mx.take(w, mx.array(np.array([[0, 2], [size, 1]], np.int32)), axis=axis)
            with pytest.raises(IndexError, match=f"index {size} is out of bounds for axis {axis} "
                                                 f"with size {size}"):
                mx.eval(out)
    ok = mx.take(w, mx.array(np.array([-1, 0], np.int32)), axis=1)
    np.testing.assert_array_equal(np.array(ok), np.take(np.arange(12).reshape(3, 4), [3, 0], axis=1))
