"""``%load_ext tapescope``: the ``%%mlx`` cell magic and the ``%mlx`` line magics.

``%%mlx [--device cpu|gpu|cuda|metal|cpu,gpu] [--compile] [--check] [--fusion mlx|extended]
[--tiered] [--show graph,tapes,kernels,check,memory,cache,events] [--quiet]`` runs the cell in the user
namespace while recording the timeline, then shows what it did (``viz.cell.CellReport``):
the arrays it assigned or evaluated, their graph (arrays the cell left lazy, and the programs
of the compiled functions it traced), the fused tapes and kernel sources, JAX's verdict
(``--check``), memory, the kernel cache and the streams' events. The magic then evaluates the
arrays the cell left lazy, so their values can be shown. An exception (or an interrupt) in the
cell still shows the report of what ran, then the normal traceback.

``--compile`` runs the cell as one ``mx.compile``d function of the arrays it reads from the
namespace (so its elementwise chains fuse); a cell that cannot be traced (it prints or
evaluates an array) runs uncompiled, and the report says why. ``--fusion extended`` runs the
cell (and draws its report) under tapescope's extended fusion (reductions fused with their
elementwise neighbours, ``tapescope.set_fusion``); the mode in place before comes back after
the cell. ``--tiered`` runs it with tiered first calls (``tapescope.set_tiered``: a new
kernel's calls run interpreted while its C builds in the background), the setting in place
before coming back after. ``--device cpu,gpu`` runs the
cell on both devices (the second in a copy of the namespace) and shows results, differences
and timings side by side; an unavailable device is reported, never an error.

Line magics: ``%mlx graph <expr>``, ``%mlx memory``, ``%mlx cache``, ``%mlx events``.
IPython is imported only when the extension is loaded.
"""

from __future__ import annotations

import argparse
import shlex
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Optional

from tapescope import cell_recording as rec

if TYPE_CHECKING:  # the records are viz's (imported where used: importing tapescope imports no viz)
    from tapescope.viz.cell import ArrayResult, CellReport, DeviceRun

__all__ = ["load_ipython_extension", "mlx_magic", "last_report", "device_status"]

DEVICES = ("cpu", "gpu", "cuda", "metal")
MAX_GRAPH_NODES = 2000  # lazy graphs larger than this are summarised, not drawn
_last: dict = {"report": None}


def last_report() -> Optional[CellReport]:
    """The report of the last ``%%mlx`` cell run in this process (None before the first)."""
    return _last["report"]


def _last_records() -> Optional[list]:
    """The last ``%%mlx`` cell's records (what ``viz.EventsWidget()`` shows by default)."""
    rep = _last["report"]
    return rep.run.records if rep is not None else None



class _HTML:
    """Something to display: HTML for notebooks, text for terminals."""

    def __init__(self, html_text: str, text: str):
        self.html, self.text = html_text, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


def _usage_error(msg: str) -> Exception:
    from IPython.core.error import UsageError

    return UsageError(msg)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit the kernel
        raise _usage_error(f"%%mlx: {message}\n{self.format_usage()}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%%mlx", add_help=False)
    p.add_argument("--device", default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("--show", default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--fusion", default=None)
    p.add_argument("--tiered", action="store_true")
    return p


def parse_options(line: str) -> argparse.Namespace:
    """The ``%%mlx`` options; bad devices or sections raise UsageError."""
    opts = _parser().parse_args(shlex.split(line))
    devs = [d.strip().lower() for d in (opts.device or "").split(",") if d.strip()]
    bad = [d for d in devs if d not in DEVICES]
    if bad or (opts.device is not None and not devs):
        raise _usage_error(f"%%mlx: unknown device {', '.join(bad) or repr(opts.device)}; "
                           f"use {', '.join(DEVICES)} or a comma list such as cpu,gpu.")
    opts.devices = list(dict.fromkeys(devs))
    if opts.fusion is not None and opts.fusion not in ("mlx", "extended"):
        raise _usage_error(f"%%mlx: unknown fusion mode {opts.fusion!r}; "
                           "--fusion takes mlx or extended.")
    from tapescope.viz.cell import SECTIONS

    if opts.show is None:
        opts.sections = set(SECTIONS) if opts.check else set(SECTIONS) - {"check"}
    else:
        sec = {s.strip() for s in opts.show.split(",") if s.strip()}
        bad = sorted(sec - set(SECTIONS))
        if bad:
            raise _usage_error(f"%%mlx: unknown section {', '.join(bad)}; "
                               f"--show takes {','.join(SECTIONS)}.")
        opts.sections = sec
    return opts


def device_status(name: str) -> tuple[Any, Optional[str]]:
    """(the mx.Device for ``name``, or None and why it is unavailable here)."""
    import tapescope.core as mx

    if name == "cpu":
        return mx.cpu, None
    if name == "metal":
        if mx.metal.is_available():
            return mx.gpu, None
        return None, "The Metal GPU is unavailable here (mx.metal.is_available() is False)."
    if mx.is_available(mx.gpu):
        return mx.gpu, None
    what = "CUDA GPU" if name == "cuda" else "GPU"
    return None, f"The {what} is unavailable here (mx.is_available(mx.gpu) is False): no GPU runtime."


# -- running a cell --------------------------------------------------------------------------


def _arrays(ns: dict) -> dict:
    from tapescope.core.array import array

    return {k: v for k, v in ns.items() if isinstance(v, array) and not k.startswith("_")}


def _compiled(ns: dict) -> dict:
    from tapescope.core.ops.compile_api import CompiledFunction

    return {k: v for k, v in ns.items() if isinstance(v, CompiledFunction)}


def _is_lazy(a: Any) -> bool:
    return a._d.node is not None


def _graph_size(arrays: list, limit: int) -> int:
    """How many nodes are above ``arrays`` (counting stops past ``limit``)."""
    seen: set = set()
    stack = [a._d for a in arrays]
    while stack and len(seen) <= limit:
        d = stack.pop()
        n = d.node
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(n.inputs)
    return len(seen)


def _program_graphs(name: str, fn: Any) -> list:
    from tapescope.viz.graph import from_program

    out = []
    for i, prog in enumerate(fn.programs()):
        title = name if len(fn.programs()) == 1 else f"{name} (program {i})"
        g = from_program(prog, [f"in{j}" for j in range(len(prog.inputs))], [None] * len(prog.inputs),
                         [f"out[{j}]" for j in range(len(prog.outputs))], title, compiled=True,
                         program=True)
        out.append((f"compiled function {title}", g))
    return out


def _run_compiled(code: Any, ns: dict, run: DeviceRun) -> Any:
    """Run the cell as one mx.compile'd function of the arrays it reads; the CompiledFunction,
    or None when the cell could not be traced (it then ran uncompiled)."""
    import tapescope.core as mx
    from tapescope.core.array import array

    names = [n for n in code.co_names if isinstance(ns.get(n), array)]
    box: dict = {}

    def cell(*args: Any) -> dict:
        local = dict(ns)
        local.update(zip(names, args))
        exec(code, local)
        box["ns"], box["args"] = local, dict(zip(names, args))
        return {k: v for k, v in local.items() if isinstance(v, array) and not k.startswith("_")
                and v is not box["args"].get(k, ns.get(k))}

    cell.__name__ = "cell"
    fn = mx.compile(cell)
    try:
        out = fn(*[ns[n] for n in names])
    except Exception as e:  # noqa: BLE001 - not traceable: run it as written
        run.notes.append(f"--compile: the cell could not be traced ({type(e).__name__}: {e}); "
                         "it ran uncompiled.")
        exec(code, ns)
        return None
    for k, v in box["ns"].items():  # names the cell bound that are not arrays
        if not isinstance(v, array) and (k not in ns or ns[k] is not v) and k != "__builtins__":
            ns[k] = v
    ns.update(out)
    return fn


def _result(name: str, a: Any) -> ArrayResult:
    import numpy as np

    from tapescope.viz.cell import ArrayResult

    if _is_lazy(a):  # left lazy by a cell that raised: showing it would evaluate it
        data, text = None, "(lazy: not evaluated)"
    else:
        data, text = np.array(a), repr(a)
    return ArrayResult(name, tuple(a.shape), str(a.dtype).replace("mlx.core.", ""), text, data)


class _Status:
    """A one-line live status under a running ``%%mlx`` cell (in a kernel with ipywidgets):
    time so far, evals, primitive runs and memory, read off the timeline every half second;
    the cell's report replaces it when the cell ends."""

    current: Optional["_Status"] = None

    def __init__(self) -> None:
        import threading

        import ipywidgets as W
        from IPython.display import display

        self.t0 = time.perf_counter()
        from tapescope.viz.report import status_html

        self.widget = W.HTML(status_html("%%mlx: running…"))
        self.handle = display(self.widget, display_id=True)
        self.collector: Optional[rec.Collector] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tapescope-status", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, opts: Any) -> Optional["_Status"]:
        from tapescope.viz.theme import in_kernel

        if opts.quiet or not in_kernel():
            return None
        try:
            cls.current = cls()
        except ImportError:
            cls.current = None
        return cls.current

    def text(self) -> str:
        from tapescope.viz.theme import fmt_bytes

        recs = list(self.collector.records) if self.collector is not None else []
        evals = sum(1 for r in recs if r.kind == "eval_begin")
        prims = sum(1 for r in recs if r.kind == "primitive")
        mem = rec.memory_now()
        what = (f"{evals} eval(s), {prims:,} primitive run(s)" if evals else
                "building the graph (no eval has started yet)")
        return (f"%%mlx: running for {time.perf_counter() - self.t0:.1f} s · {what} · active "
                f"{fmt_bytes(mem.active)}, peak {fmt_bytes(mem.peak)}")

    def _loop(self) -> None:
        from tapescope.viz.report import status_html

        while not self._stop.wait(0.5):
            try:
                self.widget.value = status_html(self.text())
            except Exception:  # noqa: BLE001 - a status line must never break the cell
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        _Status.current = None


def _run_on(device_name: str, device: Any, code: Any, ns: dict, opts: Any) -> DeviceRun:
    """Run the compiled cell ``code`` in ``ns`` on ``device`` (None: the default device),
    recording everything."""
    __tracebackhide__ = True  # IPython: the traceback starts at the cell's own lines
    import tapescope.core as mx

    from tapescope.viz.cell import DeviceRun

    run = DeviceRun(device_name)
    before = _arrays(ns)
    lazy_before = {k for k, v in before.items() if _is_lazy(v)}
    fns_before = {k: (v, v.traces) for k, v in _compiled(ns).items()}
    run.memory_before, run.cache_before = rec.memory_now(), rec.cache_counts()
    compiled_fn = None
    changed: dict = {}
    t0 = time.perf_counter()
    with rec.Collector() as col:
        if _Status.current is not None:
            _Status.current.collector = col
        try:
            with _progress(opts.quiet), (mx.stream(device) if device is not None else nullcontext()):
                if opts.compile:
                    compiled_fn = _run_compiled(code, ns, run)
                else:
                    exec(code, ns)
        except BaseException as e:  # noqa: BLE001 - reported, then re-raised by the magic
            run.error = e
        after = _arrays(ns)
        changed = {k: v for k, v in after.items()
                   if k not in before or before[k] is not v or k in lazy_before}
        lazy = {k: v for k, v in changed.items() if _is_lazy(v)}
        if compiled_fn is not None:
            run.graphs += _program_graphs("cell", compiled_fn)
        for k, f in _compiled(ns).items():
            if k not in fns_before or fns_before[k][0] is not f or fns_before[k][1] != f.traces:
                run.graphs += _program_graphs(k, f)
        if run.error is None and lazy:
            _graph_lazy(run, lazy, compiled_fn is None)
            try:
                _check_and_eval(run, lazy, opts.check)
                for title, g in run.graphs:  # the magic computed them: drawn solid, not "lazy"
                    if title.endswith("(left lazy by the cell)"):
                        for vid in g.outputs:
                            g.values[vid].evaluated = True
            except BaseException as e:  # noqa: BLE001
                run.error = e
        elif opts.check:
            run.check = ("Nothing to check: the cell left no lazy arrays (an eval frees the graph "
                         "above an array). Leave the results lazy and --check compares them, "
                         "node by node, with JAX.") if run.error is None else \
                "Not checked: the cell did not finish."
    run.wall_s = time.perf_counter() - t0
    run.records = col.records
    if col.dropped:
        run.notes.append(f"{col.dropped} timeline records were not kept (over {col.limit}).")
    run.memory_after, run.cache_after = rec.memory_now(), rec.cache_counts()
    run.arrays = [_result(k, v) for k, v in changed.items()
                  if not (k in lazy_before and _is_lazy(v) and k in before and before[k] is v)]
    return run


class _progress:
    """Progress bars (tapescope.progress) unless ``--quiet``; nothing if that module is absent."""

    def __init__(self, quiet: bool):
        self.ctx = None
        if not quiet:
            try:
                from tapescope.progress import progress

                self.ctx = progress()
            except ImportError:
                self.ctx = None

    def __enter__(self) -> "_progress":
        if self.ctx is not None:
            self.ctx.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
        return False


def _graph_lazy(run: DeviceRun, lazy: dict, draw: bool) -> None:
    from tapescope.viz.graph import graph_of

    n = _graph_size(list(lazy.values()), MAX_GRAPH_NODES)
    if n > MAX_GRAPH_NODES:
        run.notes.append(f"The graph above {', '.join(lazy)} has more than {MAX_GRAPH_NODES} nodes; "
                         "it is not drawn.")
    elif draw:
        run.graphs.append((f"graph of {', '.join(lazy)} (left lazy by the cell)",
                           graph_of(*lazy.values())))


def _check_and_eval(run: DeviceRun, lazy: dict, check: bool) -> None:
    import tapescope.core as mx

    if check:
        try:
            from tapescope import check as ts_check

            run.check = ts_check(lambda: dict(lazy))
        except ImportError as e:
            run.check = f"Not checked: {e} (tapescope.check needs JAX)."
        except Exception as e:  # noqa: BLE001 - the check is a report, not the cell
            run.check = f"Not checked: {type(e).__name__}: {e}"
    mx.eval(list(lazy.values()))


def _prompt_number(shell: Any) -> int:
    """The number of the prompt this cell runs under (``In[N]``): the number IPython gave the
    calling cell's code, found on the stack; ``shell.execution_count`` when there is none
    (IPython 9 has already counted the cell by the time a magic runs)."""
    import sys

    names = getattr(shell.compile, "_filename_map", {}) or {}
    f = sys._getframe(1)
    while f is not None:
        n = names.get(f.f_code.co_filename)
        if isinstance(n, int):
            return n
        f = f.f_back
    return shell.execution_count


def mlx_cell(shell: Any, line: str, cell: str) -> CellReport:
    """Run ``cell`` under ``%%mlx`` options ``line``; display and return the report."""
    __tracebackhide__ = True
    opts = parse_options(line)
    if opts.fusion is None and not opts.tiered:
        return _mlx_cell(shell, opts, cell)
    from tapescope.core import fusion
    from tapescope.kernels.cpu import tiered

    before, was_tiered = fusion.fusion_mode(), tiered.tiered()
    if opts.fusion is not None:
        fusion.set_fusion(opts.fusion)
    if opts.tiered:
        tiered.set_tiered(True)
    try:
        return _mlx_cell(shell, opts, cell)
    finally:
        fusion.set_fusion(before)
        tiered.set_tiered(was_tiered)


def _mlx_cell(shell: Any, opts: Any, cell: str) -> CellReport:
    __tracebackhide__ = True
    from tapescope.viz.cell import CellReport, DeviceRun

    ns = shell.user_ns
    try:
        fname = shell.compile.cache(cell, _prompt_number(shell))
    except Exception:  # noqa: BLE001 - an old or stub shell: tracebacks lack the source only
        fname = "<%%mlx cell>"
    code = compile(cell, fname, "exec")
    status = _Status.start(opts)
    pre = dict(ns)
    runs: list = []
    primary = None
    if not opts.devices:  # no --device: the default device, as the code would run without %%mlx
        import tapescope.core as mx

        runs.append(_run_on(mx.default_device().type.name, None, code, ns, opts))
        primary = runs[-1]
    for name in opts.devices:
        dev, why = device_status(name)
        if dev is None:
            runs.append(DeviceRun(name, unavailable=why))
            continue
        target = ns if primary is None else dict(pre)
        runs.append(_run_on(name, dev, code, target, opts))
        if primary is None:
            primary = runs[-1]
    if primary is None:  # nothing requested is available: run on the CPU, and say so
        import tapescope.core as mx

        runs.append(_run_on("cpu", mx.cpu, code, ns, opts))
        primary = runs[-1]
        primary.notes.append(f"Ran on the CPU instead of {', '.join(opts.devices)}.")
    for r in runs:
        _option_notes(r, opts)
    report = CellReport(cell, runs, opts.sections, compiled=opts.compile, filename=fname)
    _last["report"] = report
    from tapescope.viz import events

    events.set_default_records(_last_records)  # viz.EventsWidget() shows this cell's records
    if status is not None:
        status.stop()
    if not opts.quiet:
        _display(report, status.handle if status is not None else None)
    if primary.error is not None:
        raise _user_traceback(primary.error)
    return report


TIERED_CPU_ONLY = ("--tiered: tiered first calls are the CPU's (a new kernel's C builds in the "
                   "background while its calls run interpreted); on this device each kernel was "
                   "built before its first launch.")
EXTENDED_UNFUSED = ("--fusion extended: {n} reduction(s) ran unfused on this device: its runtime "
                    "has no fused reduction kernels (only the CPU's C does), so MLX's fusion applied.")


def _option_notes(run: DeviceRun, opts: Any) -> None:
    """Say when an option did nothing on the device the cell ran on: ``--tiered`` where
    fused tapes do not run as the CPU's C (no background builds there), ``--fusion
    extended`` where reductions stayed outside every fused kernel."""
    if run.unavailable:
        return
    if opts.tiered:
        import tapescope.core as mx
        from tapescope.kernels.backends import backend

        dev = device_status(run.device)[0] if run.device in DEVICES else mx.default_device()
        if dev is not None and backend(dev).compiled_prebuild is None:
            run.notes.append(TIERED_CPU_ONLY)
    if opts.fusion == "extended":
        from tapescope.kernels.primitives import REDUCE

        n = sum(1 for _, g in run.graphs for op in g.ops if op.family == REDUCE and op.kernel is None)
        if n:
            run.notes.append(EXTENDED_UNFUSED.format(n=n))


def _display(report: CellReport, handle: Any) -> None:
    """Show the report: in a kernel, its HTML snapshot (into the status line's place) and then the
    live tabbed panel; elsewhere the static HTML."""
    from IPython.display import display

    from tapescope.viz.theme import in_kernel

    if in_kernel():
        try:
            from tapescope.viz.panel import CellPanel
            from tapescope.viz.theme import show

            report.panel = CellPanel(report)
            show(report.panel.widget, report._repr_html_(), repr(report).splitlines()[0], handle=handle)
            return
        except ImportError:
            pass
    if handle is not None:
        handle.update({"text/html": report._repr_html_(), "text/plain": repr(report)}, raw=True)
    else:
        display(report)


def _user_traceback(err: BaseException) -> BaseException:
    """``err`` with tapescope's own frames taken out of its traceback, so the reader sees the
    frames of their cell (and of their own functions) only."""
    import os

    import tapescope

    roots = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (
        tapescope.__file__, tapescope.core.__file__)) + tuple(
        os.path.dirname(os.path.abspath(m.__file__)) + os.sep
        for m in (__import__("tapescope.kernels", fromlist=["x"]), __import__("tapescope.viz", fromlist=["x"])))
    tbs = []
    tb = err.__traceback__
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(roots):
            tbs.append(tb)
        tb = tb.tb_next
    if not tbs:
        return err
    for a, b in zip(tbs, tbs[1:]):
        a.tb_next = b
    tbs[-1].tb_next = None
    return err.with_traceback(tbs[0])


# -- line magics -----------------------------------------------------------------------------

LINE_USAGE = "%mlx graph <expr> | %mlx memory | %mlx cache | %mlx events | %mlx as-mlx [off]"


def _graph_of_expr(shell: Any, expr: str) -> Any:
    from tapescope.core.array import array
    from tapescope.viz.graph import Graph, graph_of
    from tapescope.viz import report as vr

    if not expr.strip():
        raise _usage_error("%mlx graph: give an expression, e.g. %mlx graph f(x)")
    obj = shell.ev(expr)
    if isinstance(obj, Graph):
        return obj
    if isinstance(obj, array):
        return graph_of(obj)
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(a, array) for a in obj):
        return graph_of(*obj)
    if _compiled({"obj": obj}):
        graphs = _program_graphs(expr.strip(), obj)
        if not graphs:
            msg = "Not traced yet: call the compiled function once."
            return _HTML(vr.note_html(msg), msg)
        return graphs[0][1] if len(graphs) == 1 else _HTML(
            vr.titled_graphs_html(graphs), "\n".join(g.summary() for _, g in graphs))
    raise _usage_error(f"%mlx graph: {expr.strip()} is a {type(obj).__name__}, not an array, "
                       "a list of arrays or a compiled function.")


def _memory_view() -> _HTML:
    import tapescope.core as mx
    from tapescope.viz import report as vr

    now = rec.memory_now()
    text = (f"active {now.active} B, peak {now.peak} B, cache {now.cache} B, "
            f"limit {mx.get_memory_limit()} B")
    return _HTML(vr.memory_view_html(text, now, last_report()), text)


def _cache_view() -> _HTML:
    from tapescope.kernels.cache_entries import kernel_cache
    from tapescope.viz import report as vr

    entries = kernel_cache()
    rows = [(e["name"], e["runtime"], e["variant"], e["origin"], f"{e['build_ms']:.1f}", e["hits"],
             e["misses"]) for e in entries]
    head = ["kernel", "runtime", "variant", "from", "build ms", "hits", "misses"]
    text = f"{len(entries)} cached kernel(s)" + "".join(f"\n  {r[0]} hits={r[5]} misses={r[6]}"
                                                         for r in rows)
    return _HTML(vr.cache_view_html(head, rows, last_report()), text)


def _events_view() -> _HTML:
    from tapescope.viz import report as vr
    from tapescope.viz.records import EVENT_KINDS

    rep = last_report()
    if rep is None:
        msg = "No %%mlx cell has run yet: the events of the last %%mlx cell are shown here."
        return _HTML(vr.note_html(msg), msg)
    recs = [r for r in rep.run.records if r.kind in EVENT_KINDS or r.kind == "interrupt"]
    text = f"{len(recs)} event record(s) in the last %%mlx cell" + "".join(
        f"\n  {r.kind} stream={r.stream} {r.detail}" for r in recs[:50])
    return _HTML(vr.events_html(rep.run.records), text)


def _as_mlx(arg: str) -> _HTML:
    """``%mlx as-mlx``: route ``mlx.core`` (and mlx.nn / mlx.optimizers) to tapescope;
    ``%mlx as-mlx off`` restores the real MLX."""
    from tapescope.as_mlx import as_mlx
    from tapescope.viz.report import note_html

    if arg not in ("", "on", "off"):
        raise _usage_error(f"%mlx as-mlx: expected 'on' or 'off', got {arg!r}.")
    as_mlx(arg != "off")
    msg = ("mlx.core is tapescope.core now: import mlx.core / mlx.nn / mlx.optimizers run on "
           "tapescope (a name bound by an earlier import mlx.core keeps the old module: "
           "import it again)" if arg != "off" else "mlx.core is MLX's own again")
    return _HTML(note_html(msg), msg)


def mlx_line(shell: Any, line: str) -> Any:
    """``%mlx graph <expr>``, ``%mlx memory``, ``%mlx cache``, ``%mlx events``,
    ``%mlx as-mlx [off]``."""
    cmd, _, rest = line.strip().partition(" ")
    if cmd == "graph":
        return _graph_of_expr(shell, rest)
    if cmd == "as-mlx":
        return _as_mlx(rest.strip())
    if cmd in ("memory", "cache", "events"):
        try:  # the live widgets (their HTML snapshot where no kernel shows widgets)
            import ipywidgets  # noqa: F401

            from tapescope import viz

            if cmd == "memory":
                rep = last_report()
                return viz.MemoryWidget(records=rep.run.records if rep is not None else None)
            if cmd == "cache":
                return viz.CacheWidget()
            return viz.EventsWidget()
        except ImportError:
            return {"memory": _memory_view, "cache": _cache_view, "events": _events_view}[cmd]()
    raise _usage_error(f"%mlx: unknown command {cmd!r}; use {LINE_USAGE} (or %%mlx for a cell).")


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%mlx`` / ``%mlx`` and put ``mx`` (tapescope.core) in the user namespace."""
    import tapescope.core as mx

    def mlx_magic(line: str, cell: Optional[str] = None) -> Any:
        __tracebackhide__ = True
        if cell is None:
            return mlx_line(ipython, line)
        mlx_cell(ipython, line, cell)
        return None

    mlx_magic.__doc__ = __doc__
    ipython.register_magic_function(mlx_magic, magic_kind="line_cell", magic_name="mlx")
    ipython.push({"mx": mx})


def mlx_magic(line: str, cell: Optional[str] = None) -> Any:
    """``%%mlx`` / ``%mlx`` on the running IPython shell (what the extension registers)."""
    from IPython import get_ipython

    shell = get_ipython()
    return mlx_line(shell, line) if cell is None else mlx_cell(shell, line, cell)
