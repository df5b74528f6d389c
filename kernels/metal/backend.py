"""``MetalBackend``: evaluating primitives on an Apple GPU (``runtime.py``, through PyObjC).

Memory is unified: arrays live in shared-storage MTLBuffers that numpy views directly
(``MetalAllocator``, MLX's Metal allocator policy of ``kernels/allocator.py``). Fused tapes
and the eager elementwise primitives (unary, binary, ternary, AsType) run as tapescope's
MSL kernels (``kernels.py``), encoded on the stream's command queue; every other primitive
runs its CPU rule on the same shared memory after the stream's GPU work has completed, and
the timeline records each such fallback (``"fallback"``), so none is silent.

Written against Apple's documented API and MLX's use of it; not run on Apple hardware here
(see ``runtime.py``). Registered by ``kernels.backends`` only on macOS with PyObjC's Metal.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import numpy as np

from .. import timeline
from ..allocator import Allocator
from ..backends import Backend, DeviceContext
from ..codegen.c_ops import Unsupported
from ..codegen.render import renderer
from ..primitives import ASTYPE, REGISTRY
from ..stream_workers import Event
from . import kernels as K
from . import runtime

_device: Optional[runtime.MetalDevice] = None
_queues: dict = {}  # mx stream index -> runtime.Queue
_lock = threading.RLock()


def device() -> runtime.MetalDevice:
    global _device
    with _lock:
        if _device is None:
            _device = runtime.MetalDevice()
        return _device


def queue(stream: int) -> runtime.Queue:
    with _lock:
        q = _queues.get(stream)
        if q is None:
            q = _queues[stream] = runtime.Queue(device())
        return q


class MetalAllocator(Allocator):
    """MLX's Metal allocator policy over shared MTLBuffers."""

    def __init__(self):
        info = device().info()
        super().__init__("gpu", total_memory=info["memory_size"],
                         working_set=info["max_recommended_working_set_size"])

    def _raw_alloc(self, size: int) -> Any:
        return device().new_buffer(size)

    def _release(self, buf) -> None:
        if buf.raw is not None:
            device().free(buf.raw)
        super()._release(buf)

    def set_wired_limit(self, limit: int) -> int:
        """mlx/backend/metal/allocator.cpp: above the max working set is refused."""
        if limit > self.working_set:
            raise ValueError("[metal::set_wired_limit] Setting a wired limit larger than the "
                             "maximum working set size is not allowed.")
        return super().set_wired_limit(limit)


class MetalEvent(Event):
    """An ``mx`` event whose signals on a GPU stream are MTLSharedEvent signals: another GPU
    stream waits on the device, the host polls the shared event (MLX's metal/event.cpp)."""

    __slots__ = ("shared",)

    def __init__(self, stream: Optional[int] = None):
        super().__init__(stream)
        self.shared = None

    def _gpu(self, stream) -> bool:
        return stream is not None and stream in _queues

    def signal(self, value: int = 1) -> None:
        if self._gpu(self.stream):
            if self.shared is None:
                self.shared = device().new_event()
            queue(self.stream).signal(self.shared, value)
        super().signal(value)

    def is_signaled(self, value: int = 1) -> bool:
        return self.value >= value and (self.shared is None or self.shared.value() >= value)

    def wait(self, value: int = 1, stream: Optional[int] = None) -> None:
        super().wait(value, stream)  # the producer has encoded its work
        if self.shared is None:
            return
        if self._gpu(stream):
            queue(stream).wait(self.shared, value)
        else:
            self.shared.host_wait(value)


class _OnQueue(DeviceContext):
    """A node on a Metal stream: a CPU-rule fallback first waits for the stream's GPU work
    and is recorded on the timeline. Its ``rule``: the node's Metal rule (None: the CPU's)."""

    __slots__ = ("q", "name", "fallback", "t0")

    def __init__(self, q: runtime.Queue, name: str, fallback: bool, rule: Any = None):
        self.q, self.name, self.fallback, self.rule = q, name, fallback, rule

    def __enter__(self):
        _tls.queue = self.q  # where this thread's kernels are encoded
        self.t0 = 0
        if self.fallback:
            self.q.synchronize()
            self.t0 = timeline.now() if timeline.enabled else 0

    def __exit__(self, *exc):
        _tls.queue = None
        if self.fallback and self.t0:
            timeline.add("fallback", self.t0, timeline.now(), device="gpu",
                         detail={"primitive": self.name, "why": "no Metal kernel: CPU rule "
                                 "on shared memory"})
        return False


class MetalBackend(Backend):
    name = "metal"
    device_type = "gpu"
    dialect = "metal"
    reduction_tapes = False  # extended fusion's reduction tapes have no Metal runner yet
    event_type = MetalEvent

    def __init__(self):
        super().__init__(np, MetalAllocator())
        self._elementwise: dict = {}  # (primitive, dtypes, params) -> one-op tape, or False
        self._rules: dict = {}  # primitive name -> its Metal rule, or None

    def new_stream(self, stream: Any) -> None:
        queue(stream.index)

    def device_context(self, stream: Any, node: Any = None) -> _OnQueue:
        prim = node.primitive if node is not None else None
        rule = self._rule(prim) if prim is not None else None
        on_gpu = prim is not None and (prim.defn.takes_runtime or rule is not None)
        return _OnQueue(queue(stream.index), prim.name if prim else "", not on_gpu, rule)

    def _rule(self, prim: Any):
        """The Metal rule of an eager elementwise primitive MSL spells, of a reduction
        primitive (``metal/reductions.py``) or a fast one (``metal/fast_kernels.py``): the
        evaluator runs it instead of the CPU rule (the device context's ``rule``); else None."""
        rule = self._rules.get(prim.name, False)
        if rule is False:
            from ..common.norms import PRIMITIVES as FAST_PRIMITIVES
            from ..common.reductions import PRIMITIVES

            d, msl = prim.defn, renderer("metal")
            spelled = prim.name in msl.code_for_op or prim.name in msl.math_functions
            rule = None
            if prim.name in PRIMITIVES:
                from .reductions import rule as reduction_rule

                rule = reduction_rule(self, prim.name)
            elif prim.name in FAST_PRIMITIVES:  # MLX's fast primitives (metal/fast_kernels.py)
                from .fast_kernels import rule as fast_rule

                rule = fast_rule(self, prim.name)
            elif (d.elementwise or d.family == ASTYPE) and spelled:
                name = prim.name

                def rule(xp, *ins, out=None, **kw):
                    return self._run_elementwise(name, ins, out, kw)
            self._rules[prim.name] = rule
        return rule

    def _run_elementwise(self, name: str, ins, out, kw) -> Any:
        """One eager elementwise op as its one-op tape's Metal kernel; dtypes Metal cannot
        express (float64, complex) run the CPU rule, after the stream's GPU work."""
        key = (name, tuple(x.dtype for x in ins), tuple(sorted(kw.items())))
        tape = self._elementwise.get(key)
        if tape is None:
            try:
                probe = [np.zeros((0,), x.dtype) for x in ins]
                out_dt = np.asarray(REGISTRY[name].rule(np, *probe, **kw)).dtype
                tape = K.elementwise_tape(name, [x.dtype for x in ins], out_dt,
                                          [x.ndim == 0 for x in ins], tuple(kw.items()))
                renderer("metal").render(tape, "probe", True, 1, False)
            except (Unsupported, ValueError, KeyError):
                tape = False
            self._elementwise[key] = tape
        shape = np.broadcast_shapes(*[x.shape for x in ins])
        if tape is False:  # the CPU rule, after the GPU work before it, recorded
            with _OnQueue(_tls.queue, name, True):
                return REGISTRY[name].rule(np, *ins, **({"out": out} if out is not None else {}),
                                           **kw)
        return self.run_compiled(tape, list(ins), shape, out=out)[0]

    def run_compiled(self, tape, inputs, shape, out=None, donatable=None) -> list:
        """A fused tape's MSL kernel (every variant in one library, compiled once per tape),
        encoded on the current stream's queue; outputs in ``out`` when it fits, else new
        shared memory."""
        def empty(shp, dt, order):
            if out is not None and out.shape == tuple(shp) and out.dtype == dt and \
                    (out.flags.c_contiguous if order == "C" else out.flags.f_contiguous) and \
                    device().find(out) is not None:  # the GPU writes only Metal memory
                return out
            buf = self.allocator.malloc(int(np.prod(shp, dtype=np.int64)) * dt.itemsize)
            return buf.view(int(np.prod(shp, dtype=np.int64)) * dt.itemsize, dt, tuple(shp))

        arrays = [np.asarray(x.constant, x.dtype) if x.is_constant else a
                  for x, a in zip(tape.inputs, inputs)]
        call = K.fused_call(tape, arrays, shape, empty=empty)
        pso = device().pipeline(call.name, tape.lib_name, K.msl_module(tape))
        q = _tls.queue
        q.dispatch(pso, call.buffers, call.grid, call.threadgroup,
                   outputs={k for k, v in call.buffers.items()
                            if any(v is o or v.base is o for o in call.outputs)})
        if any(o is not out for o in call.outputs):
            # the evaluator may copy or adopt a result it did not allocate at once: let the
            # kernel finish first (results written into ``out`` stay asynchronous)
            q.synchronize()
        return call.outputs

    def synchronize(self, stream: Any) -> None:
        queue(stream.index).synchronize()

    def machine(self):
        """None: the roofline has no Metal limits yet (no copy timed with Metal's command
        buffers, no per-GPU FLOP table; the runtime has not run on Apple hardware), and its
        launches record no device time or layouts, so no Metal kernel is placed."""
        return None

    def info(self) -> dict:
        return device().info()


_tls = threading.local()  # .queue: the queue of the node running on this thread
