"""Every method ``mx.array`` has beyond its class body (``array.py``), attached here at import:
the operators and the method forms of ops, and (defined beside their concern) indexing
(``array_indexing.py``) and the interchange protocols (``interop.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as _dt
from . import array_indexing as _indexing
from . import interop as _interop
from . import ops
from .array import array
from .ops import elementwise as _elementwise
from .ops import products as _products
from .device import StreamOrDevice
from .ops.convert import incompatible, is_scalar_or_array, to_array, type_name


# ---- operators and elementwise methods (owner: elementwise ops and dtypes) ------------
_OPERAND_SIG = ("{}(self, other: bool | int | float | mlx.core.array | ndarray[writable=False] | "
                "complex | mlx.core.ArrayLike) -> mlx.core.array")


def _operand(self: array, other: Any, method: str, what: str, inplace: bool = False) -> array:
    """``other`` as an operand of ``self``'s operator: typed weakly against ``self``, with
    MLX's errors for None (TypeError) and unsupported types (ValueError)."""
    if other.__class__ is array:  # the common case: nothing to convert
        return other
    if other.__class__ is float:  # the next most common: a Python float, which the op's
        return other                # ``binary`` types weakly against ``self``
    if other is None:
        raise incompatible(method, _OPERAND_SIG.format(method), self, other)
    if not is_scalar_or_array(other):
        prefix = "inplace " if inplace else ""
        raise ValueError(f"Cannot perform {prefix}{what} on an mlx.core.array and {type_name(other)}")
    return to_array(other, self.dtype)


# operators whose op is ``binary(name, a, b, stream)`` of its operands as given (ops/binary.py);
# divide's too where ``self`` is inexact and the other operand a float or of its dtype (its
# compute dtype is then theirs)
_AS_GIVEN = {"add": "Add", "subtract": "Subtract", "multiply": "Multiply"}
_INEXACT_AS_GIVEN = {"divide": "Divide"}


def _operator(fn_name: str, method: str, what: str, reflected: bool = False,
              inplace: bool = False, bitwise: bool = False):
    name = None if inplace or bitwise else _AS_GIVEN.get(fn_name)
    inexact = None if inplace or bitwise else _INEXACT_AS_GIVEN.get(fn_name)

    def op(self: array, other: Any) -> array:
        if inexact is not None and self._d.dtype.kind in "fVc" and (
                other.__class__ is float or
                (other.__class__ is array and other._d.dtype is self._d.dtype)):
            binary = _elementwise.binary
            return binary(inexact, other, self, None) if reflected else binary(inexact, self, other, None)
        if name is not None and (other.__class__ is array or other.__class__ is float):
            # the common operand: the op's own ``binary`` call, without its Python frames
            # (``_elementwise.binary``: the C one where it is built)
            binary = _elementwise.binary
            return binary(name, other, self, None) if reflected else binary(name, self, other, None)
        o = _operand(self, other, method, what, inplace)
        if inplace and fn_name == "divide" and not _dt.is_inexact(self.dtype):
            raise ValueError("In place division cannot cast to non-floating point type.")
        if bitwise and o.__class__ is float:
            o = to_array(o, self._d.dtype)
        if bitwise and (_dt.is_inexact(self.dtype) or _dt.is_inexact(o.dtype)):
            raise ValueError(f"Floating point types not allowed with {what}.")
        fn = getattr(ops, fn_name)
        out = fn(o, self) if reflected else fn(self, o)
        if inplace:  # MLX overwrites the array in place: every handle sees the new value
            self._d = out._d
            return self
        return out

    op.__name__ = method
    op.__doc__ = f"``{fn_name}`` as the ``{method}`` operator."
    return op


_ARITH = (("add", "add", "addition", True), ("sub", "subtract", "subtraction", True),
          ("mul", "multiply", "multiplication", True), ("truediv", "divide", "division", True),
          ("div", "divide", "division", True), ("floordiv", "floor_divide", "floor division", True),
          ("mod", "remainder", "modulus", True), ("pow", "power", "power", True))
_COMMUTATIVE = ("add", "mul")
_BITWISE = (("and", "bitwise_and", "bitwise and"), ("or", "bitwise_or", "bitwise or"),
            ("xor", "bitwise_xor", "bitwise xor"), ("lshift", "left_shift", "left shift"),
            ("rshift", "right_shift", "right shift"))
_COMPARE = (("lt", "less", "less than"), ("le", "less_equal", "less than or equal"),
            ("gt", "greater", "greater than"), ("ge", "greater_equal", "greater than or equal"))


def _equality(fn_name: str, method: str, otherwise: bool):
    def op(self: array, other: Any):
        if other is None:
            raise incompatible(method, _OPERAND_SIG.format(method).replace(
                "-> mlx.core.array", "-> mlx.core.array | bool"), self, other)
        if not is_scalar_or_array(other):
            return otherwise  # MLX: an array never equals a list, a string, a dtype, ...
        return getattr(ops, fn_name)(self, to_array(other, self.dtype))

    op.__name__ = method
    op.__doc__ = f"``{fn_name}`` as the ``{method}`` operator (a bool for non-array types)."
    return op


def _matmul(inplace: bool):
    method = "__imatmul__" if inplace else "__matmul__"

    def op(self: array, other: Any) -> array:
        if other.__class__ is array:  # (to_array's result for an array: itself)
            out = ops.matmul(self, other)
        elif not isinstance(other, (array, np.ndarray)):
            raise incompatible(method, f"{method}(self, other: mlx.core.array) -> mlx.core.array",
                               self, other)
        else:
            out = ops.matmul(self, to_array(other))
        if inplace:
            self._d = out._d
            return self
        return out

    op.__name__ = method
    return op


def _invert(self: array) -> array:
    """``~a``: bitwise inversion of integers, logical not of bools."""
    if _dt.is_inexact(self.dtype):
        raise ValueError("Floating point types not allowed with bitwise inversion.")
    return ops.bitwise_invert(self)


def _method(fn_name: str):
    def method(self: array, *, stream: StreamOrDevice = None) -> array:
        return getattr(ops, fn_name)(self, stream=stream)

    method.__name__ = fn_name
    method.__doc__ = f"``mx.{fn_name}`` of this array."
    return method


def _install() -> None:
    A = array
    for short, fn_name, what, reflect in _ARITH:
        setattr(A, f"__{short}__", _operator(fn_name, f"__{short}__", what))
        setattr(A, f"__i{short}__", _operator(fn_name, f"__i{short}__", what, inplace=True))
        if reflect:
            # MLX keeps the array first for the commutative ones (``2 * y`` is Multiply(y, 2)),
            # which decides the graph's input order and so the fused kernels' names
            setattr(A, f"__r{short}__", _operator(fn_name, f"__r{short}__", what,
                                                  reflected=short not in _COMMUTATIVE))
    for short, fn_name, what in _BITWISE:  # MLX has no reflected bitwise operators
        setattr(A, f"__{short}__", _operator(fn_name, f"__{short}__", what, bitwise=True))
        setattr(A, f"__i{short}__", _operator(fn_name, f"__i{short}__", what, inplace=True,
                                               bitwise=True))
    for short, fn_name, what in _COMPARE:
        setattr(A, f"__{short}__", _operator(fn_name, f"__{short}__", what))
    A.__eq__ = _equality("equal", "__eq__", False)
    A.__ne__ = _equality("not_equal", "__ne__", True)
    A.__matmul__ = _matmul(False)
    A.__imatmul__ = _matmul(True)
    A.__invert__ = _invert
    A.__neg__ = lambda self: ops.negative(self)
    A.__pos__ = lambda self: self
    A.__abs__ = lambda self: ops.abs(self)
    for name in ("abs", "conj", "cos", "exp", "log", "log10", "log1p", "log2", "reciprocal",
                 "rsqrt", "sin", "sqrt", "square"):
        setattr(A, name, _method(name))

    def round(self: array, decimals: int = 0, *, stream: StreamOrDevice = None) -> array:
        """``mx.round`` of this array."""
        return ops.round(self, decimals, stream=stream)

    def astype(self: array, dtype: _dt.Dtype, stream: StreamOrDevice = None) -> array:
        """This array cast to ``dtype``."""
        return ops.astype(self, dtype, stream=stream)

    A.round = round
    A.astype = astype
    A.real = property(lambda self: ops.real(self), doc="The real part of a complex array.")
    A.imag = property(lambda self: ops.imag(self), doc="The imaginary part of a complex array.")


_install()


def _install_c_operators() -> None:
    """``+ - * /`` and their reflected forms in C (core/_binary.c install_operators: the
    same ``binary`` call for an array or float operand, these Python ops for any other and
    every error), where ``binary`` is the C one."""
    if _elementwise.binary is _elementwise.binary_py:
        return
    from . import _call

    PY_OPERATORS.update((n, array.__dict__[n]) for n in (
        "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
        "__rtruediv__"))
    _call.install_operators(dict(PY_OPERATORS))
    if _products._matmul is _call.matmul:  # ``@``: core/_products.c's matmul (install_matmul)
        PY_OPERATORS["__matmul__"] = array.__dict__["__matmul__"]
        _call.install_matmul(PY_OPERATORS["__matmul__"])


PY_OPERATORS: dict = {}  # (the Python ops the C operators replace: their reference)


_install_c_operators()


# ---- reductions and scans (owner: reductions/scans/products/sort) --------------------
def _install_reductions() -> None:
    """Method forms of the reductions and scans, with MLX's method signatures."""
    A = array

    def _reduction(name):
        fn = getattr(ops, name)

        def method(self, axis=None, keepdims=False, *, stream=None):
            return fn(self, axis, keepdims, stream=stream)

        method.__name__ = name
        method.__doc__ = fn.__doc__
        return method

    for name in ("sum", "prod", "max", "min", "all", "any", "mean", "logsumexp",
                 "argmax", "argmin"):
        setattr(A, name, _reduction(name))

    def _moment(name):
        fn = getattr(ops, name)

        def method(self, axis=None, keepdims=False, ddof=0, *, correction=None, stream=None):
            return fn(self, axis, keepdims, ddof if correction is None else correction,
                      stream=stream)

        method.__name__ = name
        method.__doc__ = fn.__doc__
        return method

    A.var = _moment("var")
    A.std = _moment("std")

    def _scan(name):
        fn = getattr(ops, name)

        def method(self, axis=None, *, reverse=False, inclusive=True, stream=None):
            return fn(self, axis, reverse=reverse, inclusive=inclusive, stream=stream)

        method.__name__ = name
        method.__doc__ = fn.__doc__
        return method

    for name in ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"):
        setattr(A, name, _scan(name))


_install_reductions()


# ---- shape, view and indexing methods (owner: creation/shape/indexing ops) ------------
def _install_shape_methods() -> None:
    """Method forms of the shape ops, with MLX's method signatures."""
    A = array

    def _shape_args(args: tuple) -> Any:
        return args[0] if len(args) == 1 and not isinstance(args[0], int) else args

    def reshape(self: array, *shape: Any, stream: StreamOrDevice = None) -> array:
        """``mx.reshape``; the shape may be given as one sequence or as ints."""
        return ops.reshape(self, _shape_args(shape), stream=stream)

    def transpose(self: array, *axes: Any, stream: StreamOrDevice = None) -> array:
        """``mx.transpose``; the axes may be given as one sequence or as ints."""
        return ops.transpose(self, _shape_args(axes) if axes else None, stream=stream)

    def flatten(self: array, start_axis: int = 0, end_axis: int = -1, *,
                stream: StreamOrDevice = None) -> array:
        """``mx.flatten`` of this array."""
        return ops.flatten(self, start_axis, end_axis, stream=stream)

    def squeeze(self: array, axis: Any = None, *, stream: StreamOrDevice = None) -> array:
        """``mx.squeeze`` of this array."""
        return ops.squeeze(self, axis, stream=stream)

    def swapaxes(self: array, axis1: int, axis2: int, *, stream: StreamOrDevice = None) -> array:
        """``mx.swapaxes`` of this array."""
        return ops.swapaxes(self, axis1, axis2, stream=stream)

    def moveaxis(self: array, source: int, destination: int, *,
                 stream: StreamOrDevice = None) -> array:
        """``mx.moveaxis`` of this array."""
        return ops.moveaxis(self, source, destination, stream=stream)

    def split(self: array, indices_or_sections: Any, axis: int = 0, *,
              stream: StreamOrDevice = None) -> list:
        """``mx.split`` of this array."""
        return ops.split(self, indices_or_sections, axis, stream=stream)

    def diag(self: array, k: int = 0, *, stream: StreamOrDevice = None) -> array:
        """``mx.diag`` of this array."""
        return ops.diag(self, k, stream=stream)

    def diagonal(self: array, offset: int = 0, axis1: int = 0, axis2: int = 1,
                 stream: StreamOrDevice = None) -> array:
        """``mx.diagonal`` of this array."""
        return ops.diagonal(self, offset, axis1, axis2, stream=stream)

    for fn in (reshape, transpose, flatten, squeeze, swapaxes, moveaxis, split, diag, diagonal):
        setattr(A, fn.__name__, fn)
    A.T = property(lambda self: ops.transpose(self), doc="Equivalent to ``self.transpose()``.")
    A.mT = property(lambda self: ops.swapaxes(self, -1, -2),
                    doc="The transpose of the last two axes.")


_install_shape_methods()


# the Python method forms the C ones fall back on (the tests' reference), where C's are in
python_methods: dict = {}


def _c_shape_methods() -> None:
    """The layout ops' method forms, ``astype`` and the ``T`` / ``mT`` getters in C
    (core/_layout.c: the common case, the same nodes as ops/shape.py's; the Python methods
    above run every other case), where ops/shape.py's functions are C's."""
    from .ops import shape as _shape

    if _shape.reshape is _shape.python_ops["reshape"]:
        return
    from . import _call

    A = array
    py = {name: A.__dict__[name] for name in ("reshape", "transpose", "squeeze", "swapaxes",
                                              "moveaxis", "astype", "__getitem__",
                                              "__setitem__")}
    py.update(T=A.__dict__["T"].fget, mT=A.__dict__["mT"].fget)
    got = _call.configure_layout_methods(py)
    python_methods.update(py)
    for name in py:
        if name in ("T", "mT"):
            setattr(A, name, property(got[name], doc=A.__dict__[name].__doc__))
        else:
            setattr(A, name, got[name])



# ---- indexing, the bit view, the interchange protocols ---------------------------------
def _view(self: array, dtype: _dt.Dtype, *, stream: StreamOrDevice = None) -> array:
    """View the array's bits as ``dtype`` (see ``mx.view``)."""
    if not isinstance(dtype, _dt.Dtype):
        raise incompatible("view", "view(self, dtype: mlx.core.Dtype, *, stream: mlx.core.Stream "
                           "| mlx.core.ThreadLocalStream | mlx.core.Device | mlx.core.DeviceType "
                           "| None = None) -> mlx.core.array", self, dtype)
    return ops.view(self, dtype, stream=stream)


_view.__name__ = "view"
_view.__qualname__ = "array.view"


def _install_protocols() -> None:
    A = array
    A.__getitem__ = _indexing.getitem
    A.__setitem__ = _indexing.setitem
    A.at = property(_indexing.at, doc="Out-of-place scatter updates: x.at[idx].add(v).")
    A.view = _view
    A.__dlpack__ = _interop.dlpack
    A.__dlpack_device__ = _interop.dlpack_device
    A.__cuda_array_interface__ = property(_interop.cuda_array_interface)
    A.__array_namespace__ = _interop.array_namespace
    A.__bytes__ = _interop.as_bytes


_install_protocols()


_c_shape_methods()  # (last: over the Python methods above, __getitem__ among them)
