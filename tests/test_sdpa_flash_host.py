"""The fused prefill attention kernel (``codegen/attention_flash.py``) run on the host: the
exact CUDA text NVRTC gets, compiled by g++ against ``tests/cuda_host_shim.h`` (a block's
threads as fibers; ``mma.sync`` as a warp collective over the PTX ISA's fragment layouts,
``cvt.rna.tf32`` rounding as the GPU's), launched with the plan's grid, block and integer
arguments (``attention_flash.launch``, as ``cuda/attention.py``'s plan) and checked against float64 numpy over
hypothesis shapes: query and key lengths off the 64-row / key tiles, head sizes 16..128,
grouped and multi-query heads, every mask kind (broadcast boolean, additive), causal with
more keys than queries, sinks, transposed and strided inputs (16-byte tile loads, or rows
off 16 bytes: the kernel's element loads),
float32 at TF32 and at full accuracy (3xTF32), float16, bfloat16. What it checks is the
kernel's logic and the fragments' bookkeeping; nothing here says how fast a GPU runs it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cuda_host import CXX, build, launch
from tapescope.kernels.codegen import attention_flash as af
from sdpa_inputs import inputs
from test_sdpa import ref

pytestmark = pytest.mark.skipif(CXX is None, reason="no g++ to build the CUDA source for the host")

# TF32 keeps 10 bits of each operand; 3xTF32 is float32's accuracy (float64 products here)
TOL = {("float32", "tf32"): 4e-3, ("float32", "f32x3"): 2e-5, ("float16", ""): 4e-3,
       ("bfloat16", ""): 3e-2}
EXAMPLES = 200 if os.environ.get("TAPESCOPE_REDUCTION_SWEEP") == "1" else 14


def _elem_strides(a: np.ndarray) -> tuple:
    return tuple(s // a.itemsize for s in a.strides)


def _layout(a: np.ndarray, layout: str) -> np.ndarray:
    """``a`` (B, H, L, D) as a view: row-major, a (B, L, H, D) buffer transposed, or a slice
    of rows 8 (``strided``) or 1 (``offset``: rows off 16 bytes) elements into a wider
    buffer."""
    if layout == "transposed":
        return np.ascontiguousarray(a.swapaxes(1, 2)).swapaxes(1, 2)
    if layout in ("strided", "offset"):
        at = 8 if layout == "strided" else 1
        wide = np.zeros(a.shape[:-1] + (a.shape[-1] + 16,), a.dtype)
        wide[..., at:at + a.shape[-1]] = a
        return wide[..., at:at + a.shape[-1]]
    return a


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a


def run_flash(q, k, v, scale, mask=None, causal=False, sinks=None, precision="", tile=""):
    """The fused kernel over these host arrays (any strides, unit-stride head rows), as the
    CUDA plan launches it (``attention_flash.launch``; ``tile``: the half types' kernel)."""
    B, H, L, D = q.shape
    kind = "none" if mask is None else "bool" if mask.dtype == np.bool_ else "add"
    spec, ints, grid, block = af.launch(q.dtype.name, q.shape, _elem_strides(q), k.shape,
                                        _elem_strides(k), _elem_strides(v), kind,
                                        None if mask is None else _elem_strides(mask),
                                        causal, sinks is not None, precision, tile)
    out = np.full((B, H, L, D), np.nan, q.dtype)
    bufs = {"q": _bits(q), "k": _bits(k), "v": _bits(v), "out": _bits(out)}
    if mask is not None:
        bufs["mask"] = _bits(mask)
    if sinks is not None:
        bufs["sinks"] = _bits(sinks)
    args = []
    for kind, name in af.params(spec):
        if kind in ("in", "out"):
            args.append(bufs[name])
        elif kind == "int":
            args.append(ints[name])
        else:
            args.append(int(np.float32(scale).view(np.uint32)))
    launch(build(af.flash_source(spec), [spec.name]), spec.name, grid, block, args)
    return out


@st.composite
def case(draw):
    dtype, precision = draw(st.sampled_from(sorted(TOL)))
    B = draw(st.sampled_from([1, 2]))
    kv = draw(st.sampled_from([1, 2]))
    reps = draw(st.sampled_from([1, 3]))  # (a multiple of the key heads: grouped queries)
    L = draw(st.sampled_from([9, 16, 63, 64, 65, 100]))
    kL = draw(st.sampled_from([1, 15, 16, 33, 64, 65, 130]))
    D = draw(st.sampled_from([16, 64, 80, 96, 128]))
    mask = draw(st.sampled_from([None, "causal", "bool", "bool_bcast", "additive"]))
    if mask == "causal":
        kL = draw(st.sampled_from([kL, L, L + 37]))
    sinks = draw(st.booleans())
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided", "offset"]))
    return dtype, precision, B, kv, reps, L, kL, D, mask, sinks, layout, draw(st.integers(0, 2 ** 16))


def _inputs(c):
    dtype, precision, B, kv, reps, L, kL, D, mask, sinks, layout, seed = c
    q, k, v, m, s = inputs(B, kv, reps, L, kL, D, mask, sinks, dtype, seed)
    if mask == "bool":
        m[:, :, 0] = False  # (a fully masked row: MLX's fallback averages the values)
    elif m is not None:  # (the scores' shape: the kernel reads a broadcast mask at stride 0)
        m = np.broadcast_to(m, (B, kv * reps, L, kL))
    return q, k, v, m, s


# the kernels: the first loop (""), float32's with the queries re-read each tile, each tile of
# the half types' attention_flash16
TILES = ("", "qreload") + af.f16.TILES


@pytest.mark.timeout(3600 if EXAMPLES > 14 else 300)  # (the sweep builds a few hundred kernels)
@settings(max_examples=EXAMPLES, deadline=None)
@given(case(), st.sampled_from(TILES), st.sampled_from([1.0, 1.0, 1.0, -0.5, 0.0]))
def test_the_fused_kernel_on_the_host_matches_float64_numpy(c, tile, sign):
    """(``tile``: ``qreload`` for float32, the others for float16 / bfloat16 where they fit
    the head size; ``sign`` times
    D^-0.5 is the scale: a negative scale flips the ldmatrix kernel's query signs, zero
    averages the values.)"""
    dtype, precision, B, kv, reps, L, kL, D, mask, sinks, layout, _ = c
    half = tile not in ("", "qreload")
    tile = tile if (dtype == "float32") != half and (not half or af.f16.fits(D, tile)) else ""
    q, k, v, m, s = _inputs(c)
    qa, ka, va = (_layout(a, layout) for a in (q, k, v))
    scale = sign * D ** -0.5
    got = run_flash(qa, ka, va, scale, m, mask == "causal", s, precision, tile)
    want = ref(q, k, v, scale, m, mask == "causal", s)
    tol = TOL[dtype, precision]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol,
                               atol=tol * max(1.0, np.abs(want).max()), err_msg=str((c, tile, sign)))


def test_full_float32_is_more_accurate_than_tf32():
    """3xTF32's error is float32's (well under TF32's), on the same inputs."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(sh).astype(np.float32) for sh in ((1, 1, 70, 64), (1, 1, 90, 64), (1, 1, 90, 64)))
    want = ref(q, k, v, 0.125)
    e3 = np.abs(run_flash(q, k, v, 0.125, precision="f32x3") - want).max()
    e1 = np.abs(run_flash(q, k, v, 0.125, precision="tf32") - want).max()
    assert e3 < 1e-5 < e1, (e3, e1)


from conftest import sweep  # noqa: E402

NVCC = __import__("shutil").which("nvcc")
# what ptxas reports for the kernels (sm_90, as NVRTC builds them: --fmad=false): 3xTF32 at
# head sizes above 64 spills (a few hundred bytes to L1), the others fit their registers
# (`make test` builds two of them, `make test-fuzz` all: conftest.sweep)
NVCC_SPECS = sweep([af.FlashSpec("full", "float32", 64, "none", False, False, "tf32", True),
                    af.FlashSpec("full", "float32", 128, "add", True, True, "f32x3", True),
                    af.FlashSpec("full", "float32", 96, "bool", False, False, "tf32", False),
                    af.FlashSpec("full", "bfloat16", 128, "bool", True, True, "", True),
                    af.FlashSpec("full", "float16", 80, "add", False, False, "", True),
                    af.FlashSpec("full", "bfloat16", 64, "none", False, False, "", True, "w4m2k64"),
                    af.FlashSpec("full", "float16", 128, "bool", True, True, "", True, "w4m1k64"),
                    af.FlashSpec("full", "bfloat16", 128, "none", False, False, "", True, "w4m2k32q"),
                    af.FlashSpec("full", "float16", 48, "bool", False, True, "", True, "w8m1k64"),
                    af.FlashSpec("full", "float16", 64, "add", True, False, "", False, "w4m1k128"),
                    af.FlashSpec("full", "float32", 128, "add", True, False, "f32x3", True, "qreload"),
                    af.FlashSpec("full", "float32", 128, "none", False, False, "tf32", False, "qreload")],
                   [af.FlashSpec("full", "float32", 128, "add", True, True, "f32x3", True),
                    af.FlashSpec("full", "bfloat16", 64, "none", False, False, "", True, "w4m2k64")])


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("spec", NVCC_SPECS, ids=lambda s: s.name)
def test_the_fused_kernel_compiles_for_sm_90_without_spills(spec, tmp_path):
    import re
    import subprocess

    cu = tmp_path / "flash.cu"
    cu.write_text(af.flash_source(spec))
    r = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "--fmad=false", "-Xptxas", "-v",
                        "-o", str(tmp_path / "flash.cubin"), str(cu)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    spill = int(re.search(r"(\d+) bytes spill stores", r.stderr).group(1))
    smem = int(re.search(r"(\d+) bytes smem", r.stderr).group(1))
    assert smem <= 48 * 1024
    assert (spill > 0) == (spec.precision == "f32x3" and spec.head > 64 and not spec.tile), r.stderr
