"""``Slice`` and ``SliceUpdate`` (``a[..., i:j, :] = v``, a KV cache's write) on the CUDA backend
(``kernels/cuda/slicing.py``) over ``tests/fake_cupy.py`` with ``tests/fake_cuda_driver.py``,
its copy kernels computed at their launch by their CUDA source's host build
(``run_kernels_on_host``: the plan's own argument words), against numpy: a cache written one
position a call is launched from C once planned, with no Python ``run_node``; where nobody
else holds the cache its buffer is written in place by the window's launch alone (the same
pointer, no copy of the cache); where a view holds it, the cache is copied into a fresh
buffer first and the held view keeps its values; random windows (steps, negative steps,
broadcast and transposed updates, every item size) equal numpy's assignment. A Slice is
the device array's own basic indexing, made by the eval loop in C (``core/_loop.c``
slice_view: no Python rule frame), equal to numpy's for random bounds and steps, negative
and out of range ones too. The GPU runs the same kernels in ``test_cuda_slice_update.py``."""

from pathlib import Path

import pytest

from conftest import stand_in_result
from cuda_host import CXX

HERE = Path(__file__).parent
pytestmark = pytest.mark.skipif(CXX is None, reason="no g++ to build the CUDA source for the host")

CODE = r"""
import json, sys
sys.path.insert(0, %r)
import fake_cupy; fake_cupy.install()
import fake_cuda_driver; fake_cuda_driver.install()
fake_cuda_driver.run_kernels_on_host("copy_")
import numpy as np
import tapescope.core as mx
from tapescope.core import evaluate as ev
from tapescope.kernels import timeline

mx.set_default_device(mx.gpu)
python_nodes = []
real = ev._run_node
def counted(node):
    python_nodes.append(node.primitive.name)
    return real(node)
ev._run_node = counted
ev.c_loop = ev._c_loop()
f32 = lambda x: np.array(x.astype(mx.float32)) if x.dtype == mx.bfloat16 else np.array(x)
ptr = lambda x: getattr(x._d.data, "raw", x._d.data).data.ptr
rng = np.random.default_rng(7)
out = {"cache": {}, "random": []}
for name in ("float32", "bfloat16", "int8", "float16"):
    dt = getattr(mx, name)
    c = mx.add(mx.array(rng.standard_normal((1, 4, 12, 8)).astype(np.float32) * 4), 0).astype(dt)
    mx.eval(c)
    want = f32(c)
    rows = []
    for t in range(8):
        u = mx.add(mx.array(rng.standard_normal((1, 4, 1, 8)).astype(np.float32) * 4), 0).astype(dt)
        mx.eval(u)
        held = c[:, 1:] if t %% 3 == 2 else None  # a view holding the cache's buffer
        if held is not None:
            mx.eval(held)
            before = f32(held)
        p0, c0, r0 = ptr(c), fake_cuda_driver.launches(), fake_cuda_driver.RAN[0]
        del python_nodes[:]
        with timeline.record() as rec:
            c[..., t:t + 1, :] = u
            mx.eval(c)
        row = {"c": fake_cuda_driver.launches() - c0, "ran": fake_cuda_driver.RAN[0] - r0,
               "same": ptr(c) == p0, "held": held is not None, "python": list(python_nodes),
               "names": [r.name for r in rec.records if r.kind == "kernel_launch"]}
        want[..., t:t + 1, :] = f32(u)
        row["equal"] = bool(np.array_equal(f32(c), want))
        if held is not None:
            row["held_kept"] = bool(np.array_equal(f32(held), before))
        rows.append(row)
    out["cache"][name] = rows

def window(n):
    b, e = sorted(rng.integers(0, n + 1, 2).tolist())
    if b == e:
        e = b + 1 if b < n else b
        b = e - 1
    s = int(rng.choice([1, 1, 2, 3, -1, -2]))
    return slice(b, e, s) if s > 0 else slice(e - 1, (b - 1) if b > 0 else None, s)

for k in range(40):
    name = ["float32", "bfloat16", "int8", "float16", "int64", "uint16"][k %% 6]
    dt, nd = getattr(mx, name), int(rng.integers(1, 4))
    shape = tuple(int(s) for s in rng.integers(1, 7, nd))
    base = rng.integers(0, 100, shape).astype(np.float32)  # (exact in every dtype here)
    a = mx.add(mx.array(base), 0).astype(dt)
    if rng.integers(0, 2) and nd > 1:  # a transposed (column-order) input: not donatable
        a = mx.add(mx.array(np.ascontiguousarray(base.T)), 0).astype(dt).T
    idx = tuple(window(n) for n in shape)
    wshape = base[idx].shape
    src = rng.integers(0, 100, wshape).astype(np.float32)
    form = int(rng.integers(0, 3)) if nd > 1 else 0
    if form == 1:  # broadcast along the first axis (stride 0)
        src = np.broadcast_to(src[:1], wshape)
        upd = mx.broadcast_to(mx.array(np.ascontiguousarray(src[:1])).astype(dt), wshape)
    elif form == 2:  # a transposed update
        upd = mx.array(np.ascontiguousarray(src.T)).astype(dt).T
    else:
        upd = mx.array(src).astype(dt)
    mx.eval(a, upd)
    want = base.copy()
    want[idx] = src
    for rep in range(2):  # (the first call plans it, the second is the C loop's)
        b = mx.array(a) if rep == 0 else a
        b[idx] = upd
        got = np.array(b.astype(mx.float32))
    out["random"].append({"case": [name, list(shape), str(idx)],
                          "equal": bool(np.array_equal(got, want))})

import cProfile, pstats
from tapescope.kernels.rules import indexing as rules
out["slices"] = {}
for name in ("float32", "bfloat16"):
    base = rng.integers(0, 50, (5, 6, 7)).astype(np.float32)
    a = mx.array(base).astype(getattr(mx, name))
    mx.eval(a)
    bad, pr = [], cProfile.Profile()
    for k in range(200):
        idx = tuple(slice(*(int(v) for v in rng.integers(-n - 2, n + 2, 2)),
                          int(rng.choice([1, 2, -1, -3]))) for n in base.shape)
        y = a[idx]
        pr.enable()
        mx.eval(y)
        pr.disable()
        got = y._d.data.get().astype(np.float32)  # (the view's own elements, bfloat16's bits)
        if got.shape != base[idx].shape or not np.array_equal(got, base[idx]):
            bad.append(str(idx))
    rule_calls = sum(v[1] for k, v in pstats.Stats(pr).stats.items()
                     if k[2] in ("slice_", "_slices"))
    out["slices"][name] = {"bad": bad, "rule_calls": rule_calls}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def got():
    return stand_in_result(CODE % str(HERE), timeout=900)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float16"])
def test_a_cache_write_equals_numpy_and_is_launched_from_c(got, dtype):
    rows = got["cache"][dtype]
    assert all(r["equal"] for r in rows), rows
    # after the first call (which plans it) no node goes through the Python run_node
    assert all(r["python"] == [] for r in rows[1:]), rows


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float16"])
def test_a_donated_cache_is_written_in_place_by_the_window_alone(got, dtype):
    rows = [r for r in got["cache"][dtype][1:] if not r["held"]]
    assert rows
    for r in rows:  # one launch, the window's, into the cache's own buffer: no copy of it
        assert r["same"] and r["c"] == 1 and r["ran"] == 1, r
        assert [n.split("_")[1] for n in r["names"]] == ["window"], r


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float16"])
def test_a_held_cache_is_copied_first_and_not_written(got, dtype):
    rows = [r for r in got["cache"][dtype] if r["held"]]
    assert rows
    for r in rows:  # the copy into a fresh buffer, then the window; the held view unchanged
        assert not r["same"] and r["c"] == 2 and r["held_kept"], r
        assert [n.split("_")[1] for n in r["names"]] == ["strided", "window"], r


def test_random_windows_equal_numpy(got):
    bad = [r for r in got["random"] if not r["equal"]]
    assert not bad, bad


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_slice_is_made_in_c_and_equals_numpy(got, dtype):
    row = got["slices"][dtype]
    assert row["bad"] == [] and row["rule_calls"] == 0, row
