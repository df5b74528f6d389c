"""Extended fusion's reduction tapes on an NVIDIA GPU: one CUDA kernel per tape from the
loop IR (``codegen/fused_reduce.py``: a block per row, or a thread per kept element for the
first axes), compiled by NVRTC through the fused kernels' cache, its arguments as the CPU
kernel's (``common/fused_reduction.py``). A tape the CUDA dialect cannot spell, or a failed
build, runs interpreted with CuPy (one kernel per op), recorded on the timeline with why."""

from __future__ import annotations

from typing import Optional, Sequence

import cupy
import numpy as np

from .. import timeline
from ..codegen.c_ops import Unsupported
from ..codegen.fused_reduce import fused_reduction_kernel, fused_reduction_source
from ..codegen.reduction import interpret
from ..codegen.tape import Tape
from ..common.fused_reduction import kernel_arguments
from ..common.reductions import arguments
from .. import kernel_registry
from . import compiled
from .primitive_plans import fits
from .reductions import launch_recorded


def _kernel(tape: Tape):
    """(IR kernel, loaded entry) of the tape, built once per tape."""
    got = tape.launches.get("cuda_reduce")
    if got is not None and got[0] == kernel_registry.generation():
        return got[1]
    mode = tape.reduction.mode
    name = f"{tape.lib_name}_reduce_{mode}"
    d = compiled._dialect()
    try:
        try:
            k = fused_reduction_kernel(tape, name, d)
        except Unsupported as e:
            raise kernel_registry.BuildError(f"the CUDA dialect cannot express it: {e}") from None
        entry = compiled.get_kernel(name, f"reduce_{mode}", lambda: fused_reduction_source(tape, name, d),
                                    key=name + "|" + ",".join(tape.outputs), tape=tape)
        got = (k, entry)
    except kernel_registry.BuildError as e:
        got = e
    tape.launches["cuda_reduce"] = (kernel_registry.generation(), got)
    return got


def run_reduction(tape: Tape, inputs: Sequence, shape: Sequence[int], out=None) -> list:
    """The outputs of reduction tape ``tape`` on device ``inputs`` (constants by position)."""
    red = tape.reduction
    full = tuple(int(s) for s in shape)
    rows, cols = red.split(full)
    got = _kernel(tape) if rows * cols else None
    if not isinstance(got, tuple):
        t0 = timeline.now() if timeline.enabled and got is not None else 0
        outs = interpret(tape, inputs, full, cupy)
        if t0:
            timeline.add("kernel_fallback", t0, timeline.now(), name=tape.lib_name, device="gpu",
                         detail={"reason": str(got), "runtime": "cupy",
                                 "variant": f"reduce_{red.mode}"})
        return outs
    k, entry = got
    arrays, ints = kernel_arguments(tape, list(inputs), full, cupy)
    bufs = {x.name: a for x, a in zip(tape.non_constant_inputs, arrays)}
    outs = []
    for j, n in enumerate(tape.outputs):
        oshape, dt = red.shape_of(n, full), np.dtype(tape.dtype_of(n))
        if len(tape.outputs) == 1 and fits(out, oshape, dt, arrays):  # __restrict__ buffers
            o = out
        else:
            o = cupy.empty(oshape, dtype=dt)
        outs.append(o)
        bufs[f"out{j}"] = o
    args = [np.int64(v) if isinstance(v, int) else v for v in arguments(k.params, bufs, ints, {})]
    launch_recorded(entry, *k.launch(ints), tuple(args), entry.name,
                    {"variant": f"reduce_{red.mode}", "tier": "kernel"})
    return outs
