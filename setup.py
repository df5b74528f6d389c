"""Package list for setuptools: every package under the three source folders, by mapping.

The metadata lives in pyproject.toml. ``interactive/`` installs as ``tapescope``,
``kernels/`` as ``tapescope.kernels`` and ``viz/`` as ``tapescope.viz``; their subpackages
are found here so that a new folder is installed without editing a list.
"""

from setuptools import find_namespace_packages, setup

ROOTS = {"tapescope": "interactive", "tapescope.kernels": "kernels", "tapescope.viz": "viz"}


def _packages() -> list[str]:
    """Every package under the mapped folders, named under ``tapescope``."""
    out = []
    for name, folder in ROOTS.items():
        out.append(name)
        for sub in find_namespace_packages(folder, exclude=["*__pycache__*", "*.ipynb_checkpoints*"]):
            out.append(f"{name}.{sub}")
    return out


setup(package_dir=ROOTS, packages=_packages())
