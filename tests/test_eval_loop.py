"""The one eval loop: every kind of eval (an eager op's, a compiled call's, several arrays',
async_eval's, on the CPU and on a stand-in GPU backend) runs its nodes through
``evaluate.run_node``, which counts the dispatch path each node took; recording the
timeline changes nothing but the records; and random sequences of evals, frees and
interrupts keep MLX's semantics (numpy in float64 is the reference)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from tapescope.core import eval_loop, evaluate
from tapescope.kernels import timeline
from tapescope.kernels.stream_workers import Interrupt
from conftest import registered_as_gpu, sweep
from test_backends import NumpyGpu


def _nodes_run(fn) -> int:
    """How many nodes ``fn`` ran, by the loop's dispatch counts."""
    before = sum(evaluate.dispatch_counts().values())
    fn()
    return sum(evaluate.dispatch_counts().values()) - before


def _run_by_the_loop(fn) -> list:
    """The primitives ``fn``'s evals ran, each once, as the loop's records name them."""
    with timeline.record() as rec:
        fn()
    return [r.name for r in rec.records if r.kind == "primitive"]


def _kinds_of_eval() -> dict:
    """Each kind of eval on the default device: name -> (function, primitives it runs)."""
    a = mx.array(np.arange(8, dtype=np.float32))
    b = mx.array(np.ones(8, dtype=np.float32))
    mx.eval(a, b)
    f = mx.compile(lambda x, y: x * y + x)

    def async_eval():
        c = mx.exp(a)
        mx.async_eval(c)
        mx.eval(c)

    return {
        "eager op": (lambda: mx.eval(mx.add(a, b)), ["Add"]),
        "two arrays": (lambda: mx.eval(mx.add(a, b), mx.negative(a)),
                       ["Add", "Negative"]),
        "a chain": (lambda: mx.eval(mx.exp(mx.add(a, b))), ["Add", "Exp"]),
        "compiled call": (lambda: mx.eval(f(a, b)), ["Compiled"]),
        "async_eval": (async_eval, ["Exp"]),
    }


@pytest.mark.parametrize("device", ["cpu", "testgpu"])
def test_every_kind_of_eval_runs_each_node_once_through_the_loop(device):
    gen = registered_as_gpu(NumpyGpu()) if device == "testgpu" else None
    dev = mx.gpu if gen is not None else mx.cpu
    if gen is not None:
        next(gen)
    try:
        with mx.stream(dev):
            for name, (fn, prims) in _kinds_of_eval().items():
                fn()  # first calls may build kernels
                assert sorted(_run_by_the_loop(fn)) == sorted(prims), name
                assert _nodes_run(fn) == len(prims), name  # one dispatch path per node
    finally:
        if gen is not None:
            gen.close()


def _workload() -> list:
    """Eager ops, a compiled call, a multi-output op, async_eval and a view: the values."""
    a = mx.array(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))
    b = mx.array(np.linspace(1, 3, 64, dtype=np.float32).reshape(8, 8))
    f = mx.compile(lambda x, y: mx.exp(x) * y - x)
    outs = [a + b, mx.sum(a * b, axis=1), f(a, b), f(b, a)[2:, :3], mx.split(a, 2, axis=0)[1]]
    mx.eval(outs[0])
    mx.async_eval(outs[1])
    mx.eval(*outs)
    c = mx.matmul(a, b).T
    mx.eval(c)
    return [np.array(o) for o in outs + [c]]


class _Plan:
    """A stand-in GPU's loaded fused kernel: the tape interpreted into the output."""

    def __init__(self, tape, shape):
        self.tape, self.shape = tape, shape

    def takes(self, out) -> bool:
        return True


class LaunchingGpu(NumpyGpu):
    """The stand-in GPU with a device context and a loaded fused kernel for every call: the
    eval loop launches its fused calls outside the context (a GPU's small-call path)."""

    name = "launchgpu"

    @staticmethod
    def device_context(stream, node=None):
        from tapescope.kernels.backends import DeviceContext

        return DeviceContext()  # (no stream to make current; the definition's rules)

    @property
    def compiled_launch(self):
        return lambda tape, ins, shape: _Plan(tape, shape)

    def launch_fused(self, stream, launch, inputs, out):
        from tapescope.kernels.codegen.interpret import interpret

        out[...] = interpret(launch.tape, inputs, launch.shape, np)[0]


@pytest.mark.parametrize("device", ["cpu", "launchgpu"])
def test_recording_the_timeline_changes_nothing_but_the_records(device):
    gen = registered_as_gpu(LaunchingGpu()) if device == "launchgpu" else None
    if gen is not None:
        next(gen)
    try:
        with mx.stream(mx.gpu if gen is not None else mx.cpu):
            _compare_recorded(device)
    finally:
        if gen is not None:
            gen.close()


def _compare_recorded(device) -> None:
    _workload()  # kernels built, caches warm
    runs = {}
    for recording in (False, True, False):
        evaluate.reset_dispatch_counts()
        if recording:
            with timeline.record() as rec:
                values = _workload()
        else:
            values = _workload()
        runs.setdefault(recording, []).append((evaluate.dispatch_counts(), values))
    (off, values_off), (off2, _) = runs[False]
    on, values_on = runs[True][0]
    assert off == off2  # the workload is deterministic
    assert on == off, (on, off)
    for x, y in zip(values_on, values_off):
        np.testing.assert_array_equal(x, y)
    prims = [r for r in rec.records if r.kind == "primitive"]
    assert len(prims) == sum(on.values())  # each node run, recorded
    fused = "fused_kernel" if device == "cpu" else "fused_kernel_device"
    assert on[fused] >= 1, on  # the fast launch is taken, recording or not


# -- random sequences of evals, frees and interrupts ------------------------------------

UNARY = {"negative": np.negative, "exp": np.exp, "abs": np.abs}
BINARY = {"add": np.add, "multiply": np.multiply, "subtract": np.subtract,
          "maximum": np.maximum}

step = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY)), st.integers(0, 1 << 20)),
    st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY)), st.integers(0, 1 << 20),
              st.integers(0, 1 << 20)),
    st.tuples(st.just("eval"), st.lists(st.integers(0, 1 << 20), min_size=1, max_size=3),
              st.booleans()),
    st.tuples(st.just("free"), st.integers(0, 1 << 20)),
    st.tuples(st.just("interrupt"), st.integers(0, 1 << 20), st.integers(0, 4)),
)


class _InterruptingAfter:
    """While it is entered, the rules of the ops drawn here request an interrupt once ``k``
    of them have run (the eval loop reads each node's rule off its definition)."""

    def __init__(self, k: int):
        from tapescope.kernels.primitives import REGISTRY

        self.k, self.ran = k, 0
        self.defs = [REGISTRY[n] for n in ("Negative", "Exp", "Abs", "Add", "Multiply",
                                           "Subtract", "Maximum")]

    def __enter__(self):
        self.saved = [d.rule for d in self.defs]
        for d, rule in zip(self.defs, self.saved):
            d.rule = self._counting(rule)

    def _counting(self, rule):
        def run(*args, **kw):
            out = rule(*args, **kw)
            self.ran += 1
            if self.ran == self.k:
                Interrupt.request()
            return out
        return run

    def __exit__(self, *exc):
        for d, rule in zip(self.defs, self.saved):
            d.rule = rule


# young_heap: the fixture spans every example (each collects twice)
@settings(max_examples=sweep(40, 15), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=25))
def test_sequences_of_evals_frees_and_interrupts_keep_mlxs_semantics(young_heap, steps):
    gc.collect()
    active0 = mx.get_active_memory()
    _run_steps(steps)
    gc.collect()
    assert mx.get_active_memory() <= active0  # every freed array's memory is back


def _run_steps(steps: list) -> None:
    rng = np.random.default_rng(0)
    pool = [mx.array(x) for x in rng.uniform(-1, 1, (3, 6)).astype(np.float32)]
    ref = [np.array(p, dtype=np.float64) for p in pool]
    for s in steps:
        kind = s[0]
        if kind == "unary":
            i = s[2] % len(pool)
            pool.append(getattr(mx, s[1])(pool[i]))
            ref.append(UNARY[s[1]](ref[i]))
        elif kind == "binary":
            i, j = s[2] % len(pool), s[3] % len(pool)
            pool.append(getattr(mx, s[1])(pool[i], pool[j]))
            ref.append(BINARY[s[1]](ref[i], ref[j]))
        elif kind == "eval":
            xs = [pool[i % len(pool)] for i in s[1]]
            (mx.async_eval if s[2] else mx.eval)(*xs)
            if s[2]:
                mx.eval(*xs)
            for x in xs:
                assert x._d.node is None  # evaluated: detached from the graph
        elif kind == "free" and len(pool) > 1:
            i = s[1] % len(pool)
            del pool[i], ref[i]
        elif kind == "interrupt":
            x = pool[s[1] % len(pool)]
            lazy = _lazy_descs(x)
            try:
                with _InterruptingAfter(s[2] + 1):
                    mx.eval(x)
                interrupted = False
            except KeyboardInterrupt:
                interrupted = True
            ran = sum(1 for d in lazy if d.node is None)
            assert interrupted == (len(lazy) > s[2] + 1)  # stopped at the next boundary
            assert ran == min(len(lazy), s[2] + 1)
            for d in lazy:  # evaluated nodes keep their data, the rest stay lazy, unscheduled
                assert (d.data is not None) == (d.node is None)
                assert d.node is None or d.node.event is None
    mx.eval(*pool)
    for x, r in zip(pool, ref):
        np.testing.assert_allclose(np.array(x), r, rtol=1e-5, atol=1e-6)


def _lazy_descs(x) -> list:
    """The lazy descs ``x`` needs, one per node, in the eval's order."""
    from tapescope.core.walk import topological

    return [next(r() for r in n.outputs if r() is not None) for n in topological([x._d])]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 1 << 20), st.booleans()),
                min_size=1, max_size=30),
       st.lists(st.integers(0, 1 << 20), min_size=1, max_size=4),
       st.lists(st.integers(0, 1 << 20), max_size=3))
def test_the_schedules_order_in_c_is_the_walkers(ops, outs, scheduled):
    """core/_call.c's topo_order against walk.topological with the schedule's cut: the same
    nodes in the same order, and the same nodes another eval has scheduled."""
    if eval_loop.c_loop is None:
        pytest.skip("core/_call.c is not built")
    pool = [mx.array(np.ones(3, np.float32)) for _ in range(3)]
    for i, j, unary in ops:
        a, b = pool[i % len(pool)], pool[j % len(pool)]
        pool.append(mx.exp(a) if unary else a + b)
    lazy = [p for p in pool if p._d.node is not None]
    marked = [lazy[k % len(lazy)]._d.node for k in scheduled] if lazy else []
    for n in marked:
        n.event = object()  # scheduled by another eval
    try:
        descs = [pool[k % len(pool)]._d for k in outs]
        assert eval_loop.topo_order(descs) == eval_loop._topo_order(descs)
    finally:
        for n in marked:
            n.event = None


def _slots(obj, skip=()) -> dict:
    return {k: getattr(obj, k) for k in type(obj).__slots__ if k != "__weakref__" and k not in skip}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 4), max_size=3).map(tuple), min_size=1, max_size=3),
       st.integers(0, 3), st.booleans())
def test_recording_a_node_in_c_makes_the_objects_the_python_recorder_makes(shapes, n_in, traced):
    """core/_call.c's make / make1 against array.py's Python recorders: the same node slots
    (its primitive, inputs, a fresh id, no event), the same desc slots per output (shape,
    dtype, stream, node, index, no data, the tracer flag inside a transformation too), each
    weakly listed on the node, and a fresh handle per output."""
    from tapescope.core.array import array
    from tapescope.core.primitive import Primitive

    if not hasattr(array, "_make_py"):
        pytest.skip("core/_call.c is not built (or settings.c_call is off)")
    s = mx.default_stream(mx.default_device())
    ins = [mx.array(np.ones(2, np.float32)) for _ in range(n_in)]
    dtypes = [mx.float32, mx.int32, mx.float16][:len(shapes)]

    def made(make, make1):
        prim = Primitive("Abs", s)
        if len(shapes) == 1 and make1 is not None:
            return prim, [make1(shapes[0], dtypes[0], prim, ins)]
        return prim, make([list(sh) for sh in shapes], dtypes, prim, ins)

    def record():
        return made(array._make, array._make1), made(array._make_py, array._make1_py)

    if traced:  # a transformation's tracers: the flag comes from transform_tracers.any_tracer
        got = []
        mx.grad(lambda x: (got.append(record()), x.sum())[1])(mx.array(1.0))
        (pc, c), (pp, p) = got[0]
    else:
        (pc, c), (pp, p) = record()
    assert len(c) == len(p) == len(dtypes[:len(shapes)])
    nc, np_ = c[0]._d.node, p[0]._d.node
    assert nc.primitive is pc and np_.primitive is pp
    assert nc.inputs == np_.inputs == [x._d for x in ins]
    assert nc.id != np_.id and nc.event is None and nc.keep is False
    assert [r() for r in nc.outputs] == [a._d for a in c]
    for a, b, i in zip(c, p, range(len(c))):
        assert type(a) is array and a is not b
        da, db = _slots(a._d, skip=("node",)), _slots(b._d, skip=("node",))
        assert da == db and da["index"] == i and type(da["shape"]) is tuple
        assert a._d.node is nc


def test_a_rule_that_raises_leaves_the_node_lazy_and_a_later_eval_runs_it():
    from tapescope.kernels.primitives import REGISTRY

    defn = REGISTRY["Exp"]
    rule = defn.rule

    def broken(*args, **kw):
        raise ValueError("the rule failed")

    a_np = np.linspace(0, 1, 8, dtype=np.float32)
    a = mx.array(a_np)
    for make, want in ((lambda: mx.exp(a), np.exp(a_np)),  # one node, and a chain
                       (lambda: mx.exp(a) + 1, np.exp(a_np) + 1)):
        x = make()
        defn.rule = broken
        try:
            with pytest.raises(ValueError, match="the rule failed"):
                mx.eval(x)
        finally:
            defn.rule = rule
        assert x._d.node is not None and x._d.node.event is None  # lazy, unscheduled
        mx.eval(x)
        np.testing.assert_allclose(np.array(x), want, rtol=1e-6)


_WORKLOAD = """
import json, numpy as np, tapescope, tapescope.core as mx
from tapescope.core import evaluate
from tapescope.kernels import timeline
a = mx.array(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))
b = mx.array(np.linspace(1, 3, 64, dtype=np.float32).reshape(8, 8))
f = mx.compile(lambda x, y: mx.exp(x) * y - x)
def work():
    outs = [a + b, mx.sum(a * b, axis=1), f(a, b), f(b, a)[2:, :3], mx.split(a, 2, axis=0)[1],
            (a * 2.0).T, mx.matmul(a, b)]
    for o in outs[:3]:
        mx.eval(o)
    mx.eval(*outs)
    return [np.array(o).tolist() for o in outs]
work()
evaluate.reset_dispatch_counts()
with timeline.record() as rec:
    values = work()
print(json.dumps({"counts": evaluate.dispatch_counts(), "values": values,
                  "records": [[r.kind, r.name] for r in rec.records
                              if r.kind not in ("alloc", "free", "free_to_cache", "cache_reuse")]}))
"""


def test_the_c_loop_and_the_python_loop_make_the_same_records_counts_and_values():
    """core/_call.c's parts of the loop against the Python path they stand for
    (``TAPESCOPE_C_CALL=0``): the same dispatch paths, records and values."""
    from conftest import with_and_without_c_call

    if eval_loop.c_loop is None:
        pytest.skip("core/_call.c is not built")
    c, py = with_and_without_c_call(_WORKLOAD)
    assert c["counts"] == py["counts"]
    assert c["records"] == py["records"]
    assert c["values"] == py["values"]


def test_a_graph_is_freed_by_reference_counting_alone():
    """Graph objects are outside the cyclic collector (core/_call.c): an unevaluated graph,
    a gradient's and an evaluated one go away as soon as nobody holds them, with the
    collector off (they never form a cycle)."""
    import weakref

    x = mx.array(np.ones(4, np.float32))
    mx.eval(x)
    gc.disable()
    try:
        y = mx.exp(x * 2) + x
        refs = [weakref.ref(y._d), weakref.ref(y._d.node.inputs[0]), weakref.ref(y._d.node)]
        del y
        assert [r() for r in refs] == [None, None, None]
        g = mx.grad(lambda v: (mx.sin(v) * v).sum())(x)
        refs = [weakref.ref(g._d)] + ([weakref.ref(g._d.node)] if g._d.node is not None else [])
        del g
        assert all(r() is None for r in refs)
        z = mx.exp(x) * x
        mx.eval(z)
        ref = weakref.ref(z._d)
        del z
        assert ref() is None
    finally:
        gc.enable()


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(["float32", "float16", "bfloat16", "float64", "int8", "uint16",
                              "int64", "bool_", "complex64"]),
       shape=st.lists(st.integers(0, 5), min_size=0, max_size=4), compiled=st.booleans())
def test_an_output_view_of_an_allocator_buffer_is_the_one_numpy_s_constructor_makes(
        dtype, shape, compiled):
    """A fresh output's typed view over its allocator buffer (_loop.c's buffer_view: numpy's
    C API where usable) is ``np.ndarray(shape, dtype, raw)``: the same memory, dtype, strides,
    flags and base (the buffer's raw array, or the memory it flattens), and the op's values."""
    rng = np.random.default_rng(len(shape))
    a = (rng.standard_normal(shape) * 3).astype(np.float64)
    x = mx.array(a).astype(getattr(mx, dtype))
    mx.eval(x)
    f = mx.compile(lambda u: u * u) if compiled else (lambda u: mx.maximum(u, u))
    y = f(x)
    mx.eval(y)
    data, buf = y._d.data, y._d.buffer.buffer
    raw = buf.raw
    if dtype in ("float32", "float64", "int64") or data.base is not None:  # an allocator buffer
        assert raw.dtype == np.uint8 and raw.ndim == 1  # (else the rule's own, adopted memory)
        want = np.ndarray(tuple(shape), data.dtype, raw)
        assert data.base is want.base  # raw, or the owner raw flattens (an adopted reuse)
        assert data.dtype == want.dtype and data.shape == want.shape
        assert data.strides == want.strides and data.flags.writeable and data.flags.c_contiguous
        assert data.__array_interface__["data"][0] == want.__array_interface__["data"][0]
    else:
        assert raw is data
    xs = x._d.data  # numpy in the same dtype is the reference (a product rounded once)
    ref = (xs * xs if compiled else np.maximum(xs, xs)).astype(data.dtype)
    if dtype == "complex64":
        np.testing.assert_allclose(data, ref, rtol=1e-6)
    else:
        np.testing.assert_array_equal(data.astype(np.float64), ref.astype(np.float64))


def test_an_eval_waits_for_the_interrupt_flag_s_lock_held_by_another_thread():
    """The loop's bracket (Interrupt.begin / end in _loop.c) moves the running count without
    taking the flag's lock only while nobody holds it: held by another thread, an eval waits
    for it, then runs; the count is back to zero after each eval, the flag cleared."""
    import threading
    import time

    x = mx.array(np.arange(16, dtype=np.float32))
    mx.eval(x + 1)
    assert Interrupt._running == 0
    took, order = threading.Event(), []

    def hold():
        with Interrupt._lock:
            took.set()
            time.sleep(0.3)  # the eval below starts meanwhile
            order.append("released")

    t = threading.Thread(target=hold)
    t.start()
    took.wait(5)
    y = x * 3
    mx.eval(y)  # waits for the lock (else it ends long before the holder lets go)
    order.append("evaluated")
    t.join(5)
    assert order == ["released", "evaluated"]
    np.testing.assert_array_equal(np.asarray(y), np.arange(16, dtype=np.float32) * 3)
    assert Interrupt._running == 0 and not Interrupt._flag
    for _ in range(3):  # unheld: the same count
        mx.eval(x - 1)
        assert Interrupt._running == 0

def test_a_node_recorded_in_c_leaves_the_collector_its_parameters_too():
    """core/_call.c's recorder keeps the graph out of the cyclic collector (acyclic by
    construction): the node, its input list, the primitive and the primitive's parameter
    dict; what the parameters hold stays tracked, and the node's results are right."""
    import gc

    from tapescope.core.array import array

    if not hasattr(array, "_make_py"):
        pytest.skip("core/_call.c is not built (or settings.c_call is off)")
    x = mx.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    y = mx.broadcast_to(mx.sum(x, axis=0, keepdims=True), (4, 3))
    node = y._d.node
    assert node.primitive.kw == {"shape": (4, 3)}
    assert not gc.is_tracked(node) and not gc.is_tracked(node.primitive)
    assert not gc.is_tracked(node.primitive.kw) and not gc.is_tracked(node.inputs)
    np.testing.assert_array_equal(np.array(y), np.broadcast_to(np.arange(6).reshape(2, 3).sum(0), (4, 3)))


@pytest.mark.parametrize("first", ["compiled", "rule"])
def test_the_loops_quiet_state_is_taken_at_its_first_rule_and_given_back(first):
    """numpy's floating-point warnings are silenced for every rule of an eval (MLX has none),
    whether a compiled call's kernel or a rule runs first, and numpy's own state is the
    caller's again after the eval (float64 numpy under errstate is the reference)."""
    import warnings

    x_np = np.array([-1.0, 0.0, 0.5, 4.0], np.float32)
    g = mx.compile(lambda v: v * 2.0 - 1.0)
    x = mx.array(x_np)
    mx.eval(x, g(x))
    with np.errstate(all="ignore"):
        k = x_np.astype(np.float64) * 2.0 - 1.0
        ref = np.log(k) / k if first == "compiled" else np.log(x_np.astype(np.float64)) / 0.0
    state = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="warn"):
            inner = np.geterr()
            if first == "compiled":
                y = g(x)
                out = mx.log(y) / y
            else:
                out = mx.log(x) / mx.array(np.zeros(4, np.float32))
            mx.eval(out)
            assert np.geterr() == inner
            mx.eval(g(x))  # a loop of one compiled call alone
            assert np.geterr() == inner
    assert np.geterr() == state
    np.testing.assert_allclose(np.array(out), ref.astype(np.float32), rtol=1e-6, atol=0)
