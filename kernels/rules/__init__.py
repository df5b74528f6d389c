"""Array-module-generic primitive rules, keyed by MLX primitive name.

A rule is ``fn(xp, *inputs, **params)`` returning one array or a tuple of arrays (one per
output). ``xp`` is the array module (numpy on the CPU, cupy on CUDA), so one rule serves
every runtime. Importing this package registers every rule module.
"""

from __future__ import annotations

from typing import Callable

RULES: dict[str, Callable] = {}


def rule(*names: str) -> Callable:
    """Register the decorated function as the rule for each primitive name."""

    def deco(fn: Callable) -> Callable:
        for n in names:
            if n in RULES:
                raise KeyError(f"rule for {n} registered twice")
            RULES[n] = fn
        return fn

    return deco


def get(name: str) -> Callable:
    try:
        return RULES[name]
    except KeyError:
        raise NotImplementedError(f"[eval] No rule for primitive {name}.") from None


from . import elementwise, shape  # noqa: E402,F401  (registers rules)
