"""The reduction kernels' GPU dialects: every CUDA kernel the reduction primitives can ask
for compiles with nvcc (skipped without it), and the MSL kernels run through the Metal shim
(kernels/metal/shim.py: MSL compiled by g++, threadgroups as fibers, simd_* and barriers)
against float64 numpy, launched as a GPU launches them (``common.reductions.gpu_launches``).

``make test`` compiles a sample (float32, bfloat16, int32, bool kernels) and runs a few shim
cases; ``TAPESCOPE_REDUCTION_SWEEP=1`` compiles all of them and runs more shapes.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from tapescope.kernels.codegen.c_ops import Unsupported
from tapescope.kernels.codegen.lower import render_module
from tapescope.kernels.codegen.reduce_kernels import all_specs
from tapescope.kernels.codegen.render import renderer
from tapescope.kernels.common import reductions as plan
from tapescope.kernels.metal import shim

SWEEP = os.environ.get("TAPESCOPE_REDUCTION_SWEEP") == "1"
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
SAMPLE = ("float32", "bfloat16", "int32", "bool")
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the CUDA sources are rendered only")
def test_every_cuda_reduction_kernel_compiles_with_nvcc(tmp_path):
    specs = [s for s in all_specs() if SWEEP or s.in_dtype in SAMPLE]
    d = renderer("cuda")
    cu = tmp_path / "reductions.cu"
    cu.write_text(render_module([s.kernel(gpu=True) for s in specs], d))
    r = subprocess.run([NVCC, "--ptx", str(cu), "-o", str(tmp_path / "r.ptx")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    ptx = (tmp_path / "r.ptx").read_text()
    for s in specs:
        assert f".entry {s.name}(" in ptx, s.name


def test_every_msl_reduction_kernel_renders():
    d = renderer("metal")
    refused = []
    for s in all_specs():
        try:
            src = s.source(d)
        except Unsupported as e:
            refused.append((s.name, str(e)))
            continue
        assert f"[[kernel]] void {s.name}(" in src
    # Metal has no double: exactly the float64 kernels are refused
    assert refused and all("float64" in n for n, _ in refused)


# -- the Metal shim ------------------------------------------------------------------------

_LIBS: dict = {}


def _run_msl(spec, ints: dict, buffers: dict) -> None:
    k = spec.kernel(gpu=True)
    lib = _LIBS.get(spec.name)
    if lib is None:
        lib = _LIBS[spec.name] = shim.Library([spec.source(renderer("metal"))],
                                              [shim.Entry(0, spec.name)])
    bound = {}
    for i, p in enumerate(k.params):
        if p.kind in ("in", "out"):
            bound[i] = buffers[p.name]
        elif p.kind == "int":
            bound[i] = np.array([ints[p.name]], np.int64)
        else:
            bound[i] = buffers[p.name]
    groups, threads = k.launch(ints)
    lib.run(0, bound, (groups * threads, 1, 1), (threads, 1, 1))


def run_on_shim(call, x: np.ndarray) -> np.ndarray:
    out = np.zeros(call.out_shape, dtype=call.out_dtype)
    bufs = {"x": np.ascontiguousarray(x).reshape(-1) if x.ndim else x.reshape(1),
            "out": out.reshape(-1), **call.arrays}
    if plan.gpu_part_size(call):
        bufs["part"] = np.zeros(plan.gpu_part_size(call), call.part_dtype)
    for spec, ints, src, dst in plan.gpu_launches(call):
        b = dict(bufs)
        b["x"], b["out"] = bufs[src], bufs[dst]
        if dst == "part":
            b["part"] = bufs["part"]
        _run_msl(spec, ints, b)
    return out


pytestmark_shim = pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler")

CASES = [((3, 40), (1,)), ((40, 3), (0,)), ((2, 3, 5), (0, 2)), ((70000,), (0,)), ((1, 1), (1,))]
if SWEEP:
    CASES += [((33, 257), (1,)), ((257, 33), (0,)), ((4, 5, 6, 7), (1, 3)), (((1 << 16) + 3,), (0,))]


@pytestmark_shim
@pytest.mark.parametrize("shape,axes", CASES[:4] if not SWEEP else CASES)
@pytest.mark.parametrize("op", ["sum", "max", "argmax", "and"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_msl_reductions_on_the_shim_match_numpy(shape, axes, op, dtype):
    rng = np.random.default_rng(0)
    if dtype == "int32":
        x = rng.integers(-5, 6, shape).astype(np.int32)
    else:
        x = rng.standard_normal(shape).astype(BF16 if dtype == "bfloat16" else np.float32)
    if op == "argmax":
        axes = axes[:1]
    xc = np.ascontiguousarray(x)
    strides = tuple(s // xc.itemsize for s in xc.strides)
    call = plan.reduce_call(op, xc.dtype, xc.shape, strides, axes)
    got = run_on_shim(call, xc).astype(np.float64)
    x64 = x.astype(np.float64)
    if op == "sum":
        want = x64.sum(axis=axes, keepdims=True)
        tol = 1e-5 if dtype != "bfloat16" else 1e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1, np.abs(want).max()))
    elif op == "max":
        np.testing.assert_array_equal(got, x64.max(axis=axes, keepdims=True))
    elif op == "argmax":
        np.testing.assert_array_equal(got, np.argmax(x64, axis=axes[0]).reshape(call.out_shape))
    else:
        np.testing.assert_array_equal(got, x64.all(axis=axes, keepdims=True))


@pytestmark_shim
@pytest.mark.parametrize("family", ["softmax", "logsumexp"])
@pytest.mark.parametrize("shape", [(3, 1000), (5, 33), (2, 1)])
def test_msl_softmax_on_the_shim_matches_float64(family, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    call = plan.softmax_call(family, x.dtype, x.shape, (shape[1], 1))
    got = run_on_shim(call, x).astype(np.float64)
    x64 = x.astype(np.float64)
    m = x64.max(-1, keepdims=True)
    e = np.exp(x64 - m)
    want = m + np.log(e.sum(-1, keepdims=True)) if family == "logsumexp" else e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytestmark_shim
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse,inclusive", [(False, True), (True, False)])
def test_msl_scans_on_the_shim_match_numpy(axis, reverse, inclusive):
    x = np.random.default_rng(2).standard_normal((7, 300)).astype(np.float32)
    call = plan.scan_call("sum", x.dtype, x.shape, (300, 1), axis, inclusive, reverse)
    got = run_on_shim(call, x).astype(np.float64)
    x64 = np.flip(x.astype(np.float64), axis) if reverse else x.astype(np.float64)
    want = np.cumsum(x64, axis=axis)
    if not inclusive:
        want = np.concatenate([np.zeros_like(np.take(want, [0], axis)),
                               np.take(want, np.arange(x.shape[axis] - 1), axis)], axis)
    want = np.flip(want, axis) if reverse else want
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# -- extended fusion: a reduction tape as one GPU kernel -------------------------------------

def _fused_tapes(shape=(6, 40)):
    """Reduction tapes of extended fusion: softmax, logsumexp and layernorm written out
    (last axis), a variance and an argmax over the first axis."""
    import tapescope
    import tapescope.core as mx

    def softmax(x):
        e = mx.exp(x - mx.max(x, axis=-1, keepdims=True))
        return e / mx.sum(e, axis=-1, keepdims=True)

    def logsumexp(x):
        m = mx.max(x, axis=-1, keepdims=True)
        return mx.log(mx.sum(mx.exp(x - m), axis=-1, keepdims=True)) + m

    def layernorm(x):
        mu = mx.mean(x, axis=-1, keepdims=True)
        v = mx.mean(mx.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * mx.rsqrt(v + 1e-5) * 2.0 + 0.5

    def var_first(x):
        mu = mx.mean(x, axis=0, keepdims=True)
        return mx.mean(mx.square(x - mu), axis=0, keepdims=True)

    def argmax_first(x):
        return mx.argmax(x * 2.0, axis=0, keepdims=True)

    old = tapescope.fusion_mode()
    tapescope.set_fusion("extended")
    try:
        x = mx.array(np.ones(shape, np.float32))
        out = []
        for f in (softmax, logsumexp, layernorm, var_first, argmax_first):
            g = tapescope.trace(f, x)
            out += [(f.__name__, k.tape) for k in g.kernels if k.tape.reduction is not None]
        return out
    finally:
        tapescope.set_fusion(old)


@pytestmark_shim
def test_fused_reduction_tapes_run_as_one_msl_kernel_on_the_shim():
    from tapescope.kernels.codegen.fused_reduce import fused_reduction_kernel, fused_reduction_source
    from tapescope.kernels.codegen.reduction import interpret
    from tapescope.kernels.common.fused_reduction import kernel_arguments

    d = renderer("metal")
    rng = np.random.default_rng(5)
    for full in ((6, 40), (3, 300), (2, 1), (257, 3)):
        tapes = _fused_tapes(full)
        if full == (6, 40):
            assert {n for n, _ in tapes} >= {"softmax", "logsumexp", "layernorm", "var_first"}
        for fname, tape in tapes:
            inputs = [None if x.is_constant else rng.standard_normal(
                tape.reduction.shape_of(x.name, full) if not x.scalar else ()).astype(x.dtype)
                for x in tape.inputs]
            inputs = [np.asarray(x.constant, x.dtype) if x.is_constant else a
                      for x, a in zip(tape.inputs, inputs)]
            want = interpret(tape, inputs, full)
            name = f"{tape.lib_name}_reduce_{tape.reduction.mode}"
            k = fused_reduction_kernel(tape, name, d)
            lib = shim.Library([fused_reduction_source(tape, name, d)], [shim.Entry(0, name)])
            arrays, ints = kernel_arguments(tape, inputs, full)
            bufs = {x.name: np.ascontiguousarray(a) if a.flags.c_contiguous else None
                    for x, a in zip(tape.non_constant_inputs, arrays)}
            # the shim binds C-contiguous buffers: strided views are passed as their base
            for x, a in zip(tape.non_constant_inputs, arrays):
                if bufs[x.name] is None or a.strides != bufs[x.name].strides:
                    base = np.ascontiguousarray(a)
                    bufs[x.name] = base.reshape(-1)
                    if not x.scalar:
                        ints[f"{x.name}_sr"], ints[f"{x.name}_sc"] = _strides_2d(
                            base, tape.reduction, full, x.name)
                else:
                    bufs[x.name] = bufs[x.name].reshape(-1)
            outs = [np.zeros(tape.reduction.shape_of(n, full), tape.dtype_of(n)) for n in tape.outputs]
            for j, o in enumerate(outs):
                bufs[f"out{j}"] = o.reshape(-1)
            bound = {}
            for i, p in enumerate(k.params):
                bound[i] = bufs[p.name] if p.kind in ("in", "out") else np.array([ints[p.name]], np.int64)
            groups, threads = k.launch(ints)
            lib.run(0, bound, (groups * threads, 1, 1), (threads, 1, 1))
            for o, w in zip(outs, want):
                np.testing.assert_allclose(o.astype(np.float64), np.asarray(w, np.float64),
                                           rtol=2e-5, atol=2e-5, err_msg=f"{fname} {full}")


def _strides_2d(a, red, full, name):
    from tapescope.kernels.common.fused_reduction import view_strides

    _, sr, sc = view_strides(a, red.shape_of(name, full), red.mode, red.naxes)
    return sr, sc


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_fused_reduction_tapes_compile_as_cuda(tmp_path):
    from tapescope.kernels.codegen.fused_reduce import fused_reduction_source, unit_input

    d = renderer("cuda")
    vec = 0
    for i, (fname, tape) in enumerate(_fused_tapes()):
        # the strided variant, and over the last axes the one reading its row by vectors
        for unit in {None, unit_input(tape)}:
            name = f"{tape.lib_name}_reduce_{tape.reduction.mode}" + ("_vec" if unit else "")
            src = fused_reduction_source(tape, name, d, unit)
            vec += unit is not None and "float4" in src
            cu = tmp_path / f"t{i}{unit or ''}.cu"
            cu.write_text(src)
            ptx = tmp_path / f"t{i}{unit or ''}.ptx"
            r = subprocess.run([NVCC, "--ptx", str(cu), "-o", str(ptx)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, (fname, unit, r.stderr[-3000:])
            assert f".entry {name}(" in ptx.read_text()
    assert vec >= 3  # softmax, logsumexp and layernorm read their rows 16 bytes at a time
