"""The progress bar counts the nodes of an eval even when the timeline's ring dropped some of
their records before the bar's poller read them (a long eval outruns a descheduled poller):
the bar must not stop short of what the %%mlx report says."""

from __future__ import annotations

from tapescope.kernels import timeline
from tapescope.progress import ProgressMonitor


def test_records_the_ring_dropped_still_count_as_nodes_done():
    n = timeline.CAPACITY + 50_000
    m = ProgressMonitor(min_seconds=3600)
    with timeline.record():
        m._last_seq = timeline.next_seq() - 1
        timeline.add("eval_begin", timeline.now(), detail={"nodes": n + 10, "streams": [0]})
        m.poll()
        for _ in range(n):  # more primitive runs than the ring holds, with no poll between
            timeline.add("primitive", timeline.now(), name="Add", stream=0)
        m.poll()
    (task,) = m.tasks
    # every primitive counted (other records the ring dropped, e.g. frees of earlier tests'
    # buffers, count too: the bar may run ahead of the nodes, never past its total)
    assert n <= task.done <= task.total


def test_a_finalizer_adding_a_record_while_the_ring_is_held_does_not_hang():
    """A garbage collection can start while a reader holds the ring's lock (between
    bytecodes on Python 3.12, at an allocation before); its finalizers free buffers and a
    free adds a record on the same thread. With a plain lock that thread waited on itself
    (this module's test hung on the GPU machine under xdist until pytest-timeout killed it)."""
    import gc
    import subprocess
    import sys

    code = (
        "import gc; from tapescope.kernels import timeline\n"
        "class Cyc:\n"
        "    def __del__(self): timeline.add('free', timeline.now())\n"
        "gc.disable()\n"
        "for _ in range(5):\n"
        "    a = Cyc(); a.self = a; del a\n"
        "with timeline._lock:\n"
        "    gc.collect()\n"
        "print(sum(r.kind == 'free' for r in timeline.records()))\n")
    assert gc.isenabled()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "5", out.stdout + out.stderr
