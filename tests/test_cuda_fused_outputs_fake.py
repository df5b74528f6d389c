"""Fused calls of several outputs on the CUDA backend (a compiled optimizer update: the
parameter and its moments), over ``tests/fake_cupy.py`` with ``tests/fake_cuda_driver.py``
in a fresh process: planned once, then launched by the eval loop from C (one launch, no
Python launch), every output's buffer chosen by the loop (a dying input's where MLX's
Compiled rules and the kernels' restrict pointers allow it, else a fresh one), host scalars
taken by value, in float32, float16 and bfloat16 storage. The stand-in driver computes each
fused launch (``run_fused_tapes``: the tape interpreted at the pointers its launch words
hold), so the values check the words the loop wrote (inputs, outputs, scalar bits, donors)
against float64 numpy and the CPU's compiled result. The kernels' own arithmetic needs the
GPU (``test_cuda_fusion.py``)."""

from pathlib import Path

import pytest

from conftest import stand_in_result

HERE = Path(__file__).parent

CODE = r"""
import json, os, sys
os.environ["TAPESCOPE_C_CALL"] = %r
sys.path.insert(0, %r)
import fake_cupy; fake_cupy.install()
import fake_cuda_driver; fake_cuda_driver.install(); fake_cuda_driver.run_fused_tapes()
import numpy as np, ml_dtypes
import tapescope.core as mx
from tapescope.core import evaluate as ev
from tapescope.kernels.cuda.compiled import Launch

mx.set_default_device(mx.gpu)
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
DT = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def adam(p, m, v, g, lr):  # three outputs: MLX's Adam update without bias correction
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * (g * g)
    return p - lr * m2 / (mx.sqrt(v2) + 1e-8), m2, v2


def adam_np(p, m, v, g, lr):
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * (g * g)
    return p - lr * m2 / (np.sqrt(v2) + 1e-8), m2, v2


def two(a, b):  # b a row broadcast over a's rows
    u = a * b + 1.5
    return u, mx.exp(u * 0.25) - a


def two_np(a, b):
    u = a * b + 1.5
    return u, np.exp(u * 0.25) - a


def four(a, b, s):  # a host scalar s, four outputs
    u = a - s
    v = u * b
    w = mx.maximum(v, 0.0) + u
    return u, v, w, w * s


def four_np(a, b, s):
    u = a - s
    v = u * b
    w = np.maximum(v, 0.0) + u
    return u, v, w, w * s


def swap(a, b):  # the first output does not read a (a's buffer is not given to it)
    u = b * 2.0 + 1.0
    return u, (a + u) * b


def swap_np(a, b):
    u = b * 2.0 + 1.0
    return u, (a + u) * b


rng = np.random.default_rng(0)
SH = (256, 128)  # (whole 16 KiB pages in each dtype: the peak counts arrays exactly)
HOST = {"adam": [rng.standard_normal(SH), 0.1 * rng.standard_normal(SH),
                 rng.uniform(0.5, 1.0, SH), rng.standard_normal(SH), np.array(0.01)],
        "two": [rng.standard_normal(SH), rng.standard_normal(SH[1:])],
        "four": [rng.standard_normal(SH), rng.standard_normal(SH), np.array(0.375)],
        "swap": [rng.standard_normal(SH), rng.standard_normal(SH)]}
FNS = {"adam": (adam, adam_np), "two": (two, two_np), "four": (four, four_np),
       "swap": (swap, swap_np)}
addr = lambda d: getattr(d, "raw", d).__array_interface__["data"][0]

out = {}
for dt in ("float32", "float16", "bfloat16"):
    for name, (f, ref) in FNS.items():
        host = [h.astype(NP[dt]) for h in HOST[name]]  # the values as the dtype holds them
        args = []
        for h in host:
            if h.ndim == 0:  # a host scalar (kept on the host: taken by value)
                args.append(mx.array(h.astype(np.float32)).astype(DT[dt]))
            else:
                args.append(mx.add(mx.array(h.astype(np.float32)), 0).astype(DT[dt]))
        mx.eval(*args)
        cf = mx.compile(f)
        mx.eval(cf(*args))  # the first call plans
        ev.reset_dispatch_counts()
        c0, p0, r0 = (fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0],
                      fake_cuda_driver.RAN[0])
        for _ in range(3):
            res = cf(*args)
            mx.eval(res)
        row = {"c": (fake_cuda_driver.launches() - c0) / 3,
               "py": (fake_cuda_driver.PY_LAUNCHES[0] - p0) / 3,
               "ran": (fake_cuda_driver.RAN[0] - r0) / 3, "n": len(res),
               "paths": {k: v for k, v in ev.dispatch_counts().items() if v}}
        want = ref(*[h.astype(np.float64) for h in host])
        got = [np.asarray(r.astype(mx.float32)).astype(np.float64) for r in res]
        row["err"] = [float(np.max(np.abs(g - w) / (1 + np.abs(w)))) for g, w in zip(got, want)]
        # the arguments still hold their values (the caller holds them: nothing donated)
        row["kept"] = all(np.array_equal(np.asarray(a.astype(mx.float32)), h.astype(np.float32))
                          for a, h in zip(args, host))
        row["fresh"] = not ({addr(r._d.data) for r in res} & {addr(a._d.data) for a in args})
        with mx.stream(mx.cpu):  # the CPU's compiled function on the same values
            cpu = [mx.array(h.astype(np.float32)).astype(DT[dt]) for h in host]
            cres = mx.compile(f)(*cpu)
            mx.eval(cres)
        row["cpu_err"] = [float(np.max(np.abs(g - np.asarray(c.astype(mx.float32)))
                                       / (1 + np.abs(np.asarray(c.astype(mx.float32))))))
                          for g, c in zip(got, cres)]
        # dying inputs (lazy ones nobody else holds): outputs in their buffers where allowed
        del res, cres, cpu, got
        mx.synchronize()
        mx.clear_cache()
        a0 = mx.get_active_memory()
        mx.reset_peak_memory()
        c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
        ev.reset_dispatch_counts()
        res = cf(*[mx.add(a, 0) if a.ndim else a for a in args])
        mx.eval(res)
        row["donated_c"] = fake_cuda_driver.launches() - c0
        row["donated_py"] = fake_cuda_driver.PY_LAUNCHES[0] - p0
        row["donated_paths"] = {k: v for k, v in ev.dispatch_counts().items() if v}
        row["peak"] = (mx.get_peak_memory() - a0) / res[0].nbytes  # in output-sized arrays
        tape, ins, outs = fake_cuda_driver.LAST[0]
        # per output: the argument whose buffer it was written into (its position among
        # the full-size array arguments, in the tape's order), or None: a fresh buffer
        full = [i for i in sorted(ins) if ins[i][1] == SH]  # the full-size array arguments
        row["donors"] = [next((k for k, i in enumerate(full) if ins[i][0] == o), None)
                         for o in outs]
        row["tape_inputs"] = [(x.name, x.by_value, x.is_constant) for x in tape.inputs]
        got = [np.asarray(r.astype(mx.float32)).astype(np.float64) for r in res]
        row["donated_err"] = [float(np.max(np.abs(g - w) / (1 + np.abs(w))))
                              for g, w in zip(got, want)]
        out[f"{name}_{dt}"] = row
out["aliases"] = fake_cuda_driver.ALIASES
print("RESULT" + json.dumps(out))
"""

CASES = [f"{n}_{dt}" for n in ("adam", "two", "four", "swap")
         for dt in ("float32", "float16", "bfloat16")]
TOL = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}
OUTPUTS = {"adam": 3, "two": 2, "four": 4, "swap": 2}


@pytest.fixture(scope="module")
def runs():
    return {c: stand_in_result(CODE % (c, str(HERE))) for c in ("1", "0")}


@pytest.mark.parametrize("case", CASES)
def test_a_fused_call_of_several_outputs_is_one_launch_from_c(runs, case):
    """Once planned, each call is one launch by the eval loop's C part (no Python launch, no
    run_compiled), the fused kernel writing every output."""
    got = runs["1"][case]
    assert got["n"] == OUTPUTS[case.split("_")[0]]
    assert got["c"] == 1 and got["py"] == 0 and got["ran"] == 1, got
    assert got["paths"].get("fused_kernel_device") == 3 and "run_compiled" not in got["paths"], got


@pytest.mark.parametrize("case", CASES)
def test_the_python_loop_takes_the_same_path_from_python(runs, case):
    """The loop's Python reference (TAPESCOPE_C_CALL=0): the same plan launched through
    ``launch_fused``, the same buffers and values."""
    c, py = runs["1"][case], runs["0"][case]
    assert py["c"] == 0 and py["py"] == 1 and py["ran"] == 1, py
    assert py["paths"] == c["paths"] and py["peak"] == c["peak"], (py, c)
    assert py["donated_paths"] == c["donated_paths"], (py, c)


@pytest.mark.parametrize("c_call", ["1", "0"])
@pytest.mark.parametrize("case", CASES)
def test_its_outputs_match_float64_numpy_and_the_cpu(runs, case, c_call):
    got = runs[c_call][case]
    tol = TOL[case.split("_")[1]]
    assert max(got["err"]) < tol and max(got["donated_err"]) < tol, got
    assert max(got["cpu_err"]) < tol, got
    assert got["kept"] and got["fresh"], got


# per output: the argument (its position among the full-size ones) whose buffer it takes
# when the arguments are dying, by MLX's walk (inputs once, in the tape's order, each to the
# next output that can take it) and the restrict rule (only an input the output reads).
# The tapes' outputs: adam's (m, v, p) updates (arguments p, m, g, v in the tape's order:
# m's update skips p, which it does not read); four's u, v, w, w * s; swap's u does not
# read a: b's buffer, and nothing left for the second output.
DONORS = {"adam": [1, 2, 3], "two": [0, None], "four": [0, 1, None, None], "swap": [1, None]}
ARRAYS = {"adam": 4, "two": 1, "four": 2, "swap": 2}  # full-size array arguments


@pytest.mark.parametrize("c_call", ["1", "0"])
@pytest.mark.parametrize("case", CASES)
def test_dying_inputs_give_their_buffers_to_the_outputs_that_read_them(runs, case, c_call):
    """Inputs nobody else holds (MLX's donation, bfloat16 and float16 storage too): the
    outputs take their buffers where MLX's Compiled rules and the restrict pointers allow it
    (the Adam update writes all three over its dying inputs: the inputs' copies are all the
    memory the call takes), fresh buffers for the rest; no output is ever written over an
    input its value does not read. Still one launch, from C where the loop's C part is on."""
    got = runs[c_call][case]
    name = case.split("_")[0]
    assert got["donors"] == DONORS[name], got
    fresh = DONORS[name].count(None)
    row = 0.1 if name == "two" else 0  # two's b: one row (a page at most)
    assert ARRAYS[name] + fresh <= got["peak"] <= ARRAYS[name] + fresh + row, got
    assert got["donated_paths"].get("fused_kernel_device") == 1, got
    assert "run_compiled" not in got["donated_paths"], got
    assert runs[c_call]["aliases"] == []
