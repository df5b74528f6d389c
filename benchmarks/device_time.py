"""Device times of queued calls on a GPU, the host's per-call work left out: tapescope's
from its timeline (the CUDA events around each launch: ``gpu_work`` records), PyTorch's from
two CUDA events around the calls. The benchmarks that print kernel times share these."""

from __future__ import annotations


def tapescope_ms(run, calls: int) -> tuple:
    """(the mean device time of ``calls`` calls of ``run``, or None where no launch was
    timed; the names of the kernels that ran, in their first launch's order)."""
    from tapescope.kernels import timeline

    timeline.set_recording(True)
    seq = timeline.next_seq()
    try:
        for _ in range(calls):
            run()
    finally:
        recs = timeline.records_since(seq)
        timeline.set_recording(False)
    work = [r for r in recs if r.kind == "gpu_work"]
    ms = [r.detail.get("device_time_ms", 0.0) for r in work]
    names = list(dict.fromkeys(r.detail.get("kernel", r.name) for r in work))
    return (sum(ms) / calls if ms else None), names


def torch_ms(issue, calls: int) -> float:
    """The mean device time of ``calls`` calls of ``issue`` (PyTorch's, queued) between two
    CUDA events."""
    import torch

    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(calls):
        issue()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / calls
