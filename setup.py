"""Package list for setuptools: every package under the three source folders, by mapping.

The metadata lives in pyproject.toml; the one C extension (the buffer protocol's base type,
for Python < 3.12) is listed here. ``interactive/`` installs as ``tapescope``,
``kernels/`` as ``tapescope.kernels`` and ``viz/`` as ``tapescope.viz``; their subpackages
are found here so that a new folder is installed without editing a list.
"""

import sys

from setuptools import Extension, find_namespace_packages, setup

ROOTS = {"tapescope": "interactive", "tapescope.kernels": "kernels", "tapescope.viz": "viz"}


def _packages() -> list[str]:
    """Every package under the mapped folders, named under ``tapescope``."""
    out = []
    for name, folder in ROOTS.items():
        out.append(name)
        for sub in find_namespace_packages(folder, exclude=["*__pycache__*", "*.ipynb_checkpoints*"]):
            out.append(f"{name}.{sub}")
    return out


def _extensions() -> list:
    """The buffer protocol's C base type, needed before Python 3.12 only (PEP 688); optional:
    without a C compiler the package installs and ``memoryview(x)`` raises TypeError."""
    if sys.version_info >= (3, 12):
        return []
    return [Extension("tapescope.core._buffer", ["interactive/core/_buffer.c"], optional=True)]


setup(package_dir=ROOTS, packages=_packages(), ext_modules=_extensions())
