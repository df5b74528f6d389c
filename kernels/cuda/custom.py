"""``mx.fast.cuda_kernel`` on the CUDA runtime: MLX's generated kernel signature, NVRTC, launch.

``write_source`` follows ``build_kernel`` of ``mlx/backend/cuda/custom_kernel.cpp``: the
default header, the user's header, then in ``namespace mlx::core::cu`` a ``__global__``
function ``custom_kernel_<name><template hash>`` taking per input ``const T* <name>`` and,
only when the source mentions them, ``<name>_shape`` / ``<name>_strides`` / ``<name>_ndim``;
per output ``T* <name>``; template arguments as ``constexpr`` / ``using`` lines; the body.
MLX's default header is its device ``utils.cuh`` (not available here): ``PRELUDE`` gives
what kernels use of it (the fp16 / bf16 types, cooperative groups, ``Shape`` and
``Strides``: ``MAX_NDIM`` values by value, passed from Python as numpy structured scalars).

(The source writer needs no CuPy: it is tested everywhere.) ``run`` is ``CustomKernel::eval_gpu``: outputs filled with ``init_value`` (else fresh),
inputs copied to row-contiguous when asked, arguments in signature order, the grid given in
threads (``ceil(grid / threadgroup)`` blocks of ``min(threadgroup, grid)`` threads).
"""

from __future__ import annotations

import threading
import time
from typing import Optional, Sequence

import ml_dtypes
import numpy as np

from .. import timeline
from ..codegen.cuda import RTC_INT_TYPES
from .. import kernel_registry
from ..common.custom_kernel import shape_infos, type_string  # MLX's get_type_string, the shared rule

PRELUDE = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
""" + RTC_INT_TYPES + r"""namespace mlx::core::cu {
// MLX's device utils.cuh: shape and strides pass by value, MAX_NDIM entries (config.h)
#define MAX_NDIM 10
template <typename T, int N> struct DeviceArray {
  T values[N];
  __device__ __forceinline__ T operator[](int i) const { return values[i]; }
  __device__ __forceinline__ const T* data() const { return values; }
  __device__ __forceinline__ constexpr int size() const { return N; }
};
using Shape = DeviceArray<int32_t, MAX_NDIM>;
using Strides = DeviceArray<int64_t, MAX_NDIM>;
}  // namespace mlx::core::cu
"""

_TYPE = {np.dtype(np.bool_): "bool", np.dtype(np.int8): "int8_t", np.dtype(np.int16): "int16_t",
         np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t",
         np.dtype(np.uint8): "uint8_t", np.dtype(np.uint16): "uint16_t",
         np.dtype(np.uint32): "uint32_t", np.dtype(np.uint64): "uint64_t",
         np.dtype(np.float16): "__half", np.dtype(ml_dtypes.bfloat16): "__nv_bfloat16",
         np.dtype(np.float32): "float", np.dtype(np.float64): "double",
         np.dtype(np.complex64): "cuComplex"}


def cuda_type(dt) -> str:
    return _TYPE[np.dtype(dt)]


def template_hash(template_args: Sequence) -> str:
    out = ""
    for _, v in template_args:
        if isinstance(v, bool):
            out += "_t" if v else "_f"
        elif isinstance(v, int):
            out += f"_{v}"
        else:
            out += "_" + type_string(v)
    return out


def write_source(name: str, input_names: Sequence[str], output_names: Sequence[str],
                 source: str, header: str, input_dims: Sequence[tuple], output_dtypes: Sequence,
                 template_args: Sequence) -> tuple:
    """``(kernel name, whole source)``; ``input_dims``: (dtype, ndim) per input."""
    kname = "custom_kernel_" + name + template_hash(template_args)
    infos = shape_infos(source, input_names)
    lines = [PRELUDE, header, "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n",
             f"__global__ void {kname}(\n"]
    params = []
    for n, (dt, ndim), (sh, st, nd) in zip(input_names, input_dims, infos):
        params.append(f"    const {cuda_type(dt)}* {n}")
        if ndim > 0:
            if sh:
                params.append(f"    const __grid_constant__ Shape {n}_shape")
            if st:
                params.append(f"    const __grid_constant__ Strides {n}_strides")
            if nd:
                params.append(f"    const __grid_constant__ int {n}_ndim")
    for n, dt in zip(output_names, output_dtypes):
        params.append(f"    {cuda_type(dt)}* {n}")
    lines.append(",\n".join(params) + ") {\n")
    for tname, v in template_args:
        if isinstance(v, bool):
            lines.append(f"  constexpr bool {tname} = {'true' if v else 'false'};\n")
        elif isinstance(v, int):
            lines.append(f"  constexpr int {tname} = {v};\n")
        else:
            lines.append(f"  using {tname} = {cuda_type(v)};\n")
    if template_args:
        lines.append("\n")
    lines.append(source)
    lines.append("\n}\n\n} // namespace mlx::core::cu\n")
    return kname, "".join(lines)


# -- compiling and running ---------------------------------------------------------------------
_lock = threading.Lock()
_modules: dict = {}  # (kernel name, source) -> (RawModule, kernel function)


def _function(kname: str, source: str, precompiled: bool):
    import cupy

    key = (kname, source)
    hit = _modules.get(key)
    if hit is not None:
        entry = kernel_registry._kernels.get("cuda-custom:" + kname)
        if entry is not None:
            entry.hits += 1
        return hit[1]
    with _lock:
        hit = _modules.get(key)
        if hit is not None:
            return hit[1]
        t0 = time.perf_counter()
        if precompiled:  # PTX or cubin bytes, the kernel's own (unmangled) name
            from cupy.cuda import function

            mod = function.Module()
            mod.load(source if isinstance(source, bytes) else source.encode())
            fn = mod.get_function(kname)
        else:
            from .compiled import _arch, _include_dirs

            full = "mlx::core::cu::" + kname
            opts = (f"--gpu-architecture={_arch()}", "--std=c++17",
                    *[f"-I{d}" for d in _include_dirs()])
            mod = cupy.RawModule(code=source, options=opts, name_expressions=[full])
            fn = mod.get_function(full)
        ms = (time.perf_counter() - t0) * 1e3
        _modules[key] = (mod, fn)
        e = kernel_registry.KernelEntry(kname, "cuda", "custom",
                                 source if isinstance(source, str) else "<precompiled>",
                                 build_ms=ms, misses=1, origin="built")
        with kernel_registry._lock:  # listed by tapescope.kernel_cache() with its generated source
            kernel_registry._kernels["cuda-custom:" + kname] = e
    return fn


MAX_NDIM = 10  # mlx/backend/cuda/device/config.h


def _by_value(dt, values) -> np.void:
    """A ``DeviceArray<T, MAX_NDIM>`` argument: a structured numpy scalar CuPy passes by value."""
    if len(values) > MAX_NDIM:
        raise ValueError(f"[custom_kernel] Arrays of more than {MAX_NDIM} dimensions are not "
                         "supported for shape / strides arguments.")
    st = np.zeros((), dtype=np.dtype([("values", dt, (MAX_NDIM,))], align=True))
    st["values"][:len(values)] = values
    return st[()]


def run(inputs, *, kernel_name, source, grid, threadgroup, shape_infos, ensure_row_contiguous,
        init_value, output_shapes, output_dtypes, shared_memory=0, scalars=(),
        precompiled=False, language="cuda") -> tuple:
    """``CustomKernel::eval_gpu`` of ``mlx/backend/cuda/custom_kernel.cpp`` on the current
    CUDA stream (the call's mx stream's)."""
    import cupy

    arrays = [a if isinstance(a, cupy.ndarray) else cupy.asarray(a) for a in inputs]
    if ensure_row_contiguous:
        arrays = [cupy.ascontiguousarray(a) for a in arrays]
    outs = [cupy.full(tuple(s), init_value, dtype=dt) if init_value is not None
            else cupy.empty(tuple(s), dtype=dt) for s, dt in zip(output_shapes, output_dtypes)]
    args = []
    for a, (sh, st, nd) in zip(arrays, shape_infos):
        args.append(a)
        if a.ndim > 0:
            if sh:
                args.append(_by_value(np.int32, a.shape))
            if st:
                args.append(_by_value(np.int64, [s // a.itemsize for s in a.strides]))
            if nd:
                args.append(np.int32(a.ndim))
    args += outs
    for s in scalars:
        args.append(np.bool_(s) if isinstance(s, bool) else
                    np.int32(s) if isinstance(s, int) else np.float32(s))
    fn = _function(kernel_name, source, precompiled)
    if shared_memory > 48000:
        fn.max_dynamic_shared_size_bytes = int(shared_memory)
    (tx, ty, tz), (gx, gy, gz) = threadgroup, grid
    block = (min(tx, gx), min(ty, gy), min(tz, gz))
    blocks = (-(-gx // tx), -(-gy // ty), -(-gz // tz))
    t0 = timeline.now() if timeline.enabled else 0
    fn(blocks, block, tuple(args), shared_mem=int(shared_memory))
    if t0:
        timeline.add("kernel_launch", t0, timeline.now(), name=kernel_name, device="gpu",
                     detail={"runtime": "cuda", "variant": "custom", "grid": blocks,
                             "block": block})
    return tuple(outs)
