"""Run by tests/test_distributed_mpi.py under ``mpirun -np N``: every rank checks tapescope's
``mx.distributed`` over MPI against numpy (each rank rebuilds every rank's input, so the
reference is numpy over all of them) and prints ``OK <rank>`` when all checks pass."""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np

import tapescope.core as mx
from tapescope.kernels import timeline

D = mx.distributed


def data(rank: int, shape, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input: small integers, so every order of summation is exact."""
    rng = np.random.default_rng(1000 + rank)
    v = rng.integers(-8, 9, size=shape)
    if dtype == "bool":
        return v > 0
    if dtype.startswith("uint"):
        v = np.abs(v)
    if dtype.startswith("complex"):
        return (v + 1j * rng.integers(-8, 9, size=shape)).astype(dtype)
    return v.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def same(got, want, what: str) -> None:
    if want.dtype == ml_dtypes.bfloat16:  # numpy cannot take MLX's bfloat16 buffer
        assert got.dtype == mx.bfloat16, f"{what}: dtype {got.dtype}"
        got, want = got.astype(mx.float32), want.astype(np.float32)
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert np.array_equal(got, want), f"{what}: {got} != {want}"


def raises(exc, msg: str, fn) -> None:
    try:
        mx.eval(fn())
    except exc as e:
        assert str(e) == msg, f"{msg!r} != {str(e)!r}"
        return
    raise AssertionError(f"no {exc.__name__}: {msg}")


def check_collectives(g, n: int, r: int) -> None:
    for dt in ("float32", "float64", "float16", "bfloat16", "int32", "int8", "uint8",
               "bool", "complex64"):
        parts = np.stack([data(k, (3, 4), dt) for k in range(n)])
        x = mx.array(parts[r], dtype=getattr(mx, dt + "_" if dt == "bool" else dt))
        total = parts[0].copy()
        for p in parts[1:]:
            total = (total | p) if dt == "bool" else (total + p).astype(total.dtype)
        y = D.all_sum(x)
        assert y._d.node.primitive.name == "AllReduce", "all_sum is a lazy primitive"
        same(y, total, f"all_sum {dt}")
        if dt != "complex64":
            same(D.all_max(x), parts.max(axis=0), f"all_max {dt}")
            same(D.all_min(x), parts.min(axis=0), f"all_min {dt}")
        same(D.all_gather(x), np.concatenate(list(parts)), f"all_gather {dt}")
        big = np.stack([data(k, (2 * n, 3), dt) for k in range(n)])
        s = big[0].copy()
        for p in big[1:]:
            s = (s | p) if dt == "bool" else (s + p).astype(s.dtype)
        same(D.sum_scatter(mx.array(big[r], dtype=getattr(mx, dt + "_" if dt == "bool" else dt))), s[2 * r:2 * r + 2], f"sum_scatter {dt}")
    same(D.all_gather(mx.array(float(r))), np.arange(n, dtype=np.float32), "all_gather 0-d")
    same(D.all_sum(mx.array(np.zeros((0, 3), np.float32))), np.zeros((0, 3), np.float32),
         "all_sum of an empty array")


def check_lazy_and_timeline(g, n: int, r: int) -> None:
    x = mx.full((256,), float(r + 1))
    f = mx.compile(lambda a: mx.exp(D.all_sum(a * 2.0)) * 0.0 + D.all_sum(a) * 3.0)
    with timeline.record() as rec:
        y = f(x)
        mx.eval(y)
    same(y, np.full((256,), 3.0 * n * (n + 1) / 2, np.float32), "compiled all_sum")
    import tapescope

    tr = tapescope.trace(f, x)
    ops = [o.primitive for o in tr.ops]
    assert ops == ["Compiled", "AllReduce", "AllReduce", "Compiled"], ops  # never fused
    why = {i.reason for k in tr.kernels for i in k.inputs if i.producer == "AllReduce"}
    assert why == {"collective (communication between processes)"}, why  # the picture says so
    coll = [q for q in rec.records if q.kind == "collective"]
    assert [q.name for q in coll] == ["AllReduce", "AllReduce"], coll
    assert all(q.nbytes == 1024 and q.detail["group_size"] == n for q in coll), coll


def check_send_recv(g, n: int, r: int) -> None:
    nxt, prv = (r + 1) % n, (r - 1) % n
    x = mx.array(data(r, (5,), "float32"))
    if r % 2 == 0:  # even ranks send first, odd ones receive first: no cycle of waits
        mx.eval(D.send(x, nxt))
        got = D.recv((5,), mx.float32, prv)
        mx.eval(got)
    else:
        got = D.recv_like(x, prv)
        mx.eval(got)
        mx.eval(D.send(x, nxt))
    same(got, data(prv, (5,), "float32"), "ring of send / recv")
    xb = mx.array(data(r, (3, 2), "float32"))  # a batched send: vmap of Send
    send_b = mx.vmap(lambda a: D.send(a, nxt))
    if r % 2 == 0:
        mx.eval(send_b(xb))
        got = D.recv((3, 2), mx.float32, prv)
        mx.eval(got)
    else:
        got = D.recv((3, 2), mx.float32, prv)
        mx.eval(got)
        mx.eval(send_b(xb))
    same(got, data(prv, (3, 2), "float32"), "ring of vmapped send / recv")
    check_token_ring(n, r, "int16")


def check_token_ring(n: int, r: int, dt: str) -> None:
    """A token sent around the ring from rank 0, each rank adding its own data: rank 0 gets
    back the sum over ranks."""
    nxt, prv = (r + 1) % n, (r - 1) % n
    v = mx.array(data(r, (2, 3), dt))
    if r == 0:
        mx.eval(D.send(v, nxt))
        tok = D.recv_like(v, prv)
    else:
        tok = D.recv_like(v, prv) + v
        mx.eval(D.send(tok, nxt))
    if r == 0:
        want = sum(data(k, (2, 3), dt) for k in range(n)).astype(dt)
        same(tok, want, "token around the ring")


def check_split(g, n: int, r: int) -> None:
    sub = g.split(r % 2)
    members = [k for k in range(n) if k % 2 == r % 2]
    assert (sub.size(), sub.rank()) == (len(members), members.index(r))
    want = sum(data(k, (4,), "int32") for k in members).astype(np.int32)
    same(D.all_sum(mx.array(data(r, (4,), "int32")), group=sub), want, "all_sum on a split")
    rev = g.split(0, n - 1 - r)
    assert (rev.size(), rev.rank()) == (n, n - 1 - r)
    got = D.all_gather(mx.array([r]), group=rev)
    same(got, np.arange(n - 1, -1, -1, dtype=np.int32), "all_gather ordered by key")


def check_errors(g, n: int, r: int) -> None:
    check_argument_errors(n)
    raises(ValueError, f"[sum_scatter] Invalid shape=() for a group of size {n}. The first "
           "dimension (axis 0) must be divisible by the group size and input mst have at "
           "least one.", lambda: D.sum_scatter(mx.array(1.0)))
    assert D.init(strict=True, backend="mpi").size() == n
    assert D.is_available("mpi")


def check_argument_errors(n: int) -> None:
    """MLX 0.32.4's messages under mpirun for a bad peer or scatter shape (any backend)."""
    raises(ValueError, f"Invalid destination={n} for a group of size {n}",
           lambda: D.send(mx.ones(2), n))
    raises(ValueError, f"Invalid source=-1 for a group of size {n}",
           lambda: D.recv((2,), mx.float32, -1))
    raises(ValueError, f"[sum_scatter] Invalid shape=({n + 1},2) for a group of size {n}. The "
           "first dimension (axis 0) must be divisible by the group size and input mst have at "
           "least one.", lambda: D.sum_scatter(mx.ones((n + 1, 2))))


def check_transforms(g, n: int, r: int) -> None:
    c = mx.array([1.0, 2.0]) * (r + 1)
    # MLX's AllReduce VJP passes the cotangent through; its JVP reduces the tangent
    same(mx.grad(lambda x: (D.all_sum(x) * c).sum())(mx.ones(2)), np.array(c), "vjp all_sum")
    _, t = mx.jvp(D.all_sum, [mx.ones(2)], [c])
    same(t[0], np.array([1.0, 2.0], np.float32) * n * (n + 1) / 2, "jvp all_sum")
    w = mx.arange(2.0 * n).reshape(n, 2)
    gr = mx.grad(lambda x: (D.all_gather(x) * w).sum())(mx.ones((1, 2)))
    same(gr, np.arange(2.0 * n, dtype=np.float32).reshape(n, 2)[r:r + 1], "vjp all_gather")
    xs = np.stack([np.arange(6.0, dtype=np.float32).reshape(3, 2) + k for k in range(n)])
    same(mx.vmap(D.all_sum)(mx.array(xs[r])), xs.sum(axis=0), "vmap all_sum")
    want = np.stack([xs[:, b].reshape(-1) for b in range(3)])  # each row gathered on its own
    same(mx.vmap(D.all_gather)(mx.array(xs[r])), want, "vmap all_gather")


def main() -> None:
    n = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    g = D.init()
    r = g.rank()
    assert g.size() == n and r == int(os.environ["OMPI_COMM_WORLD_RANK"])
    for check in (check_collectives, check_lazy_and_timeline, check_send_recv, check_split,
                  check_errors, check_transforms):
        check(g, n, r)
    print(f"OK {r}", flush=True)


def run(entry) -> None:
    """Run a worker's ``entry``; on any error print it and end every rank (under mpirun the
    others would wait for this one forever), else exit with status 1."""
    try:
        entry()
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        if "OMPI_COMM_WORLD_SIZE" in os.environ:
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(1)
        os._exit(1)


if __name__ == "__main__":
    run(main)
