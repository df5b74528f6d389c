"""The rule for ``Compiled`` (a fused elementwise tape) and for trace placeholders."""

from __future__ import annotations

from ..primitives import COMPILED, PLACEHOLDER, define


@define("Compiled", family=COMPILED, out=True, donatable=True,
        shape="interactive/core/fusion.py (the tape's root shape: the ``shape`` parameter)",
        dtype="the tape's output dtypes")
def compiled(xp, *inputs, tape, shape, out=None, donatable=None, runtime=None):
    """Run a fused tape with ``runtime``, the compiled-kernel runtime of the device's
    backend (``Backend.run_compiled``: generated C on the CPU, numpy where it cannot); with
    no runtime (a caller outside evaluation) the tape is interpreted with ``xp``. ``out``
    (single-output tapes) is written when its layout suits the kernel; ``donatable``
    (multi-output tapes) marks the inputs whose buffers the outputs may take, by MLX's
    Compiled rules. A reduction tape (extended fusion) runs on the backend's runtime too
    (the CPU's: ``cpu/reduction.py``; CUDA's: ``cuda/fused_reduction.py``), or interpreted
    with ``xp``."""
    if tape.reduction is not None and runtime is None:
        from ..codegen.reduction import interpret as interpret_reduction

        outs = interpret_reduction(tape, inputs, shape, xp)
        return outs[0] if len(outs) == 1 else tuple(outs)
    if runtime is not None:
        outs = runtime(tape, inputs, shape, out=out, donatable=donatable)
    else:
        from ..codegen.interpret import interpret

        outs = interpret(tape, inputs, shape, xp)
    return outs[0] if len(outs) == 1 else tuple(outs)


@define("Placeholder", family=PLACEHOLDER)
def placeholder(xp, *inputs, **params):
    """A tracer stands for a compiled function's argument: it has no value to compute."""
    raise ValueError("[eval] Attempting to eval an array during function transformations like "
                     "compile or vmap is not allowed.")
