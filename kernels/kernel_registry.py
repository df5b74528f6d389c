"""The in-process kernel cache every runtime's kernels register in: one entry per kernel
(what ``tapescope.kernel_cache()`` lists), keyed by the kernel's key, under one lock, and the
generation call plans compare (bumped when the cache is cleared, so a plan holding an older
kernel is rebuilt). The CPU compiler, the CUDA runtime (NVRTC / nvcc) and the custom kernels
all put their entries here; a tape that ran interpreted is counted here too."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass
class KernelEntry:
    """One cached kernel: what ``tapescope.kernel_cache()`` lists."""

    name: str
    runtime: str
    variant: str
    source: str
    build_ms: float = 0.0
    hits: int = 0
    misses: int = 0
    interpreted: int = 0  # calls run interpreted while the kernel built (tiered first calls)
    disk_path: Optional[str] = None
    origin: str = ""  # "built", "disk", "temp" (built in a temporary folder, not cached)
    cache_note: str = ""  # why the disk cache was not used ("" when it was)
    tape: Optional[object] = field(default=None, repr=False)  # the codegen Tape it was made from
    fn: Optional[Callable] = field(default=None, repr=False)
    lib: Optional[ctypes.CDLL] = field(default=None, repr=False)
    _fast: dict = field(default_factory=dict, repr=False)

    def fast_fn(self, gil: bool) -> Callable:
        """The kernel as a ctypes function without argument conversion (it takes the argv
        array as is); with ``gil=True`` it runs holding the GIL, which saves the release
        and re-acquire on small calls (the kernel never calls back into Python)."""
        f = self._fast.get(gil)
        if f is None:
            dll = (ctypes.PyDLL if gil else ctypes.CDLL)(self.lib._name, handle=self.lib._handle)
            f = getattr(dll, self.name)
            f.restype = None
            self._fast[gil] = f
        return f


class BuildError(Exception):
    """The compiler failed or is missing; the message says why."""


class BuildInterrupted(BuildError):
    """The compiler was stopped by a signal (an interrupt): not remembered as a failure, so
    the next call builds again."""


_lock = threading.Lock()
_kernels: dict[str, KernelEntry] = {}
_generation = [0]  # bumped by clear(): call plans holding an older kernel are rebuilt


def generation() -> int:
    """How many times the in-process cache was cleared (call plans compare it)."""
    return _generation[0]


def loaded(key: str) -> Optional[KernelEntry]:
    """The in-process kernel under ``key`` when it is built and loaded, else None."""
    e = _kernels.get(key)
    return e if e is not None and e.fn is not None else None


def note_fallback(name: str, variant: str, source: str, reason: str,
                  tape: Optional[object] = None) -> None:
    """Count a tape that ran interpreted (no compiler, failed build, unsupported op)."""
    with _lock:
        e = _kernels.get(name)
        if e is None:
            e = _kernels[name] = KernelEntry(name, "numpy", variant, source, tape=tape)
        e.misses += 1
        e.origin = f"fallback: {reason}"


def note_interpreted(key: str, name: str, variant: str, reason: str,
                     tape: Optional[object] = None) -> None:
    """Count a call that ran interpreted while its kernel builds (tiered first calls)."""
    with _lock:
        e = _kernels.get(key)
        if e is None:
            e = _kernels[key] = KernelEntry(name, "interpreted", variant, "", tape=tape)
        if e.fn is None:
            e.runtime, e.origin = "interpreted", reason
        e.interpreted += 1


def entries() -> list:
    """Every kernel in the in-process cache."""
    with _lock:
        return list(_kernels.values())
