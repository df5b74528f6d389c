"""The deferred bounds check of the CUDA gather / scatter kernels (``cuda/bounds.py``) over
the stand-in CUDA stack (``tests/fake_cupy.py``, ``tests/fake_cuda_driver.py``), with the
gather / scatter kernels' own CUDA text run on the host at their launches
(``tests/cuda_host_shim.h``: the plan's packed words as CUDA's parameters, the arrays at
their stand-in device pointers, the stream's bounds record in the stand-in's pinned
memory) and the fused tapes computed (``run_fused_tapes``):

- ``take_along_axis`` and its VJP's scatter give numpy's values, and an index out of
  bounds raises numpy's IndexError (type and message) from the eval, from the C launch of
  the plan and from the rule's first call alike, with the first bad index of the walk;
- the failed eval's arrays raise the same error when read or used, the record is cleared
  and the next eval on the stream is right;
- take / ``a[idx]`` / put_along_axis / ``.at[]`` (the rules' checks) raise numpy's error;
- gather_qmm's gather-qmv kernel (its C build, the same text, run at its launch) raises
  numpy's error for an index outside x's or w's batch, as the CPU stream does;
- an eager chain of gathers and scatters makes no host synchronisation: one wait per eval,
  no read-back (counted through the timeline and the stand-in).
The GPU's own cases are ``test_cuda_indexing.py``'s."""

from pathlib import Path

import numpy as np
import pytest

from conftest import stand_in_result

HERE = Path(__file__).parent

CODE = r"""
import ctypes, json, sys
sys.path.insert(0, HERE_PATH)
import fake_cupy; fake_cupy.install()
import fake_cuda_driver; fake_cuda_driver.install()
fake_cuda_driver.run_fused_tapes()
import cuda_host
import numpy as np
import tapescope.core as mx
from tapescope.kernels import timeline
from tapescope.kernels.cuda import bounds, device, indexing

# the axis plans' kernels run on the host at their launch, from C or from Python
ran = {"axis": 0}
real_run = fake_cuda_driver._run_launch
def run(params):
    got = fake_cuda_driver._PACKS.get(params)
    if got is not None and type(got[0]) is indexing.AxisPlan:
        plan = got[0]
        lib = cuda_host.build(plan.entry.source, [plan.name])
        fn = getattr(lib, "ts_run_" + plan.name)
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
        assert fn(plan.grid, plan.block, params) == 0
        ran["axis"] += 1
        return
    real_run(params)
fake_cuda_driver._run_launch = run

# the gather-qmv kernel's C build (the same text, blocks and lanes walked in order) at its launch
import threading
from tapescope.kernels.codegen import qmv_cuda
from tapescope.kernels.cpu import compiler
def run_qmv(plan):
    spec = plan.entry.tape
    vals = plan.packs[threading.get_ident()][0]
    args = [int(vals[plan.offsets[i]]) for i in range(len(spec.params()))]
    entry = compiler.get_kernel(spec.name, spec.layout, lambda tc: qmv_cuda.c_source(spec),
                                key="qmv_c:" + spec.name)
    entry.fast_fn(gil=True)((ctypes.c_void_p * len(args))(*args))
    ran["qmv"] = ran.get("qmv", 0) + 1
real_run2 = fake_cuda_driver._run_launch
def run2(params):
    got = fake_cuda_driver._PACKS.get(params)
    if got is not None and isinstance(getattr(got[0].entry, "tape", None), qmv_cuda.QmvSpec):
        return run_qmv(got[0])
    real_run2(params)
fake_cuda_driver._run_launch = run2

mx.set_default_device(mx.gpu)
reads = [0]
real_get = fake_cupy.ndarray.get
def get(self, *a, **k):
    reads[0] += 1
    return real_get(self, *a, **k)
fake_cupy.ndarray.get = get

def numpy_error(f):
    try:
        f()
    except IndexError as e:
        return [type(e).__name__, str(e)]
    return None

def error(f):
    try:
        f()
    except BaseException as e:
        return [type(e).__name__, str(e)]
    return None

out = {}
rng = np.random.default_rng(0)
a_np = rng.standard_normal((6, 5)).astype(np.float32)
a = mx.add(mx.array(a_np), 0.0)
mx.eval(a)
good_np = rng.integers(-5, 5, (6, 3)).astype(np.int32)
bad_np = good_np.copy()
bad_np[2, 1], bad_np[4, 0] = 7, -9  # (2, 1) comes first in the walk
for call in ("first", "second", "third"):  # the rule's call, then the C launches
    g = mx.take_along_axis(a, mx.array(good_np), axis=1)
    out["gather_" + call] = np.array(g).tolist()
    b = mx.take_along_axis(a, mx.array(bad_np), axis=1)
    out["gather_bad_" + call] = error(lambda: mx.eval(b))
    out["read_after_" + call] = error(lambda: np.array(b))
    out["use_after_" + call] = error(lambda: mx.eval(b + 1))
    out["record_after_" + call] = error(lambda: bounds.check(device.cuda_stream(b._d.stream.index).ptr))
out["gather_want"] = np.take_along_axis(a_np, good_np, axis=1).tolist()
out["gather_numpy"] = numpy_error(lambda: np.take_along_axis(a_np, bad_np, axis=1))
out["axis_launches"] = ran["axis"]

# failed evals leak nothing: the allocator's active memory does not grow
import gc
bad_idx = mx.array(bad_np)
mx.eval(bad_idx)
gc.collect()
m0 = mx.get_active_memory()
for _ in range(4):
    b = mx.take_along_axis(a, bad_idx, axis=1)
    error(lambda: mx.eval(b))
    del b
gc.collect()
out["active_growth"] = mx.get_active_memory() - m0
del bad_idx

# an intermediate of the failed eval is not readable either
h = mx.take_along_axis(a, mx.array(bad_np), axis=1)
y = mx.sum(h * 2.0)
out["chain_bad"] = error(lambda: mx.eval(y))
out["chain_intermediate"] = error(lambda: h.tolist())

# the VJP's ScatterAxis (sum): values, then an index out of bounds
up_np = rng.standard_normal((6, 3)).astype(np.float32)
up = mx.add(mx.array(up_np), 0.0)
def vjp(idx):
    return mx.vjp(lambda v: mx.take_along_axis(v, idx, axis=1), [a], [up])[1][0]
for call in ("first", "second"):
    out["scatter_" + call] = np.array(vjp(mx.array(good_np))).tolist()
    s = vjp(mx.array(bad_np))
    out["scatter_bad_" + call] = error(lambda: mx.eval(s))
want = np.zeros_like(a_np)
np.add.at(want, (np.arange(6)[:, None].repeat(3, 1), good_np % 5), up_np)
out["scatter_want"] = want.tolist()
out["scatter_numpy"] = numpy_error(lambda: np.put_along_axis(np.zeros_like(a_np), bad_np, up_np, axis=1))

# the rules' checks: take, a[idx], put_along_axis, .at[] updates
i_np = np.array([1, 9, 2], np.int32)
for name, f, g in (
        ("take", lambda: mx.eval(mx.take(a, mx.array(i_np), axis=1)),
         lambda: np.take(a_np, i_np, axis=1)),
        ("getitem", lambda: mx.eval(a[mx.array(i_np)]), lambda: a_np[i_np]),
        ("put_along_axis", lambda: mx.eval(mx.put_along_axis(a, mx.array(bad_np), mx.array(up_np), axis=1)),
         lambda: np.put_along_axis(a_np.copy(), bad_np, up_np, axis=1)),
        ("at_add", lambda: mx.eval(a.at[mx.array(i_np)].add(1.0)),
         lambda: np.add.at(a_np.copy(), i_np, 1.0))):
    out[name] = [error(f), numpy_error(g)]

# gather_qmm: an index outside x's or w's batch (numpy's error for x[lhs], then w[rhs])
wf = rng.standard_normal((2, 32, 64)).astype(np.float32)
with mx.stream(mx.cpu):
    wq, ws, wb = [np.array(t) for t in mx.quantize(mx.array(wf), group_size=32, bits=4)]
xq_np = rng.standard_normal((1, 1, 64)).astype(np.float32)
def gqmm(lhs, rhs, stream=None):
    ops = [mx.array(t) for t in (xq_np, wq, ws, wb)]
    if stream is not None:
        with mx.stream(stream):
            return mx.gather_qmm(*ops, lhs_indices=mx.array(np.array(lhs, np.uint32)),
                                 rhs_indices=mx.array(np.array(rhs, np.uint32)), group_size=32, bits=4)
    return mx.gather_qmm(*ops, lhs_indices=mx.array(np.array(lhs, np.uint32)),
                         rhs_indices=mx.array(np.array(rhs, np.uint32)), group_size=32, bits=4)
for call in ("first", "second", "third"):
    out["qmm_good_" + call] = np.array(gqmm([0, 0, 0], [1, 0, 1])).tolist()
    for name, lhs, rhs in (("rhs", [0, 0, 0], [1, 5, 7]), ("lhs", [0, 3, 0], [1, 0, 1]),
                           ("both", [0, 0, 2], [9, 0, 1])):
        out[f"qmm_{name}_{call}"] = error(lambda: mx.eval(gqmm(lhs, rhs)))
for name, lhs, rhs in (("rhs", [0, 0, 0], [1, 5, 7]), ("lhs", [0, 3, 0], [1, 0, 1]),
                       ("both", [0, 0, 2], [9, 0, 1])):
    out[f"qmm_{name}_cpu"] = error(lambda: mx.eval(gqmm(lhs, rhs, mx.cpu)))
    out[f"qmm_{name}_numpy"] = numpy_error(lambda: (xq_np[np.array(lhs)], wf[np.array(rhs)]))
out["qmm_good_cpu"] = np.array(gqmm([0, 0, 0], [1, 0, 1], mx.cpu)).tolist()
out["qmv_launches"] = ran.get("qmv", 0)

# an eager chain with the check: no host synchronisation, one wait per eval
idx = mx.array(good_np)
mx.eval(idx)
x = a
for _ in range(2):  # (plans made)
    x = mx.take_along_axis(x, idx, axis=1)
    x = vjp(idx) + mx.sum(x)
    mx.eval(x)
r0, s0, h0 = reads[0], fake_cupy._SYNCS[0], device.host_syncs()
with timeline.record() as rec:
    for _ in range(5):
        g = mx.take_along_axis(a, idx, axis=1)
        x = vjp(idx) * 0.5 + mx.sum(g)
        mx.eval(x)
out["chain"] = {"reads": reads[0] - r0, "syncs": fake_cupy._SYNCS[0] - s0,
                "host_syncs": device.host_syncs() - h0,
                "waits": sum(1 for r in rec.records if r.kind == "event_wait"
                             and not (r.detail or {}).get("device_wait")),
                "evals": sum(1 for r in rec.records if r.kind == "eval_begin")}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def got():
    return stand_in_result(CODE.replace("HERE_PATH", repr(str(HERE))))


@pytest.mark.parametrize("call", ["first", "second", "third"])
def test_a_gather_out_of_bounds_raises_numpys_error_at_the_eval(got, call):
    assert got["gather_" + call] == got["gather_want"]
    assert got["gather_numpy"] == ["IndexError", "index 7 is out of bounds for axis 1 with size 5"]
    assert got["gather_bad_" + call] == got["gather_numpy"]


@pytest.mark.parametrize("call", ["first", "second", "third"])
def test_the_failed_evals_arrays_raise_the_same_error_and_the_record_is_cleared(got, call):
    assert got["read_after_" + call] == got["gather_numpy"]
    assert got["use_after_" + call] == got["gather_numpy"]
    assert got["record_after_" + call] is None


def test_failed_evals_leak_no_device_memory(got):
    assert got["active_growth"] == 0, got["active_growth"]


def test_an_intermediate_of_the_failed_eval_is_not_readable(got):
    assert got["axis_launches"] >= 6, got["axis_launches"]  # (the kernels' own text ran)
    assert got["chain_bad"] == got["gather_numpy"]
    assert got["chain_intermediate"] == got["gather_numpy"]


@pytest.mark.parametrize("call", ["first", "second"])
def test_a_scatter_out_of_bounds_raises_numpys_error(got, call):
    np.testing.assert_allclose(got["scatter_" + call], got["scatter_want"], rtol=1e-6, atol=1e-6)
    assert got["scatter_numpy"][0] == "IndexError"
    assert got["scatter_bad_" + call] == got["scatter_numpy"]


@pytest.mark.parametrize("name", ["take", "getitem", "put_along_axis", "at_add"])
def test_the_rules_checks_raise_numpys_error(got, name):
    mine, numpy = got[name]
    assert numpy is not None and numpy[0] == "IndexError"
    assert mine == numpy


@pytest.mark.parametrize("call", ["first", "second", "third"])
@pytest.mark.parametrize("name", ["rhs", "lhs", "both"])
def test_gather_qmm_outside_the_batch_raises_numpys_error_as_the_cpu_does(got, name, call):
    """The gather-qmv kernel notes the index (x's batch before w's, numpy's order) instead
    of clamping it; the eval raises numpy's error, the CPU stream's too; in range it is
    the CPU's product."""
    assert got["qmv_launches"] >= 12, got["qmv_launches"]  # (the kernel's own text ran)
    want = got[f"qmm_{name}_numpy"]
    assert want is not None and want[0] == "IndexError"
    assert got[f"qmm_{name}_{call}"] == want
    assert got[f"qmm_{name}_cpu"] == want
    np.testing.assert_allclose(got["qmm_good_" + call], got["qmm_good_cpu"], rtol=1e-5, atol=1e-5)


def test_an_eager_chain_with_the_check_makes_no_host_synchronisation(got):
    c = got["chain"]
    assert c["reads"] == 0 and c["syncs"] == 0 and c["host_syncs"] == 0, c
    assert c["waits"] == c["evals"] == 5, c
