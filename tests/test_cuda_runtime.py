"""The CUDA runtime (kernels/cuda) on a real GPU: ops, memory, streams and events.

Runs only where CuPy reaches a GPU and the runtime is switched on (``TAPESCOPE_CUDA=1``, as
on the H200 machine: ``TAPESCOPE_CUDA=1 python -m pytest tests/test_cuda_runtime.py``);
elsewhere every test here skips with the reason. References: numpy on the host, and the
same program on tapescope's CPU.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends, timeline

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="the CUDA runtime needs CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")


@pytest.fixture(autouse=True)
def _gpu_default():
    assert mx.cuda.is_available()
    old = mx.default_device()
    mx.set_default_device(mx.gpu)  # the runtime's default (another test may have moved it)
    try:
        yield
        mx.synchronize()
    finally:
        mx.set_default_device(old)


def test_the_gpu_is_the_default_device_in_a_fresh_process():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import tapescope.core as mx; print(mx.default_device())"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "Device(gpu, 0)"


def _gpu():
    return backends.backend("gpu")


def test_device_info_is_the_gpus():
    import cupy

    info = mx.device_info(mx.gpu)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    assert info["memory_size"] == cupy.cuda.runtime.memGetInfo()[1]
    assert info["compute_capability_major"] == props["major"]
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    assert info["device_name"] == name
    assert mx.get_memory_limit() == int(0.95 * info["memory_size"])


OPS = {
    "add": lambda a, b: a + b,
    "exp_mul": lambda a, b: mx.exp(a) * b,
    "sum_axis": lambda a, b: mx.sum(a * b, axis=1),
    "max": lambda a, b: mx.max(a - b, axis=0),
    "matmul": lambda a, b: a @ b.T,
    "cumsum": lambda a, b: mx.cumsum(a, axis=1),
    "cummax": lambda a, b: mx.cummax(a, axis=1),
    "sort": lambda a, b: mx.sort(a, axis=-1),
    "argmax": lambda a, b: mx.argmax(b, axis=1),
    "take": lambda a, b: mx.take(a, mx.array([2, 0, 1]), axis=0),
    "slice_update": lambda a, b: a.at[1:3].add(b[1:3]),
    "transpose_reshape": lambda a, b: mx.reshape(mx.transpose(a), (-1,)) * 2,
    "where": lambda a, b: mx.where(a > b, a, b),
    "softmax": lambda a, b: mx.softmax(a, axis=-1),
    "fft": lambda a, b: mx.abs(mx.fft.rfft(a, axis=-1)),
    "compiled": mx.compile(lambda a, b: mx.tanh(a) * b + 1),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_on_the_gpu_match_the_cpu(name):
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((4, 6)).astype(np.float32)
    b_np = rng.standard_normal((4, 6)).astype(np.float32)
    fn = OPS[name]
    with mx.stream(mx.cpu):
        want = np.array(fn(mx.array(a_np), mx.array(b_np)))
    got_arr = fn(mx.array(a_np), mx.array(b_np))
    mx.eval(got_arr)
    import cupy

    assert isinstance(got_arr._d.data, cupy.ndarray), "computed on the host"
    np.testing.assert_allclose(np.array(got_arr), want, rtol=2e-5, atol=2e-5)


def test_active_memory_is_the_gpus_bytes_exactly():
    mx.synchronize()
    gc.collect()
    alloc = _gpu().allocator
    before = mx.get_active_memory()
    n = (1 << 22) + 12  # 16 MiB + 48 bytes: not a whole page
    x = mx.zeros((n,), dtype=mx.float32) + 1
    mx.eval(x)
    mx.synchronize()  # intermediates freed during the eval are reusable once their kernels end
    assert alloc.pending_bytes() == 0
    held = x._d.buffer.buffer.size  # an allocator buffer (rounded) or an adopted CuPy result
    assert held in (4 * n, alloc.round_size(4 * n))
    assert mx.get_active_memory() - before == held
    import cupy

    assert isinstance(x._d.data, cupy.ndarray)
    del x
    mx.synchronize()
    assert mx.get_active_memory() == before


def test_a_buffer_freed_while_a_kernel_reads_it_is_not_reused_before_the_kernel_ends():
    alloc = _gpu().allocator
    s = mx.new_stream(mx.gpu)
    a = mx.random.normal((8192, 8192), stream=s)
    mx.eval(a)
    buf = a._d.buffer.buffer
    if buf.size == 0:  # memory CuPy made in the rule, lent from the cache: the lease's buffer
        buf = alloc._lent[a._d.data.data.mem.ptr]
    y = mx.sum(a @ a @ a, stream=s)  # tens of milliseconds of kernels reading a
    mx.async_eval(y)
    del a
    gc.collect()
    deadline = time.monotonic() + 5  # the worker frees a once it has launched the matmul
    while buf.id not in {b.id for b in alloc.held_buffers()} and time.monotonic() < deadline:
        time.sleep(0.0005)
    assert buf.id in {b.id for b in alloc.held_buffers()}, "freed while a kernel reads it"
    alloc.settle()  # sealed in a batch: its event not complete while the kernels run
    assert buf.id in {b.id for b in alloc.held_buffers()}
    fresh = alloc.malloc(buf.size)
    try:
        assert fresh.id != buf.id  # not handed out while the kernels run
    finally:
        alloc.free(fresh)
    mx.eval(y)
    mx.synchronize(s)
    alloc.settle()
    assert buf.id not in {b.id for b in alloc.held_buffers()}


def test_cpu_gpu_cpu_pipeline_across_streams_is_exact_with_device_side_waits():
    cpu, g1, g2 = mx.new_stream(mx.cpu), mx.new_stream(mx.gpu), mx.new_stream(mx.gpu)
    x_np = np.arange(1 << 16, dtype=np.int32)
    with timeline.record() as rec:
        x = mx.add(mx.array(x_np), 1, stream=cpu)
        y = mx.multiply(x, 3, stream=g1)
        z = mx.subtract(y, x, stream=g2)  # g2 waits for g1 on the device
        w = mx.add(z, 7, stream=cpu)
        mx.eval(w)
    np.testing.assert_array_equal(np.array(w), (x_np + 1) * 3 - (x_np + 1) + 7)
    waits = [r for r in rec.records if r.kind == "event_wait" and r.detail.get("device_wait")]
    assert waits, "no device-side wait between the GPU streams"
    work = {r.name for r in rec.records if r.kind == "gpu_work"}  # device time of the GPU nodes
    assert {"Multiply", "Subtract"} <= work, work


def test_a_cpu_stream_reads_a_gpu_broadcast_in_place():
    """A broadcast GPU view read by a CPU stream is not materialised on its way to the host:
    (1 << 24) x (1 << 24) float32 would be a PiB; the CPU sees the one element as MLX's
    CPU does, and its own malloc for the full result fails with MLX's error."""
    cpu = mx.new_stream(mx.cpu)
    col = mx.array(np.arange(3, dtype=np.float32).reshape(3, 1))
    wide = mx.broadcast_to(col, (3, 1 << 20))  # a GPU view: stride 0 along axis 1
    got = mx.sum(wide, axis=1, stream=cpu)
    np.testing.assert_array_equal(np.array(got), np.arange(3, dtype=np.float32) * (1 << 20))
    host = backends.host_array(wide._d.data)
    assert host.strides[1] == 0 and not host.flags.writeable
    huge = mx.add(mx.broadcast_to(mx.array(1.0), (1 << 24, 1 << 24)), 1.0, stream=cpu)
    with pytest.raises(RuntimeError, match=r"\[malloc\] Unable to allocate"):
        mx.eval(huge)


def test_a_view_made_from_a_memory_pointer_keeps_its_inputs_buffer():
    """CuPy's as_strided result has no ``base``: it must still hold its input's buffer, not
    adopt the same memory a second time, which cached it while the input used it and gave
    a later array the same memory (wrong values on the H200 under xdist)."""
    alloc = _gpu().allocator
    x = np.arange(12, dtype=np.float32)
    base = mx.array(x)
    mx.eval(base)
    before = alloc.active
    v = mx.as_strided(base, (3, 3), (1, 2), 1)
    mx.eval(v)
    assert alloc.active == before
    assert v._d.buffer is base._d.buffer
    del base
    gc.collect()
    others = [mx.array(np.full(12, -1.0, np.float32)) for _ in range(4)]  # reuse candidates
    mx.eval(others)
    np.testing.assert_array_equal(np.array(v), np.lib.stride_tricks.as_strided(x[1:], (3, 3), (4, 8)))


def test_async_eval_on_a_gpu_stream_enqueues_on_the_calling_thread():
    """MLX's eval_impl encodes GPU work on the calling thread: after async_eval the kernels
    are enqueued (the arrays hold their device buffers) with no hand-over to the stream's
    worker thread; eval then waits for the device."""
    from tapescope.kernels.stream_workers import existing_worker

    s = mx.new_stream(mx.gpu)
    x_np = np.linspace(-3, 3, 1 << 20, dtype=np.float32)
    y = mx.exp(mx.multiply(mx.sin(mx.array(x_np), stream=s), 2, stream=s), stream=s)
    mx.async_eval(y)
    assert y._d.node is None  # enqueued: the data is set, its event says when it is ready
    assert existing_worker(s.index) is None
    mx.eval(y)
    np.testing.assert_allclose(np.array(y), np.exp(np.sin(x_np) * 2), rtol=2e-6)


def test_bfloat16_on_a_gpu_stream_stays_on_the_device():
    """bfloat16 arrays live on the device (uint16 storage, ``kernels/cuda/bfloat16.py``):
    no node of the program runs on the host, elementwise results are the CPU stream's bit
    for bit, the reductions and matmul (float32 accumulation) within rounding."""
    from tapescope.kernels.cuda.bfloat16 import BF16Array

    rng = np.random.default_rng(3)
    x_np = rng.standard_normal((4, 8)).astype(np.float32)
    w_np = rng.standard_normal((8, 3)).astype(np.float32)
    f = mx.compile(lambda a: a * 2 + a)

    def program(stream):
        x = mx.array(x_np)  # float32: on the GPU for the GPU stream
        xb = mx.astype(mx.multiply(x, 3, stream=stream), mx.bfloat16, stream=stream)
        with mx.stream(stream):
            e = xb * xb + 1
            z = f(xb)
            y = mx.sum(e, axis=1)
            m = mx.matmul(xb, mx.array(w_np).astype(mx.bfloat16))
            back = mx.astype(m, mx.float32) + 1
        return [e, z, y, m, back]

    with timeline.record() as rec:
        got = program(mx.default_stream(mx.gpu))
        mx.eval(got)
    want = program(mx.default_stream(mx.cpu))
    mx.eval(want)
    assert all(type(g._d.data) is BF16Array for g in got[:4])
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype
        gf, wf = np.array(g.astype(mx.float32)), np.array(w.astype(mx.float32))
        if i < 2:
            np.testing.assert_array_equal(gf, wf)
        else:
            np.testing.assert_allclose(gf, wf, rtol=2 ** -7, atol=1e-2)
    assert not [r for r in rec.records if r.kind == "fallback" and r.detail.get("runtime") == "cpu"]


def test_an_interrupted_async_eval_on_a_gpu_stream_raises_and_leaves_the_rest_lazy(monkeypatch):
    """Enqueued on the calling thread, an async eval is interruptible as a synchronous one:
    the nodes after the interrupt stay lazy, the caller gets MLX's KeyboardInterrupt, and
    a later eval resumes."""
    import tapescope
    from tapescope.core import eval_loop

    real = eval_loop.run_node

    def run_then_interrupt(node):
        real(node)
        if node.primitive.name == "Add":
            tapescope.interrupt_eval()

    s = mx.new_stream(mx.gpu)
    x = mx.array(np.arange(8, dtype=np.float32))
    a = mx.add(x, 1, stream=s)
    c = mx.subtract(mx.multiply(a, 2, stream=s), 3, stream=s)
    monkeypatch.setattr(eval_loop, "run_node", run_then_interrupt)
    with pytest.raises(KeyboardInterrupt, match=r"\[eval\] Evaluation interrupted"):
        mx.async_eval(c)
    monkeypatch.setattr(eval_loop, "run_node", real)
    assert a._d.node is None and c._d.node is not None and c._d.node.event is None
    np.testing.assert_array_equal(np.array(c), (np.arange(8, dtype=np.float32) + 1) * 2 - 3)


def test_an_array_made_from_host_data_lives_in_gpu_memory():
    import cupy

    mx.synchronize()
    mx.clear_cache()  # a cached buffer up to MLX's slack larger could be reused otherwise
    alloc = _gpu().allocator
    before = alloc.active
    x = mx.array(np.arange(1 << 20, dtype=np.float32))
    assert isinstance(x._d.data, cupy.ndarray)
    assert alloc.active - before == alloc.round_size(4 << 20)
    np.testing.assert_array_equal(np.array(x), np.arange(1 << 20, dtype=np.float32))


def test_numpy_conversion_copies_to_the_host():
    x = mx.arange(10) * 2
    h = np.array(x)
    assert type(h) is np.ndarray
    np.testing.assert_array_equal(h, np.arange(10) * 2)
    assert x.tolist() == list(range(0, 20, 2)) and (x[3]).item() == 6


def test_cupy_and_jax_read_gpu_arrays_without_a_copy_and_keep_the_buffer():
    import cupy

    x = mx.arange(1 << 16, dtype=mx.float32) * 2
    mx.eval(x)
    ptr = x._d.data.data.ptr
    c = cupy.asarray(x)  # __cuda_array_interface__
    assert c.data.ptr == ptr
    d = cupy.from_dlpack(x)  # DLPack
    assert d.data.ptr == ptr and x.__dlpack_device__()[0] == 2
    del x
    gc.collect()
    junk = mx.ones((1 << 16,), dtype=mx.float32) * 5  # would reuse the buffer if it were free
    mx.eval(junk)
    np.testing.assert_array_equal(cupy.asnumpy(d), np.arange(1 << 16, dtype=np.float32) * 2)
    try:
        import jax
        import jax.numpy as jnp

        if any(dv.platform == "gpu" for dv in jax.devices()):
            y = mx.arange(10, dtype=mx.float32)
            j = jnp.from_dlpack(y)
            np.testing.assert_array_equal(np.asarray(j), np.arange(10, dtype=np.float32))
            back = mx.array(cupy.asarray(j))
            np.testing.assert_array_equal(np.array(back), np.arange(10, dtype=np.float32))
    except ImportError:
        pass
    z = mx.array(cupy.arange(5, dtype=cupy.int32))
    assert z.dtype == mx.int32 and z.tolist() == [0, 1, 2, 3, 4]


def test_eval_of_one_array_returns_once_the_gpu_has_computed_it():
    """MLX's eval blocks until the data is there: the eager one-node path too (it once
    returned after the launch, and a host copy on another CUDA stream read stale memory)."""

    x = mx.array(np.ones(1 << 26, np.float32))
    mx.eval(x)
    for _ in range(3):
        y = mx.exp(x) * 2  # two lazy nodes: the general path
        mx.eval(y)
        assert y._d.data is not None
        z = mx.sin(y)  # one node over available inputs: the eager path
        mx.eval(z)
        # read at once on another CUDA stream: stale memory unless the kernel had finished
        got = np.array(z)
        assert np.all(got == np.float32(np.sin(np.float32(np.exp(np.float32(1)) * 2)))) or \
            np.allclose(got, np.sin(np.exp(1.0) * 2), rtol=1e-6), np.unique(got)[:5]


def test_cupy_allocations_inside_rules_come_from_the_buffer_cache():
    """A matmul's result and a transposed operand's copy are CuPy's allocations inside the
    rule: lent from the cache and given back, so a loop of them makes no new device memory
    (before, each was a cudaMalloc, each temporary's free a cudaFree, and the results filled
    the cache: 20 iterations grew it by 20 results)."""
    from tapescope.kernels.backends import backend

    alloc = backend("gpu").allocator
    if alloc.lending is None:
        pytest.skip("this CuPy has no allocator hook (the tests' stand-in): nothing is lent")
    rng = np.random.default_rng(0)
    a = mx.array(rng.standard_normal((256, 256)).astype(np.float32))
    b = mx.array(rng.standard_normal((256, 256)).astype(np.float32))
    mx.eval(a, b)
    want = np.array(a) @ np.array(b).T
    for _ in range(3):  # warm: the cache holds what one iteration needs
        mx.eval(a @ b.T + 1)
    mx.synchronize()
    raw = []
    orig = alloc._raw_alloc
    alloc._raw_alloc = lambda size: raw.append(size) or orig(size)
    try:
        gc.collect()
        active, cache = mx.get_active_memory(), mx.get_cache_memory()
        for _ in range(20):
            c = a @ b.T  # the matmul rule (CuPy's output) on a transposed view
            mx.eval(c)
            np.testing.assert_allclose(np.array(c), want, rtol=1e-4, atol=1e-3)
            del c
        mx.synchronize()
        gc.collect()
    finally:
        del alloc._raw_alloc
    assert raw == []
    assert mx.get_active_memory() == active
    assert mx.get_cache_memory() <= cache + 2 * want.astype(np.float32).nbytes
