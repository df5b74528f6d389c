"""Which fast-primitive kernel a call runs, and its integer arguments, from its inputs'
layouts (every runtime launches the same ``NormSpec`` with these arguments).

RMSNorm / LayerNorm take rows whose leading axes collapse to one stride and any column
stride (``row``: unit; ``strided``); an input whose leading axes do not collapse is copied
first, as MLX's backends copy it (``set_output`` in ``backend/metal/normalization.cpp``).
The VJPs take row-contiguous ``x`` and ``g`` (MLX copies them, ``check_input``) in groups of
rows. RoPE takes MLX's (B, H, L, D) view with any strides where its heads collapse.
Strides are in elements; a weight / bias of MLX's scalar stand-in has none.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from ..codegen.norm_kernels import ROPE_HALF_MAX, VJP_GROUPS, NormSpec
from ..primitives import REGISTRY
from ..rules.fast import rope_bhld
from .reductions import Call
from .strides import collapse, elem_strides  # noqa: F401  (elem_strides: the planners' too)

# the primitives whose definitions name these kernels (``PrimitiveDef.kernel``) -> the kernel
NORMS = {n: d.kernel for n, d in REGISTRY.items() if d.kernel in ("rms", "layer_norm")}
VJPS = {n: d.kernel for n, d in REGISTRY.items() if d.kernel in ("vjp_rms", "vjp_layer_norm")}
PRIMITIVES = (*NORMS, *VJPS, *(n for n, d in REGISTRY.items() if d.kernel == "rope"))


def _float(dtype) -> Optional[str]:
    dtype = np.dtype(dtype)
    if dtype.kind != "f" and dtype.name != "bfloat16":
        return f"no generated kernel for {dtype} values"
    return None


@functools.lru_cache(maxsize=4096)  # asked on every call, per layout
def norm_call(name: str, dtype, shape: tuple, strides: tuple, vec_strides: tuple) -> Call:
    """RMSNorm / LayerNorm of ``x`` (``shape`` / ``strides``) with weight (and bias) strides
    ``vec_strides`` (None: MLX's scalar stand-in, no weight / bias). ``copy``: the leading
    axes do not collapse, the caller makes ``x`` row-contiguous and asks again."""
    cols = int(shape[-1])
    kept = collapse(list(zip(shape[:-1], strides[:-1])))
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    if len(kept) > 1:
        return Call(None, {}, out_shape=tuple(shape), out_dtype=np.dtype(dtype), copy=True)
    sc = int(strides[-1]) if cols > 1 else 1
    ws = vec_strides[0]
    ints = {"rows": rows, "cols": cols, "sr": kept[0][1] if kept else 0, "sc": sc,
            "ws": ws or 0}
    family = REGISTRY[name].kernel
    has_b = False
    if family == "layer_norm":
        ints["bs"] = vec_strides[1] or 0
        has_b = vec_strides[1] is not None
    spec = NormSpec(family, np.dtype(dtype).name, "row" if sc == 1 else "strided",
                    ws is not None, has_b)
    return Call(spec, ints, out_shape=tuple(shape), out_dtype=np.dtype(dtype))


@functools.lru_cache(maxsize=4096)  # asked on every call, per layout
def vjp_call(name: str, dtype, shape: tuple, vec_strides: tuple, groups: int = VJP_GROUPS) -> Call:
    """RMSNormVJP / LayerNormVJP over row-contiguous ``x`` and ``g``: ``groups`` groups of
    rows at most, each leaving its rows' weight / bias gradients in one row of ``part``."""
    cols = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    rpg = max(1, -(-rows // max(1, groups)))
    ints = {"rows": rows, "cols": cols, "ws": vec_strides[0] or 0, "rpg": rpg,
            "groups": -(-rows // rpg)}
    family = REGISTRY[name].kernel
    has_b = family == "vjp_layer_norm" and vec_strides[1] is not None
    spec = NormSpec(family, np.dtype(dtype).name, "row", vec_strides[0] is not None, has_b)
    return Call(spec, ints, out_shape=tuple(shape), out_dtype=np.dtype(dtype))


@functools.lru_cache(maxsize=4096)  # asked on every call, per layout
def rope_call(dtype, shape: tuple, strides: tuple, offset_size: int, offset_stride: int,
              *, dims: int, traditional: bool, forward: bool, **_) -> Call:
    """RoPE over MLX's (B, H, L, D) view of ``x``; ``copy`` when its heads do not collapse to
    one stride; a string when no kernel takes it."""
    if dims // 2 > ROPE_HALF_MAX:
        return f"no generated kernel for more than {2 * ROPE_HALF_MAX} rotated features"
    B, H, L, D = rope_bhld(shape)
    if len(shape) == 3:
        sb, sh, sl, sd = strides[0], 0, strides[1], strides[2]
    else:
        heads = collapse(list(zip(shape[1:-2], strides[1:-2])))
        if len(heads) > 1:
            return Call(None, {}, out_shape=tuple(shape), out_dtype=np.dtype(dtype), copy=True)
        sb, sh, sl, sd = strides[0], heads[0][1] if heads else 0, strides[-2], strides[-1]
    ints = {"B": B, "H": H, "L": L, "D": D, "dims": dims, "sb": sb, "sh": sh, "sl": sl, "sd": sd,
            "os": offset_stride if offset_size > 1 else 0}
    spec = NormSpec("rope", np.dtype(dtype).name, "strided", traditional=traditional, forward=forward)
    return Call(spec, ints, out_shape=tuple(shape), out_dtype=np.dtype(dtype))


def why_not(dtype, *arrays) -> Optional[str]:
    """Why no kernel takes these inputs (their dtype, strides that are not whole elements)."""
    why = _float(dtype)
    if why:
        return why
    for a in arrays:
        if a is not None and elem_strides(a) is None:
            return "no generated kernel for strides that are not whole elements"
    return None
