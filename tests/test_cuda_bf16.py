"""bfloat16 and float16 on the CUDA runtime: the arrays live on the device (bfloat16 as
uint16 storage, ``kernels/cuda/bfloat16.py``), every op runs there, and the results are the
CPU's bit for bit where MLX's are (elementwise arithmetic, comparisons, casts, data
movement, max / min / argmax), else within bfloat16's rounding (transcendentals, sums,
matmul: float32 accumulation in another order). An eager chain makes no host
synchronisation before its eval.

Runs on a GPU (``TAPESCOPE_CUDA=1``) and, for the plumbing, over the stand-in CuPy
(``tests/test_cuda_backend_fake.py`` runs this file in a process whose ``import cupy`` is
``tests/fake_cupy.py``: no kernels there, so elementwise ops take the float32 way).
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends, timeline

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="the CUDA runtime needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(autouse=True)
def _gpu_default():
    old = mx.default_device()
    mx.set_default_device(mx.gpu)
    try:
        yield
        mx.synchronize()
    finally:
        mx.set_default_device(old)


def _fake() -> bool:
    import cupy

    return getattr(cupy, "__fake__", False)


def _on(device, fn, *host):
    """``fn`` of ``host`` arrays evaluated on ``device``; results as numpy (bfloat16 bits
    as uint16)."""
    old = mx.default_device()
    mx.set_default_device(device)
    try:
        outs = fn(*[mx.array(h) if h.dtype != BF16 else mx.array(h.astype(np.float32)).astype(mx.bfloat16)
                    for h in host])
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        mx.eval(*outs)
        return [np.array(o.view(mx.uint16)) if o.dtype == mx.bfloat16 else np.array(o)
                for o in outs]
    finally:
        mx.set_default_device(old)


def _same(got, want, ulps: int = 0):
    """Equal bits (NaNs: any NaN) or, with ``ulps``, at most that many bfloat16 steps apart."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype != np.uint16:
            np.testing.assert_array_equal(g, w)
            continue
        gf, wf = g.view(BF16).astype(np.float32), w.view(BF16).astype(np.float32)
        nan = np.isnan(wf)
        assert (np.isnan(gf) == nan).all()
        if ulps == 0:
            np.testing.assert_array_equal(g[~nan], w[~nan])
        else:  # ordered bits: the distance in representable steps
            def key(b):
                b = b.astype(np.int32)
                return np.where(b & 0x8000, 0x8000 - b, b)
            assert np.abs(key(g[~nan]) - key(w[~nan])).max(initial=0) <= ulps


def _values(shape, seed=0, specials=True):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    if specials:
        flat = x.reshape(-1)
        flat[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40][: flat.size]
    return x.astype(BF16)


def test_bfloat16_arrays_live_on_the_device():
    from tapescope.kernels.cuda.bfloat16 import BF16Array

    x = mx.array([1.5, -2.25, 3.0]).astype(mx.bfloat16)
    y = mx.array(np.array([1, 2, 3], np.float32).astype(BF16))  # from host bfloat16 data
    z = (x * y + 1)[1:]
    mx.eval(z)
    for a in (x, y, z):
        assert type(a._d.data) is BF16Array and a.dtype == mx.bfloat16
    assert z.tolist() == [-3.5, 10.0]
    with timeline.record() as rec:
        mx.eval(mx.exp(x) + y)
    assert not [r for r in rec.records if r.kind == "fallback" and r.detail.get("runtime") == "cpu"]


def test_bfloat16_kernels_render_16_bit_loads_float_math_and_rounded_stores():
    """A one-op kernel's source: bfloat16 storage in and out, float math, the store rounded
    to nearest even (MLX's fp16_math.cuh operators); a 0-d input read once."""
    from tapescope.kernels.codegen.render import renderer
    from tapescope.kernels.cuda.bfloat16 import elementwise_tape

    tape = elementwise_tape("Add", [BF16, BF16], BF16, [False, True])
    src = renderer("cuda").render(tape, "k", True, 1, False)
    assert "const __nv_bfloat16* __restrict__ A" in src and "__nv_bfloat16* __restrict__ out0" in src
    assert "float tmp_A = __bfloat162float(A[index]);" in src and "__bfloat162float(B[0])" in src
    assert "out0[index] = __float2bfloat16_rn(" in src
    assert elementwise_tape("Add", [BF16, BF16], BF16, [False, True]) is tape  # one per op and types


def test_each_bfloat16_node_takes_its_way_and_the_fallbacks_are_recorded():
    """Data movement never falls back; reductions are kernels reading the bfloat16 storage
    (float32 accumulation, one rounding); matmul is one cuBLAS GEMM on the bfloat16 storage
    (``cuda/gemm.py``; over the stand-in CuPy, which has no cuBLAS, it goes through
    float32, recorded, runtime "cuda (float32)"); elementwise ops are kernels (on the
    stand-in CuPy, with no NVRTC, they are recorded fallbacks); none runs on the host."""
    import cupy

    from tapescope.kernels.cuda import gemm

    x = mx.array(np.arange(12, dtype=np.float32)).astype(mx.bfloat16)
    mx.eval(x)
    with timeline.record() as rec:
        m = mx.reshape(x, (3, 4)).T[1:]
        c = mx.concatenate([m, m], axis=1)
        s = mx.sum(c, axis=1)
        p = c @ mx.ones((6, 2), dtype=mx.bfloat16)
        e = c * 2 + 1
        mx.eval(s, p, e)
    falls = {r.name: r.detail for r in rec.records if r.kind == "fallback"}
    through = set() if gemm.available() else {"Matmul"}
    assert through <= set(falls) and "Sum" not in falls
    assert all(d["runtime"] == "cuda (float32)" for d in falls.values())
    elementwise = {"Multiply", "Add", "Full"}
    assert set(falls) - through <= (elementwise if getattr(cupy, "__fake__", False) else set())
    want = np.arange(12, dtype=np.float32).reshape(3, 4).T[1:]
    np.testing.assert_array_equal(np.array(e.astype(mx.float32)),
                                  np.concatenate([want, want], axis=1) * 2 + 1)
    both = np.concatenate([want, want], axis=1)
    np.testing.assert_array_equal(np.array(p.astype(mx.float32)),  # sums exact in bfloat16
                                  np.repeat(both.sum(axis=1, keepdims=True), 2, axis=1))


def test_bfloat16_files_load_onto_the_device(tmp_path):
    from tapescope.kernels.cuda.bfloat16 import BF16Array

    x = mx.array(np.linspace(-3, 3, 10, dtype=np.float32)).astype(mx.bfloat16)
    mx.save(str(tmp_path / "a.npy"), x)
    mx.save_safetensors(str(tmp_path / "a.safetensors"), {"x": x})
    for y in (mx.load(str(tmp_path / "a.npy")), mx.load(str(tmp_path / "a.safetensors"))["x"]):
        mx.eval(y)
        assert type(y._d.data) is BF16Array
        np.testing.assert_array_equal(np.array(y.view(mx.uint16)), np.array(x.view(mx.uint16)))


def test_widen_and_narrow_are_ml_dtypes_casts():
    """Every bfloat16 bit pattern widened exactly; float32 values (ties, subnormals,
    overflow, NaN) rounded to nearest even as ml_dtypes rounds."""
    import cupy

    from tapescope.kernels.cuda import bfloat16 as b

    bits = np.arange(1 << 16, dtype=np.uint16)
    w = b.widen(b.BF16Array(cupy.asarray(bits)))
    want = bits.view(BF16).astype(np.float32)
    got = cupy.asnumpy(w)
    nan = np.isnan(want)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()
    rng = np.random.default_rng(1)
    u = np.concatenate([rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32),
                        (bits.astype(np.uint32) << 16) | 0x8000,  # exact ties
                        (bits.astype(np.uint32) << 16) | 0x8001,
                        np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x7F800001], np.uint32)])
    f = u.view(np.float32)
    got = b.narrow(cupy.asarray(f)).get()
    want = f.astype(BF16)
    nan = np.isnan(f)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(got[nan].astype(np.float32)).all()


EXACT = {  # one rounding of a correctly rounded float32 result: MLX's bits
    "add": lambda a, b: a + b,
    "chain": lambda a, b: ((a * b - a) / (b + 2)) * 0.5 + 1.0,
    "max_min": lambda a, b: mx.maximum(a, b) - mx.minimum(a, 1.0),
    "unary": lambda a, b: mx.abs(-a) + mx.square(b) + mx.sqrt(mx.abs(a)),
    "compare": lambda a, b: [a > b, mx.where(a < b, a, b), a == b],
    # (to int32 finite values only: CUDA's conversion saturates inf and NaN, as MLX's
    # CUDA backend's does, where the host's gives INT_MIN)
    "casts": lambda a, b: [a.astype(mx.float32), a.astype(mx.float16),
                           mx.where(mx.abs(a) < 1e6, a, 0).astype(mx.int32),
                           (a.astype(mx.float32) * 3).astype(mx.bfloat16)],
    "movement": lambda a, b: [mx.concatenate([a, b], axis=0)[::2].T, mx.reshape(a, (-1,))[3:9],
                              mx.take(b, mx.array([2, 0, 1]), axis=1), mx.pad(a, 1),
                              mx.broadcast_to(a[:1], (3, 5)), mx.full((2, 2), b[0, 0])],
    "reduce_exact": lambda a, b: [mx.max(a, axis=1), mx.min(b, axis=0), mx.argmax(a, axis=1),
                                  mx.sort(b, axis=1)],
    "compiled": mx.compile(lambda a, b: a * b + a),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_bfloat16_programs_on_the_gpu_are_the_cpus_bits(name):
    a, b = _values((3, 5), 0), _values((3, 5), 1)
    _same(_on(mx.gpu, EXACT[name], a, b), _on(mx.cpu, EXACT[name], a, b))


CLOSE = {  # a float function or a float32 sum in another order: within bfloat16's rounding
    "transcendental": (lambda a, b: [mx.exp(a / 8), mx.tanh(b), mx.log(mx.abs(a) + 1),
                                     mx.sin(b)], 1),
    "sum_mean": (lambda a, b: [mx.sum(a, axis=1), mx.mean(b), mx.sum(a * b)], 1),
    "softmax_compiled": (lambda a, b: [mx.softmax(a, axis=-1),
                                       mx.compile(lambda x: mx.exp(-x) * 2 + x)(b)], 1),
}


@pytest.mark.parametrize("name", sorted(CLOSE))
def test_bfloat16_programs_on_the_gpu_are_within_rounding_of_the_cpu(name):
    fn, ulps = CLOSE[name]
    a, b = _values((4, 16), 2, specials=False), _values((4, 16), 3, specials=False)
    _same(_on(mx.gpu, fn, a, b), _on(mx.cpu, fn, a, b), ulps=ulps)


def test_bfloat16_matmul_accumulates_in_float32():
    a, b = _values((16, 64), 4, False), _values((64, 8), 5, False)
    (got,) = _on(mx.gpu, lambda x, y: x @ y, a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.view(BF16).astype(np.float64), ref, rtol=2 ** -7, atol=1e-2)


@pytest.mark.parametrize("op", ["sum_first", "sum_last", "sum_all", "logsumexp", "max"])
def test_bfloat16_reductions_accumulate_in_float32_and_round_once(op):
    """A bfloat16 reduction reads the 16-bit storage and accumulates in float32 (MLX's CUDA
    reduce): within one bfloat16 step of the float64 result rounded to bfloat16 (positive
    terms: no cancellation), including split columns (the first axis) and ``all``."""
    a = (np.abs(_values((4096, 130), 9, False).astype(np.float32)) + 0.5).astype(BF16)
    fns = {"sum_first": (lambda x: mx.sum(x, axis=0), lambda h: h.sum(axis=0)),
           "sum_last": (lambda x: mx.sum(x, axis=-1), lambda h: h.sum(axis=-1)),
           "sum_all": (lambda x: mx.sum(x), lambda h: h.sum()),
           "logsumexp": (lambda x: mx.logsumexp(x / 8, axis=-1),
                         lambda h: np.log(np.exp(h / 8).sum(axis=-1))),
           "max": (lambda x: mx.max(x, axis=-1), lambda h: h.max(axis=-1))}
    fn, ref = fns[op]
    want = np.asarray(ref(a.astype(np.float64))).astype(np.float32).astype(BF16).view(np.uint16)
    ulps = 0 if op == "max" else 1
    # (the logsumexp's x / 8 is a bfloat16 op on both: the reference divides exactly)
    _same(_on(mx.gpu, fn, a), [np.asarray(want)], ulps=ulps)


def _mlp_loss(params, x, y):
    h = mx.maximum(x @ params["w1"] + params["b1"], 0)
    out = h @ params["w2"] + params["b2"]
    return mx.mean(mx.square(out - y))


def test_a_bfloat16_mlp_forward_and_backward_on_the_gpu_is_the_cpus_within_rounding():
    rng = np.random.default_rng(7)
    host = {"w1": rng.standard_normal((8, 16)) * 0.3, "b1": rng.standard_normal(16) * 0.1,
            "w2": rng.standard_normal((16, 4)) * 0.3, "b2": rng.standard_normal(4) * 0.1}
    x_np, y_np = rng.standard_normal((32, 8)), rng.standard_normal((32, 4))

    def run(device):
        old = mx.default_device()
        mx.set_default_device(device)
        try:
            def bf(v):
                return mx.array(np.asarray(v, np.float32)).astype(mx.bfloat16)
            params = {k: bf(v) for k, v in host.items()}
            loss, grads = mx.value_and_grad(_mlp_loss)(params, bf(x_np), bf(y_np))
            mx.eval(loss, grads)
            assert all(g.dtype == mx.bfloat16 for g in grads.values())
            return loss.astype(mx.float32).item(), {k: np.array(g.astype(mx.float32))
                                                     for k, g in grads.items()}
        finally:
            mx.set_default_device(old)

    (lg, gg), (lc, gc) = run(mx.gpu), run(mx.cpu)
    assert abs(lg - lc) <= 2 ** -6 * abs(lc)
    for k in gg:
        np.testing.assert_allclose(gg[k], gc[k], rtol=2 ** -5, atol=2e-2 * np.abs(gc[k]).max())


def test_an_mlx_nn_mlp_trains_in_bfloat16_on_the_gpu():
    from conftest import mlx_ref

    if mlx_ref is None:  # as test_as_mlx: as_mlx() re-imports MLX's own mlx.nn over its core
        pytest.skip("mlx is not installed (its core library): as_mlx() runs MLX's own mlx.nn")
    import tapescope
    tapescope.as_mlx()
    try:
        import mlx.core as mxm
        import mlx.nn as nn
        import mlx.optimizers as optim

        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        model.set_dtype(mxm.bfloat16)
        opt = optim.Adam(learning_rate=1e-2)
        rng = np.random.default_rng(0)
        x = mxm.array(rng.standard_normal((64, 8)).astype(np.float32)).astype(mxm.bfloat16)
        y = mxm.array(rng.standard_normal((64, 4)).astype(np.float32)).astype(mxm.bfloat16)

        def loss_fn(m):
            return nn.losses.mse_loss(m(x), y)

        step = nn.value_and_grad(model, loss_fn)
        losses = []
        for _ in range(20):
            loss, g = step(model)
            opt.update(model, g)
            mxm.eval(model.parameters(), opt.state)
            losses.append(loss.item())
        assert losses[-1] < losses[0]
        assert model.layers[0].weight.dtype == mxm.bfloat16
    finally:
        tapescope.as_mlx(False)


def test_float16_programs_on_the_gpu_are_the_cpus():
    rng = np.random.default_rng(9)
    a, b = (rng.standard_normal((3, 7)).astype(np.float16) for _ in range(2))
    exact = lambda x, y: [x + y, (x * y - x) / (y + 2), mx.maximum(x, y), x.astype(mx.float32)]  # noqa: E731
    for g, w in zip(_on(mx.gpu, exact, a, b), _on(mx.cpu, exact, a, b)):
        np.testing.assert_array_equal(g, w)
    close = lambda x, y: [mx.exp(x), mx.sum(x * y, axis=1), x @ y.T]  # noqa: E731
    for g, w in zip(_on(mx.gpu, close, a, b), _on(mx.cpu, close, a, b)):
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=4e-3, atol=4e-3)


def _counting_syncs(monkeypatch):
    """A count of every host block on a stream or the device (the runtime's own counter,
    and CuPy's stream / device synchronize)."""
    import cupy

    from tapescope.kernels.cuda import device

    seen = [0]
    for owner, name in ((cupy.cuda.Stream, "synchronize"), (cupy.cuda.runtime, "deviceSynchronize")):
        real = getattr(owner, name)

        def counted(*a, _real=real, **k):
            seen[0] += 1
            return _real(*a, **k)
        try:
            monkeypatch.setattr(owner, name, counted)
        except (TypeError, AttributeError):  # an extension type: the runtime's count only
            pass
    return lambda: seen[0] + device.host_syncs()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_eager_chain_makes_no_host_synchronisation_before_its_eval(monkeypatch, dtype):
    """``v * 1.0001 + 0.5`` twenty-five times: every op makes a host constant, copied to the
    device without a host wait; the only wait is the eval's, on its event."""
    dt = getattr(mx, dtype)
    v = mx.array(np.linspace(-1, 1, 1 << 12, dtype=np.float32)).astype(dt)
    mx.eval(v)
    syncs = _counting_syncs(monkeypatch)
    before = syncs()
    w = v
    for _ in range(25):
        w = w * 1.0001 + 0.5
    assert syncs() == before  # building the chain: no host synchronisation
    mx.eval(w)
    assert syncs() == before  # the eval waits on its event, not on the stream
    ref = np.linspace(-1, 1, 1 << 12, dtype=np.float32).astype(dt == mx.bfloat16 and BF16 or np.float32)
    with mx.stream(mx.cpu):
        c = mx.array(np.asarray(ref, np.float32)).astype(dt)
        for _ in range(25):
            c = c * 1.0001 + 0.5
        mx.eval(c)
    np.testing.assert_array_equal(np.array(w.astype(mx.float32)), np.array(c.astype(mx.float32)))


def test_host_data_read_at_once_and_from_another_stream_is_the_copied_data():
    """No host wait after the copy: the host's read and another stream's kernel are ordered
    after it by events."""
    n = 1 << 22
    src = np.arange(n, dtype=np.float32)
    x = mx.array(src)
    np.testing.assert_array_equal(np.array(x), src)
    s = mx.new_stream(mx.gpu)
    y = mx.array(src * 2)
    z = mx.add(y, 1, stream=s)
    np.testing.assert_array_equal(np.array(z), src * 2 + 1)
    b = mx.array(src[:1024].astype(BF16))
    np.testing.assert_array_equal(np.array(b.astype(mx.float32)), src[:1024].astype(BF16).astype(np.float32))
