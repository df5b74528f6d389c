"""Helpers the test files share: the graph a result recorded, and errors compared with MLX."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import tapescope.core as mx
from conftest import mlx_ref


def primitive_names(*outs) -> list:
    """Primitive names of the unevaluated graph recorded for ``outs`` (each node once)."""
    seen, names, stack = set(), [], [o._d for o in outs]
    while stack:
        node = stack.pop().node
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            names.append(node.primitive.name)
            stack.extend(node.inputs)
    return names


def same_error(case: Callable) -> None:
    """``case(module)`` raises the same exception type and message in tapescope as in MLX
    (both evaluated, so errors raised late count too); skipped without MLX."""
    if mlx_ref is None:
        pytest.skip("mlx is not installed")
    with pytest.raises(Exception) as want:
        mlx_ref.eval(case(mlx_ref))
    with pytest.raises(type(want.value)) as got:
        mx.eval(case(mx))
    # the whole message, every line of it
    assert str(got.value) == str(want.value), f"{str(got.value)!r} != {str(want.value)!r}"


def raises_exactly(call: Callable, module, exc: type, msg: str) -> None:
    """``call(module)`` raises ``exc`` with exactly ``msg``."""
    with pytest.raises(exc) as info:
        call(module)
    assert str(info.value) == msg


def check(out, expected) -> None:
    """``out`` (an array) has ``expected``'s shape and exactly its values."""
    expected = np.asarray(expected)
    assert out.shape == expected.shape
    np.testing.assert_array_equal(np.array(out), expected)


def data(x):
    """The evaluated data behind ``x`` (a numpy array, or a device's, e.g. CuPy's, on a GPU
    stream): to see which buffer it shares (``shares_memory``) or read it (``host``)."""
    mx.eval(x)
    return x._d.data


def shares_memory(a, b) -> bool:
    """``np.shares_memory`` for host arrays, the array module's own for device arrays."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    import cupy

    return bool(cupy.shares_memory(a, b))


def host(a) -> np.ndarray:
    """A data array's values on the host (a copy of a device array)."""
    return a if isinstance(a, np.ndarray) else a.get()


def outcome(module, source: str, **names):
    """(exception type, whole message) of evaluating ``source`` with ``M`` bound to ``module``
    (and the result evaluated), or None when nothing was raised; compared between MLX and us."""
    try:
        res = eval(source, {"M": module, **{k: v(module) for k, v in names.items()}})
        if isinstance(res, (module.array, list, tuple)):
            module.eval(res)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None
