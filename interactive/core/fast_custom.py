"""What ``mx.fast.metal_kernel`` and ``mx.fast.cuda_kernel`` share: the kernel call's keyword
arguments, their type checks and template arguments, and MLX's size checks
(``PyCustomKernelFunction`` in python/src/fast.cpp; the size errors of
mlx/backend/*/custom_kernel.cpp and mlx/backend/common/metal_kernel.cpp)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as _dt
from .array import array
from .device import BadArgs, incompatible
from .primitive import Primitive

# the kernel object's call, as nanobind shows it (python/src/fast.cpp: one for both kinds)
CALL_SIG = ("__call__(self, *, inputs: list[scalar | array], output_shapes: "
            "list[Sequence[int]], output_dtypes: list[Dtype], grid: tuple[int, int, int], "
            "threadgroup: tuple[int, int, int], template: list[tuple[str, bool | int | Dtype]] "
            "| None = None, init_value: float | None = None, verbose: bool = false, "
            "stream: StreamOrDevice = None)")
REQUIRED = {"inputs", "output_shapes", "output_dtypes", "grid", "threadgroup"}
KEYWORDS = REQUIRED | {"template", "init_value", "verbose", "stream"}


def strs(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v)


def triple(v) -> bool:
    return (isinstance(v, tuple) and len(v) == 3
            and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v))


def scalar(x) -> array:
    if isinstance(x, (bool, int, float, complex)):
        return array(x)
    raise BadArgs()


def call_arguments(tag: str, inputs, output_shapes, output_dtypes, grid, threadgroup,
                   template, init_value, verbose) -> tuple:
    """``(input arrays, template arguments)`` of a kernel call, after the binding's type
    checks (``BadArgs``) and the template arguments' (``tag``'s ValueError)."""
    if not (isinstance(inputs, list) and isinstance(output_shapes, list)
            and isinstance(output_dtypes, list)
            and all(isinstance(d, _dt.Dtype) for d in output_dtypes)
            and triple(grid) and triple(threadgroup) and isinstance(verbose, bool)
            and (template is None or isinstance(template, list))
            and (init_value is None or isinstance(init_value, (int, float)))):
        raise BadArgs()
    arrays = [x if isinstance(x, array) else scalar(x) for x in inputs]
    targs = []
    for item in template or []:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise BadArgs()
        tname, v = item
        if isinstance(v, (bool, int)):
            targs.append((tname, v))
        elif isinstance(v, _dt.Dtype):
            targs.append((tname, v.np))
        else:
            raise ValueError(f"{tag} Invalid template argument. Must be "
                             "`mlx.core.Dtype`, `int` or `bool`.")
    return arrays, targs


def check_sizes(tag: str, kernel, arrays, output_shapes, output_dtypes) -> None:
    """MLX's size errors (``tag``: ``[metal_kernel]`` or ``[custom_kernel]``)."""
    n = len(kernel.output_names)
    for actual, expected, what in ((len(arrays), len(kernel.input_names), "inputs"),
                                   (len(output_shapes), n, "output_shapes"),
                                   (len(output_dtypes), n, "output_dtypes")):
        if actual != expected:
            raise ValueError(f"{tag} Expected `{what}` to have size {expected} "
                             f"but got size {actual}.\n")


class CustomKernelFunction:
    """The callable a kernel maker returns (MLX's ``CustomKernelFunction``): its source parts,
    and the keyword-only call checked as nanobind checks it; ``_call`` is the kind's own."""

    def __init__(self, name, input_names, output_names, source, header, ensure_row_contiguous):
        self.name, self.input_names, self.output_names = name, input_names, output_names
        self.source, self.header = source, header
        self.ensure_row_contiguous = ensure_row_contiguous

    def __call__(self, *args, **kwargs) -> list:
        try:
            if args or not REQUIRED <= set(kwargs) or not set(kwargs) <= KEYWORDS:
                raise BadArgs()  # nanobind: keyword-only, these names
            return self._call(**kwargs)
        except BadArgs:
            raise incompatible("__call__", CALL_SIG, *args, **kwargs) from None


def record(stream, kernel_name: str, source, grid, threadgroup, shape_infos,
           ensure_row_contiguous: bool, init_value, output_shapes, output_dtypes, arrays,
           **extra) -> list:
    """The kernel call's ``CustomKernel`` node (one output per output shape) over ``arrays``;
    ``extra``: the kind's own parameters (CUDA's ``shared_memory``, ``language``, ...)."""
    shapes = [tuple(int(v) for v in shp) for shp in output_shapes]
    prim = Primitive("CustomKernel", stream, kernel_name=kernel_name, source=source,
                     grid=tuple(int(g) for g in grid),
                     threadgroup=tuple(int(t) for t in threadgroup),
                     shape_infos=tuple(shape_infos), ensure_row_contiguous=ensure_row_contiguous,
                     init_value=None if init_value is None else float(init_value),
                     output_shapes=tuple(shapes),
                     output_dtypes=tuple(d.np for d in output_dtypes), **extra)
    return array._make(shapes, list(output_dtypes), prim, arrays)
