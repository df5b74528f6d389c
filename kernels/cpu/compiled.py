"""Run a fused tape on the CPU: pick the variant, get the kernel, allocate, call.

Mirrors MLX's ``Compiled::eval_cpu``: contiguity check and dim collapse choose the
``_contiguous`` or ``_strided_<ndim>`` kernel (``_large`` past UINT32_MAX elements); outputs
take a donated input buffer where MLX's rules allow it, else fresh memory; the arguments go
to ``void <name>(void** args)``. Without a compiler, or when a build fails or the C dialect
cannot spell an op, the tape runs interpreted with numpy and the timeline says why.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import numpy as np

from .. import timeline
from ..codegen.interpret import interpret
from ..codegen.layout import (
    broadcast_strides, check_contiguity, collapse_contiguous_dims, elem_strides,
    is_col_contiguous, is_row_contiguous, row_strides, use_large_index,
)
from ..codegen.render import CDialect, Unsupported
from ..codegen.tape import Tape, variant_name
from . import compiler


def plan(tape: Tape, inputs: Sequence[np.ndarray], shape: Sequence[int]) -> tuple:
    """``(contiguous, collapsed shape, strides per non-scalar input, large)`` for a call."""
    shape = tuple(int(s) for s in shape)
    nc = [(x, a) for x, a in zip(tape.inputs, inputs) if not x.is_constant]
    arrays = [a for _, a in nc]
    contiguous = check_contiguity(arrays, shape)
    size = int(np.prod(shape, dtype=np.int64))
    if contiguous:
        cshape, strides = list(shape), []
    else:
        out_st = row_strides(shape)
        vecs = [list(out_st)] + [broadcast_strides(shape, out_st, a.shape, elem_strides(a))
                                 for x, a in nc if not x.scalar]
        cshape, cst = collapse_contiguous_dims(shape, vecs)
        strides = cst[1:]
    large = use_large_index(arrays, [size], contiguous)
    return contiguous, cshape, strides, large


def allocate_outputs(tape: Tape, inputs: Sequence[np.ndarray], shape: Sequence[int],
                     contiguous: bool, donatable: Optional[Sequence[bool]] = None) -> list:
    """Output arrays, reusing donated input buffers by MLX's Compiled rules.

    An input may give its buffer to the next output when the caller marks it donatable
    (nobody else holds it), it is not a constant and not a scalar, and the itemsizes match;
    on the strided path it must also be row-contiguous with the output's size. Outputs
    without a donor follow the layout of the first input of the output's size (so
    column-major inputs give column-major outputs) on the contiguous path, else row-major.
    """
    shape = tuple(int(s) for s in shape)
    size = int(np.prod(shape, dtype=np.int64))
    dts = [np.dtype(tape.dtype_of(n)) for n in tape.outputs]
    outs: list = []
    rep = None
    for i, (x, a) in enumerate(zip(tape.inputs, inputs)):
        if x.is_constant:
            continue
        if rep is None and a.size == size:
            rep = a
        if len(outs) >= len(dts) or not donatable or not donatable[i] or a.ndim == 0:
            continue
        if a.dtype.itemsize != dts[len(outs)].itemsize or not a.flags.writeable:
            continue
        if contiguous or (is_row_contiguous(a) and a.size == size):
            outs.append(a.view(dts[len(outs)]).reshape(shape) if not contiguous else a.view(dts[len(outs)]))
    order = "F" if (contiguous and rep is not None and rep.ndim > 1 and is_col_contiguous(rep)
                    and not is_row_contiguous(rep)) else "C"
    for dt in dts[len(outs):]:
        outs.append(np.empty(shape, dtype=dt, order=order))
    return outs


def _source(tape: Tape, name: str, contiguous: bool, ndim: int, large: bool,
            vector_math: tuple = ()) -> str:
    return CDialect(vector_math=vector_math).render(tape, name, contiguous, ndim, large)


_unsupported: dict = {}


def _fits(out: np.ndarray, tape: Tape, inputs: Sequence[np.ndarray], shape: tuple,
          contiguous: bool) -> bool:
    """Can the kernel write its single output straight into ``out``?"""
    if len(tape.outputs) != 1 or tuple(out.shape) != shape or not out.flags.writeable:
        return False
    if out.dtype != np.dtype(tape.dtype_of(tape.outputs[0])):
        return False
    if not contiguous or out.ndim <= 1:
        return bool(out.flags.c_contiguous)
    size = int(np.prod(shape, dtype=np.int64))
    rep = next((a for x, a in zip(tape.inputs, inputs) if not x.is_constant and a.size == size), None)
    if rep is not None and not is_row_contiguous(rep):
        return bool(out.flags.f_contiguous)
    return bool(out.flags.c_contiguous)


def run_compiled(tape: Tape, inputs: Sequence[np.ndarray], shape: Sequence[int],
                 donatable: Optional[Sequence[bool]] = None,
                 out: Optional[np.ndarray] = None) -> list:
    """The outputs of ``tape`` on ``inputs`` (numpy arrays, constants included by position).

    ``out``: memory the caller offers for a single output (a donated input's buffer or an
    allocator buffer); used when its layout is the one the kernel writes.
    """
    shape = tuple(int(s) for s in shape)
    if any(s == 0 for s in shape):
        return [np.empty(shape, dtype=tape.dtype_of(n)) for n in tape.outputs]
    contiguous, cshape, strides, large = plan(tape, inputs, shape)
    ndim = len(cshape)
    name = variant_name(tape.lib_name, contiguous, ndim, large)
    variant = name[len(tape.lib_name) + 1:]
    try:
        if tape.lib_name not in _unsupported:
            try:
                CDialect().render(tape, name, contiguous, ndim, large)
                _unsupported[tape.lib_name] = None
            except Unsupported as e:
                _unsupported[tape.lib_name] = f"the C dialect cannot express it: {e}"
        reason = _unsupported[tape.lib_name]
        if reason:
            raise compiler.BuildError(reason)
        key = name if tape.outputs == (tape.ops[-1].name,) else name + "|" + ",".join(tape.outputs)
        entry = compiler.get_kernel(
            name, variant, lambda tc: _source(tape, name, contiguous, ndim, large, tc.vector_math),
            key=key)
    except compiler.BuildError as e:
        t0 = timeline.now() if timeline.enabled else 0
        compiler.note_fallback(name, variant, "", str(e))
        outs = interpret(tape, inputs, shape)
        if t0:
            timeline.add("kernel_fallback", t0, timeline.now(), name=name, device="cpu",
                         detail={"reason": str(e), "runtime": "numpy", "variant": variant})
        return outs
    if out is not None and _fits(out, tape, inputs, shape, contiguous):
        outs = [out]
    else:
        outs = allocate_outputs(tape, inputs, shape, contiguous, donatable)
    ptrs: list = []
    keep: list = []
    k = 0
    for x, a in zip(tape.inputs, inputs):
        if x.is_constant:
            continue
        ptrs.append(a.ctypes.data)
        if not contiguous and not x.scalar:
            st = np.asarray(strides[k], dtype=np.int64)
            k += 1
            keep.append(st)
            ptrs.append(st.ctypes.data)
    for o in outs:
        ptrs.append(o.ctypes.data)
    if contiguous:
        ptrs.append(int(np.prod(shape, dtype=np.int64)))
    else:
        sh = np.asarray(cshape, dtype=np.int32)
        keep.append(sh)
        ptrs.append(sh.ctypes.data)
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    t0 = timeline.now() if timeline.enabled else 0
    entry.fn(argv)
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=name, device="cpu",
                     detail={"runtime": "cpu", "variant": variant})
    return outs
