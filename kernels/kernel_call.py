"""A generated kernel's call planned once per layout: ``KernelCall`` and ``KernelRule``.

A primitive's generated kernel (a reduction, a normalisation, RoPE) takes its arrays'
layouts through integer arguments and a few constant buffers. Working those out (the
layout's plan, the kernel's entry, the argument vector) is the same for every call with
the same input types, dtypes, shapes, strides and parameters, so a ``KernelRule`` makes it
once per such key: a ``KernelCall`` holding the kernel's function and its argument vector,
into which a call puts only its arrays' data pointers. The eval loop (``core/_loop.c``)
finds a node's plan under the same key and calls it without Python code; the rule
itself (the evaluator's Python path, a direct call) runs the same plan. A key whose call no
plan takes (a copy first, a fallback, a failed build) maps to None: the rule's ``slow``
path runs it, as before. ``forget()`` drops every plan (the kernel cache was cleared). A
fused call's launch plan (``cpu/compiled.py``: ``Launch``) carries a ``KernelCall`` of its
single-output call too, which the loop calls on an output of the layout it writes.

``KernelCall`` is ``_kernel_call.c``'s type where the extension is built, else the Python
class below (the same arguments and behaviour, through ctypes). So is ``PlanLookup``: how a
backend finds a fused call's launch plan by its layouts (its ``compiled_launch``, asked by
the eval loop before every fused call).
"""

from __future__ import annotations

import ctypes
from typing import Callable, Optional

import numpy as np

from . import timeline

_MAX_PLANS = 4096  # per rule; past it the plans are dropped and made again


def plan_key(name: str, ins, kw: dict, free=(), per_call=()) -> tuple:
    """A call's key: the primitive, each input's (type, dtype, shape, strides), then the
    parameters as name, value pairs (``core/_loop.c`` builds the same tuple); ``free``:
    (input, axis) pairs whose sizes the key leaves out (-1 there: a rule's ``free`` axes);
    ``per_call``: parameters it leaves out (a rule's ``per_call``)."""
    key = [name]
    for i, a in enumerate(ins):
        shape = a.shape
        for j, ax in free:
            if j == i:
                shape = shape[:ax] + (-1,) + shape[ax + 1:]
        key += (type(a), a.dtype, shape, a.strides)
    for k, v in kw.items():
        if k not in per_call:
            key += (k, v)
    return tuple(key)


def takes_out(out, shape: tuple, dtype, ins) -> bool:
    """Whether ``out`` (the evaluator's buffer) can take the kernel's rows: its shape and
    dtype, row-contiguous, writeable, and, where it is an input's memory (a donation), that
    input row-contiguous (each element is read before it is written)."""
    if (out is None or out.shape != tuple(shape) or out.dtype != dtype
            or not out.flags.c_contiguous or not out.flags.writeable):
        return False
    return all(a.flags.c_contiguous or not np.may_share_memory(out, a) for a in ins)


class PyKernelCall:
    """``_kernel_call.KernelCall`` in Python: ``fn`` the kernel's address, ``argv`` its
    argument vector (integers and constant pointers; 0 where an array goes), ``slots`` the
    place in ``argv`` of each array of a call (inputs, then the output; -1: not passed),
    ``keep`` what the pointers point into, ``entry`` the kernel's cache entry (a hit per
    call), ``note(t0, t1, arrays)`` the launch's timeline records (the kernel's start and end,
    the call's arrays), called while the timeline records; ``out_shape``, ``out_dtype`` and
    ``out_strides`` (None: row-contiguous) the output it writes."""

    __slots__ = ("_fn", "gil", "_argv", "_slots", "keep", "entry", "note", "out_shape",
                 "out_dtype", "out_strides")

    def __init__(self, fn: int, gil: bool, argv: tuple, slots: tuple, keep, entry,
                 note: Callable, out_shape: tuple, out_dtype, out_strides=None) -> None:
        proto = (ctypes.PYFUNCTYPE if gil else ctypes.CFUNCTYPE)(None, ctypes.c_void_p)
        self._fn, self.gil, self._argv, self._slots = proto(fn), gil, argv, slots
        self.keep, self.entry, self.note = keep, entry, note
        self.out_shape, self.out_dtype, self.out_strides = out_shape, out_dtype, out_strides

    def __call__(self, *arrays) -> None:
        if len(arrays) != len(self._slots):
            raise TypeError(f"[KernelCall] takes {len(self._slots)} arrays (its inputs and "
                            f"output), got {len(arrays)}")
        argv = (ctypes.c_void_p * len(self._argv))(*self._argv)
        for a, s in zip(arrays, self._slots):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"[KernelCall] takes numpy arrays, got {type(a).__name__}")
            if s >= 0:
                argv[s] = a.ctypes.data
        t0 = timeline.now() if timeline.enabled else 0
        self._fn(argv)
        if self.entry is not None:
            self.entry.hits += 1
        if t0:
            self.note(t0, timeline.now(), arrays)


class PyPlanLookup:
    """``_kernel_call.PlanLookup`` in Python: ``lookup(tape, inputs, shape)`` is the launch
    plan a backend made for a fused call with these layouts, ``tape.launches[(*tag, shape,
    *((a.shape, a.strides) of each non-constant input a))]`` (their positions under
    ``tape.launches[tag]``; no tag in the key when ``tag`` is None), or None: no plan made
    yet, one of an older kernel cache (its ``gen`` not ``generation[0]``), or an input of
    the ``refused`` type."""

    __slots__ = ("tag", "generation", "refused")

    def __init__(self, tag, generation: list, refused: Optional[type] = None) -> None:
        hash(tag)
        if not isinstance(generation, list):
            raise TypeError("PlanLookup() argument 2 must be list")
        self.tag, self.generation, self.refused = tag, generation, refused

    def __call__(self, tape, inputs, shape):
        launches = tape.launches
        arrays = launches.get(self.tag)
        if arrays is None:
            return None
        refused = self.refused
        if refused is not None and any(type(inputs[i]) is refused for i in arrays):
            return None
        pairs = [(inputs[i].shape, inputs[i].strides) for i in arrays]
        ln = launches.get((shape, *pairs) if self.tag is None else (self.tag, shape, *pairs))
        if ln is None or ln.gen != self.generation[0]:
            return None
        return ln


def _c_types():
    try:
        from . import _kernel_call
    except ImportError:
        return None, None
    _kernel_call.configure(np.ndarray, timeline)
    probes = [np.arange(7, dtype=np.float32), np.ones((3, 4), np.float64)[1:, ::2],
              np.zeros((), np.int8)]
    if all(_kernel_call.data_pointer(a) == a.ctypes.data for a in probes):
        # PlanLookup remembers a tape's last hit by its inputs' layouts read from numpy's struct
        _kernel_call.use_layouts(all(_kernel_call.layout(a) == (a.shape, a.strides) for a in probes))
        return _kernel_call.KernelCall, getattr(_kernel_call, "PlanLookup", None)
    return None, getattr(_kernel_call, "PlanLookup", None)


_C_KERNEL_CALL, _C_PLAN_LOOKUP = _c_types()
KernelCall = _C_KERNEL_CALL or PyKernelCall
PlanLookup = _C_PLAN_LOOKUP or PyPlanLookup


def kernel_call(entry, argv: list, slots: tuple, keep, gil: bool, note: Callable,
                out_shape: tuple, out_dtype, out_strides=None) -> "KernelCall":
    """The plan of one call of ``entry``'s kernel (a loaded KernelEntry): ``argv`` in its
    signature's order, ints and constant pointers as ``kernels.common.reductions.arguments``
    makes them."""
    fn = ctypes.cast(entry.fast_fn(gil=True), ctypes.c_void_p).value
    return KernelCall(fn, bool(gil), tuple(int(v or 0) for v in argv), tuple(slots), keep,
                      entry, note, tuple(out_shape), np.dtype(out_dtype),
                      None if out_strides is None else tuple(out_strides))


_NONE = object()
_rules: list = []  # every KernelRule, for forget()


class KernelRule:
    """A primitive's generated-kernel rule, ``rule(xp, *ins, out=None, **kw)``: the call's
    plan (``plan(*ins, **kw)``, made once per ``plan_key``; None: no plan takes it) run into
    ``out`` where it takes it (``fits(out, shape, dtype, ins)``: ``takes_out`` on the host),
    else into a new array (``empty``: numpy's on the host); ``slow`` (the same signature)
    where there is no plan. A device's plans (``cuda/primitive_plans.py``) are launched
    by the eval loop from C once made.

    ``free``: (input, axis) pairs whose sizes a plan may take per call (a decoding cache's
    growing length): a plan with ``dims`` (``(input, axis, word, most)``: the size goes into
    its launch word ``word`` each call, up to ``most``) is kept under the key without those
    sizes too (``plan_key``'s ``free``), where a call of another size finds it (the C loop
    looks there after the exact key).

    ``donor``: the input whose buffer may become the output (MLX's donation: a SliceUpdate's
    input), written by the plan's ``in_place`` launch alone (the window, not the copy of the
    input first); the eval loop's C part donates where ``evaluate._donor``'s test passes,
    the Python path where the evaluator's ``out`` is that input's memory (``donated(out,
    input)``). None: the plans write a fresh output.

    ``per_call``: integer-tuple parameters the key leaves out (a SliceUpdate's start and end:
    a KV cache's write moves one position a token), which a plan takes as one launch word
    per call, ``per_call_value``: the plan's ``linear`` ((parameter, coefficients), ...)
    summed into its host 0-d int64 array ``at``, passed as one more input after the call's
    (read by value, its ``values`` entry)."""

    __slots__ = ("name", "plan", "slow", "plans", "fits", "empty", "free", "donor", "donated",
                 "per_call")

    def __init__(self, name: str, plan: Callable, slow: Callable, fits: Optional[Callable] = None,
                 empty: Optional[Callable] = None, donor: Optional[int] = None,
                 donated: Optional[Callable] = None, per_call: tuple = ()) -> None:
        self.name, self.plan, self.slow = name, plan, slow
        self.fits, self.empty = fits or takes_out, empty or np.empty
        self.plans: dict = {}
        self.free: tuple = ()
        self.donor, self.donated, self.per_call = donor, donated, tuple(per_call)
        _rules.append(self)

    def planned(self, ins, kw: dict) -> Optional[object]:
        """The plan for these inputs and parameters (None: none takes them)."""
        try:
            key = plan_key(self.name, ins, kw, (), self.per_call)
            p = self.plans.get(key, _NONE)
        except TypeError:  # an unhashable parameter: no plan
            return None
        if p is _NONE and self.free:
            fkey = plan_key(self.name, ins, kw, self.free, self.per_call)
            got = self.plans.get(fkey)
            if got is not None and sized(got, ins):
                return got
        if p is _NONE:
            if len(self.plans) >= _MAX_PLANS:
                self.plans.clear()
            p = self.plans[key] = self.plan(*ins, **kw)
            if self.free and getattr(p, "dims", ()):
                self.plans[plan_key(self.name, ins, kw, self.free, self.per_call)] = p
        return p

    def __call__(self, xp, *ins, out=None, **kw):
        p = self.planned(ins, kw)
        if p is None:
            return self.slow(xp, *ins, out=out, **kw)
        args = (*ins, per_call_value(p, kw)) if self.per_call else ins
        if (self.donor is not None and out is not None and p.in_place is not None
                and self.donated(out, ins[self.donor])):  # the input's own buffer: in place
            p.in_place(*args, out)
            return out
        if not self.fits(out, p.out_shape, p.out_dtype, ins):
            out = self.empty(p.out_shape, dtype=p.out_dtype)
        p(*args, out)
        return out

    @property
    def takes_bfloat16(self) -> bool:
        """Whether it takes a device's bfloat16 storage as it is (its ``slow`` rule does;
        its plans are keyed by the inputs' types): ``cuda/backend.py`` widens no input."""
        return getattr(self.slow, "takes_bfloat16", False)

    def __repr__(self) -> str:
        return f"KernelRule({self.name!r}, {len(self.plans)} plans)"


def per_call_value(plan, kw: dict) -> np.ndarray:
    """A plan's launch word from the call's ``per_call`` parameters (``KernelRule.per_call``):
    ``sum(kw[name][d] * coefs[d])`` over its ``linear``, written into its ``at`` (the C
    loop computes the same, ``core/_loop.c`` per_call_input)."""
    v = 0
    for name, coefs in plan.linear:
        for x, c in zip(kw[name], coefs):
            v += int(x) * int(c)
    plan.at[()] = v
    return plan.at


def sized(plan, ins) -> bool:
    """Whether a plan's per-call sizes (its ``dims``) take these inputs' (the C loop's test
    too, core/_loop.c)."""
    return all(ins[i].shape[ax] <= most for i, ax, _, most in plan.dims)


_caches: list = []  # other plan dicts keyed by plan_key (EagerPlans'), for forget()


def plan_cache() -> dict:
    """A new dict of plans keyed by ``plan_key`` that ``forget()`` empties."""
    d: dict = {}
    _caches.append(d)
    return d


class EagerPlans:
    """A backend's one-op kernels for eager elementwise ops (``cpu/eager.py``,
    ``cuda/eager.py``): ``plans``, their call plans by ``plan_key`` (the eval loop's C part
    looks there before it asks the backend's ``plan_for``), emptied by ``forget()`` and when
    ``settings.eager_kernels`` changes; ``on``, that setting; the one-op tapes by their key
    (``tape``) and, for a key that has none, why (``none``)."""

    __slots__ = ("plans", "on", "tapes", "none")

    def __init__(self) -> None:
        from .settings import settings

        self.plans: dict = plan_cache()
        self.tapes: dict = {}
        self.none: dict = {}
        self.on = True
        settings.watch("eager_kernels", self._set_on)

    def _set_on(self, value) -> None:
        self.on = bool(value)
        self.plans.clear()

    def tape(self, key: tuple, make: Callable) -> Optional[object]:
        """The tape of ``key``, made by ``make()`` the first time; None where ``make``
        raised (a type the tape cannot key: ``none[key]`` keeps the reason)."""
        t = self.tapes.get(key)
        if t is None and key not in self.none:
            try:
                t = self.tapes[key] = make()
            except Exception as e:  # noqa: BLE001 - the op's rule runs it
                self.none[key] = str(e)
        return t

    def remember(self, name: str, ins, kw: dict, plan: object) -> None:
        """Keep ``plan`` for calls of these layouts: the loop finds it from now on."""
        plans = self.plans
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plans[plan_key(name, ins, kw)] = plan


def forget() -> None:
    """Drop every rule's plans (they hold kernels of a cleared cache)."""
    for r in _rules:
        r.plans.clear()
    for d in _caches:
        d.clear()
