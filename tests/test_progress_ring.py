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
