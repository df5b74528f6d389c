"""C spellings of the elementwise ops: building blocks the primitive definitions name.

Each definition (``kernels/rules/elementwise.py``) gives its C spelling as a libm stem or as
one of these functions. Many need more than one C operator for MLX's semantics:

Integer floor division and remainder (by zero, ``INT_MIN // -1``), integer powers (negative
exponents give 0, wrapping like repeated squaring), shifts past the bit width (MLX's x86
CPU: the count is taken modulo max(32, width)), ``logaddexp`` with infinities, the sign of
NaN, round half to even, and float16 results rounded after every step the numpy rule takes
in float16. Each spelling is ``fn(dialect, args, out_dtype, in_dtype) -> C expression``; the
ones that need statements call ``static inline`` helpers (``ts_<op>_<type>``) whose source
``helper_source`` returns, so the preamble includes only the helpers a kernel uses.

The semantics reproduced are those of ``kernels/rules/elementwise.py`` (the numpy rules).
"""

from __future__ import annotations

import re
from typing import Callable

import ml_dtypes
import numpy as np

_BF16 = np.dtype(ml_dtypes.bfloat16)


class Unsupported(Exception):
    """The dialect cannot express this tape (the runtime then interprets it with numpy)."""


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt == _BF16


def _is_half(dt: np.dtype) -> bool:
    return dt == np.float16 or dt == _BF16


_INT_C = {"i1": ("int8_t", "uint8_t"), "i2": ("int16_t", "uint16_t"),
          "i4": ("int32_t", "uint32_t"), "i8": ("int64_t", "uint64_t"),
          "u1": ("uint8_t", "uint8_t"), "u2": ("uint16_t", "uint16_t"),
          "u4": ("uint32_t", "uint32_t"), "u8": ("uint64_t", "uint64_t")}


def _int_key(dt: np.dtype) -> str:
    return f"{dt.kind}{dt.itemsize}"


def _flt_key(d, dt: np.dtype) -> str:
    return "f64" if np.dtype(dt) == np.float64 else "f32"


def _f16_step(d, dt: np.dtype, expr: str) -> str:
    """Round an intermediate to float16 when the numpy rule computes it in float16 (bfloat16
    rules run wholly in float32, so their intermediates stay in float)."""
    return d.round_to(dt, expr) if np.dtype(dt) == np.float16 else f"({expr})"


def _lit(d, dt: np.dtype, v: float) -> str:
    return repr(float(v)) if np.dtype(dt) == np.float64 else f"{float(v)!r}f"


# -- helpers: name -> C source ------------------------------------------------------------

def _int_helpers(key: str) -> dict:
    t, u = _INT_C[key]
    signed = key[0] == "i"
    if signed:
        fdiv = (f"static inline {t} ts_floordiv_{key}({t} a, {t} b) {{\n"
                f"  if (b == 0) return 0;\n"
                f"  if (b == -1) return ({t})(({u})0 - ({u})a);  /* INT_MIN // -1 wraps */\n"
                f"  {t} q = ({t})(a / b), r = ({t})(a % b);\n"
                f"  return (r != 0 && ((r < 0) != (b < 0))) ? ({t})(q - 1) : q;\n}}\n")
        rem = (f"static inline {t} ts_rem_{key}({t} a, {t} b) {{\n"
               f"  if (b == 0) return a;\n"
               f"  if (b == -1) return 0;\n"
               f"  {t} r = ({t})(a % b);\n"
               f"  return (r != 0 && ((r < 0) != (b < 0))) ? ({t})(r + b) : r;\n}}\n")
        neg = "  if (b < 0) return 0;  /* MLX: negative integer exponents give 0 */\n"
    else:
        fdiv = (f"static inline {t} ts_floordiv_{key}({t} a, {t} b) {{\n"
                f"  return b == 0 ? 0 : ({t})(a / b);\n}}\n")
        rem = (f"static inline {t} ts_rem_{key}({t} a, {t} b) {{\n"
               f"  return b == 0 ? a : ({t})(a % b);\n}}\n")
        neg = ""
    pw = (f"static inline {t} ts_pow_{key}({t} a, {t} b) {{\n{neg}"
          f"  uint64_t r = 1, x = (uint64_t)({u})a, e = (uint64_t)({u})b;\n"
          f"  while (e) {{ if (e & 1) r *= x; x *= x; e >>= 1; }}\n"
          f"  return ({t})({u})r;\n}}\n")
    return {f"ts_floordiv_{key}": fdiv, f"ts_rem_{key}": rem, f"ts_pow_{key}": pw}


def _float_helpers(key: str) -> dict:
    t = "double" if key == "f64" else "float"
    s = "" if key == "f64" else "f"
    ln2 = "0.693147180559945309417232121458176568" + ("" if key == "f64" else "f")
    zero = "0.0" + s
    # numpy's npy_logaddexp: equal arguments (also equal infinities) give x + ln 2
    lae = (f"static inline {t} ts_logaddexp_{key}({t} x, {t} y) {{\n"
           f"  if (x == y) return x + {ln2};\n"
           f"  const {t} d = x - y;\n"
           f"  if (d > {zero}) return x + log1p{s}(exp{s}(-d));\n"
           f"  if (d <= {zero}) return y + log1p{s}(exp{s}(d));\n"
           f"  return d;  /* NaN */\n}}\n")
    # the divisor's sign: fmod, plus b when the remainder is nonzero and of the other sign
    rem = (f"static inline {t} ts_rem_{key}({t} a, {t} b) {{\n"
           f"  const {t} r = fmod{s}(a, b);\n"
           f"  return (r != {zero} && ((r < {zero}) != (b < {zero}))) ? r + b : r;\n}}\n")
    return {f"ts_logaddexp_{key}": lae, f"ts_rem_{key}": rem}


# double -> float rounded to odd (truncated toward zero, last bit set when inexact): rounding
# that float to nearest float16 / bfloat16 (13 / 16 fewer bits) is then one correct rounding
# of the double. Branch-free, so it vectorises.
_ROUND_TO_ODD = r"""static inline float ts_f64_to_f32_odd(double y) {
  union { uint32_t u; float f; } v; v.f = (float)y;
  const uint32_t inexact = (double)v.f != y;
  const uint32_t away = fabs((double)v.f) > fabs(y);
  v.u = (v.u - (inexact & away)) | inexact;
  return v.f;
}
"""

HELPERS: dict = {"ts_f64_to_f32_odd": _ROUND_TO_ODD}
for _k in _INT_C:
    HELPERS.update(_int_helpers(_k))
for _k in ("f32", "f64"):
    HELPERS.update(_float_helpers(_k))

_IDENT = re.compile(r"\b(ts_[A-Za-z0-9_]+)\s*\(")


def helper_source(expr: str) -> dict:
    """The helpers ``expr`` calls: name -> C source."""
    return {n: HELPERS[n] for n in _IDENT.findall(expr) if n in HELPERS}


# -- spellings ------------------------------------------------------------------------------

def identity(d, a, o, i):
    return a[0]


def rounding(fn: str) -> Callable:
    def spell(d, a, o, i):
        if not _is_float(i):
            return a[0]  # integers and bools are their own floor / ceil / round
        return f"{d.math(fn, d.compute_dtype(i))}({a[0]})"

    return spell


def bitwise(sym: str) -> Callable:
    def spell(d, a, o, i):
        if _is_float(i) or i.kind == "c":
            raise Unsupported(f"bitwise op on {i}")
        if i.kind == "b":
            return f"({a[0]} {sym} {a[1]})"
        return f"({d.compute_type(i)})({a[0]} {sym} {a[1]})"

    return spell


def invert(d, a, o, i):
    if _is_float(i) or i.kind == "c":
        raise Unsupported(f"BitwiseInvert on {i}")
    if i.kind == "b":
        return f"(!{a[0]})"
    return f"({d.compute_type(i)})(~{a[0]})"


def _ints_or_bool(i: np.dtype, prim: str) -> None:
    if i.kind not in "biu":
        raise Unsupported(f"{prim} on {i}")


def shift(left: bool) -> Callable:
    def spell(d, a, o, i):
        _ints_or_bool(i, "shift")
        t = d.compute_type(i)
        if i.itemsize < 4:  # shifted as a C int, truncated back
            if left:
                return f"({t})((uint32_t)(int32_t){a[0]} << ((int64_t){a[1]} & 31))"
            return f"({t})((int32_t){a[0]} >> ((int64_t){a[1]} & 31))"
        bits = i.itemsize * 8
        if left:
            u = _INT_C[_int_key(i)][1]
            return f"({t})(({u}){a[0]} << ((int64_t){a[1]} & {bits - 1}))"
        return f"({t})({a[0]} >> ((int64_t){a[1]} & {bits - 1}))"

    return spell


def floor_divide(d, a, o, i):
    if i.kind == "b":
        return f"({a[0]} && {a[1]})"
    if i.kind in "iu":
        return f"ts_floordiv_{_int_key(i)}({a[0]}, {a[1]})"
    if not _is_float(i):
        raise Unsupported(f"FloorDivide on {i}")
    return f"{d.math('floor', d.compute_dtype(i))}({_f16_step(d, i, f'{a[0]} / {a[1]}')})"


def remainder(d, a, o, i):
    if i.kind == "b":
        return f"({a[0]} && !{a[1]})"
    if i.kind in "iu":
        return f"ts_rem_{_int_key(i)}({a[0]}, {a[1]})"
    if not _is_float(i):
        raise Unsupported(f"Remainder on {i}")
    return f"ts_rem_{_flt_key(d, i)}({a[0]}, {a[1]})"


def power(d, a, o, i):
    if i.kind == "b":
        return f"({a[0]} || !{a[1]})"
    if i.kind in "iu":
        return f"ts_pow_{_int_key(i)}({a[0]}, {a[1]})"
    if not _is_float(i):
        raise Unsupported(f"Power on {i}")
    return f"{d.math('pow', d.compute_dtype(i))}({a[0]}, {a[1]})"


def float_fn(fn: str) -> Callable:
    def spell(d, a, o, i):
        if not _is_float(i):
            raise Unsupported(f"{fn} on {i}")
        return f"{d.math(fn, d.compute_dtype(i))}({', '.join(a)})"

    return spell


def logaddexp(d, a, o, i):
    if not _is_float(i):
        raise Unsupported(f"LogAddExp on {i}")
    return f"ts_logaddexp_{_flt_key(d, i)}({a[0]}, {a[1]})"


def rsqrt(d, a, o, i):
    if not _is_float(i):
        raise Unsupported(f"Rsqrt on {i}")
    one = _lit(d, d.compute_dtype(i), 1.0)
    root = _f16_step(d, i, f"{d.math('sqrt', d.compute_dtype(i))}({a[0]})")
    return f"({one} / {root})"


def sigmoid(d, a, o, i):
    """The numpy rule's float64 sigmoid as one branch-free expression (the two ``exp`` calls
    are one after CSE; libmvec's vector ``exp`` keeps the loop vectorised), rounded once to
    the output: float32 by the cast, float16 / bfloat16 through the float rounded to odd,
    which the store then rounds to nearest with no double-rounding error. NaN gives +NaN,
    as MLX and the rule, by a select: gcc folds the rule's ``0.0 - fabs(x)`` into
    ``-fabs(x)`` and drops a ``fabs`` of the quotient (it takes exp to be nonnegative)."""
    if not _is_float(i):
        raise Unsupported(f"Sigmoid on {i}")
    x = a[0] if np.dtype(i) == np.float64 else f"(double){a[0]}"
    e = f"exp(-fabs({x}))"
    expr = f"(({x}) != ({x}) ? (double)NAN : (({x}) >= 0.0 ? 1.0 : {e}) / (1.0 + {e}))"
    if np.dtype(i) == np.float64:
        return expr
    return f"ts_f64_to_f32_odd{expr}" if _is_half(i) else f"(float){expr}"


def msl_sigmoid(d, a, o, i):
    """MLX's Metal Sigmoid (mlx/backend/metal/kernels/unary_ops.h), in float: C's spelling
    computes in double, which Metal lacks."""
    if not _is_float(i):
        raise Unsupported(f"Sigmoid on {i}")
    y = f"(1.0f / (1.0f + metal::precise::exp(metal::fabs({a[0]}))))"
    return f"(({a[0]}) < 0.0f ? {y} : 1.0f - {y})"


def sign(d, a, o, i):
    if i.kind == "b":
        return a[0]
    if i.kind == "c":
        raise Unsupported("Sign on complex")
    t = d.compute_type(i)
    if i.kind == "u":
        return f"({t})({a[0]} > 0)"
    return f"({t})(({a[0]} > 0) - ({a[0]} < 0))"  # NaN gives 0


def real_part(imag: bool) -> Callable:
    def spell(d, a, o, i):
        if i.kind == "c":
            raise Unsupported("complex")
        return f"({d.compute_type(i)})0" if imag else a[0]

    return spell


def conjugate(d, a, o, i):
    if i.kind == "c":
        raise Unsupported("complex")
    return a[0]


def nan_equal(d, a, o, i):
    if _is_float(i):
        return f"(({a[0]} == {a[1]}) || ({a[0]} != {a[0]} && {a[1]} != {a[1]}))"
    if i.kind == "c":
        raise Unsupported("complex")
    return f"({a[0]} == {a[1]})"


def binop(sym: str) -> Callable:
    return lambda d, a, o, i: f"({a[0]} {sym} {a[1]})"


def float_only(fn: Callable) -> Callable:
    def wrapped(d, a, o, i):
        if not _is_float(i):
            raise Unsupported(f"integer {i} for a float-only op")
        return fn(d, a, o, i)

    return wrapped


def abs_(d, a, o, i):
    if _is_float(i):
        return f"{d.math('fabs', i)}({a[0]})"
    if i.kind == "i":
        return f"({a[0]} < 0 ? ({d.compute_type(i)})-{a[0]} : {a[0]})"
    return a[0]


def maximum(d, a, o, i):
    # numpy/MLX propagate NaN from either side
    if _is_float(i):
        # ``|`` not ``||``: no short circuit, so the select vectorises (``||`` kept whole
        # loops scalar, and every libm call in them with it)
        return f"((({a[0]} > {a[1]}) | ({a[0]} != {a[0]})) ? {a[0]} : {a[1]})"
    return f"({a[0]} > {a[1]} ? {a[0]} : {a[1]})"


def minimum(d, a, o, i):
    if _is_float(i):
        return f"((({a[0]} < {a[1]}) | ({a[0]} != {a[0]})) ? {a[0]} : {a[1]})"
    return f"({a[0]} < {a[1]} ? {a[0]} : {a[1]})"


def astype(d, a, o, i):
    if o.kind == "b":
        return f"({a[0]} != 0)"
    if i.kind == "b":
        # a select, not a cast: gcc 12 vectorizes no loop with a (float)bool conversion in it
        # (the ReLU gradient's mask), and the select is the same 0 / 1
        ct = d.compute_type(o)
        return f"({a[0]} ? ({ct})1 : ({ct})0)"
    if _is_float(o) and i.kind in "iu":
        # An integer 0 converts to +0.0. Under -fno-trapping-math gcc folds (float)(int)x into
        # trunc(x), which gives -0.0 for x in (-1, -0]; the select survives that fold (``+ 0``
        # does not: gcc drops it, believing the conversion never gives -0.0)
        ct = d.compute_type(o)
        return f"({a[0]} == 0 ? ({ct})0 : ({ct}){a[0]})"
    if o == np.float16 and i == np.float64:
        # one rounding, as numpy's astype: double -> float -> half would round twice
        return d.half_from_double(o, a[0])
    return f"({d.compute_type(o)}){a[0]}"


def negative(d, a, o, i):
    if i.kind == "b":
        raise Unsupported("negative of bool")
    return f"({d.compute_type(o)})(-{a[0]})"


def square(d, a, o, i):
    return f"({a[0]} * {a[0]})"


def logical_not(d, a, o, i):
    return f"(!{a[0]})"


def select(d, a, o, i):
    return f"({a[0]} ? {a[1]} : {a[2]})"
