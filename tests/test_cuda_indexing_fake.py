"""``GatherAxis`` / ``ScatterAxis`` (sum) on the CUDA backend make no host wait, over
``tests/fake_cupy.py`` with ``tests/fake_cuda_driver.py`` (kernels load without NVRTC, a
stand-in libcuda runs nothing): a ``take_along_axis`` and its VJP evaluated on the GPU read
nothing back from the device at launch (no ``get``, no stream or device synchronisation:
the bounds check is deferred to the eval's wait, ``cuda/bounds.py``), and once planned are
launched by the eval loop from C (a gather one kernel, a scatter-sum the input's copy into
the output and the scatter), with the arrays' pointers, the stream's bounds word, the
element count, the axis's size and the per-dimension sizes and strides as their
arguments. The values need the GPU (``test_cuda_indexing.py``)."""

from pathlib import Path

import pytest

from conftest import stand_in_result

HERE = Path(__file__).parent

CODE = r"""
import json, sys, threading
sys.path.insert(0, %r)
import fake_cupy; fake_cupy.install()
import fake_cuda_driver; fake_cuda_driver.install()
import numpy as np
import tapescope.core as mx
from tapescope.core import evaluate as ev
from tapescope.kernels import timeline
from tapescope.kernels.cuda import bounds, device, indexing

mx.set_default_device(mx.gpu)
reads = [0]
real_get = fake_cupy.ndarray.get
def get(self, *a, **k):
    reads[0] += 1
    return real_get(self, *a, **k)
fake_cupy.ndarray.get = get
out = {}
for name, dt in (("float32", mx.float32), ("bfloat16", mx.bfloat16)):
    x = mx.add(mx.array(np.ones((64, 10), np.float32)), 0).astype(dt)
    idx = mx.array(np.tile(np.arange(10, dtype=np.int32)[::-1], (64, 1))[:, :3])
    up = mx.add(mx.array(np.ones((64, 3), np.float32)), 0).astype(dt)
    mx.eval(x, idx, up)
    for op, f in (("gather", lambda: mx.take_along_axis(x, idx, axis=1)),
                  ("scatter", lambda: mx.vjp(lambda v: mx.take_along_axis(v, idx, axis=1),
                                             [x], [up])[1][0])):
        y = f()
        mx.eval(y)  # (the first call builds)
        y = f()
        r0, s0, p0 = reads[0], fake_cupy._SYNCS[0], fake_cuda_driver.PY_LAUNCHES[0]
        c0 = fake_cuda_driver.launches()
        ev.reset_dispatch_counts()
        first = y._d.node.inputs[0]  # (the gather's x; the scatter's zeros)
        with timeline.record() as rec:
            mx.eval(y)
        prim = "GatherAxis" if op == "gather" else "ScatterAxis"
        plan = list(indexing.RULES[prim].plans.values())[-1]
        words = [list(p.packs[threading.get_ident()][0]) for p in (plan, *plan.then)]
        raw = lambda d: getattr(d, "raw", d)
        ptr = lambda a: raw(a._d.data).__array_interface__["data"][0]
        out[f"{op}_{name}"] = {
            "reads": reads[0] - r0, "syncs": fake_cupy._SYNCS[0] - s0,
            "py": fake_cuda_driver.PY_LAUNCHES[0] - p0, "c": fake_cuda_driver.launches() - c0,
            "paths": {k: v for k, v in ev.dispatch_counts().items() if v},
            "names": [r.name for r in rec.records if r.kind == "kernel_launch"],
            "words": words, "bounds": bounds.word_for(device.cuda_stream(y._d.stream.index).ptr),
            "a": raw(first.data).__array_interface__["data"][0], "idx": ptr(idx), "up": ptr(up), "y": ptr(y)}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def got():
    return stand_in_result(CODE % str(HERE))


@pytest.mark.parametrize("case", [f"{op}_{dt}" for op in ("gather", "scatter")
                                  for dt in ("float32", "bfloat16")])
def test_an_axis_gather_or_scatter_reads_nothing_back_and_launches_from_c(got, case):
    row = got[case]
    assert row["reads"] == 0 and row["syncs"] == 0, row
    assert row["py"] == 0, row  # (no Python launch: the plans from C)
    if case.startswith("gather"):  # a, indices, out, count, axis size, (size, sa, si) x 2
        assert row["c"] == 1 and len(row["names"]) == 1, row
        (w,) = row["words"]
        assert w[:6] == [row["a"], row["idx"], row["y"], row["bounds"], 64 * 3, 10], row
        assert w[6:12] == [64, 10, 3, 3, 1, 1] and len(w) == 12 + 2, row
    else:  # the input copied into the output, then indices, updates, out: the scatter
        assert row["c"] == 2, row  # the timeline names both launches of the sequence
        assert row["names"][0].startswith("copy_") and row["names"][1].startswith("scatter_axis_sum"), row
        copy, scatter = row["words"]
        assert copy[:3] == [row["a"], row["y"], 64 * 10] and copy[3:7] == [64, 10, 10, 1], row
        assert scatter[:6] == [row["idx"], row["up"], row["y"], row["bounds"], 64 * 3, 10], row
        assert scatter[6:14] == [64, 10, 3, 3, 3, 1, 1, 1], row
