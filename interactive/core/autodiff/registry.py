"""Registering VJP / JVP rules onto the primitive definitions (``tapescope.kernels``).

A VJP rule is ``vjp(primals, cotangents, argnums, outputs, **params) -> [cotangent per argnum]``
(a cotangent is None for a sibling output nobody holds any more); a JVP rule is
``jvp(primals, tangents, argnums, outputs, **params) -> [tangent per output]`` (``tangents``:
one per argnum). ``primals`` / ``outputs`` are the node's arrays, ``params`` its parameters.
A primitive without a rule keeps the reason in its definition's ``why``.
"""

from __future__ import annotations

from typing import Callable, Optional

from tapescope.kernels import primitives

from ..array import array
from ..device import resolve_stream
from ..primitive import Primitive


def defvjp(name: str, rule: Callable) -> Callable:
    """Set ``rule`` as the VJP of primitive ``name``."""
    primitives.set_facet(name, "vjp", rule)
    return rule


def defjvp(name: str, rule: Callable) -> Callable:
    """Set ``rule`` as the JVP of primitive ``name``."""
    primitives.set_facet(name, "jvp", rule)
    return rule


def without(name: str, vjp: Optional[str] = None, jvp: Optional[str] = None) -> None:
    """State why primitive ``name`` has no VJP / JVP rule."""
    if vjp:
        primitives.state_absent(name, "vjp", vjp)
    if jvp:
        primitives.state_absent(name, "jvp", jvp)


def record(name: str, inputs: list, shapes: list, dtypes: list, **params) -> list:
    """Record primitive ``name`` with ``params`` on ``inputs``; one array per output."""
    return array._make([tuple(s) for s in shapes], dtypes,
                       Primitive(name, resolve_stream(None), **params), inputs)


def record1(name: str, inputs: list, shape: tuple, dtype, **params) -> array:
    return record(name, inputs, [shape], [dtype], **params)[0]


def same_op(name: str, inputs: list, outputs: list, **params) -> list:
    """The node's own primitive applied to other inputs (tangents of a linear op), with the
    node's output shapes and dtypes."""
    live = [o for o in outputs if o is not None]
    return record(name, inputs, [o.shape for o in live], [o.dtype for o in live], **params)
