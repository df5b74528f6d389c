"""The CPU backend: host memory computed with numpy, fused tapes and MLX's reductions and
fast primitives as generated C (``cpu/compiled.py``, ``cpu/primitive_kernels.py``,
``cpu/fast_kernels.py``), large eager elementwise ops as one-op kernels (``cpu/eager.py``),
the host's roofline limits (``cpu/machine.py``). A backend like the others
(``kernels/backends.py``'s ``Backend`` contract), as MLX's ``eval_cpu`` sits beside
``eval_gpu`` (mlx/backend/cpu/)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from ..backends import Backend


class CpuBackend(Backend):
    """The host's runtime: the array module is numpy, the compiled kernels are C."""

    name = "cpu"
    device_type = "cpu"
    dialect = "c"

    @functools.cached_property
    def run_compiled(self) -> Callable:
        """Generated C (``cpu.compiled.run_compiled``; a reduction tape through
        ``cpu.reduction``), numpy where it cannot: the function itself, resolved on first
        use (the ``Compiled`` rule is given it on every fused call)."""
        from .compiled import run_compiled

        return run_compiled

    @functools.cached_property
    def compiled_launch(self) -> Optional[Callable]:
        from .compiled import launch_for

        return launch_for

    @functools.cached_property
    def compiled_prebuild(self) -> Optional[Callable]:
        from .compiled import prebuild

        return prebuild

    @functools.cached_property
    def eager_kernel(self) -> Optional[Callable]:
        """Eager elementwise ops of ``cpu.eager.MIN_SIZE`` elements and more as one-op
        kernels (``cpu/eager.py``), called by the eval loop as loaded fused calls are."""
        from .eager import EagerKernels

        return EagerKernels()

    @functools.cached_property
    def kernel_rules(self) -> dict:
        from .fast_kernels import RULES as FAST
        from .gemm import RULES as GEMM
        from .primitive_kernels import RULES
        from .views import RULES as VIEWS

        return {**RULES, **FAST, **VIEWS, **GEMM}

    def machine(self) -> Optional[Any]:
        from .machine import host_machine

        return host_machine()
