"""Which attention kernel a ``ScaledDotProductAttention`` call runs, and its integer
arguments, from its inputs' layouts (MLX's ``backend/metal/scaled_dot_product_attention.cpp``
picks the same way: the vector kernel for query lengths up to 8, the tiled one above).

The kernels take any batch / head / sequence strides (a transposed ``(B, L, H, D)`` view
included) with unit-stride head rows; an input whose head rows are not unit-stride is copied
first, as MLX's backend copies it (``copy_unless(is_matrix_contiguous, ...)``). The mask
(broadcast to ``(B, H, L, kL)``) is read through its strides, 0 included. Strides are in
elements; the output is row-major ``(B, H, L, D)``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..codegen.attention_kernels import HEAD_MAX, VECTOR_MAX_L, SdpaSpec
from .norms import elem_strides
from .reductions import Call

KERNEL_DTYPES = ("float16", "bfloat16", "float32")


def why_not(q, k, v) -> Optional[str]:
    """Why no attention kernel takes these inputs (None: one does)."""
    name = np.dtype(q.dtype).name
    if name not in KERNEL_DTYPES:
        return f"no generated attention kernel for {name} values"
    D = q.shape[-1]
    if not (0 < D <= HEAD_MAX) or v.shape[-1] != D or k.shape[-1] != D:
        return f"no generated attention kernel for head sizes {D} / {v.shape[-1]}"
    if 0 in q.shape or 0 in k.shape:
        return "an empty input"
    return None


def sdpa_call(dtype, q_shape: tuple, q_strides: tuple, k_shape: tuple, k_strides: tuple,
              v_strides: tuple, mask: str, mask_strides: Optional[tuple], causal: bool,
              sinks: bool) -> Call:
    """The kernel and integer arguments of one call (strides in elements, each input's last
    stride 1; ``mask``: ``none``, ``bool`` or ``add``)."""
    B, H, L, D = (int(n) for n in q_shape)
    Hk, kL = int(k_shape[1]), int(k_shape[2])
    mode = "vector" if L <= VECTOR_MAX_L else "full"
    ints = {"B": B, "H": H, "Hk": Hk, "L": L, "kL": kL,
            "qsb": q_strides[0], "qsh": q_strides[1], "qsl": q_strides[2],
            "ksb": k_strides[0], "ksh": k_strides[1], "ksl": k_strides[2],
            "vsb": v_strides[0], "vsh": v_strides[1], "vsl": v_strides[2]}
    if mask != "none":
        ints.update(zip(("msb", "msh", "msl", "msk"), mask_strides))
    spec = SdpaSpec(mode, np.dtype(dtype).name, D, mask, causal, sinks)
    return Call(spec, ints, out_shape=(B, H, L, D), out_dtype=np.dtype(dtype))


def call_in_place(q, k, v, *rest, causal, has_mask, has_sinks) -> Optional[Call]:
    """``sdpa_call`` for inputs a kernel reads where they are: unit-stride head rows, a mask
    of whole element strides (an additive one of the inputs' dtype), sinks contiguous in the
    inputs' dtype; None where the rule copies first or falls back (``why_not``). Each
    runtime's plan asks this (cpu/fast_kernels.py ``sdpa_plan``, cuda/attention.py
    ``vector_plan``)."""
    if why_not(q, k, v):
        return None
    sts = [elem_strides(a) for a in (q, k, v)]
    if any(st is None or st[-1] != 1 for st in sts):
        return None
    kind, mst = "none", None
    if has_mask:
        mask = rest[0]
        kind = "bool" if mask.dtype == np.bool_ else "add"
        mst = elem_strides(mask)
        if mst is None or (kind == "add" and mask.dtype != q.dtype):
            return None
    if has_sinks and (rest[-1].dtype != q.dtype or not rest[-1].flags.c_contiguous):
        return None
    return sdpa_call(q.dtype, q.shape, sts[0], k.shape, sts[1], sts[2], kind, mst, causal,
                     has_sinks)
