"""``mx.array``: a lazy array — a node in the graph until evaluated, then a view over data."""

from __future__ import annotations

import copyreg
import weakref
from typing import Any, Optional, Sequence

import numpy as np

from tapescope.kernels.allocator import BufferHandle, allocator, owner_of
from tapescope.kernels.backends import host_array, stream_backend

from . import dtypes as _dt
from .device import DeviceType, incompatible, resolve_stream
from .primitive import Node, Primitive
from .transform_tracers import any_tracer


class ArrayDesc:
    """The shared state of an array (MLX's ``ArrayDesc``): shape, dtype, stream, and either
    a graph node (while lazy) or data (once evaluated). Several ``array`` handles may share
    one desc; graph nodes reference descs, never the Python handles.

    Evaluated data is a numpy view over an allocator buffer; ``buffer`` is the shared
    ``BufferHandle`` (views of the same memory hold the same handle), and the buffer goes
    back to the allocator when the last desc holding it is gone.
    """

    __slots__ = ("shape", "dtype", "stream", "node", "index", "data", "buffer", "tracer", "kept",
                 "__weakref__")

    def __init__(self, shape: tuple, dtype: _dt.Dtype, stream, node: Optional[Node] = None,
                 index: int = 0, data: Optional[np.ndarray] = None,
                 buffer: Optional[BufferHandle] = None):
        self.shape = shape
        self.dtype = dtype
        self.stream = stream
        self.node = node
        self.index = index
        self.data = data
        self.buffer = buffer
        # MLX's tracer flag, and the node an evaluated tracer keeps (core/transform_tracers.py)
        self.tracer = node is not None and any_tracer(node.inputs)
        self.kept: Optional[Node] = None
        if data is not None and buffer is None:
            be = stream_backend(stream) if stream is not None else None
            if be is not None and be.array_type is not np.ndarray:
                # a GPU array made from host data lives in the device's memory (as in MLX)
                self.data, self.buffer = be.allocator.import_host(data, stream)
                return
            if data.base is not None:  # never adopt memory that something else owns
                data = self.data = np.array(data)
            alloc = allocator("cpu")  # adopt(data): ``data`` owns its memory
            self.buffer = BufferHandle(alloc.adopt(data), alloc)

    @property
    def evaluated(self) -> bool:
        return self.node is None

    def set_data(self, data: np.ndarray, buffer: BufferHandle) -> None:
        """Store the evaluated value (a view into ``buffer``) and detach from the graph."""
        self.data = data
        self.buffer = buffer
        self.node = None


def adopt(data: np.ndarray, device: str = "cpu") -> BufferHandle:
    """Account for numpy-allocated ``data`` in the device allocator; returns its handle."""
    alloc = allocator(device)
    return BufferHandle(alloc.adopt(owner_of(data)), alloc)


_INIT_SIG = ("__init__(self: array, val: scalar | list | tuple | DLPackCompatible | array, "
             "dtype: Dtype | None = None)")
_CONVERT_ERR = "[convert] Only length-1 arrays can be converted to Python scalars."


def _int_dtype(v: int) -> _dt.Dtype:
    """MLX's type for a Python int: int32 when it fits, else int64 (beyond that: bad_cast)."""
    if -(2**31) <= v < 2**31:
        return _dt.int32
    if -(2**63) <= v < 2**63:
        return _dt.int64
    raise RuntimeError("std::bad_cast")


def _list_shape(val: Any) -> tuple:
    """The shape MLX reads off a nested list: the lengths along its chain of first elements."""
    shape = []
    while isinstance(val, (list, tuple)):
        shape.append(len(val))
        if not val:
            break
        val = val[0]
    if isinstance(val, array):
        shape.extend(val.shape)
    return tuple(shape)


def _scalar_dtype(val: Any) -> _dt.Dtype:
    """MLX's type for one list element (numpy scalars only where they subclass float/complex)."""
    if isinstance(val, bool):
        return _dt.bool_
    if isinstance(val, int):
        return _int_dtype(val)
    if isinstance(val, float):
        return _dt.float32
    if isinstance(val, complex):
        return _dt.complex64
    raise ValueError(f"Invalid type {type(val).__name__} received in array initialization.")


def _check_list(val: Any, shape: tuple, depth: int, found: list) -> None:
    """Walk the list in order as MLX does, checking it against ``shape``; collect leaf dtypes."""
    if isinstance(val, array):
        if val.shape != shape[depth:]:  # MLX: a mismatched array is a length mismatch
            raise ValueError("Initialization encountered non-uniform length.")
        found.append(val.dtype)
    elif depth == len(shape):
        if isinstance(val, (list, tuple)):
            raise ValueError("Initialization encountered extra dimension.")
        found.append(_scalar_dtype(val))
    elif not isinstance(val, (list, tuple)) or len(val) != shape[depth]:
        raise ValueError("Initialization encountered non-uniform length.")
    else:
        for v in val:
            _check_list(v, shape, depth + 1, found)


class _Exported:
    """The base of a numpy view handed out of tapescope: it holds the buffer's handle, so the
    allocator cannot recycle the memory while the view lives."""

    __slots__ = ("__array_interface__", "handle", "data")

    def __init__(self, data: np.ndarray, handle: Optional[BufferHandle]):
        iface = dict(data.__array_interface__)
        iface["data"] = (iface["data"][0], True)  # read-only
        self.__array_interface__ = iface
        self.handle = handle
        # the memory itself: for a GPU array ``data`` is a host copy that nothing else holds
        # (without it the view would read freed memory)
        self.data = data


def _export_view(data: np.ndarray, handle: Optional[BufferHandle]) -> np.ndarray:
    """A read-only numpy view of ``data`` that keeps its buffer alive."""
    return np.asarray(_Exported(data, handle))


def _infer_list(val: Any) -> tuple[tuple, _dt.Dtype]:
    """Shape and MLX dtype of a nested Python list (MLX's initialization rules)."""
    shape = _list_shape(val)
    found: list[_dt.Dtype] = []
    _check_list(val, shape, 0, found)
    if not found:
        return shape, _dt.float32
    d = found[0]
    for t in found[1:]:
        if t != d:
            d = _dt.promote_types(d, t)
    return shape, d


def _holds_array(val: Any) -> bool:
    """Whether a nested list has an ``mx.array`` anywhere in it."""
    for v in val:
        if isinstance(v, array) or (isinstance(v, (list, tuple)) and _holds_array(v)):
            return True
    return False


def _to_numpy_list(val: Any) -> Any:
    if isinstance(val, array):
        return val.tolist()
    if isinstance(val, (list, tuple)):
        return [_to_numpy_list(v) for v in val]
    return val


def check_dimensions(shape: Sequence[int], op: str = "") -> None:
    """MLX's shape dimensions are 32-bit: a computed dimension outside raises its
    OverflowError (``[op] Shape dimension N is outside ...``, without the op for data)."""
    for d in shape:
        if not -(2**31) <= d < 2**31:
            raise OverflowError(f"{f'[{op}] ' if op else ''}Shape dimension {d} is outside the "
                                "supported range [-2147483648, 2147483647]. MLX currently uses "
                                "32-bit integers for shape dimensions.")


def _numpy_source(val: np.ndarray) -> tuple[np.ndarray, _dt.Dtype]:
    """A numpy array's data and MLX dtype (float64 -> float32, complex128 -> complex64)."""
    if val.dtype.kind in "OSUVMm" and val.dtype not in (_dt.bfloat16.np,):
        raise RuntimeError("std::bad_cast")
    if any(s < 0 for s in val.strides):
        raise ValueError("Cannot convert DLPack arrays with negative strides to mlx array.")
    check_dimensions(val.shape)
    inferred = _dt.float32 if val.dtype == np.float64 else _dt.from_numpy(val.dtype)
    return val, inferred


# The range of Python ints MLX accepts in a list for an integer (or bool) target dtype: it
# fills int64 / uint32 / uint64 arrays directly and every other integer type through int32.
_LIST_INT_RANGE = {"int64": (-(2**63), 2**63), "uint32": (0, 2**32), "uint64": (0, 2**64)}


def _convert(src: Any, inferred: _dt.Dtype, out: _dt.Dtype) -> np.ndarray:
    """``src`` as numpy data of dtype ``out``, converting the way MLX does.

    Python values are first made into MLX's inferred type (floats: float32, unless the target
    is float64; a list of ints must fit the type MLX fills it through, ``_LIST_INT_RANGE``),
    numpy complex128 into complex64, then cast C-style; complex to bool reads the real part.
    """
    if isinstance(src, np.ndarray):
        data = src.astype(np.complex64) if src.dtype == np.complex128 else src
    elif isinstance(src, list) and (_dt.is_integer(inferred) or inferred == _dt.bool_):
        data = np.array(src, dtype=inferred.np)
        lo, hi = _LIST_INT_RANGE.get(out.name, (-(2**31), 2**31)) if out.kind in "biu" else (None, None)
        if lo is not None and data.size and (int(data.min()) < lo or int(data.max()) >= hi):
            raise RuntimeError("std::bad_cast")
    elif inferred == _dt.float32 and out == _dt.float64:
        data = np.array(src, dtype=np.float64)
    else:
        data = np.array(src, dtype=inferred.np)
    if data.dtype.kind == "c" and out.kind != "c":  # MLX keeps the real part (bool too)
        data = data.real
    return np.array(data, dtype=out.np, copy=True)


def _from_value(val: Any, dtype: Optional[_dt.Dtype]) -> tuple[np.ndarray, _dt.Dtype]:
    """Convert a Python/numpy value into (numpy data, Dtype) following MLX's rules."""
    if isinstance(val, np.ndarray):
        src, inferred = _numpy_source(val)
    elif isinstance(val, np.generic):
        src, inferred = _numpy_source(np.asarray(val))
    elif isinstance(val, (list, tuple)):
        _, inferred = _infer_list(val)
        src = _to_numpy_list(val)
    elif isinstance(val, (bool, int, float, complex)):
        _, inferred = _infer_list(val)
        src = val
    elif isinstance(val, (bytes, bytearray, memoryview)):
        src, inferred = _numpy_source(np.asarray(memoryview(val)))
    elif hasattr(val, "__cuda_array_interface__") and not isinstance(val, array):
        import cupy  # a CUDA array (CuPy, Numba, PyTorch): read through the host for now

        src, inferred = _numpy_source(cupy.asnumpy(cupy.asarray(val)))
    elif hasattr(val, "__array__") or hasattr(val, "__array_interface__"):
        try:
            host = np.asarray(val)
        except (TypeError, ValueError):  # numpy has no such dtype (a torch / MLX bfloat16)
            from .dlpack_import import host_copy

            host = host_copy(val)
            if host is None:
                raise
        src, inferred = _numpy_source(host)
    elif hasattr(val, "__dlpack__"):  # a DLPack producer with no numpy form
        from .dlpack_import import host_copy

        host = host_copy(val)
        if host is None:
            raise ValueError(f"Invalid type {type(val).__name__} received in array initialization.")
        src, inferred = _numpy_source(host)
    else:
        raise ValueError(f"Invalid type {type(val).__name__} received in array initialization.")
    out = dtype or inferred
    with np.errstate(all="ignore"):
        data = _convert(src, inferred, out)
    if out == _dt.bfloat16:  # MLX's float -> bfloat16 makes every NaN the positive quiet NaN
        nans = np.isnan(data)
        if nans.any():
            data[nans] = np.nan
    return data, out


try:  # Python < 3.12: a C base type exports __buffer__ (interactive/core/_buffer.c)
    from ._buffer import BufferBase as _BufferBase
except ImportError:  # Python >= 3.12 (PEP 688), or built without a C compiler
    _BufferBase = object


_FLT_MAX = float(np.finfo(np.float32).max)


class array(_BufferBase):
    """An N-dimensional array, lazily computed (``mx.array(val, dtype=None)``)."""

    __slots__ = ("_d", "__weakref__")

    def __init__(self, val: Any, dtype: Optional[_dt.Dtype] = None):
        # a Python float in float32's range to float32 (the scalar every op's constant is):
        # the general path's result, without its dispatch and error-state bracket
        if type(val) is float and (dtype is None or dtype is _dt.float32) and \
                -_FLT_MAX <= val <= _FLT_MAX:
            self._d = ArrayDesc((), _dt.float32, resolve_stream(None),
                                data=np.array(val, dtype=np.float32))
            return
        if dtype is not None and not isinstance(dtype, _dt.Dtype):
            raise incompatible("__init__", _INIT_SIG, self, val, dtype=dtype)
        if isinstance(val, array):
            if dtype is not None and dtype != val.dtype:
                from .ops import astype

                self._d = astype(val, dtype)._d
            else:
                self._d = val._d
            return
        if val is None:
            raise incompatible("__init__", _INIT_SIG, self, val)
        if hasattr(type(val), "__mlx_array__"):  # an ArrayLike
            self.__init__(val.__mlx_array__(), dtype)
            return
        if isinstance(val, (list, tuple)) and _holds_array(val):
            # MLX's array_from_list with arrays inside: the checks, then each element made an
            # array and the lot stacked, so the arrays stay in the graph (python/src/convert.cpp)
            _infer_list(val)
            from .ops import stack

            self._d = stack([array(v, dtype) for v in val])._d
            return
        data, dt = _from_value(val, dtype)
        self._d = ArrayDesc(data.shape, dt, resolve_stream(None), data=data)

    # -- construction used by ops -------------------------------------------------------
    def _handle(self) -> "array":
        """A new handle on the same array: what an op with nothing to do returns, as MLX
        never hands back its argument's handle (an in-place operator overwrites a handle,
        so ``b = mx.reshape(a, a.shape); b += 1`` must leave ``a`` alone)."""
        h = array.__new__(array)
        h._d = self._d
        return h

    @staticmethod
    def _wrap(desc: ArrayDesc) -> "array":
        a = array.__new__(array)
        a._d = desc
        return a

    @staticmethod
    def _from_data(data: np.ndarray, dtype: _dt.Dtype, stream=None) -> "array":
        return array._wrap(ArrayDesc(tuple(data.shape), dtype, stream or resolve_stream(None), data=data))

    @staticmethod
    def _make1(shape: tuple, dtype: _dt.Dtype, primitive: Primitive, inputs: list["array"]) -> "array":
        """Record a single-output ``primitive`` (``shape`` must be a tuple of ints)."""
        if primitive.stream.device._type is _GPU and _f64_in((dtype,), inputs):
            _no_gpu_float64(primitive.stream)
        node = Node(primitive, [x._d for x in inputs])
        d = ArrayDesc(shape, dtype, primitive.stream, node=node)
        node.outputs.append(weakref.ref(d))
        a = array.__new__(array)
        a._d = d
        return a

    @staticmethod
    def _make(shapes, dtypes, primitive: Primitive, inputs: list["array"]) -> list["array"]:
        """Record ``primitive`` applied to ``inputs`` as a node with one output per shape."""
        if primitive.stream.device._type is _GPU and _f64_in(dtypes, inputs):
            _no_gpu_float64(primitive.stream)
        node = Node(primitive, [x._d for x in inputs])
        outs = []
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            d = ArrayDesc(tuple(int(s) for s in shape), dtype, primitive.stream, node=node, index=i)
            node.outputs.append(weakref.ref(d))
            outs.append(array._wrap(d))
        return outs

    # -- properties ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._d.shape

    @property
    def dtype(self) -> _dt.Dtype:
        return self._d.dtype

    @property
    def ndim(self) -> int:
        return len(self._d.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self._d.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self._d.dtype.size

    @property
    def nbytes(self) -> int:
        return self.size * self._d.dtype.size

    # -- realising ----------------------------------------------------------------------
    def _numpy(self) -> np.ndarray:
        """Evaluate and return the numpy view of the data (read-only to callers)."""
        if self._d.node is not None:
            from .eval_api import eval as _eval

            _eval(self)
        data = self._d.data
        return data if type(data) is np.ndarray else host_array(data)  # a GPU's: copied to the host

    def item(self) -> Any:
        """The value of a size-1 array as a Python scalar."""
        if self.size != 1:
            raise ValueError(_CONVERT_ERR)
        v = self._numpy().reshape(()).item()
        if self.dtype == _dt.bfloat16:
            v = float(v)
        return v

    def tolist(self) -> Any:
        """The array as (nested) Python lists of Python scalars (a scalar for 0-d)."""
        data = self._numpy()
        if self.dtype == _dt.bfloat16:
            data = data.astype(np.float32)
        return data.tolist()

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        """The data as a numpy array (numpy casts to ``dtype`` itself, as with MLX).

        MLX hands numpy its own memory; tapescope hands out a copy, or with ``copy=False``
        a read-only view, so that numpy cannot write into buffers the runtime may reuse.
        """
        if self.dtype == _dt.bfloat16:  # MLX exports through PEP 3118, which has no bfloat16
            raise ValueError("'bfloat16' is not a valid PEP 3118 buffer format string")
        data = self._numpy()
        if copy is False:
            return _export_view(data, self._d.buffer)
        return np.array(data, copy=True)

    def __buffer__(self, flags: int) -> memoryview:
        """The buffer protocol (``memoryview(x)``): the data as it lies, strides included.

        Python 3.12 calls this itself (PEP 688); before 3.12 the C base type
        ``_buffer.BufferBase`` does. Unlike MLX the view is read-only: the runtime recycles
        buffers, so nobody may write into one behind its back.
        """
        if self.dtype == _dt.bfloat16:
            raise ValueError("'bfloat16' is not a valid PEP 3118 buffer format string")
        data = self._numpy()
        mv = memoryview(_export_view(data, self._d.buffer))
        if mv.format in ("l", "L") and data.flags.c_contiguous:  # MLX spells int64 'q' / 'Q'
            mv = mv.cast("B").cast("Q" if mv.format == "L" else "q", data.shape)
        return mv

    def __repr__(self) -> str:
        from .printing import format_array

        return format_array(self)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if self.ndim == 0:
            return format(self.item(), spec)
        if spec == "":
            return str(self)
        raise TypeError("unsupported format string passed to mx.array.__format__")

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() 0-dimensional array.")
        return self.shape[0]

    def __iter__(self) -> "ArrayIterator":
        if self.ndim == 0:
            raise TypeError("iter() 0-dimensional array.")
        return ArrayIterator._new(self)

    def __bool__(self) -> bool:
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __index__(self) -> int:
        if self.ndim != 0 or not _dt.is_integer(self.dtype):
            raise TypeError("Only 0-dimensional integer arrays can be converted to an index.")
        return int(self.item())

    __hash__ = object.__hash__  # by identity, as MLX (an array's == is elementwise)

    def __copy__(self) -> "array":
        return array._wrap(self._d)

    def __deepcopy__(self, memo: dict) -> "array":
        return array._wrap(self._d)  # arrays are immutable values; MLX shares the data too

    def __reduce_ex__(self, protocol: int) -> tuple:
        """Pickle through __getstate__ / __setstate__ (the C base type has no reducer)."""
        return copyreg.__newobj__, (array,), self.__getstate__()

    def __getstate__(self) -> tuple:
        """Pickled state as MLX makes it: (numpy data, dtype number); bfloat16 as uint16 bits."""
        data = self._numpy()
        if self.dtype == _dt.bfloat16:
            data = data.view(np.uint16)
        return (np.array(data, copy=True), _dt.ALL_DTYPES.index(self.dtype))

    def __setstate__(self, state: tuple) -> None:
        data, code = state
        dtype = _dt.ALL_DTYPES[code]
        data = np.array(data, copy=True)
        if dtype == _dt.bfloat16:
            data = data.view(dtype.np)
        self._d = ArrayDesc(data.shape, dtype, resolve_stream(None), data=data.astype(dtype.np))


def is_array(x: Any) -> bool:
    """Whether ``x`` is an ``mx.array``."""
    return isinstance(x, array)


class ArrayIterator:
    """What ``iter(x)`` returns: ``x[0]``, ``x[1]``, ... along the first axis."""

    __slots__ = ("_a", "_i")

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("mlx.core.ArrayIterator: no constructor defined!")

    @classmethod
    def _new(cls, a: array) -> "ArrayIterator":
        it = object.__new__(cls)
        it._a, it._i = a, 0
        return it

    def __iter__(self) -> "ArrayIterator":
        return self

    def __next__(self) -> array:
        if self._i >= self._a.shape[0]:
            raise StopIteration
        self._i += 1
        return self._a[self._i - 1]


class ArrayLike:
    """Any Python object which has an ``__mlx_array__`` method that returns an array."""

    __slots__ = ("_obj",)

    def __init__(self, arg: Any, /):
        self._obj = arg

    def __mlx_array__(self) -> array:
        return self._obj.__mlx_array__()


_GPU = DeviceType.gpu


def _no_gpu_float64(stream) -> None:
    """MLX's array constructor with a primitive (mlx/array.cpp): on a GPU stream no input
    and no output is float64 (``ValueError: float64 is not supported on the GPU``; such ops
    run on a CPU stream, e.g. ``x.astype(mx.float64, stream=mx.cpu)``). Called when an
    input's or an output's dtype is float64 (``_f64_in``; the C recorder, core/_call.c
    ``make1`` / ``make``, compares the dtypes itself)."""
    if stream.device._type is _GPU:
        raise ValueError("float64 is not supported on the GPU")


def _f64_in(dtypes, inputs) -> bool:
    return any(d is _dt.float64 for d in dtypes) or any(x._d.dtype is _dt.float64 for x in inputs)


def _c_record() -> None:
    """``array._make1`` / ``array._make`` in C (core/_call.c ``make1`` / ``make``: the same
    Node, ArrayDesc, weak output and handle), where the extension is built and
    ``settings.c_call`` is on; the Python versions above otherwise."""
    from tapescope.kernels.settings import settings

    if not settings.c_call:
        return
    try:
        from . import _call
    except ImportError:
        return
    from . import transform_tracers
    from .primitive import _node_ids

    _call.configure_record({"node_type": Node, "desc_type": ArrayDesc, "array_type": array,
                            "primitive_type": Primitive, "node_ids": _node_ids,
                            "tracer": transform_tracers, "any_tracer": any_tracer,
                            "float64": _dt.float64, "float64_check": _no_gpu_float64})
    array._make1_py, array._make_py = array._make1, array._make
    array._make1 = staticmethod(_call.make1)
    array._make = staticmethod(_call.make)
    # shape / dtype / ndim read off the desc in C (core/_fields.c: the properties' values and
    # docs), _wrap / _handle made there
    fields = _call.configure_fields({"array_type": array, "docs": {
        k: array.__dict__[k].__doc__ for k in ("shape", "dtype", "ndim")}})
    for name, v in fields.items():
        setattr(array, name, staticmethod(v) if name == "_wrap" else v)


_c_record()
