"""Which reduction kernel a call runs, and its integer arguments, from its input's layout:
MLX's reduction plans (``mlx/backend/common/reduce.cpp``: contiguous all / row, strided
column, general), its softmax's and scan's contiguous / strided choice. Every runtime
(the CPU's C, CUDA, Metal) launches the same ``KernelSpec`` with these arguments.

Strides are in elements. A ``Call`` lists the spec, the integer parameters by name, the
int64 arrays (``general``), the output's shape and dtype, and, for ``all``, the parts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..codegen.layout import row_strides
from ..codegen.reduce_kernels import COL_BLOCK, COL_LANES, KernelSpec, acc_dtype
from ..primitives import REGISTRY
from .strides import collapse

ALL_PART = 1 << 14  # elements per part of an ``all`` reduction (parts run in parallel)
MAX_PARTS = 64
THREADS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)  # the CPU kernels' OpenMP threads (one per core)


@dataclass
class Call:
    spec: KernelSpec
    ints: dict
    arrays: dict = field(default_factory=dict)
    out_shape: tuple = ()
    out_dtype: Optional[np.dtype] = None
    parts: int = 0  # ``all``: the partial results' count (their buffer: acc dtype)
    # ``col`` on a GPU: the splits of the reduced run side by side in the grid (> 1: a
    # second launch merges their rows x splits partial results)
    gpu_splits: int = 1
    copy: bool = False  # the input must be made row-contiguous first (as MLX's backends do)

    @property
    def part_dtype(self) -> np.dtype:
        return acc_dtype(self.spec.out_dtype if self.spec.op in ("sum", "prod")
                         else self.spec.in_dtype) if self.spec.op not in ("and", "or") \
            else np.dtype(np.bool_)


def sum_dtype(dt) -> np.dtype:
    """MLX's Sum / Prod output type: bool, int8, int16 -> int32; uint8, uint16 -> uint32."""
    dt = np.dtype(dt)
    if dt.kind == "b" or (dt.kind == "i" and dt.itemsize < 4):
        return np.dtype(np.int32)
    if dt.kind == "u" and dt.itemsize < 4:
        return np.dtype(np.uint32)
    return dt


def _split(shape, strides, axes) -> tuple:
    axes = set(axes)
    kept = collapse([(n, s) for i, (n, s) in enumerate(zip(shape, strides)) if i not in axes])
    # the reduced elements' order does not matter: the largest strides first collapse most
    red = sorted([(n, s) for i, (n, s) in enumerate(zip(shape, strides)) if i in axes and n != 1],
                 key=lambda d: -abs(d[1]))
    return kept, collapse(red)


def reduce_call(op: str, in_dtype, shape, strides, axes) -> Call:
    """Reduce (sum, prod, max, min, and, or; argmax / argmin over one axis) of an input of
    ``shape`` / ``strides`` over ``axes``, keeping them (size 1)."""
    in_dtype = np.dtype(in_dtype)
    arg = op in ("argmax", "argmin")
    out_dtype = (np.dtype(np.uint32) if arg else sum_dtype(in_dtype) if op in ("sum", "prod")
                 else np.dtype(np.bool_) if op in ("and", "or") else in_dtype)
    out_shape = tuple(1 if i in set(axes) else n for i, n in enumerate(shape))
    kept, red = _split(shape, strides, axes)
    rows = int(np.prod([n for n, _ in kept], dtype=np.int64)) if kept else 1
    cols = int(np.prod([n for n, _ in red], dtype=np.int64)) if red else 1

    def spec(layout):
        return KernelSpec("reduce", op, in_dtype.name, out_dtype.name, layout)

    if len(kept) <= 1 and len(red) <= 1:
        sr = kept[0][1] if kept else 0
        sc = red[0][1] if red else 0
        ints = {"rows": rows, "cols": cols, "sr": sr, "sc": sc}
        if rows == 1 and sc == 1 and not arg and cols >= 2 * ALL_PART:
            parts = min(MAX_PARTS, cols // ALL_PART)
            return Call(spec("all"), {"cols": cols, "parts": parts}, out_shape=out_shape,
                        out_dtype=out_dtype, parts=parts)
        layout = "row" if sc == 1 or cols == 1 else "col" if sr == 1 and rows > 1 else "strided"
        if layout == "row":
            ints["sc"] = 1
        splits = 1
        if layout == "col":  # kept elements per block: a share per thread, 64 at least
            share = -(-rows // THREADS)
            ints["cb"] = min(COL_BLOCK, max(64, -(-share // 64) * 64))
            splits = 1 if arg else col_splits(rows, cols)
        return Call(spec(layout), ints, out_shape=out_shape, out_dtype=out_dtype, gpu_splits=splits)
    kept = kept or [(1, 0)]
    red = red or [(1, 0)]
    arrays = {"kshape": [n for n, _ in kept], "kstrides": [s for _, s in kept],
              "rshape": [n for n, _ in red], "rstrides": [s for _, s in red]}
    return Call(spec("general"), {"rows": rows, "cols": cols, "knd": len(kept), "rnd": len(red)},
                {k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()},
                out_shape=out_shape, out_dtype=out_dtype)


def softmax_call(family: str, in_dtype, shape, strides, precise: bool = False) -> Optional[Call]:
    """Softmax / LogSumExp over the last axis; None unless that axis is unit-stride and the
    others collapse to one stride (the caller copies the input, as MLX's backends do)."""
    in_dtype = np.dtype(in_dtype)
    cols = int(shape[-1]) if shape else 1
    kept = collapse(list(zip(shape[:-1], strides[:-1])))
    if len(kept) > 1 or (cols > 1 and strides[-1] != 1):
        return None
    rows = kept[0][0] if kept else 1
    out_shape = tuple(shape[:-1]) + ((1,) if family == "logsumexp" else (cols,))
    return Call(KernelSpec(family, family, in_dtype.name, in_dtype.name, "row", precise=precise),
                {"rows": rows, "cols": cols, "sr": kept[0][1] if kept else 0},
                out_shape=out_shape, out_dtype=in_dtype)


def scan_call(op: str, in_dtype, shape, strides, axis: int, inclusive: bool,
              reverse: bool) -> Optional[Call]:
    """CumSum / CumProd / CumMax / CumMin along ``axis``: ``contig`` when it is the last
    (non-trivial) axis, else ``strided``; None when the dims around it do not collapse."""
    in_dtype = np.dtype(in_dtype)
    out_dtype = np.dtype(np.int32) if op == "sum" and in_dtype.kind == "b" else in_dtype
    outer = collapse(list(zip(shape[:axis], strides[:axis])))
    inner = collapse(list(zip(shape[axis + 1:], strides[axis + 1:])))
    if len(outer) > 1 or len(inner) > 1:
        return None
    n = int(shape[axis])
    ints = {"outer": outer[0][0] if outer else 1, "n": n, "inner": inner[0][0] if inner else 1,
            "so": outer[0][1] if outer else 0, "sa": int(strides[axis]),
            "si": inner[0][1] if inner else 0}
    layout = "contig" if ints["inner"] == 1 else "strided"
    spec = KernelSpec("scan", op, in_dtype.name, out_dtype.name, layout, inclusive=inclusive,
                      reverse=reverse)
    return Call(spec, ints, out_shape=tuple(shape), out_dtype=out_dtype)


GPU_GROUPS = 1024  # groups a GPU column reduction aims for (H200: 132 SMs x 8 groups of 256)
COL_SPLIT_MIN = 512  # reduced elements a split takes at least (64 per warp)


def col_splits(rows: int, cols: int) -> int:
    """Splits of a column reduction's reduced run on a GPU: enough groups to fill the
    device (MLX's ``col_reduce`` grows its grid along the reduced axis likewise)."""
    groups = -(-rows // COL_LANES)
    return max(1, min(-(-GPU_GROUPS // groups), cols // COL_SPLIT_MIN))


def gpu_part_size(call: Call) -> int:
    """Elements of the partial results buffer (``part``) a GPU's launches of ``call`` use."""
    if call.parts:
        return call.parts
    return call.ints["rows"] * call.gpu_splits if call.gpu_splits > 1 else 0


def gpu_launches(call: Call) -> list:
    """The kernel launches of ``call`` on a GPU, in order, as (spec, ints, source buffer,
    destination buffer) with buffers named ``x`` (the input), ``part``, ``out``: ``all`` is
    its parts kernel, then the row kernel over the parts (a GPU's groups cannot wait for
    each other inside one launch); the rest one launch."""
    s = call.spec
    if s.layout == "col":  # the GPU kernel's cb: the reduced elements of one split
        rows, cols, n = call.ints["rows"], call.ints["cols"], call.gpu_splits
        if n == 1:
            return [(s, {**call.ints, "cb": cols}, "x", "out")]
        pd = call.part_dtype.name
        return [(KernelSpec("reduce", s.op, s.in_dtype, pd, "col"), {**call.ints, "cb": -(-cols // n)},
                 "x", "part"),
                (KernelSpec("reduce", s.op, pd, s.out_dtype, "col"),
                 {"rows": rows, "cols": n, "sr": 1, "sc": rows, "cb": n}, "part", "out")]
    if not call.parts:
        return [(call.spec, call.ints, "x", "out")]
    row = KernelSpec("reduce", s.op, call.part_dtype.name, s.out_dtype, "row")
    return [(s, call.ints, "x", "part"),
            (row, {"rows": 1, "cols": call.parts, "sr": 0, "sc": 1}, "part", "out")]


# the generated kernels planned here, as definitions name them (``PrimitiveDef.kernel``)
KERNELS = ("reduce", "arg_reduce", "softmax", "logsumexp", "scan")
PRIMITIVES = tuple(n for n, d in REGISTRY.items() if d.kernel in KERNELS)


def plan_for(name: str, dtype, shape, strides: Optional[tuple], kw: dict):
    """The ``Call`` that runs primitive ``name`` (with its parameters ``kw``) on an input of
    this dtype, shape and element strides (None: not whole elements), or a string saying
    why no kernel takes it (the runtime then runs the array-module rule)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in shape)
    defn = REGISTRY[name]
    kernel = defn.kernel
    if dtype.kind == "c":
        return "no generated kernel for complex values"
    if not shape and kernel != "reduce":
        return "no generated kernel for a 0-d input"
    if strides is None:
        return "no generated kernel for strides that are not whole elements"
    if kernel == "reduce":
        return reduce_call(defn.monoid, dtype, shape, strides, tuple(int(a) for a in kw["axes"]))
    if kernel == "arg_reduce":
        return reduce_call(kw["reduce_type"], dtype, shape, strides, (int(kw["axis"]) % len(shape),))
    if kernel in ("softmax", "logsumexp"):
        if dtype.kind != "f" and dtype.name != "bfloat16":
            return f"no generated kernel for {dtype} values"
        family = kernel
        precise = bool(kw.get("precise"))
        call = softmax_call(family, dtype, shape, strides, precise)
        if call is None:
            call = softmax_call(family, dtype, shape, row_strides(shape), precise)
            call.copy = True
        return call
    if kernel == "scan":
        if defn.monoid not in ("sum", "prod", "max", "min"):
            return f"no generated kernel for {defn.monoid} scans"
        axis = int(kw["axis"]) % len(shape)
        args = (defn.monoid, dtype, shape, strides, axis, bool(kw["inclusive"]), bool(kw["reverse"]))
        call = scan_call(*args)
        if call is None:
            call = scan_call(*args[:3], row_strides(shape), *args[4:])
            call.copy = True
        return call
    return f"{name} has no generated kernel"


def arguments(params, buffers: dict, ints: dict, arrays: dict) -> list:
    """A kernel's arguments in its signature's order (``loop_ir.Param``s): buffers and int64
    arrays by name (the runtime's pointers or arrays), integers by value."""
    out = []
    for p in params:
        if p.kind in ("in", "out"):
            out.append(buffers[p.name])
        elif p.kind == "int":
            out.append(int(ints[p.name]))
        else:
            out.append(arrays[p.name])
    return out


_calls: dict = {}  # (primitive, parameters, dtype, shape, strides) -> its Call, or why none


def call_for(name: str, dtype, shape, itemsize: int, byte_strides, kw: dict):
    """``plan_for`` remembered per layout (a runtime asks it on every call): the input's
    strides given in bytes, as numpy and CuPy report them."""
    st = None if any(s % itemsize for s in byte_strides) else tuple(s // itemsize for s in byte_strides)
    key = (name, tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v)
                              for k, v in kw.items())), dtype, shape, st)
    call = _calls.get(key)
    if call is None:
        if len(_calls) > 4096:
            _calls.clear()
        call = _calls[key] = plan_for(name, dtype, shape, st, kw)
    return call
