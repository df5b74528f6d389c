"""Batching of the quantization primitives. MLX batches only ``Quantize`` (a Custom
primitive: its fallback composition is batched, ``mlx/fast.cpp``); the matmuls raise NYI
(``QuantizedMatmul::vmap``, ``GatherQMM::vmap`` in ``mlx/primitives.cpp``) or have no rule,
and so do the e4m3 conversions."""

from __future__ import annotations

from ..device import resolve_stream
from ..ops.quantized import _affine_quantize, affine_quantize_composed
from .custom import default_vmap
from .registry import defvmap, without


def _quantize(inputs, vaxes, primals, outputs, *, group_size, bits, mode):
    if vaxes[0] < 0:  # nothing mapped: the op itself
        return _affine_quantize(inputs[0], group_size, bits, resolve_stream(None)), [-1] * 3

    def fun(arrs: list) -> list:
        return affine_quantize_composed(arrs[0], group_size, bits, resolve_stream(None))

    outs, axes = default_vmap(fun, 3)(list(inputs), list(vaxes))
    return list(outs), list(axes)


defvmap("Quantize", _quantize)

without("QuantizedMatmul", "MLX has no vmap for QuantizedMatmul: raises "
        "[QuantizedMatmul::vmap] NYI")
without("GatherQMM", "MLX has no vmap for GatherQMM: raises GatherQMM::vmap NYI")
for _name in ("QQMatmul", "GatherQQMM", "ToFP8", "FromFP8"):
    without(_name, f"MLX has no vmap for {_name}: raises [Primitive::vmap] Not implemented "
            f"for {_name}.")
