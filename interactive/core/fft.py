"""``mx.fft``: discrete Fourier transforms as one ``FFT`` primitive (axes, inverse, real).

Inputs are first cut (Slice) or zero-padded (Pad) to the requested sizes and cast to
complex64 (float32 for a forward real transform), as MLX's ``fft_impl`` does. The
primitive computes numpy's "backward" convention; other ``norm`` modes multiply after it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

from . import dtypes as _dt
from .array import array
from .device import StreamOrDevice, resolve_stream
from .ops.convert import cast, to_array
from .primitive import Primitive

__all__ = ["fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2",
           "rfftn", "irfftn", "fftshift", "ifftshift"]


_NORMS = ("backward", "ortho", "forward")


def _ops():
    """The op namespace, imported at call time (other op families land independently)."""
    from . import ops

    return ops


def _fmt(seq: Sequence[int]) -> str:
    return "(" + ",".join(str(int(v)) for v in seq) + ")"


def _size_of(a: array, ax: int) -> int:
    """``a.shape[ax]`` with MLX's error for an axis out of range."""
    if not -a.ndim <= ax < a.ndim:
        raise IndexError("SmallVector out of range.")
    return a.shape[ax]


def _fft_impl(a: array, n: Sequence[int], axes: Sequence[int], real: bool, inverse: bool,
              norm: str, s) -> array:
    """MLX's ``fft_impl``: validate, slice / pad to ``n``, cast, one FFT node, then scale."""
    ops = _ops()
    if norm not in _NORMS:
        raise ValueError("[fft] Invalid norm. Expected one of {'backward', 'ortho', 'forward'}.")
    if a.ndim < 1:
        raise ValueError("[fftn] Requires array with at least one dimension.")
    n, axes = [int(v) for v in n], [int(v) for v in axes]
    if len(n) != len(axes):
        raise ValueError("[fftn] Shape and axes have different sizes.")
    if not axes:
        return a
    valid = [ax + a.ndim if ax < 0 else ax for ax in axes]
    if len(set(valid)) != len(valid):
        raise ValueError(f"[fftn] Duplicated axis received {_fmt(axes)}")
    if min(valid) < 0 or max(valid) >= a.ndim:
        raise ValueError(f"[fftn] Invalid axis received for array with {a.ndim} dimensions.")
    if any(v <= 0 for v in n):
        raise ValueError(f"[fftn] Invalid FFT output size requested {_fmt(n)}")
    in_shape = list(a.shape)
    for ax, v in zip(valid, n):
        in_shape[ax] = v
    if real and inverse:
        in_shape[valid[-1]] = n[-1] // 2 + 1
    x = a
    if any(i < d for i, d in zip(in_shape, a.shape)):
        x = x[tuple(slice(0, min(i, d)) for i, d in zip(in_shape, a.shape))]
    if any(i > d for i, d in zip(in_shape, x.shape)):
        pads = [(0, max(0, i - d)) for i, d in zip(in_shape, x.shape)]
        x = ops.pad(x, pads, stream=s)
    out_shape = list(in_shape)
    if real:
        out_shape[valid[-1]] = n[-1] if inverse else in_shape[valid[-1]] // 2 + 1
    in_type = _dt.float32 if real and not inverse else _dt.complex64
    out_type = _dt.float32 if real and inverse else _dt.complex64
    prim = Primitive("FFT", s, axes=tuple(valid), inverse=bool(inverse), real=bool(real),
                     out_shape=tuple(out_shape))
    out = array._make([tuple(out_shape)], [out_type], prim, [cast(x, in_type, s)])[0]
    if norm == "backward":
        return out
    total = math.prod(n)
    factor = math.sqrt(total) if norm == "ortho" else float(total)
    scale = factor if inverse else 1.0 / factor
    return ops.multiply(out, array(scale, _dt.float32), stream=s)


def _one(a, n, axis, real, inverse, norm, stream, default_n=None) -> array:
    a = to_array(a)
    s = resolve_stream(stream)
    size = _size_of(a, axis)
    if n is None:
        n = default_n(size) if default_n else size
    return _fft_impl(a, [n], [axis], real, inverse, norm, s)


def _many(name: str, a, s_, axes, real, inverse, norm, stream) -> array:
    a = to_array(a)
    st = resolve_stream(stream)
    if axes is None:
        if s_ is not None:
            raise ValueError(f"[{name}] `axes` should not be `None` if `s` is not `None`.")
        axes = list(range(a.ndim))
    axes = [int(v) for v in axes]
    if s_ is None:
        n = [_size_of(a, ax) for ax in axes]
        if real and inverse and n:
            n[-1] = 2 * (n[-1] - 1)
    else:
        n = [int(v) for v in s_]
    return _fft_impl(a, n, axes, real, inverse, norm, st)


def fft(a: array, n: Optional[int] = None, axis: int = -1, norm: str = "backward",
        stream: StreamOrDevice = None) -> array:
    """One dimensional discrete Fourier transform."""
    return _one(a, n, axis, False, False, norm, stream)


def ifft(a: array, n: Optional[int] = None, axis: int = -1, norm: str = "backward",
         stream: StreamOrDevice = None) -> array:
    """One dimensional inverse discrete Fourier transform."""
    return _one(a, n, axis, False, True, norm, stream)


def rfft(a: array, n: Optional[int] = None, axis: int = -1, norm: str = "backward",
         stream: StreamOrDevice = None) -> array:
    """One dimensional FFT of a real input (``n // 2 + 1`` output bins)."""
    return _one(a, n, axis, True, False, norm, stream)


def irfft(a: array, n: Optional[int] = None, axis: int = -1, norm: str = "backward",
          stream: StreamOrDevice = None) -> array:
    """Inverse of ``rfft``: real output of length ``n`` (default ``2 * (m - 1)``)."""
    return _one(a, n, axis, True, True, norm, stream, default_n=lambda m: 2 * (m - 1))


def fft2(a: array, s: Optional[Sequence[int]] = None,
         axes: Optional[Sequence[int]] = [-2, -1], norm: str = "backward",
         stream: StreamOrDevice = None) -> array:
    """Two dimensional discrete Fourier transform."""
    return _many("fft2", a, s, axes, False, False, norm, stream)


def ifft2(a: array, s: Optional[Sequence[int]] = None,
          axes: Optional[Sequence[int]] = [-2, -1], norm: str = "backward",
          stream: StreamOrDevice = None) -> array:
    """Two dimensional inverse discrete Fourier transform."""
    return _many("ifft2", a, s, axes, False, True, norm, stream)


def fftn(a: array, s: Optional[Sequence[int]] = None, axes: Optional[Sequence[int]] = None,
         norm: str = "backward", stream: StreamOrDevice = None) -> array:
    """N-dimensional discrete Fourier transform (all axes by default)."""
    return _many("fftn", a, s, axes, False, False, norm, stream)


def ifftn(a: array, s: Optional[Sequence[int]] = None, axes: Optional[Sequence[int]] = None,
          norm: str = "backward", stream: StreamOrDevice = None) -> array:
    """N-dimensional inverse discrete Fourier transform."""
    return _many("ifftn", a, s, axes, False, True, norm, stream)


def rfft2(a: array, s: Optional[Sequence[int]] = None,
          axes: Optional[Sequence[int]] = [-2, -1], norm: str = "backward",
          stream: StreamOrDevice = None) -> array:
    """Two dimensional real discrete Fourier transform."""
    return _many("rfft2", a, s, axes, True, False, norm, stream)


def irfft2(a: array, s: Optional[Sequence[int]] = None,
           axes: Optional[Sequence[int]] = [-2, -1], norm: str = "backward",
           stream: StreamOrDevice = None) -> array:
    """Inverse of ``rfft2``."""
    return _many("irfft2", a, s, axes, True, True, norm, stream)


def rfftn(a: array, s: Optional[Sequence[int]] = None, axes: Optional[Sequence[int]] = None,
          norm: str = "backward", stream: StreamOrDevice = None) -> array:
    """N-dimensional real discrete Fourier transform."""
    return _many("rfftn", a, s, axes, True, False, norm, stream)


def irfftn(a: array, s: Optional[Sequence[int]] = None, axes: Optional[Sequence[int]] = None,
           norm: str = "backward", stream: StreamOrDevice = None) -> array:
    """Inverse of ``rfftn``."""
    return _many("irfftn", a, s, axes, True, True, norm, stream)


def _shift(name: str, a, axes, sign: int, stream) -> array:
    a = to_array(a)
    s = resolve_stream(stream)
    if axes is None:
        axes = list(range(a.ndim))
    elif isinstance(axes, int):
        axes = [axes]
    axes = [int(v) for v in axes]
    if not axes or a.ndim == 0:
        return a
    valid = []
    for ax in axes:
        v = ax + a.ndim if ax < 0 else ax
        if not 0 <= v < a.ndim:
            raise IndexError(f"[{name}] Invalid axis {ax} for array with {a.ndim} dimensions.")
        valid.append(v)
    shifts = [sign * (a.shape[v] // 2) for v in valid]
    return _ops().roll(a, tuple(shifts), tuple(valid), stream=s)


def fftshift(a: array, axes: Union[int, Sequence[int], None] = None,
             stream: StreamOrDevice = None) -> array:
    """Shift the zero-frequency term to the center (roll by ``n // 2`` on each axis)."""
    return _shift("fftshift", a, axes, 1, stream)


def ifftshift(a: array, axes: Union[int, Sequence[int], None] = None,
              stream: StreamOrDevice = None) -> array:
    """Inverse of ``fftshift`` (roll by ``-(n // 2)`` on each axis)."""
    return _shift("ifftshift", a, axes, -1, stream)


# -- sample frequencies (appended by the MLX-surface gap filler) -----------------------------
__all__ += ["fftfreq", "rfftfreq"]


def _freq_args(name: str, n: int, d: float) -> float:
    """MLX's checks on ``n`` and ``d``; the spacing scale ``1 / (n * d)``."""
    if not isinstance(n, int) or not isinstance(d, (int, float)):
        raise TypeError(f"{name}(): incompatible function arguments. The following argument "
                        "types are supported:\n    1. "
                        f"{name}(n: int, d: float = 1.0, stream: mlx.core.Stream | "
                        "mlx.core.ThreadLocalStream | mlx.core.Device | mlx.core.DeviceType | "
                        "None = None) -> mlx.core.array\n\nInvoked with types: "
                        f"{type(n).__name__}" + ("" if isinstance(d, (int, float))
                                                  else f", {type(d).__name__}"))
    if n <= 0:
        raise ValueError(f"[{name}] `n` must be greater than 0.")
    if d == 0:
        raise ValueError(f"[{name}] `d` must be non-zero.")
    return 1.0 / (n * d)


def fftfreq(n: int, d: float = 1.0, stream: StreamOrDevice = None) -> array:
    """The FFT sample frequencies ``[0, 1, ..., -2, -1] / (n * d)`` (float32)."""
    scale = _freq_args("fftfreq", n, d)
    ops = _ops()
    s = resolve_stream(stream)
    pos = ops.arange(0, (n - 1) // 2 + 1, dtype=_dt.float32, stream=s)
    neg = ops.arange(-(n // 2), 0, dtype=_dt.float32, stream=s)
    return ops.multiply(ops.concatenate([pos, neg], stream=s), array(scale, _dt.float32),
                        stream=s)


def rfftfreq(n: int, d: float = 1.0, stream: StreamOrDevice = None) -> array:
    """The rfft sample frequencies ``[0, 1, ..., n // 2] / (n * d)`` (float32)."""
    scale = _freq_args("rfftfreq", n, d)
    ops = _ops()
    s = resolve_stream(stream)
    return ops.multiply(ops.arange(0, n // 2 + 1, dtype=_dt.float32, stream=s),
                        array(scale, _dt.float32), stream=s)


from .stft import istft, stft  # noqa: E402,F401  (composed from the ops above)
