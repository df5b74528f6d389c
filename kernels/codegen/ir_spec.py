"""What every loop-IR kernel spec shares (reductions, norms and rope, attention, the scores
softmax): its kernel's parameters computed once, its source in a dialect, and its sources in
the three runtimes for the Kernels tab. A spec is a frozen dataclass with ``kernel(gpu)``."""

from __future__ import annotations

from typing import Optional

from .c_ops import Unsupported

_PARAMS: dict = {}  # spec -> its kernel's parameters (the same for the CPU and GPU schedules)


class IRKernelSpec:
    """Mixin of the spec dataclasses whose kernels are ``loop_ir.Kernel``s."""

    __slots__ = ()

    def kernel_params(self) -> list:
        """The kernel's parameters (the same for the CPU and GPU schedules), computed once."""
        got = _PARAMS.get(self)
        if got is None:
            got = _PARAMS[self] = self.kernel().params
        return got

    def source(self, dialect) -> str:
        """The kernel in dialect ``dialect`` (a ``render.CFamily``), preamble included."""
        from .lower import render_kernel

        return render_kernel(self.kernel(getattr(dialect, "ir_threads", None) is not None), dialect)

    def sources(self, built: Optional[dict] = None) -> dict:
        """runtime -> source (cpu: C, cuda, metal: MSL), or a comment saying why a dialect
        cannot express it; ``built`` gives the ones a runtime's cache holds."""
        from .render import RUNTIME_DIALECT, renderer

        out = {}
        for runtime, dialect in RUNTIME_DIALECT.items():
            if built and built.get(runtime):
                out[runtime] = built[runtime]
                continue
            d = renderer(dialect)
            try:
                out[runtime] = self.source(d)
            except Unsupported as e:
                out[runtime] = f"// no {d.name} kernel: the {d.name} dialect cannot express it ({e})"
        return out
