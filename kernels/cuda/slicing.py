"""MLX's ``SliceUpdate`` (``a[..., i:j, :] = v``: a KV cache's write) on an NVIDIA GPU as MLX's
CUDA backend runs it (mlx/backend/gpu/primitives.cpp ``SliceUpdate::eval_gpu``: ``copy_gpu``
of the input into the output, then ``copy_gpu_inplace`` of the update into the output's
window at ``prepare_slice``'s offset and strides; mlx/backend/gpu/copy.cpp
``set_copy_output_data``: a donatable input's buffer becomes the output's, and the first copy
is skipped).

A ``KernelRule`` whose plan for a call layout (``SlicePlan``) is two launches: the input
copied into a fresh output (the strided copy kernel ``cuda/indexing.py``'s scatter starts
with), then the update copied into the output's window (``_window_source``: each update
element to ``offset + sum(c_d * so_d)`` of the output); its ``in_place`` plan is the second
launch alone. The eval loop (``core/_loop.c`` run_host) launches from C the ``in_place`` plan
into the input's own buffer where that input may give it (``KernelRule.donor``:
``evaluate._donor``'s test, MLX's ``is_donatable``: nobody else holds the array or its buffer,
row-contiguous, same item size), so a cache's write moves the update's elements, not the
cache; else the whole plan into a fresh buffer (a non-donatable input is read, never
written). bfloat16 moves its storage's bits (``takes_bfloat16``). A reducing update (MLX's
``SliceUpdate Sum`` etc.), an empty update, a window not of the update's shape or strides
that are not whole elements run the definition's rule (``slow``).
"""

from __future__ import annotations

from typing import Optional

import cupy
import numpy as np

from .. import kernel_registry
from ..common.strides import elem_strides as _elem_strides
from ..kernel_call import KernelRule
from ..primitives import REGISTRY
from ..rules.indexing import _slices
from . import bfloat16 as bf16, compiled
from .bfloat16 import BF16Array
from .indexing import _MOVE, AxisPlan, _copy_source, _empty, _fits, _ints


def _window_source(name: str, elem: str, ndim: int) -> str:
    """A strided copy of ``u`` (any strides) into the window of ``out`` that starts at element
    ``offset`` and steps ``so_d`` along dimension ``d`` (MLX's ``CopyType::GeneralGeneral``),
    element by element (``elem``: the bytes' type)."""
    dims = ", ".join(f"long long n{d}, long long su{d}, long long so{d}" for d in range(ndim))
    walk = "\n".join(f"    {{ const long long c = r % n{d}; r /= n{d}; uo += c * su{d}; oo += c * so{d}; }}"
                     for d in reversed(range(ndim)))
    return f"""extern "C" __global__ void {name}(const {elem}* __restrict__ u,
    {elem}* __restrict__ out, long long n, long long offset{", " + dims if dims else ""}) {{
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {{
    long long r = t, uo = 0, oo = offset;
{walk}
    out[oo] = u[uo];
  }}
}}
"""


def window(shape: tuple, start_indices, end_indices, strides) -> Optional[tuple]:
    """(the window's shape, its first element's offset and its element strides) in a
    row-major array of ``shape`` (MLX's ``prepare_slice``), bounds as the definition's rule
    reads them (``rules/indexing.py`` ``_slices``); None for an empty window."""
    row, acc = [0] * len(shape), 1
    for d in reversed(range(len(shape))):
        row[d] = acc
        acc *= int(shape[d])
    sizes, offset, steps = [], 0, []
    for d, sl in enumerate(_slices(start_indices, end_indices, strides)):
        r = range(int(shape[d]))[sl]
        if len(r) == 0:
            return None
        sizes.append(len(r))
        offset += r.start * row[d]
        steps.append(r.step * row[d])
    return tuple(sizes), offset, tuple(steps)


class SlicePlan(AxisPlan):
    """A SliceUpdate's two launches (the input's copy into the output, then the update into
    its window: ``then``) and ``in_place``, the window's launch alone, for an output that is
    the input's own buffer. The window's first element is the call's (``KernelRule.per_call``:
    its start indices times the output's row strides, ``linear``, into ``at``: input 2 of
    the call, read by value into the window launch's offset word)."""

    __slots__ = ("in_place", "linear", "at")


def _kernels(elem: str, ndim_a: int, ndim_u: int):
    """(copy name, its entry, window name, its entry); BuildError without them."""
    cname = f"copy_strided_{elem.replace(' ', '_')}_{ndim_a}d"
    wname = f"copy_window_{elem.replace(' ', '_')}_{ndim_u}d"
    copy = compiled.get_kernel(cname, f"{ndim_a}d", lambda: _copy_source(cname, elem, ndim_a),
                               key=cname)
    win = compiled.get_kernel(wname, f"{ndim_u}d", lambda: _window_source(wname, elem, ndim_u),
                              key=wname)
    return cname, copy, wname, win


def _plan(a, update, *, start_indices, end_indices, strides, reduce="none") -> Optional[SlicePlan]:
    """The plan of a SliceUpdate of these layouts (None: the definition's rule runs it)."""
    half = type(a) is BF16Array
    ra, ru = (a.raw, bf16.storage(update)) if half else (a, update)
    if (reduce != "none" or type(ra) is not cupy.ndarray or type(ru) is not cupy.ndarray
            or update.dtype != a.dtype or ra.itemsize not in _MOVE or ra.ndim != ru.ndim):
        return None
    win = window(ra.shape, start_indices, end_indices, strides)
    sa, su = _elem_strides(ra), _elem_strides(ru)
    if win is None or win[0] != tuple(ru.shape) or sa is None or su is None:
        return None
    sizes, _, so = win
    try:
        cname, copy, wname, entry = _kernels(_MOVE[ra.itemsize], ra.ndim, ru.ndim)
    except kernel_registry.BuildError:
        return None
    n, ints = _ints(sizes, (su, so), None)
    ints.insert(1, 0)  # (the kernel's arguments: n, offset (per call), then per dimension)
    row = [1] * ra.ndim  # the output's row-major element strides
    for d in reversed(range(ra.ndim - 1)):
        row[d] = row[d + 1] * int(ra.shape[d + 1])
    linear, at = (("start_indices", tuple(row)),), np.zeros((), np.int64)
    # the update's launch writes the output's window: input 1 into word 1, the offset (input
    # 2, the call's ``at``) by value into word 3
    write = SlicePlan(entry, wname, (1,), 1, ints, n, a.shape, a.dtype, "SliceUpdate",
                      checked=False)
    write.values = ((2, 3, 8),)
    m, cints = _ints(ra.shape, (sa,), None)
    plan = SlicePlan(copy, cname, (0,), 1, cints, m, a.shape, a.dtype, "SliceUpdate",
                     then=(write,), checked=False)
    for p in (plan, write):
        p.linear, p.at = linear, at
    write.in_place, plan.in_place = None, write
    return plan


def donated(out, a) -> bool:
    """Whether ``out`` (the evaluator's buffer) is ``a``'s own memory, row-contiguous: the
    donation ``evaluate._output_buffer`` made, which the plan's ``in_place`` writes."""
    to, ta = bf16.storage(out), bf16.storage(a)
    return (type(to) is cupy.ndarray and type(ta) is cupy.ndarray and to.data.ptr == ta.data.ptr
            and to.shape == ta.shape and to.flags.c_contiguous and ta.flags.c_contiguous)


def slice_update(xp, a, update, *, out=None, **kw):
    """The rule where no plan takes the call: the definition's (into ``out``, the evaluator's
    buffer, as the definition's rule writes it); bfloat16 as ``bfloat16.rule`` takes it (an
    assignment: its bits moved; a reduction: on float32 values, rounded back)."""
    rule = REGISTRY["SliceUpdate"].rule
    if type(a) is not BF16Array and type(update) is not BF16Array:
        return rule(xp, a, update, out=out, **kw)
    if kw.get("reduce", "none") != "none":
        return bf16.cast(rule(xp, bf16.value(a), bf16.value(update), **kw), bf16.BF16)
    target = None if out is None else bf16.storage(out)
    res = rule(xp, bf16.storage(a), bf16.storage(update), out=target, **kw)
    return out if target is not None and res is target else BF16Array(res)


slice_update.takes_bfloat16 = True  # (its bits moved; cuda/backend.py widens nothing)


RULES: dict = {"SliceUpdate": KernelRule("SliceUpdate", _plan, slice_update, _fits, _empty,
                                         donor=0, donated=donated,
                                         per_call=("start_indices", "end_indices"))}
