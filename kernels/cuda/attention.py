"""MLX's ``ScaledDotProductAttention`` on an NVIDIA GPU.

Decoding (query length up to 8, MLX's ``sdpa_vector``): ``codegen/attention_cuda.py``'s
kernel, compiled by NVRTC through the fused kernels' cache (``compiled.get_kernel``:
memory, disk, ``kernel_cache()``), one launch on the node's CUDA stream, as MLX's CUDA
backend runs ``kernel_sdpav_1pass`` (mlx/backend/cuda/scaled_dot_product_attention.cu).
The kernel reads the inputs through their strides with unit-stride head rows (others are
copied first, as MLX copies them); the mask (broadcast to (B, H, L, kL)) through its own.

Longer queries run the array-module rule (``rules/fast.py``: blocks of query rows, two
matmuls and the softmax passes per block; MLX's CUDA backend runs cuDNN's fused attention
there) with a block of up to ``SCORES`` float32 scores: one block for most prompts, so the
passes are few large launches instead of tens of small ones. What the kernel does not take
(a head size above 256, float64) runs that rule too, recorded as a
``kernel_fallback`` with the reason.
"""

from __future__ import annotations

import numpy as np

from .. import timeline
from ..codegen.attention_cuda import THREADS, params, takes, vector_source
from ..codegen.attention_kernels import VECTOR_MAX_L
from ..common import attention
from ..common.norms import elem_strides
from .. import kernel_registry
from ..primitives import REGISTRY, by_kernel
from . import compiled
from .reductions import launch_recorded

SCORES = 1 << 28  # float32 scores of one query block of the array-module rule (1 GiB)
NAME = "ScaledDotProductAttention"


def _composed(xp, ins, kw, why=None):
    t0 = timeline.now() if timeline.enabled and why else 0
    out = REGISTRY[NAME].rule(xp, *ins, scores=SCORES, **kw)
    if t0:
        timeline.add("kernel_fallback", t0, timeline.now(), name=NAME, device="gpu",
                     detail={"reason": why, "runtime": "cupy", "primitive": NAME})
    return out


def _unit_rows(a):
    import cupy

    st = elem_strides(a)
    return a if st is not None and st[-1] == 1 else cupy.ascontiguousarray(a)


def rule(xp, q, k, v, *rest, scale, causal, has_mask, has_sinks):
    """The vector kernel for decoding, else the array-module rule in large blocks."""
    import cupy

    kw = dict(scale=scale, causal=causal, has_mask=has_mask, has_sinks=has_sinks)
    ins = (q, k, v, *rest)
    if q.shape[2] > VECTOR_MAX_L:
        return _composed(xp, ins, kw)
    why = attention.why_not(q, k, v)
    if why:
        return _composed(xp, ins, kw, why)
    q, k, v = _unit_rows(q), _unit_rows(k), _unit_rows(v)
    mask = rest[0] if has_mask else None
    kind = "none" if mask is None else ("bool" if mask.dtype == np.bool_ else "add")
    mst = None
    if mask is not None:
        if kind == "add" and mask.dtype != q.dtype:
            mask = mask.astype(q.dtype)
        mst = elem_strides(mask)
        if mst is None:
            mask = cupy.ascontiguousarray(mask)
            mst = elem_strides(mask)
    call = attention.sdpa_call(q.dtype, q.shape, elem_strides(q), k.shape, elem_strides(k),
                               elem_strides(v), kind, mst, causal, has_sinks)
    spec = call.spec
    if not takes(spec):
        return _composed(xp, ins, kw, f"no CUDA attention kernel for head size {spec.head} "
                                      f"in {spec.dtype}")
    try:
        entry = compiled.get_kernel(spec.name, spec.layout, lambda: vector_source(spec),
                                    key=spec.name, tape=spec)
    except kernel_registry.BuildError as e:
        kernel_registry.note_fallback(spec.name, spec.layout, "", str(e), tape=spec)
        return _composed(xp, ins, kw, str(e))
    out = cupy.empty(call.out_shape, dtype=call.out_dtype)
    bufs = {"q": q, "k": k, "v": v, "out": out}
    if mask is not None:
        bufs["mask"] = mask
    if has_sinks:
        bufs["sinks"] = cupy.ascontiguousarray(rest[-1].astype(q.dtype, copy=False))
    args = []
    for kind_, name in params(spec):
        if kind_ in ("in", "out"):
            args.append(bufs[name])
        elif kind_ == "int":
            args.append(np.int64(call.ints[name]))
        else:
            args.append(np.float32(scale))
    B, H, L = call.out_shape[:3]
    launch_recorded(entry, B * H * L, THREADS, tuple(args), spec.name,
                    {"variant": spec.layout, "primitive": NAME})
    return out


# primitive name -> rule, for the definition that names this kernel (PrimitiveDef.kernel)
RULES: dict = by_kernel({"attention": rule})
