"""MLX's tracers: arrays whose graph an eval keeps while a transformation is running.

MLX (mlx/array.cpp ``is_tracer``, mlx/transforms.cpp ``eval_impl`` / ``vjp`` / ``jvp``,
mlx/transforms_impl.h ``InTracing`` / ``RetainGraph``): a transformation marks its primals
as tracers, and an array made from a tracer is one (``ArrayDesc.tracer``). While a
transformation runs (``tracing()``, per thread), evaluating a tracer computes its data but
keeps its node and inputs (``ArrayDesc.kept``), so ``mx.eval`` / ``.item()`` / printing
inside a function being differentiated do not cut the gradient. When the function returns,
the transformation clears the flag on everything it walked (``untrace``); a later eval that
reaches an evaluated array which is no longer a tracer detaches it (``before_eval``). While a
VJP rule runs (``RetainEach``: MLX's ``RetainGraph``) every array counts as a tracer.

Kept graphs matter only to transformations, so when the outermost one on a thread ends they
are all dropped (memory goes back as MLX's next eval would give it back), unless
``holding()`` (``tapescope.check``) keeps them a little longer.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Iterable, Iterator

_local = threading.local()
_active = 0  # transformations running on any thread: 0 is the fast path of every op
_lock = threading.Lock()


def _state():
    s = _local.__dict__
    if "depth" not in s:
        _local.depth, _local.retain, _local.hold, _local.kept = 0, 0, 0, []
        _local.placeholders = 0
    return _local


def in_tracing() -> bool:
    """Whether a transformation is running on this thread (MLX's ``in_tracing``)."""
    return _active > 0 and _state().depth > 0


def is_tracer(desc) -> bool:
    """MLX's ``array::is_tracer``: flagged while a transformation runs, or any array while a
    VJP rule runs."""
    if _active == 0:
        return False
    s = _state()
    return s.retain > 0 or (desc.tracer and s.depth > 0)


def any_tracer(descs: Iterable) -> bool:
    """The flag of a new array made from ``descs``."""
    if _active == 0:
        return False
    s = _state()
    if s.retain > 0:
        return True
    if s.depth == 0:
        return False
    for d in descs:
        if d.tracer:
            return True
    return False


def _enter(field: str) -> None:
    global _active
    s = _state()
    setattr(s, field, getattr(s, field) + 1)
    if field != "hold":
        with _lock:
            _active += 1


def _exit(field: str) -> None:
    global _active
    s = _state()
    setattr(s, field, getattr(s, field) - 1)
    if field != "hold":
        with _lock:
            _active -= 1
    if s.depth == 0 and s.retain == 0 and s.hold == 0 and s.kept:
        _exit_kept(s)


def _exit_kept(s) -> None:
    """The outermost transformation on this thread ended: drop the graphs tracers kept."""
    kept, s.kept = s.kept, []
    for r in kept:
        d = r()
        if d is not None:
            d.kept = None


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """A transformation runs (MLX's ``InTracing``)."""
    _enter("depth")
    try:
        yield
    finally:
        _exit("depth")


@contextlib.contextmanager
def placeholders() -> Iterator[None]:
    """A function runs on placeholders (vmap's tracers, compile's or export's trace): MLX's
    ``in_tracing`` holds there too; nothing else changes (a placeholder cannot be evaluated)."""
    s = _state()
    s.placeholders += 1
    try:
        yield
    finally:
        s.placeholders -= 1


def on_placeholders() -> bool:
    """Whether a function runs on placeholders on this thread (``placeholders()``)."""
    return _state().placeholders > 0


class RetainEach:
    """MLX's ``RetainGraph`` around each VJP rule of one reverse walk, cheaply: ``with
    RetainEach() as s`` counts the walk as running (``_active``) and gives this thread's
    state; the walk raises ``s.retain`` around each rule (while it is up every array counts
    as a tracer), lowers it after and calls ``released(s)`` (an ``_active`` that stays up
    between the rules only sends other threads' ops down the slow path of the same answer)."""

    __slots__ = ()

    def __enter__(self):
        global _active
        s = _state()
        with _lock:
            _active += 1
        return s

    def __exit__(self, *exc) -> None:
        global _active
        with _lock:
            _active -= 1


def released(s) -> None:
    """After a rule's ``s.retain -= 1`` (``RetainEach``): the kept graphs go when nothing
    holds them (as the end of MLX's ``RetainGraph`` scope lets them go)."""
    if s.kept and s.retain == 0 and s.depth == 0 and s.hold == 0:
        _exit_kept(s)


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """Kept graphs outlive the transformations until this context ends (``tapescope.check``
    differentiates the forward graph again after the function has returned)."""
    _enter("hold")
    try:
        yield
    finally:
        _exit("hold")


def keep(node) -> None:
    """Keep ``node`` (just evaluated, a tracer's) on its outputs: their ``kept``. (The
    eval's thread listed them in ``before_eval``: the stream's worker may run this.)"""
    for r in node.outputs:
        d = r()
        if d is not None:
            d.kept = node


def untrace(descs: Iterable) -> None:
    """Clear the tracer flag (MLX's ``set_tracer(false)``), as a transformation does on
    its primals and on the graph its function built once the function has returned."""
    for d in descs:
        d.tracer = False


def before_eval(descs: list, asynchronous: bool) -> None:
    """MLX's ``eval_impl`` walk, while a transformation runs on this thread: a node whose
    output is a tracer is marked to be kept; an evaluated array that is no longer a tracer
    loses its kept graph; ``async_eval`` of a tracer is MLX's error."""
    if not in_tracing():
        return
    from .walk import topological

    for node in topological(descs, kept=True):
        outs = [r() for r in node.outputs]
        d = next((o for o in outs if o is not None), None)
        if d is None:
            continue
        if d.node is None:  # evaluated, kept: detach it unless still a tracer
            if not is_tracer(d):
                for o in outs:
                    if o is not None and o.kept is node:
                        o.kept = None
            continue
        if node.event is not None:  # another eval runs it
            continue
        if is_tracer(d):
            if asynchronous:
                raise ValueError("[async_eval] Not allowed inside a graph transformation.")
            node.keep = True
            _state().kept.extend(weakref.ref(o) for o in outs if o is not None)
