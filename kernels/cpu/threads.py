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

BLAS threads follow the cores that are free: before a numpy matmul, ``fit_blas_threads``
sets OpenBLAS's thread count to the cores not taken by other processes' runnable threads
(``/proc/loadavg``'s running count less this process's own, no more of them than its 1-minute
average holds besides this process; sampled at most every 0.1 s). On a quiet machine that is every core; on a shared, loaded one a two-thread GEMM whose
threads wait for each other at every step lost to a one-thread GEMM by 2-4x (measured:
512x1024 @ 1024x1024, 73-90 ms against 17-28 at load 8 on 2 cores). An
``OPENBLAS_NUM_THREADS`` the user set is kept.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
import time

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
    return dict(_applied, cores=os.cpu_count(), blas_threads=blas_threads())


def _gomp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return "libgomp" in f.read()
    except OSError:
        return False


# -- BLAS threads ----------------------------------------------------------------------------

SAMPLE_S = 0.1  # how often the free cores are sampled (at most)
_blas: dict = {"at": -1.0, "n": None, "libs": None}
_blas_lock = threading.Lock()


def _openblas_libs() -> list:
    """(set, get) thread-count functions of every OpenBLAS loaded in this process."""
    found, seen = [], set()
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line and ".so" in line}
    except OSError:
        return []
    for path in sorted(paths):
        if path in seen or not os.path.exists(path):
            continue
        seen.add(path)
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pre in ("scipy_openblas", "openblas"):
            for suf in ("64_", ""):
                fs, fg = f"{pre}_set_num_threads{suf}", f"{pre}_get_num_threads{suf}"
                if hasattr(lib, fs) and hasattr(lib, fg):
                    getattr(lib, fg).restype = ctypes.c_int
                    found.append((getattr(lib, fs), getattr(lib, fg)))
                    break
            else:
                continue
            break
    return found


def free_cores() -> int:
    """The cores other processes leave free (at least 1): the cores less the other processes'
    runnable threads now (``/proc/loadavg``'s running count less this process's own),
    counting no more of them than the 1-minute load average holds besides this process
    (``sustained``). The kernels' ``ts_threads`` (``codegen/render.py``) is the same rule."""
    cores = os.cpu_count() or 1
    try:
        with open("/proc/loadavg") as f:
            fields = f.read().split()
        load1, running = float(fields[0]), int(fields[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return cores
    if sustained(load1) == 0 or running <= 1:
        return cores  # no other load counts: no task scan
    own = 0
    for stat in glob.glob("/proc/self/task/*/stat"):
        try:
            with open(stat) as f:
                own += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except OSError:
            pass
    return free(cores, running, max(own, 1), load1)


def sustained(load1: float) -> int:
    """How many other processes' runnable tasks the 1-minute load average holds: its rounded
    value less this process's own (one). One sample of the run queue also catches a quiet
    machine's passing tasks (a kworker, khugepaged at nice 19): at the first launch of a new
    kernel, with only the benchmark's processes and the kernel's own threads counted, one was
    runnable in 2 of 5 fresh processes, and the GELU kernel ran on one of two idle cores."""
    return max(0, int(load1 + 0.5) - 1)


def free(cores: int, running: int, own: int, load1: float) -> int:
    """``free_cores``' rule: ``cores`` less the other runnable tasks (``running - own``), no
    more of them than ``sustained(load1)``; at least 1, at most ``cores``."""
    others = max(0, running - own)
    return max(1, min(cores, cores - min(others, sustained(load1))))


def fit_blas_threads(force: bool = False) -> None:
    """Before a BLAS call: OpenBLAS gets as many threads as there are free cores (sampled
    at most every ``SAMPLE_S`` seconds; nothing when the user set OPENBLAS_NUM_THREADS)."""
    now = time.monotonic()
    if not force and now - _blas["at"] < SAMPLE_S:
        return
    with _blas_lock:
        _blas["at"] = now
        if os.environ.get("OPENBLAS_NUM_THREADS"):
            return
        n = free_cores()
        if n != _blas["n"]:
            for set_n, _ in _openblas_libs_cached():
                set_n(ctypes.c_int(n))
            _blas["n"] = n


def _openblas_libs_cached() -> list:
    if _blas["libs"] is None:
        _blas["libs"] = _openblas_libs()
    return _blas["libs"]


def blas_threads() -> list:
    """The thread count of every OpenBLAS loaded in this process."""
    return [get_n() for _, get_n in _openblas_libs_cached()]
