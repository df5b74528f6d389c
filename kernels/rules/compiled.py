"""The rule for ``Compiled`` (a fused elementwise tape) and for trace placeholders."""

from __future__ import annotations

import numpy as np

from ..primitives import COMPILED, PLACEHOLDER, define


_cpu: list = []


def _cpu_run():
    """``cpu.compiled.run_compiled``, imported on first use (kept out of the rules import)."""
    if not _cpu:
        from ..cpu.compiled import run_compiled

        _cpu.append(run_compiled)
    return _cpu[0]


@define("Compiled", family=COMPILED, out=True, donatable=True,
        shape="interactive/core/fusion.py (the tape's root shape: the ``shape`` parameter)",
        dtype="the tape's output dtypes")
def compiled(xp, *inputs, tape, shape, out=None, donatable=None):
    """Run a fused tape: generated C on the CPU (numpy when it cannot), the tape
    interpreted with ``xp`` elsewhere. ``out`` (single-output tapes) is written when its
    layout suits the kernel; ``donatable`` (multi-output tapes) marks the inputs whose
    buffers the outputs may take, by MLX's Compiled rules."""
    if xp is np:
        outs = _cpu_run()(tape, inputs, shape, out=out, donatable=donatable)
    else:
        from ..codegen.interpret import interpret

        outs = interpret(tape, inputs, shape, xp)
    return outs[0] if len(outs) == 1 else tuple(outs)


@define("Placeholder", family=PLACEHOLDER)
def placeholder(xp, *inputs, **params):
    """A tracer stands for a compiled function's argument: it has no value to compute."""
    raise ValueError("[eval] Attempting to eval an array during function transformations like "
                     "compile or vmap is not allowed.")
