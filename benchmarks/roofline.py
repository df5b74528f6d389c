"""Every kernel of a small set placed on the device's roofline (tapescope.kernels.roofline):
its time (the CPU's clock; on CUDA, device time between CUDA events), bytes moved, the
fraction of the measured copy bandwidth and of peak FLOP/s, and why it is far from the roof.

Kernels (float32, ``--mib`` MiB per operand): a fused ``a * 2 + b`` on contiguous inputs,
on a strided view (every other column), on a transposed input, with a stride-0 broadcast
row, a 4 KiB one (launch-bound), ``sum(a * 2, axis=-1)`` fused under extended fusion (the
CPU's; elsewhere its two kernels run apart), and an eager ``a @ b`` (on a GPU its CuPy
kernel has a device-time record; on the CPU numpy runs it, no kernel of ours). Each runs ``--reps`` times; the table is the median run. The machine line says
how its limits were found.

    .venv/bin/python benchmarks/roofline.py [--device cpu|gpu] [--mib 64] [--reps 9]
"""

from __future__ import annotations

import argparse
import platform

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None, help="cpu or gpu (default: the default device)")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()

    import tapescope
    import tapescope.core as mx
    from tapescope.core import fusion
    from tapescope.kernels import roofline

    dev = mx.default_device() if args.device is None else (mx.gpu if args.device == "gpu" else mx.cpu)
    mx.set_default_device(dev)
    mx.set_cache_limit(1 << 34)  # outputs reused from the cache, as a steady loop's are
    cols = 4096
    rows = max(1, (args.mib << 20) // (4 * cols))
    a = mx.array(np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32))
    b = mx.array(np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32))
    sq = mx.array(np.ones((2048, 2048), np.float32))
    m = mx.array(np.ones((2048, 2048), np.float32))
    mx.eval(a, b, sq, m)
    fusion.set_fusion("extended")  # (traced at the first call: on for the whole run)
    f = mx.compile(lambda x, y: x * 2 + y)
    red = mx.compile(lambda x: mx.sum(x * 2, axis=-1))
    calls = [
        ("contiguous", lambda: f(a, b)),
        ("strided read", lambda: f(a[:, ::2], b[:, : cols // 2])),
        ("transposed read", lambda: f(sq.T, sq)),
        ("broadcast row", lambda: f(mx.broadcast_to(a[:1], a.shape), b)),
        ("4 KiB", lambda: f(a[:1, :1024], b[:1, :1024])),
        ("fused sum", lambda: red(a)),
        ("matmul 2048^2", lambda: m @ m),
    ]
    for _, c in calls:  # kernels built, buffers cached
        mx.eval(c())
    mx.synchronize()
    with tapescope.record() as rec:
        for _ in range(args.reps):
            for _, c in calls:
                mx.eval(c())
            mx.synchronize()
    placed = roofline.place(rec.records)
    ms = {p.launch.device: p.machine for p in placed if p.machine}
    for d, mach in ms.items():
        print(f"{d}: {mach.name} — copy {mach.copy_bytes_per_s / 1e9:.1f} GB/s, float32 peak "
              f"{(mach.peak('float32') or 0) / 1e12:.2f} TFLOP/s ({mach.how})")
    print(f"python {platform.python_version()}, {args.reps} runs each, {args.mib} MiB operands\n")
    print(f"{'kernel':<44} {'time':>10} {'MiB':>8} {'GB/s':>8} {'% copy':>7} {'GFLOP/s':>9} "
          f"{'% peak':>7}  why")
    for p in placed:
        x = p.launch
        pct = "—" if p.bandwidth_fraction is None else f"{p.bandwidth_fraction:.0%}"
        pk = "—" if p.peak_fraction is None else f"{p.peak_fraction:.1%}"
        gf = "—" if x.flops_per_s is None else f"{x.flops_per_s / 1e9:.1f}"
        print(f"{x.title[:44]:<44} {x.time_s * 1e6:>8.1f}us {x.nbytes / 2**20:>8.2f} "
              f"{x.bytes_per_s / 1e9:>8.1f} {pct:>7} {gf:>9} {pk:>7}  {p.why or 'at the roof'}")
    print("\n" + roofline.summary(placed))


if __name__ == "__main__":
    main()
