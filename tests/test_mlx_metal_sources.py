"""Keeping the Metal shim honest: Metal code we did not write, read from an MLX checkout
(``TAPESCOPE_MLX_SOURCE=/path/to/mlx``; skipped without one; nothing of MLX is copied here).

- MLX's elementwise kernel headers (mlx/backend/metal/kernels/unary.h, binary.h, ternary.h,
  copy.h with utils.h and the op structs): every op x real dtype that unary.metal /
  binary.metal / ternary.metal / copy.metal instantiate, its ``_v`` kernel with MLX's work
  per thread, run on the shim and compared with the primitive's numpy rule;
- MLX's softmax kernel (softmax.h: threadgroup arrays, simd_max / simd_sum, barriers);
- the documented ``mx.fast.metal_kernel`` examples (docs/src/dev/custom_metal_kernels.rst):
  their Python blocks run as written with ``mx = tapescope.core`` through the shim, and
  grid_sample (forward and the simd_sum / atomic VJP) compared with the docs' reference.

Two mechanical edits of a temporary copy, for what g++ cannot take: C++ has no address
spaces, so definitions in MLX's complex.h that differ only by one (``complex_t(...) device``,
``operator+=(device complex_t&, ...)``) would be redefinitions: they are dropped (the
``thread`` forms remain); and g++ rejects explicit specializations at class scope (C++17
allows them, Metal's clang-based compiler takes them), so binary_ops.h's
``template <> bool operator()(complex64_t, complex64_t)`` become plain overloads.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels.metal import shim
from tapescope.kernels.primitives import REGISTRY

SRC = os.environ.get("TAPESCOPE_MLX_SOURCE")
KDIR = "mlx/backend/metal/kernels"
pytestmark = [
    pytest.mark.skipif(not SRC, reason="set TAPESCOPE_MLX_SOURCE to an MLX checkout"),
    pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler on PATH"),
]

BF16 = np.dtype(ml_dtypes.bfloat16)
TYPES = {"bool_": ("bool", np.bool_), "uint8": ("uint8_t", np.uint8),
         "uint16": ("uint16_t", np.uint16), "uint32": ("uint32_t", np.uint32),
         "uint64": ("uint64_t", np.uint64), "int8": ("int8_t", np.int8),
         "int16": ("int16_t", np.int16), "int32": ("int32_t", np.int32),
         "int64": ("int64_t", np.int64), "float16": ("half", np.float16),
         "float32": ("float", np.float32), "bfloat16": ("bfloat16_t", BF16)}
INTS = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
FLOATS = ["float16", "float32", "bfloat16"]
N = 37  # elements: a tail past every work-per-thread


def _drop_address_space_overloads(text: str) -> tuple:
    head = re.compile(r"(?m)^[ \t]*(template\s*<[^{;]*?>\s*)?(constexpr|inline|METAL_FUNC)?"
                      r"[^;{}]*?\([^;{}]*\)[^;{}]*\{")
    space = r"(threadgroup|device|constant)"
    out, i, pos, n = [], 0, 0, 0
    while (m := head.search(text, pos)):
        sig = text[m.start():m.end()]
        drop = (re.search(r"\)\s*(const\s+)?" + space + r"\s*(\{|:)", sig)
                or re.search(r"\(\s*" + space + r"\s+complex_t", sig)
                or re.search(r"constexpr\s+" + space + r"\s+complex_t", sig))
        depth, j = 1, m.end()
        while depth:
            depth += (text[j] == "{") - (text[j] == "}")
            j += 1
        if drop:
            out.append(text[i:m.start()])
            i, n = j, n + 1
        pos = j if drop else m.end()
    return "".join(out) + text[i:], n


@pytest.fixture(scope="module")
def headers(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlx")
    shutil.copytree(Path(SRC) / KDIR, root / KDIR)
    cx = root / KDIR / "complex.h"
    text, n = _drop_address_space_overloads(cx.read_text())
    assert n > 10
    cx.write_text(text)
    for name in ("binary_ops.h", "unary_ops.h", "ternary_ops.h"):
        p = root / KDIR / name
        p.write_text(re.sub(r"(?m)^([ \t]+)template <>\s*\n", r"\1", p.read_text()))
    sm = root / KDIR / "softmax.h"  # the shim's own rewrite of kernel threadgroup arrays
    sm.write_text(shim.threadgroup_arrays(sm.read_text()))
    old = os.environ.get("TAPESCOPE_SHIM_INCLUDE")
    os.environ["TAPESCOPE_SHIM_INCLUDE"] = f"-I{root}"
    yield root
    if old is None:
        del os.environ["TAPESCOPE_SHIM_INCLUDE"]
    else:
        os.environ["TAPESCOPE_SHIM_INCLUDE"] = old


def _instantiated(metal: str, macros: dict) -> list:
    """(op, type name) for each ``instantiate_<macro>(Op)`` line of a .metal file."""
    out = []
    for m in re.finditer(r"(?m)^instantiate_(\w+)\((\w+)\)", metal):
        for t in macros.get(m.group(1), ()):
            out.append((m.group(2), t))
    return out


def _values(rng, dt, n=N):
    dt = np.dtype(dt)
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind == "u":
        return rng.integers(0, 40, n).astype(dt)
    if dt.kind == "i":
        return rng.integers(-20, 20, n).astype(dt)
    return rng.uniform(0.1, 0.9, n).astype(np.float32).astype(dt)  # in every op's domain


def _ref(prim, *args):
    """The primitive's numpy rule; None where it refuses the dtype (MLX's op never asks)."""
    wide = [a.astype(np.float32) if a.dtype == BF16 else a for a in args]
    try:
        with np.errstate(all="ignore"):
            return np.asarray(REGISTRY[prim].rule(np, *wide))
    except TypeError:
        return None


def _close(got, want, what):
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=what)
    else:
        rtol = {np.dtype(np.float16): 2e-3, BF16: 1.6e-2}.get(got.dtype, 2e-6)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=rtol,
                                   atol=rtol, equal_nan=True, err_msg=what)


def _kernel_source(headers, *names):
    k = headers / KDIR
    src = '#include "mlx/backend/metal/kernels/utils.h"\n' + "".join(
        f'#include "mlx/backend/metal/kernels/{n}"\n' for n in names)
    return src, "".join((k / n).read_text() for n in names)


def test_mlx_elementwise_kernels_on_the_shim(headers):
    k = headers / KDIR
    all_t = ["bool_"] + INTS + FLOATS
    unary = _instantiated((k / "unary.metal").read_text(),
                          {"unary_float": FLOATS, "unary_int": INTS, "unary_types": all_t})
    binary = _instantiated((k / "binary.metal").read_text(),
                           {"binary_types": all_t, "binary_types_bool": all_t,
                            "binary_float": FLOATS, "binary_integer": INTS})
    cases, entries = [], []
    src, decl = _kernel_source(headers, "unary_ops.h", "unary.h", "binary_ops.h", "binary.h",
                               "ternary_ops.h", "ternary.h", "copy.h")
    for op, t in unary:
        if op not in REGISTRY:
            continue
        ct, dt = TYPES[t]
        n = max(1, 8 // np.dtype(dt).itemsize)
        entries.append(shim.Entry(0, f"u_{op}_{t}", call=f"unary_v<{ct}, {ct}, {op}, {n}>", decl=decl))
        cases.append(("unary", op, dt, dt, n))
    bools = {"Equal", "Greater", "GreaterEqual", "Less", "LessEqual", "NotEqual"}
    for op, t in binary:
        if op not in REGISTRY:
            continue
        ct, dt = TYPES[t]
        out, oc = (np.bool_, "bool") if op in bools else (dt, ct)
        n = max(1, 8 // np.dtype(dt).itemsize)
        entries.append(shim.Entry(0, f"b_{op}_{t}", call=f"binary_vv<{ct}, {oc}, {op}, {n}>",
                                  decl=decl))
        cases.append(("binary", op, dt, out, n))
    for t in all_t:
        ct, dt = TYPES[t]
        n = max(1, 8 // np.dtype(dt).itemsize)
        entries.append(shim.Entry(0, f"t_{t}", call=f"ternary_v<{ct}, Select, false, false, {n}>",
                                  decl=decl))
        cases.append(("ternary", "Select", dt, dt, n))
        for u in all_t:
            cu, du = TYPES[u]
            m = max(1, 8 // np.dtype(du).itemsize)
            entries.append(shim.Entry(0, f"c_{t}_{u}", call=f"copy_v<{ct}, {cu}, {m}>", decl=decl))
            cases.append(("copy", "AsType", dt, du, m))
    lib = shim.Library([src], entries)
    rng = np.random.default_rng(0)
    failed, compared = [], 0
    for i, (kind, op, dt, out, n) in enumerate(cases):
        size = np.asarray(N, np.uint32)
        grid = (-(-N // n), 1, 1)
        o = np.zeros(N, out)
        if kind == "unary":
            a = _values(rng, dt)
            lib.run(i, {0: a, 1: o, 2: size}, grid, (32, 1, 1))
            want = _ref(op, a)
        elif kind == "binary":
            a, b = _values(rng, dt), _values(rng, dt)
            if op in ("LeftShift", "RightShift"):
                b = (b % 8).astype(dt)
            if np.dtype(dt).kind in "biu":  # a GPU divides by zero silently, a CPU traps
                b = np.where(b == 0, np.ones_like(b), b)
            lib.run(i, {0: a, 1: b, 2: o, 3: size}, grid, (32, 1, 1))
            want = _ref(op, a, b)
        elif kind == "ternary":
            c, a, b = _values(rng, np.bool_), _values(rng, dt), _values(rng, dt)
            lib.run(i, {0: c, 1: a, 2: b, 3: o, 4: size}, grid, (32, 1, 1))
            want = np.where(c, a, b)
        else:
            a = _values(rng, dt)
            lib.run(i, {0: a, 1: o, 2: size}, grid, (32, 1, 1))
            want = a.astype(out)
        if want is None:
            continue
        try:
            _close(o, want, f"{op} {np.dtype(dt)} -> {np.dtype(out)}")
        except AssertionError as e:
            failed.append(f"{op} {np.dtype(dt)} -> {np.dtype(out)}")
        compared += 1
    print(f"MLX elementwise kernels compiled and run on the shim: {len(cases)}; compared with "
          f"numpy: {compared}; disagreeing: {len(failed)} {failed}")
    assert not failed, failed


def test_mlx_softmax_kernel_with_threadgroup_memory_and_simd_reductions(headers):
    """softmax.h's softmax_single_row, dispatched as mlx/backend/metal/softmax.cpp does:
    one threadgroup per row of ceil(ceil(axis / 4) / 32) simdgroups."""
    src, decl = _kernel_source(headers, "softmax.h")
    lib = shim.Library([src], [shim.Entry(0, "sm", call="softmax_single_row<float, float, 4>",
                                          decl=decl)])
    rng = np.random.default_rng(3)
    for rows, axis in ((3, 100), (2, 7), (1, 512)):
        x = (rng.standard_normal((rows, axis)) * 3).astype(np.float32)
        out = np.zeros_like(x)
        tg = 32 * -(-(-(-axis // 4)) // 32)
        lib.run(0, {0: x, 1: out, 2: np.asarray(axis, np.int32)}, (rows * tg, 1, 1), (tg, 1, 1))
        e = np.exp(x - x.max(axis=1, keepdims=True))
        np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def _doc_blocks() -> list:
    text = (Path(SRC) / "docs/src/dev/custom_metal_kernels.rst").read_text()
    blocks = []
    for m in re.finditer(r"\.\. code-block:: python[ \t]*\n[ \t]*\n((?:[ \t]+.*\n|\n)+)", text):
        lines = m.group(1).splitlines()
        indent = min(len(s) - len(s.lstrip()) for s in lines if s.strip())
        blocks.append("\n".join(s[indent:] for s in lines))
    return blocks


def test_mlx_documented_metal_kernels_run_as_written(headers):
    old = shim.enable(True)
    try:
        ns = {"mx": mx, "np": np}
        ran = 0
        for block in _doc_blocks():
            if "x.shape = (" in block or "compile_options" in block:
                continue  # a benchmark's sizes; a compile-option fragment (no body)
            ns = dict(ns)  # each block its own globals: later blocks rebind ``kernel``
            exec(block, ns)  # asserts inside the docs' code run too
            ran += 1
        assert ran >= 5
        rng = np.random.default_rng(1)
        x = mx.array(rng.standard_normal((2, 6, 7, 5)).astype(np.float32))
        # inside the border: the docs' reference gathers every neighbour unchecked
        g = mx.array(rng.uniform(-0.8, 0.8, (2, 4, 3, 2)).astype(np.float32))
        np.testing.assert_allclose(np.array(ns["grid_sample"](x, g)),
                                   np.array(ns["grid_sample_ref"](x, g)), rtol=1e-5, atol=1e-5)
        cot = mx.array(rng.standard_normal((2, 4, 3, 5)).astype(np.float32))
        _, (gx, gg) = mx.vjp(ns["grid_sample"], [x, g], [cot])
        _, (rx, rg) = mx.vjp(ns["grid_sample_ref"], [x, g], [cot])
        np.testing.assert_allclose(np.array(gx), np.array(rx), rtol=1e-4, atol=1e-4)
        # the docs' VJP scales by the integer W / 2 and H / 2 (int division in its source)
        scale = np.array([(7 // 2) / 3.5, (6 // 2) / 3.0], np.float32)
        np.testing.assert_allclose(np.array(gg), np.array(rg) * scale, rtol=1e-4, atol=1e-4)
    finally:
        shim.enable(old)
