"""Running one graph node: its rule on the CPU, output memory (allocation, donation), detaching."""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np

from tapescope.kernels import timeline
from tapescope.kernels.allocator import BufferHandle, allocator, owner_of

from . import dtypes as _dt
from .array import ArrayDesc, adopt
from .primitive import Node

_BF16 = _dt.bfloat16


DONATION_SLACK = 16384  # MLX: an input donates only if its buffer <= output bytes + 16 KiB


class _Probe:
    __slots__ = ("buffer",)


def _baseline_refcounts() -> tuple[int, int]:
    """What ``sys.getrefcount`` reports, in ``_donor``'s own expressions, for a desc held only
    by its node's input list and for a handle held only by its desc (the counts of the loop
    variable and of the call's argument differ between Python versions)."""
    holder = [_Probe()]
    holder[0].buffer = object()
    desc_refs = handle_refs = 0
    for d in holder:
        desc_refs = sys.getrefcount(d)
        handle_refs = sys.getrefcount(d.buffer)
    return desc_refs, handle_refs


# a desc nobody but node.inputs holds / a buffer handle nobody but its desc holds
_DESC_REFS, _HANDLE_REFS = _baseline_refcounts()


def _donor(node: Node, out: ArrayDesc, nbytes: int) -> Optional[ArrayDesc]:
    """An input whose buffer nobody else holds and that can become ``out``'s (MLX's rules);
    ``nbytes`` is the output's size in bytes."""
    for d in node.inputs:
        if sys.getrefcount(d) != _DESC_REFS:  # held elsewhere: the cheap, usual rejection
            continue
        data = d.data
        if (d.buffer is not None and d.dtype.size == out.dtype.size and data.shape == out.shape
                and (data.flags.c_contiguous or data.flags.f_contiguous)
                and data.flags.writeable  # broadcast views are read-only: never donate them
                and d.buffer.buffer.size <= nbytes + DONATION_SLACK
                and sys.getrefcount(d.buffer) == _HANDLE_REFS):
            return d
    return None


def _output_buffer(node: Node, out: ArrayDesc):
    """Memory for a single output: a donated input's buffer or a fresh allocator buffer."""
    dtype = out.dtype
    nbytes = dtype.size
    for s in out.shape:
        nbytes *= s
    donor = _donor(node, out, nbytes)
    if donor is not None:
        return donor.data.view(dtype.np), donor.buffer
    buf = _CPU.malloc(nbytes)
    return buf.view(nbytes, dtype.np, out.shape), BufferHandle(buf, _CPU)


def _store(value, desc: ArrayDesc, inputs: list[ArrayDesc], out_handle) -> None:
    """Give ``desc`` the rule's result, exactly its dtype and shape, with the handle of the
    buffer it lives in (the preallocated output, an input it is a view of, or adopted)."""
    data = value if isinstance(value, np.ndarray) else np.asarray(value)
    if data.dtype != desc.dtype.np:
        data = data.astype(desc.dtype.np)
    if data.shape != desc.shape:
        data = data.reshape(desc.shape)
    owner = owner_of(data)
    handle = None
    if out_handle is not None and owner is owner_of(out_handle.buffer.raw):
        handle = out_handle
    else:
        for d in inputs:
            if d.buffer is not None and owner is owner_of(d.buffer.buffer.raw):
                handle = d.buffer
                break
    if handle is None:
        if not isinstance(owner, np.ndarray) or not owner.flags.owndata:
            # a view of memory we do not track: copy it in
            data = owner = np.array(data)
        handle = adopt(owner)
    desc.set_data(data, handle)


_CPU = allocator("cpu")


def run_node(node: Node) -> None:
    """Compute a node's outputs with the CPU rule for its primitive and detach it."""
    prim = node.primitive
    defn = prim.defn  # the definition: rule, out= / donatable= flags, view, family
    fn = defn.rule
    inputs = node.inputs
    ins = [d.data for d in inputs]
    # bfloat16 math is done in float32 and rounded back, as MLX's CPU backend does. (No loop
    # variable may outlive a check over ``inputs``: it would hold an input and stop donation.)
    upcast = defn.elementwise and _any_bfloat16(inputs)
    if upcast:
        ins = [x.astype(np.float32) if x.dtype == _BF16.np else x for x in ins]
    t0 = timeline.now() if timeline.enabled else 0
    out_handle = None
    outputs = node.outputs
    if defn.view:  # only views: no floating-point warnings to silence
        res = fn(np, *ins, **prim.kw)
    else:
        res = _compute(node, prim, fn, defn.takes_out, upcast, ins, outputs, t0)
        if res is _DONE:
            return
        out_handle, res = res
    if not isinstance(res, (tuple, list)):
        res = (res,)
    nbytes = 0
    for ref, value in zip(outputs, res):
        d = ref()
        if d is not None:
            _store(value, d, inputs, out_handle)
            nbytes += d.data.nbytes
    node.inputs = []
    if t0:
        _record(prim, node, t0, nbytes)


_DONE = object()


def _any_bfloat16(inputs: list) -> bool:
    for d in inputs:
        if d.dtype is _BF16:
            return True
    return False


def _quiet_numpy():
    """A context that silences numpy's floating-point warnings (MLX has none).

    ``np.errstate`` costs ~1.7 us per use; numpy 2 keeps the state in a context variable,
    so where that exists the ignore-all state is made once and set / reset directly."""
    try:
        from numpy._core._ufunc_config import _extobj_contextvar as var
    except ImportError:  # another numpy: the public, slower way
        return lambda: np.errstate(all="ignore")
    with np.errstate(all="ignore"):
        ignore_all = var.get()

    class _Quiet:
        __slots__ = ("token",)

        def __enter__(self):
            self.token = var.set(ignore_all)

        def __exit__(self, *exc):
            var.reset(self.token)
            return False

    return _Quiet


_quiet = _quiet_numpy()


def _compute(node: Node, prim, fn, takes_out: bool, upcast: bool, ins: list, outputs: list,
             t0: int):
    """Run a computing rule (floating-point warnings silenced, as MLX has none), into an
    allocator buffer when it takes ``out=``. Returns (out handle, result), or _DONE when the
    result is already stored."""
    out_handle = out = None
    with _quiet():
        if takes_out and not upcast and len(outputs) == 1:
            target = outputs[0]()
            if target is None:  # nobody wants the result
                node.inputs = []
                return _DONE
            out, out_handle = _output_buffer(node, target)
            try:
                res = fn(np, *ins, out=out, **prim.kw)
            except TypeError:  # numpy cannot cast into ``out``: let the rule allocate
                out_handle = out = None
                res = fn(np, *ins, **prim.kw)
            if res is out:  # the common case: the result is exactly the prepared buffer
                target.set_data(out, out_handle)
                node.inputs = []
                if t0:
                    _record(prim, node, t0, out.nbytes)
                return _DONE
        elif prim.defn.takes_donatable:
            res = fn(np, *ins, donatable=_donatable_inputs(node), **prim.kw)
        else:
            res = fn(np, *ins, **prim.kw)
    return out_handle, res


def _donatable_inputs(node: Node) -> list:
    """Per input: whether nobody but this node holds it and its buffer (MLX's use_count == 1),
    so a rule may give its memory to an output."""
    flags = []
    for d in node.inputs:
        flags.append(sys.getrefcount(d) == _DESC_REFS and d.buffer is not None
                     and sys.getrefcount(d.buffer) == _HANDLE_REFS and d.data.flags.writeable)
    return flags


def _record(prim, node: Node, t0: int, nbytes: int) -> None:
    timeline.add("primitive", t0, timeline.now(), name=prim.name, node=node.id,
                 stream=prim.stream.index, device=prim.stream.device.type.name, nbytes=nbytes)
