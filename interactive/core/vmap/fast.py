"""Batching rules of MLX's fast primitives.

MLX batches them as ``Custom::vmap`` does: its fallback composition, vmapped. The common
cases stay one node of the primitive (its kernel): a mapped ``x`` under an unmapped weight /
bias is more rows (the mapped axis first), a mapped RoPE input with an unmapped offset is
more heads (the mapped axis second, so a per-batch offset keeps indexing axis 0).
Attention with q, k and v mapped (no mask) folds the mapped axis into the batch.
Everything else is the composition (``fast.*_fallback``) batched.
"""

from __future__ import annotations

from ..array import array
from ..device import resolve_stream
from ..primitive import Primitive
from .registry import defvmap, move_to


def _composed(fallback, n_out: int):
    def rule(inputs, vaxes, primals, outputs, **params):
        from .api import vmap

        axes = tuple(a if a >= 0 else None for a in vaxes)
        if all(a is None for a in axes):  # nothing mapped (a custom rule said None): unbatched
            out = fallback(*inputs, **params)
            out = list(out) if isinstance(out, (list, tuple)) else [out]
            return out, [-1] * n_out
        out = vmap(lambda *a: fallback(*a, **params), in_axes=axes)(*inputs)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        return out, [0] * n_out
    return rule


def _norm(name: str, fallback):
    """The batching rule of norm ``name``: the primitive over a batch mapped on its input
    alone, else ``fallback`` (MLX's composition) batched."""
    composed = _composed(fallback, 1)

    def rule(inputs, vaxes, primals, outputs, *, eps):
        x, ax = inputs[0], vaxes[0]
        if ax >= 0 and all(a < 0 for a in vaxes[1:]):
            x = move_to(x, ax, 0)
            prim = Primitive(name, resolve_stream(None), eps=eps)
            return [array._make1(tuple(x.shape), outputs[0].dtype, prim, [x] + list(inputs[1:]))], [0]
        return composed(inputs, vaxes, primals, outputs, eps=eps)
    return rule


def _rope(inputs, vaxes, primals, outputs, **params):
    from .. import fast

    if vaxes[0] >= 0 and all(a < 0 for a in vaxes[1:]):
        x = move_to(inputs[0], vaxes[0], 1)
        return [fast._record_rope([x] + list(inputs[1:]), None, **params)], [1]
    return _composed(fast._rope_fallback, 1)(inputs, vaxes, primals, outputs, **params)


def _sdpa(inputs, vaxes, primals, outputs, **params):
    """A mapped axis over unmapped inputs elsewhere stays one node: q, k and v mapped on the
    same footing fold into the batch axis (mask and sinks unmapped), else the composition."""
    from .. import fast, ops

    q, k, v = inputs[:3]
    if all(a >= 0 for a in vaxes[:3]) and all(a < 0 for a in vaxes[3:]) and not params["has_mask"]:
        q, k, v = (move_to(x, a, 0) for x, a in zip((q, k, v), vaxes[:3]))
        n = q.shape[0]
        flat = [ops.flatten(x, 0, 1) for x in (q, k, v)]
        prim = Primitive("ScaledDotProductAttention", resolve_stream(None), **params)
        o = flat[0].shape[:3] + (flat[2].shape[3],)
        out = array._make1(tuple(o), outputs[0].dtype, prim, flat + list(inputs[3:]))
        return [ops.unflatten(out, 0, (n, q.shape[1]))], [0]
    return _composed(fast._sdpa_fallback, 1)(inputs, vaxes, primals, outputs, **params)


def _register() -> None:
    from .. import fast
    from ..autodiff.fast import layer_vjp_fallback, rms_vjp_fallback

    defvmap("RMSNorm", _norm("RMSNorm", fast._rms_norm_fallback))
    defvmap("LayerNorm", _norm("LayerNorm", fast._layer_norm_fallback))
    defvmap("RoPE", _rope)
    defvmap("ScaledDotProductAttention", _sdpa)
    defvmap("RMSNormVJP", _composed(lambda x, w, g, eps: rms_vjp_fallback(x, w, g, eps=eps), 2))
    defvmap("LayerNormVJP", _composed(lambda x, w, b, g, eps: layer_vjp_fallback(x, w, b, g, eps=eps), 3))


_register()
