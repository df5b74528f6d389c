"""Extended fusion's reduction tapes on an NVIDIA GPU: one CUDA kernel per tape from the
loop IR (``codegen/fused_reduce.py``: a block per row, or a thread per kept element for the
first axes), compiled by NVRTC through the fused kernels' cache, its arguments as the CPU
kernel's (``common/fused_reduction.py``). A tape the CUDA dialect cannot spell, or a failed
build, runs interpreted with CuPy (one kernel per op), recorded on the timeline with why.

A call whose inputs the kernel reads as they lie (no contiguous copy) leaves its launch plan
(``ReductionLaunch``, a ``compiled.PackedLaunch``) in the tape's ``launches`` under the key
``compiled.launch_for`` looks up, as a fused elementwise call's ``Launch``: the eval loop
launches later calls of those layouts from C, with no Python code (MLX's
``Compiled::eval_gpu`` launches from C++ likewise)."""

from __future__ import annotations

from typing import Optional, Sequence

import cupy
import numpy as np

from .. import timeline
from ..codegen.c_ops import Unsupported
from ..codegen.fused_reduce import fused_reduction_kernel, fused_reduction_source, unit_input
from ..codegen.reduction import interpret
from ..codegen.tape import Tape
from ..common.fused_reduction import kernel_arguments
from ..common.reductions import arguments
from .. import kernel_registry
from . import compiled
from .compiled import PackedLaunch
from .primitive_plans import fits
from .reductions import launch_recorded

_MASK = (1 << 64) - 1


class ReductionLaunch(PackedLaunch):
    """A reduction tape's kernel for one set of layouts: the integer arguments (rows, cols,
    each input's strides) packed once, the inputs' pointers at ``slots`` (their positions in
    the tape's inputs), the single output's at ``n_out_at``."""

    __slots__ = ()

    def __init__(self, k, entry, tape: Tape, ints: dict, out_shape: tuple, out_dtype, name: str,
                 variant: str):
        pos = {x.name: i for i, x in enumerate(tape.inputs)}
        words, offsets, slots, n_out_at = [], [], [], -1
        for p in k.params:
            offsets.append(len(words))
            if p.kind == "in":
                slots.append((pos[p.name], len(words)))
            elif p.kind == "out":
                n_out_at = len(words)
            elif p.kind == "int":
                words.append(int(ints[p.name]) & _MASK)
                continue
            else:
                raise ValueError(f"[ReductionLaunch] {name}: a {p.kind} parameter")
            words.append(0)
        word_at = len(words)  # two spare words the C launch clears (no completion word)
        words += [0, 0]
        grid, block = k.launch(ints)
        self._set_pack(entry, words, offsets, slots, (), n_out_at, word_at, grid, block,
                       [np.dtype(out_dtype)], "C", tuple(out_shape), name, variant)


def _key(tape: Tape, inputs: Sequence, full: tuple) -> tuple:
    """The call's key in ``tape.launches``, as ``compiled.launch_for`` builds it."""
    arrays = tape.launches.get("cuda")
    if arrays is None:
        arrays = tape.launches["cuda"] = tuple(i for i, x in enumerate(tape.inputs) if not x.is_constant)
    return ("cuda", full, *[(inputs[i].shape, inputs[i].strides) for i in arrays])


def _kernel(tape: Tape, unit: Optional[str] = None):
    """(IR kernel, loaded entry) of the tape, built once per tape and variant (``unit``:
    the input read by 16-byte vectors, ``fused_reduce.unit_input``; None: strided loads)."""
    got = tape.launches.get(("cuda_reduce", unit))
    if got is not None and got[0] == kernel_registry.generation():
        return got[1]
    mode = tape.reduction.mode
    name = f"{tape.lib_name}_reduce_{mode}" + ("_vec" if unit else "")
    d = compiled._dialect()
    try:
        try:
            k = fused_reduction_kernel(tape, name, d, unit)
        except Unsupported as e:
            raise kernel_registry.BuildError(f"the CUDA dialect cannot express it: {e}") from None
        entry = compiled.get_kernel(name, f"reduce_{mode}",
                                    lambda: fused_reduction_source(tape, name, d, unit),
                                    key=name + "|" + ",".join(tape.outputs), tape=tape)
        got = (k, entry)
    except kernel_registry.BuildError as e:
        got = e
    tape.launches[("cuda_reduce", unit)] = (kernel_registry.generation(), got)
    return got


def run_reduction(tape: Tape, inputs: Sequence, shape: Sequence[int], out=None) -> list:
    """The outputs of reduction tape ``tape`` on device ``inputs`` (constants by position)."""
    red = tape.reduction
    full = tuple(int(s) for s in shape)
    rows, cols = red.split(full)
    single = len(tape.outputs) == 1
    key = _key(tape, inputs, full) if single else None
    ln = tape.launches.get(key) if single else None
    if ln is not None and ln.gen == kernel_registry.generation():  # planned: no arguments to make
        given = [inputs[i] for i in tape.launches["cuda"]]
        o = out if fits(out, ln.shape, ln.dtypes[0], given) else cupy.empty(ln.shape, dtype=ln.dtypes[0])
        ln.call(inputs, (o,))
        return [o]
    got = None
    if rows * cols:
        arrays, ints = kernel_arguments(tape, list(inputs), full, cupy)
        unit = unit_input(tape)
        got = _kernel(tape, unit if unit is not None and ints.get(f"{unit}_sc") == 1 else None)
    if not isinstance(got, tuple):
        t0 = timeline.now() if timeline.enabled and got is not None else 0
        outs = interpret(tape, inputs, full, cupy)
        if t0:
            timeline.add("kernel_fallback", t0, timeline.now(), name=tape.lib_name, device="gpu",
                         detail={"reason": str(got), "runtime": "cupy",
                                 "variant": f"reduce_{red.mode}"})
        return outs
    k, entry = got
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
    given = [x for x in tape.inputs if not x.is_constant]
    if single and all(type(a) is cupy.ndarray and type(b) is cupy.ndarray and a.data.ptr == b.data.ptr
                      for a, b in zip((inputs[i] for i in tape.launches["cuda"]), arrays)) \
            and len(given) == len(arrays):  # every input read as it lies: plan the layouts
        tape.launches[key] = ReductionLaunch(k, entry, tape, ints, outs[0].shape, outs[0].dtype,
                                             entry.name, f"reduce_{red.mode}")
    return outs
