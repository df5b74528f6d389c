"""A generated kernel's call that the primitive's definition runs instead, recorded: the
rule (into the evaluator's ``out`` where one is given) and the timeline's
``kernel_fallback`` record (why, the runtime that ran it, the primitive: what the Cache
tab lists as "why numpy ran it"). Every runtime's kernel rules fall back this way."""

from __future__ import annotations

from typing import Any, Optional

from . import timeline
from .primitives import REGISTRY


def run_rule(prim_name: str, why: str, xp: Any, ins, kw: dict, out: Any = None, *,
             device: str = "cpu", runtime: str = "numpy", name: Optional[str] = None,
             variant: Optional[str] = None) -> Any:
    """``prim_name``'s definition's rule on ``ins`` with parameters ``kw`` (into ``out``
    where given), recorded as the fallback of kernel ``name`` (the primitive's own name by
    default) on ``device`` for ``why``."""
    t0 = timeline.now() if timeline.enabled else 0
    rule = REGISTRY[prim_name].rule
    res = rule(xp, *ins, **kw) if out is None else rule(xp, *ins, out=out, **kw)
    if t0:
        detail = {"reason": why, "runtime": runtime, "primitive": prim_name}
        if variant is not None:
            detail["variant"] = variant
        timeline.add("kernel_fallback", t0, timeline.now(), name=name or prim_name,
                     device=device, detail=detail)
    return res
