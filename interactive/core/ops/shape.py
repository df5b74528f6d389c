"""Shape and view ops: reshape, flatten, squeeze, transpose, concatenate, split, pad, ...

Each records the MLX primitive of the same name; the rules in
``tapescope.kernels.rules.shape`` return views wherever MLX shares the input's buffer.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Optional, Sequence, Union

from .. import dtypes as _dt
from ..array import array, check_dimensions
from ..device import BadArgs, StreamOrDevice, binding, resolve_stream
from ..primitive import Primitive
from .convert import broadcast, cast, _fmt_shape, int32, int32s, to_array

__all__ = [
    "reshape", "flatten", "unflatten", "squeeze", "expand_dims", "transpose", "swapaxes",
    "moveaxis", "atleast_1d", "atleast_2d", "atleast_3d", "concatenate", "concat", "stack",
    "split", "repeat", "tile", "pad", "roll", "as_strided", "contiguous", "kron",
]


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _one(name: str, a: array, out_shape: Sequence[int], stream: StreamOrDevice,
         **params) -> array:
    """Record a single-output layout primitive keeping ``a``'s dtype."""
    s = resolve_stream(stream)
    return array._make([out_shape], [a.dtype], Primitive(name, s, **params), [a])[0]


def _int_tuple(v: Union[int, Sequence[int]]) -> tuple:
    return (int32(v),) if isinstance(v, int) else int32s(v)


@binding("reshape(a: array, /, shape: Sequence[int], *, stream: StreamOrDevice = None) -> array")
def reshape(a: array, /, shape: Sequence[int], *, stream: StreamOrDevice = None) -> array:
    """Reshape ``a`` to ``shape`` (one dimension may be -1); a view when MLX makes one."""
    a = to_array(a)
    if isinstance(shape, int):  # (a sequence: MLX's binding refuses an int)
        raise BadArgs("shape")
    shape = int32s(shape)
    d = a._d
    size = math.prod(d.shape)
    out = shape
    infer = shape.count(-1)
    if infer:
        if infer > 1:
            raise ValueError("[reshape] Reshape can only infer one dimension.")
        rest = math.prod([n for n in shape if n != -1])
        if rest == 0:
            raise ValueError("[reshape] Cannot infer the shape of an empty array")
        out = list(shape)
        out[shape.index(-1)] = size // rest
        out = tuple(out)
    if (out and min(out) < 0) or math.prod(out) != size:
        raise ValueError(f"[reshape] Cannot reshape array of size {size} into shape {_fmt_shape(out)}.")
    if out == d.shape:
        return a._handle()
    s = resolve_stream(stream)
    if infer:  # the requested shape, as MLX's Reshape keeps it for shapeless compile
        return array._make1(out, d.dtype, Primitive("Reshape", s, shape=out, spec=shape), [a])
    return array._make1(out, d.dtype, Primitive("Reshape", s, shape=out), [a])


def reshape_known(a: array, shape: tuple, stream: StreamOrDevice = None) -> array:
    """``reshape`` to a shape of non-negative ints already known to hold ``a``'s elements
    (a VJP's cotangent back to its input's shape): the handle when equal, else the node."""
    if a._d.shape == shape:
        return a._handle()
    return _one("Reshape", a, shape, stream, shape=shape)


def _axis(ax: int, ndim: int) -> Optional[int]:
    """``ax`` made non-negative, or None when out of range."""
    ax = int(ax)
    ax = ax + ndim if ax < 0 else ax
    return ax if 0 <= ax < ndim else None


def flatten(a: array, /, start_axis: int = 0, end_axis: int = -1, *,
            stream: StreamOrDevice = None) -> array:
    """Merge axes ``start_axis``..``end_axis`` (inclusive) into one."""
    a = to_array(a)
    if a.ndim == 0:
        return reshape(a, (1,), stream=stream)
    nd = a.ndim
    st = start_axis + nd if start_axis < 0 else start_axis
    en = end_axis + nd if end_axis < 0 else end_axis
    st, en = max(st, 0), min(en, nd - 1)
    if st > en:
        raise ValueError("[flatten] start_axis must be less than or equal to end_axis")
    if st == en:
        return a._handle()
    shape = a.shape[:st] + (_prod(a.shape[st:en + 1]),) + a.shape[en + 1:]
    return _one("Flatten", a, shape, stream, shape=shape, start_axis=st, end_axis=en)


def unflatten(a: array, /, axis: int, shape: Sequence[int], *,
              stream: StreamOrDevice = None) -> array:
    """Split axis ``axis`` into ``shape`` (one entry may be -1)."""
    a = to_array(a)
    shape = _int_tuple(shape)
    ax = _axis(axis, a.ndim)
    if ax is None:
        raise IndexError(f"[unflatten] Invalid axes {axis} for array with {a.ndim} dimensions.")
    if not shape:
        raise ValueError("[unflatten] Shape to unflatten to cannot be empty.")
    infer = [i for i, d in enumerate(shape) if d == -1]
    if len(infer) > 1:
        raise ValueError("[Unflatten] Can only infer one dimension.")
    sub = list(shape)
    rest = _prod([d for d in shape if d != -1])
    if infer and rest != 0 and a.shape[ax] % rest == 0:
        sub[infer[0]] = a.shape[ax] // rest
    if infer and sub[infer[0]] == -1 or _prod(sub) != a.shape[ax]:
        raise ValueError(f"[Unflatten] Cannot unflatten axis {axis} with size {a.shape[ax]} "
                         f"into shape {_fmt_shape(shape)}.")
    out = a.shape[:ax] + tuple(sub) + a.shape[ax + 1:]
    return _one("Unflatten", a, out, stream, shape=out, axis=ax, spec=shape)


def squeeze(a: array, /, axis: Union[None, int, Sequence[int]] = None, *,
            stream: StreamOrDevice = None) -> array:
    """Remove size-1 axes (all of them, or those in ``axis``)."""
    a = to_array(a)
    if axis is None:
        axes = tuple(i for i, d in enumerate(a.shape) if d == 1)
    else:
        axes = []
        for ax in _int_tuple(axis):
            n = _axis(ax, a.ndim)
            if n is None:
                raise IndexError(f"[squeeze] Axis {ax} is out of bounds for array with {a.ndim} dimensions.")
            axes.append(n)
        if len(set(axes)) != len(axes):
            raise ValueError("[squeeze] Received duplicate axes.")
        for ax in axes:
            if a.shape[ax] != 1:
                raise ValueError(f"[squeeze] Cannot squeeze axis {ax} with size {a.shape[ax]} "
                                 "which is not equal to 1.")
        axes = tuple(sorted(axes))
    if not axes:
        return a._handle()
    out = tuple(d for i, d in enumerate(a.shape) if i not in axes)
    return _one("Squeeze", a, out, stream, shape=out, axes=axes)


def expand_dims(a: array, /, axis: Union[int, Sequence[int]], *,
                stream: StreamOrDevice = None) -> array:
    """Insert size-1 axes at the positions ``axis`` of the result."""
    a = to_array(a)
    nd = a.ndim + len(_int_tuple(axis))
    axes = []
    for ax in _int_tuple(axis):
        n = _axis(ax, nd)
        if n is None:
            raise IndexError(f"[expand_dims] Axis {ax} is out of bounds for array with {nd} dimensions.")
        axes.append(n)
    if len(set(axes)) != len(axes):
        raise ValueError("[expand_dims] Received duplicate axes.")
    axes = sorted(axes)
    out = list(a.shape)
    for ax in axes:
        out.insert(ax, 1)
    out = tuple(out)
    return _one("ExpandDims", a, out, stream, shape=out, axes=tuple(axes))


@binding("transpose(a: array, /, axes: Sequence[int] | None = None, *, stream: StreamOrDevice = "
         "None) -> array")
def transpose(a: array, /, axes: Optional[Sequence[int]] = None, *,
              stream: StreamOrDevice = None) -> array:
    """Permute the axes (reverse them by default); a view."""
    a = to_array(a)
    if isinstance(axes, int):  # (a sequence or None: MLX's binding refuses an int)
        raise BadArgs("axes")
    shape = a._d.shape
    nd = len(shape)
    if axes is None:
        norm = tuple(range(nd - 1, -1, -1))
    else:
        axes = _int_tuple(axes)
        if len(axes) != nd:
            raise ValueError(f"[transpose] Received {len(axes)} axes for array with {nd} dimensions.")
        norm = tuple([ax + nd if ax < 0 else ax for ax in axes])
        if sorted(norm) != list(range(nd)):  # not a permutation: which error, in MLX's order
            for ax, n in zip(axes, norm):
                if not 0 <= n < nd:
                    raise IndexError(f"[transpose] Invalid axis ({ax}) for array with {nd} dimensions.")
            raise ValueError("[transpose] Repeat axes not allowed.")
    return _transposed(a, norm, stream)


def _transposed(a: array, norm: tuple, stream: StreamOrDevice) -> array:
    """The Transpose node of ``a`` by ``norm`` (a permutation of its axes, already checked)."""
    shape = a._d.shape
    out = tuple([shape[i] for i in norm])
    return array._make1(out, a._d.dtype, Primitive("Transpose", resolve_stream(stream), axes=norm), [a])


def swapaxes(a: array, /, axis1: int, axis2: int, *, stream: StreamOrDevice = None) -> array:
    """Swap two axes (a Transpose)."""
    a = to_array(a)
    n1, n2 = _axis(axis1, a.ndim), _axis(axis2, a.ndim)
    for ax, n in ((axis1, n1), (axis2, n2)):
        if n is None:
            raise IndexError(f"[swapaxes] Invalid axis {ax} for array with {a.ndim} dimensions.")
    perm = list(range(a.ndim))
    perm[n1], perm[n2] = perm[n2], perm[n1]
    return _transposed(a, tuple(perm), stream)  # (a permutation: transpose's checks hold)


def moveaxis(a: array, /, source: int, destination: int, *,
             stream: StreamOrDevice = None) -> array:
    """Move axis ``source`` to position ``destination`` (a Transpose)."""
    a = to_array(a)
    ns, nd = _axis(source, a.ndim), _axis(destination, a.ndim)
    for ax, n in ((source, ns), (destination, nd)):
        if n is None:
            raise IndexError(f"[moveaxis] Invalid axis {ax} for array with {a.ndim} dimensions.")
    perm = list(range(a.ndim))
    perm.pop(ns)
    perm.insert(nd, ns)
    return transpose(a, perm, stream=stream)


def _atleast(n: int, arys: tuple, stream: StreamOrDevice) -> Union[array, list]:
    out = []
    for x in arys:
        x = to_array(x)
        if x.ndim < n:
            if n == 3 and x.ndim == 1:
                shape = (1,) + x.shape + (1,)
            elif n == 3 and x.ndim == 2:
                shape = x.shape + (1,)
            else:
                shape = (1,) * (n - x.ndim) + x.shape
            x = _one("Reshape", x, shape, stream, shape=shape)
        else:
            x = x._handle()
        out.append(x)
    return out[0] if len(out) == 1 else out


def atleast_1d(*arys: array, stream: StreamOrDevice = None) -> Union[array, list]:
    """Arrays with at least one dimension."""
    return _atleast(1, arys, stream)


def atleast_2d(*arys: array, stream: StreamOrDevice = None) -> Union[array, list]:
    """Arrays with at least two dimensions."""
    return _atleast(2, arys, stream)


def atleast_3d(*arys: array, stream: StreamOrDevice = None) -> Union[array, list]:
    """Arrays with at least three dimensions (1-D ``(n,)`` becomes ``(1, n, 1)``)."""
    return _atleast(3, arys, stream)


def _promote_all(arrs: list) -> _dt.Dtype:
    d = arrs[0].dtype
    for x in arrs[1:]:
        d = _dt.promote_types(d, x.dtype)
    return d


def concatenate(arrays: list, axis: Optional[int] = 0, *, stream: StreamOrDevice = None) -> array:
    """Join arrays along an existing axis (flattened first when ``axis`` is None)."""
    arrs = [to_array(x) for x in arrays]
    if not arrs:
        raise ValueError("[concatenate] No arrays provided for concatenation")
    if axis is None:
        arrs = [flatten(x, stream=stream) for x in arrs]
        axis = 0
    nd = arrs[0].ndim
    for x in arrs[1:]:
        if x.ndim != nd:
            raise ValueError("[concatenate] All the input arrays must have the same number of "
                             f"dimensions. However, got arrays with dimensions {nd} and {x.ndim}.")
    ax = _axis(axis, nd)
    if ax is None:
        raise IndexError(f"[concatenate] Axis {axis} is out of bounds for array with {nd} dimensions.")
    shape = list(arrs[0].shape)
    for x in arrs[1:]:
        if any(x.shape[i] != shape[i] for i in range(nd) if i != ax):
            shapes = ", ".join(_fmt_shape(y.shape) for y in arrs)
            raise ValueError("[concatenate] All the input array dimensions must match exactly except "
                             f"for the concatenation axis. However, the provided shapes are {shapes}, "
                             f"and the concatenation axis is {axis}.")
        shape[ax] += x.shape[ax]
    check_dimensions(shape, "concatenate")
    if len(arrs) == 1:
        return arrs[0]
    s = resolve_stream(stream)
    dt = _promote_all(arrs)
    arrs = [cast(x, dt, s) for x in arrs]
    return array._make([tuple(shape)], [dt], Primitive("Concatenate", s, axis=ax), arrs)[0]


concat = concatenate


def stack(arrays: list, axis: Optional[int] = 0, *, stream: StreamOrDevice = None) -> array:
    """Join arrays along a new axis."""
    arrs = [to_array(x) for x in arrays]
    if not arrs:
        raise ValueError("[stack] No arrays provided for stacking")
    if any(x.shape != arrs[0].shape for x in arrs):
        raise ValueError("[stack] All arrays must have the same shape")
    nd = arrs[0].ndim + 1
    if _axis(axis, nd) is None:
        raise IndexError(f"[stack] Axis {axis} is out of bounds for array with {nd} dimensions.")
    return concatenate([expand_dims(x, axis, stream=stream) for x in arrs], axis, stream=stream)


def split(a: array, /, indices_or_sections: Union[int, Sequence[int]], axis: int = 0, *,
          stream: StreamOrDevice = None) -> list:
    """Split into equal sections, or at the given indices, along ``axis`` (one Split node)."""
    a = to_array(a)
    ax = _axis(axis, a.ndim)
    if ax is None:
        raise IndexError(f"[split] Axis {axis} is out of bounds for array with {a.ndim} dimensions.")
    n = a.shape[ax]
    if isinstance(indices_or_sections, int) or (isinstance(indices_or_sections, array)
                                                 and indices_or_sections.ndim == 0):
        k = int(indices_or_sections)
        if k <= 0:
            raise ValueError(f"[split] num_splits must be positive and non-zero but got {k}.")
        if n % k != 0:
            raise ValueError(f"Array split does not result in sub arrays with equal size: attempting "
                             f"{k} splits along axis {axis} for shape {_fmt_shape(a.shape)}.")
        indices = tuple(n // k * i for i in range(1, k))
    else:
        indices = _int_tuple(indices_or_sections)
    bounds = [0] + [min(max(i + n if i < 0 else i, 0), n) for i in indices] + [n]
    shapes = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        sh = list(a.shape)
        sh[ax] = max(hi - lo, 0)
        shapes.append(tuple(sh))
    s = resolve_stream(stream)
    prim = Primitive("Split", s, indices=tuple(bounds[1:-1]), axis=ax)
    return array._make(shapes, [a.dtype] * len(shapes), prim, [a])


def repeat(array: array, repeats: int, axis: Optional[int] = None, *,  # noqa: F811 (MLX's name)
           stream: StreamOrDevice = None) -> array:
    """Repeat each element ``repeats`` times along ``axis`` (flattened when None)."""
    a = to_array(array)
    if repeats < 0:
        raise ValueError("[repeat] Number of repeats cannot be negative")
    if axis is None:
        a = flatten(a, stream=stream)
        axis = 0
    ax = _axis(axis, a.ndim)
    if ax is None:
        raise IndexError(f"[repeat] Axis {axis} is out of bounds for array with {a.ndim} dimensions.")
    x = expand_dims(a, ax + 1, stream=stream)
    shape = list(x.shape)
    shape[ax + 1] = repeats
    x = broadcast(x, shape, stream=stream)
    out = list(a.shape)
    out[ax] *= repeats
    check_dimensions(out, "repeat")
    return reshape(x, out, stream=stream)


def tile(a: array, reps: Union[int, Sequence[int]], /, *, stream: StreamOrDevice = None) -> array:
    """Repeat the whole array ``reps`` times along each axis."""
    a = to_array(a)
    reps = _int_tuple(reps)
    nd = max(a.ndim, len(reps))
    shape = (1,) * (nd - a.ndim) + a.shape
    reps = (1,) * (nd - len(reps)) + reps
    if any(r < 0 for r in reps):
        raise ValueError("[broadcast_to] Negative dimensions not allowed.")
    expand = []
    bshape = []
    for d, r in zip(shape, reps):
        expand += [1, d]
        bshape += [r, d]
    x = reshape(a, expand, stream=stream)
    x = broadcast(x, bshape, stream=stream)
    return reshape(x, [d * r for d, r in zip(shape, reps)], stream=stream)


def _nb_int(v: Any) -> Optional[int]:
    """``v`` as nanobind's ``int`` caster takes it (anything with ``__index__``), else None."""
    if isinstance(v, float):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _nb_items(v: Any) -> Optional[list]:
    """``v``'s items as nanobind's tuple / list casters take them (a sequence with a length,
    not a str or bytes), else None."""
    if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__getitem__"):
        return None
    try:
        len(v)
        return list(v)
    except TypeError:
        return None


def _pad_widths(pad_width: Any, ndim: int) -> list:
    """MLX's pad_width forms: int, (n,), (lo, hi), or (lo, hi) pairs, one or one per axis;
    ``BadArgs`` for anything its binding refuses (even ((1,),))."""
    n = _nb_int(pad_width)
    if n is not None:
        return [(n, n)] * ndim
    items = _nb_items(pad_width)
    if items is None:
        raise BadArgs("pad_width")
    ints = [_nb_int(p) for p in items]
    if items and None not in ints and len(ints) <= 2:  # tuple[int] or tuple[int, int]
        return [(ints[0], ints[-1])] * ndim
    pairs = [_nb_items(p) for p in items]  # list[tuple[int, int]]
    if any(p is None or len(p) != 2 for p in pairs):
        raise BadArgs("pad_width")
    pw = [(_nb_int(lo), _nb_int(hi)) for lo, hi in pairs]
    if any(lo is None or hi is None for lo, hi in pw):
        raise BadArgs("pad_width")
    if len(pw) == 1:
        return pw * ndim
    if len(pw) != ndim:
        raise ValueError(f"Invalid number of padding sizes passed to pad with axes of size {ndim}")
    return pw


_PAD_SIG = ("pad(a: array, pad_width: int | tuple[int] | tuple[int, int] | list[tuple[int, "
            "int]], mode: Literal['constant', 'edge', 'reflect', 'symmetric'] = 'constant', "
            "constant_values: scalar | array = 0, *, stream: StreamOrDevice = None) -> array")


@binding(_PAD_SIG)
def pad(a: array, pad_width: Any, mode: str = "constant", constant_values: Any = 0, *,
        stream: StreamOrDevice = None) -> array:
    """Pad with a constant value, the edge values, or the values mirrored at the edge
    (``mode`` "constant", "edge", "reflect": without the edge value, "symmetric": with it)."""
    if not isinstance(a, array) or not isinstance(mode, str) or constant_values is None:
        raise BadArgs("a")
    widths = _pad_widths(pad_width, a.ndim)
    for i, (lo, hi) in enumerate(widths):
        if lo < 0:
            raise ValueError(f"Invalid low padding size ({lo}) passed to pad for axis {i}. "
                             "Padding sizes must be non-negative")
        if hi < 0:
            raise ValueError(f"Invalid high padding size ({hi}) passed to pad for axis {i}. "
                             "Padding sizes must be non-negative")
    if mode not in ("constant", "edge", "reflect", "symmetric"):
        raise ValueError(f"Invalid padding mode ({mode}) passed to pad")
    s = resolve_stream(stream)
    axes = tuple(range(a.ndim))
    low = tuple(int(lo) for lo, _ in widths)
    high = tuple(int(hi) for _, hi in widths)
    shape = tuple(d + lo + hi for d, lo, hi in zip(a.shape, low, high))
    if mode == "constant":
        val = cast(to_array(constant_values, a.dtype), a.dtype, s)
        if val.ndim != 0:
            raise ValueError("[pad] Padding value should be a scalar.")
        prim = Primitive("Pad", s, axes=axes, low_pad_size=low, high_pad_size=high)
        return array._make([shape], [a.dtype], prim, [a, val])[0]
    from .creation import zeros
    from .indexing import _slice, _slice_update

    out = _slice_update(zeros(shape, a.dtype, stream=s), a, low,
                        tuple(lo + d for lo, d in zip(low, a.shape)), (1,) * a.ndim, s)
    if mode != "edge":
        return _reflect_pad(out, a.shape, low, high, mode == "symmetric", s)
    for ax in axes:
        for side in (0, 1):
            width = low[ax] if side == 0 else high[ax]
            if width == 0 or a.shape[ax] == 0:
                continue
            src = low[ax] if side == 0 else low[ax] + a.shape[ax] - 1
            dst = 0 if side == 0 else low[ax] + a.shape[ax]
            st, en = [0] * a.ndim, list(shape)
            st[ax], en[ax] = src, src + 1
            edge = _slice(out, tuple(st), tuple(en), (1,) * a.ndim, s)
            st[ax], en[ax] = dst, dst + width
            out = _slice_update(out, edge, tuple(st), tuple(en), (1,) * a.ndim, s)
    return out


def _reflect_pad(out: array, in_shape: tuple, low: tuple, high: tuple, include_edge: bool,
                 s) -> array:
    """``reflect_pad`` of ``mlx/ops.cpp`` on ``out`` (the input already written at ``low``):
    per axis, mirrored chunks of at most one period are copied outwards, each read from what
    is filled so far (reflect skips the edge value, period 2(n-1); symmetric repeats it)."""
    from .indexing import _slice, _slice_update

    nd = len(in_shape)
    for ax in range(nd):
        n, lo_w, hi_w = in_shape[ax], low[ax], high[ax]
        if lo_w == 0 and hi_w == 0:
            continue
        if n == 0:
            raise ValueError(f"[pad] Cannot pad empty axis {ax} using mode "
                             f"'{'symmetric' if include_edge else 'reflect'}'.")
        offset = 1 if not include_edge and n > 1 else 0
        tile = n - offset

        def copy(out, src: int, dst: int, chunk: int):
            st, en, step = [0] * nd, list(out.shape), [1] * nd
            st[ax], en[ax], step[ax] = src + chunk - 1, src - 1, -1  # the chunk, flipped
            piece = _slice(out, st, en, step, s)
            st, en = [0] * nd, list(out.shape)
            st[ax], en[ax] = dst, dst + chunk
            return _slice_update(out, piece, st, en, (1,) * nd, s)

        filled, left = lo_w, lo_w
        while left > 0:
            chunk = min(left, tile)
            out = copy(out, filled + offset, filled - chunk, chunk)
            filled, left = filled - chunk, left - chunk
        filled, left = lo_w + n, hi_w
        while left > 0:
            chunk = min(left, tile)
            out = copy(out, filled - offset - chunk, filled, chunk)
            filled, left = filled + chunk, left - chunk
    return out


def roll(a: array, shift: Union[int, Sequence[int]], /, axis: Union[None, int, Sequence[int]] = None,
         *, stream: StreamOrDevice = None) -> array:
    """Roll elements along axes (flattened when ``axis`` is None): Split then Concatenate.

    As MLX: several shifts on one axis (or on the flattened array) add up; with several
    axes, an int shift applies to each and a tuple needs one shift per axis (extras unused).
    """
    a = to_array(a)
    shifts = _int_tuple(shift)
    if axis is None:
        x = flatten(a, stream=stream)
        return reshape(_roll_axis(x, sum(shifts), 0, stream), a.shape, stream=stream)
    axes = _int_tuple(axis)
    norm = []
    for ax in axes:
        n = _axis(ax, a.ndim)
        if n is None:
            raise IndexError(f"[roll] Invalid axis {ax} for array with {a.ndim} dimensions.")
        norm.append(n)
    if isinstance(axis, int):
        shifts = (sum(shifts),)
    elif isinstance(shift, int):
        shifts = shifts * len(norm)
    elif len(shifts) < len(norm):
        raise ValueError(f"[roll] At least one shift value per axis is required, {len(shifts)} "
                         f"provided for {len(norm)} axes.")
    x = a._handle()
    for sh, ax in zip(shifts, norm):
        x = _roll_axis(x, sh, ax, stream)
    return x


def _roll_axis(x: array, shift: int, ax: int, stream: StreamOrDevice) -> array:
    n = x.shape[ax]
    if n == 0:
        return x
    k = shift % n
    if k == 0:
        return x
    lo, hi = split(x, [n - k], axis=ax, stream=stream)
    return concatenate([hi, lo], axis=ax, stream=stream)


def as_strided(a: array, /, shape: Optional[Sequence[int]] = None,
               strides: Optional[Sequence[int]] = None, offset: int = 0, *,
               stream: StreamOrDevice = None) -> array:
    """A view of ``a``'s (row-contiguous) data with the given shape, element strides, offset."""
    a = to_array(a)
    shape = a.shape if shape is None else _int_tuple(shape)
    if strides is None:
        st, acc = [], 1
        for d in reversed(shape):
            st.insert(0, acc)
            acc *= d
        strides = tuple(st)
    strides = _int_tuple(strides)
    if any(d < 0 for d in shape):
        raise ValueError("[as_strided] Negative dimensions not allowed.")
    if len(strides) != len(shape):
        raise ValueError(f"[as_strided] Shape {_fmt_shape(shape)} and strides "
                         f"{_fmt_shape(strides)} must have the same length.")
    x = flatten(a, stream=stream)
    return _one("AsStrided", x, shape, stream, shape=shape, strides=strides, offset=int(offset))


def contiguous(a: array, /, allow_col_major: bool = False, *,
               stream: StreamOrDevice = None) -> array:
    """A row-contiguous array (column-major allowed when asked); copies only if needed."""
    a = to_array(a)
    return _one("Contiguous", a, a.shape, stream, allow_col_major=bool(allow_col_major))


def copy(a: array, *, stream: StreamOrDevice = None) -> array:
    """A copy of ``a`` in its own buffer (MLX's internal ``copy``; used by deepcopy)."""
    a = to_array(a)
    return _one("Copy", a, a.shape, stream)


@binding("kron(a: array, b: array, *, stream: StreamOrDevice = None) -> array")
def kron(a: array, b: array, *, stream: StreamOrDevice = None) -> array:
    """The Kronecker product of ``a`` and ``b``."""
    if not isinstance(a, array) or not isinstance(b, array):
        raise BadArgs("a")
    from .. import ops

    multiply = ops.multiply

    if a.size == 0 or b.size == 0:
        raise ValueError("[kron] Input arrays cannot be empty.")
    nd = max(a.ndim, b.ndim)
    ash = (1,) * (nd - a.ndim) + a.shape
    bsh = (1,) * (nd - b.ndim) + b.shape
    ia, ib, shape, out = [], [], [], []
    for x, y in zip(ash, bsh):
        ia += [x, 1]
        ib += [1, y]
        shape += [x, y]
        out.append(x * y)
    check_dimensions(out, "kron")
    xa = broadcast(reshape(a, ia, stream=stream), shape, stream=stream)
    xb = broadcast(reshape(b, ib, stream=stream), shape, stream=stream)
    return reshape(multiply(xa, xb, stream=stream), out, stream=stream)


# the Python versions: the reference, and every case the C recording does not take
python_ops = {"reshape": reshape, "transpose": transpose, "expand_dims": expand_dims,
              "squeeze": squeeze, "swapaxes": swapaxes, "moveaxis": moveaxis}


def _c_layout() -> None:
    """reshape / transpose / expand_dims / squeeze / swapaxes / moveaxis in C (core/_layout.c:
    their common case, the same nodes; every other case, errors included, calls the Python
    versions in ``python_ops``), where the extension is built and ``settings.c_call`` is on."""
    from tapescope.kernels.settings import settings

    from . import elementwise

    if not settings.c_call or elementwise.binary is elementwise.binary_py:
        return
    from .. import _call

    fns = _call.configure_layout({"array_type": array, "dtype_type": _dt.Dtype, **python_ops})
    globals().update(fns)


_c_layout()
