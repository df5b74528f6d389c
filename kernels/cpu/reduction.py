"""Run a fused reduction tape (``codegen.reduction``) on the CPU: each input as a
``rows x cols`` view (its element strides collapsed over the kept and the reduced axes, or a
contiguous copy when they do not collapse), the outputs allocated, the kernel called.
Without a compiler, or when the C dialect cannot spell the tape, it runs interpreted."""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import numpy as np

from .. import timeline
from ..roofline import layouts
from ..codegen import reduction as codegen
from ..codegen.c_ops import Unsupported
from ..codegen.tape import Tape
from ..common.fused_reduction import view_strides
from . import compiler


def _kernel(tape: Tape):
    """(entry or the BuildError, name, variant) of the tape's kernel."""
    red = tape.reduction
    variant = f"reduce_{red.mode}"
    name = f"{tape.lib_name}_{variant}"
    try:
        try:
            codegen.render(tape, name)
        except Unsupported as e:
            raise compiler.BuildError(f"the C dialect cannot express it: {e}") from None
        key = name + "|" + ",".join(tape.outputs)
        entry = compiler.get_kernel(name, variant, lambda tc: codegen.render(
            tape, name, _dialect(tc)), key=key, tape=tape)
    except compiler.BuildError as e:
        return e, name, variant
    return entry, name, variant


def _dialect(tc):
    from ..codegen.render import CDialect

    return CDialect(vector_math=tc.vector_math)


def run_reduction(tape: Tape, inputs: Sequence[np.ndarray], shape: Sequence[int],
                  out: Optional[np.ndarray] = None) -> list:
    """The outputs of reduction tape ``tape`` on ``inputs`` (constants included by position);
    ``shape``: the kernel's full shape. ``out``: memory offered for a single output, used when
    it is C-contiguous with the output's shape and dtype."""
    red = tape.reduction
    full = tuple(int(s) for s in shape)
    rows, cols = red.split(full)
    if rows * cols == 0:
        return codegen.interpret(tape, inputs, full)
    got = tape.launches.get("reduce")
    if got is None or got[0] != compiler.generation():
        got = tape.launches["reduce"] = (compiler.generation(), *_kernel(tape))
    _, entry, name, variant = got
    if isinstance(entry, compiler.BuildError):
        t0 = timeline.now() if timeline.enabled else 0
        compiler.note_fallback(name, variant, "", str(entry), tape=tape)
        outs = codegen.interpret(tape, inputs, full)
        if t0:
            timeline.add("kernel_fallback", t0, timeline.now(), name=name, device="cpu",
                         detail={"reason": str(entry), "runtime": "numpy", "variant": variant})
        return outs
    k = red.naxes
    ptrs, meta = [], [rows, cols, 1 if red.mode == "first" else cols,
                      rows if red.mode == "first" else 1]
    keep = []
    for x, a in zip(tape.inputs, inputs):
        if x.is_constant:
            continue
        a = np.asarray(a)
        if x.scalar or a.ndim == 0:
            b = np.ascontiguousarray(a).reshape(())
            keep.append(b)
            ptrs.append(b.ctypes.data)
            if not x.scalar:
                meta += [0, 0]
            continue
        b, sr, sc = view_strides(a, red.shape_of(x.name, full), red.mode, k)
        keep.append(b)
        ptrs.append(b.ctypes.data)
        meta += [sr, sc]
    outs = []
    for n in tape.outputs:
        oshape, dt = red.shape_of(n, full), np.dtype(tape.dtype_of(n))
        if (out is not None and len(tape.outputs) == 1 and tuple(out.shape) == oshape
                and out.dtype == dt and out.flags.c_contiguous and out.flags.writeable):
            outs.append(out)
        else:
            outs.append(np.empty(oshape, dtype=dt))
    m = np.asarray(meta, dtype=np.int64)
    argv = (ctypes.c_void_p * (len(ptrs) + len(outs) + 1))(
        *ptrs, *[o.ctypes.data for o in outs], m.ctypes.data)
    fn = entry.fast_fn(gil=rows * cols < codegen.SCHEDULE.omp_min_size)
    t0 = timeline.now() if timeline.enabled else 0
    fn(argv)
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=name, device="cpu",
                     detail={"runtime": "cpu", "variant": variant, "tape": tape, "shape": full,
                             "io": (layouts(np.asarray(a) for a in inputs), layouts(outs))})
    entry.hits += 1
    del keep
    return outs
