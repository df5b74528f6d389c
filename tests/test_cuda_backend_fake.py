"""The CUDA backend's plumbing (registration, streams, device context, moving inputs between
host and device, events, the allocator, host reads) run over ``tests/fake_cupy.py``: the GPU
tests of ``test_cuda_runtime.py`` that do not need real asynchronous kernels, in a fresh
process whose ``import cupy`` is the stand-in. On a GPU machine the real ones run instead."""

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import sweep

HERE = Path(__file__).parent


def test_cuda_backend_runs_the_gpu_tests_over_a_stand_in_cupy():
    code = (
        "import sys; sys.path.insert(0, %r); import fake_cupy; fake_cupy.install();"
        "import pytest; sys.exit(pytest.main(['-p', 'no:cacheprovider', '-q', '-o', 'addopts=',"
        " %r, %r, %r, %r, %r, %r, %r, '-k', 'not freed_while and not without_a_copy and not fresh_process and not torch_copies and not come_from_the_buffer_cache']))" % (
            str(HERE), str(HERE / "test_cuda_runtime.py"), str(HERE / "test_cuda_bf16.py"),
            str(HERE / "test_cuda_float64.py"), str(HERE / "test_cuda_subnormals.py"),
            str(HERE / "test_cuda_interop.py"), str(HERE / "test_cuda_donation.py"),
            str(HERE / "test_cuda_eager.py")))
    env = dict(os.environ, TAPESCOPE_CUDA="1")
    env.pop("TAPESCOPE_DISABLE_GPU", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, cwd=HERE.parent)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    # nothing skipped for want of a GPU; only the test that needs MLX itself where it is absent
    from conftest import mlx_ref

    allowed = 0 if mlx_ref is not None else 1
    last = r.stdout.splitlines()[-1]
    skipped = int(re.search(r"(\d+) skipped", last).group(1)) if "skipped" in last else 0
    assert " passed" in r.stdout and skipped == allowed, r.stdout[-2000:]


def test_a_buffer_freed_by_a_finalizer_while_the_stream_record_is_locked_does_not_deadlock():
    """A garbage collection may run at a function entry inside ``device.enter_work`` (Python
    3.12): its finalizers free buffers, and a free notes finished streams under the same
    lock. Before the lock was re-entrant this hung (seen on the H200 as an xdist worker
    killed in the middle of ``test_indexing``)."""
    code = (
        "import sys; sys.path.insert(0, %r); import fake_cupy; fake_cupy.install();"
        "from tapescope.kernels.cuda import device;"
        "w = device.work(0); ev = object(); device._marks[0] = (w[0], ev);"
        "device._work_lock.acquire(); device.note_finished(0, ev); device._work_lock.release();"
        "print('no deadlock')" % str(HERE))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=HERE.parent)
    assert r.returncode == 0 and "no deadlock" in r.stdout, r.stdout + r.stderr


def test_frees_while_a_stream_runs_are_held_and_come_back_in_batches_ordered_by_one_event():
    """A buffer freed while a GPU stream may still read it is held (counted active, not in
    the cache, not handed out again) until the batch's covering event has completed: one
    event per batch of frees, not one per free (MLX keeps an eval's temporaries until its
    command buffer completes). Over the stand-in CuPy with events that complete late
    (fake_cupy.LAG), in a fresh process."""
    code = (
        "import sys; sys.path.insert(0, %r); import fake_cupy; fake_cupy.install();"
        "import tapescope.core as mx; from tapescope.kernels.backends import backend;"
        "from tapescope.kernels.cuda import device; from tapescope.kernels import allocator as A;"
        "mx.set_default_device(mx.gpu); a = backend(mx.gpu).allocator; s = mx.default_stream(mx.gpu);"
        "device.cuda_stream(s.index);"
        "records = [0]; rec = fake_cupy.Event.record;"
        "fake_cupy.Event.record = lambda self, st=None: (records.__setitem__(0, records[0] + 1), rec(self, st))[1];"
        "w = device.work(s.index); device.enter_work(w); device.leave_work(w);"  # work enqueued
        "fake_cupy.LAG[0] = 100;"
        "bufs = [a.malloc(4096) for _ in range(A.HELD_BATCH + 1)]; ids = [b.id for b in bufs];"
        "active = a.active; r0 = records[0];"
        "[a.free(b) for b in bufs]; del bufs;"
        "assert a.active == active, (a.active, active);"  # held: still active
        "assert records[0] - r0 == 1, records[0] - r0;"  # one event for the sealed batch
        "held = {b.id for b in a.held_buffers()}; assert held == set(ids), held;"
        "fresh = a.malloc(4096); assert fresh.id not in ids, 'handed out while the kernels run';"
        "assert records[0] - r0 == 1, records[0] - r0;"  # the miss sealed the rest: no new work
        "[e.synchronize() for evs, _ in a._pending for e in evs];"  # the kernels end
        "a.settle(); assert not a.held_buffers(), a.held_buffers();"
        "n = a.round_size(4096); assert a.active == active - A.HELD_BATCH * n, (a.active, active);"
        "again = a.malloc(4096); assert again.id in ids, 'the batch is in the cache again';"
        "print('ok')" % str(HERE))
    env = dict(os.environ, TAPESCOPE_CUDA="1")
    env.pop("TAPESCOPE_DISABLE_GPU", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, cwd=HERE.parent)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


_SEAL_TRACE = r"""
import sys, random; sys.path.insert(0, %r); import fake_cupy; fake_cupy.install()
import tapescope.core as mx
from tapescope.kernels.backends import backend
from tapescope.kernels.cuda import device
mx.set_default_device(mx.gpu); a = backend(mx.gpu).allocator
if %r:
    a._event_source = None  # the Python _seal_events (memory._unfinished_events)
for i in (0, 1):
    device.cuda_stream(i)
made = [0]; rec = fake_cupy.Event.record
def counted(self, st=None):
    made[0] += 1
    return rec(self, st)
fake_cupy.Event.record = counted
rng = random.Random(%d); fake_cupy.LAG[0] = 2
live, trace = [], []
for step in range(400):
    r = rng.random()
    if r < 0.3:
        buf = a.malloc(rng.choice([8, 100, 4096, 5000, 40000]))
        busy = [b for _, bufs in a._pending for b in bufs] + list(a._held)
        assert all(buf is not b for b in busy), "a buffer handed out while its readers may run"
        live.append(buf)
    elif r < 0.6 and live:
        a.free(live.pop(rng.randrange(len(live))))
    elif r < 0.75:  # a node enqueues work on stream 0 or 1
        w = device.work(rng.randrange(2)); device.enter_work(w); device.leave_work(w)
    elif r < 0.8:
        device.synchronize(rng.randrange(2))
    elif r < 0.85:
        a.settle()
    trace.append((a.active, a.peak, a.get_cache_memory(), len(a._held), a._held_batches,
                  [len(evs) for evs, _ in a._pending], sorted(device.unfinished()), made[0],
                  sorted((k, m[0]) for k, m in device._marks.items())))
print(repr(trace))
"""


def test_the_seals_events_made_in_c_are_the_python_ones_and_reuse_waits_for_them():
    """Over the stand-in CuPy with events that complete late and two streams at work: the
    allocator's seals with their covering events made in C (kernels/_handle.c
    seal_events_c over device.event_source()) and with the Python ``_unfinished_events``
    leave the same counters, held buffers, batches, unfinished streams, events made and
    marks, step by step; no malloc hands out a buffer of a batch whose events have not
    completed (or one still held)."""
    env = dict(os.environ, TAPESCOPE_CUDA="1")
    env.pop("TAPESCOPE_DISABLE_GPU", None)
    for seed in sweep((1, 2, 3), (1,)):  # (each trace two processes: make test runs one)
        out = []
        for python in (False, True):
            r = subprocess.run([sys.executable, "-c", _SEAL_TRACE % (str(HERE), python, seed)],
                               env=env, capture_output=True, text=True, timeout=120,
                               cwd=HERE.parent)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
            out.append(r.stdout.strip().splitlines()[-1])
        assert out[0] == out[1]
        assert "[1]" in out[0] or "[1, 1]" in out[0]  # some batches waited for their events
