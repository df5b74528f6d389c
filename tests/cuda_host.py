"""Run a generated CUDA kernel on the host (a test tool): its CUDA source, as NVRTC would get
it, compiled by g++ against ``cuda_host_shim.h`` (a block's threads as fibers, warp shuffles,
group memory and barriers as a GPU orders them) and launched over numpy buffers with CUDA's
parameter form (``params[i]`` points at argument ``i``), so the CUDA text itself is checked
against numpy on a machine without a GPU. Builds are cached by the source's hash in the
temporary directory. Nothing here says how fast a GPU runs the kernel."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
SHIM = HERE / "cuda_host_shim.h"
CXX = shutil.which("g++")
_libs: dict = {}


def host_source(source: str) -> str:
    """The CUDA source with the toolkit's headers left out (the shim stands for them)."""
    return re.sub(r"(?m)^#include <cuda_(fp16|bf16)\.h>\s*$", "", source)


def build(source: str, names) -> ctypes.CDLL:
    """One shared object of ``source`` with a ``ts_run_<name>`` entry per kernel name."""
    text = host_source(source) + "".join(f"TS_ENTRY({n})\n" for n in names)
    tag = hashlib.sha256((SHIM.read_text() + text).encode()).hexdigest()[:20]
    lib = _libs.get(tag)
    if lib is not None:
        return lib
    folder = Path(tempfile.gettempdir()) / f"tapescope_cuda_host_{os.getuid()}"
    folder.mkdir(exist_ok=True)
    so = folder / f"{tag}.so"
    if not so.exists():
        src = folder / f"{tag}.{os.getpid()}.cpp"
        src.write_text(text)
        tmp = folder / f"{tag}.{os.getpid()}.so"
        r = subprocess.run([CXX, "-std=gnu++17", "-O1", "-shared", "-fPIC", "-w",
                            "-fno-strict-aliasing", "-include", str(SHIM), "-o", str(tmp), str(src)],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ failed on the CUDA source:\n{r.stderr[-4000:]}")
        os.replace(tmp, so)
        src.unlink()
    lib = _libs[tag] = ctypes.CDLL(str(so))
    return lib


def launch(lib, name: str, grid: int, block: int, args: list) -> None:
    """Kernel ``name`` over ``grid`` blocks of ``block`` threads; ``args`` in the kernel's
    order: numpy arrays (their data pointers) or integers (int64 by value)."""
    keep = []
    for a in args:
        if isinstance(a, np.ndarray):
            keep.append(ctypes.c_void_p(a.ctypes.data))
        else:
            keep.append(ctypes.c_int64(int(a)))
    params = (ctypes.c_void_p * len(keep))(*[ctypes.cast(ctypes.pointer(k), ctypes.c_void_p) for k in keep])
    fn = getattr(lib, f"ts_run_{name}")
    fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
    if fn(grid, block, params) != 0:
        raise RuntimeError(f"{name}: threads of a block wait at different meetings")
    conflicts = getattr(lib, "ts_ldsm_conflicts", None)
    if conflicts is not None:
        conflicts.restype = ctypes.c_long
        n = conflicts()
        if n:
            raise RuntimeError(f"{name}: {n} ldmatrix phases with a bank conflict (eight rows "
                               "not in eight 16-byte bank groups)")
