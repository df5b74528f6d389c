"""``mx.compile``, ``mx.enable_compile``, ``mx.disable_compile`` (and ``MLX_DISABLE_COMPILE``).

A compiled function flattens its arguments (arrays, and lists / tuples / dicts of them;
ints, floats, strings and None become part of the cache key, as does the tree's shape),
looks up a traced program by (key, input dtypes and shapes — only ndims when
``shapeless=True``), traces on a miss (the Python body runs only then: placeholders in,
graph out, simplified and fused into Compiled ops), and replays the program on the real
arrays. Captured state (``inputs=`` / ``outputs=``, e.g. ``mx.random.state``) is swapped
for placeholders while tracing and refilled with the new arrays after every call.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable, Optional

from ..array import array
from ..device import resolve_stream
from ..tree import tree_arrays, tree_fill, tree_unflatten, tree_update
from ..fusion import _MODE as _FUSION, fuse
from ..compile_trace import (Program, ReplayPlan, UncapturedInputs, dynamic_tracing, made_from_tracers,
                       replay, simplify, trace)

__all__ = ["compile", "enable_compile", "disable_compile"]

_LIST, _DICT, _ARRAY, _NONE = ("list",), ("dict",), ("array",), ("none",)
_state = {"enabled": "MLX_DISABLE_COMPILE" not in os.environ}
_SHAPED = 256  # a shapeless function's entries of concrete shapes kept (_Entry.shaped)


def _call_base() -> type:
    """CompiledFunction's base: ``core/_call.c``'s CompiledBase, whose call runs the fast
    path's hit in C and otherwise ``_call``; ``object`` without the extension (no C
    compiler) or with ``settings.c_call`` off (``TAPESCOPE_C_CALL=0``), and ``_call`` is
    then ``__call__``."""
    from tapescope.kernels.settings import settings

    if not settings.c_call:
        return object
    try:
        from .. import _call
    except ImportError:
        return object
    from .. import device, transform_tracers
    from ..array import ArrayDesc
    from ..primitive import Node, _node_ids

    _call.configure({"node_type": Node, "desc_type": ArrayDesc, "array_type": array,
                     "node_ids": _node_ids, "tracer": transform_tracers, "fusion": _FUSION,
                     "state": _state, "resolve_stream": resolve_stream, "device": device})
    return _call.CompiledBase


_CallBase = _call_base()


def _handles_py(descs: list) -> list:
    return [array._wrap(d) for d in descs]


def _c_handles():
    """core/_call.c's ``handles`` (the results' handles made in C) where array._make1
    records in C (the switch compile_trace's replay follows), else ``_handles_py``."""
    if getattr(array, "_make1_py", None) is None:
        return _handles_py
    from .. import _call

    return _call.handles


_handles = _c_handles()


def enable_compile() -> None:
    """Globally enable compilation (overrides ``MLX_DISABLE_COMPILE``)."""
    _state["enabled"] = True


def disable_compile() -> None:
    """Globally disable compilation: compiled functions run as plain Python."""
    _state["enabled"] = False


def _type_error(obj: Any) -> ValueError:
    return ValueError("[compile] Function arguments must be trees of arrays or constants "
                      f"(floats, ints, strings, or None), but received type {type(obj).__qualname__}.")


def _flatten(obj: Any, arrays: list, key: list) -> None:
    """MLX's argument walk: arrays out, everything else (and the structure) into ``key``."""
    if isinstance(obj, array):
        arrays.append(obj)
        key.append(_ARRAY)
    elif isinstance(obj, (list, tuple)):
        key.append(_LIST)
        for x in obj:
            _flatten(x, arrays, key)
    elif isinstance(obj, dict):
        key.append(_DICT)
        for k, v in obj.items():
            key.append(("k", k))
            _flatten(v, arrays, key)
    elif obj is None:
        key.append(_NONE)
    elif isinstance(obj, (bool, int, float, str)):
        key.append((type(obj).__name__, obj))
    else:
        raise _type_error(obj)


def _structure(out: Any) -> tuple:
    """(flat arrays, a template to rebuild the output tree from new arrays)."""
    return tree_arrays(out), out


class _Entry:
    __slots__ = ("program", "template", "n_outputs", "plan", "lone")

    def __init__(self, program: Program, template: Any, n_outputs: int):
        self.program, self.template, self.n_outputs = program, template, n_outputs
        self.plan = ReplayPlan(program)
        # the function returns exactly one array: the call hands back that handle
        self.lone = isinstance(template, array) and n_outputs == 1

    @classmethod
    def shaped(cls, entry: "_Entry", real: list) -> "_Entry":
        """A shapeless function's entry for arguments of ``real``'s shapes (its ``_fast``
        table's, which the call in C replays): ``entry``'s template, its plan for those
        shapes (``ReplayPlan.shaped``), no program of its own."""
        e = cls.__new__(cls)
        e.program, e.template, e.n_outputs, e.lone = None, entry.template, entry.n_outputs, entry.lone
        e.plan = ReplayPlan.shaped(entry.program, real)
        return e

    def __del__(self):
        # a traced program's ops and values refer to each other (GOp.outputs, Val.op): cut
        # when its entry goes, the program (its constants' arrays among it) is freed by
        # reference counting then, not whenever the cyclic collector next runs
        if self.program is not None:  # (a shaped entry shares its function's program)
            for g in self.program.tape:
                g.outputs = []


class CompiledFunction(_CallBase):
    """What ``mx.compile`` returns: call it like the function it wraps."""

    def __init__(self, fun: Callable, inputs: Any, outputs: Any, shapeless: bool):
        self._fun = fun
        self._inputs = inputs
        self._outputs = outputs
        self._shapeless = bool(shapeless)
        self._cache: dict = {}
        # signature (shape, dtype per positional array) -> entry, for calls that pass only
        # arrays positionally to a function without captured state (a shapeless one's:
        # its entry for those shapes, _Entry.shaped)
        self._fast: dict = {}
        self._direct = inputs is None and outputs is None
        # re-entrant: the function may call itself while it is traced (MLX allows it; the
        # inner call is a miss at its own signature, or recurses until RecursionError)
        self._lock = threading.RLock()
        self.traces = 0  # how many times the function was traced (cache misses)
        # updated=(): copying ``fun.__dict__`` would copy a wrapped CompiledFunction's
        # state (its program cache) onto this one, which then ran the inner function
        functools.update_wrapper(self, fun, updated=())

    def __get__(self, obj, objtype=None):  # behave as a method when set on a class
        return self if obj is None else functools.partial(self, obj)

    def programs(self) -> list:
        """The traced, simplified, fused programs held in this function's cache."""
        return [e.program for e in self._cache.values()]

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        """The call (``__call__``; with core/_call.c its base calls this on a miss)."""
        if not _state["enabled"]:
            return self._fun(*args, **kwargs)
        # a trace's primitives carry the default stream it was made under: MLX's compile cache
        # (mlx/compile.cpp CompilerCache::find) matches an entry only on the same stream
        stream = resolve_stream(None)
        if self._direct and not kwargs:
            # the fast path: positional arrays only, a signature traced before
            # keyed by the stream's index and dtype names: equal to keying by the objects
            # (they compare by those), without calling their Python ``__hash__``
            descs = []
            sig = [stream.index, _FUSION[0]]
            for a in args:
                if a.__class__ is not array:
                    break
                d = a._d
                descs.append(d)
                sig.append(d.shape)
                sig.append(d.dtype.name)
            else:
                entry = self._fast.get(tuple(sig))
                if entry is not None:
                    outs = entry.plan.run(descs)
                    if entry.lone:
                        h = array.__new__(array)
                        h._d = outs[0]
                        return h
                    return tree_unflatten(entry.template, iter([array._wrap(d) for d in outs]))
        arrays: list = []
        key: list = []
        _flatten(args, arrays, key)
        n_args = len(arrays)
        _flatten(kwargs, arrays, key)
        n_kw = len(arrays)
        if self._inputs is not None:
            tree_arrays(self._inputs, arrays)
        descs = [x._d for x in arrays]
        if self._shapeless:
            sig = tuple([(len(d.shape), d.dtype) for d in descs])
        else:
            sig = tuple([(d.shape, d.dtype) for d in descs])
        # the stream by its index (Stream compares and hashes by it); the fusion mode
        # changes the program
        ck = (tuple(key), sig, stream.index, _FUSION[0])
        entry = self._cache.get(ck)
        if entry is None:
            with self._lock:
                entry = self._cache.get(ck)
                if entry is None:
                    try:
                        entry = self._trace(args, kwargs, arrays, n_args, n_kw)
                    except UncapturedInputs:
                        if made_from_tracers(arrays):  # MLX runs the function uncompiled
                            return self._fun(*args, **kwargs)
                        raise
                    self._cache[ck] = entry
        if self._direct and not kwargs and n_args == len(args) and all(
                a.__class__ is array for a in args):
            fast_key = [stream.index, _FUSION[0]]
            for x in arrays:
                fast_key.append(x.shape)
                fast_key.append(x.dtype.name)
            if self._shapeless:  # the plan of these shapes, made once (kept for a bounded few)
                if len(self._fast) >= _SHAPED:
                    self._fast.clear()
                entry = _Entry.shaped(entry, descs)
            self._fast[tuple(fast_key)] = entry
        if self._shapeless and entry.program is not None:
            outs = replay(entry.program, descs, True)
        else:
            outs = entry.plan.run(descs)
        handles = _handles(outs)
        if self._outputs is not None:
            tree_fill(self._outputs, handles[entry.n_outputs:])
        if entry.lone:
            return handles[0]
        return tree_unflatten(entry.template, iter(handles[:entry.n_outputs]))

    def _trace(self, args, kwargs, arrays, n_args, n_kw) -> _Entry:
        avals = [(x.shape, x.dtype) for x in arrays]
        box: dict = {}

        def run(tracers: list):
            it = iter(tracers)
            a = tree_unflatten(args, it)
            k = tree_unflatten(kwargs, it)
            originals = []
            if self._inputs is not None:
                originals = tree_arrays(self._inputs)
                fill = iter(tracers[n_kw:])
                tree_update(self._inputs, lambda a: next(fill))
            try:
                out = self._fun(*a, **k)
                flat, template = _structure(out)
                box["n"] = len(flat)
                if self._outputs is not None:  # read before the inputs' originals go back
                    flat = flat + tree_arrays(self._outputs)
            finally:
                if self._inputs is not None:
                    # put the originals back wherever a tracer is still sitting
                    tr = {id(t): o for t, o in zip(tracers[n_kw:], originals)}
                    tree_update(self._inputs, lambda a: tr.get(id(a), a))
            return flat, template

        with dynamic_tracing(self._shapeless):
            program, template = trace(run, avals, arrays)
        self.traces += 1
        # reductions fuse at their traced shapes only (a shapeless program is reused at others)
        fuse(simplify(program), reductions=False if self._shapeless else None)
        return _Entry(program, template, box["n"])


if _CallBase is object:
    CompiledFunction.__call__ = CompiledFunction._call


def compile(fun: Callable, inputs: Optional[Any] = None, outputs: Optional[Any] = None,
            shapeless: bool = False) -> Callable:
    """Return a compiled version of ``fun``: traced once per input signature, its
    elementwise chains fused into generated kernels."""
    if not callable(fun):
        raise TypeError("compile(): incompatible function arguments. The following argument "
                        "types are supported:\n    1. compile(fun: Callable[P, R], inputs: "
                        "object | None = None, outputs: object | None = None, shapeless: bool "
                        "= False) -> Callable[P, R]\n\nInvoked with types: "
                        f"{type(fun).__name__}")
    return CompiledFunction(fun, inputs, outputs, shapeless)
