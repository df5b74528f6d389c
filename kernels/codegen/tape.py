"""The tape IR that ``compile`` hands down: plain data, and its kernel name in MLX's grammar.

A tape is a fused chain of elementwise primitives (MLX's ``Compiled``): its inputs (arrays,
scalars, or constants inlined as literals), its operations in topological order (inputs
excluded, outputs included) and which of them are outputs. Everything here is plain
Python data (strings, tuples, numbers) so every runtime can read it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import ml_dtypes
import numpy as np

from ..primitives import BROADCAST, REGISTRY

# MLX's fusion limits (mlx/compile.cpp): depth of the fused sub-graph, arrays per kernel.
MAX_COMPILE_DEPTH = 11
MAX_COMPILE_ARRAYS = 24

_BF16 = np.dtype(ml_dtypes.bfloat16)


def kindof(dtype: np.dtype) -> str:
    """MLX's one-letter dtype kind: b, u, i, f (float16/32/64), V (bfloat16), c."""
    dtype = np.dtype(dtype)
    if dtype == _BF16:
        return "V"
    return {"b": "b", "u": "u", "i": "i", "f": "f", "c": "c"}[dtype.kind]


def dtype_code(dtype: np.dtype) -> str:
    """kind letter + itemsize, as the kernel name spells a dtype (``f4``, ``V2``, ``b1``)."""
    dtype = np.dtype(dtype)
    return f"{kindof(dtype)}{dtype.itemsize}"


def node_name(i: int) -> str:
    """The i-th name (from 0) of MLX's NodeNamer: A, B, ..., Z, AA, AB, ..."""
    letters = []
    n = i + 1
    while n > 0:
        letters.append(chr(ord("A") + (n - 1) % 26))
        n = (n - 1) // 26
    return "".join(reversed(letters))


def print_constant(value: Any, dtype: np.dtype) -> str:
    """A constant's value as text that parses back to exactly the same value.

    MLX prints floats with 7 significant digits, which does not round-trip every float32;
    here floats print in their shortest round-trip form (``repr`` of the value in its own
    precision), so equal strings mean equal constants.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return "true" if bool(value) else "false"
    if dtype.kind in "iu":
        return str(int(value))
    if dtype.kind == "c":
        c = complex(value)
        return f"complex64_t({_float_text(c.real, np.float32)}, {_float_text(c.imag, np.float32)})"
    return _float_text(float(value), np.float64 if dtype == np.float64 else np.float32)


def _float_text(v: float, dtype) -> str:
    """Shortest text that round-trips ``v`` in ``dtype`` (float32 or float64)."""
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v)) if np.dtype(dtype) == np.float64 else str(np.float32(v))


def stable_hash(text: str) -> str:
    """A hash of ``text`` that is the same in every process (MLX uses ``std::hash``)."""
    return str(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little"))


@dataclass(frozen=True)
class TapeInput:
    """One input of a tape: an array (``V``), a 0-d array (``S``) or an inlined constant (``C``).
    ``by_value``: a scalar that a GPU dialect takes as a kernel parameter's value rather than
    a pointer (an eager op's Python scalar, which stays on the host: no upload)."""

    name: str
    dtype: np.dtype
    scalar: bool = False
    constant: Optional[Any] = None  # the Python value when the input is a constant
    by_value: bool = False

    @property
    def is_constant(self) -> bool:
        return self.constant is not None

    @property
    def signature(self) -> str:
        return "C" if self.is_constant else ("S" if self.scalar else "V")


@dataclass(frozen=True)
class TapeOp:
    """One fused operation: ``name = primitive(*inputs)`` producing ``dtype``."""

    name: str
    primitive: str
    dtype: np.dtype
    inputs: tuple
    params: tuple = ()


@dataclass(frozen=True)
class Reduction:
    """What makes a tape a fused reduction (tapescope's extended fusion, not MLX's): the
    reduced axes are the last ``naxes`` (``mode="last"``) or the first (``"first"``) of the
    kernel's full shape, and ``rows`` names the tape values (inputs and ops) that are
    constant along them (one value per kept index: reductions' results and what is computed
    from them alone); every other value varies over the full shape."""

    mode: str  # "last" or "first"
    naxes: int
    rows: frozenset

    def shape_of(self, name: str, full: Sequence[int]) -> tuple:
        """The shape of value ``name`` when the kernel's full shape is ``full``."""
        full = tuple(full)
        if name not in self.rows:
            return full
        k = self.naxes
        return ((1,) * k + full[k:]) if self.mode == "first" else (full[:len(full) - k] + (1,) * k)

    def split(self, full: Sequence[int]) -> tuple:
        """(rows, cols): the number of kept indices and of reduced elements per kept index."""
        full = tuple(int(s) for s in full)
        k = self.naxes
        red = full[:k] if self.mode == "first" else full[len(full) - k:]
        kept = full[k:] if self.mode == "first" else full[:len(full) - k]
        return int(np.prod(kept, dtype=np.int64)), int(np.prod(red, dtype=np.int64))

    def name_part(self, inputs: Sequence["TapeInput"], ops: Sequence["TapeOp"]) -> str:
        """The kernel-name section of a reduction tape: ``R``, the mode letter, r/f per input
        and op (row or full), and a hash of the ops' parameters (axes, argmax or argmin)."""
        cls = "".join("r" if x.name in self.rows else "f" for x in (*inputs, *ops))
        params = ";".join(f"{op.name}{sorted(dict(op.params).items())}" for op in ops if op.params
                          and REGISTRY[op.primitive].family != BROADCAST)
        return f"_R{self.mode[0].upper()}{self.naxes}{cls}_{stable_hash(params)}"


@dataclass(frozen=True)
class Tape:
    """A fused chain: inputs, operations (topological) and output names. ``reduction`` is
    set on tapes that fuse reductions with their elementwise neighbours (extended fusion)."""

    inputs: tuple
    ops: tuple
    outputs: tuple
    lib_name: str = field(default="", compare=False)
    # per-runtime call plans keyed by layouts (filled by the runtime; not part of the value)
    launches: dict = field(default_factory=dict, compare=False, repr=False)
    reduction: Optional[Reduction] = None

    @property
    def non_constant_inputs(self) -> list:
        return [x for x in self.inputs if not x.is_constant]

    @property
    def constants(self) -> list:
        return [x for x in self.inputs if x.is_constant]

    def dtype_of(self, name: str) -> np.dtype:
        for x in self.inputs:
            if x.name == name:
                return x.dtype
        for op in self.ops:
            if op.name == name:
                return op.dtype
        raise KeyError(name)


def lib_name(inputs: Sequence[TapeInput], ops: Sequence[TapeOp]) -> str:
    """MLX's kernel library name for a tape (``Compiled`` constructor's ``kernel_lib_``).

    Per op: name, kind, itemsize, primitive, input names; then ``_`` and C/S/V per input;
    ``_`` and kind+itemsize of each non-constant input (the section upstream v0.26.1 lost to
    a use-after-move, kept here); ``_`` and a stable hash of the constants' printed values.
    """
    parts = []
    for op in ops:
        parts.append(f"{op.name}{dtype_code(op.dtype)}{op.primitive}{''.join(op.inputs)}")
    sig = "".join(x.signature for x in inputs)
    dts = "".join(dtype_code(x.dtype) for x in inputs if not x.is_constant)
    consts = "".join(print_constant(x.constant, x.dtype) for x in inputs if x.is_constant)
    return "".join(parts) + "_" + sig + "_" + dts + "_" + stable_hash(consts)


def make_tape(inputs: Sequence[TapeInput], ops: Sequence[TapeOp], outputs: Sequence[str],
              reduction: Optional[Reduction] = None) -> Tape:
    """Build a tape and its kernel library name (a reduction tape's name has its own section,
    so it never collides with MLX's names)."""
    inputs, ops = tuple(inputs), tuple(ops)
    name = lib_name(inputs, ops)
    if reduction is not None:
        name += reduction.name_part(inputs, ops)
    return Tape(inputs, ops, tuple(outputs), name, reduction=reduction)


def variant_name(lib: str, contiguous: bool, ndim: int, large: bool) -> str:
    """The kernel symbol of one variant: ``_contiguous`` or ``_strided_<ndim>``, plus ``_large``."""
    name = lib + ("_contiguous" if contiguous else f"_strided_{ndim}")
    return name + "_large" if large else name


_one_op: dict = {}  # (primitive, input dtypes, output dtype, scalars, params, by_value, name) -> tape


def one_op_tape(prim: str, in_dtypes: Sequence, out_dtype: Any, scalars: Sequence[bool],
                params: tuple = (), by_value: Sequence[bool] = (),
                name: Optional[str] = None) -> Tape:
    """The one-op tape of an eager elementwise primitive, as MLX's backends run one unary /
    binary / ternary kernel per op and types (mlx/backend/cpu/binary.h, cuda/binary.cu):
    inputs ``A``, ``B``, ... (``scalars``: a 0-d input, read once; ``by_value``: one a GPU
    dialect takes as a parameter's value), the op writing the next name. Its kernel name is
    MLX's for that tape (``make_tape``) unless ``name`` is given."""
    by_value = tuple(bool(v) for v in by_value) or (False,) * len(in_dtypes)
    key = (prim, tuple(np.dtype(d).str for d in in_dtypes), np.dtype(out_dtype).str,
           tuple(bool(s) for s in scalars), tuple(params), by_value, name)
    tape = _one_op.get(key)
    if tape is None:
        names = [node_name(i) for i in range(len(in_dtypes))]
        inputs = tuple(TapeInput(n, np.dtype(dt), scalar=bool(s) or v, by_value=v)
                       for n, dt, s, v in zip(names, in_dtypes, scalars, by_value))
        ops = (TapeOp(node_name(len(in_dtypes)), prim, np.dtype(out_dtype), tuple(names),
                      tuple(params)),)
        tape = make_tape(inputs, ops, (ops[0].name,))
        if name is not None:
            tape = Tape(tape.inputs, tape.ops, tape.outputs, name)
        _one_op[key] = tape
    return tape
