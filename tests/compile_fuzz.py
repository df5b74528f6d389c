"""Differential fuzzing of compiled kernels: compiled == uncompiled, bit for bit.

Two generators, shared by the test suite (small samples), ``make test-fuzz`` and
``make test-ub`` (large runs, the latter under the sanitizers):

- ``random_graph``: a random elementwise program over 1-3 inputs of any real dtype and
  layout (contiguous, transposed, broadcast, sliced, 0-d, Python constants) with 1-3
  outputs, at sizes around every threshold of the C kernels (the OpenMP cut, the streaming
  cut of each itemsize, the staging block, the tile edge, 2^21). ``mx.compile(f)`` must give
  exactly what calling ``f`` op by op gives.
- ``variant_cases``: one tape per (input dtype, output dtype) pair run through each kernel
  variant (contiguous, strided, ``_large``) with one or two outputs, at every output
  alignment phase, against the tape interpreter.

Only ops whose results IEEE arithmetic (or MLX's integer semantics) fixes exactly are drawn:
libm's transcendental functions differ by an ulp or two between numpy and the C kernels and
have their own accuracy tests (tests/test_compile_ops.py). Float-to-integer casts are drawn
only on values in the target's range (out of range is undefined in C, as in MLX).

Run as a script: ``python tests/compile_fuzz.py --graphs 2000`` prints the counts.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import sys
import time
from typing import Callable, Optional

import ml_dtypes
import numpy as np

import tapescope.core as mx
from tapescope.kernels.codegen.render import CDialect

_BF16 = np.dtype(ml_dtypes.bfloat16)
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
DTYPES = ["bool"] + INTS + FLOATS


def threshold_sizes() -> list:
    """Element counts on both sides of every size the C kernels switch behaviour at."""
    d = CDialect
    edges = {1, 2, 3, 7, 8, 9, 31, 32, 33, d.tile - 1, d.tile, d.tile + 1,
             d.stream_block - 1, d.stream_block, d.stream_block + 1,
             d.omp_min_size - 1, d.omp_min_size, d.omp_min_size + 1,
             2**21 - 3, 2**21, 2**21 + 5, 3 * 2**21}
    for isz in (1, 2, 4, 8):  # the streaming cut for each output itemsize, 1-3 outputs
        for n_out in (1, 2, 3):
            n = -(-d.stream_min_bytes // (isz * n_out))
            edges |= {n - 1, n, n + 1 + d.stream_block // 2}
    return sorted(s for s in edges if s <= 3 * 2**21)


# -- values ------------------------------------------------------------------------------

def random_values(rng: np.random.Generator, dtype: str, shape: tuple) -> np.ndarray:
    """Values of ``dtype`` with the edge cases mixed in (extremes, 0, -0, inf, NaN, subnormals)."""
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    dt = _BF16 if dtype == "bfloat16" else np.dtype(dtype)
    if dtype in INTS:
        info = np.iinfo(dt)
        small = rng.integers(-9 if info.min < 0 else 0, 10, n)
        full = rng.integers(int(info.min), int(info.max), n, dtype=dt, endpoint=True)
        edge = rng.choice(np.array([info.min, info.max, 0, 1, -1 if info.min < 0 else 2], dtype=dt), n)
        pick = rng.integers(0, 10, n)
        return np.where(pick < 6, small.astype(dt), np.where(pick < 9, full, edge)).reshape(shape)
    fi = ml_dtypes.finfo(dt) if dt == _BF16 else np.finfo(dt)
    vals = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(fi.max), -float(fi.max),
                         float(fi.smallest_subnormal), 0.5, 1.5, 2.5, -2.5], dtype=np.float64)
    pick = rng.integers(0, 20, n)
    vals = np.where(pick == 0, rng.choice(specials, n), vals)
    with np.errstate(all="ignore"):
        return vals.astype(np.float32).astype(dt).reshape(shape) if dt == _BF16 else vals.astype(dt).reshape(shape)


def _is(a: mx.array, kind: str) -> bool:
    name = str(a.dtype).split(".")[-1]
    return {"bool": name == "bool", "int": name in INTS, "float": name in FLOATS,
            "signed": name.startswith("int") or name in FLOATS}[kind]


def _below(v: float, dt) -> float:
    """The largest value of float dtype ``dt`` that is strictly below the positive ``v``."""
    x = np.array([v], dtype=np.float64).astype(dt)
    bits = x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
    while float(x[0]) >= v:
        bits -= 1  # positive finite floats: one bit pattern down is the next value down
    return float(x[0])


def safe_astype(a: mx.array, dtype: str) -> mx.array:
    """``a.astype(dtype)``, with floats first brought into the integer target's range
    (NaN to 0, then clipped to bounds that the source dtype represents exactly)."""
    target = getattr(mx, "bool_" if dtype == "bool" else dtype)
    if dtype in INTS and _is(a, "float"):
        src = _BF16 if a.dtype == mx.bfloat16 else np.dtype(str(a.dtype).split(".")[-1])
        fmax = float(ml_dtypes.finfo(src).max if src == _BF16 else np.finfo(src).max)
        info = np.iinfo(dtype)
        top = float(info.max) + 1.0  # a power of two: the first value out of range
        hi = fmax if fmax < top else _below(top, src)
        lo = max(float(info.min), -fmax)
        a = mx.clip(mx.where(a != a, 0, a), lo, hi)
    return a.astype(target)


# -- programs ----------------------------------------------------------------------------

UNARY: dict = {
    "negative": (lambda a: -a, lambda a: not _is(a, "bool")),
    "abs": (mx.abs, lambda a: True),
    "square": (mx.square, lambda a: True),
    "sqrt": (mx.sqrt, lambda a: _is(a, "float")),
    "floor": (mx.floor, lambda a: not _is(a, "bool")),
    "ceil": (mx.ceil, lambda a: not _is(a, "bool")),
    "round": (mx.round, lambda a: _is(a, "float")),
    "logical_not": (mx.logical_not, lambda a: True),
    "sign": (mx.sign, lambda a: not _is(a, "bool")),
    "bitwise_invert": (mx.bitwise_invert, lambda a: _is(a, "int") or _is(a, "bool")),
}
BINARY: dict = {
    "add": (mx.add, lambda a, b: True),
    "subtract": (mx.subtract, lambda a, b: not (_is(a, "bool") and _is(b, "bool"))),
    "multiply": (mx.multiply, lambda a, b: True),
    "divide": (mx.divide, lambda a, b: True),
    "maximum": (mx.maximum, lambda a, b: True),
    "minimum": (mx.minimum, lambda a, b: True),
    "equal": (mx.equal, lambda a, b: True),
    "not_equal": (mx.not_equal, lambda a, b: True),
    "less": (mx.less, lambda a, b: True),
    "greater_equal": (mx.greater_equal, lambda a, b: True),
    "logical_and": (mx.logical_and, lambda a, b: True),
    "logical_or": (mx.logical_or, lambda a, b: True),
    "floor_divide": (mx.floor_divide, lambda a, b: not (_is(a, "bool") and _is(b, "bool"))),
    "remainder": (mx.remainder, lambda a, b: not (_is(a, "bool") and _is(b, "bool"))),
    "bitwise_and": (mx.bitwise_and, lambda a, b: not (_is(a, "float") or _is(b, "float"))),
    "bitwise_xor": (mx.bitwise_xor, lambda a, b: not (_is(a, "float") or _is(b, "float"))),
    "left_shift": (mx.left_shift, lambda a, b: _is(a, "int") and _is(b, "int")),
    "right_shift": (mx.right_shift, lambda a, b: _is(a, "int") and _is(b, "int")),
}


class Graph:
    """A random program: ``fn(*inputs)`` returns 1-3 arrays; ``describe`` says what it does."""

    def __init__(self, fn: Callable, inputs: list, steps: list, size: int):
        self.fn, self.inputs, self.steps, self.size = fn, inputs, steps, size

    def describe(self) -> str:
        ins = ", ".join(f"{a.dtype} {tuple(a.shape)}" for a in self.inputs)
        return f"inputs [{ins}] steps {self.steps}"


def _shape_for(rng: np.random.Generator, size: int) -> tuple:
    ndim = int(rng.integers(1, 4))
    if ndim == 1 or size < 4:
        return (size,)
    cols = int(rng.choice([1, 3, CDialect.tile, CDialect.tile + 1, CDialect.stream_block,
                           2 * CDialect.stream_block + 1, 1031]))
    cols = min(cols, size)
    rows = max(1, size // cols)
    if ndim == 2:
        return (rows, cols)
    first = int(rng.choice([1, 2, 3]))
    return (first, max(1, rows // first), cols)


def _make_input(rng: np.random.Generator, dtype: str, shape: tuple):
    """An mx input of ``shape`` in a random layout: (kind, array)."""
    kind = rng.choice(["contiguous", "contiguous", "transposed", "broadcast", "sliced", "scalar"])
    if kind == "scalar":
        return kind, mx.array(random_values(rng, dtype, ()))
    if kind == "transposed" and len(shape) >= 2:
        base = random_values(rng, dtype, shape[::-1])
        return kind, mx.transpose(mx.array(base))
    if kind == "broadcast" and len(shape) >= 2:
        bshape = tuple(1 if rng.integers(0, 2) else s for s in shape)
        return kind, mx.array(random_values(rng, dtype, bshape))
    if kind == "sliced":
        base = random_values(rng, dtype, shape[:-1] + (2 * shape[-1] + 1,))
        return kind, mx.array(base)[..., 1::2]
    return "contiguous", mx.array(random_values(rng, dtype, shape))


def random_graph(rng: np.random.Generator, max_size: int = 3 * 2**21,
                 dtypes_from: Optional[list] = None) -> Graph:
    """A random elementwise program over 1-3 inputs, 1-8 ops and 1-3 outputs."""
    sizes = [s for s in threshold_sizes() if s <= max_size]
    size = int(rng.choice(sizes)) if rng.random() < 0.6 else int(rng.integers(1, 5000))
    shape = _shape_for(rng, size)
    n_in = int(rng.integers(1, 4))
    dtypes = [str(rng.choice(dtypes_from or DTYPES)) for _ in range(n_in)]
    inputs, kinds = [], []
    for dt in dtypes:
        kind, a = _make_input(rng, dt, shape)
        inputs.append(a)
        kinds.append(kind)
    if all(k == "scalar" for k in kinds):  # something must carry the shape
        inputs[0] = mx.array(random_values(rng, dtypes[0], shape))
    n_ops = int(rng.integers(1, 9))
    steps = []  # (op name, operand indices, extra) replayed by fn
    pool_dtypes = [a for a in inputs]  # stand-ins to decide which ops apply
    for _ in range(n_ops):
        r = rng.random()
        if r < 0.3:
            k = int(rng.integers(0, len(pool_dtypes)))
            name = str(rng.choice(list(UNARY)))
            if not UNARY[name][1](pool_dtypes[k]):
                continue
            steps.append(("unary", name, (k,)))
            pool_dtypes.append(UNARY[name][0](pool_dtypes[k]))
        elif r < 0.45:
            k = int(rng.integers(0, len(pool_dtypes)))
            dt = str(rng.choice(dtypes_from or DTYPES))
            steps.append(("astype", dt, (k,)))
            pool_dtypes.append(safe_astype(pool_dtypes[k], dt))
        elif r < 0.9:
            i, j = (int(v) for v in rng.integers(0, len(pool_dtypes), 2))
            name = str(rng.choice(list(BINARY)))
            const = None
            if rng.random() < 0.25:  # a Python scalar: a constant inlined into the kernel
                const = int(rng.integers(-3, 4)) if _is(pool_dtypes[i], "int") else float(rng.choice([0.5, -2.0, 3.0, 0.0]))
                if _is(pool_dtypes[i], "bool"):
                    const = bool(rng.integers(0, 2))
            b = const if const is not None else pool_dtypes[j]
            if const is not None and name in ("left_shift", "right_shift", "bitwise_and", "bitwise_xor") \
                    and not isinstance(const, int):
                continue
            if not BINARY[name][1](pool_dtypes[i], b if isinstance(b, mx.array) else mx.array(b)):
                continue
            try:
                res = BINARY[name][0](pool_dtypes[i], b)
            except (ValueError, TypeError, RuntimeError):  # not defined for these dtypes (MLX raises)
                continue
            steps.append(("binary", name, (i, j), const))
            pool_dtypes.append(res)
        else:
            c, i, j = (int(v) for v in rng.integers(0, len(pool_dtypes), 3))
            steps.append(("where", None, (c, i, j)))
            pool_dtypes.append(mx.where(pool_dtypes[c].astype(mx.bool_), pool_dtypes[i], pool_dtypes[j]))
    if not steps:
        steps.append(("unary", "abs", (0,)))
        pool_dtypes.append(mx.abs(pool_dtypes[0]))
    n_nodes = len(pool_dtypes)
    n_out = int(rng.integers(1, 4))
    outs = sorted({int(v) for v in rng.integers(max(n_in, n_nodes - 4), n_nodes, n_out)})

    def fn(*xs):
        pool = list(xs)
        for step in steps:
            kind, name, idx = step[0], step[1], step[2]
            if kind == "unary":
                pool.append(UNARY[name][0](pool[idx[0]]))
            elif kind == "astype":
                pool.append(safe_astype(pool[idx[0]], name))
            elif kind == "binary":
                const = step[3]
                pool.append(BINARY[name][0](pool[idx[0]], pool[idx[1]] if const is None else const))
            else:
                pool.append(mx.where(pool[idx[0]].astype(mx.bool_), pool[idx[1]], pool[idx[2]]))
        return tuple(pool[k] for k in outs)

    return Graph(fn, inputs, steps, size)


# -- comparison --------------------------------------------------------------------------

def mismatches(got: np.ndarray, want: np.ndarray) -> int:
    """Elements that differ bit for bit (any NaN equals any NaN; -0.0 differs from 0.0)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size, 1)
    if got.dtype.kind == "f" or got.dtype == _BF16:
        isz = got.dtype.itemsize
        u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[isz]
        gn = np.isnan(got.astype(np.float64))
        wn = np.isnan(want.astype(np.float64))
        diff = (got.view(u) != want.view(u)) & ~(gn & wn)
        return int(np.count_nonzero(diff))
    return int(np.count_nonzero(got != want))


def to_numpy(a: mx.array) -> np.ndarray:
    """The values of ``a`` (bfloat16 through its bits: numpy cannot take it through the buffer)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(_BF16)
    return np.array(a)


def check_graph(g: Graph) -> tuple:
    """(elements compared, mismatching elements, message) for compiled vs op-by-op."""
    with np.errstate(all="ignore"):
        want = g.fn(*g.inputs)
        mx.eval(want)
        got = mx.compile(g.fn)(*g.inputs)
        mx.eval(got)
    n = bad = 0
    msg = ""
    for k, (a, b) in enumerate(zip(got, want)):
        if a.dtype != b.dtype or a.shape != b.shape:
            return 1, 1, f"output {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        an, bn = to_numpy(a), to_numpy(b)
        m = mismatches(an, bn)
        n += an.size
        bad += m
        if m and not msg:
            where = np.flatnonzero((an != bn) & ~(np.isnan(an.astype(np.float64)) & np.isnan(bn.astype(np.float64)))
                                   if an.dtype.kind in "fV" or an.dtype == _BF16 else an != bn)
            i = int(where[0]) if where.size else 0
            msg = (f"output {k} ({a.dtype}): {m} of {an.size} differ, first at {i}: "
                   f"compiled {an.reshape(-1)[i]!r} vs op by op {bn.reshape(-1)[i]!r}")
    return n, bad, msg


def run_graphs(n: int, seed: int = 0, max_size: int = 3 * 2**21, log: Optional[Callable] = None) -> dict:
    """Check ``n`` random graphs; returns the totals and the first failures."""
    rng = np.random.default_rng(seed)
    totals = {"graphs": 0, "elements": 0, "mismatches": 0, "failed_graphs": 0, "failures": []}
    for k in range(n):
        g = random_graph(rng, max_size)
        elems, bad, msg = check_graph(g)
        totals["graphs"] += 1
        totals["elements"] += elems
        totals["mismatches"] += bad
        if bad:
            totals["failed_graphs"] += 1
            if len(totals["failures"]) < 10:
                totals["failures"].append(f"graph {k} (seed {seed}): {msg}\n  {g.describe()}")
        if log and (k + 1) % 100 == 0:
            log(f"{k + 1} graphs, {totals['mismatches']} mismatching elements")
    return totals


# -- every variant, every dtype pair, every alignment phase ------------------------------

LAYOUTS = ("contiguous", "strided", "rows", "large")


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def variant_cases(exhaustive: bool, rng: Optional[np.random.Generator] = None, sample: int = 24) -> list:
    """(in dtype, out dtype, layout, n_out, size) cases; all of them, or ``sample`` drawn.

    Sizes: tiny, odd, past the staging block, past the OpenMP cut, and just past the
    streaming cut of the case's outputs (itemsize x number of outputs)."""
    d = CDialect
    small = [1, 7, d.stream_block + 3, d.omp_min_size + 1]
    cases = []
    for i, o in itertools.product(DTYPES, DTYPES):
        for lay in LAYOUTS:
            for n_out in (1, 2):
                stream = -(-d.stream_min_bytes // (_itemsize(o) * n_out)) + 5
                cases += [(i, o, lay, n_out, sz) for sz in small + [stream]]
    if exhaustive:
        return cases
    # a sample with each layout both below and past the streaming cut
    rng = rng or np.random.default_rng(0)
    picked = []
    for lay in LAYOUTS:
        for big in (False, True):
            pool = [c for c in cases if c[2] == lay and (c[4] > d.omp_min_size + 1) == big]
            picked += [pool[int(k)] for k in rng.choice(len(pool), max(1, sample // (2 * len(LAYOUTS))),
                                                        replace=False)]
    return picked


def _pair_tape(in_dt: str, out_dt: str, n_out: int):
    """``y = astype(a * b + a, out)`` (and ``y2 = astype(a - b, out)``): a tape per dtype pair."""
    from tapescope.kernels.codegen.tape import TapeInput, TapeOp, make_tape

    idt = _BF16 if in_dt == "bfloat16" else np.dtype(in_dt)
    odt = _BF16 if out_dt == "bfloat16" else np.dtype(out_dt)
    mid = "LogicalAnd" if in_dt == "bool" else "Multiply"
    add = "LogicalOr" if in_dt == "bool" else "Add"
    ops = [TapeOp("C", mid, idt, ("A", "B")), TapeOp("D", add, idt, ("C", "A"))]
    if in_dt in FLOATS and out_dt in INTS:
        # NaN to 0, then into the integer range (out of range is undefined behaviour in C)
        info = np.iinfo(odt)
        lo = TapeInput("E", idt, constant=float(max(info.min, -1000)))
        hi = TapeInput("F", idt, constant=float(min(info.max, 1000)))
        zero = TapeInput("G", idt, constant=0.0)
        cast = (("dtype", odt),)

        def into_range(src: str, k: str) -> list:
            return [TapeOp(k + "N", "NotEqual", np.dtype(bool), (src, src)),
                    TapeOp(k + "S", "Select", idt, (k + "N", "G", src)),
                    TapeOp(k + "X", "Maximum", idt, (k + "S", "E")),
                    TapeOp(k + "M", "Minimum", idt, (k + "X", "F")),
                    TapeOp(k + "Y", "AsType", odt, (k + "M",), cast)]

        ops += into_range("D", "P")
        inputs = [TapeInput("A", idt), TapeInput("B", idt), lo, hi, zero]
        outs = ["PY"]
        if n_out == 2:
            ops += into_range("A", "Q")
            outs.append("QY")
    else:
        ops.append(TapeOp("E", "AsType", odt, ("D",), (("dtype", odt),)))
        inputs = [TapeInput("A", idt), TapeInput("B", idt)]
        outs = ["E"]
        if n_out == 2:
            ops.append(TapeOp("F", "AsType", odt, ("B",), (("dtype", odt),)))
            outs.append("F")
    return make_tape(inputs, ops, outs)


def check_variant(case: tuple, phases: Optional[list] = None) -> list:
    """Failures (strings) of one case run through its variant at each output alignment phase."""
    from tapescope.kernels.codegen import layout as layout_plan
    from tapescope.kernels.codegen.interpret import interpret
    from tapescope.kernels.cpu import compiled

    in_dt, out_dt, layout, n_out, size = case
    tape = _pair_tape(in_dt, out_dt, n_out)
    rng = np.random.default_rng(size)
    if layout == "contiguous" or layout == "large":
        shape = (size,)
        a = random_values(rng, in_dt, shape)
        b = random_values(rng, in_dt, shape)
    elif layout == "strided":  # a transposed input and a broadcast row: the tiled nest
        cols = 67 if size > 67 else max(1, size)
        shape = (max(1, size // cols), cols)
        a = np.ascontiguousarray(random_values(rng, in_dt, shape[::-1])).T
        b = random_values(rng, in_dt, (1, cols))
    else:  # "rows": unit-stride rows with gaps between them (the rows stream when large)
        cols = 2 * CDialect.stream_block + 7 if size > 4 * CDialect.stream_block else max(1, min(size, 13))
        shape = (max(1, -(-size // cols)), cols)
        a = random_values(rng, in_dt, (shape[0], cols + 3))[:, 1:cols + 1]
        b = random_values(rng, in_dt, (1, cols))
    ins = [np.asarray(np.array(x.constant).astype(x.dtype)) if x.is_constant else (a if x.name == "A" else b)
           for x in tape.inputs]
    want = interpret(tape, ins, shape)
    odt = want[0].dtype
    if phases is None:
        phases = list(range(max(1, 32 // odt.itemsize)))
    fails = []
    real_large = layout_plan.use_large_index
    if layout == "large":  # the 64-bit index forms, at a size we can afford (the call's plan)
        layout_plan.use_large_index = lambda *args: True
    try:
        for phase in phases:
            n = int(np.prod(shape))
            backing = [np.zeros(n + 64, dtype=odt) for _ in range(n_out)]
            outs = [bk[phase:phase + n].reshape(shape) for bk in backing]
            if n_out == 1:
                got = compiled.run_compiled(tape, ins, shape, out=outs[0])
            else:
                got = compiled.run_compiled(tape, ins, shape)
            for k, (g, w) in enumerate(zip(got, want)):
                m = mismatches(np.ascontiguousarray(g), w)
                if m:
                    fails.append(f"{case} phase {phase} output {k}: {m} of {w.size} differ")
            if n_out == 1 and got[0] is outs[0]:
                untouched = np.concatenate([backing[0][:phase], backing[0][phase + n:]])
                if np.any(untouched.view(np.uint8) != 0):
                    fails.append(f"{case} phase {phase}: wrote outside the output")
    finally:
        layout_plan.use_large_index = real_large
    return fails


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable), 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def check_huge(n: int = 2**32 + 7) -> list:
    """The ``_large`` kernel chosen for real: ``a * 3 + 1`` over ``n`` > UINT32_MAX int8 elements
    with a period-251 pattern (2^32 is not a multiple of 251, so an index that wrapped at 32
    bits would read or write the wrong phase). Needs about 9 GiB."""
    from tapescope.kernels.codegen.layout import plan
    from tapescope.kernels.codegen.tape import TapeInput, TapeOp, make_tape
    from tapescope.kernels.cpu import compiled

    i8 = np.dtype(np.int8)
    tape = make_tape([TapeInput("A", i8), TapeInput("B", i8, constant=3), TapeInput("C", i8, constant=1)],
                     [TapeOp("D", "Multiply", i8, ("A", "B")), TapeOp("E", "Add", i8, ("D", "C"))], ["E"])
    period = (np.arange(251) - 125).astype(np.int8)
    a = np.resize(period, n)
    ins = [a, np.asarray(np.int8(3)), np.asarray(np.int8(1))]
    contiguous, _, _, large = plan(tape, ins, (n,))
    if not (contiguous and large):
        return [f"huge: plan chose contiguous={contiguous} large={large}"]
    (out,) = compiled.run_compiled(tape, ins, (n,))
    del a, ins
    with np.errstate(over="ignore"):
        want = (period * np.int8(3) + np.int8(1)).astype(np.int8)
    fails = []
    step = 251 * 2**22  # compare a few hundred MiB at a time
    for start in range(0, n, step):
        block = out[start:start + step]
        ref = np.resize(want, block.size)  # start is a multiple of 251: the same phase
        bad = int(np.count_nonzero(block != ref))
        if bad:
            fails.append(f"huge: {bad} wrong elements in [{start}, {start + block.size})")
    return fails


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-size", type=int, default=3 * 2**21)
    p.add_argument("--variants", choices=["none", "sample", "all"], default="all")
    p.add_argument("--sample", type=int, default=24, help="variant cases drawn by --variants sample")
    p.add_argument("--huge", action="store_true", help="also run a kernel over more than 2^32 elements")
    args = p.parse_args(argv)
    print(f"machine: {platform.machine()} {platform.processor() or ''} "
          f"{platform.python_implementation()} {platform.python_version()}", flush=True)
    t0 = time.perf_counter()
    bad = 0
    if args.variants != "none":
        cases = variant_cases(args.variants == "all", sample=args.sample)
        fails = []
        for c in cases:
            fails += check_variant(c)
        print(f"variants: {len(cases)} cases, {len(fails)} failing ({time.perf_counter() - t0:.0f} s)",
              flush=True)
        for f in fails[:20]:
            print("  " + f)
        bad += len(fails)
    if args.huge:
        if available_memory() < 12 * 2**30:
            print(f"huge: skipped, {available_memory() / 2**30:.1f} GiB available (needs 12)")
        else:
            th = time.perf_counter()
            fails = check_huge()
            print(f"huge: {2**32 + 7} elements through the _large kernel, {len(fails)} failing "
                  f"({time.perf_counter() - th:.0f} s)", flush=True)
            for f in fails:
                print("  " + f)
            bad += len(fails)
    t1 = time.perf_counter()
    tot = run_graphs(args.graphs, args.seed, args.max_size, log=lambda s: print(s, flush=True))
    print(f"graphs: {tot['graphs']} random compiled graphs, {tot['elements']} elements compared, "
          f"{tot['mismatches']} mismatching elements in {tot['failed_graphs']} graphs "
          f"({time.perf_counter() - t1:.0f} s)")
    for f in tot["failures"]:
        print("  " + f)
    bad += tot["mismatches"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
