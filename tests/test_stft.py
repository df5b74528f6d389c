"""mx.fft.stft / istft against MLX 0.32 over hypothesis inputs (sizes, hops, windows, padding,
norms, sidedness, batch shapes), and their errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import tapescope.core as mx
from conftest import mlx_ref, requires_mlx
from mlx_compare import outcome


@st.composite
def cases(draw):
    n_fft = draw(st.integers(1, 12))
    hop = draw(st.one_of(st.none(), st.integers(1, n_fft + 2)))
    wl = draw(st.one_of(st.none(), st.integers(1, n_fft)))
    center = draw(st.booleans())
    mode = draw(st.sampled_from(["reflect", "constant", "edge"]))
    t = draw(st.integers(n_fft if not center else max(n_fft // 2 + 1, 1), 30))
    batch = draw(st.sampled_from([(), (2,), (2, 1)]))
    complex_in = draw(st.booleans())
    kw = dict(n_fft=n_fft, hop_length=hop, win_length=wl, center=center, pad_mode=mode,
              norm=draw(st.sampled_from(["backward", "ortho", "forward"])),
              onesided=draw(st.sampled_from([None, True, False])) if not complex_in else False)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal(batch + (t,)).astype(np.float32)
    if complex_in:
        x = (x + 1j * rng.standard_normal(x.shape)).astype(np.complex64)
    w = rng.uniform(0.5, 1.5, (wl or n_fft,)).astype(np.float32) if draw(st.booleans()) else None
    return x, w, kw


def _run(m, x, w, kw):
    return m.fft.stft(m.array(x), window=None if w is None else m.array(w), **kw)


@requires_mlx
@settings(max_examples=60)
@given(cases())
def test_stft_matches_mlx(case):
    x, w, kw = case
    src = "M.fft.stft(M.array(x), window=None if w is None else M.array(w), **kw)"
    names = dict(x=lambda m: x, w=lambda m: w, kw=lambda m: kw)
    want = outcome(mlx_ref, src, **names)
    assert outcome(mx, src, **names) == want
    if want is None:
        a, b = _run(mx, x, w, kw), _run(mlx_ref, x, w, kw)
        assert a.shape == b.shape and str(a.dtype) == str(b.dtype)
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-4)


@requires_mlx
@settings(max_examples=60)
@given(cases(), st.one_of(st.none(), st.integers(1, 40)))
def test_istft_of_stft_matches_mlx(case, length):
    x, w, kw = case
    kw.pop("pad_mode")
    kw["onesided"] = kw["onesided"] is not False
    try:
        spec = np.array(mlx_ref.fft.stft(mlx_ref.array(x), window=None if w is None else mlx_ref.array(w), **kw))
    except ValueError:  # no spectrum to invert (stft's own errors are tested above)
        reject()
    src = ("M.fft.istft(M.array(spec), window=None if w is None else M.array(w), length=length, "
           "**{k: v for k, v in kw.items()})")
    names = dict(spec=lambda m: spec, w=lambda m: w, length=lambda m: length, kw=lambda m: kw)
    want = outcome(mlx_ref, src, **names)
    assert outcome(mx, src, **names) == want
    if want is None:
        env = {"M": mx, "spec": spec, "w": w, "length": length, "kw": kw}
        a = eval(src, env)
        b = eval(src, {**env, "M": mlx_ref})
        assert a.shape == b.shape and str(a.dtype) == str(b.dtype)
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-3, atol=1e-3)


@requires_mlx
@pytest.mark.parametrize("src", [
    "M.fft.stft(M.zeros((40,)), n_fft=8, pad_mode='foo')",
    "M.fft.stft(M.zeros((40,)), n_fft=8, norm='foo')", "M.fft.stft(M.zeros((40,)), n_fft=0)",
    "M.fft.stft(M.zeros((40,)), n_fft=8, hop_length=0)",
    "M.fft.stft(M.zeros((40,)), n_fft=8, win_length=9)",
    "M.fft.stft(M.zeros((5,)), n_fft=8, center=False)", "M.fft.stft(M.zeros(()), n_fft=8)",
    "M.fft.stft(M.zeros((40,)), n_fft=8, window=M.ones((2, 2)))",
    "M.fft.istft(M.zeros((5,)))", "M.fft.istft(M.zeros((5, 3)), norm='x')",
    "M.fft.stft(M.zeros((40,), M.int32), n_fft=8)", "M.fft.istft(M.zeros((5, 3)), n_fft=8)",
])
def test_errors_and_edge_calls_match_mlx(src):
    got, want = outcome(mx, src), outcome(mlx_ref, src)
    assert got == want
    if want is None:
        a, b = eval(src, {"M": mx}), eval(src, {"M": mlx_ref})
        assert a.shape == b.shape and str(a.dtype) == str(b.dtype)


def test_round_trip_recovers_the_signal():
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    w = mx.array(np.hanning(17)[1:].astype(np.float32))
    y = mx.fft.istft(mx.fft.stft(mx.array(x), n_fft=16, hop_length=4, window=w), n_fft=16,
                     hop_length=4, window=w, length=64)
    np.testing.assert_allclose(np.array(y), x, rtol=1e-4, atol=1e-4)
