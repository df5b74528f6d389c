"""MLX's reduction primitives as MSL on the Metal runtime: the loop-IR kernels of
``codegen/reduce_kernels.py`` rendered by the Metal dialect (a threadgroup per row with
``simd_sum`` / lane exchanges and threadgroup memory, 32 x 8 groups for columns, online
softmax), one library and pipeline per kernel name, encoded on the node's queue; the
layout picks the kernel as on the CPU and CUDA (``kernels/common/reductions.py``; a strided
input is bound as a contiguous copy, as the runtime binds every buffer). A call no kernel
takes (float64, complex, CumLogAddExp) runs the CPU rule, recorded as a fallback."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import timeline
from ..codegen.c_ops import Unsupported
from ..common import reductions as plan
from ..fallback import run_rule
from .kernels import msl as _msl

def run(be: Any, queue: Any, prim_name: str, a: np.ndarray, out, kw: dict):
    """``prim_name`` on ``a`` as Metal kernels on ``queue`` (the node's), into ``out`` (the
    evaluator's buffer) when it is Metal memory of the result's shape and dtype."""
    from .backend import device

    if a.size and not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    call = plan.call_for(prim_name, a.dtype, a.shape, a.itemsize, a.strides, kw) if a.size else \
        "an empty input"
    steps = [] if isinstance(call, str) else plan.gpu_launches(call)
    why = call if isinstance(call, str) else next(
        (str(_msl(s)) for s, *_ in steps if isinstance(_msl(s), Unsupported)), None)
    if why is not None:
        queue.synchronize()  # (the host reads the queue's results)
        return run_rule(prim_name, why, np, (a,), kw, out, device="gpu", runtime="cpu")

    def metal_array(shape, dt):
        """The allocator's memory when it is Metal's (its cache may hold adopted host
        arrays), else a new shared buffer."""
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        v = be.allocator.malloc(max(n, 1)).view(n, np.dtype(dt), tuple(shape))
        if device().find(v) is None:
            v = device().new_buffer(max(n, 1))[:n].view(np.dtype(dt)).reshape(tuple(shape))
        return v

    given = (out is not None and out.shape == call.out_shape and out.dtype == call.out_dtype
             and out.flags.c_contiguous and device().find(out) is not None)
    res = out if given else metal_array(call.out_shape, call.out_dtype)
    bufs = {"x": a, "out": res}
    if plan.gpu_part_size(call):
        bufs["part"] = metal_array((plan.gpu_part_size(call),), call.part_dtype)
    for spec, ints, src, dst in steps:
        k = spec.kernel(gpu=True)
        b = {**bufs, "x": bufs[src], "out": bufs[dst]}
        arrays = {n: v for n, v in call.arrays.items()}
        args = plan.arguments(k.params, b, ints, arrays)
        buffers = {i: (np.array([v], np.int64) if isinstance(v, int) else v)
                   for i, v in enumerate(args)}
        outs = {i for i, p in enumerate(k.params) if p.kind == "out"}
        groups, threads = k.launch(ints)
        pso = device().pipeline(spec.name, spec.name, _msl(spec))
        t0 = timeline.now() if timeline.enabled else 0
        queue.dispatch(pso, buffers, (groups * threads, 1, 1), (threads, 1, 1), outputs=outs)
        if t0:
            timeline.add("kernel_launch", t0, timeline.now(), name=spec.name, device="gpu",
                         detail={"runtime": "metal", "variant": spec.layout, "primitive": prim_name,
                                 "grid": groups, "block": threads})
    if not given:  # the evaluator adopts or copies a result it did not allocate at once
        queue.synchronize()
    return res


def rule(be: Any, prim_name: str) -> Callable:
    def run_here(xp, a, out=None, **kw):
        from .backend import _tls

        return run(be, _tls.queue, prim_name, a, out, kw)
    return run_here
