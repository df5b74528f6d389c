"""Writes the teaching notebooks (source only, no outputs): ``python notebooks/make_notebooks.py``.

The course: ten notebooks, each teaching one idea with short prose, code, pictures and widgets,
and exercises whose answers sit in collapsed cells (``jupyter.source_hidden``, which JupyterLab
honours; tag ``answer``). They are generated so that their text and code stay reviewable as
Python; ``tests/test_notebooks.py`` executes every ``notebooks/*.ipynb`` with nbclient and
``make demo`` executes ``00_tour`` into ``build/tour.html``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

IMPORTS = """import numpy as np
import tapescope
import tapescope.core as mx"""

GPU_NOTE = """No GPU here: mx.cuda.is_available() and mx.metal.is_available() are both False, so the GPU cells below print this note instead of running. (The CUDA runtime is opt-in: TAPESCOPE_CUDA=1 with CuPy on an NVIDIA GPU; Metal: TAPESCOPE_METAL=1 on a Mac.)"""


def md(text: str) -> tuple:
    return ("md", text)


def code(text: str, tags: tuple = ()) -> tuple:
    return ("code", text, {"tags": list(tags)} if tags else {})


def exercise(question: str, answer: str) -> list:
    """A question (markdown) and its answer: a code cell whose source is collapsed."""
    return [("md", "**Exercise.** " + question),
            ("code", "# Answer\n" + answer, {"tags": ["answer"], "jupyter": {"source_hidden": True},
                                            "collapsed": False})]


# -- 00: the tour ----------------------------------------------------------------------------

TOUR = [
    md("""# 0. The tour: tapescope in five minutes

tapescope runs MLX code (`import tapescope.core as mx`) and shows what happens inside: the
**graph** an expression records, the **fused tapes** `mx.compile` makes of it, the **kernels**
generated for each runtime (C, CUDA, Metal), **memory**, the **streams** and their events,
and a **check against JAX**. Each section here is a notebook of its own later in the course.
`make demo` runs this notebook headlessly and writes it as `build/tour.html`."""),
    code(IMPORTS + "\nfrom tapescope import viz\nfrom IPython.display import HTML\n%load_ext tapescope"),
    md("""## 1. Arrays are lazy

Writing an expression records a graph; nothing runs until something needs the values
(notebook 01)."""),
    code("""x = mx.array(np.linspace(-3, 3, 1 << 16, dtype=np.float32))
b = mx.array(2.0)
y = mx.exp(x * 0.5) + b
tapescope.graph_of(y)"""),
    md("""## 2. `mx.compile` fuses elementwise chains into one kernel

GELU is a dozen elementwise primitives. Compiled, they become one `Compiled` node — a
*fused tape* (the cluster in the picture) — and one generated kernel that reads `x` once and
writes the result once (notebook 02)."""),
    code("""def gelu(x):
    return 0.5 * x * (1 + mx.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

gelu_c = mx.compile(gelu)
mx.eval(gelu_c(x))
graph = tapescope.trace(gelu, x)
graph"""),
    md("""## 3. One tape, three kernels

The tape is rendered in three dialects of one C-family renderer: the C that was built and
ran here, and the CUDA and Metal Shading Language a GPU runtime builds (notebook 03)."""),
    code("""HTML(graph.kernels[0].sources_html())"""),
    md("""## 4. Checked against JAX

`tapescope.check` runs the same graph through its own table of JAX rules and compares
every output and, with `every_node=True`, every intermediate (notebook 06)."""),
    code("""report = tapescope.check(gelu_c, x, every_node=True)
report"""),
    md("""## 5. The `%%mlx` cell magic

`%%mlx` runs a cell and shows one panel under it — Summary, Graph, Kernels, Check, Memory,
Cache, Events. Here the cell is compiled, checked, and uses two streams."""),
    code("""%%mlx --compile --check
s = mx.new_stream(mx.cpu)
h = mx.tanh(x * 1.5) * 0.5
z = mx.add(h, 1.0, stream=s) * mx.sigmoid(x)"""),
    md("""## 6. Memory, streams and the kernel cache

The widgets read the timeline, the allocator's statistics and the kernel cache (notebooks
04 and 05). Each is shown after a static snapshot of itself, so this page shows them
even without a running kernel."""),
    code("""s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
with tapescope.record() as rec:
    p = mx.multiply(x, 3.0, stream=s1)   # produced on s1
    q = mx.exp(p, stream=s2)             # consumed on s2: a fence orders them
    mx.eval(q)
viz.EventsWidget(rec.records)"""),
    code("""viz.MemoryWidget(rec.records, live=False)   # the same records: memory over that eval"""),
    code("""viz.CacheWidget()"""),
    md("""## What the tour did"""),
    code("""kernels = [e for e in tapescope.kernel_cache() if e["runtime"] == "cpu"]
print("tour summary")
print(f"  kernels built: {len(kernels)} C kernels on the CPU "
      f"({sum(e['origin'] == 'built' for e in kernels)} compiled now, "
      f"{sum(e['origin'] == 'disk' for e in kernels)} from the disk cache of an earlier run)")
print(f"  fused tapes: {len(graph.kernels)} in gelu's trace "
      f"({len(graph.kernels[0].steps)} steps in one kernel); variants built: "
      f"{', '.join(sorted({e['variant'] for e in kernels}))}")
print(f"  peak memory: {mx.get_peak_memory() / 2**20:.2f} MiB")
print(f"  JAX check of gelu: {report.verdict()}")""",
         tags=("tour-summary",)),
    *exercise("""Compile `lambda x: mx.sin(x) * mx.cos(x) + 1.0` and trace it: how many fused kernels,
and how many primitives are on its tape?""",
              """g = tapescope.trace(lambda x: mx.sin(x) * mx.cos(x) + 1.0, x)
print(len(g.kernels), "fused kernel with", len(g.kernels[0].steps), "tape steps:",
      [step[1] for step in g.kernels[0].steps])"""),
    md("""Next: `01_lazy_evaluation`."""),
]

# -- 01: lazy evaluation -------------------------------------------------------------------

LAZY = [
    md("""# 1. Lazy evaluation: graphs, evaluating, detaching

An op in tapescope (as in MLX) does not compute anything: it **records** a node — a
primitive applied to input arrays. Evaluation runs the nodes in order, and then **detaches**
the result from its graph, so intermediates are freed."""),
    code(IMPORTS),
    md("""## Writing an expression records a graph

The timeline (`tapescope.record()`) shows that no primitive ran while the expression was
written. The picture is the graph `y` stands for."""),
    code("""x = mx.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
b = mx.array([10.0, 20.0, 30.0])
with tapescope.record() as rec:
    y = mx.exp(x * 0.5) + b
print("primitives run while writing y:", sum(r.kind == "primitive" for r in rec.records))
tapescope.graph_of(y)"""),
    md("""The scalar `0.5` became a 0-d array that a `Broadcast` stretches to `x`'s shape, and `b`
(shape `(3,)`) is broadcast to `(2, 3)` before the `Add` — the primitives MLX records."""),
    md("""## Evaluating runs the nodes in order

`mx.eval(y)` orders the graph (inputs before users) and runs each node's rule. The records
say which primitive ran, on which stream, how many bytes it wrote and how long it took."""),
    code("""with tapescope.record() as rec:
    mx.eval(y)
for r in rec.records:
    if r.kind == "primitive":
        print(f"{r.name:10s} stream {r.stream}  {r.nbytes:4d} bytes  {(r.end_ns - r.start_ns) / 1e3:7.1f} us")
print(y)"""),
    md("""## Evaluation detaches

Once evaluated, `y` holds its data and no longer points at its graph, so the intermediate
`exp(x * 0.5)` is freed. Evaluating or reading `y` again runs nothing."""),
    code("""with tapescope.record() as rec:
    mx.eval(y)
    y.tolist()
print("primitives run the second time:", sum(r.kind == "primitive" for r in rec.records))
tapescope.graph_of(y)"""),
    md("""## What triggers an evaluation

`mx.eval` is explicit; reading values (`print`, `.item()`, `.tolist()`, `np.array(a)`) evaluates
implicitly. Only the part of the graph the value needs runs: here `w` is never needed."""),
    code("""a = mx.array(np.arange(6, dtype=np.float32))
v = mx.sqrt(a) * 2.0
w = mx.log(a + 1.0)          # recorded, never needed
with tapescope.record() as rec:
    total = v.sum().item()   # .item() evaluates v's graph only
ran = [r.name for r in rec.records if r.kind == "primitive"]
print("ran:", ran)
print("w still lazy:", "Log" not in ran)"""),
    *exercise("""How many primitives does `mx.sum(a * a + 1.0)` record? Count them with the timeline
when it is evaluated, and draw its graph.""",
              """with tapescope.record() as rec:
    s = mx.sum(a * a + 1.0)
    mx.eval(s)
print([r.name for r in rec.records if r.kind == "primitive"])"""),
    *exercise("""Build `c = a * 2.0`, then `d = c + 1.0` and `e = c - 1.0`, and evaluate only `d`. Is `c`
evaluated afterwards? (Hint: `c` is an input of `d`'s graph; evaluating `d` runs it, and its
data stays with `c` as long as you hold `c`.)""",
              """c = a * 2.0
d, e = c + 1.0, c - 1.0
with tapescope.record() as rec:
    mx.eval(d)
print("ran while evaluating d:", [r.name for r in rec.records if r.kind == "primitive"])
with tapescope.record() as rec:
    mx.eval(e)
print("ran while evaluating e:", [r.name for r in rec.records if r.kind == "primitive"])"""),
]

# -- 02: compile and fusion ----------------------------------------------------------------

COMPILE = [
    md("""# 2. Compile and fusion: fewer passes over memory

Elementwise ops are cheap to compute and expensive to feed: each one reads its inputs from
memory and writes a whole array back. `mx.compile(f)` traces `f`, finds chains of
elementwise work and **fuses** each chain into one *tape*, generated as one kernel: the
intermediates live in registers instead of memory. This notebook measures it, reads the
kernels' names, and shows where fusion stops and why."""),
    code(IMPORTS + """
import time


def measure(label, fn, *args, repeat=5):
    mx.eval(fn(*args))  # warm up: traces, builds and caches the kernels once
    best = float("inf")
    for _ in range(repeat):
        with tapescope.record() as rec:
            t0 = time.perf_counter()
            mx.eval(fn(*args))
            best = min(best, time.perf_counter() - t0)
    prims = [r for r in rec.records if r.kind == "primitive"]
    written = sum(r.nbytes for r in prims)
    print(f"{label:10s} {best * 1e3:7.2f} ms  {len(prims):2d} primitives  {written / 2**20:5.1f} MiB written")
    return written"""),
    md("""## Measured: eager against compiled

A softplus-like chain on a million floats (4 MiB). Eagerly, every op writes 4 MiB; compiled,
one kernel writes the result once."""),
    code("""x = mx.array(np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32))
mx.eval(x)

def soft(x):
    return mx.log1p(mx.exp(-mx.abs(x))) + mx.maximum(x, 0.0) * 0.5 + 1.0

eager = measure("eager", soft, x)
fused = measure("compiled", mx.compile(soft), x)
print(f"the compiled version writes {eager / fused:.0f}x fewer bytes")"""),
    md("""The timings on a shared machine wander; the bytes do not. On a machine whose memory
bandwidth is the limit (most, for elementwise work), time follows bytes."""),
    md("""## The kernel's name says what it computes

MLX names a fused kernel by its tape, and tapescope uses MLX's grammar: one letter per value
(inputs first), then each tape step as `letter kind itemsize Primitive inputs` (`f4`: float32),
then `_` and one letter per input (`C`onstant, `S`calar, `V`: a full array), then the inputs'
dtypes, then a hash of the constants' values. The variant (`_contiguous`, `_strided_<ndim>`,
`_large`) is appended when it is built."""),
    code("""def small(x, y):
    return mx.exp(x) * y

xs = mx.array(np.ones(8, np.float32))
g = tapescope.trace(small, xs, xs)
k = g.kernels[0]
print(k.name)
for letter, prim, dtype, inputs in k.steps:
    print(f"  {letter} = {prim}({', '.join(inputs)})  {dtype}")
mx.eval(mx.compile(small)(xs, xs))
print("built:", [e["name"][len(k.name):] for e in k.cached()])"""),
    md("""## Where fusion stops

A reduction (`Sum`, `Max`, ...) needs every element of its rows before its users can start,
so MLX's fusion ends a tape there; so does a value that is needed outside the tape. The
picture labels each kernel input with the reason, and `Graph.boundaries` lists them."""),
    code("""def normalised(x):
    y = mx.exp(-x * x)
    return (y - y.mean(axis=-1, keepdims=True)) * 2.0

rows = x.reshape(1024, 1024)
g = tapescope.trace(normalised, rows)
for kernel, letter, producer, reason in g.boundaries:
    print(f"kernel {kernel}: input {letter} from {producer:9s} — {reason}")
g"""),
    md("""tapescope has one fusion beyond MLX's, off by default: `tapescope.set_fusion("extended")`
fuses a reduction over rows with its elementwise neighbours (its kernel names carry an `_R`
section, so they never meet MLX's). The same function then needs one kernel less:"""),
    code("""tapescope.set_fusion("extended")
g_ext = tapescope.trace(normalised, rows)
tapescope.set_fusion("mlx")
print("mlx fusion:     ", len(g.ops), "ops,", len(g.kernels), "kernels")
print("extended fusion:", len(g_ext.ops), "ops,", len(g_ext.kernels), "kernels")
g_ext"""),
    *exercise("""Measure `lambda x: mx.sin(x) * 2.0 + mx.cos(x)` eager and compiled with `measure`. How
many bytes does each write, and why that ratio?""",
              """f = lambda x: mx.sin(x) * 2.0 + mx.cos(x)
e, c = measure("eager", f, x), measure("compiled", mx.compile(f), x)
print(e // c, "x: eager writes sin, the broadcast 2.0, the product, cos and the sum; compiled writes the sum")"""),
    *exercise("""Trace a softmax written out, `e = mx.exp(x - x.max(axis=-1, keepdims=True)); e / e.sum(axis=-1,
keepdims=True)`, for x of shape (4, 256). Where does fusion stop, and why?""",
              """def softmax(x):
    e = mx.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

x2 = mx.array(np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32))
g2 = tapescope.trace(softmax, x2)
print(g2.summary())
for b in g2.boundaries:
    print(b)"""),
]

# -- 03: one tape, three kernels -----------------------------------------------------------

DIALECTS = [
    md("""# 3. One tape, three kernels: C, CUDA and Metal

A fused tape is a list of steps. tapescope writes the kernel's *structure* once (arguments,
index arithmetic, loads, the steps, stores, half-precision rounding) and renders it in three
**dialects** — C for the CPU, CUDA, and Metal Shading Language — which differ only in tables
(types, qualifiers, math names, thread index); the loops are a separate **schedule**
(OpenMP on the CPU, threads per element on a GPU). This notebook shows one tape's three
kernels and which of them ran where."""),
    code(IMPORTS + """
from IPython.display import HTML


def swish_scaled(x, y):
    return x * mx.sigmoid(x) * 1.5 + y

mx.set_default_device(mx.cpu)  # the C kernel on the CPU; a GPU, if any, in its own cell below
x = mx.array(np.linspace(-4, 4, 4096, dtype=np.float32))
y = mx.array(np.full(4096, 0.25, np.float32))
g = tapescope.trace(swish_scaled, x, y)
kernel = g.kernels[0]
print(kernel.symbol)
print([step[1] for step in kernel.steps])"""),
    md("""## The three sources side by side

Each column starts at the kernel itself; the includes and helpers above it are under
"show all". Look for the same steps in each: the loads, one line per tape step, the store."""),
    code("""HTML(kernel.sources_html())"""),
    md("""## Which ran where

On this machine the C kernel is built by the system C compiler and runs on the CPU. The
Metal source can run here too, through tapescope's **Metal shim** (a test tool: the MSL is
compiled as C++ by `g++` against a header that maps Metal onto C++, and run over its launch
grid on the CPU — it says the MSL is right, not how fast a GPU runs it). CUDA runs only with
an NVIDIA GPU and the opt-in CUDA runtime."""),
    code("""from tapescope.kernels.metal import shim

expected = np.array(swish_scaled(x, y))
compiled = mx.compile(swish_scaled)
c_out = np.array(compiled(x, y))
ran = {"C": f"CPU, {kernel.tier or 'not run'}: " + ", ".join(e['variant'] for e in kernel.cached()),
       "CUDA": "on the GPU: the next cell" if mx.cuda.is_available() else "not run: no CUDA GPU here"}
print(f"C    max |error| vs the eager ops: {np.abs(c_out - expected).max():.3g}")
if shim.compiler():
    lib = shim.TapeLibrary([kernel.tape], [(True, 1, False)])
    args = iter([np.array(x), np.array(y)])  # the tape's inputs: arguments in order, constants inlined
    inputs = [None if t.is_constant else next(args) for t in kernel.tape.inputs]
    (msl_out,), variant = lib.run(0, inputs, (4096,))
    print(f"MSL  max |error| vs the eager ops: {np.abs(msl_out - expected).max():.3g}")
    ran["Metal"] = f"CPU through the Metal shim (g++), variant {variant}"
else:
    ran["Metal"] = "not run: no C++ compiler for the Metal shim"
for dialect, where in ran.items():
    print(f"{dialect:6s} {where}")"""),
    md("""The CUDA runtime (`TAPESCOPE_CUDA=1`, CuPy on an NVIDIA GPU) builds the CUDA column with
NVRTC; the cell below runs the same tape there when a GPU is present."""),
    code("""if mx.cuda.is_available():
    with mx.stream(mx.gpu):
        out = compiled(x, y)
        mx.eval(out)
    print("CUDA max |error| vs the eager ops:", np.abs(np.array(out) - expected).max())
    print("built for the GPU:", [(e["runtime"], e["variant"]) for e in kernel.cached() if e["runtime"] != "cpu"])
else:
    print(NOTE)""".replace("NOTE", repr(GPU_NOTE))),
    *exercise("""Trace `lambda a: (a * 2.0).astype(mx.float16)` and find, in the three sources, how each
dialect writes a float16 value (its type name, and how the conversion is spelled).""",
              """a = mx.array(np.linspace(0, 1, 64, dtype=np.float32))
k16 = tapescope.trace(lambda a: (a * 2.0).astype(mx.float16), a).kernels[0]
for runtime, src in k16.sources.items():
    print(f"{runtime:6s}", [l.strip() for l in src.splitlines() if "out0[" in l][:2])"""),
    *exercise("""The variant depends on the inputs' layout. Trace `swish_scaled` with `x` transposed from a
(64, 64) array: which variant is predicted, and what changes in the C source?""",
              """xt = mx.array(np.linspace(-4, 4, 4096, dtype=np.float32).reshape(64, 64)).T
mx.eval(xt)  # a transposed view: its strides are (1, 64)
kt = tapescope.trace(swish_scaled, xt, y.reshape(64, 64)).kernels[0]
print(kt.variant)
for line in kt.sources["cpu"].splitlines():
    if "strides" in line:
        print(line.strip())"""),
]

# -- 04: memory and the buffer cache -------------------------------------------------------

MEMORY = [
    md("""# 4. Memory and the buffer cache

Every array's storage comes from an **allocator** that counts it to the byte: active memory
(in use), peak memory, and a **buffer cache** of freed buffers kept for reuse, as MLX's
`BufferCache` does. This notebook watches a buffer go back to the cache and out again, shows
**donation** (a chain running in place) and measures what fusion saves in peak memory."""),
    code(IMPORTS + "\nfrom tapescope import viz"),
    md("""## Freed buffers go to the cache, and come back

When an array is deleted its buffer goes to the cache; the next allocation of a similar size
reuses it (`cache_reuse` on the timeline) instead of asking the system for new memory."""),
    code("""mx.clear_cache()
base = mx.get_active_memory()
a = mx.array(np.ones(1 << 16, dtype=np.float32))
c = a * 2.0
mx.eval(c)
print("active after c:", mx.get_active_memory() - base, "bytes")
del c
print("active after del c:", mx.get_active_memory() - base, "bytes; cache:", mx.get_cache_memory(), "bytes")
with tapescope.record() as rec:
    d = a * 3.0
    mx.eval(d)
print("allocations:", [(r.kind, r.nbytes) for r in rec.records if r.kind in ("alloc", "cache_reuse")])"""),
    md("""## Donation: a chain that runs in place

An input that nobody else holds **donates** its buffer to the op's output (MLX's rule), so
`x = f(x)` in a loop needs no new memory."""),
    code("""x = mx.array(np.linspace(0, 1, 1 << 16, dtype=np.float32))
mx.eval(x)
before = mx.get_active_memory()
for _ in range(100):
    x = mx.exp(-x)
    mx.eval(x)
print("active memory grew by", mx.get_active_memory() - before, "bytes over 100 steps")"""),
    md("""## Fusion saves memory too

Eagerly, intermediates must exist at the same time; a fused kernel keeps them in registers.
Peak memory above the input, for a four-op chain on 4 MiB:"""),
    code("""x = mx.array(np.ones(1 << 20, np.float32))
mx.eval(x)
f = lambda x: mx.exp(x) * 2.0 + mx.sin(x) - 1.0
for name, fn in (("eager", f), ("compiled", mx.compile(f))):
    mx.eval(fn(x))                     # warm up (builds the kernel)
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    out = fn(x)
    mx.eval(out)
    print(f"{name:9s} peak above the input: {(mx.get_peak_memory() - base) / 2**20:.1f} MiB")
    del out"""),
    md("""## The memory widget

`viz.MemoryWidget()` shows active / peak / cache memory over time, the limits, and buttons for
`clear_cache` and `reset_peak_memory` (live while open; `live=False` draws it once)."""),
    code("""viz.MemoryWidget(live=False)"""),
    md("""## Limits

`mx.set_cache_limit(n)` caps the cache (0: freed buffers go straight back to the system);
`mx.set_memory_limit` caps everything. Both return the previous value, as in MLX."""),
    code("""old = mx.set_cache_limit(0)
e = mx.array(np.ones(1 << 16, np.float32)) * 2.0
mx.eval(e)
del e
print("cache with limit 0:", mx.get_cache_memory(), "bytes")
mx.set_cache_limit(old)"""),
    *exercise("""Evaluate `a + 1.0` twice, deleting the result in between, inside `tapescope.record()`.
Which allocation came from the cache?""",
              """for i in range(2):
    with tapescope.record() as rec:
        t = a + 1.0
        mx.eval(t)
    print(i, [(r.kind, r.nbytes) for r in rec.records if r.kind in ("alloc", "cache_reuse")])
    del t"""),
    *exercise("""Why does the donation loop above stop running in place if you keep the previous value
(`prev = x; x = mx.exp(-x)`)? Measure the growth.""",
              """x = mx.array(np.linspace(0, 1, 1 << 16, dtype=np.float32))
mx.eval(x)
before = mx.get_active_memory()
history = []
for _ in range(10):
    history.append(x)   # somebody else holds x: it cannot donate its buffer
    x = mx.exp(-x)
    mx.eval(x)
print("grew by", mx.get_active_memory() - before, "bytes: one new buffer per step")"""),
]

# -- 05: streams, events and fences --------------------------------------------------------

STREAMS = [
    md("""# 5. Streams, events and fences

A **stream** is an ordered queue of work on a device; each of tapescope's CPU streams has its
own worker thread, as MLX's do. Work on different streams runs concurrently; when a value
made on one stream is used on another, the consumer must wait: inside one `mx.eval` MLX
orders them with a **fence**, and each stream **signals an event** when its part is done,
which the host waits on. This notebook draws those waits."""),
    code(IMPORTS + "\nfrom tapescope import viz"),
    md("""## Two streams, one eval

`p` is made on `s1` and used on `s2`. The records show the fence: `s1` updates it after its
work, `s2` waits on it before its `Add`."""),
    code("""s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
a = mx.array(np.arange(8, dtype=np.float32))
with tapescope.record() as rec:
    p = mx.multiply(a, 3.0, stream=s1)   # produced on s1
    q = mx.add(p, 1.0, stream=s2)        # consumed on s2
    mx.eval(q)
for r in rec.records:
    if r.kind in ("primitive", "fence_update", "fence_wait", "event_signal", "event_wait"):
        print(f"{r.kind:13s} stream {r.stream}  {r.name or ''}")
print(q)"""),
    md("""## The events widget

One lane per stream and one for the host; arrows go from each signal or fence update to the
wait it releases. (Zoom with the mouse in a live notebook.)"""),
    code("""viz.EventsWidget(rec.records)"""),
    md("""## `async_eval` returns at once

`mx.async_eval` schedules the work and returns; the host blocks only when it reads the value
(or calls `mx.synchronize`)."""),
    code("""import time

big = mx.array(np.ones(1 << 20, np.float32))
work = big
for _ in range(20):
    work = mx.sin(work) + 1.0
t0 = time.perf_counter()
mx.async_eval(work)
returned = time.perf_counter() - t0
mx.synchronize()
done = time.perf_counter() - t0
print(f"async_eval returned after {returned * 1e3:.1f} ms; the work finished after {done * 1e3:.1f} ms")
print("returned before the work was done:", returned < done)"""),
    md("""## Streams run concurrently

Two independent chains on two streams overlap in time: their records' intervals interleave.
(On a loaded machine the overlap may be small, but the two lanes never wait for each other.)"""),
    code("""with tapescope.record() as rec:
    u = mx.array(np.ones(1 << 18, np.float32))
    v = mx.array(np.ones(1 << 18, np.float32))
    for _ in range(10):
        u = mx.sin(u, stream=s1)
        v = mx.cos(v, stream=s2)
    mx.eval(u, v)
t0 = rec.records[0].start_ns
lanes = {}
for r in rec.records:
    if r.kind == "primitive":
        lanes.setdefault(r.stream, []).append((r.start_ns - t0, r.end_ns - t0))
for stream, spans in sorted(lanes.items()):
    print(f"stream {stream}: {len(spans)} primitives, busy from {spans[0][0] / 1e6:.2f} to {spans[-1][1] / 1e6:.2f} ms")
viz.EventsWidget(rec.records)"""),
    *exercise("""Make `p` on `s1` with `mx.async_eval(p)`, then use it on `s2` in a separate `mx.eval`.
Which record orders them now: a fence or an event?""",
              """with tapescope.record() as rec:
    p = mx.multiply(a, 3.0, stream=s1)
    mx.async_eval(p)
    q = mx.add(p, 1.0, stream=s2)
    mx.eval(q)
print([(r.kind, r.stream) for r in rec.records if "event" in r.kind or "fence" in r.kind])"""),
]

# -- 06: checking against JAX --------------------------------------------------------------

CHECK = [
    md("""# 6. Checking against JAX, and finding a diverging node

`tapescope.check(f, *args)` evaluates `f` in tapescope and again in JAX — from the same
graph, through its own table of JAX rules (one per primitive, written independently of
tapescope's) — and compares every output with dtype-aware tolerances. With `every_node=True`
it compares every intermediate too, each computed by JAX *from tapescope's own inputs to that
node*, so a wrong primitive is named even when its error is washed out downstream."""),
    code(IMPORTS + """

def f(a):
    return mx.sum(mx.exp(a * 2.0) - 1.0, axis=1)

a = mx.array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
report = tapescope.check(f, a, every_node=True)
report"""),
    md("""`ulp` is the largest distance in units of the last place: libm's `exp` and XLA's differ by
an ulp or two here and there, which is why float tolerances are not zero."""),
    md("""## Planting a bug

To see what a failure looks like, replace the rule of one primitive — `Exp` — with a wrong one
for a moment (this is how tapescope's own tests plant faults). The rule lives in the
primitive's one definition in `tapescope.kernels`. (On a GPU an eager elementwise op runs as
a generated one-op kernel, not through its rule: `tapescope.settings(eager_kernels=False)`
sends those ops to their rules for the block; on the CPU it changes nothing.)"""),
    code("""from tapescope.kernels import primitives

defn = primitives.lookup("Exp")
saved = defn.rule, defn.takes_out
defn.rule, defn.takes_out = (lambda xp, x: xp.exp(x) + np.float32(0.25)), False
try:
    with tapescope.settings(eager_kernels=False):
        bad = tapescope.check(f, a, every_node=True)
finally:
    defn.rule, defn.takes_out = saved
print(bad.status, "— first divergence:", bad.first_divergence.label)
bad"""),
    md("""The output is off by 1.0 (four elements of 0.25 each summed), and the report names the node
where it started: `Exp`, whose own inputs (the `Multiply` before it) still agree. Its
consumers are marked as passing, because from the values they were given they computed
correctly."""),
    code("""print(tapescope.check(f, a, every_node=True).status, "after restoring the rule")"""),
    md("""## Compiled functions and gradients are checked too

A compiled function is compared with JAX on the uncompiled graph; a gradient's reference is
`jax.vjp` of the JAX forward graph."""),
    code("""print(tapescope.check(mx.compile(f), a).status)
print(tapescope.check(mx.grad(lambda a: mx.sum(mx.tanh(a) ** 2)), a).status)"""),
    *exercise("""Check `lambda a: (a * 3.0).astype(mx.float16)` — what tolerance does the check pick for
float16, and how far apart are the results in ulps?""",
              """r16 = tapescope.check(lambda a: (a * 3.0).astype(mx.float16), a)
out = r16.outputs[0]
print(r16.status, "rtol", out.rtol, "atol", out.atol, "ulp", out.ulp)"""),
    *exercise("""Plant a bug in `Add` for integers only (add 1 where `x == 7`) and find it in
`lambda i: (i + 1) * 2` over `mx.arange(10)`.""",
              """add = primitives.lookup("Add")
saved = add.rule, add.takes_out
add.rule, add.takes_out = (lambda xp, x, y: x + y + (x == 7)), False
try:
    with tapescope.settings(eager_kernels=False):
        r = tapescope.check(lambda i: (i + 1) * 2, mx.arange(10), every_node=True)
finally:
    add.rule, add.takes_out = saved
print(r.status, r.first_divergence.label, r.first_divergence.reason)"""),
]

# -- 07: interrupting an eval --------------------------------------------------------------

INTERRUPT = [
    md("""# 7. Interrupting an eval

A long `mx.eval` can be stopped: Jupyter's stop button sends SIGINT, and while an eval runs
tapescope answers it by asking every stream to stop **at the next node boundary** (MLX's
interruptible eval). The eval raises `KeyboardInterrupt`; arrays evaluated so far keep their
data, the rest stay lazy, and a later eval **resumes** from there instead of starting over.
`tapescope.interrupt_eval()` is the same request from code. Here it is made from inside the
eval, at a known moment: for one cell the rule of `Sin` (its one definition in
`tapescope.kernels`, as in notebook 6) is wrapped so that the 100th `Sin` to run asks for the
interrupt, as if the stop button were pressed right then. A timer thread would race the eval:
on a fast machine it would finish first. (On a GPU the eager `Sin` is a generated one-op
kernel, not its rule: the helper sends the ops to their rules while it is entered,
`tapescope.settings(eager_kernels=False)`; the interrupt itself works either way.)"""),
    code("""import itertools
from contextlib import contextmanager

""" + IMPORTS + """
from tapescope.kernels import primitives

x = mx.array(np.ones(1 << 18, np.float32))
steps = []
y = x
for _ in range(300):
    y = mx.sin(y) + 1.0
    steps.append(y)
total = len(tapescope.graph_of(y).ops)
print("a chain of", total, "primitives, recorded and not run")


@contextmanager
def stop_button_at(name, k):
    \"\"\"While entered, the k-th run of primitive `name` calls interrupt_eval() (its answer
    is appended to the list this yields): the stop button pressed while that node runs.\"\"\"
    defn = primitives.lookup(name)
    saved, calls, answers = defn.rule, itertools.count(1), []

    def rule(*args, **kw):
        out = saved(*args, **kw)
        if next(calls) == k:  # next() of a count is atomic: streams may run it at once
            answers.append(tapescope.interrupt_eval())
        return out

    defn.rule = rule
    try:
        with tapescope.settings(eager_kernels=False):
            yield answers
    finally:
        defn.rule = saved"""),
    code("""try:
    with stop_button_at("Sin", 100) as answers:
        mx.eval(y)
except KeyboardInterrupt as e:
    print("KeyboardInterrupt:", e)
print("interrupt_eval() ->", answers)"""),
    md("""## What was kept

Evaluated steps are detached and hold data; the rest are still nodes of the graph."""),
    code("""done = sum(s._d.node is None for s in steps)
print(f"{done} of {len(steps)} steps evaluated before the interrupt")
print("the result is still lazy:", y._d.node is not None)"""),
    md("""## Resuming

Evaluating again runs only what is left; the timeline counts the primitives that ran."""),
    code("""with tapescope.record() as rec:
    mx.eval(y)
ran = sum(r.kind == "primitive" for r in rec.records)
print(f"resumed: {ran} primitives ran (of {total} for the whole chain)")
print("y[0] =", y[0].item())"""),
    md("""The last line compares with numpy running the same chain:"""),
    code("""ref = np.ones(4, np.float32)
for _ in range(300):
    ref = np.sin(ref) + np.float32(1.0)
print("numpy:", ref[0], " tapescope:", y[0].item())"""),
    *exercise("""Interrupt a chain that runs on two streams (alternate `stream=s1` and `stream=s2`), then
resume it. Does the result still match numpy?""",
              """s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
z = x
for i in range(200):
    z = mx.cos(z, stream=s1 if i % 2 else s2)
try:
    with stop_button_at("Cos", 60):
        mx.eval(z)
except KeyboardInterrupt:
    print("interrupted")
mx.eval(z)
ref = np.ones(4, np.float32)
for _ in range(200):
    ref = np.cos(ref)
print(z[0].item(), ref[0])"""),
]

# -- 08: gradients as graphs ---------------------------------------------------------------

GRADS = [
    md("""# 8. Gradients as graphs

`mx.grad(f)` is a function that returns the gradient of `f`. It works by recording `f`'s
forward graph and then the **backward graph** — each primitive's vector-Jacobian product,
applied from the output back to the inputs. Both are ordinary graphs of primitives, so they
can be drawn, compiled, fused and checked like any other."""),
    code(IMPORTS + """

def f(w):
    return mx.sum(mx.tanh(w * 2.0) ** 2)

w = mx.array([0.1, 0.5, -0.3], mx.float32)
print("f(w) =", f(w).item())
print("grad:", mx.grad(f)(w))
t = np.tanh(2 * np.array(w))
print("by hand:", 2 * t * (1 - t ** 2) * 2)"""),
    md("""## The forward and the backward graph

`tapescope.trace(..., compile=False)` draws the graph without fusing it. Backward ops are drawn
with magenta borders, starting from the `seed` (the cotangent 1.0 of the output); the forward
ops are grey. Read it from the seed: `Sum`'s VJP broadcasts, `Power`'s multiplies by `2 t`,
`Tanh`'s by `1 - t²`, `Multiply`'s by 2."""),
    code("""g = tapescope.trace(mx.grad(f), w, compile=False)
print(f"{len(g.ops)} ops, {sum(op.backward for op in g.ops)} of them backward")
g"""),
    md("""## Compiled, the backward pass fuses like any other graph

Elementwise forward and backward steps end up in one tape."""),
    code("""gc = tapescope.trace(mx.grad(f), w)
print(gc.summary())
gc"""),
    md("""## A small model, trained

A two-layer network learning a sine, trained by `mx.value_and_grad` over a dict of parameters
and plain gradient descent — everything here is `tapescope.core`. (`10_extra_mlx_nn` trains
MLX's own `mlx.nn` layers on tapescope.)"""),
    code("""mx.random.seed(0)
params = {"w1": mx.random.normal((1, 32)) * 0.5, "b1": mx.zeros((32,)),
          "w2": mx.random.normal((32, 1)) * 0.2, "b2": mx.zeros((1,))}
xs = mx.array(np.linspace(-3, 3, 128, dtype=np.float32).reshape(-1, 1))
ys = mx.sin(xs)

def model(p, x):
    return mx.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]

def loss(p):
    return mx.mean((model(p, xs) - ys) ** 2)

step = mx.compile(mx.value_and_grad(loss))
for i in range(301):
    l, grads = step(params)
    params = {k: params[k] - 0.1 * grads[k] for k in params}
    mx.eval(params)
    if i % 100 == 0:
        print(f"step {i:3d}  loss {l.item():.4f}")"""),
    md("""The gradient of the loss is checked against `jax.vjp` of the JAX forward graph:"""),
    code("""tapescope.check(mx.grad(loss), params)"""),
    *exercise("""Draw the backward graph of `lambda w: mx.sum(mx.exp(w) * w)`. Which forward value does
the backward pass reuse?""",
              """gb = tapescope.trace(mx.grad(lambda w: mx.sum(mx.exp(w) * w)), w, compile=False)
print(gb.summary())
gb"""),
    *exercise("""`mx.value_and_grad` returns the value too. Compare `tapescope.trace` of `mx.grad(f)` and of
`mx.value_and_grad(f)`: what is added?""",
              """a1 = tapescope.trace(mx.grad(f), w, compile=False)
a2 = tapescope.trace(mx.value_and_grad(f), w, compile=False)
print(len(a1.ops), "ops and", len(a1.outputs), "output;", len(a2.ops), "ops and", len(a2.outputs), "outputs")"""),
]

# -- 09: why is it fast or slow ------------------------------------------------------------

SPEED = [
    md("""# 9. Why is it fast or slow? Eager, fused and split

The same computation three ways: **eager**, op by op; **fused**, compiled into one kernel; and
**split**, compiled but with a reduction in the middle that ends the tape. The timeline says
what ran, how many bytes each way wrote, and how long it took — on the CPU, and on the GPU
when there is one."""),
    code(IMPORTS + """
import time

mx.set_default_device(mx.cpu)  # the CPU first; the GPU has its own section below
x = mx.array(np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32))
mx.eval(x)


def summary(label, fn, *args, repeat=5):
    mx.eval(fn(*args))  # warm up: traces, builds and caches the kernels once
    best = float("inf")
    for _ in range(repeat):
        with tapescope.record() as rec:
            t0 = time.perf_counter()
            mx.eval(fn(*args))
            best = min(best, time.perf_counter() - t0)
    prims = [r for r in rec.records if r.kind == "primitive"]
    written = sum(r.nbytes for r in prims)
    print(f"{label:8s} {best * 1e3:7.2f} ms  {len(prims):2d} primitives  {written / 2**20:5.1f} MiB written")
    return rec


def softplus_scaled(x):
    return mx.log1p(mx.exp(-mx.abs(x))) + mx.maximum(x, 0.0) * 0.5 + 1.0


def split(x):
    y = softplus_scaled(x)
    return (y - y.mean(axis=-1, keepdims=True)) * 2.0


rows = x.reshape(1024, 1024)
mx.eval(rows)"""),
    md("""## On the CPU"""),
    code("""eager = summary("eager", softplus_scaled, x)
fused = summary("fused", mx.compile(softplus_scaled), x)
halves = summary("split", mx.compile(split), rows)"""),
    md("""Eager writes a whole array per op. Fused writes the result once. Split needs two kernels
and a reduction between them; the picture names the boundary:"""),
    code("""tapescope.trace(split, rows)"""),
    md("""## Where the time went

Every primitive record has a start and an end. Sorting the eager run by time spent shows which
steps matter; the transcendental ones (`Exp`, `Log1p`) cost more than the cheap ones, but
every one of them pays the memory traffic."""),
    code("""prims = sorted((r for r in eager.records if r.kind == "primitive"),
               key=lambda r: r.end_ns - r.start_ns, reverse=True)
for r in prims[:5]:
    print(f"{r.name:10s} {(r.end_ns - r.start_ns) / 1e3:9.1f} us  {r.nbytes / 2**20:5.1f} MiB")"""),
    md("""## Joining the split: extended fusion

`tapescope.set_fusion("extended")` (tapescope's extension, not MLX's) fuses the reduction
with its elementwise neighbours, so the split version runs as one kernel:"""),
    code("""tapescope.set_fusion("extended")
extended = summary("extended", mx.compile(split), rows)
tapescope.set_fusion("mlx")"""),
    md("""## On the GPU

The same three on the GPU, when there is one (CUDA through CuPy, opt-in with
`TAPESCOPE_CUDA=1`; Metal on a Mac with `TAPESCOPE_METAL=1`). The GPU's memory bandwidth is
far higher, and launching a kernel costs more, so eager loses by more."""),
    code("""gpu = mx.cuda.is_available() or mx.metal.is_available()
if gpu:
    with mx.stream(mx.gpu):
        xg = mx.array(np.array(x))
        mx.eval(xg)
        summary("eager", softplus_scaled, xg)
        summary("fused", mx.compile(softplus_scaled), xg)
        summary("split", mx.compile(split), xg.reshape(1024, 1024))
else:
    print(NOTE)""".replace("NOTE", repr(GPU_NOTE))),
    *exercise("""Write `lambda x: mx.exp(x).sum() + x` and predict, before running `summary`, how many
primitives the compiled version runs (hint: the reduction's output is a scalar broadcast
back).""",
              """r = summary("compiled", mx.compile(lambda x: mx.exp(x).sum() + x), x)
print([r2.name for r2 in r.records if r2.kind == "primitive"])"""),
    *exercise("""Is eager always slower? Try a tiny array (16 elements): compare `summary` of eager and
fused. What dominates then?""",
              """tiny = mx.array(np.ones(16, np.float32))
summary("eager", softplus_scaled, tiny)
summary("fused", mx.compile(softplus_scaled), tiny)
print("at 16 elements the per-op overhead (scheduling, dispatch) dominates, not memory traffic")"""),
]

# -- 10 (extra): MLX's own mlx.nn on tapescope -------------------------------------------

MLX_NN = [
    ("md", """# 10. Extra: MLX's own `mlx.nn` on tapescope: a model, its backward graph and its fused tapes

`tapescope.as_mlx()` routes `mlx.core` to `tapescope.core` for the rest of the process, so
the *real* `mlx.nn`, `mlx.optimizers` and `mlx.utils` (from the installed MLX package) build
their layers, losses and optimizer states out of tapescope arrays. Nothing in the model code
changes; you see what MLX would run. (`%mlx as-mlx` is the magic form; `as_mlx(False)`
switches back.)"""),
    ("code", """import time
import tapescope
tapescope.as_mlx()
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
print(mx.__name__, type(mx.ones(1)))"""),
    ("md", """## An MNIST-sized MLP, trained with `mlx.optimizers`

784 inputs, one hidden layer of 128 ReLUs, 10 classes; the labels come from a fixed random
linear map, so there is something to learn. `nn.value_and_grad(model, loss_fn)` is MLX's
reverse mode over the model's parameters."""),
    ("code", """mx.random.seed(0)
model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
mx.eval(model.parameters())
teacher = mx.random.normal((784, 10))

def batch(n=64):
    x = mx.random.normal((n, 784))
    return x, mx.argmax(x @ teacher, axis=1)

def loss_fn(model, x, y):
    return nn.losses.cross_entropy(model(x), y, reduction="mean")

loss_and_grad = nn.value_and_grad(model, loss_fn)
opt = optim.Adam(learning_rate=1e-3)
t0 = time.perf_counter()
for step in range(30):
    x, y = batch()
    loss, grads = loss_and_grad(model, x, y)
    opt.update(model, grads)
    mx.eval(model.parameters(), opt.state, loss)
    if step % 10 == 0:
        print(f"step {step:2d}  loss {loss.item():.4f}")
eager_ms = (time.perf_counter() - t0) / 30 * 1e3
print(f"eager step: {eager_ms:.1f} ms")"""),
    ("md", """## The forward and the backward graph of one step

`tapescope.trace` records the step as `mx.compile` would. Backward ops (the VJP rules'
ops and the cotangent sums) are drawn with magenta borders and edges, starting at the
`seed`; the forward ops are grey. Read it from the loss back: the cross-entropy's
gradient, then the second layer's weight gradient (a Matmul with the hidden activations
transposed), the ReLU mask, and the first layer's."""),
    ("code", """x, y = batch()
g = tapescope.trace(lambda x, y: loss_and_grad(model, x, y), x, y)
print(f"{len(g.ops)} ops, {sum(op.backward for op in g.ops)} of them backward, "
      f"{len(g.kernels)} fused kernels")
g"""),
    ("md", """## A transformer block and its fused elementwise tapes

`nn.TransformerEncoderLayer` is attention (matmuls, a softmax) and an MLP with layer norms.
Between the matmuls and reductions, chains of elementwise ops fuse into tapes; each box is
one generated kernel (click a kernel in the `%%mlx` report to see its C, CUDA and Metal)."""),
    ("code", """block = nn.TransformerEncoderLayer(dims=32, num_heads=4, mlp_dims=64)
block.eval()
h = mx.random.normal((2, 8, 32))
g2 = tapescope.trace(lambda h: block(h, None), h)
print(f"{len(g2.ops)} ops, {len(g2.kernels)} fused kernels")
for k in g2.kernels:
    print(" ", k.variant, [step[1] for step in k.steps])
g2"""),
    ("md", """## The whole step compiled

MLX's usual pattern: compile the step with the model's and the optimizer's state as
captured inputs and outputs. The first call traces; later calls replay the fused program.
Compare the two times: what compiling removes is the per-op work between the kernels (and
the elementwise chains, fused); where a step's time is in its matmuls, as here on a CPU,
the two are close — `09_why_is_it_fast_or_slow` shows how to find out which case you are in."""),
    ("code", """state = [model.state, opt.state]

def step(x, y):
    loss, grads = loss_and_grad(model, x, y)
    opt.update(model, grads)
    return loss

cstep = mx.compile(step, inputs=state, outputs=state)
x, y = batch()
mx.eval(cstep(x, y), state)  # trace and build the kernels
t0 = time.perf_counter()
for _ in range(30):
    x, y = batch()
    loss = cstep(x, y)
    mx.eval(loss, state)
compiled_ms = (time.perf_counter() - t0) / 30 * 1e3
print(f"compiled step: {compiled_ms:.1f} ms (eager {eager_ms:.1f} ms), loss {loss.item():.4f}")"""),
]


NOTEBOOKS = {
    "00_tour": TOUR,
    "01_lazy_evaluation": LAZY,
    "02_compile_and_fusion": COMPILE,
    "03_one_tape_three_kernels": DIALECTS,
    "04_memory_and_the_buffer_cache": MEMORY,
    "05_streams_events_and_fences": STREAMS,
    "06_checking_against_jax": CHECK,
    "07_interrupting_an_eval": INTERRUPT,
    "08_gradients_as_graphs": GRADS,
    "09_why_is_it_fast_or_slow": SPEED,
    "10_extra_mlx_nn": MLX_NN,
}


def cell(spec: tuple):
    """A markdown or code cell from ``("md", text)`` or ``("code", text[, metadata])``."""
    if spec[0] == "md":
        return new_markdown_cell(spec[1])
    c = new_code_cell(spec[1])
    if len(spec) > 2 and spec[2]:
        c.metadata.update(spec[2])
    return c


def write(cells: list, path: Path) -> None:
    nb = new_notebook(cells=[cell(spec) for spec in cells])
    for i, c in enumerate(nb.cells):  # stable ids: regenerating changes only what changed
        c.id = f"{path.stem[:2]}-{i:02d}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, str(path))


if __name__ == "__main__":
    for stem, cells in NOTEBOOKS.items():
        write(cells, HERE / f"{stem}.ipynb")
