"""``mx.eval``, ``mx.async_eval``, ``mx.synchronize`` and ``mx.clear_streams``."""

from __future__ import annotations

from typing import Any

from tapescope.kernels import stream_workers
from tapescope.kernels.backends import existing_stream_backend, stream_backend
from tapescope.kernels.settings import settings

from .array import array
from .device import StreamOrDevice, resolve_stream, streams
from .eval_loop import evaluate
from .random_state import reset_thread_key
from .transform_tracers import on_placeholders
from .tree import tree_arrays


def _eval(*args: Any) -> None:
    """Evaluate the arrays (or pytrees of arrays) given, and everything they depend on.

    Leaves that are not arrays are ignored. Blocks until the outputs are available.
    """
    if len(args) == 1 and args[0].__class__ is array:  # the common ``mx.eval(x)``
        evaluate([args[0]._d])
    else:
        evaluate([a._d for a in tree_arrays(args)])


def _c_eval():
    """``mx.eval``: core/_call.c's eval (one array's eval in the loop's C part,
    ``eager_eval``, without a Python frame; else ``_eval``) where that extension is built
    and on, else ``_eval``."""
    if not settings.c_call:
        return _eval
    try:
        from . import _call
    except ImportError:
        return _eval
    _call.configure_eval({"python": _eval})
    return _call.eval


eval = _c_eval()


def async_eval(*args: Any) -> None:
    """Start evaluating the arrays (or pytrees of arrays) given and return at once.

    Work goes onto each stream's worker thread; reading a result (``item()``, printing,
    ``mx.eval``) waits for it.
    """
    arrays = tree_arrays(args)
    if on_placeholders():  # MLX: a tracer of vmap / compile may not be evaluated asynchronously
        from .compile_trace import made_from_tracers  # (grad's tracers: transform_tracers.before_eval)

        if made_from_tracers(arrays):
            raise ValueError("[async_eval] Not allowed inside a graph transformation.")
    evaluate([a._d for a in arrays], asynchronous=True)


def synchronize(stream: StreamOrDevice = None) -> None:
    """Wait until all work queued on ``stream`` (default: the default device's default
    stream) has finished; raise the earliest error of an asynchronous eval on it since the last
    ``synchronize`` (once, as MLX's does: mlx/scheduler.cpp). The failed arrays stay
    lazy: reading one evaluates it again (and raises again)."""
    s = resolve_stream(stream)
    w = stream_workers.existing_worker(s.index)
    if w is not None:
        w.synchronize()
        w.check_error()
    stream_backend(s).synchronize(s)  # a GPU stream's enqueued device work


def clear_streams() -> None:
    """Finish the queued work and stop every stream's worker thread (they restart on use);
    the calling thread's random key starts afresh, as in MLX (python/src/stream.cpp). A GPU
    stream's enqueued kernels finish too, so the buffers freed while they ran are released."""
    reset_thread_key()
    stream_workers.stop_workers()
    for s in streams():
        b = existing_stream_backend(s.index)
        if b is not None:  # (a stream nothing ran on has nothing queued)
            b.synchronize(s)
