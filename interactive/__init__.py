"""tapescope: an MLX-style lazy array runtime for Jupyter that shows its own insides."""

from tapescope.core.eval_loop import interrupt_eval  # noqa: F401
from tapescope.kernels.timeline import record  # noqa: F401
from tapescope.kernels.settings import settings  # noqa: F401  (every mode and switch)
from tapescope.kernels.cache_entries import clear_kernel_cache, kernel_cache  # noqa: F401
from tapescope.kernels.cpu.tiered import set_tiered, tiered  # noqa: F401  (tiered first calls)
from tapescope.core.fusion import fusion_mode, set_fusion  # noqa: F401  (extended fusion)
from tapescope.check import check  # noqa: F401  (imports JAX only when called)
from tapescope.magic import load_ipython_extension  # noqa: F401  (imports IPython only when loaded)
from tapescope.as_mlx import as_mlx  # noqa: F401  (mlx.core -> tapescope.core)

__version__ = "0.1.0"

_GRAPH = ("Graph", "graph_of", "trace")  # viz/graph.py's: the graph model the pictures draw


def __getattr__(name: str):
    """``Graph``, ``graph_of`` and ``trace`` from ``viz/graph.py``, imported on first use
    (importing tapescope imports no part of viz)."""
    if name in _GRAPH:
        from tapescope.viz import graph

        return getattr(graph, name)
    raise AttributeError(f"module 'tapescope' has no attribute {name!r}")


def export_trace(path, records=None) -> str:
    """Write the timeline (or ``records``) as Chrome trace-event JSON for Perfetto / chrome://tracing."""
    from tapescope.viz.trace import export_trace as _export

    return _export(path, records)


def timeline():
    """Every record on the timeline (evals, primitive runs, ...), oldest first."""
    from tapescope.kernels import timeline as _t

    return _t.records()
