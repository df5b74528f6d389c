"""``mx.array``: a lazy array — a node in the graph until evaluated, then a view over data."""

from __future__ import annotations

import weakref
from typing import Any, Optional

import numpy as np

from tapescope.kernels.allocator import BufferHandle, allocator, owner_of

from . import dtypes as _dt
from .device import resolve_stream
from .primitive import Node, Primitive


class ArrayDesc:
    """The shared state of an array (MLX's ``ArrayDesc``): shape, dtype, stream, and either
    a graph node (while lazy) or data (once evaluated). Several ``array`` handles may share
    one desc; graph nodes reference descs, never the Python handles.

    Evaluated data is a numpy view over an allocator buffer; ``buffer`` is the shared
    ``BufferHandle`` (views of the same memory hold the same handle), and the buffer goes
    back to the allocator when the last desc holding it is gone.
    """

    __slots__ = ("shape", "dtype", "stream", "node", "index", "data", "buffer", "__weakref__")

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
        if data is not None and buffer is None:
            if data.base is not None:  # never adopt memory that something else owns
                data = self.data = np.array(data)
            self.buffer = adopt(data)

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


def _infer_list(val, depth=0):
    """Shape and MLX dtype of a nested Python list (MLX's initialization rules)."""
    if isinstance(val, (list, tuple)):
        if len(val) == 0:
            return (0,), _dt.float32
        parts = [_infer_list(v, depth + 1) for v in val]
        sub = parts[0][0]
        for s, _ in parts:
            if len(s) != len(sub):
                raise ValueError("Initialization encountered extra dimension.")
            if s != sub:
                raise ValueError("Initialization encountered non-uniform length.")
        d = parts[0][1]
        for _, t in parts[1:]:
            d = _dt.promote_types(d, t) if d != t else d
        return (len(val),) + sub, d
    if isinstance(val, array):
        return val.shape, val.dtype
    if isinstance(val, (bool, np.bool_)):
        return (), _dt.bool_
    if isinstance(val, (int, np.integer)):
        return (), _dt.int32 if -(2**31) <= int(val) < 2**31 else _dt.int64
    if isinstance(val, (float, np.floating)):
        return (), _dt.float32
    if isinstance(val, (complex, np.complexfloating)):
        return (), _dt.complex64
    raise ValueError(f"Invalid type {type(val).__name__} received in array initialization.")


def _to_numpy_list(val):
    if isinstance(val, array):
        return val.tolist()
    if isinstance(val, (list, tuple)):
        return [_to_numpy_list(v) for v in val]
    return val


def _from_value(val: Any, dtype: Optional[_dt.Dtype]) -> tuple[np.ndarray, _dt.Dtype]:
    """Convert a Python/numpy value into (numpy data, Dtype) following MLX's rules."""
    if isinstance(val, np.ndarray):
        inferred = _dt.float32 if val.dtype == np.float64 else _dt.from_numpy(val.dtype)
        src = val
    elif isinstance(val, (list, tuple)):
        _, inferred = _infer_list(val)
        src = _to_numpy_list(val)
    elif isinstance(val, (bool, int, float, complex, np.generic)):
        if isinstance(val, int) and not isinstance(val, bool) and not (-(2**63) <= val < 2**63):
            raise OverflowError(f"Python integer {val} out of bounds for int64.")
        _, inferred = _infer_list(val)
        src = val
    elif hasattr(val, "__array__") or hasattr(val, "__array_interface__"):
        arr = np.asarray(val)
        return _from_value(arr, dtype)
    else:
        raise ValueError(f"Invalid type {type(val).__name__} received in array initialization.")
    out = dtype or inferred
    with np.errstate(all="ignore"):
        data = np.array(src, dtype=out.np)
    return data, out


class array:
    """An N-dimensional array, lazily computed (``mx.array(val, dtype=None)``)."""

    __slots__ = ("_d", "__weakref__")
    __array_priority__ = 1000  # numpy defers binary operators to us

    def __init__(self, val: Any, dtype: Optional[_dt.Dtype] = None):
        if isinstance(val, array):
            if dtype is not None and dtype != val.dtype:
                from .ops import astype

                self._d = astype(val, dtype)._d
            else:
                self._d = val._d
            return
        if dtype is not None and not isinstance(dtype, _dt.Dtype):
            raise TypeError(f"[array] Expected dtype to be mlx.core.Dtype, got {type(dtype).__name__}.")
        data, dt = _from_value(val, dtype)
        self._d = ArrayDesc(data.shape, dt, resolve_stream(None), data=data)

    # -- construction used by ops -------------------------------------------------------
    @staticmethod
    def _wrap(desc: ArrayDesc) -> "array":
        a = array.__new__(array)
        a._d = desc
        return a

    @staticmethod
    def _from_data(data: np.ndarray, dtype: _dt.Dtype, stream=None) -> "array":
        return array._wrap(ArrayDesc(tuple(data.shape), dtype, stream or resolve_stream(None), data=data))

    @staticmethod
    def _make(shapes, dtypes, primitive: Primitive, inputs: list["array"]) -> list["array"]:
        """Record ``primitive`` applied to ``inputs`` as a node with one output per shape."""
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
            from .transforms import eval as _eval

            _eval(self)
        return self._d.data

    def item(self):
        """The value of a size-1 array as a Python scalar."""
        if self.size != 1:
            raise ValueError("[item] item can only be called on arrays of size 1.")
        v = self._numpy().reshape(()).item()
        if self.dtype == _dt.bfloat16:
            v = float(v)
        return v

    def tolist(self):
        """The array as (nested) Python lists of scalars."""
        data = self._numpy()
        if self.dtype == _dt.bfloat16:
            data = data.astype(np.float32)
        return data.tolist()

    def __array__(self, dtype=None, copy=None):
        data = self._numpy()
        out = np.array(data, copy=True) if dtype is None else data.astype(dtype)
        return out

    def __buffer__(self, flags):  # Python >= 3.12 buffer protocol
        return memoryview(np.ascontiguousarray(self._numpy()))

    def __repr__(self) -> str:
        from .printing import format_array

        return format_array(self, repr_=True)

    def __str__(self) -> str:
        from .printing import format_array

        return format_array(self, repr_=False)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() 0-dimensional array.")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iter() 0-dimensional array.")
        for i in range(self.shape[0]):
            yield self[i]

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError("[convert] Only length-1 arrays can be converted to Python scalars.")
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        if not _dt.is_integer(self.dtype):
            raise TypeError("Only integer arrays can be converted to an index.")
        return int(self.item())

    def __hash__(self) -> int:
        return id(self)

    def __copy__(self) -> "array":
        return array._wrap(self._d)

    def __deepcopy__(self, memo) -> "array":
        from .ops import copy

        return copy(self)

    def __getstate__(self):
        return {"data": self.__array__(), "dtype": self.dtype.name}

    def __setstate__(self, state):
        data = state["data"]
        self._d = ArrayDesc(data.shape, _dt._dtype_by_name(state["dtype"]), resolve_stream(None),
                            data=np.array(data))


def is_array(x: Any) -> bool:
    return isinstance(x, array)
