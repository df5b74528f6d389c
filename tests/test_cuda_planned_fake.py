"""The CUDA backend's planned launches, run over ``tests/fake_cupy.py`` with
``tests/fake_cuda_driver.py`` (kernels load without NVRTC, a stand-in libcuda counts the
launches and runs nothing): which calls the eval loop launches from C once their layout is
planned, and how many launches each makes. The values need the GPU
(``test_cuda_reductions.py``); here only the host's path and the launch counts are checked,
in a fresh process whose ``import cupy`` is the stand-in."""

from pathlib import Path

import pytest

from conftest import stand_in_result

HERE = Path(__file__).parent

CODE = r"""
import json, sys
sys.path.insert(0, %r)
import fake_cupy; fake_cupy.install()
import fake_cuda_driver; fake_cuda_driver.install()
import numpy as np
import tapescope, tapescope.core as mx
from tapescope.kernels import kernel_call
from tapescope.kernels.common import reductions as plan
from tapescope.core import evaluate as ev

mx.set_default_device(mx.gpu)
from tapescope.kernels import backends as bk
assert bk.backend("gpu").device_api is not None
x = mx.add(mx.array(np.ones((4096, 130), np.float32)), 0)
t = mx.add(mx.array(np.ones((4096, 130), np.float32)), 0)
xb = x.astype(mx.bfloat16)
mx.eval(x, t, xb)
tapescope.set_fusion("extended")

def softmax(v):
    e = mx.exp(v - mx.max(v, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)

def xent(v, w):
    m = mx.max(v, axis=-1, keepdims=True)
    lse = mx.log(mx.sum(mx.exp(v - m), axis=-1, keepdims=True)) + m
    return mx.sum(w * (lse - v), axis=-1)

sm, xe = mx.compile(softmax), mx.compile(xent)
ops = {"sum_first": lambda: mx.sum(x, axis=0), "max_first": lambda: mx.max(x, axis=0),
       "sum_all": lambda: mx.sum(x), "sum_last": lambda: mx.sum(x, axis=-1),
       "softmax": lambda: mx.softmax(x, axis=-1), "softmax_written": lambda: sm(x),
       "xent_written": lambda: xe(x, t),
       "bf16_sum_first": lambda: mx.sum(xb, axis=0), "bf16_sum_last": lambda: mx.sum(xb, axis=-1),
       "bf16_max_last": lambda: mx.max(xb, axis=-1),
       "bf16_logsumexp": lambda: mx.logsumexp(xb, axis=-1)}
ran = []
real = kernel_call.KernelRule.__call__
def spy(self, *a, **k):
    ran.append(self.name)
    return real(self, *a, **k)
kernel_call.KernelRule.__call__ = spy
out = {"splits": plan.col_splits(130, 4096)}
first_args = {}
for name, f in ops.items():
    mx.eval(f())
    if fake_cuda_driver.PY_CALLS:
        first_args[name] = fake_cuda_driver.PY_CALLS[-1]
    del ran[:]
    ev.reset_dispatch_counts()
    c0, p0 = fake_cuda_driver.launches(), fake_cuda_driver.PY_LAUNCHES[0]
    for _ in range(3):
        mx.eval(f())
    out[name] = {"c": (fake_cuda_driver.launches() - c0) / 3,
                 "py": (fake_cuda_driver.PY_LAUNCHES[0] - p0) / 3, "rules": list(ran),
                 "paths": {k: v for k, v in ev.dispatch_counts().items() if v}}
# a sequence's packed words against the rule's own launches from Python (Step.run)
import threading
from tapescope.kernels.cuda import reductions, primitive_plans
xd = x._d.data
seq = next(p for p in reductions.RULES["Sum"].plans.values()
           if isinstance(p, primitive_plans.PlanSequence) and p.shape == (1, 130))
o = fake_cupy.empty((1, 130), np.float32)
seq.call([xd], [o])
packed = [list(q.packs[threading.get_ident()][0]) for q in (seq, *seq.then)]
reductions._launch(plan.call_for("Sum", xd.dtype, xd.shape, 4, xd.strides, {"axes": (0,)}),
                   xd, "Sum", fake_cupy, {"axes": (0,)}, o)
py = []
for fn, grid, block, args in fake_cuda_driver.PY_CALLS[-2:]:
    py.append([int(a) if isinstance(a, np.integer) else a.__array_interface__["data"][0]
               for a in args] + [grid[0], block[0], fn])
c = [w[:len(q.offsets)] + [q.grid, q.block, q.fn_ptr] for w, q in zip(packed, (seq, *seq.then))]
scratch = seq.scratch_for(fake_cupy.get_current_stream().ptr)
part = py[0][[i for i, (a, b) in enumerate(zip(c[0], py[0])) if a == scratch][0]]
swap = lambda row: [scratch if v == part else v for v in row]
out["sequence_words"] = {"c": c, "python": [swap(r) for r in py],
                         "x": xd.__array_interface__["data"][0], "out": o.__array_interface__["data"][0]}
# a reduction tape's plan against its first call's launch from Python (run_reduction)
import gc
from tapescope.kernels.cuda.fused_reduction import ReductionLaunch
fn, grid, block, args = first_args["xent_written"]
ln = next(o for o in gc.get_objects() if type(o) is ReductionLaunch and o.fn_ptr == fn)
words = list(ln.packs[threading.get_ident()][0])
row = lambda a: int(a) if isinstance(a, np.integer) else a.__array_interface__["data"][0]
out["tape_words"] = {"c": [w for j, w in enumerate(words[:len(ln.offsets)]) if j != ln.n_out_at]
                            + [ln.grid, ln.block],
                     "python": [row(a) for j, a in enumerate(args) if j != ln.n_out_at]
                               + [grid[0], block[0]],
                     "inputs": [x._d.data.__array_interface__["data"][0], t._d.data.__array_interface__["data"][0]]}

# a second stream: its own scratch buffer, both launches on its CUDA stream
from tapescope.kernels.cuda import device
s2 = mx.new_stream(mx.gpu)
for _ in range(2):
    mx.eval(mx.sum(x, axis=0, stream=s2))
n = fake_cuda_driver.launches()
last = [fake_cuda_driver.launch(k) for k in (n - 4, n - 3, n - 2, n - 1)]
out["second_stream"] = {"scratches": sorted(seq.scratches), "streams": [l[3] for l in last],
                        "s2": device.cuda_stream(s2.index).ptr,
                        "s1": device.cuda_stream(mx.default_stream(mx.gpu).index).ptr}
# an eager chain's intermediates give their buffers to the next op (16-bit storage too)
out["chain_peak"] = {}
for dt in ("float32", "bfloat16", "float16"):
    v = v0 = mx.add(mx.array(np.ones(1 << 16, np.float32)), 0).astype(getattr(mx, dt))
    mx.eval(v0)
    for _ in range(10):
        v = v * 1.0001 + 0.5
    mx.clear_cache()
    a0 = mx.get_active_memory()
    mx.reset_peak_memory()
    mx.eval(v)
    out["chain_peak"][dt] = (mx.get_peak_memory() - a0) / v0.nbytes
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def counts():
    return stand_in_result(CODE % str(HERE))


@pytest.mark.parametrize("op", ["sum_first", "max_first", "sum_all"])
def test_a_two_pass_reduction_is_two_launches_from_c_and_no_python_rule(counts, op):
    assert counts["splits"] > 1  # the first axis is reduced in splits, then merged
    got = counts[op]
    assert got["c"] == 2 and got["py"] == 0 and got["rules"] == [], got


@pytest.mark.parametrize("op", ["bf16_sum_first", "bf16_sum_last", "bf16_max_last",
                                "bf16_logsumexp"])
def test_a_bfloat16_reduction_reads_its_storage_launched_from_c(counts, op):
    """No widening casts (they launch from Python) and no float32 rule: the kernel reads the
    bfloat16 storage and is planned as float32's (two launches for split columns)."""
    got = counts[op]
    assert got["c"] == (2 if op == "bf16_sum_first" else 1) and got["py"] == 0, got
    f32 = counts["sum_first" if op == "bf16_sum_first" else "sum_last"]
    assert got["rules"] == [] and got["paths"] == f32["paths"], (got, f32)


@pytest.mark.parametrize("op", ["sum_last", "softmax"])
def test_a_one_launch_reduction_is_one_launch_from_c(counts, op):
    got = counts[op]
    assert got["c"] == 1 and got["py"] == 0 and got["rules"] == [], got


def test_sum_without_keepdims_squeezes_by_a_view_in_the_loop(counts):
    assert counts["sum_last"]["paths"].get("view", 0) == 3, counts["sum_last"]  # 3 calls


@pytest.mark.parametrize("op", ["softmax_written", "xent_written"])
def test_an_extended_fusion_reduction_tape_is_one_launch_from_c(counts, op):
    got = counts[op]
    assert got["c"] == 1 and got["py"] == 0, got


def test_a_sequence_launches_what_the_rule_launches_from_python(counts):
    """The sequence's packed words (integers, the input's, the scratch's and the output's
    pointers) and grids are those of the rule's launches from Python (``run_steps``), the
    rule's partial results buffer read as the scratch."""
    got = counts["sequence_words"]
    assert got["c"] == got["python"], got
    assert got["x"] in got["c"][0] and got["out"] in got["c"][-1] and got["out"] not in got["c"][0]


def test_a_sequence_on_a_second_stream_has_its_own_scratch_and_runs_there(counts):
    got = counts["second_stream"]
    # one scratch per CUDA stream the plan ran on (the direct call above ran on CuPy's current)
    assert got["s1"] != got["s2"] and {got["s1"], got["s2"]} <= set(got["scratches"]), got
    assert got["streams"] == [got["s2"]] * 4, got  # both calls' two launches on that stream


def test_a_reduction_tape_plan_launches_what_its_first_call_launched(counts):
    """The plan's words (the inputs' pointers, rows, cols, strides) and grid are those the
    first call's Python launch passed (the output's pointer aside: a fresh buffer each)."""
    got = counts["tape_words"]
    assert got["c"] == got["python"], got
    assert set(got["inputs"]) <= set(got["c"]), got


def test_an_eager_chain_donates_its_intermediates_in_every_storage_type(counts):
    """20 ops, one output buffer: each op writes over its input's (MLX's donation), bfloat16's
    uint16 storage as float32's."""
    assert counts["chain_peak"] == {"float32": 1.0, "bfloat16": 1.0, "float16": 1.0}
