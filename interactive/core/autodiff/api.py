"""``mx.grad``, ``mx.value_and_grad``, ``mx.vjp``, ``mx.jvp``: MLX 0.32's Python API and errors
(python/src/transforms.cpp) over the graph walks of ``engine``."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence, Union

from ..array import array
from ..device import incompatible
from ..transform_tracers import tracing
from ..tree import tree_arrays, tree_fill, tree_unflatten
from . import engine

__all__ = ["grad", "value_and_grad", "vjp", "jvp"]


def _handles(primals: list) -> list:
    """New handles of the primals for the function: an in-place operator on an argument
    (``x[idx] = 2.0``, ``x += 1``) rebinds the function's handle, not the primal the walk
    differentiates with respect to (MLX's C++ primals are values the binding copies)."""
    return [array._wrap(p._d) for p in primals]


def _type_name(obj: Any) -> str:
    return type(obj).__name__


_GRAD_SIG = ("{}(fun: Callable[P, R], argnums: int | Sequence[int] | None = None, argnames: str "
             "| Sequence[str] = []) -> Callable[P, {}]")


def _argnums_argnames(op: str, ret: str, fun, argnums, argnames) -> tuple[list, list]:
    """MLX's ``validate_argnums_argnames`` plus the binding's type checks."""
    sig = _GRAD_SIG.format(op, ret)
    ok_nums = argnums is None or (isinstance(argnums, int) and not isinstance(argnums, bool)) or (
        isinstance(argnums, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool)
                                                   for i in argnums))
    ok_names = isinstance(argnames, str) or (
        isinstance(argnames, (list, tuple)) and all(isinstance(n, str) for n in argnames))
    if not callable(fun) or not ok_nums or not ok_names:
        kw = {}
        if argnums is not None:
            kw["argnums"] = argnums
        if argnames != []:
            kw["argnames"] = argnames
        raise incompatible(op, sig, fun, **kw)
    names = [argnames] if isinstance(argnames, str) else list(argnames)
    if argnums is None:
        nums = [0] if not names else []
    elif isinstance(argnums, int):
        nums = [argnums]
    else:
        nums = list(argnums)
    return nums, names


def _value_and_grad_impl(fun: Callable, argnums: list, argnames: list, tag: str,
                         scalar_only: bool) -> Callable:
    if not argnums and not argnames:
        raise ValueError(f"{tag} Gradient wrt no argument requested")
    argnums = sorted(argnums)
    if argnums:
        if argnums[0] < 0:
            raise ValueError(f"{tag} Can't compute the gradient of negative argument index "
                             f"{argnums[0]}")
        for i in range(1, len(argnums)):
            if argnums[i] == argnums[i - 1]:
                raise ValueError(f"{tag} Duplicate argument index {argnums[0]} is not allowed.")

    def inner(*args: Any, **kwargs: Any) -> tuple:
        if argnums and argnums[-1] >= len(args):
            raise ValueError(f"{tag} Can't compute the gradient of argument index {argnums[-1]} "
                             f"because the function is called with only {len(args)} "
                             "positional arguments.")
        for key in argnames:
            if key not in kwargs:
                listed = "".join(f"{k}," for k in kwargs)
                raise ValueError(f"{tag} Can't compute the gradient of keyword argument '{key}' "
                                 "because the function is called with the following keyword "
                                 f"arguments {{{listed}}}")
        with tracing():
            return _differentiate(args, kwargs)

    def _differentiate(args: tuple, kwargs: dict) -> tuple:
        arrays: list = []
        ends: list = []  # where each argument's arrays end in ``arrays``
        for i in argnums:
            tree_arrays(args[i], arrays, strict=True)
            ends.append(len(arrays))
        for key in argnames:
            tree_arrays(kwargs[key], arrays, strict=True)
            ends.append(len(arrays))
        primals = engine.make_primals(arrays)
        given = _handles(primals)
        # MLX's tree_fill: the primals go into the arguments' lists and dicts in place (an
        # nn.Module stays itself), and after the call the originals go back into the slots
        # the function left alone (one it assigned keeps the new value); tree_fill is
        # tree_update with the next of the values at each array, in the order tree_arrays
        # lists them
        args_cpy, kwargs_cpy = list(args), dict(kwargs)
        slots = [(args_cpy, i, args[i]) for i in argnums] + [
            (kwargs_cpy, key, kwargs[key]) for key in argnames]
        start = 0
        for (target, k, tree), end in zip(slots, ends):
            target[k] = tree_fill(tree, given[start:end])
            start = end
        try:
            out = fun(*args_cpy, **kwargs_cpy)
        finally:
            n, k = len(given), 0  # the k-th array met pairs with the k-th primal
            for target, key, _ in slots:
                now = tree_arrays(target[key])
                back = []
                for a in now:
                    back.append(arrays[k] if k < n and a is given[k] else a)
                    k += 1
                tree_fill(target[key], back)
        if not isinstance(out, array):
            if scalar_only:
                raise ValueError(f"{tag} The return value of the function whose gradient we want "
                                 "to compute should be a scalar array; but "
                                 f"{_type_name(out)} was returned.")
            if not isinstance(out, tuple):
                raise ValueError(f"{tag} The return value of the function whose gradient we want "
                                 "to compute should be either a scalar array or a tuple with "
                                 "the first value being a scalar array (Union[array, "
                                 f"tuple[array, Any, ...]]); but {_type_name(out)} was returned.")
            if len(out) == 0:
                raise ValueError(f"{tag} The return value of the function whose gradient we want "
                                 "to compute should be either a scalar array or a non-empty "
                                 "tuple. The first value should be a scalar array and the rest "
                                 "can be anything. Instead, we got an empty tuple.")
            if not isinstance(out[0], array):
                raise ValueError(f"{tag} The return value of the function whose gradient we want "
                                 "to compute should be either a scalar array or a tuple with "
                                 "the first value being a scalar array (Union[array, "
                                 "tuple[array, Any, ...]]); but it was a tuple with the first "
                                 f"value being of type {_type_name(out[0])} .")
        flat = tree_arrays(out)
        stop_gradient = engine._ops().stop_gradient

        # value_and_grad: only the first output is differentiated (MLX stops the rest)
        flat = flat[:1] + [stop_gradient(o) for o in flat[1:]]
        grads = _vjp_outputs(flat, primals, [array(1.0)], list(range(len(primals))),
                             tag.strip("[]"))
        value = tree_unflatten(out, iter(flat))
        git = iter(grads)
        pos = [tree_unflatten(args[i], git) for i in argnums]
        if len(argnums) == 1:
            positional = pos[0]
        elif len(argnums) > 1:
            positional = tuple(pos)
        else:
            positional = None
        if not argnames:
            return value, positional
        return value, (positional, {k: tree_unflatten(kwargs[k], git) for k in argnames})

    return inner


def _vjp_outputs(outputs: list, primals: list, cotangents: list, argnums: list,
                 api: str = "vjp") -> list:
    """MLX's ``vjp`` after the function ran: match cotangents to outputs, then walk back."""
    seeds = []
    j = 0
    for i, o in enumerate(outputs):
        node = o._d.node
        if node is not None and node.primitive.defn.stops_gradient:  # MLX skips StopGradient
            continue
        if j >= len(cotangents):
            raise ValueError(f"[vjp] Number of outputs to compute gradients for ({len(outputs)}) "
                             f"does not match number of cotangents ({len(cotangents)}).")
        c = cotangents[j]
        if tuple(o.shape) != tuple(c.shape):
            msg = (f"[vjp] Output shape {_shape(o.shape)} does not match cotangent shape "
                   f"{_shape(c.shape)}.")
            if len(outputs) == 1 and o.size == 1:
                msg += " If you are using grad your function must return a scalar."
            raise ValueError(msg)
        seeds.append((i, c))
        j += 1
    return engine.backward(outputs, primals, seeds, argnums, api)


def _shape(shape: tuple) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


def value_and_grad(fun: Callable, argnums: Union[int, Sequence[int], None] = None,
                   argnames: Union[str, Sequence[str]] = []) -> Callable:
    """A function computing ``fun``'s value and its gradient w.r.t. ``argnums`` / ``argnames``."""
    nums, names = _argnums_argnames("value_and_grad", "tuple[R, Any]", fun, argnums, argnames)
    f = _value_and_grad_impl(fun, nums, names, "[value_and_grad]", False)
    return functools.wraps(fun, updated=())(lambda *a, **k: f(*a, **k))


def grad(fun: Callable, argnums: Union[int, Sequence[int], None] = None,
         argnames: Union[str, Sequence[str]] = []) -> Callable:
    """A function computing the gradient of scalar-valued ``fun`` w.r.t. its arguments."""
    nums, names = _argnums_argnames("grad", "Any", fun, argnums, argnames)
    f = _value_and_grad_impl(fun, nums, names, "[grad]", True)

    def g(*args: Any, **kwargs: Any) -> Any:
        return f(*args, **kwargs)[1]

    return functools.wraps(fun, updated=())(g)


def _as_list(out: Any) -> list:
    if isinstance(out, array):
        return [out]
    if isinstance(out, (list, tuple)) and all(isinstance(o, array) for o in out):
        return list(out)
    raise RuntimeError("std::bad_cast")


def _arrays_arg(op: str, sig: str, fun, primals, other) -> None:
    """nanobind's TypeError unless ``fun`` is callable and both are lists of arrays."""
    ok = callable(fun) and all(isinstance(x, (list, tuple)) and all(isinstance(a, array) for a in x)
                               for x in (primals, other))
    if not ok:
        raise incompatible(op, sig, fun, primals, other)


def vjp(fun: Callable, primals: list, cotangents: list) -> tuple[list, list]:
    """(outputs, vector-Jacobian products) of ``fun`` at ``primals`` with ``cotangents``."""
    _arrays_arg("vjp", "vjp(fun: Callable, primals: list[array], cotangents: list[array]) -> "
                "tuple[list[array], list[array]]", fun, primals, cotangents)
    with tracing():
        ps = engine.make_primals(list(primals))
        outs = _as_list(fun(*_handles(ps)))
        grads = _vjp_outputs(outs, ps, list(cotangents), list(range(len(ps))))
    return outs, grads


def jvp(fun: Callable, primals: list, tangents: list) -> tuple[list, list]:
    """(outputs, Jacobian-vector products) of ``fun`` at ``primals`` along ``tangents``."""
    _arrays_arg("jvp", "jvp(fun: Callable, primals: list[array], tangents: list[array]) -> "
                "tuple[list[array], list[array]]", fun, primals, tangents)
    if len(primals) != len(tangents):
        raise ValueError("[jvp] Number of inputs does not match number of tangents.")
    for p, t in zip(primals, tangents):
        if tuple(p.shape) != tuple(t.shape):
            raise ValueError("[jvp] Input shape does not match shape of tangent.")
    with tracing():
        ps = engine.make_primals(list(primals))
        outs = _as_list(fun(*_handles(ps)))
        return outs, engine.forward(outs, ps, list(tangents))
