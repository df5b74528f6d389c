"""MLX's reduction primitives as generated CUDA: the loop-IR kernels of
``codegen/reduce_kernels.py`` rendered by the CUDA dialect (a block per row with warp
shuffles and shared memory, a thread per kept element for columns, online softmax),
compiled by NVRTC through the fused kernels' cache (``compiled.get_kernel``: memory, disk,
``kernel_cache()``), launched on the current CUDA stream (the node's, inside its device
context). The layout picks the kernel as on the CPU (``kernels/common/reductions.py``);
``all`` is two launches (parts, then the row kernel over them), as MLX's ``all_reduce``.

A call no kernel takes, or one whose kernel NVRTC cannot build, runs the primitive's CuPy
rule, recorded on the timeline as a ``kernel_fallback`` with the reason.
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
from . import compiled

_arrays: dict = {}  # id of a Call -> its int64 arrays on the device (Calls live in common's cache)


def _entry(spec):
    """The loaded CUDA kernel of ``spec``; raises BuildError."""
    try:
        spec.kernel(gpu=True)
    except Unsupported as e:
        raise kernel_registry.BuildError(f"the CUDA dialect cannot express it: {e}") from None
    return compiled.get_kernel(spec.name, spec.layout, lambda: spec.source(compiled._dialect()),
                               key=spec.name, tape=spec)


def _fallback(prim_name: str, why: str, xp, a, kw, out=None):
    t0 = timeline.now() if timeline.enabled else 0
    out = REGISTRY[prim_name].rule(xp, a, out=out, **kw)
    if t0:
        timeline.add("kernel_fallback", t0, timeline.now(), name=prim_name, device="gpu",
                     detail={"reason": why, "runtime": "cupy", "primitive": prim_name})
    return out


def _overlaps(a, b) -> bool:
    """Whether two device arrays' bytes overlap (a donated input given as the output)."""
    return bool(cupy.may_share_memory(a, b))  # the arrays' memory bounds, as numpy's


def _launch(call, a, prim_name: str, xp, kw, given=None):
    """The launches of ``call`` into ``given`` (the evaluator's buffer) when it fits and is
    not the input's memory, else into a new array: the kernels declare their buffers
    ``__restrict__``, so NVRTC may read an element after storing to the same place (an
    exclusive scan stores ``out[c]`` before folding ``x[c]``: a donated input gave
    [-inf, -inf] for cummax([0, 0]))."""
    fits = (given is not None and given.shape == call.out_shape and given.dtype == call.out_dtype
            and given.flags.c_contiguous and not _overlaps(given, a))
    out = given if fits else cupy.empty(call.out_shape, dtype=call.out_dtype)
    bufs = {"x": a, "out": out}
    if plan.gpu_part_size(call):
        bufs["part"] = cupy.empty(plan.gpu_part_size(call), dtype=call.part_dtype)
    arrays = _arrays.get(id(call))
    if (arrays is None or arrays[0] is not call) and call.arrays:
        arrays = _arrays[id(call)] = (call, {k: cupy.asarray(v) for k, v in call.arrays.items()})
    steps = []
    for spec, ints, src, dst in plan.gpu_launches(call):
        try:
            steps.append((spec, ints, src, dst, _entry(spec)))
        except kernel_registry.BuildError as e:
            kernel_registry.note_fallback(spec.name, spec.layout, "", str(e), tape=spec)
            return _fallback(prim_name, str(e), xp, a, kw, given)
    for spec, ints, src, dst, entry in steps:
        k = spec.kernel(gpu=True)
        b = {**bufs, "x": bufs[src], "out": bufs[dst]}
        args = [np.int64(v) if isinstance(v, int) else v
                for v in plan.arguments(spec.kernel_params(), b, ints, arrays[1] if arrays else {})]
        launch_recorded(entry, k, ints, args, spec.name,
                        {"variant": spec.layout, "primitive": prim_name})
    return out


def launch_recorded(entry, kernel, ints: dict, args: list, name: str, detail: dict) -> None:
    """One launch of a loop-IR kernel's compiled ``entry`` (its grid and block from the
    kernel's sizes), recorded as a ``kernel_launch`` while the timeline records."""
    grid, block = kernel.launch(ints)
    t0 = timeline.now() if timeline.enabled else 0
    entry.fn((grid,), (block,), tuple(args))
    entry.hits += 1
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=name, device="gpu",
                     detail={"runtime": "cuda", "grid": grid, "block": block, **detail})


def _rule(prim_name: str) -> Callable:
    def rule(xp, a, out=None, **kw):
        if a.size == 0:
            return REGISTRY[prim_name].rule(xp, a, out=out, **kw)
        call = plan.call_for(prim_name, a.dtype, a.shape, a.itemsize, a.strides, kw)
        if isinstance(call, str):
            return _fallback(prim_name, call, xp, a, kw, out)
        if call.copy:
            a = cupy.ascontiguousarray(a)
        return _launch(call, a, prim_name, xp, kw, out)
    return rule


RULES: dict = {name: _rule(name) for name in plan.PRIMITIVES}


def rule_for(name: str) -> Optional[Callable]:
    """The CUDA kernel rule of primitive ``name`` (None: its CuPy rule runs)."""
    return RULES.get(name)
