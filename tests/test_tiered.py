"""Tiered first calls (``tapescope.set_tiered``): a new kernel's first calls run interpreted
while its C builds in the background, later calls launch the kernel; the values equal
numpy's on both sides of the switch, the timeline and the graph say which ran, and a build
that fails or is interrupted leaves no half-built entry in the kernel cache."""

from __future__ import annotations

import math
import os
import stat
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope
import tapescope.core as mx
from tapescope.kernels.codegen.interpret import interpret, interpret_blocked
from tapescope.kernels import timeline
from tapescope.kernels import disk_cache
from tapescope.kernels.cpu import compiler, tiered

needs_compiler = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Tiering on, a fresh private cache root and temporary directory, an empty in-process cache."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TAPESCOPE_CACHE_DIR", str(tmp_path / "kcache"))
    tiered.wait()
    tapescope.clear_kernel_cache()
    prev = tapescope.set_tiered(True)
    yield tmp_path
    tapescope.set_tiered(prev)
    tiered.wait()
    tapescope.clear_kernel_cache()


def _gelu(m):
    return lambda x, r: 0.5 * x * (1 + m.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))) + r


def _gelu64(x, r):
    x, r = x.astype(np.float64), r.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))) + r


class _recorded:
    """``with _recorded() as recs:``: the timeline records made inside the block."""

    def __enter__(self) -> list:
        self.rec = tapescope.record()
        self.rec.__enter__()
        self.seq, self.out = timeline.next_seq(), []
        return self.out

    def __exit__(self, *exc) -> None:
        self.out.extend(timeline.records_since(self.seq))
        self.rec.__exit__(*exc)


def _tiers(records, kinds=("kernel_fallback", "kernel_launch")) -> list:
    return [r.detail.get("tier") for r in records if r.kind in kinds]


@needs_compiler
def test_first_call_runs_interpreted_then_the_kernel_with_numpys_values(cache):
    rng = np.random.default_rng(0)
    xn = rng.uniform(-4, 4, (300, 257)).astype(np.float32)  # blocks of rows, a ragged last one
    rn = rng.uniform(-1, 1, 257).astype(np.float32)  # a broadcast row
    f = mx.compile(_gelu(mx))
    x, r = mx.array(xn), mx.array(rn)
    ref = _gelu64(xn, rn)
    with _recorded() as during:
        first = f(x, r)
        mx.eval(first)
    assert _tiers(during) == ["interpreted"]
    fallback = next(r for r in during if r.kind == "kernel_fallback")
    assert "builds in the background" in fallback.detail["reason"]
    graph = tapescope.graph_of(f(x, r))
    assert graph.kernels[0].tier in ("interpreted", "kernel")  # the build may be done already
    assert tiered.wait(timeout=120)
    assert tapescope.graph_of(f(x, r)).kernels[0].tier == "kernel"
    with _recorded() as after:
        second = f(x, r)
        mx.eval(second)
    assert _tiers(after) == ["kernel"]
    for got in (first, second):
        np.testing.assert_allclose(np.array(got), ref, rtol=2e-6, atol=2e-6)
    entry = next(e for e in tapescope.kernel_cache() if e["name"] == graph.kernels[0].symbol)
    assert entry["runtime"] == "cpu" and entry["interpreted"] == 1 and entry["origin"] == "built"


@needs_compiler
def test_graph_picture_says_interpreted_while_building(cache, monkeypatch):
    """The picture marks a kernel that ran interpreted; the mark goes once the C runs."""
    pytest.importorskip("graphviz")
    from tapescope.viz.dot import to_dot

    gate = __import__("threading").Event()
    real = compiler._build_and_load

    def slow(*a, **k):  # hold the build until the picture is drawn
        gate.wait(60)
        return real(*a, **k)

    monkeypatch.setattr(compiler, "_build_and_load", slow)
    f = mx.compile(lambda x: mx.exp(x) * 3 - x)
    x = mx.array(np.linspace(-1, 1, 64, dtype=np.float32))
    with _recorded() as recs:
        for _ in range(3):  # calls while it builds run interpreted at once (no waiting)
            np.testing.assert_allclose(np.array(f(x)), np.exp(np.array(x)) * 3 - np.array(x),
                                       rtol=1e-6)
    assert _tiers(recs) == ["interpreted"] * 3
    g = tapescope.graph_of(f(x))
    assert g.kernels[0].tier == "interpreted"
    assert "interpreted (C building)" in to_dot(g)
    gate.set()
    assert tiered.wait(timeout=120)
    g = tapescope.graph_of(f(x))
    assert g.kernels[0].tier == "kernel" and "interpreted" not in to_dot(g)


@needs_compiler
def test_builds_of_a_batch_run_in_parallel(cache, monkeypatch):
    """Two new kernels' builds overlap (each kernel has its own lock, not one global one)."""
    import threading

    inside, most = [0], [0]
    lock = threading.Lock()
    real = compiler.build

    def counting(*a, **k):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            return real(*a, **k)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(compiler, "build", counting)
    x = mx.array(np.linspace(-1, 1, 64, dtype=np.float32))
    fs = [mx.compile(lambda x, c=c: mx.sin(x) * c + x) for c in (2.0, 3.0, 5.0)]
    outs = [f(x) for f in fs]
    mx.eval(*outs)
    assert tiered.wait(timeout=120)
    assert most[0] >= 2
    for c, o in zip((2.0, 3.0, 5.0), outs):
        np.testing.assert_allclose(np.array(o), np.sin(np.array(x)) * c + np.array(x), rtol=1e-6)


def _cache_files(root) -> list:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


@needs_compiler
def test_failed_background_build_falls_back_with_its_reason_and_leaves_no_entry(cache, monkeypatch):
    real = compiler.build

    def broken(tc, name, source, workdir):
        return real(tc, name, source + "\n#error deliberately broken\n", workdir)

    monkeypatch.setattr(compiler, "build", broken)
    f = mx.compile(lambda x: mx.cos(x) + 1)
    xn = np.linspace(-3, 3, 40, dtype=np.float32)
    with _recorded() as recs:
        a = f(mx.array(xn))
        mx.eval(a)
        assert tiered.wait(timeout=120)
        b = f(mx.array(xn))
        mx.eval(b)
    assert _tiers(recs) == ["interpreted", "fallback"]
    assert "deliberately broken" in [r for r in recs if r.kind == "kernel_fallback"][1].detail["reason"]
    for got in (a, b):
        np.testing.assert_allclose(np.array(got), np.cos(xn) + 1, rtol=1e-6)
    assert not [n for n in _cache_files(cache / "kcache") if n.endswith((".so", ".json", ".c"))]
    assert not list((cache / "tmp").glob(disk_cache.BUILD_PREFIX + "*"))


@needs_compiler
def test_interrupt_while_storing_leaves_no_half_entry(cache, monkeypatch):
    """An interrupt between the library and its sidecar removes what was written: the cache
    holds whole entries only (the next process rebuilds, it never finds a library alone)."""
    real = disk_cache._atomic_write

    def interrupted(path, data):
        if path.suffix == ".json":
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(disk_cache, "_atomic_write", interrupted)
    tapescope.set_tiered(False)  # in the caller's thread, where an interrupt arrives
    f = mx.compile(lambda x: mx.sin(x) - 2)
    with pytest.raises(KeyboardInterrupt):
        mx.eval(f(mx.array(np.ones(8, np.float32))))
    assert _cache_files(cache / "kcache") == []
    assert not list((cache / "tmp").glob(disk_cache.BUILD_PREFIX + "*"))
    monkeypatch.setattr(disk_cache, "_atomic_write", real)
    out = f(mx.array(np.ones(8, np.float32)))
    np.testing.assert_allclose(np.array(out), np.sin(np.ones(8, np.float32)) - 2, rtol=1e-6)
    files = _cache_files(cache / "kcache")
    assert len([n for n in files if n.endswith(".so")]) == 1
    assert len([n for n in files if n.endswith(".json")]) == 1
    folder = next(p for p in (cache / "kcache").iterdir() if p.is_dir())
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


@needs_compiler
def test_a_kernel_on_disk_loads_without_interpreting(cache):
    """With the toolchain known, a kernel already in the disk cache is loaded on the first
    call (nothing to wait for), not interpreted."""
    f = mx.compile(lambda x: mx.tanh(x) * x)
    x = mx.array(np.linspace(-2, 2, 32, dtype=np.float32))
    mx.eval(f(x))
    assert tiered.wait(timeout=120)
    compiler._kernels.clear()  # a new process's memory, the same disk
    with _recorded() as recs:
        mx.eval(mx.compile(lambda x: mx.tanh(x) * x)(x))
    assert _tiers(recs) == ["kernel"]
    assert [r.detail["origin"] for r in recs if r.kind == "kernel_build"] == ["disk"]


# -- the blocked interpreter the tiered calls run ---------------------------------------

def _tape_of(fn, *xs):
    out = mx.compile(fn)(*[mx.array(x) for x in xs])
    prim = out._d.node.primitive
    tape = prim.kw["tape"]
    vals = iter(xs)
    ins = [np.asarray(np.asarray(v.constant).astype(v.dtype)) if v.is_constant else next(vals)
           for v in tape.inputs]
    return tape, ins, prim.kw["shape"]


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 200), cols=st.sampled_from([1, 3, 64, 333, 40000]),
       power=st.sampled_from([0, 1, 2, 3, 4, 2.5]), seed=st.integers(0, 2 ** 16),
       col_broadcast=st.booleans())
def test_blocked_interpreter_equals_numpy(rows, cols, power, seed, col_broadcast):
    """Blocked (rows of a leading axis, a broadcast operand, small integer powers by
    multiplication) against float64 numpy, within the float32 rounding of each op."""
    rng = np.random.default_rng(seed)
    xn = rng.uniform(-3, 3, (rows, cols)).astype(np.float32)
    yn = rng.uniform(-3, 3, (rows, 1) if col_broadcast else (cols,)).astype(np.float32)
    tape, ins, shape = _tape_of(lambda x, y: x ** power * y - mx.exp(-x), xn, yn)
    got = interpret_blocked(tape, ins, shape)[0]
    x64, y64 = xn.astype(np.float64), yn.astype(np.float64)
    with np.errstate(invalid="ignore"):  # a negative base to the 2.5: NaN in both
        ref = x64 ** power * y64 - np.exp(-x64)
        scale = np.maximum(np.abs(x64 ** power * y64), 1.0) + np.exp(-x64)
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.all(np.abs(got - ref)[ok] <= 4e-7 * 4 * scale[ok])
    whole = interpret(tape, ins, shape)[0]  # numpy's power, unblocked: the same bound
    assert np.all(np.abs(whole - ref)[ok] <= 4e-7 * 4 * scale[ok])


def test_small_powers_keep_ieee_special_values():
    """x ** n by multiplication gives pow's answers on zeros, infinities and NaN."""
    xn = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -2.0, 3.0e38, 1e-30], np.float32)
    for n in (0, 1, 2, 3, 4):
        tape, ins, shape = _tape_of(lambda x, n=n: x ** n, np.resize(xn, 2 ** 16))
        got = interpret_blocked(tape, ins, shape)[0][:len(xn)]
        with np.errstate(all="ignore"):
            ref = np.power(xn, np.float32(n))
        np.testing.assert_array_equal(np.signbit(got), np.signbit(ref))
        np.testing.assert_array_equal(got, ref)


# -- the remembered compiler probe ------------------------------------------------------

@needs_compiler
def test_the_compiler_probe_is_remembered_privately_and_reprobed_when_stale(cache):
    """A new process reads the probe's answer instead of probing (~100-200 ms); a record
    whose flags no longer build is dropped, the compiler probed again and the kernel built;
    a record others may write is ignored."""
    tapescope.set_tiered(False)
    f = mx.compile(lambda x: mx.sin(x) * 2)
    x = mx.array(np.linspace(-1, 1, 16, dtype=np.float32))
    mx.eval(f(x))  # makes the cache root
    compiler.clear()  # as a new process: nothing probed, nothing loaded
    probed = compiler.toolchain()
    assert probed is not None and not probed.remembered
    records = list((cache / "kcache").glob("toolchain-*.json"))
    assert len(records) == 1 and stat.S_IMODE(os.stat(records[0]).st_mode) & 0o077 == 0
    compiler.clear()
    again = compiler.toolchain()
    assert again.remembered and again.ident == probed.ident

    info = __import__("json").loads(records[0].read_text())
    info["flags"] = info["flags"] + ["-fno-such-flag-anywhere"]
    records[0].write_text(__import__("json").dumps(info))
    compiler.clear()
    assert "-fno-such-flag-anywhere" in compiler.toolchain().flags
    g = mx.compile(lambda x: mx.cos(x) * 3)
    np.testing.assert_allclose(np.array(g(x)), np.cos(np.array(x)) * 3, rtol=1e-6)
    entry = next(e for e in tapescope.kernel_cache() if e["name"].startswith(
        g(x)._d.node.primitive.kw["tape"].lib_name))
    assert entry["runtime"] == "cpu" and entry["origin"] == "built"
    assert "-fno-such-flag-anywhere" not in compiler.toolchain().flags

    os.chmod(records[0], 0o664)  # others may write it: not trusted
    compiler.clear()
    assert not compiler.toolchain().remembered


@needs_compiler
def test_an_evals_new_kernels_build_in_parallel_without_tiering(cache, monkeypatch):
    """Without tiering, an eval that needs several new kernels starts all their builds at
    once (predicting a lazy input's layout as row-contiguous) and each call waits only for
    its own; every kernel is built exactly once and runs as C."""
    import threading

    tapescope.set_tiered(False)
    inside, most, names = [0], [0], []
    lock = threading.Lock()
    real = compiler.build

    def counting(tc, name, source, workdir):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            names.append(name)
        try:
            return real(tc, name, source, workdir)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(compiler, "build", counting)
    xn = np.linspace(-1, 1, 96, dtype=np.float32).reshape(8, 12)
    x = mx.array(xn)
    f1 = mx.compile(lambda x: mx.sin(x) * 2 + x)
    f2 = mx.compile(lambda x: mx.exp(x) - 1)
    f3 = mx.compile(lambda x: mx.tanh(x) * x)
    a = f1(x)
    b = f2(mx.sum(a, axis=1))  # its input is computed by this eval: a predicted layout
    c = f3(x)
    with _recorded() as recs:
        mx.eval(a, b, c)
    fused = [n for n in names if n != "row_reduce_sum_float32_float32"]  # mx.sum's own kernel
    assert most[0] >= 2 and len(fused) == len(set(fused)) == 3
    assert _tiers(recs) == ["kernel"] * 4  # the three fused kernels and the sum's
    ra = np.sin(xn) * 2 + xn
    np.testing.assert_allclose(np.array(a), ra, rtol=1e-6)
    np.testing.assert_allclose(np.array(b), np.exp(ra.sum(1)) - 1, rtol=1e-5)
    np.testing.assert_allclose(np.array(c), np.tanh(xn) * xn, rtol=1e-6)


@needs_compiler
def test_a_compiler_killed_by_a_signal_is_not_remembered_as_a_failure(cache, monkeypatch):
    """A build whose compiler dies of SIGINT (an interrupt) leaves nothing in the cache and
    is tried again by the next call, which then runs the kernel."""
    import dataclasses

    tapescope.set_tiered(False)
    script = cache / "cc-interrupted"
    script.write_text("#!/bin/sh\nkill -INT $$\n")
    script.chmod(0o755)
    real_tc = compiler.toolchain()
    monkeypatch.setattr(compiler, "toolchain", lambda: dataclasses.replace(real_tc, path=str(script)))
    f = mx.compile(lambda x: mx.cos(x) * 5)
    xn = np.linspace(-2, 2, 24, dtype=np.float32)
    with _recorded() as recs:
        np.testing.assert_allclose(np.array(f(mx.array(xn))), np.cos(xn) * 5, rtol=1e-6)
    reason = [r.detail["reason"] for r in recs if r.kind == "kernel_fallback"]
    assert len(reason) == 1 and "return code -2" in reason[0]
    assert not [p for p in (cache / "kcache").rglob("*") if p.is_file() and "toolchain" not in p.name]
    assert not list((cache / "tmp").glob(disk_cache.BUILD_PREFIX + "*"))
    monkeypatch.setattr(compiler, "toolchain", lambda: real_tc)
    with _recorded() as recs:
        np.testing.assert_allclose(np.array(f(mx.array(xn))), np.cos(xn) * 5, rtol=1e-6)
    assert _tiers(recs) == ["kernel"]
