"""Streams on worker threads, async_eval, events and fences, interrupts, threads."""

from __future__ import annotations

import gc
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import pytest

import tapescope
import tapescope.core as mx
from tapescope.kernels import stream_workers


def chain(n: int, size: int = 1024):
    """x = 0; x = x + 1, n times (int32): the answer is n everywhere."""
    x = mx.array(np.zeros(size, dtype=np.int32))
    for _ in range(n):
        x = x + 1
    return x


def block_stream(s):
    """Occupy stream ``s``'s worker until the returned event is set."""
    gate = threading.Event()
    stream_workers.worker(s.index).enqueue(gate.wait)
    return gate


def kinds(records, kind):
    return [r for r in records if r.kind == kind]


def test_async_eval_returns_before_the_work_is_done():
    s = mx.new_stream(mx.cpu)
    gate = block_stream(s)
    x = mx.add(mx.array(np.arange(4.0)), 1.0, stream=s)
    mx.async_eval(x)
    assert x._d.node is not None  # scheduled, not available: the stream is blocked
    gate.set()
    mx.synchronize(s)
    assert x._d.node is None
    np.testing.assert_array_equal(np.array(x), np.arange(4.0) + 1)


def test_producer_and_consumer_on_different_streams_with_async_eval():
    s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
    a = mx.array(np.arange(1000, dtype=np.float32))
    p = mx.multiply(a, 3.0, stream=s1)
    gate = block_stream(s1)
    mx.async_eval(p)
    c = mx.add(p, 1.0, stream=s2)  # consumer of a still-running producer on another stream
    with tapescope.record() as rec:
        mx.async_eval(c)
        time.sleep(0.05)
        assert c._d.node is not None  # waits for s1
        gate.set()
        mx.eval(c)
    np.testing.assert_array_equal(np.array(c), np.arange(1000, dtype=np.float32) * 3 + 1)
    waits = kinds(rec.records, "event_wait")
    assert any(w.stream == s2.index for w in waits)


def test_input_whose_event_signalled_is_not_waited_on():
    s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
    p = mx.multiply(mx.array(np.ones(8, np.float32)), 2.0, stream=s1)
    mx.async_eval(p)
    mx.synchronize(s1)
    with tapescope.record() as rec:
        c = mx.add(p, 1.0, stream=s2)
        mx.eval(c)
    assert not kinds(rec.records, "event_wait") or all(
        w.detail.get("signaled_by") != s1.index for w in kinds(rec.records, "event_wait"))
    np.testing.assert_array_equal(np.array(c), np.full(8, 3.0, np.float32))


def test_cross_stream_edges_in_one_eval_use_fences_and_keep_order():
    streams = [mx.new_stream(mx.cpu) for _ in range(4)]
    x = mx.array(np.arange(256, dtype=np.int64))
    expected = np.arange(256, dtype=np.int64)
    for i in range(200):  # every step on another stream: 199 cross-stream edges
        x = mx.add(mx.multiply(x, 3, stream=streams[i % 4]), i, stream=streams[(i + 1) % 4])
        expected = expected * 3 + i  # int64 wraps, as in MLX
    with tapescope.record() as rec:
        mx.eval(x)
    np.testing.assert_array_equal(np.array(x), expected)
    assert len(kinds(rec.records, "fence_update")) >= 199
    assert len(kinds(rec.records, "fence_wait")) >= 199
    # each stream ran its primitives in order on its own thread
    threads = {r.stream: set() for r in kinds(rec.records, "primitive")}
    for r in kinds(rec.records, "primitive"):
        threads[r.stream].add(r.thread)
    assert all(len(t) == 1 for t in threads.values())


def test_work_on_one_stream_runs_in_order():
    s = mx.new_stream(mx.cpu)
    outs = []
    x = mx.array(np.zeros(4, np.int32))
    for i in range(50):
        x = mx.add(x, 1, stream=s)
        outs.append(x)
        mx.async_eval(x)
    mx.synchronize(s)
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(np.array(o), np.full(4, i + 1, np.int32))


def test_interrupt_outside_an_eval_does_nothing_and_does_not_latch():
    assert tapescope.interrupt_eval() is False
    x = chain(50)
    mx.eval(x)
    np.testing.assert_array_equal(np.array(x), np.full(1024, 50, np.int32))


def test_interrupt_from_a_timer_thread_resumes_to_the_right_answer(young_heap):
    rng = random.Random(1234)
    mx.clear_streams()  # no work of earlier tests may still be allocating or freeing
    gc.collect()
    base = mx.get_active_memory()
    outcomes = {"completed": 0, "interrupted": 0}
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # let the timer thread get the GIL promptly while evals run
    try:
        _interrupt_runs(rng, outcomes)
    finally:
        sys.setswitchinterval(switch)
    gc.collect()
    assert mx.get_active_memory() == base, (mx.get_active_memory() - base, outcomes)
    assert outcomes["interrupted"] > 0, outcomes


def _interrupt_runs(rng: random.Random, outcomes: dict) -> None:
    """100 evals of a 1000-node chain, each with a timer thread that fires an interrupt
    at a random time (often during the eval, sometimes after it finished)."""
    for run in range(100):
        x = chain(1000, size=256)
        stop = threading.Event()

        def fire(delay=rng.uniform(0, 0.04)):
            time.sleep(delay)
            while not stop.is_set() and not tapescope.interrupt_eval():
                time.sleep(0.0002)

        t = threading.Thread(target=fire)
        t.start()
        try:
            mx.eval(x)
            outcomes["completed"] += 1
        except KeyboardInterrupt:
            outcomes["interrupted"] += 1
            assert x._d.node is not None
        finally:
            stop.set()
            t.join()
        mx.eval(x)  # resumes where it stopped
        np.testing.assert_array_equal(np.array(x), np.full(256, 1000, np.int32))
        del x


def _softmax_chain(n: int):
    """n softmaxes of a (2, 8) array: each node's kernel is launched from the loop's C part
    with the GIL held (no Python runs between nodes: as a GPU stream's launches)."""
    x = mx.array(np.linspace(0, 1, 16, dtype=np.float32).reshape(2, 8))
    for _ in range(n):
        x = mx.softmax(x, axis=-1)
    return x


HANDOVERS = 12  # times the waiting thread must get the GIL during one eval


def test_an_eval_that_stays_in_c_hands_the_gil_to_a_waiting_thread_every_few_nodes():
    """The loop hands the GIL to a thread waiting for it every few nodes (its yield point:
    the interpreter's eval breaker), again and again through one eval whose nodes never
    leave C: a thread that gives the GIL up and asks for it back (``time.sleep(0)``) gets it
    ``HANDOVERS`` times while the eval runs, then its interrupt_eval stops the eval. Without
    the yield point it gets the GIL back at most a couple of times in the whole eval (where
    the eval runs Python), and the eval finishes first. Counted in handovers, not time: a
    slower or busier machine makes the eval longer, which only adds handovers."""
    mx.eval(_softmax_chain(3))  # the kernel built
    x = _softmax_chain(40000)
    handovers = 0
    done = threading.Event()

    def waiter():
        nonlocal handovers
        while handovers < HANDOVERS and not done.is_set():
            time.sleep(0)  # the GIL given up: taking it back waits for the eval to hand it over
            handovers += stream_workers.Interrupt.running()
        while not done.is_set() and not tapescope.interrupt_eval():
            time.sleep(0)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # (a waiter asks for the GIL after 0.5 ms, not 5)
    t = threading.Thread(target=waiter)
    t.start()
    try:
        mx.eval(x)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        done.set()
        t.join()
        sys.setswitchinterval(switch)
    assert interrupted and handovers >= HANDOVERS, (interrupted, handovers)
    assert x._d.node is not None
    mx.eval(x)  # resumes; a softmax of a softmax soon reaches the uniform row
    np.testing.assert_allclose(np.array(x), np.full((2, 8), 1 / 8), rtol=1e-6)


def _eval_through_a_sigint(x, delay: float) -> None:
    """``mx.eval(x)`` with a SIGINT sent ``delay`` s in: it raises KeyboardInterrupt with the
    rest of ``x`` still lazy, and a second eval finishes it."""
    t = threading.Thread(target=lambda: (time.sleep(delay), os.kill(os.getpid(), signal.SIGINT)))
    t.start()
    with pytest.raises(KeyboardInterrupt):
        mx.eval(x)
    t.join()
    assert x._d.node is not None
    mx.eval(x)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals need the main thread")
def test_sigint_stops_an_eval_that_stays_in_c():
    """The loop runs pending signal handlers every few nodes (the eval's SIGINT handler sets
    the interrupt flag), as the interpreter does between bytecodes."""
    mx.eval(_softmax_chain(3))
    x = _softmax_chain(20000)
    _eval_through_a_sigint(x, 0.01)
    np.testing.assert_allclose(np.array(x), np.full((2, 8), 1 / 8), rtol=1e-6)


def test_interrupt_on_a_worker_stream_stops_and_resumes():
    s = mx.new_stream(mx.cpu)
    x = mx.array(np.zeros(64, np.int32))
    for _ in range(2000):
        x = mx.add(x, 1, stream=s)
    gate = block_stream(s)
    mx.async_eval(x)
    assert tapescope.interrupt_eval() is True  # the eval is running (queued on s)
    gate.set()
    mx.synchronize(s)
    assert x._d.node is not None  # stopped at a node boundary, rest lazy
    mx.eval(x)
    np.testing.assert_array_equal(np.array(x), np.full(64, 2000, np.int32))


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals need the main thread")
def test_sigint_during_eval_interrupts_it_and_outside_eval_behaves_as_before():
    x = chain(20000, size=16)
    _eval_through_a_sigint(x, 0.05)
    np.testing.assert_array_equal(np.array(x), np.full(16, 20000, np.int32))
    with pytest.raises(KeyboardInterrupt):  # no eval running: the usual KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)


def test_eight_threads_evaluate_independent_graphs():
    errors = []
    results = {}

    def work(i):
        try:
            x = mx.array(np.full(512, i, np.float32))
            for k in range(200):
                x = x * 1.0 + 1.0
            mx.eval(x)
            results[i] = np.array(x)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for i in range(8):
        np.testing.assert_array_equal(results[i], np.full(512, i + 200, np.float32))


def test_threads_sharing_one_graph_compute_it_once():
    with mx.stream(mx.new_thread_unsafe_stream(mx.cpu)):  # MLX 0.32: other threads may eval it
        x = mx.array(np.arange(100, dtype=np.float32))
        shared = mx.exp(x * 0.01)
        outs = [shared + float(i) for i in range(8)]
    with tapescope.record() as rec:
        ts = [threading.Thread(target=mx.eval, args=(o,)) for o in outs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    exp_runs = [r for r in kinds(rec.records, "primitive") if r.name == "Exp"]
    assert len(exp_runs) == 1
    ref = np.exp(np.arange(100, dtype=np.float32) * np.float32(0.01))
    for i, o in enumerate(outs):
        np.testing.assert_allclose(np.array(o), ref + i, rtol=1e-6)


def test_an_error_on_a_worker_reaches_the_caller_and_leaves_the_graph_valid():
    s = mx.new_stream(mx.cpu)
    huge = mx.add(mx.broadcast_to(mx.array(1.0), (1 << 24, 1 << 24)), 1.0, stream=s)
    with pytest.raises(RuntimeError, match=r"\[malloc\]"):
        mx.eval(huge)
    assert huge._d.node is not None
    ok = mx.add(mx.array(np.ones(3, np.float32)), 1.0, stream=s)
    np.testing.assert_array_equal(np.array(ok), np.full(3, 2.0, np.float32))


def test_synchronize_default_and_clear_streams():
    s = mx.new_stream(mx.cpu)
    x = mx.add(mx.array(np.ones(4, np.float32)), 1.0, stream=s)
    mx.async_eval(x)
    mx.synchronize(s)
    mx.synchronize()
    mx.clear_streams()
    y = mx.add(x, 1.0, stream=s)  # workers restart on use
    np.testing.assert_array_equal(np.array(y), np.full(4, 3.0, np.float32))


def test_timeline_has_eval_primitive_and_event_records():
    s = mx.new_stream(mx.cpu)
    with tapescope.record() as rec:
        x = mx.add(mx.array(np.ones(4, np.float32)), 2.0, stream=s)
        mx.async_eval(x)
        mx.eval(x)
    ks = {r.kind for r in rec.records}
    assert {"eval_begin", "eval_end", "primitive", "event_signal"} <= ks
    prim = kinds(rec.records, "primitive")[-1]
    assert prim.name == "Add" and prim.stream == s.index and prim.end_ns >= prim.start_ns
    assert prim.nbytes == 16 and prim.node is not None and prim.thread is not None


def test_a_consumer_waits_for_a_producer_another_thread_runs_inline(monkeypatch):
    """Thread A evaluates a slow node inline on a stream any thread may use (MLX 0.32's
    new_thread_unsafe_stream); thread B evaluates a consumer of it on the same stream meanwhile: B waits for A's event and gets the right
    value (it must not find the input still lazy and stop)."""
    from tapescope.kernels import primitives

    started = threading.Event()

    def slow_exp(xp, a, out=None):
        started.set()
        time.sleep(0.3)
        return np.exp(a)

    exp = primitives.lookup("Exp")
    monkeypatch.setattr(exp, "rule", slow_exp)
    monkeypatch.setattr(exp, "takes_out", False)
    try:
        with mx.stream(mx.new_thread_unsafe_stream(mx.cpu)):
            x = mx.array(np.linspace(0, 1, 8, dtype=np.float32)) * 1.0
            mx.eval(x)
            y = mx.exp(x)
            z = y + 1.0
        errors = []
        a = threading.Thread(target=mx.eval, args=(y,))
        a.start()
        started.wait(5)

        def consume():
            try:
                mx.eval(z)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        b = threading.Thread(target=consume)
        b.start()
        a.join()
        b.join()
        assert not errors, errors
        np.testing.assert_allclose(np.array(z), np.exp(np.array(x)) + 1, rtol=1e-6)
    finally:
        monkeypatch.undo()


def test_a_fence_count_is_reached_only_when_its_own_producer_has_run(monkeypatch):
    """Stream s1 runs x1 then a slow x2 = exp(x1); on s2, x2's consumer comes before x1's in
    the eval's order. Each producer's fence count follows s1's order, so x1's update cannot
    release x2's consumer while exp still runs (counts handed out in the consumers' order
    did: the consumer found exp's output lazy and the eval ended in KeyboardInterrupt, as
    MLX's test_linalg did on the GPU, where linalg's CPU-stream outputs feed GPU ops)."""
    from tapescope.kernels import primitives

    def slow_exp(xp, a, out=None):
        time.sleep(0.2)
        return np.exp(a)

    exp = primitives.lookup("Exp")
    monkeypatch.setattr(exp, "rule", slow_exp)
    monkeypatch.setattr(exp, "takes_out", False)
    s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
    a = np.linspace(0, 1, 16, dtype=np.float32)
    x1 = mx.multiply(mx.array(a), 2.0, stream=s1)
    x2 = mx.exp(x1, stream=s1)
    out = mx.add(mx.add(x2, 1.0, stream=s2), mx.subtract(x1, 1.0, stream=s2), stream=s2)
    with tapescope.record() as rec:
        try:
            mx.eval(out)
        except KeyboardInterrupt as e:  # nobody interrupted: a consumer ran before its input
            pytest.fail(f"the eval stopped: {e}")
    np.testing.assert_allclose(np.array(out), (np.exp(a * 2) + 1) + (a * 2 - 1), rtol=1e-6)
    assert len(kinds(rec.records, "fence_wait")) == 2
