"""``tapescope.as_mlx()``: run MLX's own Python packages (mlx.nn, mlx.optimizers, mlx.utils)
on tapescope by routing ``mlx.core`` and its submodules to ``tapescope.core``.

The routing is a ``sys.modules`` entry per name (and the ``mlx`` package's ``core``
attribute). MLX's Python modules that were imported before (``mlx.nn`` ...) bound the real
``mlx.core`` at import, so they are imported afresh under the new routing and the old module
objects take the new contents and stay the modules in ``sys.modules``, so ``nn`` names held
by the user follow too. Objects made before the switch (modules holding real MLX arrays) stay
as they were, and a name bound by an earlier ``import mlx.core as mx`` is the module it was
then: import it again. Other packages built on MLX (mlx_lm, ...) imported before the switch
are not re-imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

SUBMODULES = ("linalg", "fft", "random", "fast", "distributed", "metal", "cuda")
_CORE_NAMES = ("mlx.core",) + tuple(f"mlx.core.{s}" for s in SUBMODULES)
_INSTALL = ("as_mlx() runs MLX's own Python packages (mlx.nn, mlx.optimizers, mlx.utils), which "
            "are not installed: pip install 'tapescope[mlx]' (or pip install mlx==0.32.4)")

_saved: dict = {}  # the real mlx.core entries (or None) while routed
_active = False


def is_active() -> bool:
    """Whether ``mlx.core`` is routed to ``tapescope.core`` now."""
    return _active


def _dependents() -> list:
    """MLX's Python modules already imported that may hold ``mlx.core`` (parents first)."""
    return [n for n, m in list(sys.modules.items())
            if n.startswith("mlx.") and n not in _CORE_NAMES and not n.startswith("mlx.core.")
            and isinstance(m, types.ModuleType)]


def _route(entries: dict) -> None:
    """Set (or, for None, remove) the ``mlx.core*`` entries and the ``mlx.core`` attribute."""
    for name, mod in entries.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    pkg = sys.modules.get("mlx")
    if pkg is not None:
        if entries.get("mlx.core") is None:
            pkg.__dict__.pop("core", None)
        else:
            pkg.core = entries["mlx.core"]


def _reimport(names: list, olds: dict) -> None:
    """Import ``names`` afresh under the current routing; each old module object takes its
    new contents (so references to it see the re-imported module)."""
    for n in names:
        sys.modules.pop(n, None)
    for n in names:
        parent, _, child = n.rpartition(".")
        if parent in sys.modules:
            sys.modules[parent].__dict__.pop(child, None)
    fresh = {}
    for n in names:
        if n not in sys.modules:
            importlib.import_module(n)
        fresh[n] = sys.modules[n]
    for n, new in fresh.items():  # the old objects stay the modules, with the new contents
        old = olds[n]
        if old is not new:
            old.__dict__.clear()
            old.__dict__.update(new.__dict__)
        sys.modules[n] = old
    for n in names:
        parent, _, child = n.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, sys.modules[n])


def as_mlx(enable: bool = True) -> None:
    """Route ``import mlx.core`` (and ``mlx.nn``, ``mlx.optimizers``, ``mlx.utils``, which use
    it) to tapescope for the rest of the process; ``as_mlx(False)`` restores the real MLX."""
    global _active
    if bool(enable) == _active:
        return
    try:
        found = importlib.util.find_spec("mlx.nn") is not None
    except ImportError:
        found = False
    if not found:
        raise ImportError(_INSTALL)
    import tapescope.core as tcore

    import mlx  # noqa: F401  (the namespace package whose .core attribute is set)

    deps = _dependents()
    olds = {n: sys.modules[n] for n in deps}
    previous = {n: sys.modules.get(n) for n in _CORE_NAMES}
    if enable:
        saved = {n: sys.modules.get(n) for n in _CORE_NAMES}
        target = {"mlx.core": tcore, **{f"mlx.core.{s}": getattr(tcore, s) for s in SUBMODULES}}
    else:
        saved = _saved.copy()
        target = _saved.copy()
    _route(target)
    try:
        _reimport(deps, olds)
    except Exception as err:
        _route(previous)
        for n in deps:
            sys.modules[n] = olds[n]
        for n in deps:
            parent, _, child = n.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, olds[n])
        raise RuntimeError(
            f"as_mlx({enable}): re-importing MLX's modules under the new mlx.core failed "
            f"({type(err).__name__}: {err}); the previous mlx.core stays in place") from err
    if enable:
        _saved.clear()
        _saved.update(saved)
    else:
        _saved.clear()
    _active = bool(enable)
