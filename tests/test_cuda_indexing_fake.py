"""``GatherAxis`` / ``ScatterAxis`` (sum) on the CUDA backend make no host wait, over
``tests/fake_cupy.py`` with ``tests/fake_cuda_driver.py`` (kernels load without NVRTC, a
stand-in libcuda runs nothing): a ``take_along_axis`` and its VJP evaluated on the GPU read
nothing back from the device (no ``get``, no stream or device synchronisation) and launch
one kernel each, whose arguments are the arrays, the element count, the axis's size and the
per-dimension sizes and strides (no bounds word), as MLX's CUDA gather / scatter check no
index. The values need the GPU (``test_cuda_indexing.py``)."""

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
import tapescope.core as mx

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
        del fake_cuda_driver.PY_CALLS[:]
        mx.eval(y)
        calls = [c for c in fake_cuda_driver.PY_CALLS if c[0]]
        out[f"{op}_{name}"] = {
            "reads": reads[0] - r0, "syncs": fake_cupy._SYNCS[0] - s0,
            "launches": fake_cuda_driver.PY_LAUNCHES[0] - p0,
            "nargs": [len(c[3]) for c in calls]}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def got():
    return stand_in_result(CODE % str(HERE))


@pytest.mark.parametrize("case", [f"{op}_{dt}" for op in ("gather", "scatter")
                                  for dt in ("float32", "bfloat16")])
def test_an_axis_gather_or_scatter_reads_nothing_back_from_the_device(got, case):
    row = got[case]
    assert row["reads"] == 0 and row["syncs"] == 0, row
    assert row["launches"] == 1, row
    # 2-d: three arrays, the count and the axis's size, then per dimension its size and a
    # stride per array (gather: a and the indices; scatter: output, indices, updates)
    per_dim = 3 if case.startswith("gather") else 4
    assert row["nargs"] == [3 + 2 + 2 * per_dim], row
