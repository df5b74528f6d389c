"""Array-module-generic primitive rules, keyed by MLX primitive name.

A rule is ``fn(xp, *inputs, **params)`` returning one array or a tuple of arrays (one per
output). ``xp`` is the array module (numpy on the CPU, cupy on CUDA), so one rule serves
every runtime. Importing this package registers every rule module.
"""

from __future__ import annotations

from typing import Callable

RULES: dict[str, Callable] = {}
# Rules that accept ``out=`` (an allocator-backed array of the output's shape and dtype)
# and write their result into it, as numpy ufuncs do.
TAKES_OUT: set[str] = set()
# Rules that accept ``donatable=`` (one flag per input: nobody else holds it, so its buffer may
# become an output's) and may return outputs that reuse those inputs' memory.
TAKES_DONATABLE: set[str] = set()


def rule(*names: str, out: bool = False, donatable: bool = False) -> Callable:
    """Register the decorated function as the rule for each primitive name.

    ``out=True`` declares that the rule takes an ``out=`` keyword and writes into it;
    ``donatable=True`` that it takes ``donatable=`` flags (one per input) for its outputs.
    """

    def deco(fn: Callable) -> Callable:
        for n in names:
            if n in RULES:
                raise KeyError(f"rule for {n} registered twice")
            RULES[n] = fn
            if out:
                TAKES_OUT.add(n)
            if donatable:
                TAKES_DONATABLE.add(n)
        return fn

    return deco


def get(name: str) -> Callable:
    try:
        return RULES[name]
    except KeyError:
        raise NotImplementedError(f"[eval] No rule for primitive {name}.") from None


def _register_all() -> None:
    """Import every module of this package (each registers its rules)."""
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


_register_all()
