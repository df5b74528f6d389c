"""MLX's reduction primitives as generated C on the CPU: ``Reduce`` (Sum, Prod, Max, Min,
And, Or), ``ArgReduce``, ``Softmax``, ``LogSumExp``, ``CumSum`` / ``CumProd`` / ``CumMax`` /
``CumMin``.

``rule_for(prim)`` gives the CPU backend's rule for such a primitive (the evaluator runs it
in place of the array-module rule): the input's layout picks the kernel and its arguments
(``kernels/common/reductions.py``), the kernel is built once through the kernel cache
(``compiler.get_kernel``: in ``kernel_cache()``, on the timeline, on disk) and called. A call
the kernels cannot take (complex values, CumLogAddExp, no compiler, a failed build) runs the
primitive's array-module rule, recorded on the timeline as a ``kernel_fallback``.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Optional

import numpy as np

from .. import timeline
from ..codegen.c_ops import Unsupported
from ..common import reductions as plan
from ..primitives import REGISTRY
from . import compiler

_REDUCE = {"Sum": "sum", "Prod": "prod", "Max": "max", "Min": "min", "And": "and", "Or": "or"}
_SCAN = {"sum", "prod", "max", "min"}
_SMALL = 1 << 15  # elements below which the kernel runs holding the GIL (no release cost)

_entries: dict = {}  # kernel name -> (compiler generation, KernelEntry or the BuildError)


def _dialect(tc):
    from ..codegen.render import CDialect

    return CDialect(vector_math=tc.vector_math)


def _entry(spec):
    """The loaded kernel of ``spec``, or the BuildError saying why there is none."""
    name = spec.name
    got = _entries.get(name)
    if got is not None and got[0] == compiler.generation():
        return got[1]
    try:
        try:
            spec.kernel()
        except Unsupported as e:
            raise compiler.BuildError(f"the C dialect cannot express it: {e}") from None
        entry = compiler.get_kernel(name, spec.layout, lambda tc: spec.source(_dialect(tc)),
                                    tape=spec)
    except compiler.BuildError as e:
        entry = e
    _entries[name] = (compiler.generation(), entry)
    return entry


def _fallback(prim_name: str, name: str, variant: str, why: str, xp, ins, kw):
    t0 = timeline.now() if timeline.enabled else 0
    out = REGISTRY[prim_name].rule(xp, *ins, **kw)
    if t0:
        timeline.add("kernel_fallback", t0, timeline.now(), name=name, device="cpu",
                     detail={"reason": why, "runtime": "numpy", "variant": variant,
                             "primitive": prim_name})
    return out


def _declined(prim_name: str, a, xp, kw):
    """A call no kernel takes: the rule, on the timeline with the reason (an empty array
    needs no kernel and is not recorded)."""
    if a.size == 0:
        return REGISTRY[prim_name].rule(xp, a, **kw)
    why = ("complex values" if a.dtype.kind == "c" else
           f"{kw.get('reduce_type')} scans" if "reduce_type" in kw and prim_name.startswith("Cum")
           else "a 0-d input" if a.ndim == 0 else f"{a.dtype} values" if prim_name in
           ("Softmax", "LogSumExp") else "strides that are not whole elements")
    return _fallback(prim_name, prim_name, "", f"no generated kernel for {why}", xp, (a,), kw)


def _launch(call, a: np.ndarray, prim_name: str, xp, ins, kw):
    """Run ``call``'s kernel on ``a`` (its strides as planned) into a new output."""
    spec = call.spec
    entry = _entry(spec)
    if isinstance(entry, compiler.BuildError):
        compiler.note_fallback(spec.name, spec.layout, "", str(entry), tape=spec)
        return _fallback(prim_name, spec.name, spec.layout, str(entry), xp, ins, kw)
    out = np.empty(call.out_shape, dtype=call.out_dtype)
    ptrs = [a.ctypes.data, out.ctypes.data]
    keep = []
    if call.parts:
        part = np.empty(call.parts, dtype=call.part_dtype)
        keep.append(part)
        ptrs.append(part.ctypes.data)
    ptrs += list(call.ints.values())
    for arr in call.arrays.values():
        keep.append(arr)
        ptrs.append(arr.ctypes.data)
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    fn = entry.fast_fn(gil=a.size < _SMALL)
    t0 = timeline.now() if timeline.enabled else 0
    fn(argv)
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=spec.name, device="cpu",
                     detail={"runtime": "cpu", "variant": spec.layout, "primitive": prim_name})
    entry.hits += 1
    del keep
    return out


def _strides(a: np.ndarray) -> Optional[tuple]:
    isz = a.itemsize
    if any(s % isz for s in a.strides):
        return None
    return tuple(s // isz for s in a.strides)


_calls: dict = {}  # (primitive, parameters, dtype, shape, strides) -> its planned Call


def _planned(key, make):
    call = _calls.get(key)
    if call is None:
        if len(_calls) > 4096:
            _calls.clear()
        call = _calls[key] = make()
    return call


def _reduce_rule(prim_name: str, op: str) -> Callable:
    def rule(xp, a, *, axes):
        st = _strides(a)
        if a.dtype.kind == "c" or st is None or a.size == 0:
            return _declined(prim_name, a, xp, {"axes": axes})
        axes = tuple(axes)
        call = _planned((op, axes, a.dtype, a.shape, st),
                        lambda: plan.reduce_call(op, a.dtype, a.shape, st, axes))
        return _launch(call, a, prim_name, xp, (a,), {"axes": axes})
    return rule


def _arg_rule(xp, a, *, reduce_type, axis):
    st = _strides(a)
    if a.dtype.kind == "c" or st is None or a.size == 0:
        return _declined("ArgReduce", a, xp, {"reduce_type": reduce_type, "axis": axis})
    axis = int(axis) % a.ndim
    call = _planned((reduce_type, axis, a.dtype, a.shape, st),
                    lambda: plan.reduce_call(reduce_type, a.dtype, a.shape, st, (axis,)))
    return _launch(call, a, "ArgReduce", xp, (a,), {"reduce_type": reduce_type, "axis": axis})


def _softmax_rule(family: str, prim_name: str) -> Callable:
    def rule(xp, a, **kw):
        if a.dtype.kind not in "f" and a.dtype.name != "bfloat16" or a.size == 0 or a.ndim == 0:
            return _declined(prim_name, a, xp, kw)
        st = _strides(a)
        precise = bool(kw.get("precise"))
        call = _planned((family, precise, a.dtype, a.shape, st), lambda: plan.softmax_call(
            family, a.dtype, a.shape, st, precise)) if st is not None else None
        if call is None:  # MLX's backends copy such an input first
            a = np.ascontiguousarray(a)
            call = plan.softmax_call(family, a.dtype, a.shape, _strides(a), bool(kw.get("precise")))
        return _launch(call, a, prim_name, xp, (a,), kw)
    return rule


def _scan_rule(prim_name: str) -> Callable:
    def rule(xp, a, *, reduce_type, axis, reverse, inclusive):
        kw = {"reduce_type": reduce_type, "axis": axis, "reverse": reverse, "inclusive": inclusive}
        if reduce_type not in _SCAN or a.dtype.kind == "c" or a.size == 0 or a.ndim == 0:
            return _declined(prim_name, a, xp, kw)
        axis = int(axis) % a.ndim
        st = _strides(a)
        call = plan.scan_call(reduce_type, a.dtype, a.shape, st, axis, bool(inclusive),
                              bool(reverse)) if st is not None else None
        if call is None:
            a = np.ascontiguousarray(a)
            call = plan.scan_call(reduce_type, a.dtype, a.shape, _strides(a), axis,
                                  bool(inclusive), bool(reverse))
        return _launch(call, a, prim_name, xp, (a,), kw)
    return rule


RULES: dict = {name: _reduce_rule(name, op) for name, op in _REDUCE.items()}
RULES["ArgReduce"] = _arg_rule
RULES["Softmax"] = _softmax_rule("softmax", "Softmax")
RULES["LogSumExp"] = _softmax_rule("logsumexp", "LogSumExp")
RULES.update({n: _scan_rule(n) for n in ("CumSum", "CumProd", "CumMax", "CumMin")})


def rule_for(name: str) -> Optional[Callable]:
    """The CPU kernel rule of primitive ``name`` (None: its array-module rule runs)."""
    return RULES.get(name)
