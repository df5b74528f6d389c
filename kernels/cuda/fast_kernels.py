"""MLX's fast primitives as generated CUDA: ``RMSNorm``, ``LayerNorm``, ``RMSNormVJP``,
``LayerNormVJP``, ``RoPE``, the loop-IR kernels of ``codegen/norm_kernels.py`` rendered by
the CUDA dialect (a block per row, its 16-byte vectors kept in registers between the row's
passes where they fit: warp shuffles and shared memory merge the row's sums, then the block
writes the row 16 bytes at a time; RoPE: a block per (batch, position), its cos / sin in
shared memory, a thread per (head, pair)), compiled by NVRTC through the fused kernels' cache and launched on the node's CUDA
stream, with the layouts of ``kernels/common/norms.py`` (the CPU's). bfloat16 is read and
written in its own 16 bits (``BF16Array`` storage; float32 math, MLX's roundings: the
kernels' ``Round``), planned and launched from C as float32 is; where no plan takes a
bfloat16 call the rule runs on float32 copies, rounded once (``bfloat16.rule``'s way). The VJPs' weight / bias
gradients are CuPy's column sums of the kernel's per-group rows (MLX's ``gw_temp``, 512
groups). What no kernel takes, or NVRTC cannot build, runs the primitive's CuPy rule,
recorded on the timeline as a ``kernel_fallback`` with the reason.
"""

from __future__ import annotations

from typing import Callable, Optional

import cupy
import numpy as np

from .. import timeline
from ..common import norms as plan
from ..primitives import REGISTRY, by_kernel
from ..rules.fast import inv_freqs
from ..kernel_call import KernelRule
from . import bfloat16 as bf16
from .primitive_plans import fits, plan_of
from .reductions import _empty, fits as storage_fits, run_steps, step_for

_fps: dict = {}  # a float parameter's value -> its one-element device buffer
_invs: dict = {}  # (device, dims, base) -> RoPE's inverse frequencies on the device


def _fallback(prim_name: str, why: str, xp, ins, kw, out=None):
    t0 = timeline.now() if timeline.enabled else 0
    rule = REGISTRY[prim_name].rule
    res = rule(xp, *ins, **kw) if out is None else rule(xp, *ins, out=out, **kw)
    if t0:
        timeline.add("kernel_fallback", t0, timeline.now(), name=prim_name, device="gpu",
                     detail={"reason": why, "runtime": "cupy", "primitive": prim_name})
    return res


def _fp(value: float):
    got = _fps.get(value)
    if got is None:
        if len(_fps) > 256:
            _fps.clear()
        got = _fps[value] = cupy.asarray(np.array([value], np.float32))
    return got


def _inv_freqs(dims: int, base: float, freqs):
    """RoPE's inverse frequencies: computed once per (dims, base) and kept (three CuPy
    launches a call otherwise); ``freqs`` given: from them, each call."""
    if freqs is not None:
        return inv_freqs(cupy, dims, base, freqs)
    key = (cupy.cuda.runtime.getDevice(), int(dims), float(base))
    got = _invs.get(key)
    if got is None:
        if len(_invs) > 256:
            _invs.clear()
        got = inv_freqs(cupy, dims, base, None)
        cupy.cuda.get_current_stream().synchronize()  # other streams may read it next
        _invs[key] = got
    return got


def _launch(spec, prim_name: str, bufs: dict, ints: dict) -> Optional[str]:
    """One launch of ``spec``'s kernel (its ``Step`` made once per layout); the reason
    when it has no build."""
    return run_steps([(step_for(spec, ints, prim_name), None, None)], bufs, {}, prim_name)


def _vec_stride(v):
    return None if v.ndim == 0 else plan.elem_strides(v)[0]


def _norm_rule(prim_name: str) -> Callable:
    def rule(xp, x, *vecs, out=None, eps):
        ins = (x, *vecs)
        why = None if x.size and x.ndim else "an empty or 0-d input"
        why = why or plan.why_not(x.dtype, *ins)
        if why:
            return _fallback(prim_name, why, xp, ins, {"eps": eps}, out)
        vs = tuple(_vec_stride(v) for v in vecs)
        call = plan.norm_call(prim_name, x.dtype, x.shape, plan.elem_strides(x), vs)
        if call.copy:
            x = cupy.ascontiguousarray(x)
            call = plan.norm_call(prim_name, x.dtype, x.shape, plan.elem_strides(x), vs)
        res = out if fits(out, call.out_shape, call.out_dtype, (x,)) else \
            cupy.empty(call.out_shape, dtype=call.out_dtype)
        bufs = {"x": x, "w": vecs[0], "fp": _fp(float(eps)), "out": res}
        if len(vecs) > 1:
            bufs["b"] = vecs[1]
        why = _launch(call.spec, prim_name, bufs, call.ints)
        return _fallback(prim_name, why, xp, ins, {"eps": eps}, out) if why else res
    return rule


def _vjp_rule(prim_name: str) -> Callable:
    def rule(xp, x, *rest, eps):
        *vecs, g = rest
        ins = (x, *vecs, g)
        why = None if x.size and x.ndim else "an empty or 0-d input"
        why = why or plan.why_not(x.dtype, *ins) or (
            None if g.dtype == x.dtype else "a cotangent of another dtype")
        if why:
            return _fallback(prim_name, why, xp, ins, {"eps": eps})
        x, g = cupy.ascontiguousarray(x), cupy.ascontiguousarray(g)
        call = plan.vjp_call(prim_name, x.dtype, x.shape, tuple(_vec_stride(v) for v in vecs))
        cols, groups = call.ints["cols"], call.ints["groups"]
        gx = cupy.empty(x.shape, dtype=x.dtype)
        bufs = {"x": x, "w": vecs[0], "g": g, "fp": _fp(float(eps)), "gx": gx}
        for name, v in zip(("part", "partb"), vecs):
            if v.ndim:
                bufs[name] = cupy.empty((groups, cols), dtype=cupy.float32)
        why = _launch(call.spec, prim_name, bufs, call.ints)
        if why:
            return _fallback(prim_name, why, xp, ins, {"eps": eps})
        grads = [gx]
        for name, v in zip(("part", "partb"), vecs):
            grads.append(bufs[name].sum(axis=0).astype(v.dtype) if v.ndim else cupy.zeros_like(v))
        return tuple(grads)
    return rule


def rope_rule(xp, x, offset, *freqs, dims, traditional, base, scale, forward, out=None):
    kw = dict(dims=dims, traditional=traditional, base=base, scale=scale, forward=forward)
    ins = (x, offset, *freqs)
    why = None if x.size else "an empty input"
    why = why or plan.why_not(x.dtype, x)
    off = offset if offset.dtype == np.int32 else offset.astype(cupy.int32)
    off = cupy.ascontiguousarray(off.reshape(-1))
    call = why or plan.rope_call(x.dtype, x.shape, plan.elem_strides(x), off.size, 1, **kw)
    if isinstance(call, str):
        return _fallback("RoPE", call, xp, ins, kw, out)
    if call.copy:
        x = cupy.ascontiguousarray(x)
        call = plan.rope_call(x.dtype, x.shape, plan.elem_strides(x), off.size, 1, **kw)
    res = out if fits(out, call.out_shape, call.out_dtype, (x,)) else \
        cupy.empty(call.out_shape, dtype=call.out_dtype)
    bufs = {"x": x, "off": off, "inv": _inv_freqs(dims, base, freqs[0] if freqs else None),
            "fp": _fp(float(scale)), "out": res}
    why = _launch(call.spec, "RoPE", bufs, call.ints)
    return _fallback("RoPE", why, xp, ins, kw, out) if why else res


def _on_float32(rule: Callable) -> Callable:
    """``rule``, which takes the plans' ``BF16Array``s (``takes_bfloat16``: cuda/backend.py
    widens nothing): a bfloat16 call no plan took runs ``rule`` on float32 copies, its result
    rounded once (``bfloat16.rule``'s way), into a fresh array."""
    def run(xp, *ins, out=None, **kw):
        if any(type(a) is bf16.BF16Array for a in ins):
            return bf16.narrow(rule(xp, *[bf16.value(a) for a in ins], **kw))
        return rule(xp, *ins, out=out, **kw)

    run.takes_bfloat16 = True
    return run


def _norm_plan(prim_name: str) -> Callable:
    """A norm call's ``KernelPlan`` (one launch over ``x`` as it lies), or None: the rule."""
    def plan_call(x, *vecs, eps):
        if not (x.size and x.ndim) or plan.why_not(x.dtype, x, *vecs):
            return None
        call = plan.norm_call(prim_name, x.dtype, x.shape, plan.elem_strides(x),
                              tuple(_vec_stride(v) for v in vecs))
        if call.copy:
            return None
        names = {"x": 0, "w": 1, "b": 2} if len(vecs) > 1 else {"x": 0, "w": 1}
        return plan_of(call.spec, call.ints, prim_name, names, {"fp": _fp(float(eps))},
                       call.out_shape, call.out_dtype)
    return plan_call


def rope_plan(x, offset, *freqs, dims, traditional, base, scale, forward):
    """RoPE's ``KernelPlan`` for an int32 offset on the device and MLX's frequencies, or
    None: the rule (given ``freqs``, another offset type, a copy first)."""
    if freqs or not x.size or plan.why_not(x.dtype, x):
        return None
    if offset.dtype != np.int32 or not offset.flags.c_contiguous:
        return None
    kw = dict(dims=dims, traditional=traditional, base=base, scale=scale, forward=forward)
    call = plan.rope_call(x.dtype, x.shape, plan.elem_strides(x), offset.size, 1, **kw)
    if isinstance(call, str) or call.copy:
        return None
    return plan_of(call.spec, call.ints, "RoPE", {"x": 0, "off": 1},
                   {"inv": _inv_freqs(dims, base, None), "fp": _fp(float(scale))},
                   call.out_shape, call.out_dtype)


RULES: dict = {**{n: KernelRule(n, _norm_plan(n), _on_float32(_norm_rule(n)), storage_fits, _empty)
                  for n in plan.NORMS},
               **{n: _vjp_rule(n) for n in plan.VJPS},
               **by_kernel({"rope": KernelRule("RoPE", rope_plan, _on_float32(rope_rule),
                                               storage_fits, _empty)})}
