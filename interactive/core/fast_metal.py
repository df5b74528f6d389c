"""``mx.fast.metal_kernel``: MLX 0.32's signature and call (python/src/fast.cpp,
mlx/backend/common/metal_kernel.cpp).

Making a kernel checks the outputs and ``compile_options`` as MLX does; calling it converts
the inputs, checks the template arguments and sizes, writes the source (MLX's signature
rules: ``kernels/metal/custom.py``) and records one ``CustomKernel`` node with an output per
``output_names``. Without Metal, MLX raises ``RuntimeError("[metal_kernel] No Metal
back-end.")`` at the call, and so does tapescope by default, except while
``export_function`` traces: the call is recorded then on a placeholder GPU stream (MLX's
``Stream(-1, gpu)``; a call on a CPU stream is MLX's ValueError) for the importing process to
run. tapescope's extension: with
``TAPESCOPE_METAL_SHIM=1`` (or ``tapescope.kernels.metal.shim.enable()``) the kernel runs
through the Metal shim on the CPU instead (a verification tool: same source, same buffers,
same launch grid, run by the system C++ compiler), on the call's stream.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from . import dtypes as _dt
from .device import BadArgs, Device, DeviceType, Stream, ThreadLocalStream, binding, resolve_stream
from .fast_custom import CustomKernelFunction, call_arguments, check_sizes, record, strs

_SIG = ("metal_kernel(name: str, input_names: collections.abc.Sequence[str], output_names: "
        "collections.abc.Sequence[str], source: str, header: str = '', ensure_row_contiguous: "
        "bool = True, atomic_outputs: bool = False, compile_options: object | None = None) "
        "-> object")
_MATH_MODES = ("safe", "relaxed", "fast")


@binding(_SIG)
def metal_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str],
                 source: str, header: str = "", ensure_row_contiguous: bool = True,
                 atomic_outputs: bool = False, compile_options: Optional[object] = None) -> object:
    """A jit-compiled custom Metal kernel defined from a source string (``source`` is the
    kernel's body; its signature is generated). Returns the callable kernel."""
    if not (isinstance(name, str) and strs(input_names) and strs(output_names)
            and isinstance(source, str) and isinstance(header, str)
            and isinstance(ensure_row_contiguous, bool) and isinstance(atomic_outputs, bool)):
        raise BadArgs()
    if compile_options is not None:
        if not isinstance(compile_options, dict):
            raise ValueError("[metal_kernel] Expected `compile_options` to be a dict.")
        for key, value in compile_options.items():
            if key == "math_mode":
                if value not in _MATH_MODES:
                    raise ValueError("[metal_kernel] Expected math_mode to be 'safe', "
                                     "'relaxed', or 'fast'.")
            else:
                raise ValueError(f"[metal_kernel] Unknown compile option `{key}`.")
    if not output_names:
        raise ValueError("[metal_kernel] Must specify at least one output.")
    return _MetalKernel(name, list(input_names), list(output_names), source, header,
                        ensure_row_contiguous, atomic_outputs)


class _MetalKernel(CustomKernelFunction):
    """The callable ``metal_kernel`` returns."""

    def __init__(self, name, input_names, output_names, source, header, ensure_row_contiguous,
                 atomic_outputs):
        super().__init__(name, input_names, output_names, source, header, ensure_row_contiguous)
        self.atomic_outputs = atomic_outputs

    def _call(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup,
              template=None, init_value=None, verbose=False, stream=None) -> list:
        from tapescope.kernels.metal import custom, shim

        arrays, targs = call_arguments("[metal_kernel]", inputs, output_shapes,
                                       output_dtypes, grid, threadgroup, template, init_value,
                                       verbose)
        check_sizes("[metal_kernel]", self, arrays, output_shapes, output_dtypes)
        if not shim.enabled():  # tapescope runs no Metal here (the runtime is macOS-only)
            s = _export_stream(stream)
        else:
            s = resolve_stream(stream)
        if any(a.dtype == _dt.float64 for a in arrays) or _dt.float64 in output_dtypes:
            # the shim stands in for the GPU: MLX's check when a GPU primitive is made
            raise ValueError("float64 is not supported on the GPU")
        kname, src = custom.write_source(
            self.name, self.input_names, self.output_names, self.source, self.header,
            self.atomic_outputs, [custom.Input(a.dtype.np, a.ndim, a.size) for a in arrays],
            [d.np for d in output_dtypes], targs)
        if verbose:
            print(f"Generated source code for `{self.name}`:\n```\n{src}\n```", file=sys.stdout)
        return record(s, kname, src, grid, threadgroup,
                      custom.shape_infos(self.source, self.input_names),
                      self.ensure_row_contiguous, init_value, output_shapes, output_dtypes,
                      arrays)


def _export_stream(stream) -> Stream:
    """Without Metal: the placeholder GPU stream an exported call is recorded on, or MLX's
    errors (``resolve_metal_kernel_stream``, mlx/backend/common/metal_kernel.cpp)."""
    from .export_function import in_export_tracing

    if not in_export_tracing():
        raise RuntimeError("[metal_kernel] No Metal back-end.")
    if isinstance(stream, (Stream, ThreadLocalStream, Device)):
        t = stream.device.type if not isinstance(stream, Device) else stream.type
    else:
        t = stream if isinstance(stream, DeviceType) else DeviceType.gpu
    if t != DeviceType.gpu:
        raise ValueError("[metal_kernel] Only supports the GPU.")
    return Stream._new(Device(DeviceType.gpu), -1, None)
