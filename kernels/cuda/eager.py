"""Eager elementwise ops on the GPU as one-op kernels of the shared renderer.

MLX's CUDA backend runs an eager unary, binary or ternary op as a kernel of its own per op
and types (mlx/backend/cuda/unary.cu, binary.cu, ternary.cu), not through a library's array
call. Here an eager elementwise node on a GPU stream is the one-op tape of its primitive
(``bfloat16.elementwise_tape``: the renderer's code, as a compiled function's fused
kernels), its call plan for the inputs' layout class built once through the kernel cache
(``compiled.kernel_for``: NVRTC, cached in memory and on disk; the output row-major, the
loop's buffer, column-major operands read by the strided variant) and launched by the eval
loop as a loaded fused call is (core/_loop.c run_node through the backend's C launch,
cuda/_driver.c; else ``CudaBackend.launch_fused``), with no CuPy call on the way.

A Python scalar's array stays on the host (``CudaAllocator.import_host``; its Broadcast is a
host view, ``evaluate``'s host views): the kernel takes its value as a parameter
(``TapeInput.by_value``), so an eager ``v * 1.0001`` uploads nothing. bfloat16 and float16
are the kernels' 16-bit storage types (bfloat16's ``BF16Array`` storage is read through
its pointer). A cast (``AsType``: its one parameter is the output dtype, which the plan's
key holds already) is planned the same way, as MLX's copy kernel per type pair casts
(mlx/backend/cuda/device/cast_op.cuh, ``CastOp``): bfloat16 and float16 through
float with one round to nearest even (``codegen/cuda.py``'s ``half_store``), a float to bool by
value (``x != 0``: NVRTC keeps subnormals, so a subnormal is true as ``cuda/casts.py``'s bit
test gives). An op whose kernel cannot be built (a dtype or op the CUDA dialect cannot spell,
other parameters, no NVRTC) runs its CuPy rule, recorded as a ``kernel_fallback``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import cupy
import numpy as np

from .. import timeline
from ..kernel_call import EagerPlans
from ..codegen.layout import Layout
from ..primitives import ASTYPE
from . import compiled
from .bfloat16 import BF16Array, elementwise_tape

_SCALAR: dict = {}  # dtype -> the layout a by-value scalar plans as (a 0-d array's)
# the tapes by (primitive, out dtype, (dtype, scalar: True / False / None by value)...), and
# the plans (the eval loop in C reads ``plans``; the setting read on every op)
_eager = EagerPlans()
plans = _eager.plans


def host_scalar(x: Any) -> bool:
    """Whether an input is host data holding one value: a Python scalar's 0-d array on a
    GPU stream, or a host broadcast of it (every stride 0)."""
    return type(x) is np.ndarray and (x.ndim == 0 or not any(x.strides)) and x.size > 0


def plan_for(prim: Any, ins: Sequence, dtype: Any, shape: tuple) -> Optional[Any]:
    """The loaded plan of ``prim``'s one-op kernel reading ``ins`` (device arrays, or host
    scalars taken by value) and writing ``dtype`` of ``shape`` (a ``compiled.Launch``),
    or None: the op's rule runs (recorded as a ``kernel_fallback`` when it has no kernel).
    (Called by the eval loop for every eager elementwise node and cast on a GPU stream:
    kept short.)"""
    if (prim.kw and prim.defn.family != ASTYPE) or not ins or not _eager.on:
        return None  # (kw: parameters the one-op spelling does not take, but a cast's
        # dtype, which is ``dtype`` here; the setting off: the rules)
    key = [prim.name, dtype]
    layouts = []
    for x in ins:
        t = type(x)
        if t is cupy.ndarray or t is BF16Array:
            # a scalar read through its pointer (a device 0-d) is another kernel than an array
            key.append((x.dtype, x.ndim == 0))
            layouts.append(x)
        elif t is np.ndarray and host_scalar(x):
            key.append((x.dtype, None))
            lay = _SCALAR.get(x.dtype)
            if lay is None:
                lay = _SCALAR[x.dtype] = Layout((), x.dtype)
            layouts.append(lay)
        else:
            return None
    for s in shape:
        if s == 0:
            return None  # nothing to launch: the rule makes the empty result
    key = tuple(key)
    why = _eager.none.get(key)
    if why is not None:  # (known to have no tape: its rule, recorded)
        _fallback(prim.name, why)
        return None
    kinds = key[2:]
    tape = _eager.tape(key, lambda: elementwise_tape(
        prim.name, [k[0] for k in kinds], dtype, [k[1] is not False for k in kinds],
        by_value=tuple(k[1] is None for k in kinds)))
    if tape is None:
        return None
    ln = compiled.kernel_for(tape, layouts, shape)
    if ln is None:
        _fallback(tape.lib_name, "the CUDA dialect cannot express it, or NVRTC is missing")
    elif ln.out_dtype is not None:  # found by the loop from now on
        _eager.remember(prim.name, ins, prim.kw, ln)
    return ln


def fused_plan_for(prim: Any, ins: Sequence, dtype: Any, shape: tuple) -> Optional[Any]:
    """The loaded plan of a fused call (``Compiled``) reading host scalars (a Python
    scalar's 0-d array, which a GPU keeps on the host, or a host broadcast of one) by value,
    its other inputs device arrays: its tape with those inputs taken as parameters' values
    (``TapeInput.by_value``, as an eager op's scalar), writing a row-major ``dtype`` of
    ``shape`` (``dtype`` None: a tape of several outputs, each its own dtype); kept in
    ``plans``, where the eval loop's C part finds it from the next call on. None:
    ``run_compiled`` (the scalars uploaded)."""
    kw = prim.kw
    tape = kw.get("tape")
    if tape is None or tape.reduction is not None or not _eager.on:
        return None
    for s in shape:
        if s == 0:
            return None
    mask, layouts = [], []
    for x, a in zip(tape.inputs, ins):
        t = type(a)
        if x.is_constant:
            mask.append(False)
            layouts.append(a)
        elif t is np.ndarray and host_scalar(a) and a.dtype == x.dtype:
            mask.append(True)
            lay = _SCALAR.get(a.dtype)
            if lay is None:
                lay = _SCALAR[a.dtype] = Layout((), a.dtype)
            layouts.append(lay)
        elif t is cupy.ndarray or t is BF16Array:
            mask.append(False)
            layouts.append(a)
        else:
            return None
    if not any(mask) or len(ins) != len(tape.inputs):
        return None
    variant = _by_value(tape, tuple(mask))
    ln = compiled.kernel_for(variant, layouts, shape)
    if ln is None or (dtype is not None and ln.out_dtype != np.dtype(dtype)):
        return None
    try:
        _eager.remember(prim.name, ins, kw, ln)
    except TypeError:  # (a constant the key cannot hash: planned again next call)
        pass
    return ln


def _by_value(tape: Any, mask: tuple) -> Any:
    """``tape`` with the inputs ``mask`` names taken by value (kept on the tape)."""
    key = ("cuda-by-value", mask)
    v = tape.launches.get(key)
    if v is None:
        from ..codegen.tape import Tape, TapeInput

        inputs = tuple(TapeInput(x.name, x.dtype, scalar=True, by_value=True) if m else x
                       for x, m in zip(tape.inputs, mask))
        tag = "".join("v" if m else "_" for m in mask)
        v = tape.launches[key] = Tape(inputs, tape.ops, tape.outputs, f"{tape.lib_name}_hv{tag}")
    return v


class EagerKernels:
    """``Backend.eager_kernel``: ``plan_for`` as a callable, and ``plans``, the plans it has
    made by their call's layouts, which the eval loop's C part finds without calling it;
    ``casts``: it plans ``AsType`` too; ``fused``: a fused call's plan with host scalars
    taken by value (``fused_plan_for``), kept in ``plans`` as well."""

    __slots__ = ()
    plans = plans
    casts = True

    def __call__(self, prim: Any, ins: Sequence, dtype: Any, shape: tuple) -> Optional[Any]:
        return plan_for(prim, ins, dtype, shape)

    def fused(self, prim: Any, ins: Sequence, dtype: Any, shape: tuple) -> Optional[Any]:
        return fused_plan_for(prim, ins, dtype, shape)


def _fallback(name: str, why: str) -> None:
    if timeline.enabled:
        t = timeline.now()
        timeline.add("kernel_fallback", t, t, name=name, device="gpu",
                     detail={"reason": why, "runtime": "cupy"})
