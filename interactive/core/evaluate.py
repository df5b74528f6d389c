"""Running one graph node: its rule with its device's backend, output memory (allocation,
donation), detaching (unless the node is a tracer's: ``core/transform_tracers.py``).

Nothing here names an array module or a device: ``stream_backend(stream)`` (``kernels.backends``)
gives the array module the rule computes with, the allocator the outputs come from, how a
result becomes the device's array, and the compiled-kernel runtime of fused tapes."""

from __future__ import annotations

import functools
import sys
from typing import Optional

from tapescope.kernels import timeline
from tapescope.kernels.allocator import BufferHandle
from tapescope.kernels.backends import backend, stream_backend
from tapescope.kernels.codegen.layout import Layout
from tapescope.kernels.kernel_call import KernelRule
from tapescope.kernels.primitives import ASTYPE
from tapescope.kernels.settings import settings

from . import dtypes as _dt
from . import transform_tracers as tracer
from .array import ArrayDesc
from .primitive import Node

_BF16 = _dt.bfloat16
_F32 = _dt.float32.np


DONATION_SLACK = 16384  # MLX: an input donates only if its buffer <= output bytes + 16 KiB

# The dispatch paths a node can take, counted by the loop whether or not the timeline
# records (so a test can show that recording changes nothing but the records):
# the rule's result stored (adopted or a view of an input); the rule into an output buffer
# (fresh or donated); a view rule; a loaded fused kernel launched into its output buffer
# (``Backend.launch_fused``), on the host or outside a GPU's device context; a fused tape
# through ``run_compiled``; a GPU's eager elementwise op as its one-op kernel
# (``Backend.eager_kernel``), launched as a loaded fused call is; the host's (the CPU's
# large ones). (core/_loop.c counts by these indices: its PATH_* enum.)
PATHS = ("rule", "rule_out", "view", "fused_kernel", "fused_kernel_device", "run_compiled",
         "eager_kernel_device", "eager_kernel")
RULE, RULE_OUT, VIEW, FUSED, FUSED_DEVICE, COMPILED, EAGER_DEVICE, EAGER = range(len(PATHS))
_counts = [0] * len(PATHS)


def count(path: int) -> None:
    """One more node on ``path`` (one of ``PATHS``' indices)."""
    _counts[path] += 1


def dispatch_counts() -> dict:
    """How many nodes took each dispatch path since the process started (or the last
    ``reset_dispatch_counts``)."""
    return dict(zip(PATHS, _counts))


def reset_dispatch_counts() -> None:
    for i in range(len(_counts)):
        _counts[i] = 0


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


def _donor(node: Node, out: ArrayDesc, nbytes: int, at: type,
           st: Optional[type] = None) -> Optional[ArrayDesc]:
    """An input whose buffer nobody else holds and that can become ``out``'s (MLX's rules);
    ``nbytes`` is the output's size in bytes, ``at`` the device's array type and ``st`` its
    storage type (a host input of a GPU node is not its memory). A tracer's node keeps its
    inputs: none."""
    if node.keep:
        return None
    for d in node.inputs:
        if sys.getrefcount(d) != _DESC_REFS:  # held elsewhere: the cheap, usual rejection
            continue
        data = d.data
        if (d.buffer is not None and (type(data) is at or type(data) is st)
                and d.dtype.size == out.dtype.size
                and data.shape == out.shape
                and (data.flags.c_contiguous or data.flags.f_contiguous)
                and getattr(data.flags, "writeable", True)  # broadcast views are read-only
                and d.buffer.buffer.size <= nbytes + DONATION_SLACK
                and sys.getrefcount(d.buffer) == _HANDLE_REFS):
            return d
    return None


def _output_buffer(node: Node, out: ArrayDesc, be, order: str = "C"):
    """Memory for a single output: a donated input's buffer or a fresh buffer of the
    backend's allocator, viewed in ``order`` ("F": column order, as a one-op kernel of a
    transposed input writes it)."""
    dtype = out.dtype
    nbytes = dtype.size
    for s in out.shape:
        nbytes *= s
    donor = _donor(node, out, nbytes, be.array_type, be.storage_type)
    if donor is not None:
        return donor.data.view(dtype.np), donor.buffer
    return _fresh_buffer(out, nbytes, be, order)


def _fresh_buffer(out: ArrayDesc, nbytes: int, be, order: str = "C"):
    """A buffer of the backend's allocator for ``out`` (``nbytes`` long), viewed in
    ``order`` ("F": column order)."""
    alloc = be.allocator
    buf = alloc.malloc(nbytes)
    if order == "F":
        return buf.view(nbytes, out.dtype.np, out.shape[::-1]).T, BufferHandle(buf, alloc)
    return buf.view(nbytes, out.dtype.np, out.shape), BufferHandle(buf, alloc)


def _store(value, desc: ArrayDesc, inputs: list[ArrayDesc], out_handle, be) -> None:
    """Give ``desc`` the rule's result, exactly its dtype and shape, with the handle of the
    buffer it lives in (the preallocated output, an input it is a view of, or adopted)."""
    data = be.to_device(value)
    if data.dtype != desc.dtype.np:
        data = data.astype(desc.dtype.np)
    if data.shape != desc.shape:
        data = data.reshape(desc.shape)
    alloc = be.allocator
    memory = alloc.memory_of(data)
    handle = None
    if out_handle is not None and memory is alloc.memory_of(out_handle.buffer.raw):
        handle = out_handle
    else:
        for d in inputs:
            if d.buffer is not None and memory is alloc.memory_of(d.buffer.buffer.raw):
                handle = d.buffer
                break
    if handle is None:
        owner = alloc.owner(data)
        if owner is None:  # a view of memory we do not track: copy it in (its layout kept)
            data = data.copy(order="K")
            owner = alloc.owner(data)
        handle = BufferHandle(alloc.adopt(owner), alloc)
    desc.set_data(data, handle)


def _run_node(node: Node) -> None:
    """Compute a node's outputs with its primitive's rule on the backend of the primitive's
    stream's device (in its device context: a GPU's stream), and detach it."""
    prim = node.primitive
    be = stream_backend(prim.stream)
    defn = prim.defn
    if be.device_context is None:  # the host: a generated kernel where the backend has one
        if _one_op(defn, be) and _eager_launch(node, prim, be, EAGER):
            return
        _run(node, prim, be, be.kernel_rules.get(prim.name))
        return
    if defn.takes_runtime and _gpu_fused_launch(node, prim, be):
        return
    if _one_op(defn, be) and _eager_launch(node, prim, be, EAGER_DEVICE):
        return
    if defn.view and _host_values(node):  # a Python scalar's Broadcast: a host view of it
        _host_view(node, prim)
        return
    # a GPU: in its stream's context, with its own rule where it has one (CUDA, Metal)
    context = be.device_context(prim.stream, node)
    with context:
        _run(node, prim, be, context.rule)


def _run(node: Node, prim, be, fn=None) -> None:
    defn = prim.defn  # the definition: rule, out= / donatable= flags, view, family
    fn = fn or defn.rule
    inputs = node.inputs
    ins = [d.data for d in inputs]
    # bfloat16 math is done in float32 and rounded back, as MLX's CPU backend does. (No loop
    # variable may outlive a check over ``inputs``: it would hold an input and stop donation.)
    at = be.array_type
    for x in ins:
        if type(x) is not at:  # another device's array (or a host one on a GPU): move it in
            # before the upcast below: a host bfloat16 broadcast (a Python scalar's) moves as
            # one element, not widened to its whole shape on the host first
            ins = [be.to_device(x) for x in ins]
            break
    upcast = defn.elementwise and _any_bfloat16(inputs)
    if upcast:  # (a GPU's bfloat16 arrays widen lazily: cuda/bfloat16.py's Widened)
        ins = [x.astype(_F32) if x.dtype == _BF16.np else x for x in ins]
    t0 = timeline.now() if timeline.enabled else 0
    out_handle = None
    outputs = node.outputs
    if defn.view:  # only views: no floating-point warnings to silence
        _counts[VIEW] += 1
        res = fn(be.xp, *ins, **prim.kw)
    else:
        res = _compute(node, prim, fn, be, upcast, ins, outputs, t0)
        if res is _DONE:
            return
        out_handle, res = res
    _finish(node, prim, be, res, out_handle, t0)


def _finish(node: Node, prim, be, res, out_handle, t0: int) -> None:
    """Store a rule's result (one array, or one per output) on the node's outputs, detach
    the node and record it (``t0``: when it started, 0 while the timeline is off)."""
    if not isinstance(res, (tuple, list)):
        res = (res,)
    inputs = node.inputs
    nbytes = 0
    for ref, value in zip(node.outputs, res):
        d = ref()
        if d is not None:
            _store(value, d, inputs, out_handle, be)
            nbytes += d.data.nbytes
    _detach(node)
    if t0:
        _record(prim, node, t0, nbytes)


def _detach(node: Node) -> None:
    """Drop the evaluated node's inputs (MLX's ``detach``), or keep it on its outputs when
    it is a tracer's (MLX keeps a tracer's graph)."""
    if node.keep:
        tracer.keep(node)
    else:
        node.inputs = []


_DONE = object()


def _any_bfloat16(inputs: list) -> bool:
    for d in inputs:
        if d.dtype is _BF16:
            return True
    return False


def _compute(node: Node, prim, fn, be, upcast: bool, ins: list, outputs: list, t0: int):
    """Run a computing rule with the backend's array module (floating-point warnings
    silenced, as MLX has none), into an allocator buffer when it takes ``out=``. A fused
    tape's rule gets the backend's compiled-kernel runtime. Returns (out handle, result),
    or _DONE when the result is already stored."""
    out_handle = out = None
    defn = prim.defn
    xp = be.xp
    kw = prim.kw
    if defn.takes_runtime:
        if _fused_launch(node, prim, be, ins, t0, FUSED):
            return _DONE
        kw = {**kw, "runtime": be.run_compiled}
    with be.quiet():
        if defn.takes_out and not upcast and len(outputs) == 1:
            target = outputs[0]()
            if target is None:  # nobody wants the result
                _detach(node)
                return _DONE
            out, out_handle = _output_buffer(node, target, be)
            try:
                res = fn(xp, *ins, out=out, **kw)
            except TypeError:  # the array module cannot cast into ``out``: let the rule allocate
                out_handle = out = None
                res = fn(xp, *ins, **kw)
            if res is out:  # the common case: the result is exactly the prepared buffer
                _counts[COMPILED if defn.takes_runtime else RULE_OUT] += 1
                target.set_data(out, out_handle)
                _detach(node)
                if t0:
                    _record(prim, node, t0, out.nbytes)
                return _DONE
        elif defn.takes_donatable:
            res = fn(xp, *ins, donatable=_donatable_inputs(node, be.array_type), **kw)
        else:
            res = fn(xp, *ins, **kw)
    _counts[COMPILED if defn.takes_runtime else RULE] += 1
    return out_handle, res


def _fused_launch(node: Node, prim, be, ins: list, t0: int, path: int) -> bool:
    """A fused call whose kernel is loaded for these layouts: it writes straight into the
    output buffer (no rule, no warning filter: it is generated code), launched by the
    backend's hook ``Backend.launch_fused`` (core/_loop.c run_node does the same steps).
    False when the call needs ``run_compiled``."""
    launch = be.compiled_launch
    outputs = node.outputs
    if launch is None or len(outputs) != 1:
        return False
    kw = prim.kw
    ln = launch(kw["tape"], ins, kw["shape"])
    if ln is None:
        return False
    target = outputs[0]()
    if target is None:  # nobody wants the result
        _detach(node)
        return True
    return _launch_into(node, prim, be, ln, ins, target, t0, path)


def _launch_into(node: Node, prim, be, ln, ins: list, target, t0: int, path: int) -> bool:
    """Plan ``ln`` launched on ``ins`` into ``target``'s output buffer (a dying input's or a
    fresh one: ``_output_buffer``) through ``Backend.launch_fused``, counted on ``path`` and
    recorded from ``t0`` (0: not recorded); False where the plan does not take the buffer."""
    order = getattr(ln, "order", "C")
    out, out_handle = _output_buffer(node, target, be, order)
    if not ln.takes(out):  # a donor's layout the plan does not write: a fresh one
        out, out_handle = _fresh_buffer(target, out.nbytes, be, order)
        if not ln.takes(out):
            return False
    be.launch_fused(prim.stream, ln, ins, out)
    _counts[path] += 1
    target.set_data(out, out_handle)
    _detach(node)
    if t0:
        _record(prim, node, t0, out.nbytes)
    return True


def _gpu_fused_launch(node: Node, prim, be) -> bool:
    """A GPU's fused call on device inputs, launched without entering the stream's device
    context (``launch_fused`` names the stream): the small-call path of
    ``benchmarks/cuda_fusion.py``. Recorded like any node (its host-side span: the
    launch is asynchronous)."""
    at, host, st = be.array_type, backend("cpu").array_type, be.storage_type
    ins = [d.data for d in node.inputs]
    hosted = False
    for x in ins:  # (a host array, a Python scalar's: a constant, or launch_for declines;
        t = type(x)  # the storage type, bfloat16's, the kernels read as it is)
        if t is host:
            hosted = True
        elif t is not at and t is not st:
            return False
    t0 = timeline.now() if timeline.enabled else 0
    if len(node.outputs) != 1:
        return _gpu_fused_outputs(node, prim, be, ins, hosted, t0)
    if _fused_launch(node, prim, be, ins, t0, FUSED_DEVICE):
        return True
    # host scalars taken by value (the backend's eager plans), not uploaded per call
    fused = getattr(be.eager_kernel, "fused", None) if hosted else None
    target = node.outputs[0]() if fused is not None and len(node.outputs) == 1 else None
    if target is None:
        return False
    ln = fused(prim, ins, target.dtype.np, target.shape)
    return ln is not None and _launch_into(node, prim, be, ln, ins, target, t0, FUSED_DEVICE)


def _gpu_fused_outputs(node: Node, prim, be, ins: list, hosted: bool, t0: int) -> bool:
    """A GPU's fused call of several outputs (an optimizer's update: a parameter and its
    moments) from its plan, host scalars by value (the backend's eager plans): each output
    into a donor's buffer or a fresh one (``_fused_outputs``), launched through
    ``launch_fused`` (core/_loop.c device_outputs does the same steps). False: no plan yet
    (``run_compiled`` makes it), or an output nobody holds."""
    targets = [r() for r in node.outputs]
    for t in targets:
        if t is None:
            return False
    kw = prim.kw
    launch = be.compiled_launch
    ln = None if launch is None else launch(kw["tape"], ins, kw["shape"])
    fused = getattr(be.eager_kernel, "fused", None) if hosted and ln is None else None
    if fused is not None:
        ln = fused(prim, ins, None, targets[0].shape)
    if ln is None:
        return False
    outs, handles = _fused_outputs(node, targets, ln, be)
    be.launch_fused(prim.stream, ln, ins, tuple(outs))
    _counts[FUSED_DEVICE] += 1
    nbytes = 0
    for t, o, h in zip(targets, outs, handles):
        t.set_data(o, h)
        nbytes += o.nbytes
    _detach(node)
    if t0:
        _record(prim, node, t0, nbytes)
    return True


def _fused_outputs(node: Node, targets: list, ln, be) -> tuple:
    """Each output's memory, in the tape's order: the buffer of the next input (inputs
    walked once, in order: MLX's Compiled rules, ``cuda/compiled.py`` _outputs) whose value
    that output reads (the plan's ``reads`` masks: the kernels' pointers are restrict) and
    that ``_donor`` would give it, in the order the plan writes; else a fresh buffer."""
    reads = getattr(ln, "reads", None)
    order = getattr(ln, "order", "C")
    at, st = be.array_type, be.storage_type
    inputs = node.inputs
    n = len(inputs) if reads is not None and not node.keep else 0
    outs, handles, k = [], [], 0
    for j in range(len(targets)):
        out = targets[j]
        nbytes = out.dtype.size
        for s in out.shape:
            nbytes *= s
        got = None
        while got is None and k < n:
            i = k
            k += 1
            if not (reads[j] >> i) & 1:
                continue
            d = inputs[i]  # (no loop variable outlives the check: _donor's counts)
            if (sys.getrefcount(d) == _DESC_REFS and d.buffer is not None
                    and (type(d.data) is at or type(d.data) is st)
                    and d.dtype.size == out.dtype.size and d.data.shape == out.shape
                    and (d.data.flags.f_contiguous if order == "F" else d.data.flags.c_contiguous)
                    and getattr(d.data.flags, "writeable", True)
                    and d.buffer.buffer.size <= nbytes + DONATION_SLACK
                    and sys.getrefcount(d.buffer) == _HANDLE_REFS):
                got = (d.data.view(out.dtype.np), d.buffer)
            d = None
        if got is None:
            got = _fresh_buffer(out, nbytes, be, order)
        outs.append(got[0])
        handles.append(got[1])
    return outs, handles


def _one_op(defn, be) -> bool:
    """Whether the backend's eager one-op kernels (``Backend.eager_kernel``) may run a node
    of ``defn``: an elementwise op, or a cast where they plan casts (``casts``)."""
    ek = be.eager_kernel
    return ek is not None and (defn.elementwise
                               or (defn.family == ASTYPE and getattr(ek, "casts", False)))


def _eager_launch(node: Node, prim, be, path: int) -> bool:
    """An eager elementwise op as the backend's one-op kernel (``eager_kernel``: a plan as a
    loaded fused call's; a GPU's, the CPU's large ones), into a donated input's buffer or a
    fresh one (``_output_buffer``), launched through ``launch_fused`` (core/_loop.c run_node
    does the same steps, through the backend's C launch or the plan's C KernelCall), counted
    on ``path``. False: the node's rule runs."""
    outputs = node.outputs
    if len(outputs) != 1:
        return False
    target = outputs[0]()
    if target is None:
        return False
    ins = [d.data for d in node.inputs]
    ln = be.eager_kernel(prim, ins, target.dtype.np, target.shape)
    if ln is None:
        return False
    return _launch_into(node, prim, be, ln, ins, target, timeline.now() if timeline.enabled else 0,
                        path)


def _host_view(node: Node, prim) -> None:
    """A view of host data holding one value, of the same dtype, is that value broadcast to
    the view's shape: a read-only stride-0 host array over the input's memory, which keeps
    the input's buffer. The CPU's rule runs where the input is not one contiguous value
    (a host broadcast) or the view changes its dtype."""
    host = backend("cpu")
    outputs, inputs = node.outputs, node.inputs
    target = outputs[0]() if len(outputs) == 1 and len(inputs) == 1 else None
    if target is not None and target.dtype is inputs[0].dtype and inputs[0].data.ndim == 0:
        d = inputs[0]
        shape = target.shape
        try:
            v = host.array_type(shape, d.data.dtype, d.data, 0, (0,) * len(shape))
        except (TypeError, ValueError, BufferError):  # (no buffer form: bfloat16)
            v = None
        if v is not None:
            t0 = timeline.now() if timeline.enabled else 0
            v.flags.writeable = False  # as a broadcast: writing it would write the scalar
            _counts[VIEW] += 1
            target.set_data(v, d.buffer)
            _detach(node)
            if t0:
                _record(prim, node, t0, v.nbytes)
            return
    _run(node, prim, host)


def _host_values(node: Node) -> bool:
    """Whether every input of a device's node is host data of one value (a Python scalar's
    0-d array, which a GPU keeps on the host, or a host view of one)."""
    host = backend("cpu").array_type
    for d in node.inputs:
        x = d.data
        if type(x) is not host or (x.ndim and any(x.strides)) or x.size == 0:
            return False
    return bool(node.inputs)


def _donatable_inputs(node: Node, at: type) -> list:
    """Per input: whether nobody but this node holds it and its buffer (MLX's use_count == 1),
    so a rule may give its memory to an output."""
    flags = []
    for d in node.inputs:
        flags.append(not node.keep and sys.getrefcount(d) == _DESC_REFS and d.buffer is not None
                     and sys.getrefcount(d.buffer) == _HANDLE_REFS
                     and type(d.data) is at and getattr(d.data.flags, "writeable", True))
    return flags


def _record(prim, node: Node, t0: int, nbytes: int) -> None:
    timeline.add("primitive", t0, timeline.now(), name=prim.name, node=node.id,
                 stream=prim.stream.index, device=prim.stream.device.type.name, nbytes=nbytes)


def _c_loop():
    """core/_call.c configured with the eval loop's objects (its ``run_node``: the common
    node in C, the same steps, else ``_run_node``; its ``topo_order``), or None where
    that extension is not built or is off. It reads each backend's array module,
    allocator, array type, ``compiled_launch`` and ``kernel_rules`` off the backend the
    first time a stream of it runs."""
    if not settings.c_call:
        return None
    try:
        from . import _call
        from tapescope.kernels import backends as _backends
        from tapescope.kernels.allocator import Buffer
        from tapescope.kernels.primitives import PrimitiveDef
        from numpy._core._ufunc_config import _extobj_contextvar as quiet_var
        from tapescope.kernels.cpu.views import broadcast as broadcast_view
        from tapescope.kernels.rules import indexing as indexing_rules
        from tapescope.kernels.rules import shape as shape_rules
    except ImportError:
        return None
    import numpy as np

    from .primitive import Primitive

    cpu = backend("cpu")
    with cpu.quiet():  # the backend's quiet state, set and reset in C
        quiet_value = quiet_var.get()
    _call.configure_loop({
        "python_run": _run_node, "by_stream": _backends._by_stream,
        "handle_type": BufferHandle, "bfloat16": _BF16, "ndarray": np.ndarray,
        "timeline": timeline, "now": timeline.now, "record": _record, "finish": _finish,
        "counts": _counts, "quiet_var": quiet_var, "quiet_value": quiet_value,
        "node_type": Node, "desc_type": ArrayDesc, "primitive_type": Primitive,
        "definition_type": PrimitiveDef, "dtype_type": type(_BF16), "buffer_type": Buffer,
        "kernel_rule_type": KernelRule, "broadcast_view": broadcast_view,
        "transpose_view": shape_rules.transpose, "reshape_view": shape_rules.reshape,
        "slice_view": indexing_rules.slice_})
    return _call


def prebuild_kernels(order: list) -> None:
    """Before an eval runs ``order``: start building, in parallel, the kernels its fused
    calls will need (``Backend.compiled_prebuild``; tapes that already ran are skipped
    before any work), each predicted from its inputs' data or, for inputs this eval
    computes, a row-contiguous layout (a view's input is not predicted: that call builds
    its own kernel when it runs)."""
    fused = [node for node in order if node.primitive.defn.takes_runtime
             and len(node.primitive.kw["tape"].launches) < 2]  # not run yet (_loop.c: tape_new)
    if len(fused) < 2:
        return
    by_backend: dict = {}
    for node in fused:
        prim = node.primitive
        by_backend.setdefault(stream_backend(prim.stream), []).append(
            (prim.kw["tape"], functools.partial(_predicted_layouts, node), prim.kw["shape"]))
    for be, items in by_backend.items():
        start = be.compiled_prebuild
        if start is not None and len(items) > 1:
            start(items)


def _predicted_layouts(node: Node) -> Optional[list]:
    """The layouts a node's inputs will have when it runs (None: a view's, not predicted)."""
    layouts = []
    for d in node.inputs:
        if d.node is None:
            layouts.append(d.data)
        elif d.node.primitive.defn.view:
            return None
        else:
            layouts.append(Layout(d.shape, d.dtype.np))
    return layouts


c_loop = _c_loop()
run_node = _run_node if c_loop is None else c_loop.run_node
