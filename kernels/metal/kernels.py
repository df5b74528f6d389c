"""tapescope's Metal kernels and their launches: fused tapes and the eager elementwise ops.

A fused tape's MSL is the shared renderer's (``codegen/metal.py`` over ``codegen/gpu.py``);
this module says how it is called, as MLX's ``Compiled::eval_gpu`` does
(mlx/backend/metal/compiled.cpp): the variant from the inputs' layouts (``_contiguous``,
``_strided_<n>``, ``_strided_dynamic`` past 7 collapsed dims, ``_large`` past UINT32_MAX
elements), the buffers in the kernel's argument order (data, per strided input its int64
element strides; outputs; ``size`` or the int32 ``shape``, then ``ndim`` for the dynamic
kernel) and the grid: ``ceil(size / work_per_thread)`` threads, 1-D, or 2-D for ``_large``
(``index = x + grid.x * y``), in threadgroups of the schedule's block size.

The eager elementwise primitives (unary, binary, ternary, copy) get their kernels the same
way: a one-op tape (``elementwise_tape``), named after MLX's kernel stems (``Addfloat32``,
``copyfloat32float16``): one renderer for both, as MLX's Metal backend shares its
elementwise op structs between ``unary.metal`` / ``binary.metal`` and compiled kernels.

Plain numpy in, plain numpy out: the Metal runtime (``runtime.py``) binds the same buffers as
MTLBuffers; the shim (``shim.py``) runs them on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import ml_dtypes
import numpy as np

from ..codegen.c_ops import Unsupported
from ..codegen.gpu import variant_suffix
from ..codegen.layout import is_col_contiguous, is_row_contiguous
from ..codegen.render import renderer
from ..codegen.tape import Tape, TapeInput, TapeOp
from ..codegen.layout import plan
from ..primitives import ASTYPE, REGISTRY, UNARY

# MLX's Metal type names in kernel names (mlx/backend/metal/utils.h type_to_name)
TYPE_NAMES = {np.dtype(np.bool_): "bool_", np.dtype(np.uint8): "uint8",
              np.dtype(np.uint16): "uint16", np.dtype(np.uint32): "uint32",
              np.dtype(np.uint64): "uint64", np.dtype(np.int8): "int8",
              np.dtype(np.int16): "int16", np.dtype(np.int32): "int32",
              np.dtype(np.int64): "int64", np.dtype(np.float16): "float16",
              np.dtype(ml_dtypes.bfloat16): "bfloat16", np.dtype(np.float32): "float32"}
METAL_DTYPES = tuple(TYPE_NAMES)  # Metal has no float64 (and complex64 is not elementwise here)
LARGE_GRID_X = 1 << 16  # threads along x of a ``_large`` 2-D grid


def check_dtype(dt) -> None:
    """MLX refuses float64 on the GPU when a GPU primitive is made (mlx/array.cpp)."""
    if np.dtype(dt) == np.float64:
        raise ValueError("float64 is not supported on the GPU")


@dataclass
class Call:
    """One launch of a tape's kernel: its name, variant, buffers by index, grid and group."""

    name: str
    variant: str
    buffers: dict
    outputs: list
    grid: tuple
    threadgroup: tuple


def fused_call(tape: Tape, inputs: Sequence[np.ndarray], shape: Sequence[int],
               force_strided: bool = False, force_large: Optional[bool] = None,
               grid_x: int = LARGE_GRID_X, empty=np.empty) -> Call:
    """The launch of ``tape`` on ``inputs`` (constants included by position): the variant
    MLX's rules choose (``force_strided`` / ``force_large`` pick another one: every variant
    computes the same values, which is what the shim tests check). ``empty(shape, dtype,
    order)`` makes each output (a runtime passes its own memory)."""
    d = renderer("metal")
    sched = d.schedule
    shape = tuple(int(s) for s in shape)
    arrays = [np.asarray(a) for a in inputs]
    arrays = [np.ascontiguousarray(a) if any(s < 0 for s in a.strides) else a for a in arrays]
    contiguous, cshape, strides, large = plan(tape, arrays, shape)
    if force_strided and contiguous:
        contiguous = False
        cshape, strides = _strided_plan(tape, arrays, shape)
    if force_large is not None:
        large = force_large
    ndim = len(cshape)
    size = int(np.prod(shape, dtype=np.int64))
    order = "C"
    if contiguous:
        rep = next((a for x, a in zip(tape.inputs, arrays) if not x.is_constant and a.size == size), None)
        if rep is not None and rep.ndim > 1 and is_col_contiguous(rep) and not is_row_contiguous(rep):
            order = "F"
    outs = [empty(shape, np.dtype(tape.dtype_of(n)), order) for n in tape.outputs]
    buffers, k, si = {}, 0, 0
    for x, a in zip(tape.inputs, arrays):
        if x.is_constant:
            continue
        if contiguous:
            buffers[k] = _flat(a, order)
            k += 1
        else:
            buffers[k] = _base_view(a)
            k += 1
            if not x.scalar:
                buffers[k] = np.asarray(strides[si], dtype=np.int64)
                si += 1
                k += 1
    for o in outs:
        buffers[k] = o.ravel(order="K")  # a view: the kernel writes o
        k += 1
    idx = np.int64 if large else np.uint32
    if contiguous:
        buffers[k] = np.asarray(size, dtype=idx)
    else:
        buffers[k] = np.asarray(cshape, dtype=np.int32)
        if ndim > sched.max_static_ndim:
            buffers[k + 1] = np.asarray(ndim, dtype=np.int32)
    wpt = sched.work_per_thread(tape, contiguous, ndim, large)
    threads = -(-size // wpt)
    if large:
        gx = max(1, min(threads, grid_x))
        grid = (gx, -(-threads // gx), 1)
    else:
        grid = (threads, 1, 1)
    name = f"{tape.lib_name}_{variant_suffix(contiguous, ndim, large, sched.max_static_ndim)}"
    return Call(name, name[len(tape.lib_name) + 1:], buffers, outs, grid,
                (min(sched.block_size, max(1, grid[0])), 1, 1))


def _flat(a: np.ndarray, order: str) -> np.ndarray:
    """A contiguous input's elements in memory order (a 0-d scalar as one element)."""
    if a.ndim == 0:
        return np.ascontiguousarray(a.reshape(1))
    return np.ascontiguousarray(a.ravel(order="K"))


def _base_view(a: np.ndarray) -> np.ndarray:
    """The memory a strided kernel indexes from the array's first element with its element
    strides (none negative): the smallest flat run that holds every element it reaches."""
    if a.ndim == 0 or a.size == 0:
        return np.ascontiguousarray(a.reshape(-1)[:1] if a.size else np.zeros(1, a.dtype))
    isz = a.dtype.itemsize
    hi = sum((s // isz) * (n - 1) for s, n in zip(a.strides, a.shape))
    return np.ascontiguousarray(np.lib.stride_tricks.as_strided(
        a, shape=(hi + 1,), strides=(isz,), writeable=False))


def _strided_plan(tape: Tape, arrays: list, shape: tuple) -> tuple:
    """(shape, per non-scalar input its element strides) without collapsing dims."""
    from ..codegen.layout import broadcast_strides, elem_strides, row_strides

    out_st = row_strides(shape)
    strides = [list(broadcast_strides(shape, out_st, a.shape, elem_strides(a)))
               for x, a in zip(tape.inputs, arrays) if not x.is_constant and not x.scalar]
    return list(shape), strides


# -- the eager elementwise kernels ---------------------------------------------------------
def elementwise_tape(prim: str, in_dtypes: Sequence, out_dtype, scalars: Sequence[bool] = (),
                     params: tuple = ()) -> Tape:
    """A one-op tape for eager primitive ``prim`` (unary, binary, ternary; ``AsType`` is the
    copy kernel), named after MLX's Metal kernel stem: the op and its type names
    (``Expfloat32float32``, ``Addfloat32``, ``Selectfloat16``, ``copyint32float32``)."""
    in_dtypes = [np.dtype(d) for d in in_dtypes]
    out_dtype = np.dtype(out_dtype)
    for dt in (*in_dtypes, out_dtype):
        check_dtype(dt)
    defn = REGISTRY[prim]
    cast = defn.family == ASTYPE
    if not (defn.elementwise or cast):
        raise ValueError(f"{prim} is not an elementwise primitive")
    scalars = list(scalars) or [False] * len(in_dtypes)
    names = [chr(ord("A") + i) for i in range(len(in_dtypes))]
    inputs = tuple(TapeInput(n, dt, scalar=s) for n, dt, s in zip(names, in_dtypes, scalars))
    out = chr(ord("A") + len(in_dtypes))
    ops = (TapeOp(out, prim, out_dtype, tuple(names), tuple(params)),)
    tn = [TYPE_NAMES[d] for d in in_dtypes]
    if cast:
        stem = f"copy{tn[0]}{TYPE_NAMES[out_dtype]}"
    elif defn.family == UNARY:
        stem = f"{prim}{tn[0]}{TYPE_NAMES[out_dtype]}"
    else:  # binary and ternary kernels are named by the (last) input type, as MLX's
        stem = f"{prim}{tn[-1]}"
    sig = "".join("s" if s else "v" for s in scalars)
    return Tape(inputs, ops, (out,), lib_name=f"{sig}_{stem}")


def msl_module(tape: Tape) -> str:
    """Every variant of ``tape`` in one MSL source (what the runtime compiles once)."""
    return renderer("metal").module(tape, tape.lib_name)


_sources: dict = {}  # kernel name -> its MSL, or the reason the Metal dialect refuses it


def msl(spec):
    """A generated kernel's (a reduction's, a fast primitive's ``KernelSpec``) MSL, made once
    per kernel name; the ``Unsupported`` saying why where the Metal dialect refuses it."""
    got = _sources.get(spec.name)
    if got is None:
        try:
            got = spec.source(renderer("metal"))
        except Unsupported as e:
            got = Unsupported(str(e))
        _sources[spec.name] = got
    return got
