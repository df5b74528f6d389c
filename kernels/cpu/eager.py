"""Eager elementwise ops on the CPU as one-op kernels of the shared renderer.

MLX's CPU backend runs an eager unary, binary or ternary op as a SIMD loop of its own per op
and types (mlx/backend/cpu/unary.h, binary.h, ternary.h), into a donated input's buffer
where nobody else holds it (mlx/backend/common/binary.h ``set_binary_op_output_data``).
Here an eager elementwise node of at least ``MIN_SIZE`` elements is the one-op tape of its
primitive (``codegen.tape.one_op_tape``: the renderer's code, as a compiled function's fused
kernels), its plan for the inputs' layouts made once (``compiled.kernel_for``) and called
by the eval loop as a loaded fused call is (core/_loop.c run_host, its C ``KernelCall``;
``evaluate._eager_launch`` in Python), into the buffer the loop chose (a dying input's or
the allocator's). From ``MIN_SIZE`` on the kernel runs on the free cores (the renderer's
OpenMP loop), where numpy's ufunc runs on one; below it numpy's ufunc, one call, is as fast.

A kernel neither loaded nor in the disk cache is built at the op's first call, as a fused
call's is (once per machine: the disk cache keeps it); with tiered first calls on
(``settings.tiered``) it builds in the background while the op's numpy rule runs. Ops with parameters, bfloat16 (computed in
float32 by the rules), what the C dialect cannot spell (complex) and column-major operands
(whose kernel writes a column-major output: the loop's buffers are row-major) keep their
rules.
``settings.eager_kernels`` off runs every rule.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import ml_dtypes
import numpy as np

from ..codegen.render import CpuSchedule
from ..codegen.tape import one_op_tape
from ..kernel_call import EagerPlans
from . import compiled

#: elements from which an eager elementwise op runs as its kernel: the renderer's OpenMP
#: threshold (below it both are one thread's SIMD loop, and one ufunc call costs no more)
MIN_SIZE = CpuSchedule.omp_min_size

_BF16 = np.dtype(ml_dtypes.bfloat16)
_eager = EagerPlans()  # the tapes by (primitive, out dtype, (dtype, scalar)...), the plans
plans = _eager.plans  # (what the eval loop in C reads)


def plan_for(prim: Any, ins: Sequence, dtype: Any, shape: tuple) -> Optional[Any]:
    """The loaded plan (a ``compiled.Launch``) of ``prim``'s one-op kernel reading ``ins``
    (host arrays) and writing ``dtype`` of ``shape``, or None: the op's rule runs."""
    if prim.kw or not ins or not _eager.on:
        return None
    size = 1
    for s in shape:
        size *= s
    if size < MIN_SIZE:
        return None
    key = [prim.name, dtype]
    for x in ins:
        if type(x) is not np.ndarray or x.dtype == _BF16:
            return None
        key.append((x.dtype, x.ndim == 0))
    key = tuple(key)
    kinds = key[2:]
    tape = _eager.tape(key, lambda: one_op_tape(prim.name, [k[0] for k in kinds], dtype,
                                                [k[1] for k in kinds]))
    if tape is None:
        return None
    ln = compiled.kernel_for(tape, ins, tuple(shape))
    if ln is None or ln.order != "C":  # column-major inputs: the loop's buffers are row-major
        return None
    if ln.kernel_call is not None:  # found by the loop from now on
        _eager.remember(prim.name, ins, prim.kw, ln)
    return ln


class EagerKernels:
    """``Backend.eager_kernel``: ``plan_for`` as a callable; ``plans``, the plans it has made
    by their call's layouts, which the eval loop's C part finds without calling it; and
    ``min_size``, the output elements below which the loop does not ask; ``casts``: no
    ``AsType`` (numpy's cast is one call, and C's float-to-integer conversion outside the
    range is not numpy's)."""

    __slots__ = ()
    plans = plans
    min_size = MIN_SIZE
    casts = False

    def __call__(self, prim: Any, ins: Sequence, dtype: Any, shape: tuple) -> Optional[Any]:
        return plan_for(prim, ins, dtype, shape)
