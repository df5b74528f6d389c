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

A call of several launches (``all`` reductions: the parts, then a row kernel over them;
columns cut into splits, then a kernel merging the splits: MLX's ``all_reduce`` and
``col_reduce_two_pass``) gets a ``PlanSequence``: its launches planned together, issued in
order on the node's stream by the same C launch, the partial results in a scratch buffer
the plan keeps per CUDA stream (MLX allocates its ``intermediate`` per call and keeps it as
the command's temporary). Inputs that need a contiguous copy first and the VJPs run their
rule (``slow``), which launches its ``Step``s from Python.
"""

from __future__ import annotations

import threading
from typing import Optional

import cupy
import numpy as np

from .. import kernel_registry, timeline
from .compiled import PackedLaunch, _launch, value_bits

_MASK = (1 << 64) - 1
SCRATCH = -1  # a slot's input index that means the plan's scratch buffer (PlanSequence)


class KernelPlan(PackedLaunch):
    """One launch of a loop-IR kernel (``reductions.Step``) for one call layout: its
    integer arguments and constant buffers (``keep``) fixed, the inputs' pointers at
    ``slots`` (``inputs``: buffer name -> the call's input index, or ``SCRATCH``), the
    output's at ``n_out_at`` (-1: a launch of a sequence that writes only the scratch;
    ``out`` names the buffer the output goes to). ``plan(*inputs, out)`` launches it on
    the current CUDA stream (a rule's call, inside the node's device context); the eval
    loop's C launch reads the packed words. ``dims``: (input, axis, word, most) per size the
    launch takes from its input each call (``KernelRule.free``: a decoding cache's length,
    up to ``most``), written into that word by both launches."""

    __slots__ = ("primitive", "keep", "dims")

    def __init__(self, step, entry, inputs: dict, consts: dict, out_shape: tuple, out_dtype,
                 primitive: str, out: Optional[str] = "out"):
        names = dict(step.bufs + step.arrays)  # parameter index -> buffer name
        words, offsets, slots, keep = [], [], [], []
        n_out_at = -1
        for i, a in enumerate(step.args):
            offsets.append(len(words))
            if a is not None:  # an integer argument (int64)
                words.append(int(a) & _MASK)
                continue
            name = names[i]
            if name == out:
                n_out_at = len(words)
                words.append(0)
            elif name in inputs:
                slots.append((inputs[name], len(words)))
                words.append(0)
            else:  # a constant device buffer (eps, inverse frequencies, int arrays)
                c = consts[name]
                keep.append(c)
                words.append(int(c.data.ptr))
        if out is not None and n_out_at < 0:
            raise ValueError(f"[KernelPlan] {step.spec.name} has no output buffer")
        word_at = len(words)  # two spare words the C launch clears (no completion word)
        words += [0, 0]
        self.primitive, self.keep, self.dims = primitive, keep, ()
        self._set_pack(entry, words, offsets, slots, (), n_out_at, word_at, int(step.grid),
                       int(step.block), [np.dtype(out_dtype)], "C", tuple(out_shape),
                       step.spec.name, step.spec.layout)

    def __call__(self, *arrays) -> None:
        self.call(arrays[:-1], arrays[-1:])

    def call(self, inputs, outs, hit: bool = True, stream=None) -> None:
        """Launch on these device arrays on ``stream`` (default: the current CUDA stream)."""
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        self._launch_one(inputs, outs[0], 0, stream, hit)

    def _launch_one(self, inputs, out, scratch: int, stream, hit: bool) -> None:
        """This launch (``PackedLaunch.call``'s), ``scratch`` the pointer a ``SCRATCH``
        slot takes."""
        if hit:
            self.entry.hits += 1
        pack = self.packs.get(threading.get_ident()) or self._pack()
        vals = pack[0]
        for i, j in self.slots:
            vals[j] = scratch if i == SCRATCH else inputs[i].data.ptr
        if self.n_out_at >= 0:
            vals[self.n_out_at] = out.data.ptr
        for i, ax, j, _ in self.dims:
            vals[j] = int(inputs[i].shape[ax])
        for i, j, _ in self.values:  # a host scalar by value (a per-call word: KernelRule.per_call)
            vals[j] = value_bits(inputs[i])
        t0 = timeline.now() if timeline.enabled else 0
        _launch(self.fn_ptr, self.grid, 1, 1, self.block, 1, 1, 0, stream.ptr, pack[2], 0)
        if t0:
            timeline.add("kernel_launch", t0, timeline.now(), name=self.name, device="gpu",
                         detail=self.launch_detail())

    def launch_detail(self) -> dict:
        return {"runtime": "cuda", "variant": self.variant, "grid": self.grid,
                "block": self.block, "primitive": self.primitive}


class PlanSequence(KernelPlan):
    """A call of several launches in order, all planned once: this object is the first
    launch's ``KernelPlan`` (with the call's output as its ``out_shape`` / ``out_dtype``,
    what the eval loop compares), ``then`` the later ones; between them the partial
    results lie in a scratch buffer of ``scratch_size`` elements of ``scratch_dtype``,
    made per CUDA stream on its first use there (``scratch_for``: launches on one stream
    run in order, so the next call may reuse it; two streams never share one). The C
    launch (``cuda/_driver.c``) issues every launch of the sequence on the node's stream,
    the scratch's pointer in its ``SCRATCH`` slots."""

    __slots__ = ("then", "scratch_size", "scratch_dtype", "scratches")

    def __init__(self, first: tuple, then: list, scratch_size: int, scratch_dtype,
                 out_shape: tuple, out_dtype, primitive: str):
        step, entry, inputs, out = first
        super().__init__(step, entry, inputs, {}, out_shape, out_dtype, primitive, out=out)
        self.then = tuple(KernelPlan(s, e, i, {}, out_shape, out_dtype, primitive, out=o)
                          for s, e, i, o in then)
        self.scratch_size, self.scratch_dtype = int(scratch_size), np.dtype(scratch_dtype)
        self.scratches: dict = {}  # CUDA stream pointer -> its scratch array

    def scratch_for(self, stream_ptr: int) -> int:
        """The device pointer of the scratch buffer used on this CUDA stream."""
        got = self.scratches.get(stream_ptr)
        if got is None:
            got = self.scratches[stream_ptr] = cupy.empty(self.scratch_size, dtype=self.scratch_dtype)
        return int(got.data.ptr)

    def call(self, inputs, outs, hit: bool = True, stream=None) -> None:
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        scratch = self.scratch_for(stream.ptr)
        for p in (self, *self.then):
            p._launch_one(inputs, outs[0], scratch, stream, hit)


def _built_step(spec, ints: dict, primitive: str) -> Optional[tuple]:
    """(step, its loaded kernel) of ``spec`` with these integer arguments, or None where the
    CUDA dialect cannot express it or it has no build."""
    from .reductions import step_for

    step = step_for(spec, ints, primitive)
    if isinstance(step, tuple):
        return None
    try:
        return step, step.entry()
    except kernel_registry.BuildError:
        return None


def sequence_of(launches: list, primitive: str, out_shape, out_dtype, scratch_size: int,
                scratch_dtype) -> Optional[PlanSequence]:
    """The ``PlanSequence`` of ``launches`` (``common.reductions.gpu_launches``: (spec,
    ints, source, destination) each, buffers ``x`` the input, ``part`` the scratch, ``out``
    the output), or None where a kernel cannot be expressed or built (the rule's
    ``run_steps`` then notes the fallback)."""
    made = []
    for spec, ints, src, dst in launches:
        built = _built_step(spec, ints, primitive)
        if built is None:
            return None
        step, entry = built
        # the kernel's buffers as run_steps binds them: ``x`` the source, ``out`` the
        # destination, ``part`` (the parts kernel's own) the scratch
        bound = {"part": "part", "x": src, "out": dst}
        inputs = {k: 0 if v == "x" else SCRATCH for k, v in bound.items() if v != "out"}
        made.append((step, entry, inputs, next((k for k, v in bound.items() if v == "out"), None)))
    return PlanSequence(made[0], made[1:], scratch_size, scratch_dtype, out_shape, out_dtype,
                        primitive)


def plan_of(spec, ints: dict, primitive: str, inputs: dict, consts: dict, out_shape,
            out_dtype) -> Optional[KernelPlan]:
    """The plan of ``spec``'s kernel with these integer arguments (its ``Step`` made once),
    or None where the CUDA dialect cannot express it or it has no build (the rule's
    ``run_steps`` then notes the fallback)."""
    built = _built_step(spec, ints, primitive)
    if built is None:
        return None
    step, entry = built
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
