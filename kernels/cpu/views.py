"""The CPU's own rules for views whose array-module form costs more than the view: a
``Broadcast`` of a contiguous numpy array is one ``np.ndarray`` constructor with stride 0
along the broadcast dimensions (numpy's ``broadcast_to`` spends ~5 us in Python making the
same view). ``_views.c`` makes it in C, and the reshape family's and ``Transpose``'s views as
their definitions' rules make them (the array's own method) without a Python frame; the
eval loop calls those (``CpuBackend.kernel_rules``) where the extension is built."""

from __future__ import annotations

import numpy as np

from ..primitives import BROADCAST, REGISTRY


def broadcast(xp, a, *, shape):
    """``Broadcast``'s read-only view (``rules/shape.broadcast``'s, made directly)."""
    if type(a) is not np.ndarray:
        return xp.broadcast_to(a, shape)
    if a.ndim == 0:  # a scalar operand's (the common case): every stride 0
        strides = (0,) * len(shape)
    elif a.flags.c_contiguous:
        lead = len(shape) - a.ndim
        strides = (0,) * lead + tuple(0 if n == 1 and m != 1 else st
                                      for n, m, st in zip(a.shape, shape[lead:], a.strides))
    else:
        return xp.broadcast_to(a, shape)
    v = np.ndarray(shape, a.dtype, a, 0, strides)
    v.flags.writeable = False
    return v


def _rules() -> dict:
    """The broadcast family's primitives (MLX's Broadcast), found by their definitions'
    family; and where ``_views.c`` is built, its ``reshape`` and ``transpose`` for those whose
    definition's rule they do without a Python frame (the reshape family: Reshape,
    ExpandDims, Squeeze, Flatten, Unflatten; Transpose), found by the rule. Elsewhere those
    run their definition's rule, the array's own method (``rules/shape.py``)."""
    from ..rules import shape

    broadcast_rule, mine = broadcast, {}
    try:
        from . import _views
    except ImportError:
        pass
    else:
        _views.configure(np.ndarray)
        broadcast_rule, mine = _views.broadcast, {shape.reshape: _views.reshape,
                                                  shape.transpose: _views.transpose}
    return {**{n: broadcast_rule for n, d in REGISTRY.items() if d.family == BROADCAST},
            **{n: mine[d.rule] for n, d in REGISTRY.items() if d.rule in mine}}


RULES = _rules()
