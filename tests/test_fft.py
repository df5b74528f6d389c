"""mx.fft: transforms against numpy.fft (values, shapes, complex64/float32 outputs), errors vs MLX."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from mlx_compare import outcome
from conftest import requires_mlx

F = mx.fft


def _rand(shape, seed, cplx=False):
    r = np.random.default_rng(seed)
    x = r.standard_normal(shape).astype(np.float32)
    if cplx:
        x = (x + 1j * r.standard_normal(shape)).astype(np.complex64)
    return x


shapes = st.lists(st.integers(2, 6), min_size=1, max_size=3).map(tuple)  # irfft needs >= 2


@given(shape=shapes, data=st.data(), norm=st.sampled_from(["backward", "ortho", "forward"]))
@settings(max_examples=50, deadline=None)
def test_one_dimensional_transforms_match_numpy(shape, data, norm):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = data.draw(st.one_of(st.none(), st.integers(1, 8)))
    x, c = _rand(shape, 0), _rand(shape, 1, cplx=True)
    for name, inp in [("fft", c), ("ifft", c), ("rfft", x)]:
        got = getattr(F, name)(mx.array(inp), n=n, axis=axis, norm=norm)
        want = getattr(np.fft, name)(inp, n=n, axis=axis, norm=norm)
        assert got.dtype == mx.complex64 and got.shape == want.shape
        np.testing.assert_allclose(np.array(got), want, rtol=1e-3, atol=1e-4)
    got = F.irfft(mx.array(c), n=n, axis=axis, norm=norm)
    want = np.fft.irfft(c, n=n, axis=axis, norm=norm)
    assert got.dtype == mx.float32 and got.shape == want.shape
    np.testing.assert_allclose(np.array(got), want, rtol=1e-3, atol=1e-4)


@given(shape=st.lists(st.integers(2, 5), min_size=2, max_size=3).map(tuple), data=st.data())
@settings(max_examples=40, deadline=None)
def test_multi_dimensional_transforms_match_numpy(shape, data):
    nd = len(shape)
    axes = data.draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=nd,
                              unique_by=lambda a: a % nd))
    s = data.draw(st.one_of(st.none(), st.lists(st.integers(1, 6), min_size=len(axes), max_size=len(axes))))
    x, c = _rand(shape, 2), _rand(shape, 3, cplx=True)
    for name, inp in [("fftn", c), ("ifftn", c), ("rfftn", x), ("irfftn", c)]:
        got = getattr(F, name)(mx.array(inp), s=s, axes=axes)
        want = getattr(np.fft, name)(inp, s=s, axes=axes)
        assert got.shape == want.shape
        np.testing.assert_allclose(np.array(got), want, rtol=1e-3, atol=1e-3)
    for name, inp in [("fft2", c), ("ifft2", c), ("rfft2", x), ("irfft2", c)]:
        got = getattr(F, name)(mx.array(inp))
        want = getattr(np.fft, name)(inp)
        assert got.shape == want.shape
        np.testing.assert_allclose(np.array(got), want, rtol=1e-3, atol=1e-3)


def test_default_all_axes_and_integer_input():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(np.array(F.fftn(mx.array(x))), np.fft.fftn(x), rtol=1e-4, atol=1e-4)
    i = mx.arange(6) if hasattr(mx, "arange") else mx.array([0, 1, 2, 3, 4, 5])
    assert F.fft(i).dtype == mx.complex64
    np.testing.assert_allclose(np.array(F.fft(i)), np.fft.fft(np.arange(6)), rtol=1e-4, atol=1e-4)


def test_graph_has_fft_primitive_with_params():
    out = F.rfft(mx.array([1.0, 2.0, 3.0, 4.0]))
    assert out._d.node.primitive.name == "FFT"
    kw = out._d.node.primitive.kwargs()
    assert kw["axes"] == (0,) and kw["real"] is True and kw["inverse"] is False


@pytest.mark.skipif(not hasattr(mx, "roll"), reason="needs mx.roll")
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple), data=st.data())
@settings(max_examples=30, deadline=None)
def test_shifts_match_numpy(shape, data):
    nd = len(shape)
    axes = data.draw(st.one_of(st.none(), st.integers(-nd, nd - 1),
                               st.lists(st.integers(-nd, nd - 1), max_size=nd, unique_by=lambda a: a % nd)))
    x = _rand(shape, 4)
    np.testing.assert_array_equal(np.array(F.fftshift(mx.array(x), axes)), np.fft.fftshift(x, axes))
    np.testing.assert_array_equal(np.array(F.ifftshift(mx.array(x), axes)), np.fft.ifftshift(x, axes))


ERRORS = [
    "fft.fft(X, n=0)", "fft.fft(X, n=-1)", "fft.fft(X, axis=2)", "fft.fft(M.array(1.0))",
    "fft.fft2(X, s=(2,))", "fft.fftn(X, axes=(0, 0))", "fft.fftn(X, s=(5,))", "fft.irfftn(X, s=(3, 5))",
    "fft.fft(X, norm='bad')", "fft.fftshift(X, axes=(3,))", "fft.ifftshift(X, axes=(-3,))",
    "fft.fftn(M.array(1.0))", "fft.fftn(X, s=(2, 3), axes=(0,))", "fft.fft(M.zeros((0,)))",
]


def _outcome(mod, expr):
    return outcome(mod, "M." + expr, X=lambda m: m.zeros((3, 4)))


@requires_mlx
@pytest.mark.parametrize("expr", ERRORS)
def test_errors_match_mlx(mlx, expr):
    want = _outcome(mlx, expr)
    assert want is not None
    assert _outcome(mx, expr) == want
