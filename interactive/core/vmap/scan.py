"""Batching rules of the scans (mlx/primitives.cpp ``Scan::vmap``) and sorts
(``Sort`` / ``ArgSort`` / ``Partition`` / ``ArgPartition`` / ``SearchSorted``): the node's
own primitive along its axis shifted past the mapped one."""

from __future__ import annotations

from ..autodiff.registry import record1
from .registry import defvmap, shift


def _along_axis(name: str):
    def rule(inputs, vaxes, primals, outputs, *, axis, **params):
        x = inputs[0]
        return [record1(name, [x], x.shape, outputs[0].dtype, axis=shift(axis, vaxes[0]),
                        **params)], [vaxes[0]]

    return rule


for _name in ("CumSum", "CumProd", "CumMax", "CumMin", "CumLogAddExp",
              "Sort", "ArgSort", "Partition", "ArgPartition"):
    defvmap(_name, _along_axis(_name))


def _searchsorted(inputs, vaxes, primals, outputs, *, side):
    if vaxes[0] != -1:
        raise ValueError("[searchsorted] Cannot vmap over the sorted sequence, only over the "
                         "values being searched for.")
    seq, values = inputs
    return [record1("SearchSorted", [seq, values], values.shape, outputs[0].dtype,
                    side=side)], [vaxes[1]]


defvmap("SearchSorted", _searchsorted)
