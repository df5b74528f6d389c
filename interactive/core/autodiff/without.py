"""Primitives with no VJP / JVP rule, and why (MLX has none, or nothing can flow through)."""

from __future__ import annotations

from .registry import without

_NO_MLX = ("MLX has no {mode} for {name}: raises [Primitive::{mode_l}] Not implemented for "
           "{name}.")
for _name in ("Inverse", "Cholesky", "QRF", "SVD", "Eigh", "Eig", "LUF"):
    without(_name, vjp=_NO_MLX.format(mode="VJP", mode_l="vjp", name=_name),
            jvp=_NO_MLX.format(mode="JVP", mode_l="jvp", name=_name))

_NO_INPUTS = "no inputs: never on a path from a differentiated argument"
for _name in ("Arange", "Placeholder"):
    without(_name, vjp=_NO_INPUTS, jvp=_NO_INPUTS)

without("RandomBits",
        vjp="its input is a uint32 key: random bits carry no gradient (MLX has no VJP)",
        jvp="its input is a uint32 key: random bits carry no tangent (MLX has no JVP)")
