"""GatherMM, BlockMaskedMM and SegmentedMM have no batching rule: MLX has none either
(``mlx/primitives.h`` declares no vmap for them; ``mx.vmap`` raises)."""

from __future__ import annotations

from .registry import without

for _name in ("GatherMM", "BlockMaskedMM", "SegmentedMM"):
    without(_name, f"MLX has no vmap for {_name}: raises [Primitive::vmap] Not implemented "
            f"for {_name}.")
