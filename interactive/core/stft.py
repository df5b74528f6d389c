"""``mx.fft.stft`` and ``mx.fft.istft`` (MLX 0.32), composed from existing primitives: a gather
of the frames, a multiply by the window, an (r)fft over each frame; the inverse overlap-adds
the windowed frames with a scatter-add and divides by the squared-window envelope (at least
1e-8, as MLX does); a two-sided inverse keeps the real part, as MLX."""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import dtypes as _dt
from .array import array
from .device import StreamOrDevice, resolve_stream
from .ops.convert import to_array

_NORMS = ("backward", "ortho", "forward")
_NORM_ERR = "Invalid norm. Expected one of {'backward', 'ortho', 'forward'}."


def _window(name: str, window: Optional[array], win_length: int, n_fft: int, s) -> array:
    """The window, zero-padded (centred) to ``n_fft``; rectangular when None."""
    from . import ops

    w = ops.ones((win_length,), stream=s) if window is None else to_array(window)
    if w.ndim != 1:
        raise ValueError(f"[{name}] window must be a one-dimensional array.")
    if w.shape[0] > n_fft:
        raise ValueError(f"[{name}] window length must not exceed n_fft.")
    left = (n_fft - w.shape[0]) // 2
    if left or w.shape[0] != n_fft:
        w = ops.pad(w, [(left, n_fft - w.shape[0] - left)], stream=s)
    return w


def _frame_index(n_frames: int, n_fft: int, hop: int) -> np.ndarray:
    return (np.arange(n_frames)[:, None] * hop + np.arange(n_fft)[None, :]).astype(np.int32)


def stft(x: array, n_fft: int = 2048, hop_length: Optional[int] = None,
         win_length: Optional[int] = None, window: Optional[array] = None, center: bool = True,
         pad_mode: str = "reflect", norm: str = "backward", onesided: Optional[bool] = None,
         stream: StreamOrDevice = None) -> array:
    """Short-Time Fourier Transform: output shape ``(..., n_freq, n_frames)``, complex."""
    from . import fft as _fft
    from . import ops

    x = to_array(x)
    s = resolve_stream(stream)
    if x.ndim < 1:
        raise ValueError("[stft] Input must have at least one dimension.")
    if n_fft <= 0:
        raise ValueError("[stft] n_fft must be positive.")
    hop = n_fft // 4 if hop_length is None else hop_length
    if hop <= 0:
        raise ValueError("[stft] hop_length must be positive.")
    wl = n_fft if win_length is None else win_length
    if wl > n_fft:
        raise ValueError("[stft] window length must not exceed n_fft.")
    if norm not in _NORMS:
        raise ValueError(f"[stft] {_NORM_ERR}")
    w = _window("stft", window, wl, n_fft, s)
    if center:
        if pad_mode not in ("reflect", "constant", "edge"):
            raise ValueError(f"Invalid padding mode ({pad_mode}) passed to pad")
        p = n_fft // 2
        if pad_mode == "constant":
            x = ops.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, p)], stream=s)
        else:  # a gather of reflected / repeated-edge positions (numpy's index rule)
            idx = np.pad(np.arange(x.shape[-1]), p, mode=pad_mode).astype(np.int32)
            x = ops.take(x, array(idx), axis=-1, stream=s)
    t = x.shape[-1]
    if t < n_fft:
        raise ValueError("[stft] Input is too short for the given n_fft.")
    n_frames = 1 + (t - n_fft) // hop
    frames = ops.take(x, array(_frame_index(n_frames, n_fft, hop)), axis=-1, stream=s)
    frames = ops.multiply(frames, w, stream=s)
    if onesided is None:
        onesided = x.dtype != _dt.complex64
    f = (_fft.rfft if onesided else _fft.fft)(frames, axis=-1, norm=norm, stream=s)
    return ops.swapaxes(f, -1, -2, stream=s)


def istft(stft_matrix: array, n_fft: Optional[int] = None, hop_length: Optional[int] = None,
          win_length: Optional[int] = None, window: Optional[array] = None, center: bool = True,
          norm: str = "backward", onesided: Optional[bool] = None, length: Optional[int] = None,
          stream: StreamOrDevice = None) -> array:
    """Inverse Short-Time Fourier Transform: overlap-add of the windowed inverse frames,
    divided by the squared-window envelope."""
    from . import fft as _fft
    from . import ops

    m = to_array(stft_matrix)
    s = resolve_stream(stream)
    if m.ndim < 2:
        raise ValueError("[istft] Input must have at least two dimensions (freq, frames).")
    onesided = True if onesided is None else onesided  # None: one-sided, as MLX
    n_freq, n_frames = m.shape[-2], m.shape[-1]
    if n_fft is None:
        n_fft = 2 * (n_freq - 1) if onesided else n_freq
    if n_fft <= 0:
        raise ValueError("[istft] n_fft must be positive.")
    hop = n_fft // 4 if hop_length is None else hop_length
    if hop <= 0:
        raise ValueError("[istft] hop_length must be positive.")
    wl = n_fft if win_length is None else win_length
    if wl > n_fft:
        raise ValueError("[istft] window length must not exceed n_fft.")
    if norm not in _NORMS:
        raise ValueError(f"[istft] {_NORM_ERR}")
    w = _window("istft", window, wl, n_fft, s)
    frames = ops.swapaxes(m, -1, -2, stream=s)
    frames = (_fft.irfft(frames, n=n_fft, axis=-1, norm=norm, stream=s) if onesided
              else ops.real(_fft.ifft(frames, n=n_fft, axis=-1, norm=norm, stream=s), stream=s))
    frames = ops.multiply(frames, w, stream=s)
    t = n_fft + hop * (n_frames - 1)
    idx = array(_frame_index(n_frames, n_fft, hop).reshape(-1))
    batch = frames.shape[:-2]
    flat = ops.reshape(frames, batch + (n_frames * n_fft,), stream=s)
    y = ops.zeros(batch + (t,), flat.dtype, stream=s).at[..., idx].add(flat)
    w2 = ops.broadcast_to(ops.square(w, stream=s), (n_frames, n_fft), stream=s)
    env = ops.zeros((t,), w2.dtype, stream=s).at[idx].add(ops.reshape(w2, (-1,), stream=s))
    y = ops.divide(y, ops.maximum(env, 1e-8, stream=s), stream=s)
    start = n_fft // 2 if center else 0
    stop = t - start if length is None else start + length
    y = y[..., start:min(stop, t)]
    if y.shape[-1] < stop - start:
        y = ops.pad(y, [(0, 0)] * (y.ndim - 1) + [(0, stop - start - y.shape[-1])], stream=s)
    return y
