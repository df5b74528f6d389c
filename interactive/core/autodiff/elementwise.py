"""VJP / JVP rules of the elementwise primitives (unary, binary, ternary), AsType, Broadcast,
and the identities (Copy, Contiguous, Full, StopGradient), as MLX's primitives.cpp has them.

Most rules come from one derivative per input: VJP multiplies the cotangent by it, JVP the
tangent. Ops with a zero derivative (comparisons, rounding, bitwise, logical) give zeros, as
MLX's do; their outputs carry no gradient.
"""

from __future__ import annotations

import math

from .. import dtypes as _dt
from .. import ops as mx
from ..array import array
from ..device import resolve_stream
from ..ops.reduction import squeeze_axes
from .registry import defjvp, defvjp, same_op


def _derivative(name: str, *partials, holomorphic: bool = True,
                derivative_first: bool = False) -> None:
    """Rules from ``partials[i](primals, out) -> d out / d primals[i]`` (elementwise). For
    complex inputs MLX's cotangent is dL/dRe + i dL/dIm (the conjugate of JAX's), so a
    holomorphic op's VJP multiplies by the conjugate derivative; ``derivative_first``: the
    VJP's product is (derivative, cotangent), MLX's order for the op (a complex product's
    rounding depends on it)."""

    def vjp(primals, cotangents, argnums, outputs, **_):
        out = []
        for i in argnums:
            d = partials[i](primals, outputs[0])
            if holomorphic and d.dtype == _dt.complex64:
                d = mx.conjugate(d)
            out.append(mx.multiply(d, cotangents[0]) if derivative_first
                       else mx.multiply(cotangents[0], d))
        return out

    def jvp(primals, tangents, argnums, outputs, **_):
        acc = None
        for i, t in zip(argnums, tangents):
            term = mx.multiply(t, partials[i](primals, outputs[0]))
            acc = term if acc is None else mx.add(acc, term)
        return [acc]

    defvjp(name, vjp)
    defjvp(name, jvp)


def _zero(name: str) -> None:
    """A derivative of zero everywhere it exists (MLX: zeros)."""

    def vjp(primals, cotangents, argnums, outputs, **_):
        return [mx.zeros_like(primals[i]) for i in argnums]

    def jvp(primals, tangents, argnums, outputs, **_):
        return [mx.zeros_like(o) if o is not None else None for o in outputs]

    defvjp(name, vjp)
    defjvp(name, jvp)


def _linear(name: str, transpose) -> None:
    """A linear op: JVP applies the op to the tangents; VJP is ``transpose``."""

    def jvp(primals, tangents, argnums, outputs, **params):
        ts = [mx.zeros_like(p) for p in primals]
        for i, t in zip(argnums, tangents):
            ts[i] = t
        return same_op(name, ts, outputs, **params)

    defvjp(name, transpose)
    defjvp(name, jvp)


# -- unary ------------------------------------------------------------------------------
U = {
    "Exp": lambda p, o: o,
    "Expm1": lambda p, o: mx.add(o, 1),
    "Log": lambda p, o: mx.reciprocal(p[0]),
    "Log1p": lambda p, o: mx.reciprocal(mx.add(p[0], 1)),
    "Log2": lambda p, o: mx.reciprocal(mx.multiply(p[0], math.log(2.0))),
    "Log10": lambda p, o: mx.reciprocal(mx.multiply(p[0], math.log(10.0))),
    "Sin": lambda p, o: mx.cos(p[0]),
    "Cos": lambda p, o: mx.negative(mx.sin(p[0])),
    "Tan": lambda p, o: mx.add(mx.square(o), 1),
    "ArcSin": lambda p, o: mx.rsqrt(mx.subtract(1, mx.square(p[0]))),
    "ArcCos": lambda p, o: mx.negative(mx.rsqrt(mx.subtract(1, mx.square(p[0])))),
    "ArcTan": lambda p, o: mx.reciprocal(mx.add(mx.square(p[0]), 1)),
    "Sinh": lambda p, o: mx.cosh(p[0]),
    "Cosh": lambda p, o: mx.sinh(p[0]),
    "Tanh": lambda p, o: mx.subtract(1, mx.square(o)),
    "ArcSinh": lambda p, o: mx.rsqrt(mx.add(mx.square(p[0]), 1)),
    "ArcCosh": lambda p, o: mx.rsqrt(mx.subtract(mx.square(p[0]), 1)),
    "ArcTanh": lambda p, o: mx.reciprocal(mx.subtract(1, mx.square(p[0]))),
    "Sqrt": lambda p, o: mx.divide(0.5, o),
    "Rsqrt": lambda p, o: mx.multiply(mx.divide(o, p[0]), -0.5),
    "Square": lambda p, o: mx.multiply(p[0], array(2, p[0].dtype)),  # MLX: 2 in its dtype
    "Sigmoid": lambda p, o: mx.multiply(o, mx.subtract(1, o)),
    "Erf": lambda p, o: mx.multiply(mx.exp(mx.negative(mx.square(p[0]))), 2.0 / math.sqrt(math.pi)),
    "ErfInv": lambda p, o: mx.multiply(mx.exp(mx.square(o)), math.sqrt(math.pi) / 2.0),
}
for _n, _d in U.items():
    _derivative(_n, _d)
_derivative("Abs", lambda p, o: mx.sign(p[0]), holomorphic=False)  # z / |z| for complex z


def _abs_jvp(p, t, argnums, o, **_):
    if p[0].dtype == _dt.complex64:  # d|z| = Re(conj(z) dz) / |z|
        return [mx.real(mx.multiply(t[0], mx.conjugate(mx.sign(p[0]))))]
    return [mx.multiply(t[0], mx.sign(p[0]))]


defjvp("Abs", _abs_jvp)

for _n in ("Sign", "Floor", "Ceil", "Round", "LogicalNot", "BitwiseInvert"):
    _zero(_n)

_linear("Negative", lambda p, c, a, o, **_: [mx.negative(c[0])])
_linear("Conjugate", lambda p, c, a, o, **_: [mx.conjugate(c[0])])
_linear("Real", lambda p, c, a, o, **_: [mx.astype(c[0], p[0].dtype)])
_linear("Imag", lambda p, c, a, o, **_: [mx.multiply(mx.astype(c[0], p[0].dtype),
                                                     array(1j, _dt.complex64))])


def _identity(name: str) -> None:
    _linear(name, lambda p, c, a, o, **_: [c[0]])


for _n in ("Copy", "Contiguous", "Full"):
    _identity(_n)
# StopGradient ends every path in the graph walk, so its rules are never asked for; they
# give what MLX's StopGradient does when called directly: zeros.
_zero("StopGradient")


# -- binary -----------------------------------------------------------------------------
def _lae(i):
    return lambda p, o: mx.exp(mx.subtract(p[i], o))


def _atan2(i):
    def d(p, o):
        den = mx.add(mx.square(p[0]), mx.square(p[1]))
        return mx.divide(p[1], den) if i == 0 else mx.negative(mx.divide(p[0], den))
    return d


_derivative("Multiply", lambda p, o: p[1], lambda p, o: p[0], derivative_first=True)
_derivative("Divide", lambda p, o: mx.reciprocal(p[1]),
            lambda p, o: mx.negative(mx.divide(o, p[1])))
# MLX's Power::vjp: d/dy x^y = log(x) x^y, and 0 where x^y is 0 (0 * log 0 -> 0)
_derivative("Power", lambda p, o: mx.multiply(p[1], mx.power(p[0], mx.subtract(p[1], 1))),
            lambda p, o: mx.where(o, mx.multiply(mx.log(p[0]), o), mx.zeros_like(o)))
_derivative("LogAddExp", _lae(0), _lae(1))
_derivative("ArcTan2", _atan2(0), _atan2(1))
_derivative("Remainder", lambda p, o: mx.ones_like(p[0]),
            lambda p, o: mx.negative(mx.floor_divide(p[0], p[1])))
# MLX: Maximum sends the cotangent to ``a`` where a > b, else to ``b`` (ties go to b);
# Minimum to ``a`` where a < b.
_derivative("Maximum", lambda p, o: mx.astype(mx.greater(p[0], p[1]), p[0].dtype),
            lambda p, o: mx.astype(mx.less_equal(p[0], p[1]), p[0].dtype))
_derivative("Minimum", lambda p, o: mx.astype(mx.less(p[0], p[1]), p[0].dtype),
            lambda p, o: mx.astype(mx.greater_equal(p[0], p[1]), p[0].dtype))


def _add_vjp(p, c, argnums, o, **_):
    return [c[0] for _ in argnums]


def _sub_vjp(p, c, argnums, o, **_):
    return [c[0] if i == 0 else mx.negative(c[0]) for i in argnums]


_linear("Add", _add_vjp)
_linear("Subtract", _sub_vjp)

for _n in ("LogicalAnd", "LogicalOr", "FloorDivide", "DivMod"):
    _zero(_n)


def _zero_in_tangent_dtype(name: str) -> None:
    """Comparisons and bitwise ops (MLX's ``Greater::jvp``, ``BitwiseBinary::jvp``, ...): the
    VJP is zeros like each input, the JVP zeros of the output's shape in the first
    tangent's dtype (a float tangent stays float, not the bool output's dtype)."""

    def jvp(primals, tangents, argnums, outputs, **_):
        return [mx.zeros(outputs[0].shape, tangents[0].dtype)]

    defvjp(name, lambda primals, c, argnums, o, **_: [mx.zeros_like(primals[i]) for i in argnums])
    defjvp(name, jvp)


for _n in ("Equal", "NotEqual", "NaNEqual", "Greater", "GreaterEqual", "Less", "LessEqual",
           "BitwiseAnd", "BitwiseOr", "BitwiseXor", "LeftShift", "RightShift"):
    _zero_in_tangent_dtype(_n)


# -- ternary ----------------------------------------------------------------------------
def _select_vjp(p, c, argnums, o, **_):
    out = []
    for i in argnums:
        if i == 0:
            out.append(mx.zeros_like(p[0]))
        else:
            z = mx.zeros_like(c[0])
            out.append(mx.where(p[0], c[0], z) if i == 1 else mx.where(p[0], z, c[0]))
    return out


def _select_jvp(p, tangents, argnums, outputs, **_):
    ta = mx.zeros_like(outputs[0])
    tb = ta
    for i, t in zip(argnums, tangents):
        if i == 1:
            ta = t
        elif i == 2:
            tb = t
    return [mx.where(p[0], ta, tb)]


defvjp("Select", _select_vjp)
defjvp("Select", _select_jvp)


# -- AsType, Broadcast ------------------------------------------------------------------
def _astype_vjp(p, c, argnums, o, **_):
    return [mx.astype(c[0], p[0].dtype)]


_linear("AsType", _astype_vjp)


def sum_to_shape(c, shape: tuple):
    """``c`` summed over the axes a broadcast to its shape added (the Broadcast VJP)."""
    lead = c.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, n in enumerate(shape)
                                if n == 1 and c.shape[lead + i] != 1]
    if axes:  # (one axis as an int: the same node, recorded by the C reduction)
        c = mx.sum(c, axis=axes[0] if len(axes) == 1 else axes, keepdims=True)
    if lead:  # MLX's broadcast_vjp squeezes the added axes (a shapeless replay keeps it):
        # mx.squeeze's node of those size-1 axes, without its checks
        c = squeeze_axes(c, tuple(range(lead)), False, resolve_stream(None))
    return c


_linear("Broadcast", lambda p, c, a, o, **_: [sum_to_shape(c[0], p[0].shape)])
