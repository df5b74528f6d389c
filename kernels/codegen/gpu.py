"""The GPU schedule: the loops of a fused kernel on a GPU, over any C-family dialect.

MLX's variants (seed map 001b §3.4-3.5): ``_contiguous`` (each thread computes
``work_per_thread`` consecutive elements: ``max(1, bytes_per_thread / itemsize)``, MLX's
Metal ``get_work_per_thread`` with 8 bytes), ``_strided_<n>`` for n = 1..``max_static_ndim``
(the element's location in each input from the shape and the input's strides, the dimension
loop unrolled; 1 element per thread for n <= 3, 2 above), ``_strided_dynamic`` for more
dimensions (``ndim`` is an argument), and the ``_large`` forms of each (64-bit index; 4
elements per thread above 3 dimensions). Outputs are written row-contiguous at the element's
linear index. The launch (grid, block) is the runtime's: ``block_size`` is the schedule's
threads per block, written into the kernel where the dialect has launch bounds.

The dialect supplies: ``index_types`` (32-bit / large), ``param(kind, name, type, k)``, the
thread-position parameters and ``thread_index``, ``kernel_prefix`` and ``unroll``; and
optionally a ``completion_word``: two last parameters and the lines that end the kernel
with them (the early exits then jump to those lines instead of returning).
"""

from __future__ import annotations

import numpy as np

from .tape import Tape


class GpuSchedule:
    """Elements per thread, vector width and block size of a GPU runtime's kernels."""

    def __init__(self, bytes_per_thread: int = 8, block_size: int = 256, max_static_ndim: int = 7,
                 strided_wpt: tuple = (1, 2, 4)):
        self.bytes_per_thread = bytes_per_thread  # contiguous: work per thread = this / itemsize
        self.block_size = block_size
        self.max_static_ndim = max_static_ndim  # above this: the ``_strided_dynamic`` kernel
        self.strided_wpt = strided_wpt  # ndim <= 3, ndim > 3, ndim > 3 and large
        self.preamble = ""

    def work_per_thread(self, tape: Tape, contiguous: bool, ndim: int, large: bool) -> int:
        if contiguous:
            isz = min(np.dtype(tape.dtype_of(n)).itemsize for n in tape.outputs)
            return max(1, self.bytes_per_thread // isz)
        if ndim <= 3:
            return self.strided_wpt[0]
        return self.strided_wpt[2] if large else self.strided_wpt[1]

    def render(self, d, tape: Tape, kernel_name: str, contiguous: bool, ndim: int,
               large: bool, preamble: bool = True) -> str:
        idx = d.index_types[large]
        dynamic = not contiguous and ndim > self.max_static_ndim
        wpt = self.work_per_thread(tape, contiguous, ndim, large)
        args = d.arguments(tape, contiguous)
        if dynamic:
            args.append(("ndim", "ndim", None))
        word = getattr(d, "completion_word", None)  # (done, seq) parameters, or None
        # shape and strides by value where the dialect takes them so (CUDA: MLX passes them
        # as kernel parameters), so a launch reads nothing a copy must have written first
        fixed = None if dynamic else getattr(d, "fixed_array", None)
        params = [fixed.format(t="int32_t" if kind == "shape" else "int64_t", n=ndim, name=name)
                  if fixed and kind in ("shape", "strides") else
                  d.param(kind, name, d.storage_type(dt) if dt is not None else idx, k)
                  for k, (kind, name, dt) in enumerate(args)] + list(word or ()) + list(d.thread_params)
        prefix = d.kernel_prefix.format(block=self.block_size)
        lines = [d.preamble(tape) if preamble else "", f"{prefix} {kernel_name}(", ",\n".join(f"    {p}" for p in params)
                 + ") {"]
        nd = "ndim" if dynamic else str(ndim)
        arrays = [x for x in tape.non_constant_inputs if not x.scalar]
        scalar = self.scalar_load(d)
        if not contiguous:
            lines.append(f"  {idx} size = 1;")
            lines.append(f"  for (int d = 0; d < {nd}; ++d) size *= ({idx})shape[d];")
        lines.append(f"  const {idx} index0 = ({idx})({d.thread_index[large]}) * {wpt};")
        # with a completion word every thread reaches the end: the early exits jump there
        leave = "goto done;" if word else "return;"
        if contiguous and wpt > 1 and getattr(d, "vector_type", None):
            lines += self._vector_path(d, tape, arrays, wpt, idx, leave)
        if d.unroll:
            lines.append(f"  {d.unroll}")
        lines.append(f"  for (int w = 0; w < {wpt}; ++w) {{")
        lines.append(f"    const {idx} index = index0 + w;")
        lines.append(f"    if (index >= size) {leave}")
        if contiguous:
            loads = {x.name: scalar(x) if x.scalar else f"{x.name}[index]"
                     for x in tape.non_constant_inputs}
        else:
            loads = {x.name: scalar(x) if x.scalar else f"{x.name}[{x.name}_loc]"
                     for x in tape.non_constant_inputs}
        if not contiguous and arrays:
            # the element's location in each input (MLX's elem_to_loc), innermost dim first
            lines.append(f"    {idx} rem = index;")
            lines.append("    int64_t " + ", ".join(f"{x.name}_loc = 0" for x in arrays) + ";")
            if d.unroll and not dynamic:
                lines.append(f"    {d.unroll}")
            lines.append(f"    for (int d = {nd} - 1; d >= 0; --d) {{")
            lines.append(f"      const {idx} q = rem % ({idx})shape[d];")
            lines.append(f"      rem /= ({idx})shape[d];")
            for x in arrays:
                lines.append(f"      {x.name}_loc += (int64_t)q * {x.name}_strides[d];")
            lines.append("    }")
        lines += d.body(tape, loads, "    ")
        lines += d.stores(tape, lambda o: f"{o}[index]", "    ")
        lines.append("  }")
        if word:
            lines += d.completion_word_store
        lines.append("}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def scalar_load(d):
        """How a scalar input is read: its parameter itself where the dialect takes it by
        value (``scalar_by_value``), else its pointer's first element."""
        values = getattr(d, "scalar_by_value", False)
        return lambda x: x.name if values and x.by_value else f"{x.name}[0]"

    @staticmethod
    def _vector_path(d, tape: Tape, arrays: list, wpt: int, idx: str, leave: str) -> list:
        """The contiguous kernel's whole-vector case: a thread whose ``wpt`` elements are all
        in range, and every array's run of them aligned to its size (one test per array,
        the same for every thread: ``index0`` is a multiple of ``wpt``), loads and stores
        each array's run in one access (16 bytes for the narrowest output type) instead of
        ``wpt`` scalar ones; the element loop below is the tail and the unaligned case."""
        vec = d.vector_type  # "{type}, {n}" -> the vector type of n elements
        outs = d.outputs(tape)
        runs = [(x.name, d.storage_type(x.dtype)) for x in arrays] + \
               [(o, d.storage_type(dt)) for o, _, dt in outs]
        aligned = " && ".join(f"d_aligned({n} + index0, sizeof({vec.format(t, wpt)}))"
                              for n, t in runs)
        lines = [f"  if (index0 + {wpt} <= size && {aligned}) {{"]
        for x in arrays:
            t = vec.format(d.storage_type(x.dtype), wpt)
            lines.append(f"    const {t} {x.name}_v = *reinterpret_cast<const {t}*>({x.name} + index0);")
        for o, _, dt in outs:
            lines.append(f"    {vec.format(d.storage_type(dt), wpt)} {o}_v;")
        if d.unroll:
            lines.append(f"    {d.unroll}")
        lines.append(f"    for (int w = 0; w < {wpt}; ++w) {{")
        scalar = GpuSchedule.scalar_load(d)
        loads = {x.name: scalar(x) if x.scalar else f"{x.name}_v.v[w]"
                 for x in tape.non_constant_inputs}
        lines += d.body(tape, loads, "      ")
        lines += d.stores(tape, lambda o: f"{o}_v.v[w]", "      ")
        lines.append("    }")
        for o, _, dt in outs:
            t = vec.format(d.storage_type(dt), wpt)
            lines.append(f"    *reinterpret_cast<{t}*>({o} + index0) = {o}_v;")
        lines.append(f"    {leave}")
        lines.append("  }")
        return lines

    def variants(self) -> list:
        """Every variant of a module, as MLX builds them: (contiguous, ndim, large)."""
        out = [(True, 1, False), (True, 1, True)]
        for n in range(1, self.max_static_ndim + 2):  # the last one: strided_dynamic
            out += [(False, n, False), (False, n, True)]
        return out

    def module(self, d, tape: Tape, lib_name: str) -> str:
        """One source holding every variant (``<lib>_<variant>``), the preamble once: what a
        GPU runtime compiles once per tape, as MLX's Metal library / CUDA module."""
        parts = [d.preamble(tape)]
        for contiguous, ndim, large in self.variants():
            name = f"{lib_name}_{variant_suffix(contiguous, ndim, large, self.max_static_ndim)}"
            parts.append(self.render(d, tape, name, contiguous, ndim, large, preamble=False))
        return "".join(parts)


def variant_suffix(contiguous: bool, ndim: int, large: bool, max_static_ndim: int = 7) -> str:
    """MLX's Metal variant name: contiguous, strided_<n> (n <= 7) or strided_dynamic; _large."""
    name = "contiguous" if contiguous else (
        f"strided_{ndim}" if ndim <= max_static_ndim else "strided_dynamic")
    return name + "_large" if large else name
