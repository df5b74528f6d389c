"""MLX's reduction primitives as generated C on the CPU: ``Reduce`` (Sum, Prod, Max, Min,
And, Or), ``ArgReduce``, ``Softmax``, ``LogSumExp``, ``CumSum`` / ``CumProd`` / ``CumMax`` /
``CumMin``.

``RULES`` are the CPU backend's rules for them (``Backend.kernel_rules``: the evaluator runs
one in place of the array-module rule): the input's layout picks the kernel and its
arguments (``kernels/common/reductions.py``), the kernel is built once through the kernel
cache (``compiler.get_kernel``: in ``kernel_cache()``, on the timeline, on disk) and called.
A call no kernel takes (complex values, CumLogAddExp, no compiler, a failed build) runs the
primitive's array-module rule, recorded on the timeline as a ``kernel_fallback`` with why.

Each is a ``KernelRule`` (``kernels/kernel_call.py``): a call whose kernel needs no scratch
buffer and no copy first is planned once per layout and parameters, and the eval loop calls
the plan without Python code; the rest run ``_launch`` below.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Optional

import numpy as np

from .. import timeline
from ..codegen.c_ops import Unsupported
from ..common import reductions as plan
from ..fallback import run_rule
from ..kernel_call import KernelRule, kernel_call
from ..primitives import REGISTRY
from . import compiler

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


def _fallback(prim_name: str, name: str, variant: str, why: str, xp, a, kw, out=None):
    return run_rule(prim_name, why, xp, (a,), kw, out, name=name, variant=variant)


def _into(out, call, a) -> Optional[np.ndarray]:
    """``out`` (the evaluator's buffer) when the kernel can write its result there: its
    shape and dtype, row-contiguous, writeable, and, when it is the input's own memory (a
    donation), a row-contiguous input (each element is then read before it is written)."""
    if (out is None or out.shape != call.out_shape or out.dtype != call.out_dtype
            or not out.flags.c_contiguous or not out.flags.writeable):
        return None
    if not a.flags.c_contiguous and np.may_share_memory(out, a):
        return None
    return out


def _launch(call, a: np.ndarray, prim_name: str, xp, kw, out=None):
    """Run ``call``'s kernel on ``a`` (its strides as planned) into ``out`` or a new array."""
    spec = call.spec
    entry = _entry(spec)
    if isinstance(entry, compiler.BuildError):
        compiler.note_fallback(spec.name, spec.layout, "", str(entry), tape=spec)
        return _fallback(prim_name, spec.name, spec.layout, str(entry), xp, a, kw, out)
    out = _into(out, call, a)
    if out is None:
        out = np.empty(call.out_shape, dtype=call.out_dtype)
    bufs = {"x": a.ctypes.data, "out": out.ctypes.data}
    part = None
    if call.parts:
        part = np.empty(call.parts, dtype=call.part_dtype)
        bufs["part"] = part.ctypes.data
    ptrs = plan.arguments(spec.kernel_params(), bufs, call.ints,
                          {k: v.ctypes.data for k, v in call.arrays.items()})
    call_recorded(entry, spec, prim_name, ptrs, a.size < _SMALL)
    del part
    return out


def call_recorded(entry, spec, prim_name: str, ptrs: list, gil: bool) -> None:
    """Call the loaded kernel ``entry`` of ``spec`` on its argument pointers (holding the GIL
    where ``gil``: a small call, no release cost), recorded as a ``kernel_launch`` of
    ``prim_name`` while the timeline records."""
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    fn = entry.fast_fn(gil=gil)
    t0 = timeline.now() if timeline.enabled else 0
    fn(argv)
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=spec.name, device="cpu",
                     detail={"runtime": "cpu", "variant": spec.layout, "primitive": prim_name,
                             "tier": "kernel"})
    entry.hits += 1


def _rule(prim_name: str) -> Callable:
    def rule(xp, a, out=None, **kw):
        if a.size == 0:  # nothing to compute: the rule's empty result
            return REGISTRY[prim_name].rule(xp, a, out=out, **kw)
        call = plan.call_for(prim_name, a.dtype, a.shape, a.itemsize, a.strides, kw)
        if isinstance(call, str):
            return _fallback(prim_name, prim_name, "", call, xp, a, kw, out)
        if call.copy:
            a = np.ascontiguousarray(a)
        return _launch(call, a, prim_name, xp, kw, out)
    return rule


def _plan(prim_name: str) -> Callable:
    def planner(a, **kw):
        if a.size == 0:
            return None
        call = plan.call_for(prim_name, a.dtype, a.shape, a.itemsize, a.strides, kw)
        if isinstance(call, str) or call.copy or call.parts:
            return None
        spec = call.spec
        entry = _entry(spec)
        if isinstance(entry, compiler.BuildError):
            return None
        params = spec.kernel_params()
        argv = plan.arguments(params, {"x": 0, "out": 0}, call.ints,
                              {k: v.ctypes.data for k, v in call.arrays.items()})
        where = {p.name: i for i, p in enumerate(params)}
        detail = {"runtime": "cpu", "variant": spec.layout, "primitive": prim_name,
                  "tier": "kernel"}

        def note(t0: int, t1: int, arrays: tuple) -> None:
            timeline.add("kernel_launch", t0, t1, name=spec.name, device="cpu",
                         detail=dict(detail))

        return kernel_call(entry, argv, (where["x"], where["out"]), call, a.size < _SMALL,
                           note, call.out_shape, call.out_dtype)
    return planner


RULES: dict = {name: KernelRule(name, _plan(name), _rule(name)) for name in plan.PRIMITIVES}


def _more_rules() -> dict:
    """MLX's quantized products (``cpu/quantized.py``) and the random-number rules
    (``cpu/random_kernels.py``: RandomBits, ErfInv), run by the same kernel rules."""
    from .quantized import RULES as quantized
    from .random_kernels import RULES as random

    return {**quantized, **random}


RULES.update(_more_rules())
