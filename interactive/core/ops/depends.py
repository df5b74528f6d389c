"""``mx.depends``: arrays equal to ``inputs`` that are evaluated only after
``dependencies`` (MLX's ``Depends`` primitive, ``mlx/ops.cpp``: a graph edge, no copy)."""

from __future__ import annotations

from typing import Any, Union

from ..array import array
from ..device import resolve_stream
from ..primitive import Primitive

__all__ = ["depends"]

_BAD_CAST = "std::bad_cast"  # what MLX's binding raises for anything but arrays


def _arrays(x: Any) -> tuple[list, bool]:
    """(arrays, whether a sequence was given), as MLX's binding casts its arguments."""
    if isinstance(x, array):
        return [x], False
    try:
        items = list(x)
    except TypeError:
        raise RuntimeError(_BAD_CAST) from None
    if isinstance(x, (str, bytes, dict)) or not all(isinstance(a, array) for a in items):
        raise RuntimeError(_BAD_CAST)
    return items, True


def depends(inputs: Union[array, list], dependencies: Union[array, list]) -> Union[array, list]:
    """Insert dependencies between arrays in the graph: the outputs are ``inputs`` (an array
    or a list, as given), and evaluating them evaluates ``dependencies`` first."""
    ins, as_list = _arrays(inputs)
    deps, _ = _arrays(dependencies)
    if not ins:  # MLX reads inputs[0] for the stream and crashes
        raise ValueError("[depends] Expected at least one input.")
    # MLX's stream: the first input's primitive's, else the default
    first = ins[0]._d
    s = first.node.primitive.stream if first.node is not None else resolve_stream(None)
    outs = array._make([a.shape for a in ins], [a.dtype for a in ins],
                       Primitive("Depends", s, count=len(ins)), ins + deps)
    return list(outs) if as_list else outs[0]
