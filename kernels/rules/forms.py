"""numpy forms that CuPy lacks, written with array operations both modules share.

CuPy 14's ufuncs ``accumulate`` only ``add`` / ``multiply`` and scatter (``ufunc.at``) only
``add`` / ``subtract`` / ``maximum`` / ``minimum`` / the bitwise ones, each for a few dtypes
(``cupy/_core/_kernel.pyx``, ``_routines_indexing.pyx``); its arrays' ``flags`` have no
``writeable``. Where the array module's backend declares ``sequential_forms`` (the CPU's:
numpy) the rules keep numpy's own forms (sequential, exact, fast on the host); with any other
array module (CuPy, or one no registered backend computes with) they use these:

- ``accumulate``: a Hillis-Steele scan, ceil(log2 n) passes of ``combine(x[i - 2^k], x[i])``
  on shifted slices. Exact for max / min / and; for logaddexp the rounding differs from a
  sequential accumulation (``tests/test_cupy_like_rules.py`` states the bound).
- ``assign``: ``out[index] = updates`` where a position repeats: numpy (and MLX's CPU loop)
  keep the last update, CuPy leaves which one undefined; the last is kept by the same
  stable sort by position.
- ``scatter``: ``out[index] op= updates`` with repeated positions combined in the order they
  occur: the updates sorted by flat position (stable), a segmented log-step scan, and one
  combine of each position's total into ``out``. ``add`` uses CuPy's atomic ``add.at``
  where its dtype allows (as MLX's CUDA scatter does), the order of its additions unspecified.

No Python loop runs over elements: loops run over log2 n passes or over axes.
"""

from __future__ import annotations


#: array module -> the registered backend computing with it (kept by ``kernels/backends.py``'s
#: ``register`` / ``unregister``): what a rule asks of its array module, it asks of that
#: backend's declared facts, never of the module's name
_backend_of: dict = {}


def declare(backends_: list) -> None:
    """Record which backend computes with each array module (``backends.register`` calls
    it; the last one listed wins for a shared module)."""
    _backend_of.clear()
    _backend_of.update((b.xp, b) for b in backends_)


def sequential(xp) -> bool:
    """Whether the backend computing with ``xp`` declares numpy's sequential forms
    (``Backend.sequential_forms``: every ufunc's ``accumulate`` and ``at`` in order, the last
    of repeated positions kept by an assignment, linalg raising where it cannot factor, a
    host loop over an axis cheap); False for a module no registered backend computes with
    (the log-step forms below)."""
    b = _backend_of.get(xp)
    return b is not None and b.sequential_forms


def on_host(xp) -> bool:
    """Whether the backend computing with ``xp`` is the host's (its device type ``cpu``)."""
    b = _backend_of.get(xp)
    return b is not None and b.device_type == "cpu"


def is_writeable(a) -> bool:
    """numpy's ``flags.writeable``; CuPy arrays have no such flag and are always writable."""
    try:
        return a.flags.writeable
    except AttributeError:
        return True


def _along(axis: int, ndim: int, sl: slice) -> tuple:
    idx = [slice(None)] * ndim
    idx[axis] = sl
    return tuple(idx)


def log_step_scan(xp, a, axis: int, combine):
    """Inclusive scan of the associative ``combine(earlier, later)`` along ``axis`` (a new
    array of ``a``'s dtype)."""
    out = a.copy()
    n = out.shape[axis] if out.ndim else 0
    step = 1
    while step < n:
        later = _along(axis, out.ndim, slice(step, None))
        earlier = _along(axis, out.ndim, slice(None, n - step))
        out[later] = combine(out[earlier], out[later])  # computed before it is written
        step *= 2
    return out


_ACCUMULATE = {"maximum", "minimum", "logaddexp", "logical_and", "logical_or"}


def accumulate(xp, ufunc: str, a, axis: int):
    """``getattr(xp, ufunc).accumulate(a, axis=axis)``; ``ufunc`` one of maximum, minimum,
    logaddexp, logical_and, logical_or."""
    if ufunc not in _ACCUMULATE:
        raise ValueError(f"no accumulate form for {ufunc}")
    if sequential(xp):
        return getattr(xp, ufunc).accumulate(a, axis=axis)
    fn = getattr(xp, ufunc)
    if ufunc.startswith("logical"):
        a = a.astype(bool)
    return log_step_scan(xp, a, axis, fn)


def _segmented_scan(xp, vals, starts, combine):
    """Inclusive scan of ``combine`` over 1-d ``vals`` restarting where ``starts`` is True
    (the pair operator ``(f, v) . (g, w) = (f | g, w if g else combine(v, w))`` is
    associative, so the log-step passes apply)."""
    n = vals.shape[0]
    step = 1
    while step < n:
        v0, v1 = vals[:n - step], vals[step:]
        f0, f1 = starts[:n - step], starts[step:]
        new_v = xp.where(f1, v1, combine(v0, v1))
        new_f = f1 | f0
        vals[step:] = new_v
        starts[step:] = new_f
        step *= 2
    return vals


# CuPy's add.at (atomicAdd): the dtypes it takes (cupy/_core/_routines_indexing.pyx)
_ATOMIC_ADD = frozenset({"int32", "uint32", "uint64", "float16", "float32", "float64"})


def _sorted_updates(xp, out, index: tuple, updates):
    """Every update's flat (row-major) position in ``out`` and its value, sorted by position
    (stable: a position's updates stay in their order), and where each position's run
    starts; None when there are no updates."""
    shape = xp.broadcast(*index, updates).shape
    size = 1
    for s in shape:
        size *= s
    if size == 0:
        return None
    pos = xp.zeros((), dtype=xp.int64)
    stride = 1
    for d in range(out.ndim - 1, -1, -1):
        pos = pos + index[d].astype(xp.int64) * stride
        stride *= out.shape[d]
    pos = xp.broadcast_to(pos, shape).reshape(-1)
    vals = xp.broadcast_to(updates.astype(out.dtype), shape).reshape(-1)
    order = xp.argsort(pos, kind="stable")
    pos, vals = pos[order], vals[order]
    first = xp.empty(pos.shape, dtype=bool)
    first[0] = True
    first[1:] = pos[1:] != pos[:-1]
    return pos, vals, first


def _last_of_runs(xp, first):
    last = xp.empty(first.shape, dtype=bool)
    last[-1] = True
    last[:-1] = first[1:]
    return last


def assign(xp, out, index: tuple, updates) -> None:
    """``out[index] = updates`` in place, the last update winning where a position repeats
    (``index``: non-negative integer arrays, one per axis; ``out`` row-contiguous)."""
    if sequential(xp):
        out[index] = updates
        return
    runs = _sorted_updates(xp, out, index, xp.asarray(updates))
    if runs is None:
        return
    pos, vals, first = runs
    last = _last_of_runs(xp, first)
    out.reshape(-1)[pos[last]] = vals[last]  # each position once


def scatter(xp, ufunc: str, out, index: tuple, updates) -> None:
    """``getattr(xp, ufunc).at(out, index, updates)`` in place: ``index`` is a tuple of
    integer arrays (non-negative, one per axis of ``out``, broadcasting with ``updates``);
    ``ufunc`` one of add, multiply, maximum, minimum. ``out`` is row-contiguous."""
    if sequential(xp):
        getattr(xp, ufunc).at(out, index, updates)
        return
    if ufunc == "add" and out.dtype.name in _ATOMIC_ADD:
        xp.add.at(out, index, xp.asarray(updates, dtype=out.dtype))
        return
    combine = getattr(xp, ufunc)
    runs = _sorted_updates(xp, out, index, updates)
    if runs is None:
        return
    pos, vals, first = runs
    last = _last_of_runs(xp, first)
    total = _segmented_scan(xp, vals, first, combine)
    where, total = pos[last], total[last]
    flat = out.reshape(-1)  # a view: ``out`` is contiguous
    flat[where] = combine(flat[where], total)
