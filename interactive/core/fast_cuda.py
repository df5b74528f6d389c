"""``mx.fast.cuda_kernel`` and ``mx.fast.precompiled_cuda_kernel``: MLX 0.32's signatures and
calls (python/src/fast.cpp, mlx/backend/cuda/custom_kernel.cpp).

Without a CUDA runtime, MLX's builds raise ``RuntimeError("[cuda_kernel] No CUDA back-end.")``
when the kernel is made, and so does tapescope (its CUDA runtime is on with
``TAPESCOPE_CUDA=1`` where CuPy reaches a GPU). With it, calling a kernel checks the sizes
and the stream as MLX does, writes the source (MLX's signature rules:
``kernels/cuda/custom.py``) and records one ``CustomKernel`` node, run by the CUDA runtime
(NVRTC, the call's CUDA stream); the generated source is listed by ``tapescope.kernel_cache()``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

from . import dtypes as _dt
from .array import array
from .device import BadArgs, DeviceType, binding, resolve_stream
from .fast_custom import (CustomKernelFunction, call_arguments, check_sizes, record, scalar,
                          strs, triple)

_SIG = ("cuda_kernel(name: str, input_names: collections.abc.Sequence[str], output_names: "
        "collections.abc.Sequence[str], source: str, header: str = '', ensure_row_contiguous: "
        "bool = True, shared_memory: int = 0) -> object")
_PRE_SIG = ("precompiled_cuda_kernel(*, name: str, compiled_source: bytes, inputs: "
            "collections.abc.Sequence[bool | int | float | mlx.core.array | "
            "ndarray[writable=False] | complex | mlx.core.ArrayLike], output_shapes: "
            "collections.abc.Sequence[tuple[int, ...]], output_dtypes: "
            "collections.abc.Sequence[mlx.core.Dtype], scalars: collections.abc.Sequence[object], "
            "grid: tuple[int, int, int], threadgroup: tuple[int, int, int], shared_memory: int = 0, "
            "init_value: float | None = None, ensure_row_contiguous: bool = False, stream: "
            "mlx.core.Stream | mlx.core.ThreadLocalStream | mlx.core.Device | "
            "mlx.core.DeviceType | None = None) -> list[mlx.core.array]")


def _cuda_runtime() -> bool:
    from tapescope.kernels import backends

    return backends.cuda_runtime_available()


@binding(_SIG)
def cuda_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str,
                header: str = "", ensure_row_contiguous: bool = True,
                shared_memory: int = 0) -> object:
    """A jit-compiled custom CUDA kernel defined from a source string (``source`` is the
    kernel's body; its signature is generated). Returns the callable kernel."""
    if not (isinstance(name, str) and strs(input_names) and strs(output_names)
            and isinstance(source, str) and isinstance(header, str)
            and isinstance(ensure_row_contiguous, bool)
            and isinstance(shared_memory, int) and not isinstance(shared_memory, bool)):
        raise BadArgs()
    if not _cuda_runtime():
        raise RuntimeError("[cuda_kernel] No CUDA back-end.")
    if not output_names:
        raise ValueError("[custom_kernel] Must specify at least one output.")
    return _CudaKernel(name, list(input_names), list(output_names), source, header,
                       ensure_row_contiguous, int(shared_memory))


def _gpu_stream(stream):
    s = resolve_stream(stream)
    if s.device.type != DeviceType.gpu:
        raise ValueError("[custom_kernel] Only supports the GPU.")
    return s


class _CudaKernel(CustomKernelFunction):
    """The callable ``cuda_kernel`` returns."""

    def __init__(self, name, input_names, output_names, source, header, ensure_row_contiguous,
                 shared_memory):
        super().__init__(name, input_names, output_names, source, header, ensure_row_contiguous)
        self.shared_memory = shared_memory

    def _call(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
              init_value=None, verbose=False, stream=None) -> list:
        from tapescope.kernels.cuda import custom

        arrays, targs = call_arguments("[cuda_kernel]", inputs, output_shapes,
                                       output_dtypes, grid, threadgroup, template, init_value,
                                       verbose)
        check_sizes("[custom_kernel]", self, arrays, output_shapes, output_dtypes)
        s = _gpu_stream(stream)
        kname, src = custom.write_source(
            self.name, self.input_names, self.output_names, self.source, self.header,
            [(a.dtype.np, a.ndim) for a in arrays], [d.np for d in output_dtypes], targs)
        if verbose:
            print(f"Generated source code for `{kname}`:\n```\n{src}\n```", file=sys.stdout)
        return record(s, kname, src, grid, threadgroup,
                      custom.shape_infos(self.source, self.input_names),
                      self.ensure_row_contiguous, init_value, output_shapes, output_dtypes,
                      arrays, shared_memory=self.shared_memory, language="cuda")


@binding(_PRE_SIG)
def precompiled_cuda_kernel(*, name: str, compiled_source: bytes, inputs: Sequence[Any],
                            output_shapes: Sequence[Sequence[int]], output_dtypes: Sequence,
                            scalars: Sequence[object], grid: tuple, threadgroup: tuple,
                            shared_memory: int = 0, init_value: Optional[float] = None,
                            ensure_row_contiguous: bool = False, stream=None) -> list:
    """Run a precompiled CUDA kernel (PTX or cubin bytes) named ``name``, with ``scalars``
    (bool, int, float) passed after the outputs."""
    if not (isinstance(name, str) and isinstance(compiled_source, bytes)
            and isinstance(inputs, (list, tuple)) and isinstance(output_shapes, (list, tuple))
            and isinstance(output_dtypes, (list, tuple))
            and all(isinstance(d, _dt.Dtype) for d in output_dtypes)
            and isinstance(scalars, (list, tuple)) and triple(tuple(grid))
            and triple(tuple(threadgroup)) and isinstance(shared_memory, int)
            and (init_value is None or isinstance(init_value, (int, float)))
            and isinstance(ensure_row_contiguous, bool)):
        raise BadArgs()
    arrays = [x if isinstance(x, array) else scalar(x) for x in inputs]
    for v in scalars:
        if not isinstance(v, (bool, int, float)):
            raise ValueError("[precompiled_cuda_kernel] Invalid scalar argument type. Received "
                             f"{type(v).__name__} but must be one of bool, int or float")
    if not _cuda_runtime():  # MLX's builds without CUDA say so under this name too
        raise RuntimeError("[cuda_kernel] No CUDA back-end.")
    return record(_gpu_stream(stream), name, compiled_source, grid, threadgroup,
                  [(False, False, False)] * len(arrays), ensure_row_contiguous, init_value,
                  output_shapes, output_dtypes, arrays, shared_memory=int(shared_memory),
                  scalars=tuple(scalars), precompiled=True, language="cuda")
