"""MLX's fast primitives as generated C on the CPU: ``RMSNorm``, ``LayerNorm``,
``RMSNormVJP``, ``LayerNormVJP``, ``RoPE`` (kernels of ``codegen/norm_kernels.py``) and
``ScaledDotProductAttention`` (``codegen/attention_kernels.py``: the vector kernel for query
lengths up to 8, the tiled one above; float64 and head sizes past 256 take the rule).

``RULES`` are the CPU backend's rules for them (``Backend.kernel_rules``): the inputs'
layouts pick the kernel and its arguments (``kernels/common/norms.py``), the kernel is built
once through the kernel cache (``compiler.get_kernel``: in ``kernel_cache()``, on the
timeline, on disk) and called. What no kernel takes (integer or complex values, strides
that are not whole elements, RoPE past 2048 rotated features, no compiler, a failed build)
runs the primitive's array-module rule, recorded on the timeline as a ``kernel_fallback``
with why. The VJPs' weight / bias gradients are the column sums of the kernel's per-group
partial rows (float32), rounded to the weight's dtype.

RMSNorm, LayerNorm, RoPE and ScaledDotProductAttention are ``KernelRule``s
(``kernels/kernel_call.py``): their call is planned once per layout and parameters (the
kernel's entry and its argument vector, with the ``fp`` parameter buffer and RoPE's
frequencies), and the eval loop calls the plan without Python code (attention's through
its rule: the primitive takes no ``out`` buffer); what a plan does not take (a copy first,
a fallback, RoPE's ``freqs``, an offset that is not int32) runs the rule below it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import timeline
from ..common import attention
from ..common import norms as plan
from ..fallback import run_rule
from ..kernel_call import KernelRule, kernel_call, takes_out
from ..common.reductions import THREADS, arguments
from ..primitives import by_kernel
from ..rules.fast import inv_freqs
from . import compiler
from .primitive_kernels import _entry, call_recorded

_SMALL = 1 << 15  # elements below which the kernel runs holding the GIL (no release cost)
CPU_VJP_GROUPS = 4 * THREADS  # the VJP's row groups on the CPU: a few per core, few partials


def _fallback(prim_name: str, why: str, xp, ins, kw, out=None, variant: str = ""):
    return run_rule(prim_name, why, xp, ins, kw, out, variant=variant)


def _run(spec, prim_name: str, bufs: dict, ints: dict, size: int) -> None:
    ptrs = arguments(spec.kernel_params(), {k: v.ctypes.data for k, v in bufs.items()}, ints, {})
    call_recorded(_entry(spec), spec, prim_name, ptrs, size < _SMALL)


def _built(spec):
    """The loaded kernel, or the BuildError's text (noted as the kernel's fallback)."""
    entry = _entry(spec)
    if isinstance(entry, compiler.BuildError):
        compiler.note_fallback(spec.name, spec.layout, "", str(entry), tape=spec)
        return str(entry)
    return None


def _fp(value: float) -> np.ndarray:
    return np.array([value], dtype=np.float32)


def _vec_stride(v):
    """A weight / bias input's stride in elements (None: MLX's scalar stand-in)."""
    return None if v.ndim == 0 else plan.elem_strides(v)[0]


def _norm_rule(prim_name: str) -> Callable:
    def rule(xp, x, *vecs, out=None, eps):
        ins = (x, *vecs)
        why = None if x.size else "an empty input"
        why = why or (None if x.ndim else "a 0-d input") or plan.why_not(x.dtype, *ins)
        if why:
            return _fallback(prim_name, why, xp, ins, {"eps": eps}, out)
        call = plan.norm_call(prim_name, x.dtype, x.shape, plan.elem_strides(x),
                              tuple(_vec_stride(v) for v in vecs))
        if call.copy:
            x = np.ascontiguousarray(x)
            call = plan.norm_call(prim_name, x.dtype, x.shape, plan.elem_strides(x),
                                  tuple(_vec_stride(v) for v in vecs))
        why = _built(call.spec)
        if why:
            return _fallback(prim_name, why, xp, ins, {"eps": eps}, out, call.spec.layout)
        if not takes_out(out, call.out_shape, call.out_dtype, (x,)):
            out = np.empty(call.out_shape, dtype=call.out_dtype)
        bufs = {"x": x, "w": vecs[0], "fp": _fp(eps), "out": out}
        if len(vecs) > 1:
            bufs["b"] = vecs[1]
        _run(call.spec, prim_name, bufs, call.ints, x.size)
        return out
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
        x, g = np.ascontiguousarray(x), np.ascontiguousarray(g)
        call = plan.vjp_call(prim_name, x.dtype, x.shape, tuple(_vec_stride(v) for v in vecs),
                             CPU_VJP_GROUPS)
        why = _built(call.spec)
        if why:
            return _fallback(prim_name, why, xp, ins, {"eps": eps}, variant="row")
        gx = np.empty(x.shape, dtype=x.dtype)
        cols, groups = call.ints["cols"], call.ints["groups"]
        bufs = {"x": x, "w": vecs[0], "g": g, "fp": _fp(eps), "gx": gx}
        parts = {}
        for name, v in zip(("part", "partb"), vecs):
            if v.ndim:
                parts[name] = bufs[name] = np.empty((groups, cols), dtype=np.float32)
        _run(call.spec, prim_name, bufs, call.ints, x.size)
        grads = [gx]
        for name, v in zip(("part", "partb"), vecs):
            grads.append(parts[name].sum(axis=0).astype(v.dtype) if v.ndim else np.zeros_like(v))
        return tuple(grads)
    return rule


def rope_rule(xp, x, offset, *freqs, dims, traditional, base, scale, forward, out=None):
    kw = dict(dims=dims, traditional=traditional, base=base, scale=scale, forward=forward)
    ins = (x, offset, *freqs)
    why = None if x.size else "an empty input"
    why = why or plan.why_not(x.dtype, x)
    call = why or plan.rope_call(x.dtype, x.shape, plan.elem_strides(x), offset.size,
                                 plan.elem_strides(offset)[0] if offset.ndim else 0, **kw)
    if isinstance(call, str):
        return _fallback("RoPE", call, xp, ins, kw, out)
    if call.copy:
        x = np.ascontiguousarray(x)
        call = plan.rope_call(x.dtype, x.shape, plan.elem_strides(x), offset.size,
                              plan.elem_strides(offset)[0] if offset.ndim else 0, **kw)
    why = _built(call.spec)
    if why:
        return _fallback("RoPE", why, xp, ins, kw, out, "strided")
    if not takes_out(out, call.out_shape, call.out_dtype, (x,)):
        out = np.empty(call.out_shape, dtype=call.out_dtype)
    off = offset if offset.dtype == np.int32 else offset.astype(np.int32)
    if off.ndim and off.size > 1 and off.strides[0] % 4:
        off = np.ascontiguousarray(off)
    ints = dict(call.ints)
    if off is not offset and off.ndim:
        ints["os"] = off.strides[0] // 4 if off.size > 1 else 0
    bufs = {"x": x, "off": off, "inv": inv_freqs(np, dims, base, freqs[0] if freqs else None),
            "fp": _fp(scale), "out": out}
    _run(call.spec, "RoPE", bufs, ints, x.size)
    return out


def _rows_unit(a):
    """``a`` with unit-stride rows (MLX copies an input whose last stride is not 1)."""
    st = plan.elem_strides(a)
    return a if st is not None and (a.shape[-1] == 1 or st[-1] == 1) else np.ascontiguousarray(a)


def sdpa_rule(xp, q, k, v, *rest, out=None, scale, causal, has_mask, has_sinks):
    """``ScaledDotProductAttention`` through ``codegen/attention_kernels.py``'s kernels: the
    calls ``sdpa_plan`` takes no plan for (a copy first, a fallback). ``out`` is unused (the
    primitive writes no given buffer: a donated key / value would be read after a block
    wrote it)."""
    kw = dict(scale=scale, causal=causal, has_mask=has_mask, has_sinks=has_sinks)
    ins = (q, k, v, *rest)
    why = attention.why_not(q, k, v)
    if why:
        return _fallback("ScaledDotProductAttention", why, xp, ins, kw)
    q, k, v = _rows_unit(q), _rows_unit(k), _rows_unit(v)
    mask = rest[0] if has_mask else None
    kind = "none" if mask is None else ("bool" if mask.dtype == np.bool_ else "add")
    mst = None
    if mask is not None:
        mst = plan.elem_strides(mask)
        if mst is None:
            mask = np.ascontiguousarray(mask)
            mst = plan.elem_strides(mask)
    call = attention.sdpa_call(q.dtype, q.shape, plan.elem_strides(q), k.shape, plan.elem_strides(k),
                               plan.elem_strides(v), kind, mst, causal, has_sinks)
    why = _built(call.spec)
    if why:
        return _fallback("ScaledDotProductAttention", why, xp, ins, kw, variant=call.spec.layout)
    out = np.empty(call.out_shape, dtype=call.out_dtype)
    bufs = {"q": q, "k": k, "v": v, "fp": _fp(scale), "out": out}
    if mask is not None:
        bufs["mask"] = mask
    if has_sinks:
        bufs["sinks"] = np.ascontiguousarray(rest[-1])
    _run(call.spec, "ScaledDotProductAttention", bufs, call.ints, q.size + k.size * q.shape[2])
    return out


def _planned(spec, prim_name: str, names: tuple, consts: dict, ints: dict, size: int,
             out_shape, out_dtype):
    """The KernelCall of ``spec``'s kernel: ``names`` the kernel buffers a call's arrays go
    to (its inputs', then ``out``), ``consts`` the constant buffers; None where the kernel
    did not build (the rule notes why)."""
    entry = _entry(spec)
    if isinstance(entry, compiler.BuildError):
        return None
    params = spec.kernel_params()
    bufs = {**{n: 0 for n in names}, **{k: v.ctypes.data for k, v in consts.items()}}
    argv = arguments(params, bufs, ints, {})
    where = {p.name: i for i, p in enumerate(params)}
    slots = tuple(where.get(n, -1) for n in names)
    detail = {"runtime": "cpu", "variant": spec.layout, "primitive": prim_name, "tier": "kernel"}

    def note(t0: int, t1: int, arrays: tuple) -> None:
        timeline.add("kernel_launch", t0, t1, name=spec.name, device="cpu", detail=dict(detail))

    return kernel_call(entry, argv, slots, consts, size < _SMALL, note, out_shape, out_dtype)


def _norm_plan(prim_name: str) -> Callable:
    def planner(x, *vecs, eps):
        ins = (x, *vecs)
        if not x.size or not x.ndim or plan.why_not(x.dtype, *ins):
            return None
        call = plan.norm_call(prim_name, x.dtype, x.shape, plan.elem_strides(x),
                              tuple(_vec_stride(v) for v in vecs))
        if call.copy:
            return None
        names = ("x", "w", "b")[:len(ins)] + ("out",)
        return _planned(call.spec, prim_name, names, {"fp": _fp(eps)}, call.ints, x.size,
                        call.out_shape, call.out_dtype)
    return planner


def rope_plan(x, offset, *freqs, dims, traditional, base, scale, forward):
    if freqs or not x.size or plan.why_not(x.dtype, x) or offset.dtype != np.int32 or (
            offset.ndim and offset.size > 1 and offset.strides[0] % 4):
        return None
    kw = dict(dims=dims, traditional=traditional, base=base, scale=scale, forward=forward)
    call = plan.rope_call(x.dtype, x.shape, plan.elem_strides(x), offset.size,
                          plan.elem_strides(offset)[0] if offset.ndim else 0, **kw)
    if isinstance(call, str) or call.copy:
        return None
    consts = {"inv": inv_freqs(np, dims, base, None), "fp": _fp(scale)}
    return _planned(call.spec, "RoPE", ("x", "off", "out"), consts, call.ints, x.size,
                    call.out_shape, call.out_dtype)


def sdpa_plan(q, k, v, *rest, scale, causal, has_mask, has_sinks):
    """The attention kernel's call for inputs with unit-stride head rows, a mask of whole
    element strides and of the kernel's dtype, sinks contiguous in the inputs' dtype; None
    where the rule copies first or falls back."""
    call = attention.call_in_place(q, k, v, *rest, causal=causal, has_mask=has_mask,
                                   has_sinks=has_sinks)
    if call is None:
        return None
    names = ("q", "k", "v") + (("mask",) if has_mask else ()) + (("sinks",) if has_sinks else ())
    return _planned(call.spec, "ScaledDotProductAttention", names + ("out",), {"fp": _fp(scale)},
                    call.ints, q.size + k.size * q.shape[2], call.out_shape, call.out_dtype)


RULES: dict = {**{n: KernelRule(n, _norm_plan(n), _norm_rule(n)) for n in plan.NORMS},
               **{n: _vjp_rule(n) for n in plan.VJPS},
               **by_kernel({"rope": KernelRule("RoPE", rope_plan, rope_rule),
                            "attention": KernelRule("ScaledDotProductAttention", sdpa_plan,
                                                    sdpa_rule)})}
