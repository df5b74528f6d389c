"""An array module over numpy that fails where CuPy 14 fails, to test the rules without a GPU.

``import cupy_like as xp``: numpy's namespace, but behaving as CuPy where the rules could
tell the difference (each from CuPy's documentation or source, ``cupy/_core/_kernel.pyx``,
``cupy/_core/_routines_indexing.pyx``):

- its arrays are ``ndarray`` (a numpy subclass) whose ``flags`` have only ``c_contiguous``,
  ``f_contiguous`` and ``owndata`` (no ``writeable``: CuPy arrays are always writable);
- a reduction or an index never gives a numpy scalar: CuPy returns 0-d arrays;
- ufunc ``reduce`` / ``accumulate``: ``add`` and ``multiply`` only (``reduceat``: ``add``);
  ``at``: ``add``, ``subtract``, ``maximum``, ``minimum`` and the bitwise ones, for CuPy's
  dtypes (others raise ``NotImplementedError`` / ``TypeError`` with CuPy's messages);
- where integer arrays index one place more than once, ``a[index] = values`` stores the
  first of its values (CuPy leaves which one undefined; numpy stores the last);
- mixing in a plain numpy array raises ``TypeError`` (CuPy never converts one implicitly;
  ``asarray`` / ``array`` copy host data in explicitly, as ``cupy.asarray`` does);
- ``ndarray(shape, dtype, buffer, offset, strides)`` (numpy's view constructor) is refused:
  CuPy's takes a device memory pointer;
- there is no ``errstate`` / ``seterr`` (CuPy computes without floating-point flags).

``to_device`` / ``to_host`` move numpy data in and out (``cupy.asarray`` / ``cupy.asnumpy``).
"""

from __future__ import annotations

import types

import numpy as np

class Flags:
    """CuPy's ``ndarray.flags``: three read-only booleans."""

    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, a: np.ndarray):
        f = np.ndarray.flags.__get__(a)
        self.c_contiguous, self.f_contiguous, self.owndata = f.c_contiguous, f.f_contiguous, f.owndata

    def __getitem__(self, key):
        return getattr(self, {"C_CONTIGUOUS": "c_contiguous", "F_CONTIGUOUS": "f_contiguous",
                              "OWNDATA": "owndata"}[key])


class ndarray(np.ndarray):  # noqa: N801 - CuPy's name
    """A device array: numpy's memory, CuPy's ``flags`` and 0-d results."""

    def __new__(cls, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None and not isinstance(memptr, int):
            raise TypeError("Argument 'memptr' has incorrect type (expected "
                            "cupy.cuda.memory.MemoryPointer, got "
                            f"{type(memptr).__name__})")
        if strides is not None:
            raise TypeError("ndarray(..., strides=) needs a device memory pointer")
        return np.empty(shape, dtype, order=order).view(cls)

    @property
    def flags(self):
        return Flags(self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _Ufunc.get(ufunc)._run(method, inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        return _call(func, args, kwargs)

    def __getitem__(self, key):
        return _wrap(np.ndarray.__getitem__(_host(self), _unwrap(key)))

    def __setitem__(self, key, value):  # CuPy copies a host value in
        if isinstance(value, ndarray):
            value = _host(value)
        host, key = _host(self), _unwrap(key)
        if _advanced(key) and host.flags.c_contiguous:
            # CuPy: "the value that is actually stored is undefined" where integer arrays
            # index one place more than once; here the first one wins (numpy keeps the last)
            pos = np.arange(host.size).reshape(host.shape)[key]
            vals = np.broadcast_to(np.asarray(value, dtype=host.dtype), pos.shape)
            host.reshape(-1)[pos.reshape(-1)[::-1]] = vals.reshape(-1)[::-1]
            return
        np.ndarray.__setitem__(host, key, value)

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        return _wrap(arr)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self):
        return "cupy_like." + repr(_host(self))


# methods computed by numpy on the plain array, results wrapped
def _method(name):
    base = getattr(np.ndarray, name)

    def m(self, *args, **kwargs):
        return _wrap(base(_host(self), *_unwrap(args), **_unwrap(kwargs)))

    m.__name__ = name
    return m


for _m in ("astype", "copy", "reshape", "view", "transpose", "sum", "prod", "max", "min",
           "any", "all", "argmax", "argmin", "mean", "cumsum", "cumprod", "ravel", "flatten",
           "squeeze", "swapaxes", "take", "conj", "conjugate", "round", "clip", "nonzero",
           "dot", "repeat", "diagonal", "trace", "std", "var", "fill", "sort", "argsort",
           "partition", "argpartition"):
    setattr(ndarray, _m, _method(_m))


def _advanced(key) -> bool:
    """Whether an index has an integer array in it (advanced indexing)."""
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, np.ndarray) and k.dtype.kind in "iu" for k in keys)


def _host(a):
    """The numpy array behind a device array (no copy)."""
    return np.ndarray.view(a, np.ndarray)


def _wrap(x):
    """numpy results as CuPy gives them: arrays as device arrays, scalars as 0-d arrays."""
    if isinstance(x, ndarray):
        return x
    if isinstance(x, np.ndarray):
        return x.view(ndarray)
    if isinstance(x, np.generic):
        return np.asarray(x).view(ndarray)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _unwrap(x):
    """Device arrays as their numpy arrays; a plain numpy array is CuPy's TypeError."""
    if isinstance(x, ndarray):
        return _host(x)
    if isinstance(x, np.ndarray):
        raise TypeError(f"Unsupported type {type(x)}")
    if isinstance(x, tuple):
        return tuple(_unwrap(v) for v in x)
    if isinstance(x, list):
        return [_unwrap(v) for v in x]
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _call(fn, args, kwargs, *, host_ok=False):
    out = kwargs.get("out")
    if host_ok:  # asarray / array: host data is copied in explicitly
        args = tuple(_host(a) if isinstance(a, ndarray) else a for a in args)
    else:
        args, kwargs = _unwrap(args), _unwrap(kwargs)
    res = fn(*args, **kwargs)
    if out is not None and isinstance(out, ndarray):
        if isinstance(res, np.ndarray) and res is kwargs.get("out"):
            return out
    return _wrap(res)


# -- ufuncs ----------------------------------------------------------------------------
_AT_DTYPES = {  # cupy/_core/_routines_indexing.pyx: _scatter_op
    "add": {"int32", "uint32", "uint64", "float16", "float32", "float64"},
    "subtract": {"int32", "uint32"},
    "maximum": {"int32", "uint32", "uint64", "float32", "float64"},
    "minimum": {"int32", "uint32", "uint64", "float32", "float64"},
    "bitwise_and": {"int32", "uint32", "uint64", "int64"},
    "bitwise_or": {"int32", "uint32", "uint64", "int64"},
    "bitwise_xor": {"int32", "uint32", "uint64", "int64"},
}


class _Ufunc:
    """A CuPy ufunc: called like numpy's, with CuPy's subset of methods."""

    _cache: dict = {}

    def __init__(self, uf: np.ufunc):
        self._uf = uf
        self.__name__ = uf.__name__
        self.nin, self.nout, self.nargs = uf.nin, uf.nout, uf.nargs

    @classmethod
    def get(cls, uf: np.ufunc) -> "_Ufunc":
        w = cls._cache.get(uf)
        if w is None:
            w = cls._cache[uf] = cls(uf)
        return w

    @property
    def name(self):
        return "cupy_" + self.__name__

    def _run(self, method, inputs, kwargs):
        if method == "__call__":
            return self(*inputs, **kwargs)
        return getattr(self, method)(*inputs, **kwargs)

    def __call__(self, *args, **kwargs):
        out = kwargs.get("out")
        if isinstance(out, tuple):
            out = out[0] if len(out) == 1 else out
            kwargs["out"] = out
        return _call(self._uf, args, kwargs)

    def _nope(self, method):
        raise NotImplementedError(f"`{self.name}.{method}` is not supported yet")

    def reduce(self, array, axis=0, dtype=None, out=None, keepdims=False):
        if self.__name__ not in ("add", "multiply"):
            self._nope("reduce")
        return _call(self._uf.reduce, (array,), dict(axis=axis, dtype=dtype, out=out, keepdims=keepdims))

    def accumulate(self, array, axis=0, dtype=None, out=None):
        if self.__name__ not in ("add", "multiply"):
            self._nope("accumulate")
        return _call(self._uf.accumulate, (array,), dict(axis=axis, dtype=dtype, out=out))

    def reduceat(self, array, indices, axis=0, dtype=None, out=None):
        if self.__name__ != "add":
            self._nope("reduceat")
        return _call(self._uf.reduceat, (array, indices), dict(axis=axis, dtype=dtype, out=out))

    def outer(self, a, b, **kwargs):
        return _call(self._uf.outer, (a, b), kwargs)

    def at(self, a, indices, b=None):
        allowed = _AT_DTYPES.get(self.__name__)
        if allowed is None:
            self._nope("at")
        dtype = (b.dtype if isinstance(b, np.ndarray) else a.dtype).name
        if dtype not in allowed:
            raise TypeError(f"cupy.{self.__name__}.at only supports "
                            f"{', '.join(sorted(allowed))} as data type")
        _call(self._uf.at, (a, indices) + (() if b is None else (b,)), {})

    def __repr__(self):
        return f"<ufunc '{self.name}'>"


# -- the module namespace ----------------------------------------------------------------
_ABSENT = {"errstate", "seterr", "geterr", "seterrcall", "geterrcall", "frompyfunc",
           "nditer", "memmap", "recarray", "chararray", "matrix", "ma", "rec", "char",
           "ctypeslib", "polynomial", "testing", "typing", "f2py", "distutils"}
_HOST_OK = {"asarray", "array", "asanyarray", "ascontiguousarray", "asfortranarray"}
_PASS = (type, np.dtype, types.ModuleType)


def _wrap_function(name, fn):
    host_ok = name in _HOST_OK

    def f(*args, **kwargs):
        return _call(fn, args, kwargs, host_ok=host_ok)

    f.__name__ = name
    f.__doc__ = getattr(fn, "__doc__", None)
    return f


def _namespace(src, into: dict, skip=()) -> None:
    for name in dir(src):
        if name.startswith("_") or name in skip:
            continue
        obj = getattr(src, name)
        if isinstance(obj, np.ufunc):
            into[name] = _Ufunc.get(obj)
        elif isinstance(obj, _PASS) or not callable(obj):
            into[name] = obj  # dtypes, scalar types, constants: CuPy re-exports numpy's
        else:
            into[name] = _wrap_function(name, obj)


_namespace(np, globals(), skip=_ABSENT | {"ndarray", "linalg", "fft", "random", "lib"})
ndarray.__module__ = "cupy_like"


def _submodule(name: str, src) -> types.ModuleType:
    mod = types.ModuleType(f"cupy_like.{name}")
    _namespace(src, mod.__dict__)
    return mod


linalg = _submodule("linalg", np.linalg)
fft = _submodule("fft", np.fft)
random = _submodule("random", np.random)
lib = types.ModuleType("cupy_like.lib")
lib.stride_tricks = _submodule("lib.stride_tricks", np.lib.stride_tricks)


def _cholesky(a):
    """CuPy's cholesky does not raise for a matrix that is not positive definite (its
    ``cupyx.errstate(linalg="ignore")`` default): it returns potrf's partial factor, here
    the lower triangle of the input where numpy would raise."""
    try:
        return _call(np.linalg.cholesky, (a,), {})
    except np.linalg.LinAlgError:
        return _wrap(np.tril(_host(a)))


linalg.cholesky = _cholesky


def to_device(x) -> ndarray:
    """A device copy of host data (``cupy.asarray``), keeping a 0-d array 0-d."""
    return np.array(x, copy=True).view(ndarray)


def on_device(x) -> ndarray:
    """The same memory seen as a device array, strides kept (for inputs of a given layout)."""
    return x.view(ndarray)


def to_host(x) -> np.ndarray:
    """A host copy (``cupy.asnumpy``)."""
    if not isinstance(x, ndarray):
        raise TypeError(f"not a device array: {type(x)}")
    return np.array(_host(x), copy=True)
