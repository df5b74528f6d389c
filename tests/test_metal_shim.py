"""Generated MSL runs and computes numpy's numbers: the Metal shim (a test tool,
``kernels/metal/shim/metal_shim.h``) compiles it with the system C++ compiler and runs it
on the CPU over its launch grid.

- every fused tape of the compile tests (test_dialects' corpus), in the contiguous,
  contiguous-large (2-D grid), strided, strided-large and strided-dynamic variants, against
  the numpy interpreter of the same tape;
- hypothesis random graphs (compile_fuzz), every tape they fuse into;
- the eager elementwise kernels: every elementwise primitive (unary, binary, ternary, the
  copy kernel AsType) x every dtype Metal has, against the primitive's numpy rule; float64
  is refused with MLX's message.

Builds are batched (one shared object per batch, two batches in parallel) and cached on
disk. ``TAPESCOPE_METAL_SWEEP=1`` runs the eager kernels in every variant too.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from tapescope.core.fusion import tapes
from tapescope.kernels.codegen.c_ops import Unsupported
from tapescope.kernels.codegen.interpret import interpret
from tapescope.kernels.codegen.render import cannot_render, renderer
from tapescope.kernels.metal import kernels as K
from tapescope.kernels.metal import shim
from tapescope.kernels.primitives import REGISTRY, spellings

sys.path.insert(0, str(Path(__file__).parent))
import compile_fuzz  # noqa: E402
from test_dialects import _corpus  # noqa: E402

pytestmark = pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler on PATH")

BF16 = np.dtype(ml_dtypes.bfloat16)
SWEEP = bool(os.environ.get("TAPESCOPE_METAL_SWEEP"))
# (contiguous, ndim, large): the variants the layouts below reach
VARIANTS = [(True, 1, False), (True, 1, True), (False, 2, False), (False, 4, True), (False, 8, False)]


def _values(rng, dt, shape):
    dt = np.dtype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind == "u":
        return rng.integers(0, 40, shape).astype(dt)
    if dt.kind == "i":
        return rng.integers(-20, 20, shape).astype(dt)
    return (rng.standard_normal(shape) * 3).astype(np.float32).astype(dt)


def _layouts(rng, tape):
    """(inputs, shape, options, expected variant) per layout: contiguous, the same as a 2-D
    grid, a transposed, sliced input (strided 2-D), 4-D inputs with two pairs of axes
    swapped and 64-bit indexing (4 elements per thread), and 8-D inputs sliced on every axis
    (strided_dynamic, 2 per thread)."""
    def make(shape, view):
        ins = []
        for x in tape.inputs:
            if x.is_constant:
                ins.append(None)
            elif x.scalar:
                ins.append(_values(rng, x.dtype, ()))
            elif view is t and any(a is not None and a.ndim for a in ins):
                ins.append(_values(rng, x.dtype, shape))  # only the first array transposed
            else:
                ins.append(view(_values(rng, x.dtype, _base(shape, view))))
        return ins

    def _base(shape, view):
        if view.__name__ == "t":
            return (shape[1], 2 * shape[0])
        if view.__name__ == "s4":
            return (shape[1], shape[0], shape[3], shape[2])
        if view.__name__ == "s8":
            return tuple(2 * s for s in shape)
        return shape

    def plain(a):
        return a

    def t(a):
        return a.T[::2]

    def s4(a):
        return a.transpose(1, 0, 3, 2)

    def s8(a):
        return a[(slice(None, None, 2),) * 8]

    if not any(not x.is_constant and not x.scalar for x in tape.inputs):
        yield make((), plain), (), {}, "contiguous"  # scalars only: one element
        return
    yield make((5, 7), plain), (5, 7), {}, "contiguous"
    yield make((5, 7), plain), (5, 7), {"force_large": True, "grid_x": 3}, "contiguous_large"
    yield make((5, 7), t), (5, 7), {}, "strided_2"
    yield make((3, 4, 5, 3), s4), (3, 4, 5, 3), {"force_large": True, "grid_x": 7}, "strided_4_large"
    yield make((2,) * 8, s8), (2,) * 8, {}, "strided_dynamic"


def _tol(dt):
    dt = np.dtype(dt)
    return {np.dtype(np.float16): (2e-3, 1e-3), BF16: (1.6e-2, 1e-2)}.get(dt, (1e-5, 1e-6))


def _assert_same(got, want, what):
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        rtol, atol = _tol(got.dtype)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=rtol,
                                   atol=atol, equal_nan=True, err_msg=what)


def _renders(t) -> bool:
    try:
        renderer("metal").render(t, "k", True, 1, False)
        return True
    except Unsupported as e:
        assert "float64" in str(e) or "double" in str(e), e  # Metal has no double, only that
        return False


def _libraries(tape_list, variants, batches=2):
    """TapeLibraries over ``batches`` chunks, built in parallel: (library, index) per tape."""
    chunks = [tape_list[i::batches] for i in range(batches)]
    with ThreadPoolExecutor(batches) as ex:
        libs = list(ex.map(lambda c: shim.TapeLibrary(c, variants) if c else None, chunks))
    out = {}
    for b, (lib, chunk) in enumerate(zip(libs, chunks)):
        for k, t in enumerate(chunk):
            out[id(t)] = (lib, k)
    return out


def _check_tape(lib, k, t, rng, layouts=None):
    for ins, shape, opts, variant in layouts or _layouts(rng, t):
        outs, ran = lib.run(k, ins, shape, **opts)
        assert ran == variant, (t.lib_name, ran, variant)
        arrays = [np.asarray(x.constant, x.dtype) if x.is_constant else a
                  for x, a in zip(t.inputs, ins)]
        want = interpret(t, arrays, shape)
        for o, w, name in zip(outs, want, t.outputs):
            _assert_same(o, np.reshape(w, shape), f"{t.lib_name} {variant} output {name}")


def test_every_fused_tape_of_the_compile_tests_runs_on_the_shim():
    corpus = [t for t in _corpus() if _renders(t)]
    assert len(corpus) > 40
    libs = _libraries(corpus, VARIANTS)
    rng = np.random.default_rng(0)
    for t in corpus:
        lib, k = libs[id(t)]
        _check_tape(lib, k, t, rng)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1))
def test_random_graphs_run_on_the_shim(seed):
    rng = np.random.default_rng(seed)
    g = compile_fuzz.random_graph(rng, max_size=24)
    cf = mx.compile(g.fn)
    cf(*g.inputs)
    found = [t for p in cf.programs() for t in tapes(p) if _renders(t)]
    if not found:
        return
    lib = shim.TapeLibrary(found, VARIANTS)
    for k, t in enumerate(found):
        _check_tape(lib, k, t, rng)


# -- the eager elementwise kernels ----------------------------------------------------------
def _eager_cases():
    """(primitive, input dtypes, output dtype, params) for every elementwise primitive with a
    spelling and every Metal dtype its numpy rule takes, with the output dtype the rule gives."""
    cases, rng = [], np.random.default_rng(1)
    for prim in sorted(spellings("c")):
        d = REGISTRY[prim]
        if d.family == "astype":
            for a in K.METAL_DTYPES:
                for b in K.METAL_DTYPES:
                    cases.append((prim, (a,), b, (("dtype", b),)))
            continue
        if d.family not in ("unary", "binary", "ternary"):
            continue
        for dt in K.METAL_DTYPES:
            ins = {"unary": (dt,), "binary": (dt, dt), "ternary": (np.dtype(bool), dt, dt)}[d.family]
            vals = [_values(rng, x, (3,)) for x in ins]
            wide = [v.astype(np.float32) if v.dtype == BF16 else v for v in vals]
            try:
                with np.errstate(all="ignore"):
                    out = np.asarray(d.rule(np, *wide)).dtype
            except Exception:  # the numpy rule does not take this dtype: MLX's op never asks
                continue
            if BF16 in ins and out == np.float32:
                out = BF16
            if out not in K.METAL_DTYPES:
                continue
            cases.append((prim, ins, out, ()))
    return cases


def test_eager_elementwise_kernels_for_every_metal_dtype():
    cases = _eager_cases()
    tape_list = []
    for prim, ins, out, params in cases:
        if cannot_render(prim, ins, out, "c") is not None:
            continue  # not an op on this dtype in any dialect (numpy's rule is broader)
        t = K.elementwise_tape(prim, ins, out, params=params)
        renderer("metal").render(t, "k", True, 1, False)  # Metal expresses all that C does
        tape_list.append(t)
    prims = {t.ops[0].primitive for t in tape_list}
    want = {p for p in spellings("c") if REGISTRY[p].family in ("unary", "binary", "ternary", "astype")}
    assert want - prims <= {"Real", "Imag", "Conjugate"}, want - prims  # complex-only or identity
    # the contiguous kernel (the fused-tape tests run every variant); the sweep: all five
    variants = VARIANTS if SWEEP else [(True, 1, False)]
    libs = _libraries(tape_list, variants)
    rng = np.random.default_rng(2)
    for t in tape_list:
        lib, k = libs[id(t)]
        layouts = list(_layouts(rng, t))
        _check_tape(lib, k, t, rng, layouts if SWEEP else layouts[:1])
    assert len(tape_list) > 300


def test_scalar_operand_kernels():
    """A binary kernel with a 0-d operand reads it as ``x[0]`` (MLX's sv / vs kernels)."""
    rng = np.random.default_rng(3)
    ts = [K.elementwise_tape("Add", (np.float32, np.float32), np.float32, (True, False)),
          K.elementwise_tape("Subtract", (np.int32, np.int32), np.int32, (False, True)),
          K.elementwise_tape("Select", (bool, np.float16, np.float16), np.float16, (True, False, True))]
    assert [t.lib_name for t in ts] == ["sv_Addfloat32", "vs_Subtractint32", "svs_Selectfloat16"]
    lib = shim.TapeLibrary(ts, [(True, 1, False), (False, 2, False)])
    for k, t in enumerate(ts):
        _check_tape(lib, k, t, rng, [lay for lay in _layouts(rng, t)][::2][:2])


def test_float64_has_no_metal_kernel():
    with pytest.raises(ValueError, match="^float64 is not supported on the GPU$"):
        K.elementwise_tape("Add", (np.float64, np.float64), np.float64)
    with pytest.raises(ValueError, match="^float64 is not supported on the GPU$"):
        K.elementwise_tape("AsType", (np.float32,), np.float64, params=(("dtype", np.float64),))


def test_eager_kernel_names_follow_mlx_stems():
    assert K.elementwise_tape("Exp", (np.float16,), np.float16).lib_name == "v_Expfloat16float16"
    assert K.elementwise_tape("Add", (np.int32, np.int32), np.int32).lib_name == "vv_Addint32"
    t = K.elementwise_tape("AsType", (BF16,), np.float32, params=(("dtype", np.float32),))
    assert t.lib_name == "v_copybfloat16float32"
    src = K.msl_module(t)
    for v in ("contiguous", "contiguous_large", "strided_1", "strided_7_large",
              "strided_dynamic", "strided_dynamic_large"):
        assert f"[[kernel]] void v_copybfloat16float32_{v}(" in src


def test_the_shim_runs_threads_as_metal_does():
    """Attributes, partial threadgroups, simd_sum over the lanes that did not return, atomics
    and a threadgroup barrier, against numpy."""
    src = r"""
#include <metal_stdlib>
using namespace metal;
[[kernel]] void probe(device const float* x [[buffer(0)]], device float* lane_sum [[buffer(1)]],
                      device atomic<float>* total [[buffer(2)]], device uint* where [[buffer(3)]],
                      uint3 gid [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint3 tg [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]], uint3 grid [[threads_per_grid]]) {
  uint i = gid.x + grid.x * gid.y;
  where[i] = tg.x * 10000 + sg * 100 + lane;
  if (gid.x % 7 == 3) return;
  float s = simd_sum(x[i]);
  threadgroup_barrier(mem_flags::mem_device);
  lane_sum[i] = s;
  if (lane == 0) atomic_fetch_add_explicit(total, s, memory_order_relaxed);
}
"""
    lib = shim.Library([src], [shim.Entry(0, "probe")])
    gx, gy, tgx = 100, 2, 48
    x = np.arange(gx * gy, dtype=np.float32)
    lane_sum = np.zeros_like(x)
    total = np.zeros(1, np.float32)
    where = np.zeros(gx * gy, np.uint32)
    lib.run(0, {0: x, 1: lane_sum, 2: total, 3: where}, (gx, gy, 1), (tgx, 1, 1))
    gid_x = np.tile(np.arange(gx), gy)
    gid_y = np.repeat(np.arange(gy), gx)
    tg = gid_x // tgx
    tsize = np.minimum(tgx, gx - tg * tgx)  # the last threadgroup is partial
    tid = gid_x - tg * tgx
    assert np.array_equal(where, tg * 10000 + (tid // 32) * 100 + tid % 32)
    active = gid_x % 7 != 3
    want = np.zeros_like(x)
    key = (gid_y * 1000 + tg) * 100 + tid // 32  # one simdgroup per (row, group, simd index)
    for k in np.unique(key):
        m = (key == k) & active
        want[m] = x[m].sum()
    assert np.array_equal(lane_sum[active], want[active])
    assert np.all(tsize > 0)
    leaders = active & (tid % 32 == 0)
    assert total[0] == pytest.approx(float(lane_sum[leaders].sum()), rel=1e-6)


def test_the_shim_refuses_what_it_cannot_run():
    with pytest.raises(shim.ShimError, match="threadgroup memory"):
        shim.Library(["[[kernel]] void k(device float* o [[buffer(0)]]) "
                      "{ threadgroup float t; o[0] = t; }"], [shim.Entry(0, "k")])
    with pytest.raises(shim.ShimError, match="could not compile"):
        shim.Library(["[[kernel]] void k(device float* o [[buffer(0)]]) { o[0] = nope; }"],
                     [shim.Entry(0, "k")])
