"""Eager elementwise ops on the GPU as one-op kernels of the shared renderer.

MLX's CUDA backend runs an eager unary, binary or ternary op as a kernel of its own per op
and types (mlx/backend/cuda/unary.cu, binary.cu, ternary.cu), not through a library's array
call. Here an eager elementwise node on a GPU stream is the one-op tape of its primitive
(``bfloat16.elementwise_tape``: the renderer's code, as a compiled function's fused
kernels), its call plan for the inputs' layout class built once through the kernel cache
(``compiled.kernel_for``: NVRTC, cached in memory and on disk) and launched by the eval
loop as a loaded fused call is (core/_loop.c run_node through the backend's C launch,
cuda/_driver.c; else ``CudaBackend.launch_fused``), with no CuPy call on the way.

A Python scalar's array stays on the host (``CudaBackend.import_host``; its Broadcast is a
host view, ``evaluate``'s host views): the kernel takes its value as a parameter
(``TapeInput.by_value``), so an eager ``v * 1.0001`` uploads nothing. bfloat16 and float16
are the kernels' 16-bit storage types (bfloat16's ``BF16Array`` storage is read through
its pointer). An op whose kernel cannot be built (a dtype or op the CUDA dialect cannot
spell, parameters, no NVRTC) runs its CuPy rule, recorded as a ``kernel_fallback``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import cupy
import numpy as np

from .. import timeline
from ..codegen.layout import Layout
from . import compiled
from .bfloat16 import BF16Array, elementwise_tape

_none: dict = {}  # (primitive, dtypes, scalars) -> why it has no kernel (its rule from now on)
_tapes: dict = {}  # (primitive, dtypes, out dtype, by-value flags) -> its tape
_DEVICE = (cupy.ndarray, BF16Array)


def host_scalar(x: Any) -> bool:
    """Whether an input is host data holding one value: a Python scalar's 0-d array on a
    GPU stream, or a host broadcast of it (every stride 0)."""
    return type(x) is np.ndarray and (x.ndim == 0 or not any(x.strides)) and x.size > 0


def plan_for(prim: Any, ins: Sequence, dtype: Any, shape: tuple) -> Optional[Any]:
    """The loaded plan of ``prim``'s one-op kernel reading ``ins`` (device arrays, or host
    scalars taken by value) and writing ``dtype`` of ``shape`` (a ``compiled.Launch``),
    or None: the op's rule runs (recorded as a ``kernel_fallback`` when it has no kernel)."""
    if prim.kw or not ins:  # parameters the one-op spelling does not take: the rule
        return None
    values = []
    for x in ins:
        t = type(x)
        if t is cupy.ndarray or t is BF16Array:
            values.append(False)
        elif host_scalar(x):
            values.append(True)
        else:
            return None
    if any(s == 0 for s in shape):
        return None  # nothing to launch: the rule makes the empty result
    # a scalar read through its pointer (a device 0-d input) is another kernel than an array
    scalars = tuple(v or x.ndim == 0 for x, v in zip(ins, values))
    key = (prim.name, tuple(x.dtype for x in ins), dtype, tuple(values), scalars)
    tape = _tapes.get(key)
    if tape is None:
        if key in _none:
            _fallback(prim.name, _none[key])
            return None
        try:
            tape = elementwise_tape(prim.name, key[1], dtype, scalars, by_value=tuple(values))
        except Exception as e:  # noqa: BLE001 - a type the tape cannot key: the rule
            _none[key] = str(e)
            return None
        _tapes[key] = tape
    layouts = [Layout((), x.dtype) if v else x for x, v in zip(ins, values)]
    ln = compiled.kernel_for(tape, layouts, tuple(shape))
    if ln is None:
        _fallback(tape.lib_name, "the CUDA dialect cannot express it, or NVRTC is missing")
    return ln


def _fallback(name: str, why: str) -> None:
    if timeline.enabled:
        t = timeline.now()
        timeline.add("kernel_fallback", t, t, name=name, device="gpu",
                     detail={"reason": why, "runtime": "cupy"})
