"""MLX's dtypes, dtype categories, type promotion and finfo/iinfo."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class Dtype:
    """An array element type, printed as MLX prints it (``mlx.core.float32``)."""

    __slots__ = ("name", "size", "kind", "np")

    def __init__(self, name: str, size: int, kind: str, np_dtype: np.dtype):
        self.name = name
        self.size = size
        self.kind = kind  # b, u, i, f, c (as in MLX's kindof)
        self.np = np.dtype(np_dtype)

    def __repr__(self) -> str:
        return f"mlx.core.{self.name}"

    __str__ = __repr__

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))

    # Equality is identity (object's, in C): there is one Dtype per type (the constants
    # below; pickling and copying give them back by name through ``__reduce__``), and an
    # ``a.dtype == float32`` runs on every recorded op.


bool_ = Dtype("bool", 1, "b", np.bool_)
uint8 = Dtype("uint8", 1, "u", np.uint8)
uint16 = Dtype("uint16", 2, "u", np.uint16)
uint32 = Dtype("uint32", 4, "u", np.uint32)
uint64 = Dtype("uint64", 8, "u", np.uint64)
int8 = Dtype("int8", 1, "i", np.int8)
int16 = Dtype("int16", 2, "i", np.int16)
int32 = Dtype("int32", 4, "i", np.int32)
int64 = Dtype("int64", 8, "i", np.int64)
float16 = Dtype("float16", 2, "f", np.float16)
float32 = Dtype("float32", 4, "f", np.float32)
float64 = Dtype("float64", 8, "f", np.float64)
bfloat16 = Dtype("bfloat16", 2, "V", ml_dtypes.bfloat16)
complex64 = Dtype("complex64", 8, "c", np.complex64)

ALL_DTYPES = (bool_, uint8, uint16, uint32, uint64, int8, int16, int32, int64,
              float16, float32, float64, bfloat16, complex64)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NP = {d.np: d for d in ALL_DTYPES}


def _dtype_by_name(name: str) -> Dtype:
    return _BY_NAME[name]


def from_numpy(np_dtype) -> Dtype:
    """The Dtype for a numpy dtype; float64 stays float64, complex128 -> complex64."""
    np_dtype = np.dtype(np_dtype)
    if np_dtype in _BY_NP:
        return _BY_NP[np_dtype]
    if np_dtype.kind == "c":
        return complex64
    raise ValueError(f"[array] Unsupported numpy dtype {np_dtype}.")


def is_floating(d: Dtype) -> bool:
    return d.kind in "fV"


def is_integer(d: Dtype) -> bool:
    return d.kind in "ui"


def is_inexact(d: Dtype) -> bool:
    return d.kind in "fVc"


class DtypeCategory(enum.Enum):
    """MLX's abstract dtype categories (``mx.floating``, ``mx.integer``, ...)."""

    complexfloating = 0
    floating = 1
    inexact = 2
    signedinteger = 3
    unsignedinteger = 4
    integer = 5
    number = 6
    generic = 7

    def __repr__(self) -> str:
        return f"DtypeCategory.{self.name}"

    __str__ = __repr__


complexfloating = DtypeCategory.complexfloating
floating = DtypeCategory.floating
inexact = DtypeCategory.inexact
signedinteger = DtypeCategory.signedinteger
unsignedinteger = DtypeCategory.unsignedinteger
integer = DtypeCategory.integer
number = DtypeCategory.number
generic = DtypeCategory.generic

_CATEGORY_PARENT = {
    complexfloating: inexact,
    floating: inexact,
    inexact: number,
    signedinteger: integer,
    unsignedinteger: integer,
    integer: number,
    number: generic,
    generic: None,
}


def _category_of(d: Dtype) -> DtypeCategory:
    return {"b": generic, "u": unsignedinteger, "i": signedinteger, "f": floating,
            "V": floating, "c": complexfloating}[d.kind]


def issubdtype(arg1, arg2) -> bool:
    """Whether ``arg1`` is a sub-type of ``arg2`` (Dtypes or DtypeCategories), as MLX."""
    if arg1.__class__ is Dtype and arg2.__class__ is DtypeCategory:  # (a recorded op's ask)
        return arg1.kind in _KINDS_IN[arg2._value_]
    if isinstance(arg1, Dtype) and isinstance(arg2, Dtype):
        return arg1 == arg2
    if isinstance(arg1, DtypeCategory) and isinstance(arg2, Dtype):
        return False
    if not isinstance(arg1, (Dtype, DtypeCategory)):
        raise ValueError("[issubdtype] Received invalid type for first input.")
    if not isinstance(arg2, (Dtype, DtypeCategory)):
        raise ValueError("[issubdtype] Received invalid type for second input.")
    cat = _category_of(arg1) if isinstance(arg1, Dtype) else arg1
    while cat is not None:
        if cat == arg2:
            return True
        cat = _CATEGORY_PARENT[cat]
    return False


def _categories_of(kind: str) -> list:
    cat, out = _category_of(Dtype("", 0, kind, np.uint8)), []
    while cat is not None:
        out.append(cat)
        cat = _CATEGORY_PARENT[cat]
    return out


# per category (by its value): the kinds whose dtypes are its sub-types, issubdtype's walk made once
_KINDS_IN = tuple("".join(k for k in "buifVc" if c in _categories_of(k))
                  for c in sorted(DtypeCategory, key=lambda c: c.value))


# Type promotion: MLX's table, row/column order as ALL_DTYPES.
_PROMOTION_ROWS = """
b   u8  u16 u32 u64 i8  i16 i32 i64 f16 f32 f64 bf  c
u8  u8  u16 u32 u64 i16 i16 i32 i64 f16 f32 f64 bf  c
u16 u16 u16 u32 u64 i32 i32 i32 i64 f16 f32 f64 bf  c
u32 u32 u32 u32 u64 i64 i64 i64 i64 f16 f32 f64 bf  c
u64 u64 u64 u64 u64 f32 f32 f32 f32 f16 f32 f64 bf  c
i8  i16 i32 i64 f32 i8  i16 i32 i64 f16 f32 f64 bf  c
i16 i16 i32 i64 f32 i16 i16 i32 i64 f16 f32 f64 bf  c
i32 i32 i32 i64 f32 i32 i32 i32 i64 f16 f32 f64 bf  c
i64 i64 i64 i64 f32 i64 i64 i64 i64 f16 f32 f64 bf  c
f16 f16 f16 f16 f16 f16 f16 f16 f16 f16 f32 f64 f32 c
f32 f32 f32 f32 f32 f32 f32 f32 f32 f32 f32 f64 f32 c
f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 c
bf  bf  bf  bf  bf  bf  bf  bf  bf  f32 f32 f64 bf  c
c   c   c   c   c   c   c   c   c   c   c   c   c   c
"""
_SHORT = {"b": bool_, "u8": uint8, "u16": uint16, "u32": uint32, "u64": uint64,
          "i8": int8, "i16": int16, "i32": int32, "i64": int64, "f16": float16,
          "f32": float32, "f64": float64, "bf": bfloat16, "c": complex64}
_PROMOTE = {}
for _a, _row in zip(ALL_DTYPES, _PROMOTION_ROWS.strip().splitlines()):
    for _b, _r in zip(ALL_DTYPES, _row.split()):
        _PROMOTE[_a, _b] = _SHORT[_r]


def promote_types(t1: Dtype, t2: Dtype) -> Dtype:
    """The dtype two arrays of dtypes ``t1`` and ``t2`` compute in (MLX's table)."""
    return _PROMOTE[t1, t2]


class finfo:
    """Machine limits for floating point types (``mx.finfo``)."""

    def __init__(self, dtype: Dtype):
        if not isinstance(dtype, Dtype):
            raise TypeError("__init__(): incompatible function arguments. The following argument "
                            "types are supported:\n    1. __init__(self, arg: mlx.core.Dtype, /) "
                            f"-> None\n\nInvoked with types: mlx.core.finfo, {_type_name(dtype)}")
        if not is_inexact(dtype):
            raise ValueError(f"[finfo] dtype {dtype.name} is not inexact.")
        info = ml_dtypes.finfo(float32.np if dtype == complex64 else dtype.np)
        self.dtype = float32 if dtype == complex64 else dtype
        self.min = float(info.min)
        self.max = float(info.max)
        self.eps = float(info.eps)
        self.smallest_normal = float(info.smallest_normal)
        self.bits = int(info.bits)

    def __repr__(self) -> str:
        return f"finfo(min={self.min:g}, max={self.max:g}, dtype={self.dtype.name})"


class iinfo:
    """Machine limits for integer types (``mx.iinfo``)."""

    def __init__(self, dtype: Dtype):
        if not isinstance(dtype, Dtype):
            raise TypeError("__init__(): incompatible function arguments. The following argument "
                            "types are supported:\n    1. __init__(self, arg: mlx.core.Dtype, /) "
                            f"-> None\n\nInvoked with types: mlx.core.iinfo, {_type_name(dtype)}")
        if not is_integer(dtype):
            raise ValueError(f"[iinfo] Only integer types supported but {dtype.name} was provided")
        info = np.iinfo(dtype.np)
        self.dtype = dtype
        self.min = int(info.min)
        self.max = int(info.max)

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype.name})"


def _type_name(v) -> str:
    t = type(v)
    if t.__module__.startswith("tapescope"):
        return f"mlx.core.{t.__name__}"
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


_KINDS = {
    "bool": lambda d: d == bool_,
    "signed integer": lambda d: d.kind == "i",
    "unsigned integer": lambda d: d.kind == "u",
    "integral": lambda d: d.kind in "ui",
    "real floating": lambda d: d.kind in "fV",
    "complex floating": lambda d: d.kind == "c",
    "numeric": lambda d: d != bool_,
}


def isdtype(dtype: Dtype, kind) -> bool:
    """Whether ``dtype`` is of a kind (a Dtype, a kind string, or a tuple of those)."""
    if not isinstance(dtype, Dtype):
        raise TypeError("isdtype(): incompatible function arguments. The following argument types "
                        "are supported:\n    1. isdtype(dtype: Dtype, kind: Dtype | str | "
                        "tuple[Dtype | str, ...]) -> bool\n\nInvoked with types: "
                        f"{_type_name(dtype)}, {_type_name(kind)}")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    for k in kinds:
        if isinstance(k, Dtype):
            if k == dtype:
                return True
        elif isinstance(k, str):
            if k not in _KINDS:
                raise ValueError(f"[isdtype] Unknown data type kind: '{k}'.")
            if _KINDS[k](dtype):
                return True
        else:
            raise ValueError("[isdtype] `kind` must be a dtype, a string, or a tuple of dtypes "
                             "and strings.")
    return False
