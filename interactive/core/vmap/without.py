"""Primitives with no batching rule, and why (nothing can be mapped through them)."""

from __future__ import annotations

from .registry import without

without("Arange", "no inputs: never on a path from a mapped argument (MLX has no vmap for "
        "Arange either)")
without("Placeholder", "a trace's stand-in for an argument: vmap's own tracers are "
        "Placeholders, replaced by the batched arguments, never batched themselves")
without("Depends", "MLX has no vmap for Depends: raises [Primitive::vmap] Not implemented for "
        "Depends.")
