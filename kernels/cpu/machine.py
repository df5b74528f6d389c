"""The host's limits for the roofline (``kernels/roofline.py``): its copy bandwidth, measured
once per process with numpy, and its peak FLOP/s from cores x clock x SIMD width.

Peak FLOP/s = CPUs this process may run on x clock x lanes of the widest vector unit that
``/proc/cpuinfo`` lists (``avx512f``: 512 bits, ``avx2`` / ``avx``: 256, ``sse2``: 128, else
scalar) x 2 with ``fma`` (one fused multiply-add per cycle: a lower bound on cores with two
FMA ports). float16 and bfloat16 are computed in float32 by the generated C, so they share
float32's peak. The clock is cpufreq's maximum where the kernel exposes it, else the highest
``cpu MHz`` listed.
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from ..roofline import Machine

COPY_BYTES = 64 << 20  # per buffer: well past the caches of the machines we run on
COPY_REPEATS = 9


def cpuinfo(path: str = "/proc/cpuinfo") -> dict:
    """The first processor's fields of ``/proc/cpuinfo`` (``flags`` as a set), and the
    highest ``cpu MHz`` listed; {} where there is no such file."""
    try:
        text = open(path).read()
    except OSError:
        return {}
    out: dict = {}
    mhz = []
    for line in text.splitlines():
        k, _, v = line.partition(":")
        k, v = k.strip(), v.strip()
        if k == "cpu MHz":
            try:
                mhz.append(float(v))
            except ValueError:
                pass
        if k and k not in out:
            out[k] = v
    out["flags"] = set(out.get("flags", "").split())
    if mhz:
        out["max MHz"] = max(mhz)
    return out


def simd_bits(flags: set) -> int:
    """The widest vector unit among ``flags``."""
    for flag, bits in (("avx512f", 512), ("avx2", 256), ("avx", 256), ("sse2", 128), ("sse", 128)):
        if flag in flags:
            return bits
    return 64


def clock_hz(info: dict) -> Optional[float]:
    """The CPU clock: cpufreq's maximum, else the highest ``cpu MHz``."""
    try:
        return int(open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read()) * 1e3
    except (OSError, ValueError):
        pass
    mhz = info.get("max MHz")
    return mhz * 1e6 if mhz else None


def cpus() -> int:
    """The CPUs this process may run on (the kernels' OpenMP threads use them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def peaks(cores: int, hz: float, bits: int, fma: bool) -> dict:
    """dtype -> (vector FLOP/s, None): no tensor units on the host."""
    out = {}
    for name, itemsize in (("float64", 8), ("float32", 4), ("int64", 8), ("int32", 4),
                           ("int16", 2), ("int8", 1), ("uint8", 1)):
        lanes = max(1, bits // (8 * itemsize))
        out[name] = (cores * hz * lanes * (2 if fma and name.startswith("float") else 1), None)
    out["float16"] = out["bfloat16"] = out["float32"]
    return out


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Bytes per second of a numpy copy (read + write: 2 x ``nbytes``) split over this
    process's CPUs (numpy copies without the GIL): the fastest of ``repeats`` after one
    warm-up (a ceiling is what the machine can do; other work only slows a copy down)."""
    n = cpus()
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    cut = [len(src) * i // n for i in range(n + 1)]
    parts = [(dst[a:b], src[a:b]) for a, b in zip(cut, cut[1:])]
    with ThreadPoolExecutor(n) as pool:
        def copy() -> None:
            list(pool.map(lambda p: np.copyto(*p), parts))

        copy()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            copy()
            ts.append(time.perf_counter() - t0)
    return 2 * src.nbytes / min(ts)


@functools.lru_cache(maxsize=None)
def host_machine() -> Machine:
    """The host's Machine (measured on the first call only)."""
    info = cpuinfo()
    flags = info.get("flags", set())
    bits, fma, n, hz = simd_bits(flags), "fma" in flags, cpus(), clock_hz(info)
    bw = copy_bandwidth()
    name = info.get("model name", "CPU")
    how = (f"copy: numpy over {n} thread(s), {COPY_BYTES >> 20} MiB, fastest of {COPY_REPEATS}; "
           f"peak: {n} CPU(s) x {hz / 1e9 if hz else 0:.2f} GHz x {bits}-bit SIMD"
           f"{' x 2 (FMA)' if fma else ''}")
    note = ("this is a copy from memory (2 x 64 MiB, past the caches) that reads each "
            "destination line before writing it: a kernel whose data fits the caches, or one "
            "with the generated C's streaming stores (outputs of 8 MiB and more, which skip that "
            "read), can pass 100% of it")
    return Machine("cpu", name, bw, peaks(n, hz, bits, fma) if hz else {}, how, note)
