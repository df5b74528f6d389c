"""Primitives: the named operations recorded in the lazy graph, and the graph node."""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Optional

from tapescope.kernels.primitives import (  # noqa: F401 - the families, for the op layer
    ASTYPE, BINARY, BROADCAST, COMPILED, PLACEHOLDER, REDUCE, REGISTRY, TERNARY, UNARY,
    PrimitiveDef,
)


class Primitive:
    """One operation in the graph, printed under its MLX name (``Add``, ``Broadcast``, ...).

    ``defn`` is its definition (``tapescope.kernels.primitives``: family, rule, spellings, ...);
    ``params`` holds the operation's parameters (e.g. a Broadcast's shape) as a sorted tuple
    of (key, value) pairs so that two primitives compare equal exactly when they compute the
    same thing; ``stream`` is where it runs.
    """

    __slots__ = ("name", "_params", "kw", "stream", "defn")

    def __init__(self, name: str, stream, **params: Any):
        try:  # looked up once: the eval reads the rule and flags off it
            self.defn: PrimitiveDef = REGISTRY[name]
        except KeyError:
            raise KeyError(f"unregistered primitive {name}") from None
        self.name = name
        self.stream = stream
        self.kw = params  # the parameters as keyword arguments for the rule (never mutated)
        self._params = None  # sorted when first asked for (few primitives ever are)

    @property
    def params(self) -> tuple:
        """The parameters as a sorted tuple of (key, value) pairs."""
        p = self._params
        if p is None:
            p = self._params = tuple(sorted(self.kw.items())) if self.kw else ()
        return p

    @property
    def kind(self) -> str:
        """The primitive's family (``unary``, ``reduce``, ``shape``, ...)."""
        return self.defn.family

    @property
    def fusable(self) -> bool:
        return self.defn.fusable

    def kwargs(self) -> dict:
        return dict(self.kw)

    def is_equivalent(self, other: "Primitive") -> bool:
        """Same operation with the same parameters (used by common-subexpression elimination)."""
        return self.name == other.name and self.params == other.params

    def __repr__(self) -> str:
        return self.name


def construct_in_c(new) -> None:
    """Make ``Primitive(name, stream, **params)`` the C ``new`` (core/_binary.c's
    ``primitive``: ``__init__``'s steps without its Python frame) in place of ``__init__``."""
    Primitive.__new__ = staticmethod(new)
    del Primitive.__init__


_node_ids = itertools.count(1)


class Node:
    """A primitive applied to input arrays, producing one or more sibling output arrays.

    Outputs are held weakly so that the graph does not keep dead arrays alive; inputs are
    held strongly until the node is evaluated and detached. A node is *unscheduled* while
    ``event`` is None, *scheduled* while it holds the event of the eval that will run it,
    and *available* once its outputs have data (they no longer point at the node).
    """

    __slots__ = ("primitive", "inputs", "outputs", "id", "event", "keep", "backward", "__weakref__")

    def __init__(self, primitive: Primitive, inputs: list):
        self.primitive = primitive
        self.inputs = inputs
        self.outputs: list[weakref.ref] = []
        self.id = next(_node_ids)
        self.event = None  # set while scheduled: the event its stream signals when done
        self.keep = False  # a tracer's: evaluating it keeps its inputs (core/transform_tracers.py)
        self.backward = False  # reverse mode recorded it (autodiff/engine.py ``_mark``)

    def output(self, i: int) -> Optional[Any]:
        return self.outputs[i]()

    def __repr__(self) -> str:
        return f"Node({self.primitive.name}#{self.id})"
