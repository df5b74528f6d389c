"""``mx.custom_function`` and ``mx.checkpoint``: MLX's ``CustomTransforms`` primitive.

A custom function runs its body, stops the gradient of each output, and records one
``CustomTransforms`` node whose inputs are the arguments' arrays followed by those outputs
(evaluating it hands the outputs through). Its VJP / JVP rules call the user's ``vjp`` /
``jvp`` (or differentiate the body again where one is not given), so reverse mode never
looks inside the body. ``checkpoint`` is a custom function whose VJP runs the body again:
the forward intermediates need not be kept for the backward pass.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from tapescope.kernels import primitives

from ..tree import tree_arrays, tree_unflatten
from . import engine
from .registry import defjvp, defvjp, record

__all__ = ["custom_function", "checkpoint"]


def _pass_outputs(xp, *inputs, num_outputs, **_):
    """The rule: the trailing ``num_outputs`` inputs are the outputs (copied)."""
    outs = tuple(x.copy() for x in inputs[len(inputs) - num_outputs:])
    return outs[0] if num_outputs == 1 else outs


primitives.define(
    "CustomTransforms", family=primitives.CUSTOM_FUNCTION,
    shape="interactive/core/autodiff/custom.py (the wrapped function's output shapes)",
    dtype="interactive/core/autodiff/custom.py (the wrapped function's output dtypes)",
)(_pass_outputs)


def _ct_vjp(p, c, argnums, o, *, num_outputs, vjp, jvp, vmap=None):
    from ..ops import zeros_like

    n_in = len(p) - num_outputs
    inputs = p[:n_in]
    # an output nobody holds any more: its value is the node's input, its cotangent zeros
    outs = [oi if oi is not None else p[n_in + k] for k, oi in enumerate(o)]
    cots = [ci if ci is not None else zeros_like(outs[k]) for k, ci in enumerate(c)]
    grads = vjp(inputs, cots, outs)

    out = []
    for i in argnums:
        if i < len(inputs) and i < len(grads) and grads[i] is not None:
            out.append(grads[i])
        else:
            out.append(zeros_like(p[i]))
    return out


def _ct_jvp(p, t, argnums, o, *, num_outputs, vjp, jvp, vmap=None):
    inputs = p[:len(p) - num_outputs]
    tans: list = [None] * len(inputs)
    for i, ti in zip(argnums, t):
        if i < len(inputs):
            tans[i] = ti
    return jvp(inputs, tans, argnums)


defvjp("CustomTransforms", _ct_vjp)
defjvp("CustomTransforms", _ct_jvp)


def _default_vjp(fun_flat: Callable) -> Callable:
    def vjp(inputs, cots, outputs):
        ps = engine.make_primals(inputs)
        outs = fun_flat(ps)
        seeds = [(k, ck) for k, ck in enumerate(cots) if ck is not None]
        return engine.backward(outs, ps, seeds, list(range(len(ps))))

    return vjp


def _default_jvp(fun_flat: Callable) -> Callable:
    def jvp(inputs, tans, argnums):
        from ..ops import zeros_like

        ps = engine.make_primals(inputs)
        outs = fun_flat(ps)
        ts = [t if t is not None else zeros_like(x) for x, t in zip(inputs, tans)]
        return engine.forward(outs, ps, ts)

    return jvp


def custom_transforms(fun_flat: Callable, inputs: list, vjp: Optional[Callable],
                      jvp: Optional[Callable], vmap: Optional[Callable] = None) -> list:
    """MLX's ``custom_function`` on flat arrays: outputs of one CustomTransforms node
    (``vmap``: its batching rule on flat arrays, ``core/vmap/custom.py``)."""
    from ..ops import stop_gradient
    from ..vmap.custom import default_vmap

    outs = [stop_gradient(o) for o in fun_flat(inputs)]
    return record("CustomTransforms", list(inputs) + outs, [o.shape for o in outs],
                  [o.dtype for o in outs], num_outputs=len(outs),
                  vjp=vjp or _default_vjp(fun_flat), jvp=jvp or _default_jvp(fun_flat),
                  vmap=vmap or default_vmap(fun_flat, len(outs)))


class custom_function:
    """Set up a function for custom gradient and vmap definitions."""

    def __init__(self, f: Callable):
        self._fun = f
        self._vjp: Optional[Callable] = None
        self._jvp: Optional[Callable] = None
        self._vmap: Optional[Callable] = None
        functools.update_wrapper(self, f, updated=())

    def vjp(self, f: Callable) -> Callable:
        """Define a custom vjp for the wrapped function."""
        self._vjp = f
        return self

    def jvp(self, f: Callable) -> Callable:
        """Define a custom jvp for the wrapped function."""
        self._jvp = f
        return self

    def vmap(self, f: Callable) -> Callable:
        """Define a custom vmap for the wrapped function."""
        self._vmap = f
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._vjp is None and self._jvp is None and self._vmap is None:
            return self._fun(*args, **kwargs)
        inputs = tree_arrays((args, kwargs))
        box: dict = {}

        def fun_flat(arrs: list) -> list:
            a, k = tree_unflatten((args, kwargs), iter(arrs))
            out = self._fun(*a, **k)
            box["out"] = out
            return tree_arrays(out)

        def vjp_flat(prims: list, cots: list, outs: list) -> list:
            a, k = tree_unflatten((args, kwargs), iter(prims))
            template = box["out"]
            c = tree_unflatten(template, iter(cots))
            o = tree_unflatten(template, iter(outs))
            res = self._vjp(a[0] if len(a) == 1 else a, c, o, **k)
            if len(a) == 1:
                res = (res,)
            return tree_arrays(res)

        def jvp_flat(prims: list, tans: list, argnums: list) -> list:
            a, k = tree_unflatten((args, kwargs), iter(prims))
            t, _ = tree_unflatten((args, kwargs), iter(tans))
            res = self._jvp(a[0] if len(a) == 1 else a, t[0] if len(t) == 1 else t, **k)
            return tree_arrays(res)

        vmap_flat = None
        if self._vmap is not None:
            from ..vmap.custom import python_vmap

            vmap_flat = python_vmap(self._vmap, (args, kwargs))
        outs = custom_transforms(fun_flat, inputs, vjp_flat if self._vjp else None,
                                 jvp_flat if self._jvp else None, vmap_flat)
        return tree_unflatten(box["out"], iter(outs))


def checkpoint(fun: Callable) -> Callable:
    """A function that recomputes ``fun``'s intermediates in the backward pass."""

    @functools.wraps(fun, updated=())
    def inner(*args: Any, **kwargs: Any) -> Any:
        inputs = tree_arrays((args, kwargs))
        box: dict = {}

        def fun_flat(arrs: list) -> list:
            a, k = tree_unflatten((args, kwargs), iter(arrs))
            out = fun(*a, **k)
            box.setdefault("out", out)
            return tree_arrays(out)

        outs = custom_transforms(fun_flat, inputs, None, None)
        return tree_unflatten(box["out"], iter(outs))

    return inner
