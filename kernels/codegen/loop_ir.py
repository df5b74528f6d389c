"""The loop IR: a kernel described once as ranges, loads, stores, accumulators and
cross-thread reductions, which ``lower.py`` renders for C, CUDA and MSL.

A ``Kernel`` has parameters (input / output buffers, 64-bit integers, integer arrays) and a
body of statements:

- ``Range(var, start, stop, body, kind)``: a loop. ``kind`` says how its iterations are
  spread: ``"blocks"`` (independent iterations, each run by one group of threads: a CUDA
  block or a Metal threadgroup; OpenMP threads on the CPU), ``"threads"`` (the iterations of
  one group's work: its threads on a GPU, SIMD lanes on the CPU), ``"global"`` (every thread
  of the grid: both at once) or ``"serial"``.
- ``Reduce(var, start, stop, body, acc, elem)``: a ``threads`` range that folds one value per
  iteration into the accumulator ``acc`` (a ``Monoid``'s state). On the CPU it runs as
  ``lanes`` independent accumulators under ``omp simd`` that are merged at the end; on a GPU
  each thread folds its strided share, then the threads merge across the group (CUDA warp
  shuffles and shared memory, Metal ``simd_*`` and threadgroup memory), and every thread
  sees the result.
- A ``Range`` or ``Reduce`` may ask a GPU to ``unroll`` it (independent loads in flight).
- ``Let`` (a declaration), ``Assign``, ``Store`` (converted to the buffer's type), ``If``,
  ``Local`` (a per-thread array), ``Fold`` (one accumulator update, e.g. into an array
  element), ``Barrier`` (the group's threads meet).

Expressions are text in the C syntax the three dialects share (index arithmetic, operators,
``?:``) with the dialect-dependent parts as nodes: ``Load`` (a buffer element in its compute
type), ``Lit`` (a typed literal), ``Math`` (a libm function by stem), ``Cast``, ``Round``
(to a half type's precision) and ``Fmt`` (a template over sub-expressions). Types are
numpy dtypes, or ``INDEX`` (the index type).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

INDEX = "index"  # the dtype of index variables (64-bit signed in every dialect)


# -- expressions ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    """``buf[index]`` converted to its compute type (float for float16 / bfloat16)."""

    buf: str
    index: "Expr"
    dtype: Any


@dataclass(frozen=True)
class Lit:
    """A literal of ``dtype`` (``inf`` / ``nan`` spelled by the dialect)."""

    value: Any
    dtype: Any


@dataclass(frozen=True)
class Math:
    """A libm function by stem (``exp``, ``log``) on values of ``dtype``."""

    stem: str
    dtype: Any
    args: tuple
    # what the argument is known to be, for a dialect's faster function over that domain
    # (``"nonpositive"``: softmax's x - max; the C dialect's ``ts_expf_neg``;
    # ``"nonpositive_nan_unused"``: the same where a NaN argument's result is not used, a
    # caller whose result is NaN then anyway: ``ts_expf_neg_any``)
    domain: str = ""


@dataclass(frozen=True)
class Cast:
    """``arg`` converted to ``dtype``'s compute type."""

    dtype: Any
    arg: "Expr"


@dataclass(frozen=True)
class Round:
    """``arg`` (a compute-type value) rounded to ``dtype``'s precision and kept in the
    compute type: a float16 / bfloat16 intermediate as MLX's kernels round it
    (``static_cast<T>(x * normalizer)`` before the weight's multiply); identity otherwise."""

    dtype: Any
    arg: "Expr"


@dataclass(frozen=True)
class ThreadId:
    """The running thread's place on a GPU: ``"thread"`` (in its group), ``"group"``,
    ``"lane"`` (in its warp / simdgroup), ``"warp"`` (in its group), ``"group_size"``."""

    which: str


@dataclass(frozen=True)
class Fmt:
    """``text.format(*args)`` with each argument rendered first."""

    text: str
    args: tuple = ()


Expr = Union[str, int, Load, Lit, Math, Cast, Round, Fmt, ThreadId]


# -- accumulators ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Monoid:
    """An accumulator's state (one variable per field), its identity, how one element is
    lifted into a state and how two states merge. ``lift(elem) -> {field: expr}`` and
    ``merge(a, b) -> {field: expr}`` take dicts of field -> expression text; the fields of a
    merge are assigned together (temporaries first)."""

    name: str
    fields: tuple  # ((field, dtype), ...)
    identity: tuple  # Expr per field
    lift: Callable[[dict], dict]
    merge: Callable[[dict, dict], dict]
    # a dialect's one-call group reduction of this monoid (Metal ``simd_sum``): its key
    simd: Optional[str] = None
    # OpenMP's own reduction operator per field (``+``, ``*``, ``max``, ``|``, ``&&``), when
    # every field merges with one: the CPU folds under ``omp simd reduction(op:field)``
    omp: Optional[tuple] = None
    # the state's value (default: its first field), e.g. max's NaN flag applied
    final: Optional[Callable[[dict], Any]] = None
    # ``step(state, elem) -> {field: expr}``: one element folded in directly, where that is
    # cheaper than ``merge(state, lift(elem))`` (online softmax: one exp, not two)
    step: Optional[Callable[[dict, dict], dict]] = None
    # ``chunk(state, elems, tmp) -> (statements, {field: expr})``: the lanes of one vector
    # folded at once (``elems``: a field -> variable dict per lane, typed as ``elem_fields``;
    # ``tmp`` a prefix for the statements' names), where that is cheaper than a ``step`` per
    # lane: online softmax's max of the lanes, one rescale and independent exps (MLX's CUDA
    # softmax / logsumexp). A GPU dialect with vector loads folds each vector so.
    chunk: Optional[Callable[[dict, list, str], tuple]] = None
    elem_fields: tuple = ()  # ((field, dtype), ...) of the elements ``chunk`` takes

    def value(self, state: dict):
        return self.final(state) if self.final else state[self.fields[0][0]]


# -- statements -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Vec:
    """The elements a ``Reduce`` or ``threads`` ``Range`` walks are ``buf[base + var]`` (unit
    stride, ``var`` from 0): ``make(value, index) -> (statements, elem)`` builds the body of
    one element from its value and index expressions. A GPU dialect with vector loads
    (``ir_vector``) reads 16 bytes at a time: a scalar head up to the first 16-byte boundary,
    the aligned body as vectors, a scalar tail (MLX's vectorised reads, ``N_READS``); other
    dialects run the plain body."""

    buf: str
    base: "Expr"
    dtype: Any
    make: Callable
    # the loops over one row that name the same ``cache`` share it: on a GPU whose row fits
    # (``slots`` 16-byte vectors a thread, the row aligned), the first loop loads each
    # thread's vectors into registers and the others read them there (the row read once:
    # MLX's layer_norm reads x once per pass from cache; here from registers)
    cache: Optional[str] = None
    slots: int = 4
    # ``(buf, base, dtype, var)``: each element's ``var`` (a compute-type value ``make``
    # declares) is stored at ``buf[base + index]``; a GPU stores a vector's lanes at once
    # (a 16-byte store) where ``buf + base`` is aligned. The plain body must hold the Store.
    store: Optional[tuple] = None
    # ``((buf, stride), ...)``: vectors read beside the row's where they are cached, element
    # ``index`` at ``buf[index * stride]`` (a weight: 16 bytes at once where the stride is 1
    # and ``buf`` aligned, else element by element); ``make(value, index, aux)`` then gets
    # ``aux``: buf -> that element's value (None where it must load it itself)
    aux: tuple = ()


@dataclass
class Let:
    name: str
    dtype: Any
    value: Expr
    mutable: bool = False


@dataclass
class Assign:
    name: str
    value: Expr


@dataclass
class Store:
    buf: str
    index: Expr
    value: Expr
    dtype: Any  # the buffer's element type


@dataclass
class If:
    cond: Expr
    then: list
    orelse: list = field(default_factory=list)


@dataclass
class Local:
    """A per-thread array of ``size`` elements (``shared``: one per group, in group memory:
    CUDA ``__shared__``, Metal ``threadgroup``)."""

    name: str
    dtype: Any
    size: int
    shared: bool = False


@dataclass
class Fold:
    """``state = merge(state, lift(elem))``: ``state`` maps each field to an lvalue."""

    acc: Monoid
    state: dict
    elem: dict


@dataclass
class Merge:
    """``state = merge(state, other)``: two states of ``acc`` (field -> lvalue / expression)."""

    acc: Monoid
    state: dict
    other: dict


@dataclass
class Range:
    var: str
    start: Expr
    stop: Expr
    body: list
    kind: str = "serial"  # "blocks", "threads", "global", "serial"
    parallel_if: Optional[str] = None  # C: the condition under which OpenMP threads run it
    step: Any = 1  # a serial range's step
    # a GPU unrolls the loop this many times: that many independent loads in flight per
    # thread (the bytes in flight a GPU needs to reach its memory bandwidth)
    unroll: int = 1
    vec: Optional[Vec] = None  # a ``threads`` range over unit-stride elements (see Vec)
    # the CPU: ``(buf, base, cond)``: this ``threads`` range writes ``buf[base + var]`` (unit
    # stride, its only stores to ``buf``), streamed around the caches (staged blocks, x86's
    # non-temporal stores: no read for ownership of each output line) where ``cond`` holds
    # (the kernel's output is large) and ``buf + base`` is aligned to its element
    stream: Optional[tuple] = None


@dataclass
class Reduce:
    """A ``threads`` range folding ``elem`` (field -> expression, evaluated after ``body``
    each iteration) into the state named ``acc_name`` (variables ``<acc_name>_<field>``)."""

    var: str
    start: Expr
    stop: Expr
    body: list
    acc: Monoid
    acc_name: str
    elem: dict
    unroll: int = 1  # as Range's
    vec: Optional[Vec] = None  # the elements are buf[base + var]: vector loads on a GPU
    # the CPU: the same fold for several rows in one loop, ``tile_var`` bound to each of
    # ``tiles`` (expressions) in turn, row j's state ``<acc_name><j>_<field>``: as many
    # streams in flight as rows (one stream per thread left the memory idle; a monoid
    # OpenMP merges only)
    tiles: tuple = ()
    tile_var: str = ""


@dataclass
class First:
    """Statements one thread of the group runs (a GPU's thread 0; the CPU's only thread)."""

    body: list


@dataclass
class Barrier:
    pass


@dataclass(frozen=True)
class Param:
    kind: str  # "in", "out", "int" (an int64 by value), "ints" (an int64 array)
    name: str
    dtype: Any = None


@dataclass
class Kernel:
    """One kernel: MLX-style name, parameters, body; on a GPU, at most ``block`` threads per
    group (its launch bound), ``groups(ints)`` groups and ``threads(ints)`` threads per
    group (default ``block``) from the integer parameters' values."""

    name: str
    params: list
    body: list
    block: int = 256
    groups: Optional[Callable[[dict], int]] = None
    threads: Optional[Callable[[dict], int]] = None
    # C: the kernel's SIMD loops take the widest vectors (512-bit on AVX-512, where gcc
    # prefers 256): register tiles of one vector per row (the attention kernels' GEMMs)
    wide: bool = False

    def launch(self, ints: dict) -> tuple:
        """(groups, threads per group) of a launch with these integer arguments."""
        t = self.threads(ints) if self.threads else self.block
        return max(1, min(int(self.groups(ints)), (1 << 31) - 1)), int(t)


def row_threads(n: int, per_thread: int = 16, most: int = 1024) -> int:
    """Threads for a group that walks ``n`` elements: about ``per_thread`` each (four 16-byte
    loads of float32), a whole number of warps (32) up to ``most``, as MLX's CUDA
    row_reduce sizes its blocks (``warps = ceil(vectors / 32) / 4``): a row just past a
    power of two (8193) gets 17 warps of ~15 elements, not 32 warps of 8 (each thread's
    fixed cost, its state's init and the group merge, over half the elements, and two
    blocks of 1024 filling a multiprocessor); more, smaller groups per multiprocessor hide
    each one's merge."""
    warps = -(-n // (per_thread * 32))
    return max(32, min(most, 32 * warps))


def state_vars(acc_name: str, acc: Monoid) -> dict:
    """The variables holding a named accumulator's fields."""
    return {f: f"{acc_name}_{f}" for f, _ in acc.fields}


def dtype_of(dt: Any) -> Any:
    return dt if dt == INDEX else np.dtype(dt)


def walk(stmts: Sequence) -> list:
    """Every statement, nested ones included (pre-order)."""
    out = []
    for s in stmts:
        out.append(s)
        for attr in ("body", "then", "orelse"):  # First has a body too
            out += walk(getattr(s, attr, ()) or ())
    return out
