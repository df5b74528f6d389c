"""Casts, bfloat16 and host scalars on the CUDA backend without Python launches or float32
copies, over ``tests/fake_cupy.py`` with ``tests/fake_cuda_driver.py`` (kernels load
without NVRTC, a stand-in libcuda counts the launches and runs nothing): an eager
``astype`` between bfloat16, float16, float32, integers and bool is its one-op kernel's
plan, launched by the eval loop from C once planned (no Python launch, no CuPy rule), its
argument words the input's and the output's addresses and the element count; an eager op
on a column-major operand writes a column-major buffer (MLX keeps the operand's strides)
from C; a fused call reading
bfloat16 storage launches from C, and one with host scalar arguments takes them by value
(their bits in its words, a new value in the same plan); a bfloat16 host scalar is packed
as its bits (ml_dtypes'), read through the buffer protocol without a format (numpy gives
bfloat16 none); a bfloat16 ``ScatterAxis`` (sum) is one kernel on the 16-bit storage; the
MLP Adam step takes the same paths with the loop's C part on and off. The values need the
GPU (``test_cuda_eager.py``'s casts, column-major operands and compiled scalars,
``test_cuda_indexing.py``'s bfloat16 scatter, against the CPU's bits)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import stand_in_result

HERE = Path(__file__).parent

CODE = r"""
import json, sys, threading
sys.path.insert(0, %r)
import fake_cupy; fake_cupy.install()
import fake_cuda_driver; fake_cuda_driver.install()
import numpy as np, ml_dtypes
import tapescope.core as mx
from tapescope.core import evaluate as ev
from tapescope.kernels import kernel_call
from tapescope.kernels.cuda import eager

mx.set_default_device(mx.gpu)
from tapescope.kernels import backends as bk
assert bk.backend("gpu").device_api is not None
NAMES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32,
         "int32": mx.int32, "int8": mx.int8, "uint8": mx.uint8, "bool": mx.bool_}
base = mx.add(mx.array(np.ones((64, 33), np.float32)), 0)
src = {k: mx.add(base.astype(v), 0) if k != "bool" else base > 0 for k, v in NAMES.items()}
mx.eval(*src.values())
addr = lambda a: a.__array_interface__["data"][0]
raw = lambda d: getattr(d, "raw", d)  # (BF16Array: its uint16 storage)


def measure(f):
    mx.eval(f())  # the first call plans
    ev.reset_dispatch_counts()
    c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
    for _ in range(3):
        y = f()
        mx.eval(y)
    return y, {"c": (fake_cuda_driver.launches() - c0) / 3,
               "py": (fake_cuda_driver.PY_LAUNCHES[0] - p0) / 3,
               "paths": {k: v for k, v in ev.dispatch_counts().items() if v}}


out = {}
for a, b in [("float32", "bfloat16"), ("bfloat16", "float32"), ("float16", "bfloat16"),
             ("bfloat16", "float16"), ("int32", "bfloat16"), ("bfloat16", "int32"),
             ("bool", "bfloat16"), ("bfloat16", "bool"), ("float32", "bool"),
             ("float32", "int8"), ("uint8", "float32"), ("float32", "float16")]:
    x = src[a]
    y, row = measure(lambda: x.astype(NAMES[b]))
    xd, yd = x._d.data, y._d.data
    key = kernel_call.plan_key("AsType", [xd], {"dtype": np.dtype(yd.dtype)})
    ln = eager.plans.get(key)
    if ln is not None:
        words = list(ln.packs[threading.get_ident()][0])
        row["words"] = {"input": words[ln.slots[0][1]], "output": words[ln.n_out_at],
                        "count": words[ln.n_out_at + 1], "variant": ln.variant}
    row["addr"] = {"input": addr(raw(xd)), "output": addr(raw(yd))}
    row["dtype"] = y.dtype.name
    out[a + "->" + b] = row

# a fused call on bfloat16 storage (a constant and a bfloat16 array operand)
xb, yb = src["bfloat16"], mx.add(src["bfloat16"], 1)
mx.eval(yb)
g = mx.compile(lambda u, v: mx.maximum(u, 0.5) * v + u)
_, out["compiled_bf16"] = measure(lambda: g(xb, yb))

# an eager op with a bfloat16 host scalar taken by value: its bits in the packed word
s = 0.3
y, row = measure(lambda: xb * s)
ln = next(p for k, p in eager.plans.items() if k[0] == "Multiply" and p.values)
words = list(ln.packs[threading.get_ident()][0])
row["value_word"] = words[ln.values[0][1]]
row["want_bits"] = int(np.array(s, ml_dtypes.bfloat16).view(np.uint16))
out["scalar_bf16"] = row

# eager ops on a column-major operand (a matmul gradient's transpose): column-major
# outputs written by the contiguous kernel, launched from C
for name, v in (("bf16", xb), ("f32", src["float32"])):
    vt = v.T
    for op, f in (("square", lambda: mx.square(vt)), ("scale", lambda: vt * 0.25),
                  ("cast", lambda: vt.astype(mx.float16))):
        y, row = measure(f)
        row["strides"] = list(raw(y._d.data).strides)
        row["itemsize"] = raw(y._d.data).itemsize
        out[f"colmajor_{name}_{op}"] = row

# a fused call with a host scalar argument (a Python scalar's 0-d array stays on the host):
# taken by value, its bits packed by the C launch, a new value in the same plan
for name, dt, v in (("bf16", mx.bfloat16, xb), ("f32", mx.float32, src["float32"])):
    h = mx.compile(lambda u, t: u * t + 1)
    scal = [mx.array(0.3, dtype=dt)]
    y, row = measure(lambda: h(v, scal[0]))
    scal[0] = mx.array(-2.75, dtype=dt)
    mx.eval(h(v, scal[0]))
    ln = next(p for k, p in eager.plans.items()
              if k[0] == "Compiled" and p.dtypes[0] == np.dtype(dt.np))
    words = list(ln.packs[threading.get_ident()][0])
    row["host"] = type(scal[0]._d.data).__name__
    row["value_word"] = words[ln.values[0][1]]
    bits = np.uint16 if dt == mx.bfloat16 else np.uint32
    row["want_bits"] = int(np.array(-2.75, dt.np).view(bits))
    out[f"compiled_scalar_{name}"] = row

# the VJP of take_along_axis in bfloat16: ScatterAxis (sum) on the storage
idx = mx.array(np.tile(np.arange(33, dtype=np.int32)[::-1], (64, 1)))
mx.eval(idx)
g, row = measure(lambda: mx.vjp(lambda v: mx.take_along_axis(v, idx, axis=1), [xb], [yb])[1][0])
from tapescope.kernels.cuda import indexing
plan = list(indexing.RULES["ScatterAxis"].plans.values())[-1]
copy, scatter = [list(p.packs[threading.get_ident()][0]) for p in (plan, *plan.then)]
row["names"] = [p.name for p in (plan, *plan.then)]
row["args"] = scatter[:3]
row["want"] = [addr(idx._d.data), addr(yb._d.data.raw), addr(g._d.data.raw)]
row["dtype"] = g.dtype.name
out["scatter_bf16"] = row
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def counts():
    return stand_in_result(CODE % str(HERE))


@pytest.mark.parametrize("case", [f"colmajor_{d}_{op}" for d in ("bf16", "f32")
                                  for op in ("square", "scale", "cast")])
def test_an_eager_op_on_a_column_major_operand_writes_columns_from_c(counts, case):
    """A transposed (column-major) operand's plan is the contiguous kernel in column order
    (MLX's output keeps a contiguous operand's strides): the loop gives it a column-major
    buffer and launches it from C."""
    got = counts[case]
    assert got["c"] == 1 and got["py"] == 0, got
    assert got["paths"].pop("eager_kernel_device") == 3 and set(got["paths"]) <= {"view"}, got
    assert got["strides"] == [got["itemsize"], 33 * got["itemsize"]]  # (33, 64), column-major


CASTS = ["float32->bfloat16", "bfloat16->float32", "float16->bfloat16", "bfloat16->float16",
         "int32->bfloat16", "bfloat16->int32", "bool->bfloat16", "bfloat16->bool",
         "float32->bool", "float32->int8", "uint8->float32", "float32->float16"]


@pytest.mark.parametrize("cast", CASTS)
def test_a_planned_cast_is_one_launch_from_c_into_the_output(counts, cast):
    got = counts[cast]
    assert got["dtype"] == cast.split("->")[1]
    assert got["c"] == 1 and got["py"] == 0, got
    assert got["paths"] == {"eager_kernel_device": 3}, got  # (three calls)
    w = got["words"]  # the plan's words as the C launch left them: this call's arrays
    assert w["variant"] == "contiguous"
    assert w["input"] == got["addr"]["input"] and w["output"] == got["addr"]["output"]
    assert w["count"] == 64 * 33


def test_a_fused_call_on_bfloat16_storage_launches_from_c(counts):
    got = counts["compiled_bf16"]
    assert got["c"] == 1 and got["py"] == 0, got
    assert got["paths"] == {"fused_kernel_device": 3}, got


@pytest.mark.parametrize("dt", ["bf16", "f32"])
def test_a_fused_calls_host_scalar_is_taken_by_value_from_c(counts, dt):
    """A compiled function's host scalar argument is a parameter's value (no upload): later
    calls are one launch from C, a new scalar's bits in the same plan's word."""
    got = counts[f"compiled_scalar_{dt}"]
    assert got["host"] == "ndarray"
    assert got["c"] == 1 and got["py"] == 0, got
    assert got["paths"] == {"fused_kernel_device": 3}, got
    assert got["value_word"] == got["want_bits"]


def test_a_bfloat16_host_scalar_is_packed_as_its_bits_by_the_c_launch(counts):
    got = counts["scalar_bf16"]
    assert got["c"] == 1 and got["py"] == 0, got
    assert got["value_word"] == got["want_bits"] == 0x3E9A


def test_a_bfloat16_scatter_sum_is_one_kernel_on_the_storage(counts):
    """The VJP's ScatterAxis (sum) on bfloat16: its input's bits copied into the output,
    then one scatter kernel adding into the 16-bit storage, both launched from C."""
    got = counts["scatter_bf16"]
    assert got["dtype"] == "bfloat16"
    assert got["names"] == ["copy_strided_unsigned_short_2d",
                            "scatter_axis_sum___nv_bfloat16_int_2d_axis1"], got["names"]
    assert got["py"] == 0, got
    assert got["args"] == got["want"], got  # indices, updates' bits, output


STEP = r"""
import json, os, sys
sys.path.insert(0, %r); sys.path.insert(0, %r)
import fake_cupy; fake_cupy.install()
import fake_cublas; fake_cublas.install()
import fake_cuda_driver; fake_cuda_driver.install()
import cuda_eager as ce, tapescope
tapescope.as_mlx()
import mlx.core as mx, mlx.nn as nn, mlx.optimizers as optim
from tapescope.core import evaluate as ev
out = {}
for dtype in ("float32", "bfloat16"):
    f = next(v for k, v in ce.mlp_steps(mx, nn, optim, dtype, 8).items() if "eager" in k)
    f(); f()
    ev.reset_dispatch_counts()
    c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
    f()
    out[dtype] = {"paths": {k: v for k, v in ev.dispatch_counts().items() if v},
                  "c": fake_cuda_driver.launches() - c0, "py": fake_cuda_driver.PY_LAUNCHES[0] - p0}
print("RESULT" + json.dumps(out))
"""


def test_the_mlp_adam_step_takes_the_same_paths_with_the_c_loop_off():
    """``cuda_eager.py``'s eager MLP Adam step (batch 8): every node takes the same dispatch
    path through the eval loop's C part and through its Python reference (a column-major
    matmul gradient that dies is not the output buffer of a plan writing rows); in bfloat16
    every elementwise op and cast is a kernel, and from C nothing launches from Python
    (GatherAxis and ScatterAxis too: their plans)."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler for the stand-in driver")
    got = {}
    for c_call in ("1", "0"):  # (the loop's C part is chosen once per process)
        env = dict(os.environ, TAPESCOPE_CUDA="1", TAPESCOPE_C_CALL=c_call)
        env.pop("TAPESCOPE_DISABLE_GPU", None)
        code = STEP % (str(HERE), str(HERE.parent / "benchmarks"))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=300, cwd=HERE.parent)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
        assert r.returncode == 0 and line, r.stdout[-4000:] + r.stderr[-4000:]
        got[c_call] = json.loads(line[-1][len("RESULT"):])
    for dtype in ("float32", "bfloat16"):
        on, off = got["1"][dtype], got["0"][dtype]
        assert on["paths"] == off["paths"], (dtype, on, off)
        assert on["py"] == 0, (dtype, on)
        assert on["c"] + on["py"] == off["c"] + off["py"], (dtype, on, off)
