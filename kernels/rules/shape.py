"""Rules for layout primitives. Most return views of their input (no copy), as MLX does:
Broadcast, Reshape (when strides allow), ExpandDims, Squeeze, Flatten, Unflatten, Transpose,
Split, AsStrided. AsType, Contiguous (of a strided input), Copy, Concatenate and Pad copy.
"""

from __future__ import annotations

from ..codegen import c_ops as C
from ..primitives import ASTYPE, BROADCAST, SHAPE, define, elements, same_shape


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


def _fmt(shape) -> str:
    """A shape as MLX's errors print it: ``(2,3)``."""
    return "(" + ",".join(str(s) for s in shape) + ")"


# Output shapes from the input's (MLX's output_shapes, mlx/primitives.cpp), which a shapeless
# compile asks on new inputs; each view's ``shape`` parameter is the output shape they give.
def _reshape_shape(shapes: list, *, shape, spec=None, **_) -> list:
    """MLX's Reshape::output_shape: the requested shape, its -1 inferred again."""
    spec = shape if spec is None else spec
    size = elements(shapes[0])
    out = list(spec)
    if -1 in spec:
        rest = elements(d for d in spec if d != -1)
        out[spec.index(-1)] = size // rest if rest else 0
    if elements(out) != size:
        raise ValueError(f"[reshape] Cannot reshape array of size {size} into shape {_fmt(out)}.")
    return [tuple(out)]


def _flatten_shape(shapes: list, *, start_axis, end_axis, **_) -> list:
    shape = tuple(shapes[0])
    if not shape:
        return [(1,)]
    lo, hi = start_axis % len(shape), end_axis % len(shape)
    return [shape[:lo] + (elements(shape[lo:hi + 1]),) + shape[hi + 1:]]


def _unflatten_shape(shapes: list, *, axis, spec, **_) -> list:
    """MLX's Unflatten::output_shape: axis ``axis`` split into ``spec``, its -1 inferred again."""
    shape = tuple(shapes[0])
    sub = list(spec)
    if -1 in spec:
        rest = elements(d for d in spec if d != -1)
        sub[spec.index(-1)] = shape[axis] // rest if rest else 0
    if elements(sub) != shape[axis]:
        raise ValueError(f"[Unflatten] Cannot unflatten axis {axis} with size {shape[axis]} into "
                         f"shape {_fmt(spec)}.")
    return [shape[:axis] + tuple(sub) + shape[axis + 1:]]


def _expand_dims_shape(shapes: list, *, axes, **_) -> list:
    out = list(shapes[0])
    for ax in sorted(axes):
        out.insert(ax, 1)
    return [tuple(out)]


def _squeeze_shape(shapes: list, *, axes, **_) -> list:
    axes = set(axes)
    return [tuple(d for i, d in enumerate(shapes[0]) if i not in axes)]


def _size_one_strides(strides: tuple, in_shape: tuple, out_shape: tuple, **_) -> tuple:
    """The input's strides of its axes longer than 1, in order, and 0 for the output's
    size-1 axes: inserting or dropping size-1 axes is always a view (numpy's and CuPy's
    no-copy reshape), so ExpandDims and Squeeze never copy."""
    kept = iter(s for s, n in zip(strides, in_shape) if n != 1)
    return tuple(0 if n == 1 else next(kept) for n in out_shape)


@define("Reshape", family=SHAPE, view=True, shape=_reshape_shape)
@define("ExpandDims", family=SHAPE, view=True, export=_axes_only, shape=_expand_dims_shape,
        view_strides=_size_one_strides)
@define("Squeeze", family=SHAPE, view=True, export=_axes_only, shape=_squeeze_shape,
        view_strides=_size_one_strides)
@define("Flatten", family=SHAPE, view=True, export=_without_shape, shape=_flatten_shape)
@define("Unflatten", family=SHAPE, view=True, export=_without_shape, shape=_unflatten_shape)
def reshape(xp, a, *, shape, **_):
    # A view when the input's strides allow it, a copy otherwise (numpy's and MLX's rule);
    # the array's method: numpy's xp.reshape is a Python wrapper calling it
    return a.reshape(shape)


@define("Transpose", family=SHAPE, view=True, export=_axes_only, view_strides=_transpose_strides,
        shape=lambda shapes, *, axes, **_: [tuple(shapes[0][a] for a in axes)])
def transpose(xp, a, *, axes):
    return a.transpose(axes)  # (numpy's xp.transpose: a Python wrapper calling the method)


@define("AsStrided", family=SHAPE, view=True)
def as_strided(xp, a, *, shape, strides, offset):
    # ``a`` is row-contiguous (the op flattens first); strides and offset count elements.
    # numpy and cupy both provide xp.lib.stride_tricks.as_strided.
    flat = xp.reshape(a, (-1,))[offset:] if a.size else xp.reshape(a, (-1,))
    byte_strides = tuple(int(s) * a.itemsize for s in strides)
    return xp.lib.stride_tricks.as_strided(flat, shape=shape, strides=byte_strides)


@define("Contiguous", family=SHAPE, moves=True, shape=same_shape)
def contiguous(xp, a, *, allow_col_major):
    if a.flags.c_contiguous or (allow_col_major and a.flags.f_contiguous):
        return a
    return xp.ascontiguousarray(a)


@define("Copy", family=SHAPE, view=True, view_strides=lambda strides, *_, **__: strides,
        shape=same_shape)
def copy(xp, a):
    """``a``'s data, its buffer shared (MLX's ``Copy::eval``: ``copy_shared_buffer``; arrays
    are immutable, and a shared buffer is donated only once one holder is left)."""
    return a.view()


def _concatenate_shape(shapes: list, *, axis, **_) -> list:
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return [tuple(out)]


@define("Concatenate", family=SHAPE, out=True, moves=True, shape=_concatenate_shape)
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
