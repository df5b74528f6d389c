"""Convolutions: conv1d / conv2d / conv3d, conv_general, conv_transpose1d / 2d / 3d and
convolve, all recording MLX's one ``Convolution`` primitive (channels-last: input
``(N, *spatial, C_in)``, weight ``(C_out, *kernel, C_in / groups)``).

The argument handling, checks, messages and the graph recorded around the primitive follow
``conv_general`` / ``conv_transpose_general`` in ``mlx/ops.cpp``, their bindings and
``convolve`` in ``python/src/ops.cpp``, and ``Convolution::conv_out_shape`` in
``mlx/primitives.cpp``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from tapescope.kernels.rules.conv import out_shape

from .. import dtypes as _dt
from ..array import array
from ..device import BadArgs, StreamOrDevice, binding, resolve_stream
from ..primitive import Primitive
from .convert import cast, _fmt_shape
from .indexing import _slice
from .shape import _nb_int, _nb_items, pad, reshape

__all__ = ["conv1d", "conv2d", "conv3d", "conv_general", "conv_transpose1d",
           "conv_transpose2d", "conv_transpose3d", "convolve"]

_S = "stream: StreamOrDevice = None) -> array"
_SIG = {
    "conv1d": "conv1d(input: array, weight: array, /, stride: int = 1, padding: int = 0, "
              f"dilation: int = 1, groups: int = 1, *, {_S}",
    "conv_transpose1d": "conv_transpose1d(input: array, weight: array, /, stride: int = 1, "
                        "padding: int = 0, dilation: int = 1, output_padding: int = 0, "
                        f"groups: int = 1, *, {_S}",
    "conv_general": "conv_general(input: array, weight: array, /, stride: int | Sequence[int] "
                    "= 1, padding: int | Sequence[int] | tuple[Sequence[int], Sequence[int]] = "
                    "0, kernel_dilation: int | Sequence[int] = 1, input_dilation: int | "
                    "Sequence[int] = 1, groups: int = 1, flip: bool = False, *, " + _S,
    "convolve": f'convolve(a: array, v: array, /, mode: str = "full", *, {_S}',
}
for _n, _t in ((2, "tuple[int, int]"), (3, "tuple[int, int, int]")):
    _SIG[f"conv{_n}d"] = (f"conv{_n}d(input: array, weight: array, /, stride: int | {_t} = 1, "
                          f"padding: int | {_t} = 0, dilation: int | {_t} = 1, groups: int = 1,"
                          f" *, {_S}")
    _SIG[f"conv_transpose{_n}d"] = (
        f"conv_transpose{_n}d(input: array, weight: array, /, stride: int | {_t} = 1, padding: "
        f"int | {_t} = 0, dilation: int | {_t} = 1, output_padding: int | {_t} = 0, groups: "
        f"int = 1, *, {_S}")


# -- nanobind's conversions of the arguments ------------------------------------------------
def _int(v: Any) -> int:
    n = _nb_int(v)
    if n is None:
        raise BadArgs("int")
    return n


def _ints(v: Any) -> Optional[list]:
    """A ``std::vector<int>`` from any sequence of ints, else None."""
    items = _nb_items(v)
    if items is None:
        return None
    ints = [_nb_int(x) for x in items]
    return None if None in ints else ints


def _int_or_ints(v: Any) -> list:
    """``int | Sequence[int]`` as conv_general's binding reads it: one int is a 1-vector."""
    n = _nb_int(v)
    if n is not None:
        return [n]
    ints = _ints(v)
    if ints is None:
        raise BadArgs("ints")
    return ints


def _int_or_tuple(v: Any, n: int) -> list:
    """``int | tuple[int, ...n]`` as conv2d / conv3d's bindings read it."""
    i = _nb_int(v)
    if i is not None:
        return [i] * n
    ints = _ints(v)
    if ints is None or len(ints) != n:
        raise BadArgs("tuple")
    return ints


def _arrays(*xs: Any) -> None:
    if not all(isinstance(x, array) for x in xs):
        raise BadArgs("array")


# -- mlx/ops.cpp ----------------------------------------------------------------------------
def _conv_checks(x: array, w: array, nd: int, groups: int) -> None:
    """``run_conv_checks`` in ``mlx/ops.cpp``."""
    if not _dt.issubdtype(x.dtype, _dt.floating):
        raise ValueError(f"[conv] Invalid input array with type {x.dtype.name}. Convolution "
                         "currently only supports floating point types")
    if x.ndim != nd + 2:
        raise ValueError(f"[conv] Invalid input array with {x.ndim} dimensions for {nd}D "
                         f"convolution. Expected an array with {nd + 2} dimensions following "
                         "the format [N, ..., C_in].")
    if w.ndim != nd + 2:
        raise ValueError(f"[conv] Invalid weight array with {w.ndim} dimensions for {nd}D "
                         f"convolution. Expected an array with {nd + 2} dimensions following "
                         "the format [C_out, ..., C_in].")
    cin = x.shape[nd + 1]
    if cin % groups != 0:
        raise ValueError("[conv] The input channels must be divisible by the number of groups. "
                         f"Got input with shape {_fmt_shape(x.shape)} and {groups} groups.")
    if groups > 1 and w.shape[0] % groups != 0:
        raise ValueError("[conv] If groups > 1, the output channels must be divisible by the "
                         f"number of groups. Got {w.shape[0]} output channels and {groups} "
                         "groups.")
    if cin != groups * w.shape[nd + 1]:
        if groups == 1:
            raise ValueError("[conv] Expect the input channels in the input and weight array to "
                             f"match but got shapes - input: {_fmt_shape(x.shape)} and weight: "
                             f"{_fmt_shape(w.shape)}")
        raise ValueError(f"Given groups={groups} and weights of shape {_fmt_shape(w.shape)}, "
                         f"expected to have {groups * w.shape[nd + 1]} input channels but got "
                         f"{cin} input channels instead.")


def _check_out_shape(in_shape, wt_shape, strides, lo, hi, kd, idil) -> tuple:
    """``Convolution::conv_out_shape``'s checks (``mlx/primitives.cpp``), then the shape."""
    nd = len(in_shape) - 2
    f = _fmt_shape
    if len(strides) != nd:
        raise ValueError(f"[conv] Invalid strides {f(strides)} for {nd}D convolution.")
    if len(lo) != nd or len(hi) != nd:
        raise ValueError(f"[conv] Invalid padding {f(lo)} | {f(hi)} for {nd}D convolution.")
    if len(kd) != nd:
        raise ValueError(f"[conv] Invalid kernel dilation {f(kd)} for {nd}D convolution.")
    if len(idil) != nd:
        raise ValueError(f"[conv] Invalid input dilation {f(idil)} for {nd}D convolution.")
    for i in range(nd):
        if kd[i] <= 0:
            raise ValueError("[conv] Kernel dilation sizes must be positive. Got kernel "
                             f"dilation {f(kd)}.")
        if idil[i] <= 0:
            raise ValueError("[conv] Input dilation sizes must be positive. Got input dilation "
                             f"{f(idil)}.")
        if lo[i] < 0 or hi[i] < 0:
            raise ValueError("[conv] Padding sizes must be non-negative. Got padding "
                             f"{f(lo)} | {f(hi)}.")
        if strides[i] <= 0:
            raise ValueError(f"[conv] Stride sizes must be positive. Got strides {f(strides)}.")
        one = out_shape(in_shape[:1] + in_shape[1 + i:2 + i] + in_shape[-1:],
                        wt_shape[:1] + wt_shape[1 + i:2 + i] + wt_shape[-1:], strides[i:i + 1],
                        lo[i:i + 1], hi[i:i + 1], kd[i:i + 1], idil[i:i + 1])
        if one[1] <= 0:
            raise ValueError("[conv] Spatial dimensions of input after padding cannot be smaller "
                             f"than weight spatial dimensions. Got error at axis {i + 1} for "
                             f"input with shape {f(in_shape)}, padding low {f(lo)}, padding "
                             f"high {f(hi)}, and weight of shape {f(wt_shape)}.")
    return out_shape(in_shape, wt_shape, strides, lo, hi, kd, idil)


def _conv_general(x: array, w: array, stride: Sequence[int], lo: Sequence[int],
                  hi: Sequence[int], kd: Sequence[int], idil: Sequence[int], groups: int,
                  flip: bool, s) -> array:
    """``conv_general`` of ``mlx/ops.cpp`` (``s`` a resolved stream): checks, promotion,
    one-value arguments spread over the spatial axes, negative padding as a slice."""
    if groups != 1 and x.ndim not in (3, 4):
        raise ValueError("[conv] Can only handle groups != 1 in 1D or 2D convolutions.")
    nd = x.ndim - 2
    if nd < 1 or nd > 3:
        raise ValueError("[conv] Only works for inputs with 1-3 spatial dimensions. The inputs "
                         "must be in the format [N, ..., C_in]")
    _conv_checks(x, w, nd, groups)
    dt = _dt.promote_types(x.dtype, w.dtype)
    x, w = cast(x, dt, s), cast(w, dt, s)

    def spread(v, default):
        v = list(v)
        return v if len(v) > 1 else [v[0] if v else default] * nd

    stride, lo, hi, kd, idil = (spread(stride, 1), spread(lo, 0), spread(hi, 0), spread(kd, 1),
                                spread(idil, 1))
    if any(p < 0 for p in lo + hi):
        start, stop = [0] * x.ndim, list(x.shape)
        for i in range(nd):
            if lo[i] < 0:
                start[i + 1] -= lo[i]
                lo[i] = 0
            if hi[i] < 0:
                stop[i + 1] += hi[i]
                hi[i] = 0
        x = _slice(x, start, stop, [1] * x.ndim, s)
    shape = _check_out_shape(x.shape, w.shape, stride, lo, hi, kd, idil)
    prim = Primitive("Convolution", s, strides=tuple(stride), padding_lo=tuple(lo),
                     padding_hi=tuple(hi), kernel_dilation=tuple(kd),
                     input_dilation=tuple(idil), groups=int(groups), flip=bool(flip))
    return array._make1(shape, dt, prim, [x, w])


def _conv_transpose(x: array, w: array, stride, padding, dilation, output_padding, groups,
                    s) -> array:
    """``conv_transpose_general`` of ``mlx/ops.cpp``: a flipped conv over the input dilated by
    ``stride``, padded so the output is ``(n - 1) * stride - 2 * padding + dilated kernel``
    (plus ``output_padding`` at the high end)."""
    lo, hi = [], []
    for i in range(len(padding)):
        if w.ndim <= i + 1 or x.ndim <= i + 1:
            break  # conv_general reports the wrong rank
        wt_size = 1 + dilation[i] * (w.shape[1 + i] - 1)
        lo.append(wt_size - padding[i] - 1)
        in_size = (x.shape[i + 1] - 1) * stride[i] - 2 * padding[i] + wt_size
        out_size = 1 + stride[i] * (x.shape[1 + i] - 1)
        hi.append(in_size - out_size + padding[i] + output_padding[i])
    return _conv_general(x, w, [1] * len(stride), lo, hi, dilation, stride, groups, True, s)


# -- the Python API ---------------------------------------------------------------------------
@binding(_SIG["conv1d"])
def conv1d(input: array, weight: array, /, stride: int = 1, padding: int = 0,
           dilation: int = 1, groups: int = 1, *, stream: StreamOrDevice = None) -> array:
    """1D convolution over an input ``(N, L, C_in)`` with weight ``(C_out, K, C_in / groups)``."""
    _arrays(input, weight)
    st, p, d, g = _int(stride), _int(padding), _int(dilation), _int(groups)
    return _conv_general(input, weight, [st], [p], [p], [d], [1], g, False,
                         resolve_stream(stream))


def _convnd(n: int, input, weight, stride, padding, dilation, groups, stream) -> array:
    _arrays(input, weight)
    st, p, d = (_int_or_tuple(v, n) for v in (stride, padding, dilation))
    return _conv_general(input, weight, st, p, p, d, [1] * n, _int(groups), False,
                         resolve_stream(stream))


@binding(_SIG["conv2d"])
def conv2d(input: array, weight: array, /, stride: Union[int, tuple] = 1,
           padding: Union[int, tuple] = 0, dilation: Union[int, tuple] = 1, groups: int = 1, *,
           stream: StreamOrDevice = None) -> array:
    """2D convolution over an input ``(N, H, W, C_in)``."""
    return _convnd(2, input, weight, stride, padding, dilation, groups, stream)


@binding(_SIG["conv3d"])
def conv3d(input: array, weight: array, /, stride: Union[int, tuple] = 1,
           padding: Union[int, tuple] = 0, dilation: Union[int, tuple] = 1, groups: int = 1, *,
           stream: StreamOrDevice = None) -> array:
    """3D convolution over an input ``(N, D, H, W, C_in)`` (``groups`` 1 only)."""
    return _convnd(3, input, weight, stride, padding, dilation, groups, stream)


@binding(_SIG["conv_general"])
def conv_general(input: array, weight: array, /, stride: Union[int, Sequence[int]] = 1,
                 padding: Any = 0, kernel_dilation: Union[int, Sequence[int]] = 1,
                 input_dilation: Union[int, Sequence[int]] = 1, groups: int = 1,
                 flip: bool = False, *, stream: StreamOrDevice = None) -> array:
    """General convolution: strides, padding (one value, one per axis, or ``(low, high)``
    lists), kernel and input dilation, groups, and ``flip`` (convolution rather than
    cross-correlation)."""
    _arrays(input, weight)
    st = _int_or_ints(stride)
    p = _nb_int(padding)
    if p is not None:
        lo = hi = [p]
    else:
        lo = _ints(padding)
        hi = lo
        if lo is None:
            pair = _nb_items(padding)
            if pair is None or len(pair) != 2:
                raise BadArgs("padding")
            lo, hi = _ints(pair[0]), _ints(pair[1])
            if lo is None or hi is None:
                raise BadArgs("padding")
    kd, idil = _int_or_ints(kernel_dilation), _int_or_ints(input_dilation)
    g = _int(groups)
    if not isinstance(flip, bool):
        raise BadArgs("flip")
    return _conv_general(input, weight, st, lo, hi, kd, idil, g, flip, resolve_stream(stream))


@binding(_SIG["conv_transpose1d"])
def conv_transpose1d(input: array, weight: array, /, stride: int = 1, padding: int = 0,
                     dilation: int = 1, output_padding: int = 0, groups: int = 1, *,
                     stream: StreamOrDevice = None) -> array:
    """1D transposed convolution: output length ``(L - 1) * stride - 2 * padding +
    dilation * (K - 1) + 1 + output_padding``."""
    _arrays(input, weight)
    st, p, d, op, g = (_int(v) for v in (stride, padding, dilation, output_padding, groups))
    return _conv_transpose(input, weight, [st], [p], [d], [op], g, resolve_stream(stream))


def _conv_transpose_nd(n: int, input, weight, stride, padding, dilation, output_padding,
                       groups, stream) -> array:
    _arrays(input, weight)
    st, p, d, op = (_int_or_tuple(v, n) for v in (stride, padding, dilation, output_padding))
    return _conv_transpose(input, weight, st, p, d, op, _int(groups), resolve_stream(stream))


@binding(_SIG["conv_transpose2d"])
def conv_transpose2d(input: array, weight: array, /, stride: Union[int, tuple] = 1,
                     padding: Union[int, tuple] = 0, dilation: Union[int, tuple] = 1,
                     output_padding: Union[int, tuple] = 0, groups: int = 1, *,
                     stream: StreamOrDevice = None) -> array:
    """2D transposed convolution over an input ``(N, H, W, C_in)``."""
    return _conv_transpose_nd(2, input, weight, stride, padding, dilation, output_padding,
                              groups, stream)


@binding(_SIG["conv_transpose3d"])
def conv_transpose3d(input: array, weight: array, /, stride: Union[int, tuple] = 1,
                     padding: Union[int, tuple] = 0, dilation: Union[int, tuple] = 1,
                     output_padding: Union[int, tuple] = 0, groups: int = 1, *,
                     stream: StreamOrDevice = None) -> array:
    """3D transposed convolution over an input ``(N, D, H, W, C_in)``."""
    return _conv_transpose_nd(3, input, weight, stride, padding, dilation, output_padding,
                              groups, stream)


@binding(_SIG["convolve"])
def convolve(a: array, v: array, /, mode: str = "full", *,
             stream: StreamOrDevice = None) -> array:
    """The discrete convolution of 1D arrays (``mode`` "full", "same" or "valid"); the
    shorter one is the (flipped) filter."""
    _arrays(a, v)
    if not isinstance(mode, str):
        raise BadArgs("mode")
    if a.ndim != 1 or v.ndim != 1:
        raise ValueError("[convolve] Inputs must be 1D.")
    if a.size == 0 or v.size == 0:
        raise ValueError("[convolve] Inputs cannot be empty.")
    s = resolve_stream(stream)
    x, w = (v, a) if a.size < v.size else (a, v)
    n = w.shape[0]
    w = _slice(w, (n - 1,), (-1,), (-1,), s)
    x, w = reshape(x, (1, -1, 1), stream=s), reshape(w, (1, -1, 1), stream=s)
    padding = 0
    if mode == "full":
        padding = n - 1
    elif mode == "same":
        if n % 2:
            padding = n // 2
        else:  # even sizes pad asymmetrically
            x = pad(x, [(0, 0), (n // 2, max(0, n // 2 - 1)), (0, 0)], "constant",
                    array(0), stream=s)
    elif mode != "valid":
        raise ValueError("[convolve] Invalid mode.")
    out = _conv_general(x, w, [1], [padding], [padding], [1], [1], 1, False, s)
    return reshape(out, (-1,), stream=s)
