"""VJP / JVP rules of Sort and Partition (the cotangent goes back through the permutation
that ``argsort`` / ``argpartition`` finds), and the index-valued ArgSort, ArgPartition and
SearchSorted, whose derivatives are zero."""

from __future__ import annotations

from .. import ops as mx
from .registry import defjvp, defvjp, record1


def _perm(name, x, params):
    """The permutation, locally constant in ``x``: its indices carry no gradient (MLX's
    ``stop_gradient(argsort(...))``), so a second derivative passes through it. A Partition
    has its ``kth``; a Sort sorts the whole axis."""
    if "kth" not in params:
        return mx.stop_gradient(mx.argsort(x, axis=params["axis"]))
    return mx.stop_gradient(mx.argpartition(x, params["kth"], axis=params["axis"]))


def _permuting(name):
    def vjp(p, c, argnums, o, **params):
        idx = _perm(name, p[0], params)
        return [record1("ScatterAxis", [mx.zeros_like(p[0]), idx, c[0]], p[0].shape, p[0].dtype,
                        axis=params["axis"], reduce="sum")]

    def jvp(p, t, argnums, o, **params):
        return [mx.take_along_axis(t[0], _perm(name, p[0], params), axis=params["axis"])]

    defvjp(name, vjp)
    defjvp(name, jvp)


_permuting("Sort")
_permuting("Partition")

for _n in ("ArgSort", "ArgPartition", "SearchSorted"):
    defvjp(_n, lambda p, c, argnums, o, **_: [mx.zeros_like(p[i]) for i in argnums])
    defjvp(_n, lambda p, t, argnums, o, **_: [mx.zeros_like(x) for x in o])
