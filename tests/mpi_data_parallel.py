"""Run by tests/test_distributed_mpi.py under ``mpirun -np N``: data-parallel training of a
small MLP. Each rank takes its quarter (1/N) of every batch, computes its gradients with
``mx.grad``, averages them with ``all_sum`` and applies the same SGD step; rank 0 also trains
one process on the full batch and prints the largest difference of the two loss curves."""

from __future__ import annotations

import numpy as np

import tapescope.core as mx

D = mx.distributed
STEPS, BATCH, LR = 30, 64, 0.1


def init_params():
    rng = np.random.default_rng(0)
    return {"w1": mx.array(rng.normal(0, 0.5, (8, 16)).astype(np.float32)),
            "b1": mx.zeros((16,)),
            "w2": mx.array(rng.normal(0, 0.5, (16, 1)).astype(np.float32)),
            "b2": mx.zeros((1,))}


def loss_fn(p, x, y):
    h = mx.tanh(x @ p["w1"] + p["b1"])
    return mx.mean(mx.square(h @ p["w2"] + p["b2"] - y))


def batches():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 1))
    for _ in range(STEPS):
        x = rng.normal(size=(BATCH, 8)).astype(np.float32)
        yield x, np.sin(x @ w).astype(np.float32)


def train(group=None):
    """The loss of the full batch at each step; with ``group``, gradients come from this
    rank's shard, averaged over the group."""
    p = init_params()
    grad_fn = mx.value_and_grad(loss_fn)
    curve = []
    for x, y in batches():
        if group is None:
            curve.append(loss_fn(p, mx.array(x), mx.array(y)).item())
            _, g = grad_fn(p, mx.array(x), mx.array(y))
        else:
            n, r = group.size(), group.rank()
            k = BATCH // n
            xs, ys = mx.array(x[r * k:(r + 1) * k]), mx.array(y[r * k:(r + 1) * k])
            local, g = grad_fn(p, xs, ys)
            curve.append((D.all_sum(local, group=group) / n).item())  # the full batch's loss
            g = {name: D.all_sum(v, group=group) / n for name, v in g.items()}
        p = {name: p[name] - LR * g[name] for name in p}
        mx.eval(p)
    return np.array(curve)


if __name__ == "__main__":
    world = D.init()
    dp = train(world)
    if world.rank() == 0:
        one = train()
        print(f"first {one[0]:.6f} last {one[-1]:.6f} dp_last {dp[-1]:.6f} "
              f"max_diff {np.abs(dp - one).max():.3e}", flush=True)
