"""Rule for MLX's ``FFT`` primitive: forward / inverse, complex or real, over given axes."""

from __future__ import annotations

from ..primitives import FFT, define


@define("FFT", family=FFT)
def fft(xp, a, *, axes, inverse, real, out_shape):
    """Unnormalized-forward FFT of ``a`` over ``axes`` (``xp.fft``, "backward" norm).

    ``real`` and not ``inverse``: rfftn (the last axis keeps n // 2 + 1 bins).
    ``real`` and ``inverse``: irfftn to ``out_shape``'s sizes on ``axes``.
    """
    axes = tuple(axes)
    if real and inverse:
        s = tuple(out_shape[ax] for ax in axes)
        return xp.fft.irfftn(a, s=s, axes=axes)
    if real:
        return xp.fft.rfftn(a, axes=axes)
    if inverse:
        return xp.fft.ifftn(a, axes=axes)
    return xp.fft.fftn(a, axes=axes)
