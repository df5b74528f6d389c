"""An NVIDIA GPU's limits for the roofline (``kernels/roofline.py``): its copy bandwidth,
measured once per process (a device-to-device copy timed by CUDA events), and its peak
FLOP/s = SMs x clock x FLOPs per SM per clock of the dtype, CUDA cores and tensor cores
apart.

``PER_SM_CLOCK`` is NVIDIA's per-SM rates (FMA = 2 FLOPs, dense tensor-core math, FP32
accumulate; float32's tensor figure is TF32's) from the architecture whitepapers (A100: Ampere GA100; A10 / RTX 30: GA10x;
L40 / RTX 40: Ada; H100 / H200: Hopper GH100; B200: Blackwell); a compute capability the
table lacks takes the nearest one below it. The clock is the device's reported maximum
(``clockRate``), so the peak is the boost clock's.
"""

from __future__ import annotations

import functools

import cupy

from ..roofline import Machine

COPY_BYTES = 512 << 20
COPY_REPEATS = 15

# (major, minor) -> dtype -> (CUDA-core FLOPs / SM / clock, tensor-core FLOPs / SM / clock)
PER_SM_CLOCK = {
    (8, 0): {"float64": (64, 128), "float32": (128, 1024), "float16": (512, 2048),
             "bfloat16": (256, 2048), "int8": (256, 4096), "int32": (64, None)},
    (8, 6): {"float64": (4, None), "float32": (256, 512), "float16": (256, 1024),
             "bfloat16": (256, 1024), "int8": (256, 2048), "int32": (128, None)},
    (8, 9): {"float64": (4, None), "float32": (256, 512), "float16": (256, 1024),
             "bfloat16": (256, 1024), "int8": (256, 2048), "int32": (128, None)},
    (9, 0): {"float64": (128, 256), "float32": (256, 2048), "float16": (512, 4096),
             "bfloat16": (512, 4096), "int8": (256, 8192), "int32": (128, None)},
    (10, 0): {"float64": (128, 128), "float32": (256, 4096), "float16": (512, 8192),
              "bfloat16": (512, 8192), "int8": (256, 16384), "int32": (128, None)},
}


def per_sm_clock(major: int, minor: int) -> dict:
    """The table's row for compute capability ``major.minor`` (the nearest one below)."""
    known = sorted(k for k in PER_SM_CLOCK if k <= (major, minor))
    return PER_SM_CLOCK[known[-1] if known else min(PER_SM_CLOCK)]


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Bytes per second of a device-to-device copy (read + write: 2 x ``nbytes``) on a
    stream of its own, each timed between two CUDA events; the fastest of ``repeats``."""
    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    stream = cupy.cuda.Stream(non_blocking=True)
    ms = []
    with stream:
        dst[...] = src  # warm-up: the copy kernel loaded, the pages mapped
        for _ in range(repeats):
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record(stream)
            dst[...] = src
            e1.record(stream)
            e1.synchronize()
            ms.append(cupy.cuda.get_elapsed_time(e0, e1))
    t = min(ms) * 1e-3
    return 2 * src.nbytes / t if t > 0 else 0.0


@functools.lru_cache(maxsize=None)
def gpu_machine(device_id: int = 0) -> Machine:
    """The GPU's Machine (measured on the first call only)."""
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    sms, khz = int(props.get("multiProcessorCount", 0)), int(props.get("clockRate", 0))
    major, minor = int(props.get("major", 0)), int(props.get("minor", 0))
    hz = khz * 1e3
    row = per_sm_clock(major, minor)
    peaks = {k: (sms * hz * v, sms * hz * t if t else None) for k, (v, t) in row.items()}
    name = props.get("name", b"GPU")
    name = name.decode() if isinstance(name, bytes) else str(name)
    with cupy.cuda.Device(device_id):
        bw = copy_bandwidth()
    how = (f"copy: device to device, {COPY_BYTES >> 20} MiB, CUDA events, fastest of "
           f"{COPY_REPEATS}; peak: {sms} SMs x {hz / 1e9:.2f} GHz x sm_{major}{minor}'s "
           "FLOPs per SM per clock (CUDA cores; tensor cores apart)")
    return Machine("gpu", name, bw, peaks, how)
