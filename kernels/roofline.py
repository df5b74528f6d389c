"""The roofline of every kernel that ran: its time, the bytes it moved, its FLOPs, and how
close that comes to the machine's limits (tinygrad's ``DEBUG=2`` prints GB/s per kernel;
here each kernel is placed against the device's own copy bandwidth and peak FLOP/s).

A launch is a timeline record whose detail carries ``io`` (the layouts of the arrays it read
and wrote, ``layouts``) and the fused ``tape`` it ran, or the ``primitive`` it computed:
the CPU's ``kernel_launch`` records (the host clock around the generated C) and the GPU's
``gpu_work`` records (device time between two CUDA events on the kernel's stream,
``kernels/cuda/timing.py``).

Bytes are counted as the bytes the kernel needs, not the cache lines the memory system
moves: each input's *distinct* elements times its itemsize (an axis of stride 0, a
broadcast, is read once; a strided view reads each of its elements once, whatever the gaps
between them), scalars once, inlined constants not at all, and each output's elements
times its itemsize. A strided or transposed read therefore shows as a low fraction of the
copy bandwidth: the cache lines it wastes are the distance to the roof. FLOPs come from
each primitive's definition (``PrimitiveDef.flops``, kernels/primitives.py).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from .primitives import ASTYPE, BROADCAST, MATMUL, elements, lookup

AT_LIMIT = 0.8  # a kernel at >= 80% of the copy bandwidth is "at the limit"
SHORT_S = 50e-6  # kernels shorter than this are dominated by their launch, not by memory
SMALL_BYTES = 1 << 20  # kernels moving less than this cannot stream (caches, thread start)

# A layout: (shape, strides in bytes, itemsize, dtype name)
Layout = tuple


def layouts(arrays: Iterable[Any]) -> tuple:
    """The layouts of numpy or CuPy arrays, for a launch record's ``io``."""
    return tuple((tuple(a.shape), tuple(a.strides), a.itemsize, a.dtype.name) for a in arrays)


def touched_bytes(layout: Layout) -> int:
    """The bytes of an array's distinct elements (the module docstring's rule)."""
    shape, strides, itemsize, _ = layout
    n = 1
    for d, s in zip(shape, strides):
        if d == 0:
            return 0
        if s != 0:
            n *= d
    return n * itemsize


def access(layout: Layout, order: Optional[Layout] = None) -> str:
    """How an array is read: ``"broadcast"`` (an axis of stride 0), ``"strided"`` (gaps
    between its elements, or its axes in another order than ``order``'s, the first
    output's: a transposed read) or ``"contiguous"``."""
    shape, strides, itemsize, _ = layout
    if any(d > 1 and s == 0 for d, s in zip(shape, strides)):
        return "broadcast"
    span = itemsize + sum((d - 1) * abs(s) for d, s in zip(shape, strides) if d > 1)
    if span != touched_bytes(layout):
        return "strided"
    if order is not None and tuple(order[0]) == tuple(shape) and _axes(order) != _axes(layout):
        return "strided"
    return "contiguous"


def _axes(layout: Layout) -> tuple:
    """The axes of size > 1 from the largest stride to the smallest."""
    shape, strides = layout[0], layout[1]
    return tuple(sorted((i for i, d in enumerate(shape) if d > 1), key=lambda i: -abs(strides[i])))


def tape_flops(tape: Any, shape: Sequence[int]) -> Optional[int]:
    """The FLOPs of one run of a fused tape (kernels/codegen/tape.py) over ``shape``: each
    op's count at its value's shape (a reduction tape's row values have the row shape);
    None when an op's definition has no count."""
    full = tuple(int(s) for s in shape)
    red = tape.reduction
    shape_of = (lambda n: full) if red is None else (lambda n: red.shape_of(n, full))
    total = 0
    for op in tape.ops:
        f = lookup(op.primitive).count_flops([shape_of(i) for i in op.inputs], [shape_of(op.name)])
        if f is None:
            return None
        total += f
    return total


@dataclass
class Launch:
    """One kernel run: what it was, how long it took (seconds, the device's clock where
    there is one), the bytes it read and wrote, its FLOPs (None: not counted)."""

    name: str
    device: str
    time_s: float
    bytes_read: int
    bytes_written: int
    flops: Optional[int]
    dtype: str
    reads: tuple = ()  # access() of each input
    writes: tuple = ()  # access() of each output
    matmul: bool = False
    seq: int = 0
    label: str = ""  # what a reader recognises: the tape's ops and the variant
    fresh_output: bool = False  # its output was new host memory (first touch: page faults)

    @property
    def title(self) -> str:
        return self.label or self.name

    @property
    def nbytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.time_s if self.time_s > 0 else 0.0

    @property
    def flops_per_s(self) -> Optional[float]:
        return None if self.flops is None or self.time_s <= 0 else self.flops / self.time_s

    @property
    def intensity(self) -> Optional[float]:
        """FLOPs per byte moved."""
        return None if self.flops is None or not self.nbytes else self.flops / self.nbytes


def launch_of(record: Any) -> Optional[Launch]:
    """The Launch of a timeline record, or None when it is not a kernel run with its layouts
    (or its time was not measured)."""
    d = record.detail
    io = d.get("io") if d else None
    if io is None:
        return None
    ins, outs = io
    if "device_time_ms" in d:
        t = d["device_time_ms"] * 1e-3
    else:
        t = (record.end_ns - record.start_ns) * 1e-9
    if t <= 0:
        return None
    tape = d.get("tape")
    if tape is not None and len(ins) == len(tape.inputs):  # inlined constants are not read
        ins = [x for x, t in zip(ins, tape.inputs) if not t.is_constant]
    if tape is not None:
        shape = d.get("shape") or (outs[0][0] if outs else ())
        flops = tape_flops(tape, shape)
        name = d.get("kernel") or record.name
        matmul = False
        ops = [op.primitive for op in tape.ops
               if lookup(op.primitive).family not in (BROADCAST, ASTYPE)]  # no work of its own
        label = " ".join(ops) + (f" [{d['variant']}]" if d.get("variant") else "")
    else:
        defn = lookup(d.get("primitive") or record.name)
        if defn.view:  # a view computes and moves nothing
            return None
        flops = defn.count_flops([x[0] for x in ins], [x[0] for x in outs])
        name = label = record.name
        matmul = defn.family == MATMUL
    return Launch(name, record.device or "cpu", t, sum(touched_bytes(x) for x in ins),
                  sum(touched_bytes(x) for x in outs), flops, outs[0][3] if outs else "",
                  tuple(access(x, outs[0] if outs else None) for x in ins),
                  tuple(access(x) for x in outs), matmul, record.seq, label)


def launches(records: Iterable[Any]) -> list:
    """Every kernel run among ``records`` (oldest first). A CPU kernel whose output buffer
    was newly allocated just before it (an ``alloc`` record, not a ``cache_reuse``, on its
    thread) is marked ``fresh_output``: its first touch of that memory page-faults."""
    out, fresh = [], {}
    for r in records:
        if r.kind == "alloc" and r.device == "cpu":
            fresh.setdefault(r.thread, []).append(r.nbytes)
            continue
        x = launch_of(r)
        if x is None:
            continue
        new = fresh.pop(r.thread, ())
        x.fresh_output = x.device == "cpu" and x.bytes_written >= SMALL_BYTES and any(
            n >= x.bytes_written for n in new)
        out.append(x)
    return out


@dataclass(frozen=True)
class Machine:
    """A device's limits: its copy bandwidth (bytes/s, measured: a copy reads and writes
    each byte once, so it moves 2 x its size) and its peak FLOP/s per dtype, vector units
    (CUDA cores) and tensor cores kept apart; ``how`` says where each figure came from."""

    device: str
    name: str
    copy_bytes_per_s: float
    peaks: dict = field(default_factory=dict)  # dtype name -> (vector FLOP/s, tensor FLOP/s | None)
    how: str = ""
    note: str = ""  # what a reader should know about the ceiling

    def peak(self, dtype: str, tensor: bool = False) -> Optional[float]:
        """Peak FLOP/s of ``dtype`` (float32's for a dtype the table lacks)."""
        p = self.peaks.get(dtype) or self.peaks.get("float32")
        if p is None:
            return None
        return p[1] if tensor and p[1] else p[0]


@functools.lru_cache(maxsize=None)
def machine(device: str) -> Optional[Machine]:
    """The limits of device type ``device`` ("cpu", "gpu"), measured once per process, the
    first time they are asked for (never at import); None where its runtime has none."""
    from .backends import backend

    try:
        be = backend(device)
    except RuntimeError:
        return None
    return be.machine()


@dataclass
class Placed:
    """A kernel (its launches of one size) on its device's roofline."""

    launch: Launch  # the median-time launch
    launches: int
    machine: Optional[Machine]

    @property
    def bandwidth_fraction(self) -> Optional[float]:
        m = self.machine
        return self.launch.bytes_per_s / m.copy_bytes_per_s if m and m.copy_bytes_per_s else None

    @property
    def peak(self) -> Optional[float]:
        m = self.machine
        return m.peak(self.launch.dtype, tensor=self.launch.matmul) if m else None

    @property
    def peak_fraction(self) -> Optional[float]:
        f, p = self.launch.flops_per_s, self.peak
        return f / p if f is not None and p else None

    @property
    def streams(self) -> bool:
        """Whether the kernel is large enough to stream (else its launch dominates)."""
        return self.launch.time_s >= SHORT_S and self.launch.nbytes >= SMALL_BYTES

    @property
    def why(self) -> str:
        """Why a kernel is far from the copy bandwidth, read from its layouts and time
        ("" when it is at the limit)."""
        frac = self.bandwidth_fraction
        if frac is None or frac >= AT_LIMIT:
            return ""
        x = self.launch
        if self.peak_fraction is not None and self.peak_fraction >= 0.5:
            return "compute-bound"
        if not self.streams:
            return "too small to stream (its launch dominates)"
        if x.fresh_output:
            return ("its output was new memory each run (page faults on first touch): the "
                    "buffer cache kept none of its size (mx.set_cache_limit)")
        if "strided" in x.reads:
            return "a strided read"
        if "strided" in x.writes:
            return "a strided write"
        if "broadcast" in x.reads:
            return "a broadcast read"
        return "below the copy bandwidth (no layout reason: other work may share the memory)"


def place(records: Iterable[Any]) -> list:
    """One Placed per kernel and size among ``records``: its median-time launch (of those
    that reused an output buffer, when some did: a first call writes new memory), in the
    order the kernels first ran."""
    groups: dict = {}
    for x in launches(records):
        groups.setdefault((x.name, x.device, x.nbytes, x.reads), []).append(x)
    out = []
    for (_, device, _, _), xs in groups.items():
        steady = [x for x in xs if not x.fresh_output] or xs  # first calls write new memory
        mid = sorted(steady, key=lambda x: x.time_s)[len(steady) // 2]
        out.append(Placed(mid, len(xs), machine(device)))
    return out


def summary(placed: Sequence[Placed]) -> str:
    """One line: how many kernels are at the copy bandwidth, and the others with why
    ("4 kernels at >= 80% of copy bandwidth; 1 at 12%: a strided read")."""
    fr = [(p, p.bandwidth_fraction) for p in placed]
    fr = [(p, f) for p, f in fr if f is not None]
    if not fr:
        return ""
    at = sum(1 for _, f in fr if f >= AT_LIMIT)
    parts = [f"{at} kernel{'s' if at != 1 else ''} at >= {AT_LIMIT:.0%} of copy bandwidth"]
    below: dict = {}
    for p, f in sorted(fr, key=lambda pf: pf[1]):
        if f < AT_LIMIT:
            below.setdefault(p.why, []).append(f)
    for why, fs in below.items():
        pct = f"{statistics.median(fs):.0%}" if len(fs) == 1 else f"{min(fs):.0%}-{max(fs):.0%}"
        parts.append(f"{len(fs)} at {pct}: {why}")
    return "; ".join(parts)


def kernel_rows(records: Iterable[Any]) -> dict:
    """Kernel name -> its Placed (the most launched size), for ``kernel_cache()``."""
    out: dict = {}
    for p in place(records):
        k = p.launch.name
        if k not in out or p.launches > out[k].launches:
            out[k] = p
    return out
