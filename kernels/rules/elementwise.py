"""The elementwise primitives (unary, binary, ternary): each definition with its C spelling
(``c=``: a libm stem or a spelling from ``codegen/c_ops.py``) above its rule
``fn(xp, *inputs, out=None)``.

``xp`` is numpy or cupy; only functions both share are used. Where numpy's semantics differ
from MLX's (integer division by zero, shifts past the bit width, negative integer powers,
the sign of NaN, ...) the rule computes MLX's. A rule writes into ``out`` when given one;
``out`` may share memory with an input (donation), so multi-step rules finish every read of
their inputs before writing it.
"""

from __future__ import annotations

from ..codegen import c_ops as C
from ..primitives import BINARY, MULTI_OUTPUT, REGISTRY, TERNARY, UNARY, broadcast_shapes, define
from .forms import is_writeable


def writable(out):
    """``out`` if it can be written (an empty numpy buffer may come back read-only; CuPy
    arrays always can), else None."""
    return out if out is not None and is_writeable(out) else None


def finish(res, out):
    """Return ``res``, or copy it into ``out`` (cast to its dtype) and return ``out``."""
    out = writable(out)
    if out is None:
        return res
    out[...] = res
    return out


def _is_complex(a) -> bool:
    return a.dtype.kind == "c"


def _is_float(a) -> bool:
    return a.dtype.kind in "fc"


# -- unary: one ufunc each ------------------------------------------------------------------
def _ufunc_rule(name: str, fname: str, c) -> None:
    def fn(xp, a, out=None):
        return getattr(xp, fname)(a, out=writable(out))

    fn.__name__ = fname
    fn.ufunc = fname  # the eval loop's C part calls the ufunc itself into a writeable out
    define(name, family=UNARY, out=True, c=c)(fn)


# name, numpy ufunc, C spelling (a libm stem: float / double function of that name)
for _name, _f, _c in (("Negative", "negative", C.negative), ("Sqrt", "sqrt", "sqrt"),
                      ("Exp", "exp", "exp"), ("Expm1", "expm1", "expm1"), ("Log", "log", "log"),
                      ("Log1p", "log1p", "log1p"), ("Log2", "log2", "log2"),
                      ("Log10", "log10", "log10"), ("Sin", "sin", "sin"), ("Cos", "cos", "cos"),
                      ("Tan", "tan", "tan"), ("ArcSin", "arcsin", "asin"),
                      ("ArcCos", "arccos", "acos"), ("ArcTan", "arctan", "atan"),
                      ("Sinh", "sinh", "sinh"), ("Cosh", "cosh", "cosh"), ("Tanh", "tanh", "tanh"),
                      ("ArcSinh", "arcsinh", "asinh"), ("ArcCosh", "arccosh", "acosh"),
                      ("ArcTanh", "arctanh", "atanh"), ("Conjugate", "conjugate", C.conjugate),
                      ("BitwiseInvert", "invert", C.invert),
                      ("LogicalNot", "logical_not", C.logical_not)):
    _ufunc_rule(_name, _f, _c)


@define("Abs", family=UNARY, out=True, c=C.abs_)
def abs_(xp, a, out=None):
    if a.dtype.kind in "bu":
        return finish(a, out)
    return finish(xp.abs(a), out)  # complex: |z| (the op casts it to float32 afterwards)


@define("Sign", family=UNARY, out=True, c=C.sign)
def sign(xp, a, out=None):
    if a.dtype.kind in "bu":
        return finish(a if a.dtype.kind == "b" else (a > 0).astype(a.dtype), out)
    if _is_complex(a):
        mag = xp.abs(a)
        return finish(xp.where(mag == 0, 0, a / xp.where(mag == 0, 1, mag)).astype(a.dtype), out)
    # (a > 0) - (a < 0): NaN gives 0, as MLX
    return finish((a > 0).astype(a.dtype) - (a < 0).astype(a.dtype), out)


@define("Rsqrt", family=UNARY, out=True, c=C.rsqrt)
def rsqrt(xp, a, out=None):
    return finish(1 / xp.sqrt(a), out)


@define("Square", family=UNARY, out=True, c=C.square)
def square(xp, a, out=None):
    if a.dtype.kind == "b":
        return finish(a, out)
    return xp.multiply(a, a, out=writable(out))


def _exact_or(fname: str):
    def fn(xp, a, out=None):
        if not _is_float(a):
            return finish(a, out)  # integers and bools are their own floor / ceil / round
        return getattr(xp, fname)(a, out=writable(out))

    return fn


define("Floor", family=UNARY, out=True, c=C.rounding("floor"))(_exact_or("floor"))
define("Ceil", family=UNARY, out=True, c=C.rounding("ceil"))(_exact_or("ceil"))


@define("Round", family=UNARY, out=True, c=C.rounding("rint"))  # rint: half to even
def round_(xp, a, out=None):
    if not _is_float(a):
        return finish(a, out)
    if _is_complex(a):
        return finish(xp.rint(a.real) + 1j * xp.rint(a.imag), out)
    return xp.rint(a, out=writable(out))  # round half to even


@define("Sigmoid", family=UNARY, out=True, c=C.sigmoid, msl=C.msl_sigmoid)
def sigmoid(xp, a, out=None):
    """``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` below, ``e = exp(-|x|)`` (it never
    overflows, so tiny results keep their digits), in float64 and rounded once to the
    output. float16: correctly rounded on every input; float32: within 0.5000000019 ulp on
    every finite input (checked exhaustively), so rounded wrong only where the sigmoid lies
    within 2e-9 ulp of a rounding midpoint (17 of the 4.3e9 inputs). bfloat16 arrives upcast to float32, so its result is rounded twice (float64 ->
    float32 -> bfloat16): the exhaustive test shows that no bfloat16 input is rounded wrong
    by it. Worked in place in one float64 copy: a fresh temporary of this size costs more
    than the exp."""
    e = a.astype(xp.float64)  # a copy (also of float64, and of 0-d input) to work in
    xp.abs(e, out=e)
    xp.subtract(0.0, e, out=e)  # 0 - |x|, not -|x|: a NaN stays +NaN, as MLX's sigmoid
    xp.exp(e, out=e)
    d = e + 1.0
    xp.maximum(e, a >= 0, out=e)  # the numerator: 1 where x >= 0 (e <= 1), else e
    xp.divide(e, d, out=e)
    out = writable(out)  # every read of ``a`` is done: ``out`` may be its donated buffer
    if out is None:
        return e.astype(a.dtype)
    out[...] = e
    return out


@define("Real", family=UNARY, out=True, c=C.real_part(False), flops=0)
def real(xp, a, out=None):
    return finish(a.real, out)


@define("Imag", family=UNARY, out=True, c=C.real_part(True), flops=0)
def imag(xp, a, out=None):
    return finish(a.imag, out)


@define("StopGradient", family=UNARY, out=True, c=C.identity, flops=0, moves=True,
        stops_gradient=True)
def stop_gradient(xp, a, out=None):
    return finish(a, out)


# -- binary ---------------------------------------------------------------------------------
def _binary_ufunc_rule(name: str, fname: str, c) -> None:
    def fn(xp, a, b, out=None):
        return getattr(xp, fname)(a, b, out=writable(out))

    fn.__name__ = fname
    fn.ufunc = fname  # (as the unary rules')
    define(name, family=BINARY, out=True, c=c)(fn)


for _name, _f, _c in (("Add", "add", C.binop("+")), ("Multiply", "multiply", C.binop("*")),
                      ("Divide", "true_divide", C.float_only(C.binop("/"))),
                      ("Equal", "equal", C.binop("==")), ("NotEqual", "not_equal", C.binop("!=")),
                      ("Less", "less", C.binop("<")), ("LessEqual", "less_equal", C.binop("<=")),
                      ("Greater", "greater", C.binop(">")),
                      ("GreaterEqual", "greater_equal", C.binop(">=")),
                      ("LogicalAnd", "logical_and", C.binop("&&")),
                      ("LogicalOr", "logical_or", C.binop("||")),
                      ("ArcTan2", "arctan2", C.float_fn("atan2")),
                      ("BitwiseAnd", "bitwise_and", C.bitwise("&")),
                      ("BitwiseOr", "bitwise_or", C.bitwise("|")),
                      ("BitwiseXor", "bitwise_xor", C.bitwise("^"))):
    _binary_ufunc_rule(_name, _f, _c)


def _exported_as(cls: str, *state):
    return lambda name, kw: (cls, list(state))


# MLX exports these under one class with a code (mlx/primitives.h: Log::Base,
# BitwiseBinary::Op in declaration order; Equal's equal_nan; Sqrt's recip)
for _name, _cls, _code in (("Log2", "Log", 0), ("Log10", "Log", 1), ("Log", "Log", 2),
                           ("BitwiseAnd", "BitwiseBinary", 0), ("BitwiseOr", "BitwiseBinary", 1),
                           ("BitwiseXor", "BitwiseBinary", 2), ("Equal", "Equal", False),
                           ("Sqrt", "Sqrt", False), ("Rsqrt", "Sqrt", True)):
    REGISTRY[_name].export = _exported_as(_cls, _code)


def _select_extreme(xp, a, b, first_wins, out):
    """MLX's Maximum/Minimum: ``a`` when it is NaN or wins the comparison, else ``b`` (so a
    tie such as max(0.0, -0.0) gives ``b``, NaN in either operand propagates). numpy's
    ufuncs return the first operand on ties for float16 and the second for float32/64 on
    this machine's SIMD paths, so floats take the explicit select."""
    if a.dtype.kind in "biuc":  # bfloat16 is kind "V": it takes the select too
        return (xp.maximum if first_wins is xp.greater else xp.minimum)(a, b, out=writable(out))
    return finish(xp.where(first_wins(a, b) | xp.isnan(a), a, b), out)


@define("Maximum", family=BINARY, out=True, c=C.maximum)
def maximum(xp, a, b, out=None):
    return _select_extreme(xp, a, b, xp.greater, out)


@define("Minimum", family=BINARY, out=True, c=C.minimum)
def minimum(xp, a, b, out=None):
    return _select_extreme(xp, a, b, xp.less, out)


@define("Subtract", family=BINARY, out=True, c=C.binop("-"))
def subtract(xp, a, b, out=None):
    if a.dtype.kind == "b":  # C: bool(a - b) is a != b
        return xp.not_equal(a, b, out=writable(out))
    return xp.subtract(a, b, out=writable(out))


@define("NaNEqual", family=BINARY, out=True, c=C.nan_equal,
        export=lambda name, kw: ("Equal", [True]))
def nan_equal(xp, a, b, out=None):
    return finish((a == b) | (xp.isnan(a) & xp.isnan(b)), out)


def floor_divide_values(xp, a, b):
    """MLX's floor division: floor(a / b) for floats, a / b for complex, and for integers
    Python's floor division with ``x // 0 == 0``."""
    if _is_complex(a):
        return a / b
    if a.dtype.kind == "f":
        return xp.floor(a / b)
    if a.dtype.kind == "b":
        return a & b
    zero = b == 0
    q = xp.floor_divide(a, xp.where(zero, 1, b).astype(b.dtype))
    return xp.where(zero, 0, q).astype(a.dtype)


def remainder_values(xp, a, b):
    """MLX's remainder, with the divisor's sign: ``r = fmod(a, b)``, plus ``b`` when ``r`` is
    nonzero and of the other sign; for integers ``x % 0 == x``."""
    if a.dtype.kind == "b":
        return a & ~b
    if a.dtype.kind == "f":
        r = xp.fmod(a, b)
        fix = (r != 0) & ((r < 0) != (b < 0))
        return xp.where(fix, r + b, r)
    zero = b == 0
    r = xp.remainder(a, xp.where(zero, 1, b).astype(b.dtype))
    return xp.where(zero, a, r).astype(a.dtype)


@define("FloorDivide", family=BINARY, out=True, c=C.floor_divide)
def floor_divide(xp, a, b, out=None):
    return finish(floor_divide_values(xp, a, b), out)


@define("Remainder", family=BINARY, out=True, c=C.remainder)
def remainder(xp, a, b, out=None):
    return finish(remainder_values(xp, a, b), out)


@define("DivMod", family=MULTI_OUTPUT, shape=lambda shapes, **_: [broadcast_shapes(*shapes)] * 2)
def divmod_(xp, a, b):
    dtype = a.dtype
    if dtype.kind == "V":  # bfloat16: computed in float32, rounded back by the caller
        a, b = a.astype(xp.float32), b.astype(xp.float32)
    return floor_divide_values(xp, a, b), remainder_values(xp, a, b)


@define("Power", family=BINARY, out=True, c=C.power, power=True)
def power(xp, a, b, out=None):
    if a.dtype.kind == "b":  # x ** True == x, x ** False == True
        return finish(a | ~b, out)
    if a.dtype.kind == "i":  # MLX: a negative integer exponent gives 0
        neg = b < 0
        res = xp.power(a, xp.where(neg, 0, b).astype(b.dtype))
        return finish(xp.where(neg, 0, res).astype(a.dtype), out)
    return xp.power(a, b, out=writable(out))  # unsigned integers wrap like MLX's repeated squaring


@define("LogAddExp", family=BINARY, out=True, c=C.logaddexp)
def logaddexp(xp, a, b, out=None):
    if _is_complex(a):
        m = xp.where(a.real >= b.real, a, b)
        n = xp.where(a.real >= b.real, b, a)
        return finish(m + xp.log1p(xp.exp(n - m)), out)
    return xp.logaddexp(a, b, out=writable(out))


def _shift(xp, a, b, left: bool, out=None):
    """MLX's shifts on its CPU (x86): the count is taken modulo max(32, bit width); types
    narrower than 32 bits shift as C ints and are truncated back. 32- and 64-bit types
    shift straight into ``out``."""
    dtype = a.dtype
    shift = xp.left_shift if left else xp.right_shift
    if dtype.itemsize < 4:
        cnt = (b.astype(xp.int64) & 31).astype(xp.int32)
        return finish(shift(a.astype(xp.int32), cnt).astype(dtype), out)
    cnt = (b.astype(xp.int64) & (dtype.itemsize * 8 - 1)).astype(dtype)
    out = writable(out)
    if out is not None and out.dtype == dtype:
        return shift(a, cnt, out=out)
    return finish(shift(a, cnt), out)


@define("LeftShift", family=BINARY, out=True, c=C.shift(True), export=_exported_as("BitwiseBinary", 3))
def left_shift(xp, a, b, out=None):
    return _shift(xp, a, b, True, out)


@define("RightShift", family=BINARY, out=True, c=C.shift(False),
        export=_exported_as("BitwiseBinary", 4))
def right_shift(xp, a, b, out=None):
    return _shift(xp, a, b, False, out)


# -- ternary --------------------------------------------------------------------------------
@define("Select", family=TERNARY, out=True, c=C.select)
def select(xp, c, a, b, out=None):
    return finish(xp.where(c, a, b), out)
