"""``CudaBackend``: evaluating primitives on an NVIDIA GPU with CuPy.

The rules are the array-module rules of ``kernels/rules`` run with ``xp=cupy`` on the CUDA
stream of the primitive's ``mx`` stream (``device_context``). Inputs that live on the host
(arrays made from Python data, results of CPU streams) are copied to the device on that
stream; a CPU stream reading a GPU result copies it to the host (``to_host``) after the
event wait that made it ready. Fused tapes run as fused CUDA kernels
(``kernels/cuda/compiled.py``). Host data is copied in without blocking the host
(``CudaAllocator.import_host``, ``device.uploaded``). bfloat16 arrays live on the device as uint16
storage (``kernels/cuda/bfloat16.py``: their kernels, data movement, float32 fallbacks).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import cupy
import numpy as np

from .. import timeline
from ..backends import Backend, DeviceContext
from ..primitives import ASTYPE, COMPILED, MATMUL
from ..rules.custom_kernel import CUSTOM
from ..roofline import layouts
from . import bfloat16 as bf16, device, timing
from .events import CudaEvent
from .memory import CudaAllocator
from .precision import matmul_rule


_tf32_rules: dict = {}  # a matmul-family rule -> it at MLX's TF32 setting (precision.matmul_rule)


class _OnStream(DeviceContext):
    """Makes the CUDA stream of an ``mx`` stream current for CuPy on this thread; while the
    timeline records, brackets the node's kernels with timing events (``timing``). Its
    ``rule``: the device's own rule for the node (``CudaBackend._rule``)."""

    __slots__ = ("stream", "prev", "node", "index", "ev0", "dev", "work", "ins", "lend")

    def __init__(self, stream: "cupy.cuda.Stream", node: Any, index: int, dev: int = 0,
                 lend: Any = None, rule: Any = None):
        self.stream, self.node, self.index, self.ev0, self.dev = stream, node, index, None, dev
        self.rule = rule
        self.ins = ()
        self.work = device.work(index)
        self.lend = lend  # CuPy's allocations in the context from the buffer cache (memory.py)

    def __enter__(self):
        if self.dev:  # this process's GPU is not 0 (a rank of mpirun): current on this thread
            cupy.cuda.runtime.setDevice(self.dev)
        self.prev = cupy.cuda.get_current_stream()
        self.stream.use()
        device.enter_work(self.work)  # the allocator's frees record fresh events meanwhile
        if self.lend is not None:
            self.lend = self.lend()
            self.lend.__enter__()
        if timeline.enabled and self.node is not None:
            # the inputs' layouts now: the node drops its inputs when it has run
            self.ins = layouts(d.data for d in self.node.inputs if d.data is not None)
            self.ev0 = timing.start(self.stream)

    def __exit__(self, *exc):
        if self.ev0 is not None:
            node = self.node
            timing.end(self.stream, self.ev0, name=node.primitive.name, node=node.id,
                       stream=self.index, detail=_roofline_detail(node, self.ins))
            self.ins = ()
        if self.lend is not None:
            self.lend.__exit__(None, None, None)
        device.leave_work(self.work)
        self.prev.use()
        return False


def _roofline_detail(node: Any, ins: tuple) -> dict:
    """What the roofline reads off a node's ``gpu_work`` record (``kernels/roofline.py``):
    the layouts of the arrays it read (``ins``) and wrote, and its fused tape or primitive."""
    outs = [d.data for d in (r() for r in node.outputs) if d is not None and d.data is not None]
    prim = node.primitive
    detail = {"io": (ins, layouts(outs)),
              "primitive": prim.name}
    tape = prim.kw.get("tape") if prim.defn.family == COMPILED else None
    if tape is not None:
        detail.update(tape=tape, kernel=tape.lib_name, shape=tuple(prim.kw.get("shape", ())))
    return detail


def _launch_name(launch: Any) -> str:
    """The primitive a launched plan runs: an eager op's one-op kernel (``cuda/eager.py``)
    is its op's, a fused call's ``Compiled``."""
    primitive = getattr(launch, "primitive", None)  # a primitive's KernelPlan
    if primitive is not None:
        return primitive
    tape = getattr(launch.entry, "tape", None)
    if tape is not None and tape.lib_name.startswith("ew_") and len(tape.ops) == 1:
        return tape.ops[0].primitive
    return "Compiled"


def _launch_detail(launch: Any, inputs: list, out: Any) -> dict:
    """``_roofline_detail`` of a fused call launched by ``launch_fused`` (no device context,
    no node at hand): its layouts and its kernel entry's tape (``out``: a tuple for a tape's
    several outputs)."""
    outs = list(out) if type(out) is tuple else [out]
    out = outs[0]
    detail = {"io": (layouts(inputs), layouts(outs)), "primitive": _launch_name(launch)}
    tape = getattr(launch.entry, "tape", None)
    if getattr(launch, "primitive", None) is not None:  # a primitive's kernel: its spec
        detail.update(kernel=launch.name, variant=launch.variant, shape=tuple(out.shape))
    elif tape is not None:
        detail.update(tape=tape, kernel=tape.lib_name, shape=tuple(out.shape))
    return detail


class CudaBackend(Backend):
    name = "cuda"
    device_type = "gpu"
    dialect = "cuda"
    event_type = CudaEvent
    array_type = cupy.ndarray
    storage_type = bf16.BF16Array  # bfloat16: its uint16 storage (cuda/bfloat16.py)
    sequential_forms = False  # CuPy's ufuncs lack most accumulate / at forms (rules/forms.py)

    def __init__(self, device_id: Optional[int] = None):
        # one GPU per process: every mx GPU stream runs on ``device_id``, by default this
        # process's (``device.selected()``: local rank % device count, as MLX's NCCL backend)
        device_id = device.selected() if device_id is None else device_id
        super().__init__(cupy, CudaAllocator(device_id))
        self.device_id = device_id

    def new_stream(self, stream: Any) -> None:
        device.cuda_stream(stream.index)

    def device_context(self, stream: Any, node: Any = None) -> _OnStream:
        return _OnStream(device.cuda_stream(stream.index), node, stream.index, self.device_id,
                         self.allocator.lending, None if node is None else self._rule(node))

    # -- data between host and device -------------------------------------------------------
    def to_device(self, data: Any) -> Any:
        """A device array as it is (a lazily widened bfloat16 result as its float32 array);
        anything else copied to the device on the current CUDA stream."""
        t = type(data)
        if t is cupy.ndarray or t is bf16.BF16Array or isinstance(data, cupy.ndarray):
            return data
        if t is bf16.Widened:
            return data.value()
        data = np.asarray(data)
        if data.ndim and data.size > 1 and not any(data.strides):
            # a host broadcast of one value (a Python scalar's Broadcast): one element
            # copied, broadcast on the device (not the whole broadcast shape)
            one = self.to_device(data.reshape(-1)[:1].reshape(()))
            if type(one) is bf16.BF16Array:
                return bf16.BF16Array(cupy.broadcast_to(one.raw, data.shape))
            return cupy.broadcast_to(one, data.shape)
        return bf16.upload(data) if data.dtype == bf16.BF16 else cupy.asarray(data)

    # -- compiled tapes, synchronisation ----------------------------------------------------
    def run_compiled(self, tape, inputs, shape, out=None, donatable=None) -> list:
        """The tape's fused CUDA kernel (``kernels/cuda/compiled.py``: NVRTC, cached in
        memory and on disk), its results where MLX's Compiled rules put them: into ``out``,
        or into the buffers of donatable inputs, else fresh device memory."""
        if tape.reduction is not None:  # extended fusion: one kernel from the loop IR
            from .fused_reduction import run_reduction

            if any(type(x) is bf16.BF16Array for x in inputs):
                # the reduction tapes' runner has no bfloat16 storage yet: numpy on host
                # copies (the CPU's interpretation), recorded as the kernel's fallback
                from ..codegen.reduction import interpret

                t0 = timeline.now() if timeline.enabled else 0
                host = [x.get() if hasattr(x, "get") else np.asarray(x) for x in inputs]
                outs = [bf16.upload(o) if o.dtype == bf16.BF16 else cupy.asarray(o)
                        for o in interpret(tape, host, tuple(int(s) for s in shape), np)]
                if t0:
                    timeline.add("kernel_fallback", t0, timeline.now(), name=tape.lib_name,
                                 device="gpu", detail={"reason": "bfloat16 reduction tape",
                                                       "runtime": "numpy"})
                return outs

            return run_reduction(tape, [self.to_device(x) for x in inputs], shape, out=out)
        from .compiled import run_compiled

        return run_compiled(tape, [self.to_device(x) for x in inputs], shape, out=out,
                            donatable=donatable)

    def machine(self):
        """The GPU's limits for the roofline (``cuda/machine.py``), measured on the first call."""
        from .machine import gpu_machine

        return gpu_machine(self.device_id)

    @functools.cached_property
    def compiled_launch(self):
        """The eval loop's fast lane for a fused call whose kernel is loaded
        (``compiled.launch_for``: the call plan, launched into the output buffer)."""
        from .compiled import launch_for

        return launch_for

    def launch_fused(self, stream: Any, launch: Any, inputs: list, out: Any) -> None:
        """The fused kernel on the mx stream's CUDA stream, without making it CuPy's
        current stream: the eval loop's hook for a loaded fused call (core/_loop.c
        run_node, ``evaluate._gpu_fused_launch``), the same code whether or not the timeline
        records (which adds the timing events: the call's device time, the roofline).
        ``out``: the output array, or a tuple of one per output of a fused tape's plan."""
        index = stream.index
        w = device.work(index)
        if self.device_id:  # this process's GPU is not 0 (a rank of mpirun)
            cupy.cuda.runtime.setDevice(self.device_id)
        cs = device.cuda_stream(index)
        ev0 = timing.start(cs) if timeline.enabled else None
        device.enter_work(w)
        try:
            launch.call(inputs, out if type(out) is tuple else (out,), stream=cs)
        finally:
            device.leave_work(w)
        if ev0 is not None:  # recorded as _OnStream records a node: device time, roofline
            timing.end(cs, ev0, name=_launch_name(launch), node=None, stream=index,
                       detail=_launch_detail(launch, inputs, out))

    @functools.cached_property
    def device_api(self):
        """The launch and host wait in C (``kernels/cuda/_driver.c``: cuLaunchKernel, the
        completion word, through the driver CuPy loaded; a GemmPlan's cuBLAS call through
        the libcublas CuPy's binding links, with CuPy's handle), or None where the extension is not
        built or no CUDA driver is loaded (the tests' stand-in CuPy): then the loop calls
        ``launch_fused`` and the events' ``wait``."""
        if self.device_id:  # this process's GPU is not 0: launch_fused sets it per thread
            return None
        try:
            from . import _driver
        except ImportError:
            return None
        from . import bounds
        from .compiled import current_context

        current_context()  # the driver initialised where CuPy is the real one
        from . import gemm  # (a GemmPlan's launch in C: CuPy's handle and cuBLAS, TF32)

        return _driver.configure({
            "cublas_handle": getattr(getattr(cupy.cuda, "device", None), "get_cublas_handle",
                                     None),
            "cublas_module": getattr(gemm._cublas, "__file__", None), "tf32": gemm.TF32,
            "streams": device._streams, "work": device._work, "work_of": device.work,
            "work_lock": device._work_lock, "unfinished": device._unfinished,
            "timeline": timeline, "timing_pending": timing._pending,
            "timing_flush": timing.flush, "launch_start": _launch_start,
            "launch_end": _launch_end, "wait_record": _wait_record, "now": timeline.now,
            "bounds": bounds.records, "bounds_check": bounds.check})

    @functools.cached_property
    def eager_kernel(self):
        """An eager elementwise op's one-op kernel plan (``cuda/eager.py``), which the loop
        launches through ``device_api`` (else ``launch_fused``)."""
        from .eager import EagerKernels

        return EagerKernels()

    def _rule(self, node: Any):
        """The device's own rule for ``node`` (its device context's ``rule``): a
        ``mx.fast.cuda_kernel`` call runs here (``kernels/cuda/custom.py``); MLX's
        reductions and fast primitives as generated CUDA (``kernels/cuda/reductions.py``,
        ``fast_kernels.py``); the quantized products (``kernels/cuda/quantized.py``); a node
        reading or making bfloat16 by ``cuda/bfloat16.py``'s rules."""
        prim = node.primitive
        own = self._own_rule(prim)
        if (not prim.defn.takes_runtime and prim.defn.family != CUSTOM
                and not getattr(own, "takes_bfloat16", False)
                and bf16.touches(node)):
            # bfloat16 products: float32 math at full precision (MLX's CUBLAS_COMPUTE_32F)
            return bf16.rule(prim, None if prim.defn.family == MATMUL else own, node)
        return own

    @functools.cached_property
    def kernel_rules(self) -> dict:
        """Primitive name -> its generated CUDA kernel rule: MLX's reductions
        (``cuda/reductions.py``), fast primitives (``cuda/fast_kernels.py``,
        ``cuda/attention.py``), quantized products (``cuda/quantized.py``), axis gathers /
        scatters (``cuda/indexing.py``), SliceUpdate (``cuda/slicing.py``), and Matmul / AddMM as one cuBLAS GEMM
        (``cuda/gemm.py``); one lookup a
        node (asked for every node a GPU stream runs through the rules). The eval loop's C
        part launches the plans of those that are KernelRules (``cuda/primitive_plans.py``)
        once a call of that layout has made one: the same rule objects the Python path
        runs, so both share the plans."""
        from .attention import RULES as attention
        from .fast_kernels import RULES as fast
        from .gemm import RULES as gemm
        from .indexing import RULES as indexing
        from .quantized import RULES as quantized
        from .reductions import RULES as reductions
        from .slicing import RULES as slicing

        return {**quantized, **fast, **reductions, **indexing, **slicing, **attention, **gemm}

    def _own_rule(self, prim: Any):
        rule = self.kernel_rules.get(prim.name)
        if rule is not None:
            return rule
        family = prim.defn.family
        if family == CUSTOM and prim.kw.get("language") == "cuda":
            from .custom import run

            def rule(xp, *inputs, **params):
                return run(inputs, **params)

            return rule
        if family == ASTYPE:  # to bool by the bits: CuPy's kernels flush subnormals
            from .casts import astype

            return astype
        if family == MATMUL:  # MLX's TF32 switch (cuda/precision.py), one wrapper a rule
            got = _tf32_rules.get(prim.defn.rule)
            if got is None:
                got = _tf32_rules[prim.defn.rule] = matmul_rule(prim.defn.rule)
            return got
        return None

    def synchronize(self, stream: Any) -> None:
        device.synchronize(stream.index)
        self.allocator.synchronize()
        timing.flush()

    def info(self) -> dict:
        return device.info(self.device_id)


def _launch_start(index: int) -> Any:
    """The timing bracket's start of a launch from C while the timeline records."""
    return timing.start(device.cuda_stream(index))


def _launch_end(index: int, ev0: Any, launch: Any, inputs: list, out: Any) -> None:
    """Its end: recorded as ``launch_fused`` records (device time, the roofline's detail)
    and as the plan's Python call records its launch (``PackedLaunch.call``)."""
    timing.end(device.cuda_stream(index), ev0, name=_launch_name(launch), node=None,
               stream=index, detail=_launch_detail(launch, inputs, out))
    t = timeline.now()
    for p in (launch, *getattr(launch, "then", ())):  # a sequence: each of its launches
        timeline.add("kernel_launch", t, t, name=p.name, device="gpu", detail=p.launch_detail())


def _wait_record(index: int, t0: int) -> None:
    """The host wait from C, recorded as ``CudaEvent.wait`` records one."""
    timeline.add("event_wait", t0, timeline.now(), stream=None,
                 detail={"stream_wait": index, "device_wait": False})


def to_host(data: Any) -> np.ndarray:
    """A GPU array's data on the host (``cudaMemcpy`` device to host, synchronous)."""
    if type(data) is bf16.BF16Array:
        return data.get()
    return cupy.asnumpy(data)
