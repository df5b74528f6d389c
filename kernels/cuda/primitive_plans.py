"""A primitive's generated CUDA kernel planned once per call layout, launched by the eval
loop from C.

MLX's reductions and fast primitives on a GPU stream (``cuda/reductions.py``,
``cuda/fast_kernels.py``) are ``KernelRule``s (``kernels/kernel_call.py``), as on the CPU:
the first call with a layout (dtype, shape, strides, parameters) runs the rule, which makes
the call's ``KernelPlan`` (the kernel's ``Step`` with its integer arguments, constant
buffers and the arrays' places packed into launch words, ``compiled.PackedLaunch``); later
calls with that layout are launched by the eval loop in C (``core/_loop.c`` run_node
through the backend's ``device_api``, ``cuda/_driver.c``'s cuLaunchKernel) into a fresh
allocator buffer, with no Python code, as a loaded fused call is. MLX's CUDA backend
launches its reduction kernels from C++ the same way (mlx/backend/cuda/reduce/*.cu,
``encoder.add_kernel_node``).

Only calls of one launch get a plan; ``all`` reductions (parts, then a row kernel over
them), columns cut into splits, inputs that need a contiguous copy and the VJPs run their
rule (``slow``), which launches its ``Step``s from Python.
"""

from __future__ import annotations

from typing import Optional

import cupy
import numpy as np

from .. import kernel_registry
from .compiled import PackedLaunch

_MASK = (1 << 64) - 1


class KernelPlan(PackedLaunch):
    """One launch of a loop-IR kernel (``reductions.Step``) for one call layout: its
    integer arguments and constant buffers (``keep``) fixed, the inputs' pointers at
    ``slots`` (``inputs``: buffer name -> the call's input index), the output's at
    ``n_out_at``. ``plan(*inputs, out)`` launches it on the current CUDA stream (a rule's
    call, inside the node's device context); the eval loop's C launch reads the packed
    words."""

    __slots__ = ("primitive", "keep")

    def __init__(self, step, entry, inputs: dict, consts: dict, out_shape: tuple, out_dtype,
                 primitive: str):
        names = dict(step.bufs + step.arrays)  # parameter index -> buffer name
        words, offsets, slots, keep = [], [], [], []
        n_out_at = -1
        for i, a in enumerate(step.args):
            offsets.append(len(words))
            if a is not None:  # an integer argument (int64)
                words.append(int(a) & _MASK)
                continue
            name = names[i]
            if name == "out":
                n_out_at = len(words)
                words.append(0)
            elif name in inputs:
                slots.append((inputs[name], len(words)))
                words.append(0)
            else:  # a constant device buffer (eps, inverse frequencies, int arrays)
                c = consts[name]
                keep.append(c)
                words.append(int(c.data.ptr))
        if n_out_at < 0:
            raise ValueError(f"[KernelPlan] {step.spec.name} has no output buffer")
        word_at = len(words)  # two spare words the C launch clears (no completion word)
        words += [0, 0]
        self.primitive, self.keep = primitive, keep
        self._set_pack(entry, words, offsets, slots, (), n_out_at, word_at, int(step.grid),
                       int(step.block), [np.dtype(out_dtype)], "C", tuple(out_shape),
                       step.spec.name, step.spec.layout)

    def __call__(self, *arrays) -> None:
        self.call(arrays[:-1], arrays[-1:])

    def launch_detail(self) -> dict:
        return {"runtime": "cuda", "variant": self.variant, "grid": self.grid,
                "block": self.block, "primitive": self.primitive}


def plan_of(spec, ints: dict, primitive: str, inputs: dict, consts: dict, out_shape,
            out_dtype) -> Optional[KernelPlan]:
    """The plan of ``spec``'s kernel with these integer arguments (its ``Step`` made once),
    or None where the CUDA dialect cannot express it or it has no build (the rule's
    ``run_steps`` then notes the fallback)."""
    from .reductions import step_for

    step = step_for(spec, ints, primitive)
    if isinstance(step, tuple):
        return None
    try:
        entry = step.entry()
    except kernel_registry.BuildError:
        return None
    if consts:  # made on this stream; the plan runs on any: the copies done first
        cupy.cuda.get_current_stream().synchronize()
    return KernelPlan(step, entry, inputs, consts, out_shape, out_dtype, primitive)


def fits(out, shape, dtype, ins) -> bool:
    """Whether the evaluator's buffer takes a kernel's result: its shape and dtype,
    row-contiguous, and none of the inputs' memory (the kernels' buffers are
    ``__restrict__``: an exclusive scan stores ``out[c]`` before folding ``x[c]``)."""
    return (out is not None and out.shape == tuple(shape) and out.dtype == dtype
            and out.flags.c_contiguous
            and not any(cupy.may_share_memory(out, a) for a in ins))
