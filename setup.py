"""Package list for setuptools: every package under the three source folders, by mapping.

The metadata lives in pyproject.toml; the optional C extensions are listed here.
``interactive/`` installs as ``tapescope``, ``kernels/`` as ``tapescope.kernels`` and
``viz/`` as ``tapescope.viz``; their subpackages are found here so that a new folder is
installed without editing a list.
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
    """Optional C extensions (without a C compiler the package installs without them):
    a compiled function's call, recording a node, mx.eval's first step and the eval loop's
    hot part (``interactive/core/_call.c``, ``_loop.c``; the Python path runs instead),
    pytree walks (``interactive/core/_tree.c``; tree.py's Python walks otherwise),
    BufferHandle and the allocator's malloc / free / adopt (``kernels/_handle.c``; the
    Python class and methods otherwise), a generated kernel's planned call
    (``kernels/_kernel_call.c``: KernelCall; kernel_call.py's Python class otherwise), a small
    matrix product's BLAS call (``kernels/cpu/_gemm.c``; the numpy rule otherwise), the CPU's
    view rules (``kernels/cpu/_views.c``; views.py's Python otherwise), the CUDA backend's launch and host wait through the
    driver loaded at run time (``kernels/cuda/_driver.c``: no CUDA needed to build it; the
    Python hooks otherwise),
    and the buffer protocol's C base type, needed before Python 3.12 only (PEP 688; without
    it ``memoryview(x)`` raises TypeError)."""
    exts = [Extension("tapescope.core._call", ["interactive/core/_call.c", "interactive/core/_loop.c",
                                             "interactive/core/_binary.c",
                                             "interactive/core/_reduce.c",
                                             "interactive/core/_layout.c",
                                             "interactive/core/_stream.c",
                                             "interactive/core/_fields.c",
                                             "interactive/core/_autodiff.c",
                                             "interactive/core/_products.c"],
                      depends=["interactive/core/_core.h", "kernels/_device_api.h"], optional=True),
            Extension("tapescope.core._tree", ["interactive/core/_tree.c"], optional=True),
            Extension("tapescope.kernels._handle", ["kernels/_handle.c"], optional=True),
            Extension("tapescope.kernels._kernel_call", ["kernels/_kernel_call.c"], optional=True),
            Extension("tapescope.kernels.cpu._gemm", ["kernels/cpu/_gemm.c"], optional=True),
            Extension("tapescope.kernels.cpu._views", ["kernels/cpu/_views.c"], optional=True),
            Extension("tapescope.kernels.cuda._driver", ["kernels/cuda/_driver.c"],
                      depends=["kernels/_device_api.h"], optional=True)]
    if sys.version_info < (3, 12):
        exts.append(Extension("tapescope.core._buffer", ["interactive/core/_buffer.c"], optional=True))
    return exts


setup(package_dir=ROOTS, packages=_packages(), ext_modules=_extensions())
