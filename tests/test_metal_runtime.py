"""The Metal runtime (``kernels/metal``: PyObjC) evaluating ``mx.gpu`` work.

On a Mac with PyObjC's Metal this runs on the GPU. Elsewhere it skips, saying so, unless
``tests/fake_metal.py`` stands in for PyObjC's ``Metal`` (test_metal_backend_fake.py runs this
file that way on Linux: the runtime's plumbing with kernels run by the Metal shim).
"""

from __future__ import annotations

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends, timeline
from conftest import registered_as_gpu

try:
    import Metal  # noqa: F401

    HAVE_METAL = Metal.MTLCreateSystemDefaultDevice() is not None
except Exception:  # not macOS, or no PyObjC
    HAVE_METAL = False

pytestmark = pytest.mark.skipif(
    not HAVE_METAL, reason="PyObjC's Metal is not importable here (macOS with "
    "pyobjc-framework-Metal only; test_metal_backend_fake.py runs this file over a stand-in)")


@pytest.fixture(scope="module")
def metal():
    from tapescope.kernels.metal.backend import MetalBackend

    yield from registered_as_gpu(MetalBackend())


def test_the_metal_backend_is_the_gpu(metal):
    assert backends.backend(mx.gpu) is metal and mx.is_available(mx.gpu)
    assert mx.metal.is_available() or not backends.gpu_available()
    info = mx.device_info(mx.gpu)
    assert set(info) == {"device_name", "architecture", "max_buffer_length",
                         "max_recommended_working_set_size", "memory_size", "resource_limit"}


@pytest.mark.parametrize("dt", ["float32", "float16", "int32", "uint8", "bool_"])
def test_eager_elementwise_ops_run_as_metal_kernels(metal, dt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1000) * 4).astype(np.float32).astype(dt if dt != "bool_" else np.float32)
    a = x > 0 if dt == "bool_" else x
    b = np.roll(a, 3)
    with mx.stream(mx.gpu):
        ma, mb = mx.array(a), mx.array(b)
        outs = [mx.maximum(ma, mb), mx.equal(ma, mb), mx.where(ma > mb, ma, mb)]
        if dt.startswith("float"):
            outs += [mx.exp(ma), mx.multiply(ma, 2.5), ma.astype(mx.float16)]
        mx.eval(*outs)
    want = [np.maximum(a, b), a == b, np.where(a > b, a, b)]
    if dt.startswith("float"):
        with np.errstate(over="ignore"):  # exp past float16's range is inf in both
            want += [np.exp(a.astype(np.float32)).astype(a.dtype),
                     (a * np.float32(2.5)).astype(a.dtype), a.astype(np.float16)]
    for o, w in zip(outs, want):
        np.testing.assert_allclose(np.array(o).astype(np.float64), w.astype(np.float64),
                                   rtol=2e-3 if dt == "float16" else 1e-6)


def test_a_fused_tape_runs_as_one_metal_kernel(metal):
    def f(x, y):
        return mx.exp(-x) * mx.sin(y) + 2 * x * y - mx.tanh(x)

    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 33)).astype(np.float32)
    b = rng.standard_normal((64, 33)).astype(np.float32)
    cf = mx.compile(f)
    with mx.stream(mx.gpu):
        out = cf(mx.array(a), mx.array(b).T.T)
        strided = cf(mx.array(a.T.copy()).T, mx.array(b))  # a transposed input: strided kernel
        mx.eval(out, strided)
    want = np.exp(-a) * np.sin(b) + 2 * a * b - np.tanh(a)
    np.testing.assert_allclose(np.array(out), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(strided), want, rtol=1e-5, atol=1e-6)


def test_a_primitive_without_a_metal_kernel_falls_back_visibly(metal):
    x = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
    timeline.set_recording(True)
    try:
        with mx.stream(mx.gpu):
            y = mx.sort(mx.exp(mx.array(x)), axis=1)  # Exp: Metal; Sort: the CPU rule
            mx.eval(y)
        recs = [r for r in timeline.records() if r.kind == "fallback"]
    finally:
        timeline.set_recording(False)
    np.testing.assert_allclose(np.array(y), np.sort(np.exp(x), axis=1), rtol=1e-6)
    assert any(r.detail["primitive"] == "Sort" for r in recs)
    assert not any(r.detail["primitive"] == "Exp" for r in recs)


def test_events_order_two_gpu_streams(metal):
    s1, s2 = mx.new_stream(mx.gpu), mx.new_stream(mx.gpu)
    a = mx.array(np.arange(100, dtype=np.float32))
    b = mx.multiply(a, 3.0, stream=s1)
    c = mx.add(b, 1.0, stream=s2)
    mx.eval(c)
    np.testing.assert_array_equal(np.array(c), np.arange(100) * 3.0 + 1.0)


def test_wired_limit_follows_mlx(metal):
    ws = mx.device_info(mx.gpu)["max_recommended_working_set_size"]
    with pytest.raises(ValueError, match=r"^\[metal::set_wired_limit\] Setting a wired limit "
                       "larger than the maximum working set size is not allowed.$"):
        metal.allocator.set_wired_limit(ws + 1)
    old = metal.allocator.set_wired_limit(1 << 20)
    assert metal.allocator.set_wired_limit(old) == 1 << 20


def test_float64_on_the_gpu_is_refused_as_mlx_refuses_it(metal):
    """MLX's array constructor refuses float64 on any GPU (mlx/array.cpp), Metal's too."""
    x = np.linspace(-1, 1, 17)
    with mx.stream(mx.gpu):
        with pytest.raises(ValueError, match="float64 is not supported on the GPU"):
            mx.exp(mx.array(x, dtype=mx.float64))
    y = mx.exp(mx.array(x, dtype=mx.float64), stream=mx.cpu)  # the CPU computes it
    np.testing.assert_allclose(np.array(y), np.exp(x))


def test_reductions_run_as_metal_kernels(metal):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((33, 300)).astype(np.float32)
    x64 = x.astype(np.float64)
    timeline.set_recording(True)
    seq = timeline.next_seq()
    try:
        with mx.stream(mx.gpu):
            a = mx.array(x)
            outs = [mx.sum(a, axis=-1), mx.max(a, axis=0), mx.argmax(a, axis=-1),
                    mx.softmax(a, axis=-1), mx.logsumexp(a.T, axis=-1), mx.cumsum(a, axis=0),
                    mx.sum(a)]
            mx.eval(*outs)
        recs = timeline.records_since(seq)
    finally:
        timeline.set_recording(False)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    t = x64.T
    want = [x64.sum(-1), x64.max(0), x.argmax(-1), e / e.sum(-1, keepdims=True),
            t.max(-1) + np.log(np.exp(t - t.max(-1, keepdims=True)).sum(-1)), np.cumsum(x64, 0),
            x64.sum()]
    for o, w in zip(outs, want):
        np.testing.assert_allclose(np.array(o).astype(np.float64), w, rtol=2e-5, atol=2e-4)
    ran = {r.detail.get("primitive") for r in recs
           if r.kind == "kernel_launch" and r.detail.get("runtime") == "metal"}
    assert {"Sum", "Max", "ArgReduce", "Softmax", "LogSumExp", "CumSum"} <= ran


def test_fast_primitives_run_as_metal_kernels(metal):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 5, 40)).astype(np.float32)
    w, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    x64 = x.astype(np.float64)
    timeline.set_recording(True)
    seq = timeline.next_seq()
    try:
        with mx.stream(mx.gpu):
            a, wa, ba = mx.array(x), mx.array(w), mx.array(b)
            outs = [mx.fast.rms_norm(a, wa, 1e-5), mx.fast.layer_norm(a, wa, ba, 1e-5),
                    mx.fast.rope(a, 16, traditional=False, base=1e4, scale=1.0,
                                 offset=mx.array([0, 1, 2, 3, 4, 5])),
                    mx.grad(lambda v: mx.fast.rms_norm(v, wa, 1e-5).sum())(a)]
            mx.eval(*outs)
        recs = timeline.records_since(seq)
    finally:
        timeline.set_recording(False)
    rms = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w
    xc = x64 - x64.mean(-1, keepdims=True)
    ln = xc / np.sqrt((xc ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(np.array(outs[0]), rms, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.array(outs[1]), ln, rtol=2e-5, atol=2e-5)
    inv = 1e4 ** (-np.arange(8) / 8)
    th = (np.arange(5)[None, :, None] + np.arange(6)[:, None, None]) * inv
    x1, x2 = x64[..., :8], x64[..., 8:16]
    rope = np.concatenate([x1 * np.cos(th) - x2 * np.sin(th), x1 * np.sin(th) + x2 * np.cos(th),
                           x64[..., 16:]], -1)
    np.testing.assert_allclose(np.array(outs[2]), rope, rtol=2e-5, atol=2e-5)
    n = 1 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5)  # d sum(rms_norm) / dx
    gx = w * n - x64 * (w * x64).mean(-1, keepdims=True) * n ** 3
    np.testing.assert_allclose(np.array(outs[3]), gx, rtol=2e-5, atol=2e-5)
    ran = {r.detail.get("primitive") for r in recs
           if r.kind == "kernel_launch" and r.detail.get("runtime") == "metal"}
    assert {"RMSNorm", "LayerNorm", "RoPE", "RMSNormVJP"} <= ran
