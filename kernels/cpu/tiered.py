"""Tiered first calls (a tapescope extension beyond MLX): no waiting for the C compiler.

With tiering on (``set_tiered(True)``, ``tapescope.set_tiered``, or ``TAPESCOPE_TIERED=1``
in the environment), a fused tape whose kernel is not loaded yet runs interpreted
(``codegen/interpret.py``) while its kernel builds on a background thread; a later call
finds the kernel loaded and launches it. Builds of different kernels run in parallel
(``compiler.get_kernel`` locks per kernel), the toolchain probe included. The timeline
says which ran: ``kernel_fallback`` records with ``detail["tier"] == "interpreted"`` while
the kernel builds, ``kernel_launch`` once it runs. MLX has no such mode: off by default.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional

from ..settings import settings
from . import compiler

_pool: list = []  # the background builders (made on first use)
_building: dict[str, Future] = {}  # kernel key -> its background build
_lock = threading.Lock()

BUILDING = "interpreted while the C kernel builds in the background (tiered first call)"


def set_tiered(on: bool) -> bool:
    """Turn tiered first calls on or off (``settings.tiered``); returns the previous setting."""
    prev = settings.tiered
    settings.tiered = bool(on)
    return prev


def tiered() -> bool:
    """Whether tiered first calls are on (``settings.tiered``)."""
    return settings.tiered


def _executor() -> ThreadPoolExecutor:
    with _lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2),
                                            thread_name_prefix="tapescope-build"))
        return _pool[0]


def start(key: str, build: Callable[[], object]) -> Future:
    """Start building the kernel ``key`` in the background unless it is building already;
    returns its future. (The caller asks only for a kernel neither loaded nor failed.)"""
    with _lock:
        f = _building.get(key)
        if f is not None and not f.done():
            return f
    ex = _executor()
    with _lock:
        f = _building.get(key)
        if f is None or f.done():
            f = _building[key] = ex.submit(_quiet, build)
    return f


def _quiet(build: Callable[[], object]) -> None:
    """Run a build; its failure is remembered by the compiler (``compiler.failed``) and
    reported by the next call, which runs interpreted with the reason."""
    try:
        build()
    except compiler.BuildError:
        pass


def building(key: str) -> bool:
    """Whether the kernel ``key`` is building in the background now."""
    f = _building.get(key)
    return f is not None and not f.done()


def wait(timeout: Optional[float] = None) -> bool:
    """Wait for every background build started so far; True when all have finished."""
    with _lock:
        futures = list(_building.values())
    done = True
    for f in futures:
        try:
            f.result(timeout)
        except Exception:  # noqa: BLE001 - a timeout: not finished
            done = False
    return done


def forget() -> None:
    """Drop finished builds' futures (``compiler.clear`` makes them stale)."""
    with _lock:
        for k in [k for k, f in _building.items() if f.done()]:
            del _building[k]
