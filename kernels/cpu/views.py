"""The CPU's own rules for views whose array-module form costs more than the view: a
``Broadcast`` of a contiguous numpy array is one ``np.ndarray`` constructor with stride 0
along the broadcast dimensions (numpy's ``broadcast_to`` spends ~5 us in Python making the
same view); the reshape family and ``Transpose`` call the array's own method (``np.reshape``
and ``np.transpose`` reach it through ~3 us of Python); ``_views.c`` has the same three in
C, which the eval loop calls (``CpuBackend.kernel_rules``) where built."""

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




def reshape(xp, a, *, shape, **_):
    """The reshape family's view (``rules/shape.reshape``: ``np.reshape`` is the array's own
    method, a copy where the strides allow no view), without ``np.reshape``'s Python."""
    if type(a) is not np.ndarray:
        return xp.reshape(a, shape)
    return a.reshape(shape)


def transpose(xp, a, *, axes):
    """``Transpose``'s view (``rules/shape.transpose``: ``np.transpose`` is the array's method)."""
    if type(a) is not np.ndarray:
        return xp.transpose(a, axes)
    return a.transpose(axes)


def _c_rules() -> tuple:
    """_views.c's ``broadcast``, ``reshape`` and ``transpose`` (the same steps in C) where
    that extension is built, else the Python functions above."""
    try:
        from . import _views
    except ImportError:
        return broadcast, reshape, transpose
    _views.configure(np.ndarray)
    return _views.broadcast, _views.reshape, _views.transpose


def _rules() -> dict:
    """The broadcast family's primitives (MLX's Broadcast), found by their definitions'
    family; those whose definition's rule is one these replace (the reshape family:
    Reshape, ExpandDims, Squeeze, Flatten, Unflatten; Transpose), found by the rule."""
    from ..rules import shape

    c_broadcast, c_reshape, c_transpose = _c_rules()
    mine = {shape.reshape: c_reshape, shape.transpose: c_transpose}
    return {**{n: c_broadcast for n, d in REGISTRY.items() if d.family == BROADCAST},
            **{n: mine[d.rule] for n, d in REGISTRY.items() if d.rule in mine}}


RULES = _rules()
