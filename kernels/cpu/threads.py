"""One thread policy for the CPU's generated kernels and the BLAS under numpy.

The kernels' OpenMP threads and OpenBLAS's threads share the cores. With OpenMP's default
(active) waiting, a kernel's threads spin after each parallel loop for the cores the next
matmul's BLAS threads need (and a loaded machine's other processes too): measured on the
2-core machine of record, loaded by other processes, the MLP ``gelu(x @ W1) @ W2`` took
96-188 ms with active waiting and 48-89 with passive, softmax of (1024, 1024) 5.8-20 ms
against 1.2-3.7 (BENCHMARKS.md, "thread policy"). So the
kernels' threads wait passively (they sleep on a futex after a loop; waking costs ~10 µs on
a small threaded kernel) and never add a thread beyond the cores: OpenMP's pool and
OpenBLAS's each have one thread per core, and only one of them runs at a time (the eval loop
runs one node after another on a stream).

libgomp reads ``OMP_WAIT_POLICY`` once, when the first kernel library loads it, so the
policy is put in the environment when this package is imported (before any kernel loads);
a value the user set is kept.
"""

from __future__ import annotations

import os

WAIT_POLICY = "PASSIVE"
_applied: dict = {}


def apply_policy() -> None:
    """Set the kernels' OpenMP wait policy (unless the user chose one) before libgomp loads."""
    if _applied:
        return
    user = os.environ.get("OMP_WAIT_POLICY", "").strip() or None
    _applied["gomp_loaded_before"] = _gomp_loaded()
    if user is None:
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    _applied["wait_policy"] = os.environ["OMP_WAIT_POLICY"]
    _applied["chosen_by"] = "user" if user is not None else "tapescope"


def policy() -> dict:
    """The policy in force: the wait policy, who chose it, and whether libgomp was already
    loaded by someone else when tapescope set it (then libgomp kept its own setting)."""
    apply_policy()
    return dict(_applied, cores=os.cpu_count())


def _gomp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return "libgomp" in f.read()
    except OSError:
        return False
