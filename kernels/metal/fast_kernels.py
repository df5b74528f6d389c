"""MLX's fast primitives as MSL on the Metal runtime: ``RMSNorm``, ``LayerNorm``,
``RMSNormVJP``, ``LayerNormVJP``, ``RoPE``, the loop-IR kernels of
``codegen/norm_kernels.py`` rendered by the Metal dialect (a threadgroup per row with
``simd_sum`` and threadgroup memory; RoPE's cos / sin in threadgroup memory), one library and
pipeline per kernel name, encoded on the node's queue with the layouts of
``kernels/common/norms.py`` (inputs bound as contiguous copies, as the runtime binds every
buffer). What no kernel takes (float64, integer values) runs the CPU rule, recorded as a
fallback."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import timeline
from ..codegen.c_ops import Unsupported
from ..common import norms as plan
from ..common.reductions import arguments
from ..fallback import run_rule
from ..rules.fast import inv_freqs
from .kernels import msl as _msl

def _call(prim_name: str, ins: tuple, kw: dict):
    """(the Call, its buffers by name besides the outputs) or the reason no kernel takes it."""
    x = ins[0]
    if not x.size or not x.ndim:
        return "an empty or 0-d input"
    why = plan.why_not(x.dtype, *ins[:1])
    if why:
        return why
    if prim_name in plan.NORMS:
        vecs = ins[1:]
        call = plan.norm_call(prim_name, x.dtype, x.shape, plan.elem_strides(x),
                              tuple(None if v.ndim == 0 else 1 for v in vecs))
        bufs = {"x": x, "w": vecs[0], "fp": np.array([kw["eps"]], np.float32)}
        if len(vecs) > 1:
            bufs["b"] = vecs[1]
    elif prim_name in plan.VJPS:
        *vecs, g = ins[1:]
        if g.dtype != x.dtype:
            return "a cotangent of another dtype"
        call = plan.vjp_call(prim_name, x.dtype, x.shape, tuple(None if v.ndim == 0 else 1 for v in vecs))
        bufs = {"x": x, "w": vecs[0], "g": g, "fp": np.array([kw["eps"]], np.float32)}
    else:
        off = ins[1].reshape(-1).astype(np.int32)
        call = plan.rope_call(x.dtype, x.shape, plan.elem_strides(x), off.size, 1, **kw)
        if isinstance(call, str):
            return call
        bufs = {"x": x, "off": off, "fp": np.array([kw["scale"]], np.float32),
                "inv": inv_freqs(np, kw["dims"], kw["base"], ins[2] if len(ins) > 2 else None)}
    msl = _msl(call.spec)
    return str(msl) if isinstance(msl, Unsupported) else (call, bufs)


def run(be: Any, queue: Any, prim_name: str, ins: tuple, out, kw: dict):
    """``prim_name`` on ``ins`` as one Metal kernel on ``queue`` (the node's)."""
    from .backend import device

    ins = tuple(np.ascontiguousarray(a) for a in ins)
    got = _call(prim_name, ins, kw)
    if isinstance(got, str):
        queue.synchronize()  # (the host reads the queue's results)
        return run_rule(prim_name, got, np, ins, kw, out, device="gpu", runtime="cpu")
    call, bufs = got

    def metal_array(shape, dt):
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        v = be.allocator.malloc(max(n, 1)).view(n, np.dtype(dt), tuple(shape))
        if device().find(v) is None:
            v = device().new_buffer(max(n, 1))[:n].view(np.dtype(dt)).reshape(tuple(shape))
        return v

    x = ins[0]
    vjp = prim_name in plan.VJPS
    name = "gx" if vjp else "out"
    given = (not vjp and out is not None and out.shape == call.out_shape
             and out.dtype == call.out_dtype and out.flags.c_contiguous
             and device().find(out) is not None)
    bufs[name] = out if given else metal_array(call.out_shape, call.out_dtype)
    vecs = ins[1:-1] if vjp else ()
    if vjp:
        for p, v in zip(("part", "partb"), vecs):
            if v.ndim:
                bufs[p] = metal_array((call.ints["groups"], call.ints["cols"]), np.float32)
    k = call.spec.kernel(gpu=True)
    args = arguments(k.params, bufs, call.ints, {})
    buffers = {i: (np.array([v], np.int64) if isinstance(v, int) else v) for i, v in enumerate(args)}
    outs = {i for i, p in enumerate(k.params) if p.kind == "out"}
    groups, threads = k.launch(call.ints)
    pso = device().pipeline(call.spec.name, call.spec.name, _msl(call.spec))
    t0 = timeline.now() if timeline.enabled else 0
    queue.dispatch(pso, buffers, (groups * threads, 1, 1), (threads, 1, 1), outputs=outs)
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=call.spec.name, device="gpu",
                     detail={"runtime": "metal", "variant": call.spec.layout,
                             "primitive": prim_name, "grid": groups, "block": threads})
    if not vjp:
        if not given:
            queue.synchronize()
        return bufs["out"]
    queue.synchronize()  # the weight / bias gradients: the partial rows' sums on the host
    grads = [bufs["gx"]]
    for p, v in zip(("part", "partb"), vecs):
        grads.append(bufs[p].sum(axis=0).astype(v.dtype) if v.ndim else np.zeros_like(v))
    return tuple(grads)


def rule(be: Any, prim_name: str) -> Callable:
    def run_here(xp, *ins, out=None, **kw):
        from .backend import _tls

        return run(be, _tls.queue, prim_name, ins, out, kw)
    return run_here
