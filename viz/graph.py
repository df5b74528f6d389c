"""The ``Graph`` a function traces into (or the live graph above some arrays), as plain data.

``tapescope.trace(fun, *args)`` traces ``fun`` the way ``mx.compile`` does (placeholders in,
then simplification and fusion when ``compile=True``) and ``tapescope.graph_of(*arrays)``
reads the lazy graph above eagerly built arrays. Both give a ``Graph``: values (inputs,
constants, intermediates, outputs; evaluated or lazy), ops (MLX primitive names, families,
parameters) and fused kernels (tape, kernel name, predicted variant, source per runtime and,
on every input, why fusion stopped there). It is the model the pictures draw from, below
them in viz (``dot.py``, ``render.py``, ``roofline.py``, ``sources.py``, the ``%%mlx``
panel and report), built from core alone: viz needs nothing of the notebook layer for it,
which reads it too (``tapescope.check``, the ``%%mlx`` magic); in a notebook it draws itself.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ml_dtypes
import numpy as np

from tapescope.core.array import ArrayDesc, array
from tapescope.core.fusion import ARGUMENT, CONSTANT, boundary_reason
from tapescope.core.tree import tree_unflatten
from tapescope.core.walk import topological
from tapescope.kernels.codegen.layout import Layout, variant as kernel_variant
from tapescope.kernels.primitives import COMPILED, PLACEHOLDER

__all__ = ["Graph", "Value", "Op", "Kernel", "KernelInput", "trace", "graph_of"]


@dataclass
class Value:
    """One array of the graph: an input, a constant, or the ``index``-th output of an op."""

    id: int
    shape: tuple
    dtype: str  # MLX dtype name ("float32", "bfloat16", ...)
    role: str  # "input", "constant" or "intermediate"
    evaluated: bool  # holds data (an evaluated array) rather than waiting on its op
    name: str = ""
    producer: Optional[int] = None  # op id
    index: int = 0
    data: Optional[np.ndarray] = field(default=None, repr=False)  # constants / evaluated leaves
    is_output: bool = False
    seed: bool = False  # the cotangent reverse mode started from (grad's 1.0)


@dataclass
class Op:
    """A primitive applied to values; ``kernel`` is the index of its fused kernel (Compiled)."""

    id: int
    primitive: str
    family: str
    params: dict = field(repr=False)
    inputs: list
    outputs: list
    kernel: Optional[int] = None
    backward: bool = False  # recorded by reverse mode (a VJP rule's op, a cotangent sum)
    # a reduction primitive's generated kernel (``codegen.reduce_kernels.KernelSpec``) for a
    # row-contiguous input: ``generated.name``, ``generated.sources()`` (C, CUDA, MSL)
    generated: Any = field(default=None, repr=False)


@dataclass
class KernelInput:
    """One input of a fused tape: its letter, the value it reads, and why fusion stopped there."""

    letter: str
    value: int
    reason: Optional[str]  # "argument", "constant", "reduction", "depth limit", ... (None: unknown)
    producer: str  # primitive that made the value, or "argument" / "constant"
    constant: Optional[Any] = None  # the literal, when the constant is inlined into the source


@dataclass
class Kernel:
    """A fused elementwise kernel (MLX's Compiled): its tape, name and predicted variant."""

    index: int
    op: int
    name: str
    tape: Any = field(repr=False)  # tapescope.kernels.codegen.tape.Tape
    shape: tuple
    variant: str  # "contiguous", "strided_<ndim>" (+ "_large"), predicted from the layouts
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)  # (letter, value id)

    @property
    def symbol(self) -> str:
        """The variant's kernel symbol (kernel name + ``_`` + variant)."""
        return f"{self.name}_{self.variant}"

    @property
    def steps(self) -> list:
        """The tape's operations: (letter, primitive, dtype name, input letters)."""
        return [(op.name, op.primitive, np.dtype(op.dtype).name, tuple(op.inputs)) for op in self.tape.ops]

    def cached(self) -> list:
        """This kernel's entries in ``tapescope.kernel_cache()`` (variants built or loaded so far)."""
        from tapescope.kernels.cache_entries import listed

        return listed(self._entries())

    def _entries(self) -> list:
        """This kernel's variants in the in-process cache (``KernelEntry``: name, runtime,
        source), without ``kernel_cache()``'s roofline columns: those read the whole timeline
        (up to ``timeline.CAPACITY`` records), once per kernel of a picture otherwise."""
        from tapescope.kernels import kernel_registry

        prefix = self.name + "_"
        return [e for e in kernel_registry.entries() if e.name.startswith(prefix)]

    @property
    def tier(self) -> Optional[str]:
        """What ran the predicted variant so far: ``"kernel"`` (its generated C),
        ``"cuda"`` / ``"metal"`` (its GPU kernel), ``"interpreted"`` (a tiered first call
        while the kernel builds: ``set_tiered``),
        ``"numpy"`` (a fallback; the kernel cache says why) or None (not run yet)."""
        for e in self._entries():
            if e.name in (self.symbol, self.gpu_symbol):
                return {"cpu": "kernel"}.get(e.runtime, e.runtime)
        return None

    @property
    def sources(self) -> dict:
        """Generated source of the predicted variant per runtime: ``cpu`` (C: the built one
        when the kernel cache has it), ``cuda`` and ``metal`` (MSL), or why there is none."""
        from tapescope.kernels.codegen.render import kernel_sources

        built = {e.runtime: e.source for e in self._entries()
                 if e.runtime in ("cpu", "cuda") and e.source
                 and e.name in (self.symbol, self.gpu_symbol)}
        return kernel_sources(self.tape, self.name, self.variant, built=built)

    @property
    def gpu_symbol(self) -> str:
        """The variant's GPU kernel symbol (MLX's GPU names: ``strided_dynamic`` above 8
        dimensions for CUDA)."""
        from tapescope.kernels.codegen.gpu import variant_suffix
        from tapescope.kernels.codegen.render import parse_variant, renderer

        contiguous, ndim, large = parse_variant(self.variant)
        static = renderer("cuda").schedule.max_static_ndim
        return f"{self.name}_{variant_suffix(contiguous, ndim, large, static)}"

    def sources_html(self) -> str:
        """The sources side by side (one column per runtime), for the viz and notebooks."""
        from .sources import sources_page

        return sources_page(self.sources, title=self.symbol, focus=self.name)


class Graph:
    """A traced or live graph: values, ops in topological order, fused kernels."""

    def __init__(self, values: list, ops: list, kernels: list, inputs: list, outputs: list,
                 title: str = "", compiled: bool = False, program: bool = False):
        self.values, self.ops, self.kernels = values, ops, kernels
        self.inputs, self.outputs = inputs, outputs
        self.title, self.compiled = title, compiled
        # a compiled function's program: its values are placeholders, neither lazy nor holding
        # data (drawn solid, without the lazy / evaluated legend)
        self.program = program

    @property
    def generated_kernels(self) -> list:
        """(op, KernelSpec) of every reduction primitive that runs as a generated kernel
        (MLX's Reduce, ArgReduce, Softmax, LogSumExp, scans), predicted for row-contiguous
        inputs; each spec's ``sources()`` are its C, CUDA and MSL."""
        return [(op, op.generated) for op in self.ops if op.generated is not None]

    @property
    def constants(self) -> list:
        """Ids of the constant values (scalars and closed-over arrays)."""
        return [v.id for v in self.values if v.role == "constant"]

    @property
    def nodes(self) -> list:
        """The ops (graph nodes), topologically ordered."""
        return list(self.ops)

    @property
    def edges(self) -> list:
        """(value id, producer op id or None, consumer op id or None for a graph output)."""
        out = []
        for op in self.ops:
            for vid in op.inputs:
                out.append((vid, self.values[vid].producer, op.id))
        for vid in self.outputs:
            out.append((vid, self.values[vid].producer, None))
        return out

    @property
    def boundaries(self) -> list:
        """(kernel name, input letter, producer, reason) for every input of every fused kernel."""
        return [(k.name, i.letter, i.producer, i.reason) for k in self.kernels for i in k.inputs]

    def to_dot(self, **options: Any) -> str:
        """The picture as DOT text (see ``tapescope.viz.dot.to_dot`` for the options)."""
        from .dot import to_dot

        return to_dot(self, **options)

    def to_svg(self, **options: Any) -> str:
        """The picture as SVG text (needs the graphviz ``dot`` program)."""
        from .render import render

        return render(self.to_dot(**options), "svg").decode()

    def to_png(self, **options: Any) -> bytes:
        """The picture as PNG bytes (needs the graphviz ``dot`` program)."""
        from .render import render

        return render(self.to_dot(**options), "png")

    def save(self, path: str, **options: Any) -> None:
        """Write the picture to ``path``: ``.dot``/``.gv`` as DOT, ``.svg``, ``.png`` or ``.pdf``."""
        from .render import save

        save(self.to_dot(**options), path)

    def draw(self, **options: Any) -> "Drawing":
        """The picture with options (``rankdir``, ``shapes``, ``max_nodes``, ...), for display."""
        return Drawing(self, options)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        return Drawing(self, {})._repr_mimebundle_(include, exclude)

    def roofline(self, records: Optional[list] = None) -> list:
        """This graph's fused kernels as they ran, on their devices' rooflines
        (``tapescope.kernels.roofline.Placed``, one per kernel and size), from ``records``
        (default: the timeline's ring; record the calls with ``tapescope.record()``)."""
        from tapescope.kernels import roofline, timeline

        names = {k.name for k in self.kernels}
        recs = timeline.records() if records is None else records
        return [p for p in roofline.place(recs)
                if p.launch.name in names or any(p.launch.name.startswith(n + "_") for n in names)]

    def roofline_figure(self, records: Optional[list] = None) -> Any:
        """The plotly roofline of ``roofline(records)`` (None without plotly or launches)."""
        from .roofline import roofline_figure

        return roofline_figure(self.roofline(records))

    def summary(self) -> str:
        """One line per op (and per kernel's tape), for the terminal."""
        lines = [self._headline()]
        for op in self.ops:
            ins = ", ".join(self._vname(v) for v in op.inputs)
            outs = ", ".join(f"{self._vname(v)} {_shape_text(self.values[v])}" for v in op.outputs)
            lines.append(f"  {op.primitive}({ins}) -> {outs}")
            if op.generated is not None:
                lines.append(f"    kernel {op.generated.name} [generated]")
            if op.kernel is not None:
                k = self.kernels[op.kernel]
                lines.append(f"    kernel {k.name} [{k.variant}]")
                for i in k.inputs:
                    lines.append(f"      {i.letter} <- {self._vname(i.value)} ({i.reason})")
                for s in k.steps:
                    lines.append(f"      {s[0]} = {s[1]}({', '.join(s[3])}) {s[2]}")
        lines.append("  outputs: " + ", ".join(self._vname(v) for v in self.outputs))
        return "\n".join(lines)

    def _vname(self, vid: int) -> str:
        v = self.values[vid]
        return v.name or f"v{vid}"

    def _headline(self) -> str:
        n_ops = len(self.ops)
        k = len(self.kernels)
        what = f"{self.title}: " if self.title else ""
        kern = f", {k} fused kernel{'s' if k != 1 else ''}" if self.compiled or k else ""
        return (f"{what}{len(self.inputs)} input{'s' if len(self.inputs) != 1 else ''}, "
                f"{n_ops} op{'s' if n_ops != 1 else ''}{kern}, "
                f"{len(self.outputs)} output{'s' if len(self.outputs) != 1 else ''}")

    def __repr__(self) -> str:
        return f"<Graph {self._headline()}>"


class Drawing:
    """A Graph with picture options; displays itself (SVG) in Jupyter, VS Code and nbconvert."""

    def __init__(self, graph: Graph, options: dict):
        self.graph, self.options = graph, dict(options)

    @property
    def dot(self) -> str:
        """The DOT text."""
        return self.graph.to_dot(**self.options)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        from .render import mimebundle

        return mimebundle(self.dot, repr(self.graph))

    def __repr__(self) -> str:
        return repr(self.graph)


def _shape_text(v: Value) -> str:
    return f"{tuple(v.shape)} {v.dtype}"


# -- building a Graph from a traced program --------------------------------------------


def _layout_of(v: Any, producers: dict, real: dict) -> Layout:
    """Predicted layout of a program value: real data for evaluated arguments; a view whose
    definition gives its strides (Broadcast, Transpose) has those; anything else is written
    row-contiguous."""
    d = real.get(id(v))
    if d is not None and d.data is not None:
        return d.data
    if getattr(v, "desc", None) is not None and v.desc.data is not None:
        return v.desc.data
    g = producers.get(id(v))
    strides = g.prim.defn.view_strides if g is not None and g.inputs else None
    if strides is not None:
        src = _layout_of(g.inputs[0], producers, real)
        est = tuple(s // src.dtype.itemsize for s in src.strides)
        return Layout(v.shape, v.dtype.np, tuple(strides(est, tuple(src.shape), tuple(v.shape),
                                                         **g.prim.kw)))
    return Layout(v.shape, v.dtype.np)


def _variant(tape: Any, shape: tuple, layouts: list) -> str:
    """The kernel variant a call with these input layouts runs (MLX's choice, the same on
    every device)."""
    if getattr(tape, "reduction", None) is not None:  # extended fusion's reduction kernel
        return f"reduce_{tape.reduction.mode}"
    return kernel_variant(tape, layouts, shape)


class _Builder:
    """Collects Values / Ops / Kernels with graph-local ids."""

    def __init__(self) -> None:
        self.values: list = []
        self.ops: list = []
        self.kernels: list = []

    def value(self, shape: tuple, dtype: Any, role: str, evaluated: bool, name: str = "",
              producer: Optional[int] = None, index: int = 0, data: Any = None) -> int:
        vid = len(self.values)
        self.values.append(Value(vid, tuple(shape), dtype.name, role, evaluated, name, producer,
                                 index, data))
        return vid

    def op(self, prim: Any, inputs: list, backward: bool = False) -> Op:
        op = Op(len(self.ops), prim.name, prim.kind, prim.kwargs(),
                list(inputs), [], backward=backward)
        op.generated = self._generated(prim, inputs)
        self.ops.append(op)
        return op

    def _generated(self, prim: Any, inputs: list) -> Any:
        """The generated kernel a reduction or fast primitive runs on row-contiguous inputs."""
        from tapescope.kernels.common import norms
        from tapescope.kernels.common.reductions import PRIMITIVES, plan_for

        fast = prim.name in norms.PRIMITIVES
        if not inputs or (not fast and (prim.name not in PRIMITIVES or len(inputs) != 1)):
            return None
        v = self.values[inputs[0]]
        try:
            dt = np.dtype(ml_dtypes.bfloat16) if v.dtype == "bfloat16" else np.dtype(
                "bool" if v.dtype == "bool" else v.dtype)
            strides = tuple(int(np.prod(v.shape[i + 1:], dtype=np.int64)) for i in range(len(v.shape)))
            if fast:
                call = self._fast_call(prim, dt, v, strides, [self.values[i] for i in inputs[1:]])
            else:
                call = plan_for(prim.name, dt, v.shape, strides, prim.kwargs())
        except (TypeError, KeyError, ValueError, IndexError):
            return None
        return None if call is None or isinstance(call, str) else call.spec

    @staticmethod
    def _fast_call(prim: Any, dt, v, strides: tuple, rest: list):
        from tapescope.kernels.common import norms

        if not v.shape or norms.why_not(dt):
            return None
        vec = tuple(None if not r.shape else 1 for r in rest)
        if prim.name in norms.NORMS:
            return norms.norm_call(prim.name, dt, v.shape, strides, vec)
        if prim.name in norms.VJPS:
            return norms.vjp_call(prim.name, dt, v.shape, vec[:-1])
        size = int(np.prod(rest[0].shape, dtype=np.int64)) if rest else 1
        return norms.rope_call(dt, v.shape, strides, size, 1, **prim.kwargs())

    def kernel(self, op: Op, tape: Any, shape: tuple, layouts: list, inputs: list) -> None:
        try:
            variant = _variant(tape, shape, layouts)
        except Exception:  # an unexpected layout: say so rather than fail the picture
            variant = "unknown"
        k = Kernel(len(self.kernels), op.id, tape.lib_name, tape, tuple(shape), variant, inputs,
                   list(zip(tape.outputs, op.outputs)))
        op.kernel = k.index
        self.kernels.append(k)


def _constant_literal(x: Any) -> Any:
    return x.constant if getattr(x, "is_constant", False) else None


def _boundary_runs(prog: Any) -> dict:
    """id(Compiled GOp) -> its Boundary records (fuse appends them per kernel, last op first)."""
    out: dict = {}
    bs = list(getattr(prog, "boundaries", ()))
    pos = 0
    for g in reversed(prog.tape):
        if g.prim.kind != COMPILED:
            continue
        n = len(g.inputs)
        run = bs[pos:pos + n]
        tape = g.prim.kw["tape"]
        if len(run) == n and all(b.kernel == tape.lib_name for b in run):
            out[id(g)] = {b.input: b for b in run}
            pos += n
        else:  # not in the expected order: look up by kernel name and letter
            out[id(g)] = {b.input: b for b in bs if b.kernel == tape.lib_name}
    return out


def from_program(prog: Any, input_names: list, real: list, output_names: list,
                 title: str = "", compiled: bool = False, backward: Optional[dict] = None,
                 program: bool = False) -> Graph:
    """A Graph of a traced (and possibly fused) ``compile_trace.Program``. ``backward``: what
    reverse mode recorded while tracing (``_backward_marks``): its ops are marked, and so
    is a fused kernel that reads a cotangent. ``program``: the graph is the program itself
    (a compiled function's, reused by every call), not one call on ``real`` arguments."""
    b = _Builder()
    bw_prims = {id(p) for p in (backward or {}).get("prims", ())}
    seeds = {id(d) for d in (backward or {}).get("seeds", ())}
    cot_vals: set = set()  # ids of program values that carry cotangents
    ids: dict = {}
    real_of = {id(v): d for v, d in zip(prog.inputs, real)}
    for v, name, d in zip(prog.inputs, input_names, real):
        ids[id(v)] = b.value(v.shape, v.dtype, "input", bool(d is not None and d.node is None), name)
    producers = {id(o): g for g in prog.tape for o in g.outputs}
    bounds = _boundary_runs(prog)
    n_const = 0

    def vid_of(v: Any) -> int:
        nonlocal n_const
        if id(v) not in ids:  # a constant (the only values not made by an op or an argument)
            data = v.desc.data if v.desc is not None else None
            seed = v.desc is not None and id(v.desc) in seeds
            ids[id(v)] = b.value(v.shape, v.dtype, "constant", True,
                                 "seed" if seed else f"c{n_const}", data=data)
            b.values[ids[id(v)]].seed = seed
            n_const += not seed
        return ids[id(v)]

    for g in prog.tape:
        if g.prim.kind == COMPILED:
            is_bw = any(id(x) in cot_vals or (x.desc is not None and id(x.desc) in seeds)
                        for x in g.inputs)
        else:
            is_bw = id(g.prim) in bw_prims
        if is_bw:
            cot_vals.update(id(o) for o in g.outputs)
        op = b.op(g.prim, [vid_of(x) for x in g.inputs], backward=is_bw)
        for i, o in enumerate(g.outputs):
            ids[id(o)] = b.value(o.shape, o.dtype, "intermediate", False, producer=op.id, index=i)
            op.outputs.append(ids[id(o)])
        if g.prim.kind == COMPILED:
            tape = g.prim.kw["tape"]
            recs = bounds.get(id(g), {})
            kin = []
            for x, v in zip(tape.inputs, g.inputs):
                r = recs.get(x.name)
                if r is None:  # a tape this trace did not fuse (a compiled function's own)
                    prod = _producer_name(v)
                    why = boundary_reason(v.op.prim) if getattr(v, "op", None) is not None else prod
                else:
                    prod, why = r.producer, r.reason
                kin.append(KernelInput(x.name, ids[id(v)], why, prod, _constant_literal(x)))
            layouts = [_layout_of(v, producers, real_of) for v in g.inputs]
            b.kernel(op, tape, g.prim.kw.get("shape", g.outputs[0].shape), layouts, kin)
    outs = [vid_of(v) for v in prog.outputs]
    _name_outputs(b, outs, output_names)
    return Graph(b.values, b.ops, b.kernels, [ids[id(v)] for v in prog.inputs], outs, title, compiled,
                 program=program)


def _producer_name(v: Any) -> str:
    if getattr(v, "op", None) is not None:
        return v.op.prim.name
    return "argument" if getattr(v, "arg", None) is not None else "constant"


def _name_outputs(b: _Builder, outs: list, names: list) -> None:
    for vid, name in zip(outs, names):
        v = b.values[vid]
        v.is_output = True
        if not v.name:
            v.name = name


# -- tapescope.trace -------------------------------------------------------------------


def _flatten(obj: Any, path: str, arrays: list, names: list) -> None:
    if isinstance(obj, array):
        arrays.append(obj)
        names.append(path)
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            _flatten(x, f"{path}[{i}]", arrays, names)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            _flatten(x, f"{path}[{k!r}]", arrays, names)


def _arg_names(fun: Callable, n: int) -> list:
    """Parameter names for the first ``n`` positional arguments (``arg<i>`` where unknown)."""
    names = [f"arg{i}" for i in range(n)]
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return names
    for i, p in enumerate(params[:n]):
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names[i] = p.name
        elif p.kind == p.VAR_POSITIONAL:
            break
    return names


def trace(fun: Callable, *args: Any, compile: bool = True, **kwargs: Any) -> Graph:
    """The Graph ``fun(*args, **kwargs)`` traces into; with ``compile=True`` simplified and
    fused as ``mx.compile`` does (each fused kernel with its tape, variant and boundaries)."""
    from tapescope.core import compile_trace, fusion

    if not callable(fun):
        raise TypeError(f"[trace] Expected a callable, got {type(fun).__name__}.")
    arrays: list = []
    names: list = []
    for name, a in zip(_arg_names(fun, len(args)), args):
        _flatten(a, name, arrays, names)
    for k, a in kwargs.items():
        _flatten(a, k, arrays, names)
    box: dict = {}

    def run(tracers: list) -> tuple:
        it = iter(tracers)
        a = tree_unflatten(args, it)
        k = tree_unflatten(kwargs, it)
        out = fun(*a, **k)
        flat: list = []
        onames: list = []
        _flatten(out, "out", flat, onames)
        box["names"] = onames
        box["backward"] = _backward_marks([x._d for x in flat])
        return flat, None

    prog, _ = compile_trace.trace(run, [(x.shape, x.dtype) for x in arrays])
    if not prog.outputs:
        raise ValueError("[trace] The function must return at least one array.")
    if compile:
        fusion.fuse(compile_trace.simplify(prog))
    title = getattr(fun, "__name__", type(fun).__name__)
    return from_program(prog, names, [x._d for x in arrays], box["names"], title, compiled=compile,
                        backward=box["backward"])


def _backward_marks(descs: list) -> dict:
    """The primitives of the nodes reverse mode recorded above ``descs`` and the cotangent
    seeds it started from (held, so that their ids stay valid while the Graph is built)."""
    from tapescope.core.autodiff.engine import is_backward, is_seed

    seeds: list = []
    nodes = topological(descs, leaf=lambda d: seeds.append(d) if is_seed(d) else None)
    return {"prims": [n.primitive for n in nodes if is_backward(n)], "seeds": seeds}


# -- tapescope.graph_of ----------------------------------------------------------------


def graph_of(*arrays: array) -> Graph:
    """The Graph of the lazy computation above ``arrays`` (evaluated arrays are its leaves)."""
    from tapescope.core.autodiff.engine import is_backward, is_seed

    for a in arrays:
        if not isinstance(a, array):
            raise TypeError(f"[graph_of] Expected arrays, got {type(a).__name__}.")
    b = _Builder()
    ids: dict = {}  # id(desc) or ("dead", id(node), i) -> value id
    keep: list = []
    order = topological([a._d for a in arrays])  # nodes, inputs first
    keep.extend(order)
    counts = {"input": 0, "constant": 0}

    def leaf(d: ArrayDesc) -> int:
        if id(d) not in ids:
            keep.append(d)
            placeholder = d.node is not None
            const = not placeholder and d.data is not None and d.data.ndim == 0
            role = "constant" if const else "input"
            seed = is_seed(d)
            name = "seed" if seed else f"{'c' if const else 'in'}{counts[role]}"
            counts[role] += not seed
            ids[id(d)] = b.value(d.shape, d.dtype, role, not placeholder, name,
                                 data=d.data if not placeholder else None)
            b.values[ids[id(d)]].seed = seed
        return ids[id(d)]

    def vid_of(d: ArrayDesc) -> int:
        if id(d) in ids:
            return ids[id(d)]
        return leaf(d)

    for node in order:
        if node.primitive.kind == PLACEHOLDER:
            continue
        op = b.op(node.primitive, [vid_of(x) for x in node.inputs], backward=is_backward(node))
        alive = [r() for r in node.outputs]
        ref = next((d for d in alive if d is not None), None)
        for i, d in enumerate(alive):
            src = d if d is not None else ref
            key = id(d) if d is not None else ("dead", id(node), i)
            keep.append(d)
            ids[key] = b.value(src.shape if src is not None else (), src.dtype if src is not None
                               else _dtype_f32(), "intermediate", False, producer=op.id, index=i)
            op.outputs.append(ids[key])
        if node.primitive.kind == COMPILED:
            tape = node.primitive.kw["tape"]
            kin = []
            layouts = []
            for x, d in zip(tape.inputs, node.inputs):
                if d.node is not None:
                    prod, why = d.node.primitive.name, boundary_reason(d.node.primitive)
                else:
                    prod = why = CONSTANT if d.data is not None and d.data.ndim == 0 else ARGUMENT
                kin.append(KernelInput(x.name, ids[id(d)], why, prod, _constant_literal(x)))
                layouts.append(d.data if d.data is not None else Layout(d.shape, d.dtype.np))
            b.kernel(op, tape, node.primitive.kw.get("shape", ref.shape), layouts, kin)
    outs = []
    for i, a in enumerate(arrays):
        outs.append(vid_of(a._d))
    _name_outputs(b, outs, [f"out[{i}]" if len(arrays) > 1 else "out" for i in range(len(arrays))])
    inputs = [v.id for v in b.values if v.role == "input"]
    keep.clear()
    return Graph(b.values, b.ops, b.kernels, inputs, outs, "", compiled=bool(b.kernels))


def _dtype_f32() -> Any:
    from tapescope.core import dtypes

    return dtypes.float32
