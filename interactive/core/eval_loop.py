"""MLX's eval loop: order the graph, put each node on its stream, synchronise across streams.

One eval: the unscheduled nodes the outputs need, in topological order, each marked
scheduled with its stream's event for this eval. Each stream runs its nodes in order on its
worker thread (``tapescope.kernels.stream_workers``). An input produced on another stream
*within* this eval is waited on through that stream's fence; an input scheduled by an
*earlier* eval is waited on through its event — unless the event has already signalled, in
which case it is detached (seed 000's eval change). A synchronous eval whose nodes are all on
one idle stream runs inline on the calling thread (same order, same records, lower latency);
so does an asynchronous one on one GPU stream, where running a node only enqueues device work
(MLX's ``eval_impl`` encodes GPU work on the calling thread; the kernels start at once instead
of after a hand-over to the stream's worker).

Between nodes the loop polls the interrupt flag; on an interrupt (or an error) the rest of
the eval's nodes are left lazy and unscheduled, every event and fence is still signalled, and
the caller gets ``KeyboardInterrupt`` (or the error). A later eval resumes.
"""

from __future__ import annotations

import signal
import threading
from _signal import getsignal as _getsignal  # the C function: signal.getsignal wraps it slowly
from signal import SIGINT
from typing import Iterable, Optional

from tapescope.kernels import timeline
from tapescope.kernels.backends import stream_backend as backend
from tapescope.kernels.stream_workers import Event, Fence
from tapescope.kernels.stream_workers import Interrupt, existing_worker, worker
from tapescope.kernels.primitives import COMPILED

from .array import ArrayDesc
from .device import check_thread
from .evaluate import c_loop, prebuild_kernels, run_node
from .primitive import Node
from .transform_tracers import before_eval
from .walk import topological

_schedule_lock = threading.RLock()
_INTERRUPTED = ("[eval] Evaluation interrupted; evaluated arrays keep their data and the rest "
                "stay lazy.")


class EvalState:
    """What one eval shares between its streams: whether it stopped, and why."""

    __slots__ = ("stopped", "interrupted", "error", "remaining", "lock", "kernels")

    def __init__(self, n_streams: int):
        self.stopped = False
        self.interrupted = False
        self.error: Optional[BaseException] = None
        self.remaining = n_streams
        self.lock = threading.Lock() if n_streams > 1 else None
        self.kernels = 0  # fused kernels in this eval (recorded only while the timeline records)

    def stop(self, error: Optional[BaseException] = None, interrupted: bool = False) -> None:
        self.stopped = True
        if error is not None and self.error is None:
            self.error = error
        if interrupted:
            self.interrupted = True

    def stream_done(self) -> bool:
        """Called once per stream after its last task; the eval ends with the last stream
        (returns True for that one)."""
        if self.lock is None:
            self.remaining -= 1
            last = True
        else:
            with self.lock:
                self.remaining -= 1
                last = self.remaining == 0
        if last:
            Interrupt.end()
        return last


def _topo_order(descs: Iterable[ArrayDesc]) -> tuple[list[Node], list[Node]]:
    """(unscheduled nodes the arrays need, inputs first; scheduled nodes they wait on);
    core/_call.c's ``topo_order`` is the same walk in C."""
    pending: list[Node] = []

    def scheduled(d: ArrayDesc) -> bool:  # another eval runs it: wait on it, do not enter it
        node = d.node
        if node.event is not None:
            pending.append(node)
            return True
        return False

    return topological(descs, scheduled), pending


topo_order = _topo_order if c_loop is None else c_loop.topo_order


def _inputs_available(node: Node) -> bool:
    """Whether every input has its data. (A helper, so that no loop variable is left holding
    an input while the node runs: that extra reference would stop its donation.)"""
    for inp in node.inputs:
        if inp.node is not None:
            return False
    return True


def _run_task(node: Node, state: EvalState, waits: list) -> None:
    """Run one node on its stream unless the eval has stopped; leave it lazy otherwise."""
    for w in waits:
        w()
    if state.stopped or Interrupt.interrupted():
        if not state.stopped:
            state.stop(interrupted=True)
        node.event = None
        return
    if not _inputs_available(node):  # a producer was interrupted or failed
        state.stop(interrupted=True)
        node.event = None
        return
    try:
        run_node(node)
    except BaseException as e:  # noqa: BLE001 - delivered to the caller
        state.stop(error=e)
        node.event = None


def _one_stream_plan(order: list[Node], si: int) -> list:
    """``_plan``'s list for an eval whose nodes are all on stream ``si``: a node waits only
    for an input that an earlier eval scheduled and has not finished."""
    mine = {id(node) for node in order}
    items = []
    for node in order:
        waits = []
        for inp in node.inputs:
            n = inp.node
            if n is None or id(n) in mine:
                continue
            if n.event is not None:
                _wait_earlier(n, si, waits)
        items.append((node, waits))
    return items


def _wait_earlier(n: Node, si: int, waits: list) -> None:
    """An input's node that an earlier eval scheduled: nothing to wait for once its event
    is signalled (the timeline notes the detach), else a wait on it (even on this stream:
    an inline eval on another thread may be running it)."""
    ev = n.event
    if ev.is_signaled():
        if timeline.enabled:
            timeline.add("event_detach", timeline.now(), stream=si,
                         detail={"event": ev.id, "node": n.id})
    else:
        waits.append(lambda ev=ev, si=si: ev.wait(1, si))


def _run_tasks(nodes: tuple, state: EvalState) -> None:
    """A stream's run of nodes without waits or fence updates, as one worker task: each as
    ``_run_task`` runs it (the stop and interrupt checks between nodes kept)."""
    for node in nodes:
        _run_task(node, state, ())


def _plan(order: list[Node]):
    """Per stream, the list of (node, waits) and the fence updates that follow each node."""
    s = order[0].primitive.stream
    for node in order:
        if node.primitive.stream is not s:
            break
    else:  # one stream (the common case): no fences; waits only on earlier evals' events
        return {s.index: _one_stream_plan(order, s.index)}, {s.index: s}, {}, {}
    plan: dict[int, list] = {}
    streams: dict[int, object] = {}
    fences: dict[int, Fence] = {}
    produced_on: dict[int, int] = {}  # id(node) -> stream index, for nodes of this eval
    crossing: set[int] = set()  # id(node) of the producers with a consumer on another stream
    for node in order:  # topological: a node's producers in this eval come before it
        s = node.primitive.stream
        si = streams.setdefault(s.index, s).index
        produced_on[id(node)] = si
        for inp in node.inputs:
            n = inp.node
            if n is not None and produced_on.get(id(n), si) != si:
                crossing.add(id(n))
    # A fence's count is a producer stream's progress: the producers that signal it get their
    # counts in the order that stream runs them (this order), so a count reached means every
    # producer before it has run (MLX keeps a fence per array: mlx/transforms.cpp eval_impl).
    # Counts handed out in the consumers' order would let a later producer's update release
    # the consumer of an earlier count whose producer has not run yet.
    updates: dict[int, list[int]] = {}  # id(producer node) -> the fence count signalled after it
    for node in order:
        si = produced_on[id(node)]
        if crossing and id(node) in crossing:
            f = fences.get(si) or fences.setdefault(si, Fence(si, backend(streams[si]).event_type))
            updates[id(node)] = [f.next_update()]
        waits = []
        for inp in node.inputs:
            n = inp.node
            if n is None:
                continue
            pi = produced_on.get(id(n))
            if pi is not None:
                if pi != si:  # cross-stream edge inside this eval: wait for its fence count
                    f, count = fences[pi], updates[id(n)][0]
                    waits.append(lambda f=f, c=count, si=si: f.wait(c, si))
            elif n.event is not None:  # scheduled by an earlier eval
                _wait_earlier(n, si, waits)
        plan.setdefault(si, []).append((node, waits))
    return plan, streams, fences, updates


def evaluate(descs: list[ArrayDesc], asynchronous: bool = False) -> None:
    """Evaluate the arrays (and what they need); return at once when ``asynchronous``.

    Every eval goes through here and ``_evaluate`` (or core/_call.c's ``eager_eval``, the
    same steps in C for one stream of any backend): one order, one schedule, and each node
    run by ``evaluate.run_node`` (inline on this thread, or by its stream's worker).
    From its first line a synchronous eval counts as running, so an interrupt (SIGINT)
    arriving while the graph is still being ordered is honoured at the first node boundary
    instead of raising in the middle of the bookkeeping.
    """
    if not asynchronous and _c_eager is not None and _c_eager(descs):
        return  # one stream, nothing scheduled elsewhere: these steps in C (_loop.c)
    before_eval(descs, asynchronous)  # inside a transformation: keep tracers' graphs
    if asynchronous:
        _evaluate(descs, True)
        return
    for d in descs:
        if d.node is not None:
            break
    else:  # everything is available already: nothing to run, nothing to wait for
        return
    _install_sigint()
    Interrupt.begin()
    try:
        _evaluate(descs, False)
    finally:
        Interrupt.end()


def _order(descs: list[ArrayDesc]) -> tuple[list[Node], list[Node]]:
    """``topo_order``, with its answer for the eager case (one array whose node's inputs
    are all available and that no eval has scheduled: that node alone) found directly."""
    if len(descs) == 1:
        node = descs[0].node
        if node is not None and node.event is None and _inputs_available(node):
            return [node], []
    return topo_order(descs)


def _evaluate(descs: list[ArrayDesc], asynchronous: bool) -> None:
    for _ in range(100):
        inline = None
        with _schedule_lock:
            order, pending = _order(descs)
            _check_threads(order)
            if order:
                if not pending and (not asynchronous or _enqueues_only(order)):
                    inline = _inline_stream(order)
                if inline is not None:
                    ev = backend(order[0].primitive.stream).event_type(inline)
                    for node in order:
                        node.event = ev
                    state, events = EvalState(1), {inline: ev}
                else:
                    state, events = _schedule(order, asynchronous)
        if len(order) > 1:
            prebuild_kernels(order)  # an eval's new kernels build in parallel
        if inline is not None:
            if asynchronous:  # a GPU stream's nodes: enqueued here, computed by the device
                _install_sigint()
                Interrupt.begin()
                try:
                    _run_inline(order, state, events[inline], asynchronous)
                finally:
                    Interrupt.end()
                _raise_for(state)
                return
            _run_inline(order, state, events[inline], asynchronous)
        if order and not asynchronous:
            try:
                for ev in events.values():
                    ev.wait(1)
            except BaseException as e:  # the device failed after its work was enqueued
                fail_outputs(order, e)
                raise
            _raise_for(state)
        if asynchronous:
            return
        for n in pending:  # scheduled by another eval: wait for it
            ev = n.event
            if ev is not None:
                ev.wait(1)
        if not pending or all(d.node is None for d in descs):
            return
    raise RuntimeError("[eval] The graph could not be evaluated (interrupted repeatedly).")


def fail_outputs(order: list[Node], error: BaseException) -> None:
    """An eval whose wait raised (the deferred bounds check's IndexError, a device error):
    every array its nodes set holds ``Failed(error)`` instead of its data, its buffer given
    back, so that no read of it gives the values of failed work (a read, or an op's eval
    on it, raises the error again). Core/_loop.c's eager eval calls it the same way."""
    from tapescope.kernels.failed import Failed

    failed = Failed(error)
    for node in order:
        for ref in node.outputs:
            d = ref()
            if d is not None and d.node is None and d.data is not None:
                d.data, d.buffer = failed, None


def _raise_for(state: EvalState) -> None:
    """The eval's error, or MLX's interrupt message when it was interrupted."""
    if state.error is not None:
        raise state.error
    if state.interrupted:
        raise KeyboardInterrupt(_INTERRUPTED)


def _check_threads(order: list[Node]) -> None:
    """MLX's RuntimeError when a node's stream belongs to another thread."""
    last = None
    for node in order:
        s = node.primitive.stream
        if s is not last:
            last = s
            check_thread(s)


def _inline_stream(order: list[Node]) -> Optional[int]:
    """The stream index if every node is on one stream whose worker is idle, else None."""
    s = order[0].primitive.stream
    for node in order:
        if node.primitive.stream is not s:
            return None
    w = existing_worker(s.index)
    if w is not None and not w.idle():
        return None
    return s.index


def _enqueues_only(order: list[Node]) -> bool:
    """Whether running these nodes only enqueues work on a device (a GPU stream: MLX's
    ``eval_impl`` encodes GPU work on the calling thread, and ``async_eval`` returns once
    it is enqueued); a CPU stream's nodes compute, so an async eval gives them to the
    stream's worker."""
    return backend(order[0].primitive.stream).device_context is not None


def _run_inline(order: list[Node], state: EvalState, ev: Event, asynchronous: bool = False) -> None:
    """Run a single-stream eval on the calling thread (the stream's order is kept by its
    worker's execution lock). The caller (``evaluate``) holds the eval's running mark."""
    t0 = _eval_begin(order, ev.stream, state, asynchronous) if timeline.enabled else 0
    w = existing_worker(ev.stream)
    lock = w.exec_lock if w is not None else None
    if lock is not None:
        lock.acquire()
    try:
        for node in order:
            if state.stopped or Interrupt.interrupted():
                _run_task(node, state, ())
            else:
                try:
                    run_node(node)
                except BaseException as e:  # noqa: BLE001 - delivered to the caller
                    state.stop(error=e)
                    node.event = None
    finally:
        if lock is not None:
            lock.release()
        ev.signal(1)
        if t0 and timeline.enabled:
            _record_end(state, ev, t0, last=True)


def _eval_begin(order: list[Node], stream: int, state: EvalState, asynchronous: bool) -> int:
    """A single-stream eval's first records (core/_call.c's eager eval makes the same):
    ``eval_begin`` and the kernels it may build; returns its start time."""
    t0 = timeline.now()
    timeline.add("eval_begin", t0, stream=stream,
                 detail={"nodes": len(order), "streams": [stream], "async": asynchronous})
    state.kernels = _kernel_batch_begin(order, t0)
    return t0


def _schedule(order: list[Node], asynchronous: bool):
    """Mark ``order`` scheduled and queue it on its streams' workers."""
    plan, streams, fences, updates = _plan(order)
    events = {si: backend(streams[si]).event_type(si) for si in plan}
    for si, items in plan.items():
        ev = events[si]
        for node, _ in items:
            node.event = ev
    state = EvalState(len(plan))
    Interrupt.begin()
    t0 = timeline.now() if timeline.enabled else 0
    if t0:
        timeline.add("eval_begin", t0, detail={"nodes": len(order), "streams": sorted(plan),
                                                "async": asynchronous})
        state.kernels = _kernel_batch_begin(order, t0)
    for si, items in plan.items():
        s = streams[si]
        wk = worker(si, f"{s.device.type.name}-stream{si}")
        run: list = []  # consecutive nodes with nothing to wait for or signal: one task
        for node, waits in items:
            ups = updates.get(id(node))
            if not ups and not waits:
                run.append(node)
                continue
            if run:
                wk.enqueue(lambda nodes=tuple(run): _run_tasks(nodes, state))
                run.clear()
            if ups:
                fence = fences[si]

                def task(node=node, waits=waits, ups=ups, fence=fence):
                    try:
                        _run_task(node, state, waits)
                    finally:
                        for c in ups:
                            fence.update(c)
            else:
                def task(node=node, waits=waits):
                    _run_task(node, state, waits)
            wk.enqueue(task)
        if run:
            wk.enqueue(lambda nodes=tuple(run): _run_tasks(nodes, state))
        wk.enqueue(lambda ev=events[si], wk=wk: _finish_stream(state, ev, t0, wk, asynchronous))
    return state, events


def _finish_stream(state: EvalState, ev: Event, t0: int, wk=None,
                   asynchronous: bool = False) -> None:
    """A stream's last task of an eval. An asynchronous eval's error stays with each of its
    streams' workers until ``mx.synchronize`` of that stream raises it (MLX: the failed
    stream and the streams that waited on it)."""
    if asynchronous and state.error is not None:
        wk.keep_error(state.error)
    ev.signal(1)
    last = state.stream_done()
    if t0 and timeline.enabled:
        _record_end(state, ev, t0, last)


def _record_end(state: EvalState, ev: Event, t0: int, last: bool) -> None:
    timeline.add("eval_end", t0, timeline.now(), stream=ev.stream,
                 detail={"interrupted": state.interrupted,
                         "error": None if state.error is None else type(state.error).__name__})
    if last and state.kernels:
        timeline.add("kernel_batch_end", timeline.now(), detail={"kernels": state.kernels})


def _kernel_batch_begin(order: list[Node], t0: int) -> int:
    """On the timeline: the fused kernels this eval may build (for the progress bar)."""
    n = sum(1 for node in order if node.primitive.kind == COMPILED)
    if n:
        timeline.add("kernel_batch_begin", t0, detail={"kernels": n})
    return n


# -- Interrupts -----------------------------------------------------------------------------

def interrupt_eval() -> bool:
    """Ask the running evals to stop at the next node boundary; True if an eval was running."""
    return Interrupt.request()


_sigint_installed = None
_MAIN_THREAD = threading.main_thread().ident
get_ident = threading.get_ident


def _install_sigint() -> None:
    """While an eval runs, SIGINT (Jupyter's interrupt button, Ctrl-C) interrupts it cleanly;
    outside an eval the previous handler runs as before. Re-installed whenever somebody
    (IPython does, per cell) replaced it."""
    global _sigint_installed
    if get_ident() != _MAIN_THREAD:
        return
    previous = _getsignal(SIGINT)
    if previous is _sigint_installed and previous is not None:
        return

    def handler(signum, frame):
        if interrupt_eval():
            return
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, handler)
        _sigint_installed = handler
    except (ValueError, OSError):  # not the main interpreter thread
        pass


_c_eager = None if c_loop is None else c_loop.eager_eval
if c_loop is not None:  # an eager op's eval in C (core/_call.c: eager_eval), the same steps
    from tapescope.kernels import stream_workers as _stream_workers

    from . import transform_tracers as _tracers

    c_loop.configure_eager({
        "tracer": _tracers, "interrupt": Interrupt, "install_sigint": _install_sigint,
        "schedule_lock": _schedule_lock, "workers": _stream_workers._workers,
        "eval_begin": _eval_begin, "eval_end": _record_end, "state_type": EvalState,
        "thread_ident": threading.get_ident, "interrupted_message": _INTERRUPTED,
        "prebuild": prebuild_kernels, "fail_outputs": fail_outputs,
        # _install_sigint's test (in C: its globals read there), the host's events
        "sigint_state": globals(), "getsignal": _getsignal, "main_thread": _MAIN_THREAD,
        "event_type": _stream_workers.Event, "event_ids": _stream_workers._event_ids})
