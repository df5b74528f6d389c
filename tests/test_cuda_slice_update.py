"""``SliceUpdate`` as CUDA kernels (``kernels/cuda/slicing.py``) on the GPU against numpy: a
KV cache written one position a call, in float32, bfloat16, float16 and int32, its buffer
written in place where nobody else holds it (the same device pointer) and copied first where
a view holds it (the view keeps its values); random windows (steps, negative steps,
broadcast and transposed updates, transposed inputs) equal numpy's assignment. The stand-in
stack checks the launches and their words (``test_cuda_slicing_fake.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx

from conftest import kernel_launches, needs_cuda

pytestmark = needs_cuda

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16,
          "int32": mx.int32}


def _ptr(x) -> int:
    d = x._d.data
    return int(getattr(d, "raw", d).data.ptr)


@pytest.mark.usefixtures("gpu_default_device")
@pytest.mark.parametrize("name", sorted(DTYPES))
def test_a_cache_written_a_position_a_call_equals_numpy(name):
    dt = DTYPES[name]
    rng = np.random.default_rng(3)
    base = rng.integers(0, 100, (1, 4, 40, 16)).astype(np.float32)  # (exact in each dtype)
    c = mx.array(base).astype(dt) + 0
    mx.eval(c)
    want = base.copy()
    for t in range(24):
        src = rng.integers(0, 100, (1, 4, 1, 16)).astype(np.float32)
        u = mx.array(src).astype(dt)
        mx.eval(u)
        held = c[:, 1:] if t % 5 == 4 else None  # a view holding the cache's buffer
        if held is not None:
            mx.eval(held)
            before = np.array(held.astype(mx.float32))
        p0 = _ptr(c)
        with kernel_launches("cuda") as rec:
            c[..., t:t + 1, :] = u
            mx.eval(c)
        want[..., t:t + 1, :] = src
        np.testing.assert_array_equal(np.array(c.astype(mx.float32)), want)
        assert "SliceUpdate" in rec.primitives and not rec.fallbacks, rec.fallbacks
        if held is None:
            assert _ptr(c) == p0  # donated: written in place
        else:
            assert _ptr(c) != p0
            np.testing.assert_array_equal(np.array(held.astype(mx.float32)), before)


@st.composite
def case(draw):
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=nd, max_size=nd)))
    idx = []
    for n in shape:
        b = draw(st.integers(0, n - 1))
        e = draw(st.integers(b + 1, n))
        s = draw(st.sampled_from([1, 2, 3, -1, -2]))
        idx.append(slice(b, e, s) if s > 0 else slice(e - 1, b - 1 if b > 0 else None, s))
    return (shape, tuple(idx), draw(st.sampled_from(sorted(DTYPES))), draw(st.booleans()),
            draw(st.sampled_from(["plain", "broadcast", "transposed"])), draw(st.integers(0, 2 ** 16)))


@pytest.mark.usefixtures("gpu_default_device")
@settings(max_examples=60, deadline=None)
@given(case())
def test_a_window_update_equals_numpy(c):
    shape, idx, name, transposed, form, seed = c
    dt = DTYPES[name]
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 100, shape).astype(np.float32)
    a = mx.array(np.ascontiguousarray(base.T)).astype(dt).T if transposed else mx.array(base).astype(dt)
    wshape = base[idx].shape
    src = rng.integers(0, 100, wshape).astype(np.float32)
    if form == "broadcast" and len(shape) > 1:
        src = np.broadcast_to(src[:1], wshape)
        upd = mx.broadcast_to(mx.array(np.ascontiguousarray(src[:1])).astype(dt), wshape)
    elif form == "transposed":
        upd = mx.array(np.ascontiguousarray(src.T)).astype(dt).T
    else:
        upd = mx.array(np.ascontiguousarray(src)).astype(dt)
    mx.eval(a, upd)
    want = base.copy()
    want[idx] = src
    for _ in range(2):  # (the second call is launched from the plan the first made)
        b = mx.array(a)
        b[idx] = upd
        np.testing.assert_array_equal(np.array(b.astype(mx.float32)), want)
