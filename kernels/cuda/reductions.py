"""MLX's reduction primitives as generated CUDA: the loop-IR kernels of
``codegen/reduce_kernels.py`` rendered by the CUDA dialect (a block per row with warp
shuffles and shared memory, a thread per kept element for columns, online softmax),
compiled by NVRTC through the fused kernels' cache (``compiled.get_kernel``: memory, disk,
``kernel_cache()``), launched on the current CUDA stream (the node's, inside its device
context). The layout picks the kernel as on the CPU (``kernels/common/reductions.py``);
``all`` is two launches (parts, then the row kernel over them), as MLX's ``all_reduce``,
and so is a column reduction whose reduced run is split over the grid (the splits, then
their merge): both planned as one ``PlanSequence`` the eval loop issues from C.

bfloat16 inputs come as ``BF16Array``s (``takes_bfloat16``: cuda/backend.py does not widen
them): the kernels read the 16-bit storage and accumulate in float32, the result rounded to
nearest even once (MLX's CUDA reduce: mlx/backend/cuda/reduce/reduce_ops.cuh,
``ReduceResult<Sum, bfloat16>`` is float), so a bfloat16 reduction is one launch, no casts.

A call no kernel takes, or one whose kernel NVRTC cannot build, runs the primitive's CuPy
rule (bfloat16 through float32), recorded on the timeline as a ``kernel_fallback`` with the
reason.
"""

from __future__ import annotations

from typing import Callable, Optional

import cupy
import numpy as np

from .. import timeline
from ..codegen.c_ops import Unsupported
from ..common import reductions as plan
from .. import kernel_registry
from ..primitives import REGISTRY
from ..kernel_call import KernelRule
from . import compiled
from . import bfloat16 as bf16
from .primitive_plans import fits as _fits_storage, plan_of, sequence_of

_arrays: dict = {}  # id of a Call -> its int64 arrays on the device (Calls live in common's cache)


def fits(out, shape, dtype, ins) -> bool:
    """``primitive_plans.fits`` over the arrays' storage (bfloat16's uint16)."""
    return out is not None and out.dtype == dtype and _fits_storage(
        bf16.storage(out), shape, bf16.storage(out).dtype, [bf16.storage(a) for a in ins])


def _empty(shape: tuple, dtype) -> object:
    """A new device array of ``dtype``, bfloat16 as a ``BF16Array``."""
    if dtype == bf16.BF16:
        return bf16.BF16Array(cupy.empty(shape, bf16.U16))
    return cupy.empty(shape, dtype=dtype)


def _fallback(prim_name: str, why: str, xp, a, kw, out=None):
    t0 = timeline.now() if timeline.enabled else 0
    if type(a) is bf16.BF16Array:  # the definition's rule on float32, rounded back once
        res = REGISTRY[prim_name].rule(xp, bf16.value(a), **kw)
        out = bf16.cast(res, bf16.BF16) if res.dtype.kind == "f" else res
    else:
        out = REGISTRY[prim_name].rule(xp, a, out=out, **kw)
    if t0:
        timeline.add("kernel_fallback", t0, timeline.now(), name=prim_name, device="gpu",
                     detail={"reason": why, "runtime": "cupy", "primitive": prim_name})
    return out


def launch_recorded(entry, grid: int, block: int, args: tuple, name: str, detail: dict) -> None:
    """One launch of a loop-IR kernel's compiled ``entry`` on the current stream, recorded
    as a ``kernel_launch`` while the timeline records."""
    t0 = timeline.now() if timeline.enabled else 0
    entry.fn((grid,), (block,), args)
    entry.hits += 1
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=name, device="gpu",
                     detail={"runtime": "cuda", "grid": grid, "block": block, **detail})


class Step:
    """One launch of a loop-IR kernel with everything but its buffers fixed: the kernel's
    grid and block, its integer arguments as int64 values in the signature's order, and
    where each named buffer (``in`` / ``out`` parameters) or int64 array (``ints``) goes.
    Made once per (kernel, integer arguments): a call fills the buffers and launches."""

    __slots__ = ("spec", "grid", "block", "args", "bufs", "arrays", "detail", "source")

    def __init__(self, spec, kernel, ints: dict, detail: dict):
        self.spec, self.detail = spec, detail
        self.grid, self.block = kernel.launch(ints)
        self.args, self.bufs, self.arrays = [], [], []
        for i, p in enumerate(kernel.params):
            if p.kind == "int":
                self.args.append(np.int64(int(ints[p.name])))
            else:
                (self.bufs if p.kind in ("in", "out") else self.arrays).append((i, p.name))
                self.args.append(None)
        self.source = lambda: spec.source(compiled._dialect())

    def entry(self):
        """The loaded kernel, through the kernel cache on every call (a cleared cache
        rebuilds it; the timeline records the hit); raises BuildError without one."""
        spec = self.spec
        return compiled.get_kernel(spec.name, spec.layout, self.source, key=spec.name, tape=spec)

    def run(self, entry, buffers: dict, arrays: dict) -> None:
        """Launch ``entry`` (``self.entry()``) over ``buffers`` (name -> device array) and
        ``arrays`` on the current stream, recorded as a ``kernel_launch``."""
        spec = self.spec
        args = list(self.args)
        for i, name in self.bufs:
            args[i] = buffers[name]
        for i, name in self.arrays:
            args[i] = arrays[name]
        launch_recorded(entry, self.grid, self.block, tuple(args), spec.name, self.detail)


_steps: dict = {}  # (spec, integer arguments, primitive) -> its Step, or (spec, why none)


def step_for(spec, ints: dict, prim_name: str):
    """The ``Step`` of ``spec``'s kernel with these integer arguments, made once (the
    kernel's IR built once, not per call), or (spec, why the CUDA dialect cannot express
    it)."""
    key = (spec, tuple(ints.items()), prim_name)
    got = _steps.get(key)
    if got is None:
        if len(_steps) > 4096:
            _steps.clear()
        try:
            got = Step(spec, spec.kernel(gpu=True), ints,
                       {"variant": spec.layout, "primitive": prim_name})
        except Unsupported as e:
            got = (spec, f"the CUDA dialect cannot express it: {e}")
        _steps[key] = got
    return got


def run_steps(steps, buffers: dict, arrays: dict, prim_name: str) -> Optional[str]:
    """Launch ``steps`` ((Step, source buffer, destination buffer) each, in order) over
    ``buffers``; the reason when a kernel has no build (nothing launched then: every
    kernel is loaded before the first launch)."""
    entries = []
    for step, _, _ in steps:
        try:
            if isinstance(step, tuple):  # (spec, why the dialect cannot express it)
                raise kernel_registry.BuildError(step[1])
            entries.append(step.entry())
        except kernel_registry.BuildError as e:
            spec = step[0] if isinstance(step, tuple) else step.spec
            kernel_registry.note_fallback(spec.name, spec.layout, "", str(e), tape=spec)
            return str(e)
    for (step, src, dst), entry in zip(steps, entries):
        step.run(entry, {**buffers, "x": buffers[src], "out": buffers[dst]} if src else buffers,
                 arrays)
    return None


_call_steps: dict = {}  # id of a Call -> (the Call, its Steps): Calls live in common's cache


def _launch(call, a, prim_name: str, xp, kw, given=None):
    """The launches of ``call`` into ``given`` (the evaluator's buffer) when it fits and is
    not the input's memory, else into a new array: the kernels declare their buffers
    ``__restrict__``, so NVRTC may read an element after storing to the same place (an
    exclusive scan stores ``out[c]`` before folding ``x[c]``: a donated input gave
    [-inf, -inf] for cummax([0, 0]))."""
    takes = fits(given, call.out_shape, call.out_dtype, (a,))
    out = given if takes else _empty(call.out_shape, call.out_dtype)
    bufs = {"x": bf16.storage(a), "out": bf16.storage(out)}
    if plan.gpu_part_size(call):
        bufs["part"] = cupy.empty(plan.gpu_part_size(call), dtype=call.part_dtype)
    arrays = _arrays.get(id(call))
    if (arrays is None or arrays[0] is not call) and call.arrays:
        arrays = _arrays[id(call)] = (call, {k: cupy.asarray(v) for k, v in call.arrays.items()})
    steps = _call_steps.get(id(call))
    if steps is None or steps[0] is not call:
        if len(_call_steps) > 4096:
            _call_steps.clear()
        steps = _call_steps[id(call)] = (call, [(step_for(spec, ints, prim_name), src, dst)
                                                for spec, ints, src, dst in plan.gpu_launches(call)])
    why = run_steps(steps[1], bufs, arrays[1] if arrays else {}, prim_name)
    return _fallback(prim_name, why, xp, a, kw, given) if why else out


def _rule(prim_name: str) -> Callable:
    def rule(xp, a, out=None, **kw):
        if a.size == 0:
            if type(a) is bf16.BF16Array:
                return _fallback(prim_name, "an empty input", xp, a, kw, out)
            return REGISTRY[prim_name].rule(xp, a, out=out, **kw)
        call = plan.call_for(prim_name, a.dtype, a.shape, a.itemsize, a.strides, kw)
        if isinstance(call, str):
            return _fallback(prim_name, call, xp, a, kw, out)
        if call.copy:
            a = (bf16.BF16Array(cupy.ascontiguousarray(a.raw)) if type(a) is bf16.BF16Array
                 else cupy.ascontiguousarray(a))
        return _launch(call, a, prim_name, xp, kw, out)

    rule.takes_bfloat16 = True  # cuda/backend.py: bfloat16 inputs come as BF16Arrays
    return rule


def _plan(prim_name: str) -> Callable:
    """A call's ``KernelPlan`` (``primitive_plans.py``): one launch over the input as it
    lies, or the ``PlanSequence`` of ``all``'s two launches and of split columns', or None
    (the rule runs: a copy first, no kernel)."""
    def plan_call(a, **kw):
        if a.size == 0:
            return None
        call = plan.call_for(prim_name, a.dtype, a.shape, a.itemsize, a.strides, kw)
        if isinstance(call, str) or call.copy:
            return None
        launches = plan.gpu_launches(call)
        if len(launches) != 1:
            return sequence_of(launches, prim_name, call.out_shape, call.out_dtype,
                               plan.gpu_part_size(call), call.part_dtype)
        spec, ints, _, _ = launches[0]
        consts = {k: cupy.asarray(v) for k, v in call.arrays.items()} if call.arrays else {}
        return plan_of(spec, ints, prim_name, {"x": 0}, consts, call.out_shape, call.out_dtype)
    return plan_call


RULES: dict = {name: KernelRule(name, _plan(name), _rule(name), fits, _empty)
               for name in plan.PRIMITIVES}
