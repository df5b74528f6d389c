"""Every op of ``tapescope.core``, grouped by family in the modules of this package.

Each module lists its public ops in ``__all__``; this package re-exports all of them.
"""

import importlib as _importlib
import pkgutil as _pkgutil

__all__: list = []
for _m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    _mod = _importlib.import_module(f"{__name__}.{_m.name}")
    for _name in getattr(_mod, "__all__", ()):
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)
del _m, _mod, _name
