"""The primitive definitions, one module per family, each registered beside its rule.

A rule is ``fn(xp, *inputs, **params)`` returning one array or a tuple of arrays (one per
output). ``xp`` is the array module (numpy on the CPU, cupy on CUDA), so one rule serves
every runtime. ``@define(name, family=..., ...)`` (``tapescope.kernels.primitives``) above a
rule records the primitive's whole definition. Importing this package registers every module.
"""

from __future__ import annotations

from typing import Callable

from ..primitives import REGISTRY, define  # noqa: F401 - the decorator every module uses


def get(name: str) -> Callable:
    """The array-module rule of primitive ``name``."""
    d = REGISTRY.get(name)
    if d is None or d.rule is None:
        raise NotImplementedError(f"[eval] No rule for primitive {name}.")
    return d.rule


def _register_all() -> None:
    """Import every module of this package (each registers its definitions)."""
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


_register_all()
