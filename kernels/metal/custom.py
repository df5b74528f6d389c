"""``mx.fast.metal_kernel``'s source, by MLX's rules (mlx/backend/common/metal_kernel.cpp).

The user writes a kernel's body; MLX writes the rest:

- the kernel is named ``custom_kernel_<name>``, then ``_<template values>`` (``<`` / ``>`` /
  ``", "`` as ``_``), then ``_<type>`` per input (``s`` after a 0-d input, ``c`` after one of
  fewer than 8 elements) and ``_<type>`` per output;
- ``template <typename T, int N, bool B>`` from the template arguments, instantiated with a
  ``[[host_name(...)]]`` line;
- per input ``const device T* x [[buffer(i)]]`` (``constant`` below 8 elements, ``&`` for a
  0-d input), then ``x_shape`` / ``x_strides`` / ``x_ndim`` only if the source mentions them
  (never for a 0-d input); per output ``device T* y`` (``device atomic<T>*`` with
  ``atomic_outputs``); then every Metal attribute the source mentions, in MLX's table order;
- the library's source is MLX's ``metal::utils()`` followed by the kernel: here ``PRELUDE``,
  our MSL with the utilities the documented examples use (``elem_to_loc``, ``ceildiv``, the
  ``float16_t`` / ``bfloat16_t`` names).

Dtypes are numpy dtypes (the core converts); the buffers are bound in signature order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..common.custom_kernel import shape_infos, type_string  # noqa: F401 (the runtimes' shared rules)

MAX_CONSTANT_ARRAY_SIZE = 8  # inputs with fewer elements go in the constant address space

# the attributes MLX adds when the source mentions them, in its order, with their types
METAL_ATTRIBUTES = (
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"), ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"), ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"), ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"), ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"), ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"), ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"), ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"), ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
)

PRELUDE = r"""#include <metal_stdlib>
using namespace metal;
typedef half float16_t;
typedef bfloat bfloat16_t;
template <typename IdxT = int64_t>
inline IdxT elem_to_loc(IdxT elem, constant const int* shape,
                        constant const int64_t* strides, int ndim) {
  IdxT loc = 0;
  for (int i = ndim - 1; i >= 0 && elem > 0; --i) {
    loc += (elem % shape[i]) * IdxT(strides[i]);
    elem /= shape[i];
  }
  return loc;
}
template <typename IdxT = int64_t>
inline IdxT elem_to_loc(uint3 elem, constant const int* shape,
                        constant const int64_t* strides, int ndim) {
  IdxT loc = elem.x * IdxT(strides[ndim - 1]) + elem.y * IdxT(strides[ndim - 2]);
  for (int d = ndim - 3; d >= 0; --d) {
    loc += (elem.z % shape[d]) * IdxT(strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}
template <typename T, typename U>
inline T ceildiv(T N, U M) {
  return (N + M - 1) / M;
}
"""


def attributes(source: str) -> list:
    """The attribute parameters the source needs (MLX: a substring test per attribute)."""
    return [f"  {t} {a} [[{a}]]" for a, t in METAL_ATTRIBUTES if a in source]


def template_text(template: Sequence[tuple]) -> str:
    """``<float, 3, 1>``: dtypes by their type string, ints, bools as 0 / 1 (MLX's ostream)."""
    vals = []
    for _, v in template:
        if isinstance(v, bool):
            vals.append("1" if v else "0")
        elif isinstance(v, int):
            vals.append(str(v))
        else:
            vals.append(type_string(v))
    return "<" + ", ".join(vals) + ">"


def template_hash(text: str) -> str:
    """MLX's make_template_hash: ``<`` and ``>`` -> ``_``, ``", "`` -> ``_``, last char dropped."""
    return text.replace("<", "_").replace(">", "_").replace(", ", "_")[:-1]


@dataclass
class Input:
    """What the signature needs to know of an input array."""

    dtype: np.dtype
    ndim: int
    size: int


def kernel_name(name: str, inputs: Sequence[Input], output_dtypes: Sequence,
                template: Sequence[tuple]) -> str:
    out = "custom_kernel_" + name
    if template:
        out += "_" + template_hash(template_text(template))
    for x in inputs:
        out += "_" + type_string(x.dtype)
        if x.ndim == 0:
            out += "s"
        elif x.size < MAX_CONSTANT_ARRAY_SIZE:
            out += "c"
    for dt in output_dtypes:
        out += "_" + type_string(dt)
    return out


def write_source(name: str, input_names: Sequence[str], output_names: Sequence[str],
                 source: str, header: str, atomic_outputs: bool, inputs: Sequence[Input],
                 output_dtypes: Sequence, template: Sequence[tuple]) -> tuple:
    """(kernel name, the kernel's source as MLX writes it, without ``PRELUDE``)."""
    kname = kernel_name(name, inputs, output_dtypes, template)
    infos = shape_infos(source, input_names)
    attrs = attributes(source)
    s = header
    if template:
        kinds = ["bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "typename"
                 for _, v in template]
        s += "template <" + ", ".join(f"{k} {n}" for k, (n, _) in zip(kinds, template)) + ">\n"
    s += f"[[kernel]] void {kname}(\n"
    params, index = [], 0
    for n, x, (sh, st, nd) in zip(input_names, inputs, infos):
        loc = "constant" if x.size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if x.ndim == 0 else "*"
        params.append(f"  const {loc} {type_string(x.dtype)}{ref} {n} [[buffer({index})]]")
        index += 1
        if x.ndim > 0:
            for flag, text in ((sh, f"  const constant int* {n}_shape"),
                               (st, f"  const constant int64_t* {n}_strides"),
                               (nd, f"  const constant int& {n}_ndim")):
                if flag:
                    params.append(f"{text} [[buffer({index})]]")
                    index += 1
    for n, dt in zip(output_names, output_dtypes):
        t = f"atomic<{type_string(dt)}>" if atomic_outputs else type_string(dt)
        params.append(f"  device {t}* {n} [[buffer({index})]]")
        index += 1
    params += attrs
    s += ",\n".join(params) + ") {\n" + source + "\n}\n"
    if template:
        inst = kname + template_text(template)
        s += (f'\ntemplate [[host_name("{kname}")]] [[kernel]] decltype({inst}) {inst};\n')
    return kname, s


def buffers(inputs: Sequence[np.ndarray], data: Sequence[np.ndarray], infos: Sequence[tuple],
            outputs: Sequence[np.ndarray]) -> dict:
    """The buffers in signature order: per input its ``data``, then its shape (int32),
    strides (int64, in elements) and ndim (int32) where the source uses them; the outputs."""
    out, k = {}, 0
    for a, d, (sh, st, nd) in zip(inputs, data, infos):
        out[k] = d
        k += 1
        if a.ndim > 0:
            for flag, val in ((sh, np.asarray(a.shape, np.int32)),
                              (st, np.asarray([s // a.itemsize for s in a.strides], np.int64)),
                              (nd, np.asarray(a.ndim, np.int32))):
                if flag:
                    out[k] = val
                    k += 1
    for o in outputs:
        out[k] = o
        k += 1
    return out


def run(inputs, *, kernel_name, source, grid, threadgroup, shape_infos, ensure_row_contiguous,
        init_value, output_shapes, output_dtypes) -> tuple:
    """``CustomKernel::eval_gpu`` (mlx/backend/metal/custom_kernel.cpp) through the shim:
    outputs filled with ``init_value`` (else uninitialised), inputs copied to row-contiguous
    when asked, buffers bound in signature order, one dispatch of ``grid`` threads."""
    from . import shim

    arrays = [np.asarray(a) for a in inputs]
    if ensure_row_contiguous:
        arrays = [np.ascontiguousarray(a) for a in arrays]
    outs = [np.full(tuple(shp), init_value, dtype=dt) if init_value is not None
            else np.empty(tuple(shp), dtype=dt) for shp, dt in zip(output_shapes, output_dtypes)]
    bufs = buffers(arrays, [_bound(a) for a in arrays], shape_infos, [o.reshape(-1) for o in outs])
    lib = shim.Library([PRELUDE + source], [shim.Entry(0, kernel_name)])
    lib.run(0, bufs, grid, threadgroup)
    return tuple(outs)


def _bound(a: np.ndarray) -> np.ndarray:
    """The memory an input binds, starting at its first element: the flat run its strides
    reach (negative strides reach below the start; its shape and strides are bound beside
    it when the source uses them)."""
    if a.ndim == 0 or a.flags.c_contiguous or a.size == 0:
        return np.ascontiguousarray(a).reshape(-1) if a.ndim else np.ascontiguousarray(a)
    isz = a.itemsize
    st = [s // isz for s in a.strides]
    lo = sum(s * (n - 1) for s, n in zip(st, a.shape) if s < 0)
    hi = sum(s * (n - 1) for s, n in zip(st, a.shape) if s > 0)
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    off = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    run = np.ndarray((hi - lo + 1,), a.dtype, buffer=root, offset=off + lo * isz, strides=(isz,))
    return np.ascontiguousarray(run)[-lo:]
