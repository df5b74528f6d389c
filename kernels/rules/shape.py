"""Rules for layout primitives. Most return views of their input (no copy), as MLX does:
Broadcast, Reshape (when strides allow), ExpandDims, Squeeze, Flatten, Unflatten, Transpose,
Split, AsStrided. AsType, Contiguous (of a strided input), Copy, Concatenate and Pad copy.
"""

from __future__ import annotations

from ..codegen import c_ops as C
from ..primitives import ASTYPE, BROADCAST, SHAPE, define


def _broadcast_strides(strides: tuple, in_shape: tuple, out_shape: tuple, **_) -> tuple:
    """Stride 0 along the new leading axes and the stretched ones (numpy's broadcast_to)."""
    off = len(out_shape) - len(in_shape)
    return (0,) * off + tuple(0 if n == 1 and m != 1 else s
                              for n, m, s in zip(in_shape, out_shape[off:], strides))


def _transpose_strides(strides: tuple, in_shape: tuple, out_shape: tuple, *, axes=None, **_) -> tuple:
    """The input's strides permuted by ``axes`` (reversed without them)."""
    axes = tuple(reversed(range(len(strides)))) if axes is None else axes
    return tuple(strides[a] for a in axes)


@define("Broadcast", family=BROADCAST, view=True, c=C.identity, view_strides=_broadcast_strides)
def broadcast(xp, a, *, shape):
    """A read-only view with stride 0 along the broadcast dimensions (the CPU's own rule,
    ``cpu/views.py``, makes numpy's view without broadcast_to's Python)."""
    return xp.broadcast_to(a, shape)


@define("AsType", family=ASTYPE, c=C.astype, dtype="the ``dtype`` parameter")
def astype(xp, a, *, dtype):
    # bfloat16 to an integer goes through float32, as MLX's cast (and the generated kernels)
    # do: ml_dtypes' own cast saturates since 0.7 (-1 -> 0 for uint8) where MLX gives 255
    if a.dtype.kind == "V" and a.dtype.itemsize == 2 and xp.dtype(dtype).kind in "iu":
        a = a.astype(xp.float32)
    return a.astype(dtype)


def _axes_only(name: str, kw: dict) -> tuple:
    """MLX's state is the axes (std::vector<int>); the output shape is tapescope's."""
    return name, [list(kw["axes"])]


def _without_shape(name: str, kw: dict) -> tuple:
    """MLX's state is the parameters but the output shape, which is tapescope's."""
    return name, [v for k, v in kw.items() if k != "shape"]


@define("Reshape", family=SHAPE, view=True)
@define("ExpandDims", "Squeeze", family=SHAPE, view=True, export=_axes_only)
@define("Flatten", "Unflatten", family=SHAPE, view=True, export=_without_shape)
def reshape(xp, a, *, shape, **_):
    # A view when the input's strides allow it, a copy otherwise (numpy's and MLX's rule).
    return xp.reshape(a, shape)


@define("Transpose", family=SHAPE, view=True, export=_axes_only, view_strides=_transpose_strides)
def transpose(xp, a, *, axes):
    return xp.transpose(a, axes)


@define("AsStrided", family=SHAPE, view=True)
def as_strided(xp, a, *, shape, strides, offset):
    # ``a`` is row-contiguous (the op flattens first); strides and offset count elements.
    # numpy and cupy both provide xp.lib.stride_tricks.as_strided.
    flat = xp.reshape(a, (-1,))[offset:] if a.size else xp.reshape(a, (-1,))
    byte_strides = tuple(int(s) * a.itemsize for s in strides)
    return xp.lib.stride_tricks.as_strided(flat, shape=shape, strides=byte_strides)


@define("Contiguous", family=SHAPE, moves=True)
def contiguous(xp, a, *, allow_col_major):
    if a.flags.c_contiguous or (allow_col_major and a.flags.f_contiguous):
        return a
    return xp.ascontiguousarray(a)


@define("Copy", family=SHAPE, moves=True)
def copy(xp, a):
    return a.copy()


@define("Concatenate", family=SHAPE, out=True, moves=True)
def concatenate(xp, *arrays, axis, out=None):
    # Into an allocator buffer, as MLX's Concatenate mallocs its output (reusing the cache).
    return xp.concatenate(arrays, axis=axis, out=out)


@define("Split", family=SHAPE, moves=True)
def split(xp, a, *, indices, axis):
    # Views of the input, one per output.
    return tuple(xp.split(a, list(indices), axis=axis))


def export_axes_first(name: str, kw: dict) -> tuple:
    """MLX's state: the axes as a std::vector<int>, then the other parameters."""
    vals = list(kw.values())
    return name, ([list(vals[0])] + vals[1:]) if vals else []


@define("Pad", family=SHAPE, moves=True, export=export_axes_first)
def pad(xp, a, val, *, axes, low_pad_size, high_pad_size):
    shape = list(a.shape)
    inner = [slice(None)] * a.ndim
    for ax, lo, hi in zip(axes, low_pad_size, high_pad_size):
        shape[ax] += lo + hi
        inner[ax] = slice(lo, lo + a.shape[ax])
    out = xp.empty(tuple(shape), dtype=a.dtype)
    out[...] = val
    out[tuple(inner)] = a
    return out
