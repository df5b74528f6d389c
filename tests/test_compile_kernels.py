"""Compiled tapes: kernel names in MLX's grammar, fusion boundaries, layout helpers,
the C kernel cache (memory and disk), the no-compiler fallback, math accuracy, donation."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import tapescope
import tapescope.core as mx
from conftest import requires_mlx
from tapescope.core.fusion import ARRAY_LIMIT, DEPTH_LIMIT, NEEDED_ELSEWHERE, REDUCTION, tapes
from tapescope.kernels import timeline
from tapescope.kernels.codegen import layout
from tapescope.kernels.codegen.tape import MAX_COMPILE_ARRAYS, node_name, stable_hash
from tapescope.kernels.cpu import compiler


def _tapes(g):
    return [t for p in g.programs() for t in tapes(p)]


def test_node_names_are_bijective_base26():
    assert [node_name(i) for i in (0, 1, 25, 26, 27, 51, 52, 701, 702)] == \
        ["A", "B", "Z", "AA", "AB", "AZ", "BA", "ZZ", "AAA"]


def test_kernel_name_hand_derived_with_constant_and_dtypes():
    # exp(x) + multiply(y, 2): inputs A=x, B=y, C=2 (constant); D=exp(A), E=Broadcast(C),
    # F=Multiply(B,E), G=Add(D,F)
    g = mx.compile(lambda x, y: mx.add(mx.exp(x), mx.multiply(y, 2.0)))
    g(mx.ones((4,)), mx.ones((4,), dtype=mx.float16).astype(mx.float32))
    (t,) = _tapes(g)
    assert t.lib_name == ("Df4ExpAEf4BroadcastCFf4MultiplyBEGf4AddDF_VVC_f4f4_" + stable_hash("2.0"))


def test_kernel_name_keeps_input_dtype_section():
    # AsType f16->f32 and bf16->f32 must not collide (MLX v0.26.1 lost this section)
    names = []
    for dt in (mx.float16, mx.bfloat16):
        g = mx.compile(lambda x: mx.exp(x.astype(mx.float32)) + 1.0)
        g(mx.ones((3,), dtype=dt))
        names.append(_tapes(g)[0].lib_name)
    assert names[0] == "Cf4AsTypeADf4ExpCEf4BroadcastBFf4AddDE_VC_f2_" + stable_hash("1.0")
    assert names[1] == "Cf4AsTypeADf4ExpCEf4BroadcastBFf4AddDE_VC_V2_" + stable_hash("1.0")


def test_kernel_name_constant_value_changes_hash_and_scalar_input_is_S():
    g = mx.compile(lambda x, s: mx.multiply(mx.add(x, s), 3))
    g(mx.ones((2,), dtype=mx.int32), mx.array(5, dtype=mx.int32))
    (t,) = _tapes(g)
    # A=x, B=s (0-d argument), C=3 (constant); D=Broadcast(B), E=Add(A,D), F=Broadcast(C),
    # G=Multiply(E,F)
    assert t.lib_name == "Di4BroadcastBEi4AddADFi4BroadcastCGi4MultiplyEF_VSC_i4i4_" + stable_hash("3")
    g(mx.ones((2,), dtype=mx.int32), mx.array(5, dtype=mx.int32))
    h = mx.compile(lambda x, s: mx.multiply(mx.add(x, s), 4))
    h(mx.ones((2,), dtype=mx.int32), mx.array(5, dtype=mx.int32))
    assert _tapes(h)[0].lib_name.endswith("_i4i4_" + stable_hash("4")) and stable_hash("4") != stable_hash("3")


@requires_mlx
def test_kernel_names_match_mlx_up_to_markers_and_hash(mlx, tmp_path, monkeypatch):
    """MLX 0.32 writes its CPU kernels' sources to the temp dir; its names add I/O
    markers and use std::hash — strip both and the grammar must agree."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    fns = {"a": lambda m, x, y: m.subtract(m.add(m.multiply(x, 2.0), m.multiply(y, 3.0)), m.multiply(x, y)),
           "b": lambda m, x, y: m.add(m.exp(x), m.multiply(y, 2.0)),
           "c": lambda m, x, y: m.tanh(m.maximum(m.sin(x), y))}
    code = ("import mlx.core as m, sys\n"
            "x = m.ones((8,)); y = m.ones((8,))\n")
    for k, src in (("a", "m.subtract(m.add(m.multiply(x, 2.0), m.multiply(y, 3.0)), m.multiply(x, y))"),
                   ("b", "m.add(m.exp(x), m.multiply(y, 2.0))"),
                   ("c", "m.tanh(m.maximum(m.sin(x), y))")):
        code += f"m.eval(m.compile(lambda x, y: {src})(x, y))\n"
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TMPDIR=str(tmp_path)),
                   check=True, timeout=120)
    theirs = set()
    for root, _, files in os.walk(tmp_path):
        for f in files:
            if f.endswith("_contiguous.cpp"):
                name = f[: -len("_contiguous.cpp")]
                name = re.sub(r"(\d)[IO](?=[A-Z][a-z])", r"\1", name)
                theirs.add(name.rsplit("_", 1)[0])
    assert len(theirs) == 3
    ours = set()
    for fn in fns.values():
        g = mx.compile(lambda x, y, fn=fn: fn(mx, x, y))
        g(mx.ones((8,)), mx.ones((8,)))
        ours |= {t.lib_name.rsplit("_", 1)[0] for t in _tapes(g)}
    assert ours == theirs


def test_reduction_ends_a_tape_and_reason_is_recorded():
    g = mx.compile(lambda x: mx.exp(mx.sum(mx.sin(x) * 2.0, axis=0, keepdims=True)) + 1.0)
    out = g(mx.ones((3, 4)))
    np.testing.assert_allclose(np.array(out), np.exp(np.sin(np.ones((3, 4))).sum(0, keepdims=True) * 2) + 1,
                               rtol=1e-5)
    (p,) = g.programs()
    assert [gg.prim.name for gg in p.tape] == ["Compiled", "Sum", "Compiled"]
    assert [b.producer for b in p.boundaries if b.reason == REDUCTION] == ["Sum"]


def test_value_used_outside_the_tape_stops_fusion_with_reason():
    def f(x):
        a = mx.sin(x) * 2.0
        return mx.exp(a) + 1.0, mx.sum(a)

    g = mx.compile(f)
    o1, o2 = g(mx.ones((5,)))
    a = np.sin(np.ones(5, np.float32)) * 2
    np.testing.assert_allclose(np.array(o1), np.exp(a) + 1, rtol=1e-6)
    np.testing.assert_allclose(np.array(o2), a.sum(), rtol=1e-6)
    p = g.programs()[0]
    assert any(b.reason == NEEDED_ELSEWHERE for b in p.boundaries)


def test_depth_limit_splits_long_chains():
    def f(x):
        for _ in range(30):
            x = mx.sin(x)
        return x

    g = mx.compile(f)
    out = g(mx.ones((4,)))
    ref = np.ones(4, np.float32)
    for _ in range(30):
        ref = np.sin(ref)
    np.testing.assert_allclose(np.array(out), ref, rtol=1e-5)
    ts = _tapes(g)
    assert len(ts) >= 3 and all(len(t.ops) <= 11 for t in ts)
    assert any(b.reason == DEPTH_LIMIT for b in g.programs()[0].boundaries)


def test_array_limit_caps_inputs_plus_outputs_per_kernel():
    def f(*xs):
        acc = xs[0]
        for x in xs[1:]:
            acc = mx.add(acc, x) if len(xs) < 0 else acc + x
        return acc

    xs = [mx.full((3,), float(i)) for i in range(40)]
    g = mx.compile(lambda *a: _balanced(list(a)))
    out = g(*xs)
    np.testing.assert_allclose(np.array(out), np.full(3, sum(range(40))), rtol=1e-6)
    for t in _tapes(g):
        assert len(t.non_constant_inputs) + len(t.outputs) <= MAX_COMPILE_ARRAYS
    assert any(b.reason == ARRAY_LIMIT for b in g.programs()[0].boundaries)


def _balanced(xs):
    while len(xs) > 1:
        xs = [xs[i] + xs[i + 1] if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
    return xs[0]


def test_tape_with_several_outputs():
    g = mx.compile(lambda x: (mx.sin(x) * 2.0, mx.sin(x) * 2.0 + 1.0))
    a, b = g(mx.ones((6,)))
    (t,) = _tapes(g)
    assert len(t.outputs) == 2
    r = np.sin(np.ones(6, np.float32)) * np.float32(2)
    np.testing.assert_allclose(np.array(a), r, rtol=1e-6)
    np.testing.assert_allclose(np.array(b), r + 1, rtol=1e-6)


def test_scalar_constants_merge_and_cse():
    g = mx.compile(lambda x: mx.exp(x) * 2.0 + mx.exp(x) * 2.0)
    g(mx.ones((3,)))
    (t,) = _tapes(g)
    assert [op.primitive for op in t.ops].count("Exp") == 1
    assert len(t.constants) == 1


# -- layout -----------------------------------------------------------------------------

def test_collapse_contiguous_dims_hand_cases():
    assert layout.collapse_contiguous_dims([2, 3, 4], [[12, 4, 1]]) == ([24], [[1]])
    assert layout.collapse_contiguous_dims([4, 1, 5], [[5, 5, 1], [0, 0, 1]]) == ([4, 5], [[5, 1], [0, 1]])
    assert layout.collapse_contiguous_dims([1, 1], [[1, 1]]) == ([1], [[0]])
    assert layout.collapse_contiguous_dims([3, 4], [[4, 1], [1, 3]]) == ([3, 4], [[4, 1], [1, 3]])
    assert layout.collapse_contiguous_dims([2, 3], [[3, 1]], size_cap=4) == ([2, 3], [[3, 1]])


def test_broadcast_strides_borrow_output_stride_on_size1_dims():
    assert layout.broadcast_strides((3, 1, 4), (4, 4, 1), (1, 4), (4, 1)) == [0, 4, 1]
    assert layout.broadcast_strides((3, 4), (4, 1), (4,), (1,)) == [0, 1]
    assert layout.broadcast_strides((3, 4), (4, 1), (3, 1), (1, 1)) == [1, 0]


def test_check_contiguity_rules():
    a = np.ones((3, 4), np.float32)
    assert layout.check_contiguity([a, a, np.float32(1) * np.ones(())], (3, 4))
    assert not layout.check_contiguity([a, np.asfortranarray(a)], (3, 4))
    assert layout.check_contiguity([np.asfortranarray(a)], (3, 4))
    assert layout.check_contiguity([np.ones((4, 3), np.float32).T, np.ones((4, 3), np.float32).T], (3, 4))
    assert not layout.check_contiguity([np.ones(4, np.float32)], (3, 4))
    assert layout.check_contiguity([], ()) and not layout.check_contiguity([], (2,))


def test_large_index_threshold_is_uint32_max():
    class Fake:
        ndim, flags = 1, type("F", (), {"c_contiguous": True, "f_contiguous": True})()

        def __init__(self, n):
            self.size = n

    assert not layout.use_large_index([Fake(2**32 - 1)], [1], True)
    assert layout.use_large_index([Fake(2**32)], [1], True)
    assert layout.use_large_index([], [2**32], False) and not layout.use_large_index([], [2**32 - 1], False)


# -- variants, cache, disk, fallback -----------------------------------------------------

@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TAPESCOPE_CACHE_DIR", str(tmp_path / "kcache"))
    tapescope.clear_kernel_cache()
    yield tmp_path / "kcache"
    tapescope.clear_kernel_cache()


def _entry(suffix):
    return [e for e in tapescope.kernel_cache() if e["name"].endswith(suffix)]


def test_variants_and_hit_counts(fresh_cache):
    g = mx.compile(lambda x, y: mx.tanh(x) * y - 1.5)
    x = mx.array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    y = mx.array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    for _ in range(3):
        mx.eval(g(x, y))
    mx.eval(g(mx.transpose(x.reshape(4, 3)), y))  # strided, 2 dims
    (c,) = [e for e in _entry("_contiguous") if "Tanh" in e["name"]]  # this tape's
    assert (c["hits"], c["misses"], c["runtime"]) == (2, 1, "cpu")
    assert c["variant"] == "contiguous" and c["build_ms"] > 0 and "void " in c["source"]
    (s,) = [e for e in _entry("_strided_2") if "Tanh" in e["name"]]
    assert s["misses"] == 1 and s["hits"] == 0
    assert os.path.exists(c["disk_path"])
    assert (os.stat(fresh_cache).st_mode & 0o777) == 0o700


def test_timeline_records_build_and_hit(fresh_cache):
    g = mx.compile(lambda x: mx.sin(x) + 0.25)
    with tapescope.record() as rec:
        mx.eval(g(mx.ones((5,))))
        mx.eval(g(mx.ones((5,))))
    builds = [r for r in rec.records if r.kind == "kernel_build"]
    assert [r.detail["hit"] for r in builds] == [False, True]
    assert builds[0].detail["origin"] == "built" and builds[0].detail["compile_ms"] > 0


def test_disk_cache_is_reused_and_corrupt_entry_rebuilt(fresh_cache):
    f = lambda x: mx.cos(x) * 3.0 - x  # noqa: E731
    x = mx.array(np.linspace(-3, 3, 7, dtype=np.float32))
    ref = np.cos(np.linspace(-3, 3, 7, dtype=np.float32)) * np.float32(3) - np.linspace(-3, 3, 7, dtype=np.float32)
    np.testing.assert_allclose(np.array(mx.compile(f)(x)), ref, rtol=1e-6)
    (e,) = tapescope.kernel_cache()
    path = e["disk_path"]
    tapescope.clear_kernel_cache()  # new "process": memory empty, disk kept
    np.testing.assert_allclose(np.array(mx.compile(f)(x)), ref, rtol=1e-6)
    assert tapescope.kernel_cache()[0]["origin"] == "disk"
    # truncate the library (a new file, as another process would leave it: this process
    # still maps the old one): it must be rebuilt, never loaded
    data = open(path, "rb").read()
    _replace(path, data[:100])
    tapescope.clear_kernel_cache()
    np.testing.assert_allclose(np.array(mx.compile(f)(x)), ref, rtol=1e-6)
    assert tapescope.kernel_cache()[0]["origin"] == "built"
    assert os.path.getsize(path) > 100
    # a foreign file (no matching hash sidecar) is rebuilt too
    _replace(path, b"\x7fELF not ours")
    tapescope.clear_kernel_cache()
    np.testing.assert_allclose(np.array(mx.compile(f)(x)), ref, rtol=1e-6)
    assert tapescope.kernel_cache()[0]["origin"] == "built"


def _replace(path, data):
    tmp = path + ".corrupt"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def test_no_compiler_on_path_falls_back_to_numpy(fresh_cache, monkeypatch):
    monkeypatch.setenv("PATH", str(fresh_cache))
    monkeypatch.delenv("CC", raising=False)
    f = lambda x, y: mx.exp(x) * y + mx.maximum(x, y)  # noqa: E731
    xn = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    yn = np.linspace(1, 3, 4, dtype=np.float32)
    with tapescope.record() as rec:
        out = mx.compile(f)(mx.array(xn), mx.array(yn))
        mx.eval(out)
    np.testing.assert_allclose(np.array(out), np.exp(xn) * yn + np.maximum(xn, yn), rtol=1e-6)
    fb = [r for r in rec.records if r.kind == "kernel_fallback"]
    assert fb and "no C compiler" in fb[0].detail["reason"]
    assert tapescope.kernel_cache()[0]["runtime"] == "numpy"


def test_a_tape_the_dialect_cannot_render_falls_back_with_reason(fresh_cache):
    """A tape handed down with an op the C dialect cannot spell (fusion never builds one: it
    stops at such an op) still runs, interpreted with numpy, and the timeline says why."""
    import math

    from tapescope.kernels.codegen.tape import TapeInput, TapeOp, make_tape
    from tapescope.kernels.cpu.compiled import run_compiled

    f4 = np.dtype(np.float32)
    tape = make_tape([TapeInput("A", f4)], [TapeOp("B", "ErfInv", f4, ("A",)),
                                            TapeOp("C", "Add", f4, ("B", "B"))], ["C"])
    vals = np.array([0.1, -0.2, 0.4], np.float32)
    with tapescope.record() as rec:
        (out,) = run_compiled(tape, [vals], (3,))
    got = np.asarray(out).astype(np.float64) / 2.0
    np.testing.assert_allclose([math.erf(v) for v in got], vals.astype(np.float64), rtol=1e-5)
    fb = [r for r in rec.records if r.kind == "kernel_fallback"]
    assert fb and "ErfInv" in fb[0].detail["reason"]


# -- donation ------------------------------------------------------------------------------

def test_donation_rules_for_compiled_outputs():
    from tapescope.kernels.codegen.tape import TapeInput, TapeOp, make_tape
    from tapescope.kernels.cpu.compiled import allocate_outputs

    f4 = np.dtype(np.float32)
    t = make_tape([TapeInput("A", f4), TapeInput("B", f4, scalar=True), TapeInput("C", f4, constant=2.0)],
                  [TapeOp("D", "Add", f4, ("A", "B"))], ["D"])
    a, s, c = np.ones((3, 4), f4), np.ones((), f4), np.ones((), f4)
    (o,) = allocate_outputs(t, [a, s, c], (3, 4), True, [True, True, True])
    assert np.shares_memory(o, a)  # contiguous, donatable
    (o,) = allocate_outputs(t, [a, s, c], (3, 4), True, [False, True, True])
    assert not np.shares_memory(o, a) and not np.shares_memory(o, s) and not np.shares_memory(o, c)
    at = np.ones((4, 3), f4).T  # strided path: not row-contiguous -> no donation
    (o,) = allocate_outputs(t, [at, s, c], (3, 4), False, [True, True, True])
    assert not np.shares_memory(o, at)
    (o,) = allocate_outputs(t, [a, s, c], (3, 4), False, [True, True, True])
    assert np.shares_memory(o, a)


def test_donation_keeps_memory_flat():
    step = mx.compile(lambda x: mx.sin(x) * 0.5 + 0.25)
    x = mx.ones((1 << 16,))
    mx.eval(x)
    x = step(x)
    mx.eval(x)
    base = mx.get_active_memory()
    for _ in range(20):
        x = step(x)
        mx.eval(x)
    assert mx.get_active_memory() <= base


# -- math accuracy -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["exp", "sin", "cos", "tanh", "log", "log1p", "expm1", "sinh",
                                  "cosh", "arctan", "arcsinh", "sqrt"])
def test_generated_math_within_4_ulp_of_float64(name):
    rng = np.random.default_rng(0)
    lo, hi = {"log": (1e-30, 1e30), "log1p": (-0.999, 1e6), "sqrt": (0, 1e30), "exp": (-100, 88),
              "expm1": (-100, 88), "sinh": (-88, 88), "cosh": (-88, 88)}.get(name, (-100, 100))
    small = np.concatenate([rng.uniform(lo, hi, 20000), np.linspace(lo, hi, 5000),
                            rng.uniform(max(lo, -1), min(hi, 1), 5000)]).astype(np.float32)
    # ``* 1.0`` (exact, keeps -0/inf/NaN) makes a two-op tape, so the generated C runs (a
    # lone op is not fused); the large size takes the vectorised streaming loop
    fn = mx.compile(lambda v: getattr(mx, name)(v) * 1.0)
    for vals in (small, np.tile(small, 71)):
        out = np.array(fn(mx.array(vals)))
        with np.errstate(all="ignore"):
            ref = getattr(np, name)(vals.astype(np.float64))
        finite = np.isfinite(ref) & (np.abs(ref) < np.finfo(np.float32).max)
        ulp = np.spacing(np.abs(ref[finite]).astype(np.float32)).astype(np.float64)
        err = np.abs(out[finite].astype(np.float64) - ref[finite]) / np.maximum(ulp, np.finfo(np.float32).smallest_subnormal)
        assert err.max() <= 4.0, (name, vals.size, err.max())
    assert {e["runtime"] for e in tapescope.kernel_cache() if e["name"].startswith(
        _tapes(fn)[0].lib_name)} == {"cpu"}
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    so = np.array(fn(mx.array(special)))
    with np.errstate(all="ignore"):
        sr = getattr(np, name)(special)
    np.testing.assert_array_equal(np.isnan(so), np.isnan(sr))
    m = ~np.isnan(sr)
    np.testing.assert_array_equal(so[m], sr[m])
    np.testing.assert_array_equal(np.signbit(so[m]), np.signbit(sr[m]))


def test_tapes_differing_only_in_outputs_get_their_own_kernels():
    """MLX's kernel name does not say which tape nodes are outputs; a 1-output and a
    2-output tape over the same ops must not share a compiled kernel (that wrote through
    the wrong argument list and crashed)."""
    x = mx.array(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6))

    def both(a):
        y = mx.exp(a * 2.0)
        return y, mx.sin(y)

    def last(a):
        return mx.sin(mx.exp(a * 2.0))

    ref_y = np.exp(np.array(x) * np.float32(2.0))
    for order in ((both, last), (last, both)):
        tapescope.clear_kernel_cache()
        for fn in order:
            out = mx.compile(fn)(x)
            outs = out if isinstance(out, tuple) else (out,)
            mx.eval(*outs)
            np.testing.assert_allclose(np.array(outs[-1]), np.sin(ref_y), rtol=1e-5)
            if len(outs) == 2:
                np.testing.assert_allclose(np.array(outs[0]), ref_y, rtol=1e-6)
    names = [e["name"] for e in tapescope.kernel_cache() if "Sin" in e["name"]]
    assert len(names) >= 2 and len(set(names)) == 1  # same MLX name, separate entries


def test_generated_erf_within_4_ulp_of_float64():
    """Erf (GELU's) runs as generated C (glibc's erff) within 4 ulp of a float64 erf."""
    import math

    rng = np.random.default_rng(1)
    vals = np.concatenate([rng.uniform(-6, 6, 20000), np.linspace(-4, 4, 4001),
                           [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    fn = mx.compile(lambda v: mx.erf(v) * 1.0)
    out = np.array(fn(mx.array(vals))).astype(np.float64)
    ref = np.array([math.erf(float(v)) for v in vals])
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    err = np.abs(out - ref) / np.maximum(ulp, np.finfo(np.float32).smallest_subnormal)
    assert err.max() <= 4.0, err.max()
    assert {e["runtime"] for e in tapescope.kernel_cache() if e["name"].startswith(
        _tapes(fn)[0].lib_name)} == {"cpu"}
    special = np.array([np.inf, -np.inf, np.nan], np.float32)
    so = np.array(fn(mx.array(special)))
    assert so[0] == 1.0 and so[1] == -1.0 and np.isnan(so[2])
