"""``mx.random``: counter-based random numbers with MLX's explicit-key semantics.

A key is a uint32 array of shape ``(2,)``. Every sampler draws its bits from one
``RandomBits`` node (a threefry2x32 hash of the key and a counter, see
``tapescope.kernels.rules.random``) and shapes them with ordinary elementwise ops, exactly as
MLX builds them, so the same key always gives the same numbers and the graph shows MLX's
primitives. Without a ``key=`` the global key (``state[0]``, the calling thread's: see
``random_state.py``) is split: one half becomes the new global key, the other is used, so
the global key advances once per call.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import dtypes as _dt
from .array import array
from .device import StreamOrDevice, resolve_stream
from .ops.convert import broadcast_shapes, cast, to_array
from .primitive import Primitive
from .random_state import key_array, set_thread_key, state, thread_key

__all__ = ["key", "seed", "split", "uniform", "normal", "randint", "bernoulli",
           "truncated_normal", "categorical", "gumbel", "permutation", "laplace",
           "multivariate_normal", "state"]


_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


def _ops():
    """The op namespace, imported at call time (other op families land independently)."""
    from . import ops

    return ops


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(int(s)) for s in shape) + ")"


def _check_seed(seed: Any, fn: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= _U64_MAX:
        raise TypeError(
            f"{fn}(): incompatible function arguments. The following argument types are "
            f"supported:\n    1. {fn}(seed: int) -> "
            f"{'mlx.core.array' if fn == 'key' else 'None'}\n\n"
            f"Invoked with types: {type(seed).__name__}")
    return int(seed)


def _shape(shape: Sequence[int]) -> tuple:
    return tuple(int(s) for s in shape)


def _check_dtype(dtype: Any, op: str) -> _dt.Dtype:
    if not isinstance(dtype, _dt.Dtype):
        raise TypeError(f"[{op}] Expected dtype to be mlx.core.Dtype, got {type(dtype).__name__}.")
    return dtype


def key(seed: int) -> array:
    """A PRNG key from a seed: ``[seed >> 32, seed & 0xffffffff]`` as uint32."""
    return key_array(_check_seed(seed, "key"))


def seed(seed: int) -> None:
    """Seed the global PRNG (the calling thread's key)."""
    set_thread_key(key_array(_check_seed(seed, "seed")))


def _check_key(k: Any) -> array:
    if not isinstance(k, array):
        raise TypeError(f"[bits] Expected key to be an array, got {type(k).__name__}.")
    if k.dtype != _dt.uint32:
        raise ValueError(f"[bits] Expected key type uint32 but received {k.dtype.name}.")
    if k.shape != (2,):
        raise ValueError(f"[bits] Expected key shape (2) but received {_fmt_shape(k.shape)}.")
    return k


def _bits(shape: Sequence[int], width: int, k: array, s) -> array:
    """Record a RandomBits node: ``shape`` values of ``width`` bytes from key ``k``."""
    dtype = {1: _dt.uint8, 2: _dt.uint16, 4: _dt.uint32}[width]
    shape = _nonnegative(_shape(shape))
    return array._make([shape], [dtype], Primitive("RandomBits", s, shape=shape, width=width), [k])[0]


def _split2(k: array, s) -> tuple[array, array]:
    """MLX's ``split(key)`` pair: split into two, then each row reshaped to ``(2,)``."""
    ops = _ops()
    both = _bits((2, 2), 4, k, s)
    a, b = ops.split(both, 2, stream=s)
    return ops.reshape(a, (2,), stream=s), ops.reshape(b, (2,), stream=s)


def _nonnegative(shape: tuple) -> tuple:
    """MLX's ``bits`` check, made before it draws the global key (which then stays as it was)."""
    if any(d < 0 for d in shape):
        raise ValueError("[bits] Negative dimensions not allowed.")
    return shape


def _next_key(k: Optional[array], s, shape: tuple) -> array:
    """The key to draw ``shape`` bits with: ``k`` itself (checked), or the global key's next
    split."""
    _nonnegative(shape)
    if k is not None:
        return _check_key(k)
    new, out = _split2(thread_key(), s)
    set_thread_key(new)
    return out


def split(key: array, num: int = 2, stream: StreamOrDevice = None) -> array:
    """Split a PRNG key into ``num`` sub keys (shape ``(num, 2)``)."""
    k = _check_key(key)
    return _bits((int(num), 2), 4, k, resolve_stream(stream))


def _below_one(dtype: _dt.Dtype) -> float:
    """The largest value below 1.0 in ``dtype`` (as float32), for a half-open interval."""
    if dtype == _dt.float32:
        return float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    if dtype == _dt.float16:
        return float(np.nextafter(np.float16(1.0), np.float16(0.0)))
    if dtype == _dt.bfloat16:
        one = np.array(1.0, dtype=_dt.bfloat16.np).view(np.uint16) - np.uint16(1)
        return float(np.array(one, dtype=np.uint16).view(_dt.bfloat16.np).astype(np.float32))
    raise RuntimeError("[uniform] Unsupported type.")


def _uniform(lo: array, hi: array, shape: tuple, dtype: _dt.Dtype, k: Optional[array], s) -> array:
    """MLX's ``random::uniform`` on arrays: bits / UINT32_MAX, clipped below 1, scaled."""
    ops = _ops()
    if not _dt.issubdtype(dtype, _dt.floating):
        raise ValueError("[uniform] Can only generate uniform numbers with real floating point type.")
    range_shape = broadcast_shapes(lo.shape, hi.shape)
    out_shape = broadcast_shapes(shape, range_shape)
    if out_shape != shape:
        raise ValueError(f"[uniform] Cannot generate random values of shape {_fmt_shape(shape)} "
                         f"from broadcasted shape {_fmt_shape(out_shape)}.")
    upper = _below_one(dtype)
    k = _next_key(k, s, shape)
    lo = cast(lo, dtype, s)
    hi = cast(hi, dtype, s)
    rng = ops.subtract(hi, lo, stream=s)
    maxval = array(float(_U32_MAX), _dt.float32)
    out = ops.divide(_bits(shape, 4, k, s), maxval, stream=s)
    out = cast(ops.minimum(out, array(upper, _dt.float32), stream=s), dtype, s)
    return ops.add(ops.multiply(rng, out, stream=s), lo, stream=s)


def uniform(low: Union[float, array] = 0, high: Union[float, array] = 1, shape: Sequence[int] = [],
            dtype: Optional[_dt.Dtype] = _dt.float32, key: Optional[array] = None,
            stream: StreamOrDevice = None) -> array:
    """Uniform random numbers in the half-open interval ``[low, high)``."""
    dtype = _check_dtype(_dt.float32 if dtype is None else dtype, "uniform")
    s = resolve_stream(stream)
    if key is not None:
        _check_key(key)
    return _uniform(to_array(low), to_array(high), _shape(shape), dtype, key, s)


def _normal(shape: tuple, dtype: _dt.Dtype, loc: Optional[array], scale: Optional[array],
            k: Optional[array], s) -> array:
    """MLX's ``random::normal``: sqrt(2) * erfinv(uniform(-1, 1)) * scale + loc."""
    ops = _ops()
    low = array(float(np.nextafter(np.float32(-1.0), np.float32(0.0))), _dt.float32)
    high = array(1.0, _dt.float32)
    if dtype == _dt.complex64:
        samples = ops.erfinv(_uniform(low, high, shape + (2,), _dt.float32, k, s), stream=s)
        if hasattr(ops, "view"):
            samples = ops.squeeze(ops.view(samples, _dt.complex64, stream=s), -1, stream=s)
        else:  # until mx.view lands: real + 1j * imag from the same two float32 draws
            re, im = ops.split(samples, 2, -1, stream=s)
            samples = ops.squeeze(ops.add(cast(re, _dt.complex64, s), ops.multiply(
                cast(im, _dt.complex64, s), array(1j, _dt.complex64), stream=s), stream=s),
                -1, stream=s)
        if scale is not None:
            samples = ops.multiply(scale, samples, stream=s)
        if loc is not None:
            samples = ops.add(loc, samples, stream=s)
        return samples
    samples = _uniform(low, high, shape, _dt.float32, k, s)
    applied_scale = array(math.sqrt(2.0), dtype)
    if scale is not None:
        applied_scale = ops.multiply(applied_scale, cast(scale, dtype, s), stream=s)
    samples = cast(ops.erfinv(samples, stream=s), dtype, s)
    samples = ops.multiply(applied_scale, samples, stream=s)
    if loc is not None:
        samples = ops.add(cast(loc, dtype, s), samples, stream=s)
    return samples


def normal(shape: Sequence[int] = [], dtype: Optional[_dt.Dtype] = _dt.float32,
           loc: Union[float, array, None] = None, scale: Union[float, array, None] = None,
           key: Optional[array] = None, stream: StreamOrDevice = None) -> array:
    """Normally distributed random numbers with mean ``loc`` and standard deviation ``scale``."""
    dtype = _check_dtype(_dt.float32 if dtype is None else dtype, "normal")
    if dtype != _dt.complex64 and not _dt.issubdtype(dtype, _dt.floating):
        raise ValueError("[normal] Only floating point and complex64 types are supported.")
    s = resolve_stream(stream)
    if key is not None:
        _check_key(key)
    loc = None if loc is None else to_array(loc)
    scale = None if scale is None else to_array(scale)
    shape = _shape(shape)
    # The broadcast of the samples with loc / scale must be valid before anything is recorded.
    if loc is not None:
        broadcast_shapes(loc.shape, shape if scale is None else broadcast_shapes(scale.shape, shape))
    elif scale is not None:
        broadcast_shapes(scale.shape, shape)
    return _normal(shape, dtype, loc, scale, key, s)


def randint(low: Union[int, array], high: Union[int, array], shape: Sequence[int] = [],
            dtype: Optional[_dt.Dtype] = _dt.int32, key: Optional[array] = None,
            stream: StreamOrDevice = None) -> array:
    """Random integers sampled uniformly from ``[low, high)``."""
    ops = _ops()
    dtype = _check_dtype(_dt.int32 if dtype is None else dtype, "randint")
    if _dt.issubdtype(dtype, _dt.inexact):
        raise ValueError("[randint] randint only accepts integer dtypes and bool.")
    s = resolve_stream(stream)
    if key is not None:
        _check_key(key)
    low, high = to_array(low), to_array(high)
    u = _uniform(low, high, _shape(shape), _dt.float32, key, s)
    out = cast(ops.floor(u, stream=s), dtype, s)
    # As MLX (mlx/random.cpp): low / high may not be exact in float32, so clamp the samples
    # to [low, high - 1], each bound computed in its own dtype and then cast.
    hi = cast(ops.subtract(high, array(1, high.dtype), stream=s), dtype, s)
    return ops.maximum(ops.minimum(out, hi, stream=s), cast(low, dtype, s), stream=s)


def bernoulli(p: Union[float, array] = 0.5, shape: Optional[Sequence[int]] = None,
              key: Optional[array] = None, stream: StreamOrDevice = None) -> array:
    """Bernoulli samples (bool) with success probability ``p``."""
    ops = _ops()
    s = resolve_stream(stream)
    p = to_array(p)
    if not _dt.issubdtype(p.dtype, _dt.floating):
        raise ValueError("[bernoulli] bernoulli probability `p` must be a float type.")
    shape = p.shape if shape is None else _shape(shape)
    if key is not None:
        _check_key(key)
    if broadcast_shapes(shape, p.shape) != shape:
        raise ValueError("[bernoulli] shape of `p` is incompatible with argument `shape`.")
    k = _next_key(key, s, shape)
    # p on the scale [0, nextafter(UINT32_MAX)] so that p >= 1 is always true, p <= 0 never.
    upper = array(float(np.nextafter(np.float32(_U32_MAX), np.float32(np.inf))), _dt.float32)
    return ops.less(_bits(shape, 4, k, s), ops.multiply(p, upper, stream=s), stream=s)


def truncated_normal(lower: Union[float, array], upper: Union[float, array],
                     shape: Optional[Sequence[int]] = None,
                     dtype: Optional[_dt.Dtype] = _dt.float32, key: Optional[array] = None,
                     stream: StreamOrDevice = None) -> array:
    """Normal samples truncated to the domain ``(lower, upper)``."""
    ops = _ops()
    dtype = _check_dtype(_dt.float32 if dtype is None else dtype, "truncated_normal")
    if not _dt.issubdtype(dtype, _dt.floating):
        raise ValueError("[trunc_normal] trunc_normal only accepts floating point dtypes.")
    s = resolve_stream(stream)
    lower, upper = to_array(lower), to_array(upper)
    shape = broadcast_shapes(lower.shape, upper.shape) if shape is None else _shape(shape)
    if key is not None:
        _check_key(key)
    sqrt2 = array(math.sqrt(2.0), dtype)
    lower_t, upper_t = cast(lower, dtype, s), cast(upper, dtype, s)
    a = ops.erf(ops.divide(lower_t, sqrt2, stream=s), stream=s)
    b = ops.erf(ops.divide(upper_t, sqrt2, stream=s), stream=s)
    u = _uniform(a, b, shape, dtype, key, s)
    out = ops.multiply(sqrt2, ops.erfinv(u, stream=s), stream=s)
    return ops.maximum(ops.minimum(upper_t, out, stream=s), lower_t, stream=s)


def _gumbel(shape: tuple, dtype: _dt.Dtype, k: Optional[array], s) -> array:
    ops = _ops()
    u = _uniform(array(0.0, dtype), array(1.0, dtype), shape, dtype, k, s)
    return ops.negative(ops.log(ops.negative(ops.log(u, stream=s), stream=s), stream=s), stream=s)


def gumbel(shape: Sequence[int] = [], dtype: Optional[_dt.Dtype] = _dt.float32,
           key: Optional[array] = None, stream: StreamOrDevice = None) -> array:
    """Samples from the standard Gumbel distribution: ``-log(-log(uniform))``."""
    dtype = _check_dtype(_dt.float32 if dtype is None else dtype, "gumbel")
    s = resolve_stream(stream)
    if key is not None:
        _check_key(key)
    if not _dt.issubdtype(dtype, _dt.floating):
        raise ValueError("[uniform] Can only generate uniform numbers with real floating point type.")
    return _gumbel(_shape(shape), dtype, key, s)


def categorical(logits: array, axis: int = -1, shape: Optional[Sequence[int]] = None,
                num_samples: Optional[int] = None, key: Optional[array] = None,
                stream: StreamOrDevice = None) -> array:
    """Samples (uint32 indices) from the categorical distributions given by ``logits``."""
    ops = _ops()
    s = resolve_stream(stream)
    logits = to_array(logits)
    if shape is not None and num_samples is not None:
        raise ValueError("[categorical] At most one of shape or num_samples can be specified.")
    ndim = logits.ndim
    ax = axis + ndim if axis < 0 else axis
    if not 0 <= ax < ndim:
        raise IndexError(f"[categorical] Invalid axis {axis} for logits with {ndim} dimensions.")
    if key is not None:
        _check_key(key)
    reduced = logits.shape[:ax] + logits.shape[ax + 1:]
    if num_samples is not None:
        logits = ops.expand_dims(logits, -1, stream=s)
        out_shape = logits.shape[:ax] + logits.shape[ax + 1:]
        out_shape = out_shape[:-1] + (int(num_samples),)
    elif shape is not None:
        out_shape = _shape(shape)
        if broadcast_shapes(out_shape, reduced) != out_shape:
            raise ValueError(f"[categorical] Requested shape {_fmt_shape(out_shape)} is not "
                             f"broadcast compatible with reduced logits shape{_fmt_shape(reduced)}.")
    else:
        out_shape = reduced
    n = logits.shape[ax]
    if n > 0 and logits.size == n and out_shape:  # MLX's inverse-CDF path (mlx/random.cpp)
        return _categorical_inverse_cdf(ops.reshape(logits, (n,), stream=s), out_shape, key, s)
    offset = ax + len(out_shape) - logits.ndim + 1
    gshape = out_shape[:offset] + (logits.shape[ax],) + out_shape[offset:]
    g = _gumbel(gshape, _dt.float32, key, s)
    return ops.argmax(ops.add(g, logits, stream=s), offset, False, stream=s)


def _categorical_inverse_cdf(logits: array, shape: tuple, key: Optional[array], s) -> array:
    """Samples of one distribution by inverting its CDF: O(N + M) memory where the Gumbel-max
    trick needs O(N * M); where the largest logit is infinite, uniform over the maximal ones."""
    ops = _ops()
    dtype = _dt.promote_types(logits.dtype, _dt.float32)
    x = cast(logits, dtype, s)
    m = ops.max(x, stream=s)
    w = ops.where(ops.isinf(m, stream=s), cast(ops.equal(x, m, stream=s), dtype, s),
                  ops.exp(ops.subtract(x, m, stream=s), stream=s), stream=s)
    cdf = ops.cumsum(w, 0, reverse=False, inclusive=False, stream=s)
    u = ops.multiply(_uniform(array(0.0, _dt.float32), array(1.0, _dt.float32), shape,
                              _dt.float32, key, s), ops.sum(w, stream=s), stream=s)
    return ops.subtract(ops.searchsorted(cdf, u, "right", stream=s), array(1, _dt.uint32), stream=s)


def laplace(shape: Sequence[int] = [], dtype: Optional[_dt.Dtype] = _dt.float32,
            loc: float = 0.0, scale: float = 1.0, key: Optional[array] = None,
            stream: StreamOrDevice = None) -> array:
    """Samples from the Laplace distribution with location ``loc`` and scale ``scale``."""
    ops = _ops()
    dtype = _check_dtype(_dt.float32 if dtype is None else dtype, "laplace")
    if not _dt.issubdtype(dtype, _dt.floating):
        raise ValueError("[laplace] Only real floating point types are supported.")
    s = resolve_stream(stream)
    if key is not None:
        _check_key(key)
    loc, scale = float(loc), float(scale)
    low = array(float(np.nextafter(np.float32(-1.0), np.float32(0.0))), _dt.float32)
    samples = _uniform(low, array(1.0, _dt.float32), _shape(shape), _dt.float32, key, s)
    # Inverse CDF: sign(u) * log1p(-|u|).
    samples = ops.multiply(ops.sign(samples, stream=s),
                           ops.log1p(ops.multiply(array(-1.0, dtype), ops.abs(samples, stream=s),
                                                  stream=s), stream=s), stream=s)
    samples = cast(samples, dtype, s)
    if scale != 1.0:
        samples = ops.multiply(array(scale, dtype), samples, stream=s)
    if loc != 0.0:
        samples = ops.add(array(loc, dtype), samples, stream=s)
    return samples


def permutation(x: Union[int, array], axis: int = 0, key: Optional[array] = None,
                stream: StreamOrDevice = None) -> array:
    """A random permutation of ``range(x)``, or of ``x`` along ``axis``."""
    ops = _ops()
    s = resolve_stream(stream)
    if key is not None:
        _check_key(key)
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        k = _next_key(key, s, (int(x),))
        return ops.argsort(_bits((int(x),), 4, k, s), stream=s)
    x = to_array(x)
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim:
        raise IndexError("SmallVector out of range.")
    k = _next_key(key, s, (x.shape[ax],))
    perm = ops.argsort(_bits((x.shape[ax],), 4, k, s), stream=s)
    return ops.take(x, perm, ax, stream=s)


def multivariate_normal(mean: array, cov: array, shape: Sequence[int] = [],
                        dtype: Optional[_dt.Dtype] = _dt.float32, key: Optional[array] = None,
                        stream: StreamOrDevice = None) -> array:
    """Jointly normal samples with the given ``mean`` (..., n) and covariance (..., n, n)."""
    ops = _ops()
    from . import linalg

    dtype = _check_dtype(_dt.float32 if dtype is None else dtype, "multivariate_normal")
    s = resolve_stream(stream)
    mean, cov = to_array(mean), to_array(cov)
    if dtype != _dt.float32:
        raise ValueError("[multivariate_normal] dtype must be float32.")
    if mean.ndim < 1:
        raise ValueError("[multivariate_normal] mean must have at least one dimension.")
    if cov.ndim < 2:
        raise ValueError("[multivariate_normal] cov must have at least two dimensions.")
    n = mean.shape[-1]
    if cov.shape[-1] != cov.shape[-2]:
        raise ValueError("[multivariate_normal] last two dimensions of cov must be equal.")
    if n != cov.shape[-1]:
        raise ValueError("[multivariate_normal] mean and cov must have compatible shapes.")
    if key is not None:
        _check_key(key)
    out_shape = broadcast_shapes(cov.shape[:-2], mean.shape[:-1])
    out_shape = _nonnegative(broadcast_shapes(out_shape, _shape(shape)) + (n,))
    # The square root of the covariance through its SVD: U * sqrt(S) @ Vt.
    u, sv, vt = linalg.svd(cast(cov, _dt.float32, s), True, stream=s)
    std = ops.matmul(ops.multiply(u, ops.expand_dims(ops.sqrt(sv, stream=s), -2, stream=s),
                                  stream=s), vt, stream=s)
    z = _normal(out_shape, dtype, array(0.0, dtype), array(1.0, dtype), key, s)
    scaled = ops.squeeze(ops.matmul(ops.expand_dims(z, -2, stream=s), std, stream=s), -2, stream=s)
    return ops.add(mean, scaled, stream=s)
