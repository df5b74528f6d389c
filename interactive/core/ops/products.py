"""Linear-algebra products: matmul, addmm, inner, outer, tensordot (MLX's ``Matmul`` and
``AddMM`` primitives plus the transposes / reshapes MLX records around them).
``einsum`` and ``einsum_path`` live in ``ops.einsum``."""

from __future__ import annotations

from typing import Sequence, Union

from .. import dtypes as _dt
from ..array import array
from ..device import StreamOrDevice, resolve_stream
from ..primitive import Primitive
from ..compile_trace import _dynamic, in_dynamic_tracing, note_partners
from .convert import broadcast, broadcast_known, broadcast_shapes, cast, _fmt_shape
from .reduction import op, require_array

__all__ = ["matmul", "addmm", "inner", "outer", "tensordot", "vecdot"]


def _mm_shapes(fname: str, a: array, b: array) -> tuple[tuple, tuple]:
    """Shapes after MLX's 1-D promotion, validated before anything is recorded."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"[{fname}] Got 0 dimension input. Inputs must have at least one dimension.")
    sa = (1,) + a.shape if a.ndim == 1 else a.shape
    sb = b.shape + (1,) if b.ndim == 1 else b.shape
    if sa[-1] != sb[-2]:
        raise ValueError(f"[{fname}] Last dimension of first input with shape {_fmt_shape(sa)} must "
                         f"match second to last dimension of second input with shape {_fmt_shape(sb)}.")
    return sa, sb


def _promote_1d(a: array, b: array, s) -> tuple[array, array]:
    if a.ndim == 1:
        a = op("expand_dims")(a, 0, stream=s)
    if b.ndim == 1:
        b = op("expand_dims")(b, -1, stream=s)
    return a, b


def _squeeze_1d(out: array, a_ndim: int, b_ndim: int, s) -> array:
    axes = []
    if a_ndim == 1:
        axes.append(out.ndim - 2)
    if b_ndim == 1:
        axes.append(out.ndim - 1)
    return op("squeeze")(out, axes, stream=s) if axes else out


def matmul(a: array, b: array, /, *, stream: StreamOrDevice = None) -> array:
    """Matrix product over the last two axes, broadcasting batch axes; 1-D inputs are
    promoted to matrices and the added axis removed (inexact dtypes only)."""
    return _matmul(a, b, stream)


def matmul_py(a: array, b: array, /, *, stream: StreamOrDevice = None) -> array:
    """``matmul``'s steps in Python: the reference of core/_products.c's ``_matmul`` (its
    common case) and every other case."""
    if a.__class__ is array and b.__class__ is array:  # matrices of one inexact dtype
        ad, bd = a._d, b._d
        sa, sb = ad.shape, bd.shape
        nd = len(sa)
        if (nd >= 2 and len(sb) == 2 and sa[-1] == sb[0] and ad.dtype is bd.dtype and
                ad.dtype.kind in "fVc"):  # inexact (what the steps below record for them)
            if nd == 2:
                return array._make1((sa[0], sb[1]), ad.dtype,
                                    Primitive("Matmul", resolve_stream(stream)), [a, b])
            if not _dynamic.on:  # (in_dynamic_tracing) a Linear's (..., K) @ (K, N): Flatten, Matmul, Unflatten
                s = resolve_stream(stream)
                lead = sa[:-1]
                n = 1
                for d in lead:
                    n *= d
                flat = (n, sa[-1])
                dt = ad.dtype
                x = array._make1(flat, dt, Primitive("Flatten", s, shape=flat, start_axis=0,
                                                     end_axis=nd - 2), [a])
                out = array._make1((n, sb[1]), dt, Primitive("Matmul", s), [x, b])
                full = lead + (sb[1],)
                return array._make1(full, dt, Primitive("Unflatten", s, shape=full, axis=0,
                                                        spec=lead), [out])
    require_array("matmul", "matmul(a: array, b: array, /, *, stream: StreamOrDevice = None) "
                  "-> array", a, b)
    sa, sb = _mm_shapes("matmul", a, b)
    out_type = _dt.promote_types(a.dtype, b.dtype)
    if not _dt.is_inexact(out_type):
        raise ValueError(f"[matmul] Only inexact types are supported but {a.dtype.name} and "
                         f"{b.dtype.name} were provided which results in {out_type.name}, which "
                         "is not a floating point type.")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    s = resolve_stream(stream)
    x, y = _promote_1d(a, b, s)
    x0, y0 = cast(x, out_type, s), cast(y, out_type, s)
    tracing = bool(batch) and in_dynamic_tracing()
    if a.ndim > 2 and b.ndim <= 2 and not tracing:
        # one product over a's leading axes flattened (mlx/ops.cpp matmul: Flatten, Matmul,
        # Unflatten; not under a shapeless trace, where Unflatten keeps the traced sizes)
        lead = sa[:-1]
        n = 1
        for d in lead:
            n *= d
        flat = (n, sa[-1])
        x = array._make1(flat, out_type, Primitive("Flatten", s, shape=flat, start_axis=0,
                                                   end_axis=len(sa) - 2), [x0])
        out = array._make1((n, sb[-1]), out_type, Primitive("Matmul", s), [x, y0])
        full = lead + (sb[-1],)
        out = array._make1(full, out_type, Primitive("Unflatten", s, shape=full, axis=0,
                                                     spec=lead), [out])
        return _squeeze_1d(out, a.ndim, b.ndim, s)
    if tracing:
        # each operand's batch axes follow the other's on replay: a Broadcast for each, even
        # of the same shape (MLX's broadcast_arrays records a BroadcastAxes for every input
        # under in_dynamic_tracing, mlx/ops.cpp), noting the other operand as its partner
        x = array._make1(batch + sa[-2:], x0._d.dtype, Primitive("Broadcast", s, shape=batch + sa[-2:]), [x0])
        y = array._make1(batch + sb[-2:], y0._d.dtype, Primitive("Broadcast", s, shape=batch + sb[-2:]), [y0])
        note_partners(x, [y0], keep=2)
        note_partners(y, [x0], keep=2)
    else:
        x = broadcast_known(x0, batch + sa[-2:], s)  # the batch shape checked above
        y = broadcast_known(y0, batch + sb[-2:], s)
    out = array._make([batch + (sa[-2], sb[-1])], [out_type], Primitive("Matmul", s), [x, y])[0]
    return _squeeze_1d(out, a.ndim, b.ndim, s)


def addmm(c: array, a: array, b: array, /, alpha: float = 1.0, beta: float = 1.0, *,
          stream: StreamOrDevice = None) -> array:
    """``alpha * (a @ b) + beta * c`` in one ``AddMM`` for real floats; complex64 is composed
    as ``matmul``, ``multiply`` and ``add``, as ``addmm`` in ``mlx/ops.cpp`` composes it."""
    return _addmm(c, a, b, alpha, beta, stream)


def addmm_py(c: array, a: array, b: array, /, alpha: float = 1.0, beta: float = 1.0, *,
             stream: StreamOrDevice = None) -> array:
    """``addmm``'s steps in Python: the reference of core/_products.c's ``_addmm`` (its
    common case) and every other case."""
    if a.__class__ is array and b.__class__ is array and c.__class__ is array:
        ad, bd, cd = a._d, b._d, c._d
        sa, sb, sc = ad.shape, bd.shape, cd.shape
        dt = ad.dtype
        if (len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0] and bd.dtype is dt and
                cd.dtype is dt and _dt.is_floating(dt) and
                len(sc) <= 2 and (not sc or sc[-1] in (1, sb[1])) and
                (len(sc) < 2 or sc[0] in (1, sa[0]))):
            # two matrices and a ``c`` that broadcasts to their product, of one real float
            # dtype: what the steps below record for them (c's Broadcast, one AddMM)
            s = resolve_stream(stream)
            out_shape = (sa[0], sb[1])
            z = broadcast_known(c, out_shape, s)
            prim = Primitive("AddMM", s, alpha=float(alpha), beta=float(beta))
            return array._make1(out_shape, dt, prim, [a, b, z])
    require_array("addmm", "addmm(c: array, a: array, b: array, /, alpha: float = 1.0, "
                  "beta: float = 1.0,  *, stream: StreamOrDevice = None) -> array", c, a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("[addmm] Got 0 dimension input. Inputs must have at least one dimension.")
    out_type = _dt.promote_types(_dt.promote_types(a.dtype, b.dtype), c.dtype)
    if out_type == _dt.complex64:
        s = resolve_stream(stream)
        scaled = op("multiply")(matmul(a, b, stream=s), array(float(alpha), _dt.float32), stream=s)
        return op("add")(scaled, op("multiply")(array(float(beta), _dt.float32), c, stream=s),
                         stream=s)
    sa, sb = _mm_shapes("addmm", a, b)
    if not _dt.is_floating(out_type):
        raise ValueError(f"[addmm] Only real floating point types are supported but "
                         f"{c.dtype.name}, {a.dtype.name} and {b.dtype.name} were provided which "
                         f"results in {out_type.name}, which is not a real floating point type.")
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    out_shape = batch + (sa[-2], sb[-1])
    adjusted = list(out_shape)
    if b.ndim == 1:
        adjusted.pop(-1)
    if a.ndim == 1:
        adjusted.pop(-2 if b.ndim != 1 else -1)
    adjusted = tuple(adjusted)
    if broadcast_shapes(c.shape, adjusted) != adjusted:
        raise ValueError("[addmm] input c must broadcast to the output shape")
    s = resolve_stream(stream)
    x, y = _promote_1d(a, b, s)
    x, y, z = cast(x, out_type, s), cast(y, out_type, s), cast(c, out_type, s)
    x = broadcast_known(x, batch + sa[-2:], s)  # the shapes checked above
    y = broadcast_known(y, batch + sb[-2:], s)
    z = broadcast_known(z, adjusted, s)
    if adjusted != out_shape:
        z = op("reshape")(z, out_shape, stream=s)
    prim = Primitive("AddMM", s, alpha=float(alpha), beta=float(beta))
    out = array._make([out_shape], [out_type], prim, [x, y, z])[0]
    return _squeeze_1d(out, a.ndim, b.ndim, s)


def _matmul_py(a: array, b: array, stream) -> array:
    return matmul_py(a, b, stream=stream)


def _addmm_py(c: array, a: array, b: array, alpha, beta, stream) -> array:
    return addmm_py(c, a, b, alpha, beta, stream=stream)


_matmul, _addmm = _matmul_py, _addmm_py


def _c_products() -> None:
    """``_matmul`` / ``_addmm`` in C (core/_products.c: their common case, the same nodes and
    descs; every other case, errors included, calls ``matmul_py`` / ``addmm_py``), where the
    extension is built and ``settings.c_call`` is on."""
    from tapescope.kernels.settings import settings
    from . import elementwise

    if not settings.c_call or elementwise.binary is elementwise.binary_py:
        return
    from .. import _call

    every = [d for d in vars(_dt).values() if isinstance(d, _dt.Dtype)]
    _call.configure_products({
        "array_type": array, "resolve_stream": resolve_stream,
        "inexact": {d for d in every if _dt.is_inexact(d)},
        "floating": {d for d in every if _dt.is_floating(d)},
        "dynamic": _dynamic, "matmul_py": matmul_py, "addmm_py": addmm_py})
    globals().update(_matmul=_call.matmul, _addmm=_call.addmm)


_c_products()


def inner(a: array, b: array, /, *, stream: StreamOrDevice = None) -> array:
    """Inner product over the last axes (a plain product when either is 0-D)."""
    require_array("inner", "inner(a: array, b: array, /, *, stream: StreamOrDevice = None) "
                  "-> array", a, b)
    if a.ndim == 0 or b.ndim == 0:
        return op("multiply")(a, b, stream=stream)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError("[inner] a and b must have the same last dimension.")
    return _tensordot(a, b, [-1], [-1], stream)


_VECDOT_SIG = "vecdot(a: array, b: array, /, *, axis: int = -1, stream: StreamOrDevice = None) -> array"


def vecdot(a: array, b: array, /, *, axis: int = -1, stream: StreamOrDevice = None) -> array:
    """The vector dot product along ``axis``: ``sum(conj(a) * b, axis)`` (``mlx/ops.cpp``
    vecdot: the axis is the same for both inputs, which broadcast elsewhere)."""
    require_array("vecdot", _VECDOT_SIG, a, b)
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"vecdot(): incompatible function arguments. The following argument "
                        f"types are supported:\n    1. {_VECDOT_SIG}\n\nInvoked with types: "
                        f"array, array, kwargs = {{ axis: {type(axis).__name__} }}")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("[vecdot] inputs must be at least 1D.")
    ax = axis + a.ndim if axis < 0 else axis
    if not 0 <= ax < a.ndim:
        raise IndexError("[vecdot] axis is out of bounds.")
    bx = axis + b.ndim if axis < 0 else axis
    if not 0 <= bx < b.ndim or bx != ax:
        raise ValueError("[vecdot] axis is out of bounds.")
    if a.shape[ax] != b.shape[bx]:
        raise ValueError("[vecdot] a and b must have the same size along axis.")
    s = resolve_stream(stream)
    if a.dtype == _dt.complex64:
        a = op("conjugate")(a, stream=s)
    return op("sum")(op("multiply")(a, b, stream=s), axis=ax, stream=s)


def outer(a: array, b: array, /, *, stream: StreamOrDevice = None) -> array:
    """Outer product of the flattened inputs: ``reshape(a, (-1, 1)) * flatten(b)``."""
    require_array("outer", "outer(a: array, b: array, /, *, stream: StreamOrDevice = None) "
                  "-> array", a, b)
    s = resolve_stream(stream)
    return op("multiply")(op("reshape")(a, (-1, 1), stream=s), op("flatten")(b, stream=s),
                          stream=s)


def _tensordot(a: array, b: array, axes_a: Sequence[int], axes_b: Sequence[int],
               stream: StreamOrDevice) -> array:
    if len(axes_a) != len(axes_b):
        raise ValueError("[tensordot] axes must have the same size.")
    csize = 1
    for i, j in zip(axes_a, axes_b):
        if a.shape[i] != b.shape[j]:
            raise ValueError("[tensordot] a and b must have the same shape on the contracted axes.")
        csize *= a.shape[i]
    ca = {x % a.ndim for x in axes_a}
    cb = {x % b.ndim for x in axes_b}
    t1 = [i for i in range(a.ndim) if i not in ca]
    t2 = [x % b.ndim for x in axes_b]
    rshape = [a.shape[i] for i in t1]
    size1 = 1
    for i in t1:
        size1 *= a.shape[i]
    t1 += [x % a.ndim for x in axes_a]
    size2 = 1
    for i in range(b.ndim):
        if i not in cb:
            t2.append(i)
            size2 *= b.shape[i]
            rshape.append(b.shape[i])
    s = resolve_stream(stream)
    x = op("reshape")(op("transpose")(a, t1, stream=s), (size1, csize), stream=s)
    y = op("reshape")(op("transpose")(b, t2, stream=s), (csize, size2), stream=s)
    return op("reshape")(matmul(x, y, stream=s), rshape, stream=s)


def tensordot(a: array, b: array, /, axes: Union[int, list] = 2, *,
              stream: StreamOrDevice = None) -> array:
    """Sum of products over ``axes`` (the last ``axes`` of a with the first of b, or two
    lists of axes)."""
    require_array("tensordot", "tensordot(a: array, b: array, /, axes: int | list[Sequence[int]] "
                  "= 2, *, stream: StreamOrDevice = None) -> array", a, b)
    if isinstance(axes, int) and not isinstance(axes, bool):
        if axes < 0:
            raise ValueError("[tensordot] axis must be greater or equal to 0.")
        if axes > min(a.ndim, b.ndim):
            raise ValueError("[tensordot] axis must be less than the number of dimensions of a and b.")
        return _tensordot(a, b, [i - axes for i in range(axes)], list(range(axes)), stream)
    if (not isinstance(axes, (list, tuple)) or len(axes) != 2
            or not all(isinstance(x, (list, tuple)) for x in axes)):
        raise TypeError("tensordot(): incompatible function arguments: axes must be an int or "
                        "a list of two sequences of ints.")
    return _tensordot(a, b, [int(x) for x in axes[0]], [int(x) for x in axes[1]], stream)
