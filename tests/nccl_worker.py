"""Run by tests/test_distributed_nccl.py, one process per GPU (``TAPESCOPE_CUDA=1``), under
``mpirun -np 2`` (``full``: everything) or started with MLX's ``MLX_RANK`` /
``MLX_WORLD_SIZE`` / ``NCCL_HOST_IP`` / ``NCCL_PORT`` (``tcp``: the unique id over TCP, a
sum and a split). With ``TAPESCOPE_FAKE_NCCL=1`` (CI) ``cupy`` and its NCCL are the
stand-ins of tests/fake_cupy.py and tests/fake_nccl.py on CPU processes. Each rank checks tapescope's ``mx.distributed`` over NCCL against numpy
(every rank rebuilds every rank's input) and prints ``OK <rank>`` when all checks pass."""

from __future__ import annotations

import os
import sys

import numpy as np

FAKE = os.environ.get("TAPESCOPE_FAKE_NCCL") == "1"  # CPU processes: tests/fake_nccl.py
if FAKE:
    import fake_nccl

    fake_nccl.install()

import mpi_worker  # noqa: E402
from mpi_worker import data, raises, same  # noqa: E402

import tapescope.core as mx  # noqa: E402
from tapescope.kernels import timeline  # noqa: E402

D = mx.distributed
# MLX's NCCL types (mlx/distributed/nccl/nccl.cpp: MLX_NCCL_TYPE_LIST), float64 apart: no
# float64 array lives on a GPU stream (mlx/array.cpp: "float64 is not supported on the GPU")
NCCL_DTYPES = ("float32", "float16", "bfloat16", "int32", "int8", "uint8",
               "uint32", "int64", "uint64")
UNSUPPORTED = ("bool", "int16", "uint16", "complex64")


def mx_dtype(dt: str):
    return getattr(mx, dt + "_" if dt == "bool" else dt)


def check_world(g, n: int, r: int) -> None:
    import cupy

    assert getattr(g._comm, "nccl", False), "init() on the CUDA runtime picks NCCL"
    assert D.init(backend="nccl") is g and D.init() is g
    assert D.is_available("nccl") and D.is_available()
    assert mx.default_device() == mx.gpu
    want_dev = r % cupy.cuda.runtime.getDeviceCount()  # one GPU per rank (ranks are local)
    assert g._comm.device_id == want_dev, (g._comm.device_id, want_dev)
    y = D.all_sum(mx.ones((4,)))
    mx.eval(y)
    if not FAKE:
        assert cupy.asarray(y).device.id == want_dev, "the result lives on this rank's GPU"


def check_collectives(g, n: int, r: int) -> None:
    for dt in NCCL_DTYPES:
        parts = np.stack([data(k, (3, 4), dt) for k in range(n)])
        x = mx.array(parts[r], dtype=mx_dtype(dt))
        y = D.all_sum(x)
        assert y._d.node.primitive.name == "AllReduce", "all_sum is a lazy primitive"
        assert y._d.node.primitive.stream.device == mx.gpu, "NCCL runs on a GPU stream"
        total = parts[0].copy()
        for p in parts[1:]:
            total = (total + p).astype(total.dtype)
        same(y, total, f"all_sum {dt}")
        same(D.all_max(x), parts.max(axis=0), f"all_max {dt}")
        same(D.all_min(x), parts.min(axis=0), f"all_min {dt}")
        same(D.all_gather(x), np.concatenate(list(parts)), f"all_gather {dt}")
        big = np.stack([data(k, (2 * n, 3), dt) for k in range(n)])
        s = big[0].copy()
        for p in big[1:]:
            s = (s + p).astype(s.dtype)
        same(D.sum_scatter(mx.array(big[r], dtype=mx_dtype(dt))), s[2 * r:2 * r + 2],
             f"sum_scatter {dt}")
    # a strided input (a transpose) and a result used by later GPU work on the same stream
    a = mx.array(data(r, (4, 3), "float32")).T
    want = sum(data(k, (4, 3), "float32") for k in range(n)).T
    same(D.all_sum(a) * 2.0, (2.0 * want).astype(np.float32), "all_sum of a transpose, then *2")
    same(D.all_gather(mx.array(float(r))), np.arange(n, dtype=np.float32), "all_gather 0-d")
    same(D.all_sum(mx.array(np.zeros((0, 3), np.float32))), np.zeros((0, 3), np.float32),
         "all_sum of an empty array")
    s2 = mx.new_stream(mx.gpu)  # another GPU stream: NCCL on its CUDA stream
    same(D.all_sum(mx.array([float(r)]), stream=s2), np.array([n * (n - 1) / 2], np.float32),
         "all_sum on a second GPU stream")
    if FAKE:  # NCCL was called on that mx stream's CUDA stream
        from tapescope.kernels.cuda import device

        assert fake_nccl.calls[-1] == ("allReduce", device.cuda_stream(s2.index).ptr)


def check_unsupported(g, n: int, r: int) -> None:
    for dt in UNSUPPORTED:  # MLX: std::invalid_argument at eval
        x = mx.array(data(r, (3,), dt), dtype=mx_dtype(dt))
        for f in (D.all_sum, D.all_max, D.all_gather):
            raises(ValueError, "[nccl] Unknown or unsupported dtype", lambda: f(x))


def check_lazy_and_timeline(g, n: int, r: int) -> None:
    x = mx.full((256,), float(r + 1))
    f = mx.compile(lambda a: mx.exp(D.all_sum(a * 2.0)) * 0.0 + D.all_sum(a) * 3.0)
    with timeline.record() as rec:
        y = f(x)
        mx.eval(y)
        mx.synchronize()
    same(y, np.full((256,), 3.0 * n * (n + 1) / 2, np.float32), "compiled all_sum")
    import tapescope

    tr = tapescope.trace(f, x)
    ops = [o.primitive for o in tr.ops]
    assert ops == ["Compiled", "AllReduce", "AllReduce", "Compiled"], ops  # never fused
    why = {i.reason for k in tr.kernels for i in k.inputs if i.producer == "AllReduce"}
    assert why == {"collective (communication between processes)"}, why
    coll = [q for q in rec.records if q.kind == "collective"]
    assert [q.name for q in coll] == ["AllReduce", "AllReduce"], coll
    assert all(q.nbytes == 1024 and q.detail["group_size"] == n and q.detail["rank"] == r
               for q in coll), coll


def check_send_recv(g, n: int, r: int) -> None:
    nxt, prv = (r + 1) % n, (r - 1) % n
    for dt in ("float32", "bfloat16", "int64"):
        x = mx.array(data(r, (5,), dt), dtype=mx_dtype(dt))
        if r % 2 == 0:  # even ranks send first, odd ones receive first
            mx.eval(D.send(x, nxt))
            got = D.recv((5,), mx_dtype(dt), prv)
            mx.eval(got)
        else:
            got = D.recv_like(x, prv)
            assert got._d.node.primitive.name == "Recv", "recv is a lazy primitive"
            mx.eval(got)
            mx.eval(D.send(x, nxt))
        same(got, data(prv, (5,), dt), f"ring of send / recv {dt}")
    mpi_worker.check_token_ring(n, r, "int32")
    raises(ValueError, "[nccl] Unknown or unsupported dtype",
           lambda: D.send(mx.array([True]), nxt))


def check_split(g, n: int, r: int) -> None:
    mpi_worker.check_split(g, n, r)
    assert getattr(g.split(0, n - 1 - r)._comm, "nccl", False)  # splits stay on NCCL


def check_errors(g, n: int, r: int) -> None:
    mpi_worker.check_argument_errors(n)
    assert D.init(strict=True, backend="nccl") is g


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "full"
    if mode == "full":
        n, r0 = int(os.environ["OMPI_COMM_WORLD_SIZE"]), int(os.environ["OMPI_COMM_WORLD_RANK"])
    else:
        n, r0 = int(os.environ["MLX_WORLD_SIZE"]), int(os.environ["MLX_RANK"])
    g = D.init(strict=True) if mode == "full" else D.init(backend="nccl", strict=True)
    r = g.rank()
    assert g.size() == n and r == r0, (g.size(), n, r, r0)
    checks = (check_world, check_collectives, check_unsupported, check_lazy_and_timeline,
              check_send_recv, check_split, check_errors)
    if mode == "tcp":
        checks = (check_world, check_split)
    for check in checks:
        check(g, n, r)
    if FAKE:
        print(f"calls {r} {len(fake_nccl.calls)}", flush=True)
    print(f"OK {r}", flush=True)


if __name__ == "__main__":
    mpi_worker.run(main)
