"""Rules for elementwise primitives (unary, binary, ternary): ``fn(xp, *inputs, out=None)``.

``xp`` is numpy or cupy; only functions both share are used. Where numpy's semantics differ
from MLX's (integer division by zero, shifts past the bit width, negative integer powers,
the sign of NaN, ...) the rule computes MLX's. A rule writes into ``out`` when given one;
``out`` may share memory with an input (donation), so multi-step rules finish every read of
their inputs before writing it.
"""

from __future__ import annotations

from . import rule


def writable(out):
    """``out`` if it can be written (an empty buffer may come back read-only), else None."""
    return out if out is not None and out.flags.writeable else None


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
def _ufunc_rule(name: str, fname: str) -> None:
    def fn(xp, a, out=None):
        return getattr(xp, fname)(a, out=writable(out))

    fn.__name__ = fname
    rule(name, out=True)(fn)


for _name, _f in (("Negative", "negative"), ("Sqrt", "sqrt"), ("Exp", "exp"), ("Expm1", "expm1"),
                  ("Log", "log"), ("Log1p", "log1p"), ("Log2", "log2"), ("Log10", "log10"),
                  ("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("ArcSin", "arcsin"),
                  ("ArcCos", "arccos"), ("ArcTan", "arctan"), ("Sinh", "sinh"),
                  ("Cosh", "cosh"), ("Tanh", "tanh"), ("ArcSinh", "arcsinh"),
                  ("ArcCosh", "arccosh"), ("ArcTanh", "arctanh"), ("Conjugate", "conjugate"),
                  ("BitwiseInvert", "invert"), ("LogicalNot", "logical_not")):
    _ufunc_rule(_name, _f)


@rule("Abs", out=True)
def abs_(xp, a, out=None):
    if a.dtype.kind in "bu":
        return finish(a, out)
    return finish(xp.abs(a), out)  # complex: |z| (the op casts it to float32 afterwards)


@rule("Sign", out=True)
def sign(xp, a, out=None):
    if a.dtype.kind in "bu":
        return finish(a if a.dtype.kind == "b" else (a > 0).astype(a.dtype), out)
    if _is_complex(a):
        mag = xp.abs(a)
        return finish(xp.where(mag == 0, 0, a / xp.where(mag == 0, 1, mag)).astype(a.dtype), out)
    # (a > 0) - (a < 0): NaN gives 0, as MLX
    return finish((a > 0).astype(a.dtype) - (a < 0).astype(a.dtype), out)


@rule("Rsqrt", out=True)
def rsqrt(xp, a, out=None):
    return finish(1 / xp.sqrt(a), out)


@rule("Square", out=True)
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


rule("Floor", out=True)(_exact_or("floor"))
rule("Ceil", out=True)(_exact_or("ceil"))


@rule("Round", out=True)
def round_(xp, a, out=None):
    if not _is_float(a):
        return finish(a, out)
    if _is_complex(a):
        return finish(xp.rint(a.real) + 1j * xp.rint(a.imag), out)
    return xp.rint(a, out=writable(out))  # round half to even


@rule("Sigmoid", out=True)
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


@rule("Real", out=True)
def real(xp, a, out=None):
    return finish(a.real, out)


@rule("Imag", out=True)
def imag(xp, a, out=None):
    return finish(a.imag, out)


@rule("StopGradient", out=True)
def stop_gradient(xp, a, out=None):
    return finish(a, out)


# -- binary ---------------------------------------------------------------------------------
def _binary_ufunc_rule(name: str, fname: str) -> None:
    def fn(xp, a, b, out=None):
        return getattr(xp, fname)(a, b, out=writable(out))

    fn.__name__ = fname
    rule(name, out=True)(fn)


for _name, _f in (("Add", "add"), ("Multiply", "multiply"),
                  ("Divide", "true_divide"),
                  ("Equal", "equal"), ("NotEqual", "not_equal"), ("Less", "less"),
                  ("LessEqual", "less_equal"), ("Greater", "greater"),
                  ("GreaterEqual", "greater_equal"), ("LogicalAnd", "logical_and"),
                  ("LogicalOr", "logical_or"), ("ArcTan2", "arctan2"),
                  ("BitwiseAnd", "bitwise_and"), ("BitwiseOr", "bitwise_or"),
                  ("BitwiseXor", "bitwise_xor")):
    _binary_ufunc_rule(_name, _f)


def _select_extreme(xp, a, b, first_wins, out):
    """MLX's Maximum/Minimum: ``a`` when it is NaN or wins the comparison, else ``b`` (so a
    tie such as max(0.0, -0.0) gives ``b``, NaN in either operand propagates). numpy's
    ufuncs return the first operand on ties for float16 and the second for float32/64 on
    this machine's SIMD paths, so floats take the explicit select."""
    if a.dtype.kind in "biuc":  # bfloat16 is kind "V": it takes the select too
        return (xp.maximum if first_wins is xp.greater else xp.minimum)(a, b, out=writable(out))
    return finish(xp.where(first_wins(a, b) | xp.isnan(a), a, b), out)


@rule("Maximum", out=True)
def maximum(xp, a, b, out=None):
    return _select_extreme(xp, a, b, xp.greater, out)


@rule("Minimum", out=True)
def minimum(xp, a, b, out=None):
    return _select_extreme(xp, a, b, xp.less, out)


@rule("Subtract", out=True)
def subtract(xp, a, b, out=None):
    if a.dtype.kind == "b":  # C: bool(a - b) is a != b
        return xp.not_equal(a, b, out=writable(out))
    return xp.subtract(a, b, out=writable(out))


@rule("NaNEqual", out=True)
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


@rule("FloorDivide", out=True)
def floor_divide(xp, a, b, out=None):
    return finish(floor_divide_values(xp, a, b), out)


@rule("Remainder", out=True)
def remainder(xp, a, b, out=None):
    return finish(remainder_values(xp, a, b), out)


@rule("DivMod")
def divmod_(xp, a, b):
    dtype = a.dtype
    if dtype.kind == "V":  # bfloat16: computed in float32, rounded back by the caller
        a, b = a.astype(xp.float32), b.astype(xp.float32)
    return floor_divide_values(xp, a, b), remainder_values(xp, a, b)


@rule("Power", out=True)
def power(xp, a, b, out=None):
    if a.dtype.kind == "b":  # x ** True == x, x ** False == True
        return finish(a | ~b, out)
    if a.dtype.kind == "i":  # MLX: a negative integer exponent gives 0
        neg = b < 0
        res = xp.power(a, xp.where(neg, 0, b).astype(b.dtype))
        return finish(xp.where(neg, 0, res).astype(a.dtype), out)
    return xp.power(a, b, out=writable(out))  # unsigned integers wrap like MLX's repeated squaring


@rule("LogAddExp", out=True)
def logaddexp(xp, a, b, out=None):
    if _is_complex(a):
        m = xp.where(a.real >= b.real, a, b)
        n = xp.where(a.real >= b.real, b, a)
        return finish(m + xp.log1p(xp.exp(n - m)), out)
    return xp.logaddexp(a, b, out=writable(out))


def _shift(xp, a, b, left: bool):
    """MLX's shifts on its CPU (x86): the count is taken modulo max(32, bit width); types
    narrower than 32 bits shift as C ints and are truncated back."""
    dtype = a.dtype
    if dtype.itemsize < 4:
        wide = xp.int32
        a_w = a.astype(wide)
        cnt = b.astype(xp.int64) & 31
    else:
        a_w = a
        cnt = b.astype(xp.int64) & (dtype.itemsize * 8 - 1)
    cnt = cnt.astype(a_w.dtype)
    res = xp.left_shift(a_w, cnt) if left else xp.right_shift(a_w, cnt)
    return res.astype(dtype)


@rule("LeftShift", out=True)
def left_shift(xp, a, b, out=None):
    return finish(_shift(xp, a, b, True), out)


@rule("RightShift", out=True)
def right_shift(xp, a, b, out=None):
    return finish(_shift(xp, a, b, False), out)


# -- ternary --------------------------------------------------------------------------------
@rule("Select", out=True)
def select(xp, c, a, b, out=None):
    return finish(xp.where(c, a, b), out)
