"""Run a fused tape on the CPU: pick the variant, get the kernel, allocate, call.

Mirrors MLX's ``Compiled::eval_cpu``: contiguity check and dim collapse choose the
``_contiguous`` or ``_strided_<ndim>`` kernel (``_large`` past UINT32_MAX elements); outputs
take a donated input buffer where MLX's rules allow it, else fresh memory; the arguments go
to ``void <name>(void** args)``. Without a compiler, or when a build fails or the C dialect
cannot spell an op, the tape runs interpreted with numpy and the timeline says why; so
does a first call with tiering on (``tiered.py``) while its kernel builds in the background.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Optional, Sequence

import numpy as np

from .. import timeline
from ..kernel_call import PlanLookup, kernel_call
from ..roofline import layouts
from ..codegen.interpret import interpret, interpret_blocked
from ..codegen.layout import (
    check_contiguity, is_col_contiguous, is_row_contiguous, output_order, plan, row_strides,
)
from ..codegen.render import CDialect, Unsupported
from ..codegen.tape import Tape, variant_name
from . import compiler, tiered


def allocate_outputs(tape: Tape, inputs: Sequence[np.ndarray], shape: Sequence[int],
                     contiguous: bool, donatable: Optional[Sequence[bool]] = None) -> list:
    """Output arrays, reusing donated input buffers by MLX's Compiled rules.

    An input may give its buffer to the next output when the caller marks it donatable
    (nobody else holds it), it is not a constant and not a scalar, and the itemsizes match;
    on the strided path it must also be row-contiguous with the output's size. Outputs
    without a donor follow the layout of the first input of the output's size (so
    column-major inputs give column-major outputs) on the contiguous path, else row-major.
    """
    shape = tuple(int(s) for s in shape)
    size = int(np.prod(shape, dtype=np.int64))
    dts = [np.dtype(tape.dtype_of(n)) for n in tape.outputs]
    outs: list = []
    rep = None
    for i, (x, a) in enumerate(zip(tape.inputs, inputs)):
        if x.is_constant:
            continue
        if rep is None and a.size == size:
            rep = a
        if len(outs) >= len(dts) or not donatable or not donatable[i] or a.ndim == 0:
            continue
        if a.dtype.itemsize != dts[len(outs)].itemsize or not a.flags.writeable:
            continue
        if contiguous or (is_row_contiguous(a) and a.size == size):
            outs.append(a.view(dts[len(outs)]).reshape(shape) if not contiguous else a.view(dts[len(outs)]))
    order = "F" if (contiguous and rep is not None and rep.ndim > 1 and is_col_contiguous(rep)
                    and not is_row_contiguous(rep)) else "C"
    for dt in dts[len(outs):]:
        outs.append(np.empty(shape, dtype=dt, order=order))
    return outs


def _source(tape: Tape, name: str, contiguous: bool, ndim: int, large: bool,
            vector_math: tuple = ()) -> str:
    return CDialect(vector_math=vector_math).render(tape, name, contiguous, ndim, large)


_unsupported: dict = {}


def _fits(out: np.ndarray, tape: Tape, inputs: Sequence[np.ndarray], shape: tuple,
          contiguous: bool) -> bool:
    """Can the kernel write its single output straight into ``out``?"""
    if len(tape.outputs) != 1 or tuple(out.shape) != shape or not out.flags.writeable:
        return False
    if out.dtype != np.dtype(tape.dtype_of(tape.outputs[0])):
        return False
    if not contiguous or out.ndim <= 1:
        return bool(out.flags.c_contiguous)
    size = int(np.prod(shape, dtype=np.int64))
    rep = next((a for x, a in zip(tape.inputs, inputs) if not x.is_constant and a.size == size), None)
    if rep is not None and not is_row_contiguous(rep):
        return bool(out.flags.f_contiguous)
    return bool(out.flags.c_contiguous)


def _data_pointer_reader():
    """The fastest way this interpreter offers to read an ndarray's data pointer.

    CPython lays a numpy array out as ``PyObject_HEAD`` then ``char* data``; reading that
    word directly costs a fraction of ``a.ctypes.data``. It is used only after checking,
    on arrays of several kinds, that it agrees with ``a.ctypes.data``.
    """
    off = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
    at = ctypes.c_void_p.from_address

    nd = np.ndarray

    def fast(a) -> int:
        if a.__class__ is not nd and not isinstance(a, nd):
            raise TypeError(f"compiled kernels take numpy arrays, got {type(a).__name__}")
        return at(id(a) + off).value or 0

    try:
        probes = [np.arange(7, dtype=np.float32), np.ones((3, 4), np.float64)[1:, ::2],
                  np.zeros((), np.int8), np.ones((4, 5), np.int16).T]
        if all(fast(a) == a.ctypes.data for a in probes):
            return fast
    except Exception:  # noqa: BLE001 - any surprise: the portable way
        pass
    return lambda a: a.ctypes.data


_ptr = _data_pointer_reader()
_MAX_ARGV = 64  # a KernelCall's argument vector at most (kernels/_kernel_call.c: MAX_ARGV)


class Launch:
    """Everything about one kernel call that depends only on the tape and the layouts.

    Keyed by the output shape and every input's (shape, strides): the variant, the kernel,
    the stride and shape arrays, where pointers go in ``argv``, and whether a single output
    offered by the caller (``out``) can be written directly.
    """

    __slots__ = ("entry", "gen", "fn", "name", "variant", "contiguous", "n_args", "slots",
                 "tail", "keep", "argv_type", "argvs", "dtypes", "order", "shape",
                 "out_strides", "kernel_call", "n_outs")

    def __init__(self, tape: Tape, inputs: Sequence[np.ndarray], shape: tuple, entry,
                 contiguous: bool, cshape: list, strides: list, name: str, variant: str):
        self.entry, self.gen, self.name, self.variant = entry, compiler.generation(), name, variant
        self.contiguous, self.shape = contiguous, shape
        size = int(np.prod(shape, dtype=np.int64))
        # below the OpenMP threshold the kernel runs with the GIL held (no release/acquire)
        self.fn = entry.fast_fn(gil=size < CDialect.omp_min_size)
        slots, ptrs, keep = [], [], []
        k = 0
        for i, (x, a) in enumerate(zip(tape.inputs, inputs)):
            if x.is_constant:
                continue
            slots.append((i, len(ptrs)))
            ptrs.append(0)
            if not contiguous and not x.scalar:
                st = np.asarray(strides[k], dtype=np.int64)
                k += 1
                keep.append(st)
                ptrs.append(st.ctypes.data)
        self.n_args = len(ptrs)
        outs = len(tape.outputs)
        if contiguous:
            tail = [size]
        else:
            sh = np.asarray(cshape, dtype=np.int32)
            keep.append(sh)
            tail = [sh.ctypes.data]
        self.slots, self.keep = tuple(slots), keep
        self.tail = ptrs, outs, tail
        self.argv_type = ctypes.c_void_p * (len(ptrs) + outs + len(tail))
        self.argvs: dict = {}  # thread id -> its own argv (the kernel may run without the GIL)
        self.dtypes = [np.dtype(tape.dtype_of(n)) for n in tape.outputs]
        self.order = output_order(tape, inputs, shape, contiguous)
        # the one layout a caller's ``out`` must have for the kernel to write it directly
        self.out_strides = _strides(shape, self.dtypes[0].itemsize, self.order) if outs == 1 else None
        # the call as a KernelCall (the tape's inputs, then each output): ``call`` runs it,
        # and the eval loop calls a single output's without Python code on an ``out`` of its
        # layout (``takes``' test); its out_strides are None for several outputs (the loop
        # leaves those to ``run_compiled``)
        where = dict(slots)
        self.kernel_call = None if len(ptrs) + outs + len(tail) > _MAX_ARGV else kernel_call(
            entry, [*ptrs, *([0] * outs), *tail],
            (*[where.get(i, -1) for i in range(len(tape.inputs))],
             *range(self.n_args, self.n_args + outs)),
            keep, size < CDialect.omp_min_size, self._note, shape, self.dtypes[0],
            self.out_strides)
        self.n_outs = outs

    def _note(self, t0: int, t1: int, arrays: tuple) -> None:
        """The kernel_call's timeline records: the cache hit and the launch (as ``call``)."""
        compiler._record("kernel_build", t0, self.name, hit=True, origin="memory",
                         runtime="cpu", variant=self.variant, compile_ms=0.0)
        timeline.add("kernel_launch", t0, t1, name=self.name, device="cpu",
                     detail={"runtime": "cpu", "variant": self.variant, "tier": "kernel",
                             "tape": self.entry.tape, "shape": self.shape,
                             "io": (layouts(arrays[:-self.n_outs]),
                                    layouts(arrays[-self.n_outs:]))})

    @property
    def out_shape(self) -> tuple:
        """The shape of what the kernel writes (the eval loop checks a plan by it)."""
        return self.shape

    @property
    def out_dtype(self):
        """The dtype of its single output (None for several)."""
        return self.dtypes[0] if self.n_outs == 1 else None

    def takes(self, out: np.ndarray) -> bool:
        """Whether the kernel writes its single output straight into ``out``."""
        return (out.strides == self.out_strides and out.shape == self.shape
                and out.dtype == self.dtypes[0] and out.flags.writeable)

    def call(self, inputs: Sequence[np.ndarray], outs: Sequence[np.ndarray],
             hit: bool = True) -> None:
        """Run the kernel on these arrays (of the layouts this plan was made for); ``hit``:
        count the call as a hit of the in-memory kernel cache (a hit runs the plan's
        ``kernel_call``: its argument vector filled in C, its timeline records its own)."""
        if hit and self.kernel_call is not None and len(outs) == self.n_outs:
            self.kernel_call(*inputs, *outs)
            return
        if hit:
            self.entry.hits += 1
            if timeline.enabled:
                compiler.record_hit(self.name, self.variant)
        tid = threading.get_ident()
        argv = self.argvs.get(tid) or self.argv()
        for i, j in self.slots:
            argv[j] = _ptr(inputs[i])
        j = self.n_args
        for o in outs:
            argv[j] = _ptr(o)
            j += 1
        if timeline.enabled:
            t0 = timeline.now()
            self.fn(argv)
            timeline.add("kernel_launch", t0, timeline.now(), name=self.name, device="cpu",
                         detail={"runtime": "cpu", "variant": self.variant, "tier": "kernel",
                                 "tape": self.entry.tape, "shape": self.shape,
                                 "io": (layouts(inputs), layouts(outs))})
        else:
            self.fn(argv)

    def argv(self) -> ctypes.Array:
        """This thread's argument vector, with the constant parts filled in."""
        tid = threading.get_ident()
        av = self.argvs.get(tid)
        if av is None:
            ptrs, outs, tail = self.tail
            av = self.argvs[tid] = self.argv_type(*ptrs, *([0] * outs), *tail)
        return av


def _strides(shape: tuple, itemsize: int, order: str) -> tuple:
    """numpy's strides of a new array of ``shape`` in ``order`` ("C" or "F"), without making
    one (a plan of a huge broadcast must not allocate its output to learn them)."""
    st, acc = [], itemsize
    for s in (reversed(shape) if order == "C" else shape):
        st.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(st)) if order == "C" else tuple(st)


def _spec(tape: Tape, inputs: Sequence, shape: tuple) -> tuple:
    """``(plan, name, variant, key, source function, reason)`` of the kernel a call with
    these input layouts (arrays or ``codegen.layout.Layout``) runs; ``reason``: why the C
    dialect cannot express the tape (None when it can)."""
    contiguous, cshape, strides, large = p = plan(tape, inputs, shape)
    ndim = len(cshape)
    name = variant_name(tape.lib_name, contiguous, ndim, large)
    variant = name[len(tape.lib_name) + 1:]
    if tape.lib_name not in _unsupported:
        try:
            CDialect().render(tape, name, contiguous, ndim, large)
            _unsupported[tape.lib_name] = None
        except Unsupported as e:
            _unsupported[tape.lib_name] = f"the C dialect cannot express it: {e}"
    key = name if tape.outputs == (tape.ops[-1].name,) else name + "|" + ",".join(tape.outputs)

    def source(tc):
        return _source(tape, name, contiguous, ndim, large, tc.vector_math)

    return p, name, variant, key, source, _unsupported[tape.lib_name]


def _prepare(tape: Tape, inputs: Sequence[np.ndarray], shape: tuple) -> object:
    """A Launch for these layouts, or the BuildError explaining why the tape runs in numpy."""
    (contiguous, cshape, strides, _), name, variant, key, source, reason = _spec(
        tape, inputs, shape)
    try:
        if reason:
            raise compiler.BuildError(reason)
        if tiered.tiered() and compiler.loaded(key) is None and compiler.failed(key) is None:
            # tiered: load it if it is on disk (once the toolchain is known), else build it
            # in the background and run this call interpreted (while it builds, at once:
            # the build holds the kernel's lock)
            if tiered.building(key):
                return _BUILDING, name, variant, key
            entry = compiler.get_kernel(name, variant, source, key=key, tape=tape,
                                        build=False) if compiler.probed() else None
            if entry is None:
                tiered.start(key, lambda: compiler.get_kernel(name, variant, source, key=key,
                                                              tape=tape))
                return _BUILDING, name, variant, key
        else:
            entry = compiler.get_kernel(name, variant, source, key=key, tape=tape)
    except compiler.BuildError as e:
        return e, name, variant, None
    return Launch(tape, inputs, shape, entry, contiguous, cshape, strides, name, variant)


def prebuild(batch: Sequence[tuple]) -> int:
    """Start building, in parallel on background threads, the kernels of a batch of fused
    calls about to run (``(tape, input layouts, shape)`` each; the layouts: arrays or
    predicted ``Layout``s, or a function giving them, or None) that are neither loaded,
    failed nor building; the calls then wait only for their own kernel. A tape that has run
    before is skipped at once (its variants build when met). Nothing starts for fewer than
    two. Returns how many started."""
    todo = []
    for tape, layouts, shape in batch:
        if (len(tape.launches) > 1 or tape.lib_name in _unsupported and _unsupported[tape.lib_name]
                or getattr(tape, "reduction", None) is not None or 0 in tuple(shape)):
            continue
        if callable(layouts):
            layouts = layouts()
        if layouts is None:
            continue
        _, name, variant, key, source, reason = _spec(tape, layouts, tuple(int(s) for s in shape))
        if (not reason and compiler.loaded(key) is None and compiler.failed(key) is None
                and not tiered.building(key) and all(key != t[2] for t in todo)):
            todo.append((name, variant, key, source, tape))
    if len(todo) < 2:
        return 0
    for name, variant, key, source, tape in todo:
        tiered.start(key, functools.partial(compiler.get_kernel, name, variant, source,
                                            key=key, tape=tape))
    return len(todo)


_BUILDING = object()  # _prepare's answer while the kernel builds in the background


def kernel_for(tape: Tape, inputs: Sequence[np.ndarray], shape: tuple) -> Optional[Launch]:
    """The plan of ``tape`` for these input layouts with its kernel loaded (built on a miss,
    as ``run_compiled`` builds; with tiered first calls on, ``tiered.start`` builds it in the
    background and the answer is None until it is loaded), or None where it cannot be built
    (the C dialect cannot spell the tape, or its build failed). Eager one-op kernels come
    through here (``cpu/eager.py``): on None their caller's rule runs."""
    arrays = tape.launches.get(None)
    if arrays is None:
        arrays = tape.launches[None] = tuple(i for i, x in enumerate(tape.inputs) if not x.is_constant)
    lkey = (shape, *[(inputs[i].shape, inputs[i].strides) for i in arrays])
    ln = tape.launches.get(lkey)
    if ln is not None and ln.gen == compiler._generation[0]:
        return ln
    (contiguous, cshape, strides, _), name, variant, key, source, reason = _spec(tape, inputs, shape)
    if reason or compiler.failed(key) is not None:
        return None
    entry = compiler.loaded(key)
    if entry is None and not tiered.tiered():
        try:
            entry = compiler.get_kernel(name, variant, source, key=key, tape=tape)
        except compiler.BuildError:
            return None
    if entry is None and compiler.probed() and not tiered.building(key):
        entry = compiler.get_kernel(name, variant, source, key=key, tape=tape, build=False)
    if entry is None:
        tiered.start(key, functools.partial(compiler.get_kernel, name, variant, source, key=key,
                                            tape=tape))
        return None
    ln = tape.launches[lkey] = Launch(tape, inputs, shape, entry, contiguous, cshape, strides,
                                      name, variant)
    return ln


def run_compiled(tape: Tape, inputs: Sequence[np.ndarray], shape: Sequence[int],
                 donatable: Optional[Sequence[bool]] = None,
                 out: Optional[np.ndarray] = None) -> list:
    """The outputs of ``tape`` on ``inputs`` (numpy arrays, constants included by position).

    ``out``: memory the caller offers for a single output (a donated input's buffer or an
    allocator buffer); used when its layout is the one the kernel writes.

    The first call for a set of layouts plans the variant and gets the kernel (building
    it on a miss); later calls with the same layouts reuse that plan (a ``Launch``) and only
    fill in the data pointers.
    """
    shape = tuple(shape)
    arrays = tape.launches.get(None)  # positions of the non-constant inputs
    if arrays is None:
        arrays = tape.launches[None] = tuple(i for i, x in enumerate(tape.inputs) if not x.is_constant)
    key = (shape, *[(inputs[i].shape, inputs[i].strides) for i in arrays])
    launches = tape.launches
    ln = launches.get(key)
    if ln is None or ln.gen != compiler._generation[0]:
        if tape.reduction is not None:  # extended fusion's reduction tape: the C reduction kernels
            from .reduction import run_reduction

            return run_reduction(tape, inputs, shape, out=out)
        shape = tuple(int(s) for s in shape)
        if any(s == 0 for s in shape):
            return [np.empty(shape, dtype=tape.dtype_of(n)) for n in tape.outputs]
        ln = _prepare(tape, inputs, shape)
        if isinstance(ln, tuple):  # no kernel: interpret with numpy (not cached: says why each time)
            err, name, variant, key = ln
            t0 = timeline.now() if timeline.enabled else 0
            if err is _BUILDING:
                reason, tier = tiered.BUILDING, "interpreted"
                compiler.note_interpreted(key, name, variant, reason, tape=tape)
            else:
                reason, tier = str(err), "fallback"
                compiler.note_fallback(name, variant, "", reason, tape=tape)
            outs = interpret_blocked(tape, inputs, shape)
            if t0:
                timeline.add("kernel_fallback", t0, timeline.now(), name=name, device="cpu",
                             detail={"reason": reason, "runtime": "numpy", "variant": variant,
                                     "tier": tier})
            return outs
        launches[key] = ln
        hit = False  # this call got (or built) the kernel: counted by ``get_kernel``
    else:
        hit = True
    if out is not None and ln.takes(out):
        outs = [out]
    elif out is not None and _fits(out, tape, inputs, ln.shape, ln.contiguous):
        outs = [out]
    else:
        outs = allocate_outputs(tape, inputs, ln.shape, ln.contiguous, donatable)
    ln.call(inputs, outs, hit)
    return outs


# launch_for(tape, inputs, shape): the call plan ``run_compiled`` made for these layouts
# (its kernel loaded; the key ``run_compiled`` files it under), or None. The eval loop asks
# it before a fused call, then gives the output buffer itself and calls the plan's
# KernelCall (``run_compiled`` does everything else). A PlanLookup: in C where built.
launch_for = PlanLookup(None, compiler._generation)
