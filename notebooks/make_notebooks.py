"""Writes the teaching notebooks (source only, no outputs): ``python notebooks/make_notebooks.py``.

The notebooks are generated so that their text and code stay reviewable as Python; the tests
execute every ``notebooks/*.ipynb`` with nbclient.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

LAZY = [
    ("md", """# 1. Lazy arrays: graphs, evaluation, memory and streams

tapescope runs MLX code (`import tapescope.core as mx`) and shows what happens inside.
This notebook follows one expression from the moment it is written to the moment its
memory is reused: **recording** a graph, **evaluating** it, **detaching** it, the
**allocator** and its buffer cache, and **streams** that run work concurrently."""),
    ("code", """import numpy as np
import tapescope
import tapescope.core as mx"""),
    ("md", """## Writing an expression records a graph

An op does not compute anything: it records a *node* — a primitive (named as MLX names it:
`Multiply`, `Exp`, `Broadcast`, ...) applied to input arrays. The timeline shows that no
primitive ran while the expression was written."""),
    ("code", """x = mx.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
b = mx.array([10.0, 20.0, 30.0])
with tapescope.record() as rec:
    y = mx.exp(x * 0.5) + b
print("primitives run while writing y:", sum(r.kind == "primitive" for r in rec.records))
tapescope.graph_of(y)"""),
    ("md", """The picture is the graph `y` stands for. The scalar `0.5` became a 0-d array that a
`Broadcast` stretches to `x`'s shape, and `b` (shape `(3,)`) is broadcast to `(2, 3)` before
the `Add` — the same primitives MLX records."""),
    ("md", """## Evaluating runs the nodes in order

`mx.eval(y)` orders the graph (inputs before users) and runs each node's rule. The records
say which primitive ran, on which stream, how many bytes it wrote and how long it took."""),
    ("code", """with tapescope.record() as rec:
    mx.eval(y)
for r in rec.records:
    if r.kind == "primitive":
        print(f"{r.name:10s} stream {r.stream}  {r.nbytes:4d} bytes  {(r.end_ns - r.start_ns) / 1e3:7.1f} us")
print(y)"""),
    ("md", """## Evaluation detaches

Once evaluated, `y` holds its data and no longer points at its graph, so the intermediate
`exp(x * 0.5)` is freed — as in MLX. Evaluating or reading `y` again runs nothing."""),
    ("code", """with tapescope.record() as rec:
    mx.eval(y)
    y.tolist()
print("primitives run the second time:", sum(r.kind == "primitive" for r in rec.records))
tapescope.graph_of(y)"""),
    ("md", """## Memory comes from an allocator with a buffer cache

Every array's storage is accounted to the byte. When an array is deleted its buffer goes to
a **cache**, and the next allocation of a similar size reuses it instead of asking the
system for fresh memory."""),
    ("code", """mx.clear_cache()
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
    ("md", """`cache_reuse` means the 256 KiB buffer `c` gave back was handed to `d`.

A chain like `x = f(x)` does even better: an input nobody else holds **donates** its buffer
to the output, so the chain runs in place and active memory stays flat."""),
    ("code", """x = mx.array(np.linspace(0, 1, 1 << 16, dtype=np.float32))
mx.eval(x)
before = mx.get_active_memory()
for _ in range(100):
    x = mx.exp(-x)
    mx.eval(x)
print("active memory grew by", mx.get_active_memory() - before, "bytes over 100 steps")"""),
    ("md", """## Streams run work concurrently and in order

Each stream has its own worker thread. `mx.async_eval` returns at once; a consumer on another
stream waits for its producer through an **event** (or, inside one eval, a **fence**)."""),
    ("code", """s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
a = mx.array(np.arange(8, dtype=np.float32))
with tapescope.record() as rec:
    p = mx.multiply(a, 3.0, stream=s1)   # produced on s1
    q = mx.add(p, 1.0, stream=s2)        # consumed on s2
    mx.eval(q)
for r in rec.records:
    if r.kind in ("primitive", "fence_update", "fence_wait", "event_signal"):
        print(f"{r.kind:13s} stream {r.stream}  {r.name or ''}")
print(q)"""),
]

COMPILE = [
    ("md", """# 2. Compiling: fusion, generated kernels, and checking against JAX

`mx.compile(f)` traces `f` into a graph, fuses chains of elementwise work into **tapes**,
and generates one kernel per tape — C on the CPU, built by the system compiler. This
notebook looks at the tape, its kernel's name and source, the kernel cache, and then checks
the results against JAX."""),
    ("code", """import numpy as np
import tapescope
import tapescope.core as mx"""),
    ("code", """def gelu(x):
    return 0.5 * x * (1 + mx.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

x = mx.array(np.linspace(-3, 3, 1 << 12, dtype=np.float32))
gelu_c = mx.compile(gelu)
y = gelu_c(x)
mx.eval(y)
print(np.abs(np.array(y) - np.array(gelu(x))).max())"""),
    ("md", """## The traced graph and its fused tape

Uncompiled, GELU is a dozen separate primitives, each reading and writing the whole array.
Compiled, the elementwise chain becomes a single `Compiled` kernel (a cluster in the
picture), which reads `x` once and writes `y` once."""),
    ("code", """tapescope.trace(gelu, x)"""),
    ("md", """## The kernel: its name, variant and source

The kernel's name follows MLX's grammar: one letter per value, each fused node as
`name kind itemsize Primitive inputs`, then the inputs' kinds, their dtypes and a hash of the
constants. `_contiguous` / `_strided_<ndim>` say which variant ran."""),
    ("code", """for entry in tapescope.kernel_cache():
    print(entry["name"], "|", entry["variant"], "|", entry["origin"], "| hits", entry["hits"])"""),
    ("md", """The same tape is written in three dialects: the C that was built and ran here, and the
CUDA and Metal a GPU runtime would build. Each column starts at the kernel itself; the
includes and helper functions above it are under "show all"."""),
    ("code", """from IPython.display import HTML

kernel = tapescope.trace(gelu, x).kernels[0]
HTML(kernel.sources_html())"""),
    ("md", """## Checking against JAX

`tapescope.check` evaluates the same graph with its own table of JAX rules and compares every
output (and, with `every_node=True`, every intermediate) with dtype-aware tolerances."""),
    ("code", """tapescope.check(gelu, x, every_node=True)"""),
    ("md", """## The `%%mlx` cell magic

In a notebook, `%load_ext tapescope` adds `%%mlx`: it runs a cell and shows, under it, the
graph, the fused tapes, the kernels, memory and the events between streams."""),
    ("code", """%load_ext tapescope"""),
    ("code", """%%mlx --show graph,memory,cache
z = mx.exp(x * 0.5) + 1.0"""),
]


SPEED = [
    ("md", """# 3. Why is it fast or slow? Reading the timeline

The same computation written three ways: eager, op by op; compiled, but with a reduction in
the middle; compiled into one fused kernel. The timeline says what ran, how many bytes each
step wrote, and where fusion stopped — the usual reasons MLX code is slower than it could be."""),
    ("code", """import time
import numpy as np
import tapescope
import tapescope.core as mx

x = mx.array(np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32))
mx.eval(x)


def summary(label, fn, *args):
    mx.eval(fn(*args))  # warm up: traces, builds and caches the kernels once
    with tapescope.record() as rec:
        t0 = time.perf_counter()
        out = fn(*args)
        mx.eval(out)
        ms = (time.perf_counter() - t0) * 1e3
    prims = [r for r in rec.records if r.kind == "primitive"]
    written = sum(r.nbytes for r in prims)
    print(f"{label:28s} {ms:7.2f} ms  {len(prims):2d} primitives  {written / 2**20:6.1f} MiB written")
    return rec"""),
    ("md", """## Eager: every op writes a whole array

Each elementwise op is its own primitive and writes its full result to memory before the next
one reads it back."""),
    ("code", """def softplus_scaled(x):
    return mx.log1p(mx.exp(-mx.abs(x))) + mx.maximum(x, 0.0) * 0.5 + 1.0

rec = summary("eager", softplus_scaled, x)"""),
    ("md", """## Compiled: one kernel, one write

`mx.compile` fuses the chain into one kernel that reads `x` once and writes the result once."""),
    ("code", """fast = mx.compile(softplus_scaled)
rec = summary("compiled", fast, x)
tapescope.trace(softplus_scaled, x)"""),
    ("md", """## A reduction in the middle splits the kernel

Normalising by the mean needs a `Sum` — a reduction, which ends a fused tape. The picture
labels each kernel boundary with the reason fusion stopped there."""),
    ("code", """def normalised(x):
    y = mx.exp(-x * x)
    return (y - y.mean()) * 2.0

slow = mx.compile(normalised)
rec = summary("compiled, with a reduction", slow, x)
tapescope.trace(normalised, x)"""),
    ("md", """## Where the time went

Every primitive record has its start and end time. Sorting by time spent shows which steps
matter."""),
    ("code", """prims = sorted((r for r in rec.records if r.kind == "primitive"),
               key=lambda r: r.end_ns - r.start_ns, reverse=True)
for r in prims[:5]:
    print(f"{r.name:10s} {(r.end_ns - r.start_ns) / 1e3:9.1f} us  {r.nbytes / 2**20:6.1f} MiB")"""),
]

MLX_NN = [
    ("md", """# 4. MLX's own `mlx.nn` on tapescope: a model, its backward graph and its fused tapes

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
the two are close — `03_fast_or_slow` shows how to find out which case you are in."""),
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


def write(cells: list, path: Path) -> None:
    nb = new_notebook(cells=[new_markdown_cell(t) if k == "md" else new_code_cell(t) for k, t in cells])
    for i, cell in enumerate(nb.cells):  # stable ids: regenerating changes only what changed
        cell.id = f"{path.stem[:2]}-{i:02d}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


if __name__ == "__main__":
    write(LAZY, HERE / "01_lazy_arrays.ipynb")
    write(COMPILE, HERE / "02_compile_and_check.ipynb")
    write(SPEED, HERE / "03_fast_or_slow.ipynb")
    write(MLX_NN, HERE / "04_mlx_nn.ipynb")
