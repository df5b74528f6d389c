"""Build generated C with the system compiler and load it: in-process and on-disk caches.

The compiler (``$CC``, ``cc``, ``gcc`` or ``clang``) is found on PATH at run time. Kernels
build with optimisation, OpenMP and glibc's vector math (declared ``omp declare simd``),
and never with ``-ffast-math``: NaN, infinities, signed zeros and overflow behave as in
numpy (``-ffp-contract=off`` also keeps a*b+c from fusing into one rounding).

Caches: a dict keyed by kernel name (double-checked locking), and a private per-user
directory (mode 0700, ``disk_cache``) holding ``lib<name>.so`` with a sidecar of hashes; a
library is loaded only when the sidecar's source hash matches and the file's own hash
matches, so a truncated, unreadable or foreign file is rebuilt, never loaded. A kernel is
built in a private temporary folder and copied into the cache; when the cache cannot take it
(read-only, full, not private) it is loaded from the temporary folder, and when even that
fails the tape runs interpreted. The reason is on the timeline either way.

The compiler probe's answer (flags, libraries) is remembered in the cache's root, keyed by
the compiler binary, PATH and the machine, so a new process does not probe again; a build
that fails with a remembered answer probes afresh and builds once more.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .. import kernel_call, timeline
from ..kernel_registry import (BuildError, BuildInterrupted, KernelEntry, _generation,  # noqa: F401
                               _kernels, _lock, entries, generation, loaded, note_fallback,
                               note_interpreted)
from ..settings import settings
from .. import disk_cache

# -fno-trapping-math: no code here enables floating-point traps, and without it gcc will not
# if-convert a NaN-propagating select (Maximum, Minimum, ...), leaving the whole loop, and every
# math call in it, scalar ("control flow in loop"). Values are unchanged: NaN, inf, signed zeros
# and rounding stay IEEE (that would take -ffast-math's other parts, which are never used).
BASE_FLAGS = ["-std=gnu11", "-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math",
              "-ffp-contract=off", "-fwrapv", "-w"]


def record_hit(name: str, variant: str) -> None:
    """Put an in-memory cache hit on the timeline (the fast call path's ``get_kernel``)."""
    if timeline.enabled:
        t0 = timeline.now()
        _record("kernel_build", t0, name, hit=True, origin="memory", runtime="cpu",
                variant=variant, compile_ms=0.0)
_toolchains: dict[tuple, Optional["Toolchain"]] = {}
_toolchain_lock = threading.Lock()  # one probe at a time (background builds probe too)
_failed: dict[str, str] = {}  # kernel name -> why its build failed (not retried)
_key_locks: dict[str, threading.Lock] = {}  # kernel key -> held while that kernel builds


@dataclass
class Toolchain:
    """A working compiler and the flags it accepted."""

    path: str
    version: str
    flags: list
    libs: list
    vector_math: tuple
    remembered: bool = False  # read from the probe's record on disk, not probed in this process

    @property
    def ident(self) -> str:
        text = "|".join([self.path, self.version, " ".join(self.flags), " ".join(self.libs),
                         platform.machine(), _cpu_id()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return platform.processor()


def find_compiler() -> Optional[str]:
    """The system C compiler on PATH now (``$CC``, cc, gcc, clang), or None."""
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand:
            p = shutil.which(cand)
            if p:
                return p
    return None


def _glibc_vector_math() -> tuple:
    """libm stems glibc's libmvec vectorises on this machine (x86-64 Linux only)."""
    from ..codegen.render import LIBMVEC_2_22, LIBMVEC_2_35

    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return ()
    try:
        name, ver = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = (int(v) for v in ver.split(".")[:2])
    except (ValueError, OSError, AttributeError):
        return ()
    if (major, minor) >= (2, 35):
        return LIBMVEC_2_22 + LIBMVEC_2_35
    if (major, minor) >= (2, 22):
        return LIBMVEC_2_22
    return ()


_PROBE = r"""
#include <math.h>
#pragma omp declare simd notinbranch
float expf(float);
void probe(float* x, int n) {
  #pragma omp parallel for simd if(n > 100000)
  for (int i = 0; i < n; ++i) x[i] = expf(x[i]);
}
"""


def toolchain() -> Optional[Toolchain]:
    """Probe the compiler on PATH once: which of -march=native, OpenMP, libmvec it takes.

    ``$TAPESCOPE_KERNEL_CFLAGS`` adds flags to every build (``make test-ub`` passes the
    sanitizers); they are part of the toolchain's identity, so such builds get their own
    on-disk cache folder."""
    cc = find_compiler()
    user_flags = tuple(shlex.split(settings.kernel_cflags))
    key = (cc, os.environ.get("PATH", ""), user_flags)
    if key in _toolchains:
        return _toolchains[key]
    with _toolchain_lock:
        if key not in _toolchains:
            tc = _remembered(cc, user_flags)
            if tc is None:
                tc = _probe(cc, user_flags)
                if tc is not None:
                    _remember(tc, user_flags)
            _toolchains[key] = tc
        return _toolchains[key]


def _probe_record(cc: str, user_flags: tuple) -> Optional[Path]:
    """Where the probe's answer for this compiler is remembered: a file in the kernel
    cache's private root (once there is one), named by what the answer depends on (the compiler binary's path,
    size and time, PATH, the extra flags, the machine and glibc), or None without a cache."""
    root = disk_cache.cache_root()  # used only once it exists (a build makes it)
    if not os.path.isdir(root) or disk_cache.unusable(root):
        return None
    try:
        st = os.stat(os.path.realpath(cc))
    except OSError:
        return None
    text = "|".join([cc, os.path.realpath(cc), str(st.st_size), str(st.st_mtime_ns),
                     os.environ.get("PATH", ""), " ".join(user_flags), platform.machine(),
                     _cpu_id(), " ".join(_glibc_vector_math())])
    return root / f"toolchain-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def _remembered(cc: Optional[str], user_flags: tuple) -> Optional[Toolchain]:
    """The probe's earlier answer for this compiler (saves its ~100-200 ms in every new
    process), when its record is ours, private and well formed."""
    if not cc:
        return None
    path = _probe_record(cc, user_flags)
    if path is None or not disk_cache.trusted(path):
        return None
    try:
        info = json.loads(path.read_text())
        tc = Toolchain(str(info["path"]), str(info["version"]), [str(f) for f in info["flags"]],
                       [str(f) for f in info["libs"]], tuple(str(v) for v in info["vector_math"]),
                       remembered=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return tc if tc.path == cc else None


def _remember(tc: Toolchain, user_flags: tuple) -> None:
    """Write the probe's answer next to the kernels (atomically; skipped when it cannot be)."""
    path = _probe_record(tc.path, user_flags)
    if path is None or disk_cache.read_only(path.parent):
        return
    try:
        disk_cache.write_atomic(path, json.dumps(
            {"path": tc.path, "version": tc.version, "flags": tc.flags, "libs": tc.libs,
             "vector_math": list(tc.vector_math)}).encode())
    except OSError:
        pass


def forget_probe() -> None:
    """Drop the remembered probe of the compiler on PATH now (its flags failed a build) so
    that the next ``toolchain()`` probes again."""
    cc = find_compiler()
    user_flags = tuple(shlex.split(settings.kernel_cflags))
    with _toolchain_lock:
        _toolchains.pop((cc, os.environ.get("PATH", ""), user_flags), None)
        path = _probe_record(cc, user_flags) if cc else None
        if path is not None:
            try:
                path.unlink()
            except OSError:
                pass


def probed() -> bool:
    """Whether the compiler on PATH now has been probed already (``toolchain()`` is cheap)."""
    user_flags = tuple(shlex.split(settings.kernel_cflags))
    return (find_compiler(), os.environ.get("PATH", ""), user_flags) in _toolchains


def _probe(cc: Optional[str], user_flags: tuple) -> Optional[Toolchain]:
    """Try the flag sets in order of preference; the first that builds and loads wins."""
    tc = None
    if cc:
        try:
            ver = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            ver = "unknown"
        vm = _glibc_vector_math()
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "probe.c"
            src.write_text(_PROBE)
            for extra, libs, vmath in (
                (["-march=native", "-fopenmp"], ["-lmvec", "-lm"] if vm else ["-lm"], vm),
                (["-march=native", "-fopenmp"], ["-lm"], ()),
                (["-fopenmp"], ["-lm"], ()),
                (["-fopenmp-simd"], ["-lm"], ()),
                ([], ["-lm"], ()),
            ):
                out = Path(d) / "probe.so"
                r = subprocess.run([cc, *BASE_FLAGS, *extra, *user_flags, str(src), "-o", str(out),
                                    *libs],
                                   capture_output=True, text=True, timeout=120)
                if r.returncode == 0:
                    try:
                        ctypes.CDLL(str(out))
                    except OSError:
                        continue
                    tc = Toolchain(cc, ver, BASE_FLAGS + extra + list(user_flags), libs, vmath)
                    break
    return tc


def build(tc: Toolchain, name: str, source: str, workdir: Path) -> tuple:
    """Compile ``source`` to a shared library in ``workdir``; returns (path, build ms).
    Raises BuildError."""
    t0 = time.perf_counter()
    try:
        fd, src = tempfile.mkstemp(dir=workdir, prefix=".src-", suffix=".c")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        fd, out = tempfile.mkstemp(dir=workdir, prefix=".lib-", suffix=".so")
        os.close(fd)
    except OSError as e:
        raise BuildError(f"[Compile::eval_cpu] Failed to compile function {name}: cannot write "
                         f"to the build folder {workdir} ({e.strerror})") from None
    cmd = [tc.path, *tc.flags, src, "-o", out, *tc.libs]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(src)
        os.unlink(out)
        raise BuildError(f"[Compile::eval_cpu] Failed to compile function {name}: {e}") from None
    os.unlink(src)
    if r.returncode != 0:
        os.unlink(out)
        raise (BuildInterrupted if r.returncode < 0 else BuildError)(
            f"[Compile::eval_cpu] Failed to compile function {name}: Failed to execute "
            f"command with return code {r.returncode}: \"{' '.join(cmd)}\", the output is: "
            f"{r.stdout}{r.stderr}")
    return Path(out), (time.perf_counter() - t0) * 1000


def _open(path: Path, name: str) -> tuple:
    """``(library, function)`` loaded from ``path``; OSError or AttributeError when it cannot be."""
    lib = ctypes.CDLL(str(path))
    return lib, getattr(lib, name)


def _build_and_load(tc: Toolchain, name: str, source: str, cache: disk_cache.DiskCache,
                    paths: Optional[tuple]) -> tuple:
    """Build in a private temporary folder, store the library in the cache and load it from
    there; when the cache cannot take it, load it from the temporary folder, which is removed
    either way. Returns ``(lib, fn, disk path or None, build ms, origin, cache note)``;
    raises BuildError, with the cache's reason, when no library can be built and loaded."""
    note = cache.reason
    try:
        workdir = disk_cache.new_build_dir(cache)
    except OSError as e:
        raise BuildError(_with_note(f"[Compile::eval_cpu] Failed to compile function {name}: no "
                                    f"temporary build folder ({e})", note)) from None
    try:
        try:
            out, ms = build(tc, name, source, workdir)
        except BuildError as e:
            raise type(e)(_with_note(str(e), note)) from None
        if cache.writable:
            try:
                disk_cache.store(paths, out, source, {
                    "name": name, "source_sha256": _source_hash(tc, source),
                    "compiler": tc.version, "flags": tc.flags})
                lib, fn = _open(paths[0], name)
                return lib, fn, paths[0], ms, "built", ""
            except (OSError, AttributeError) as e:  # disk full, quota, read-only or noexec mount
                note = (f"the kernel folder {cache.folder} could not take the library "
                        f"({getattr(e, 'strerror', None) or e})")
        try:
            lib, fn = _open(out, name)
        except (OSError, AttributeError) as err:
            raise BuildError(_with_note(f"[Compile::eval_cpu] Failed to load compiled function "
                                        f"{name}\n{err}", note)) from None
        return lib, fn, None, ms, "temp", f"{note}: built in a temporary folder"
    finally:
        disk_cache.remove_build_dir(workdir)


def _with_note(message: str, note: str) -> str:
    return f"{message} (and the disk cache was not usable: {note})" if note else message


def _source_hash(tc: Toolchain, source: str) -> str:
    return disk_cache.sha256((tc.ident + "\n" + source).encode())


def _record(kind: str, t0: int, name: str, **detail) -> None:
    if timeline.enabled:
        timeline.add(kind, t0, timeline.now(), name=name, device="cpu", detail=detail)


def get_kernel(name: str, variant: str, source_fn: Callable[[Toolchain], str],
               key: Optional[str] = None, tape: Optional[object] = None,
               build: bool = True) -> Optional[KernelEntry]:
    """The loaded kernel ``name``, building it on a miss; raises BuildError without one.

    Double-checked: a lock-free lookup first, then under the kernel's own lock again before
    building, so different kernels build in parallel (``tiered.prebuild`` starts a batch)
    while one kernel is never built twice.
    ``key`` (default: the name) is what the in-process cache is keyed by: MLX's kernel name
    does not say which tape nodes are outputs, so tapes that differ only there need their
    own entries (the C symbol keeps MLX's name; the disk file is told apart by its source hash).
    ``tape`` is kept on the entry (the viz renders its other dialects from it).
    ``build=False``: only load it (from memory or the disk cache); None when it would have
    to be built.
    """
    key = key or name
    t0 = timeline.now() if timeline.enabled else 0
    e = _kernels.get(key)
    if e is not None and e.fn is not None:
        e.hits += 1
        if t0:
            _record("kernel_build", t0, name, hit=True, origin="memory", runtime="cpu",
                    variant=variant, compile_ms=0.0)
        return e
    with _lock:
        klock = _key_locks.get(key)
        if klock is None:
            klock = _key_locks[key] = threading.Lock()
    with klock:
        e = _kernels.get(key)
        if e is not None and e.fn is not None:
            e.hits += 1
            return e
        if key in _failed:
            raise BuildError(_failed[key])
        try:
            tc = toolchain()
        except OSError as err:  # the probe needs a temporary folder
            raise BuildError(f"the C compiler could not be probed: no temporary folder ({err})"
                             ) from None
        if tc is None:
            raise BuildError("no C compiler on PATH (cc, gcc or clang)")
        source = source_fn(tc)
        shash = _source_hash(tc, source)
        cache = disk_cache.open_cache(tc.ident)
        paths = disk_cache.entry_paths(cache.folder, name, shash) if cache.folder else None
        loaded = None
        if paths is not None and disk_cache.verified(paths, shash):
            try:
                loaded = (*_open(paths[0], name), paths[0], 0.0, "disk", "")
            except (OSError, AttributeError):
                loaded = None  # unloadable on disk: rebuilt
        if loaded is None:
            if not build:
                return None
            try:
                try:
                    loaded = _build_and_load(tc, name, source, cache, paths)
                except BuildError as first:
                    if not tc.remembered or isinstance(first, BuildInterrupted):
                        raise
                    # the remembered probe may be stale (a changed linker, libmvec gone):
                    # probe again, and build once more with what the compiler takes now
                    forget_probe()
                    tc = toolchain()
                    if tc is None:
                        raise
                    source = source_fn(tc)
                    cache = disk_cache.open_cache(tc.ident)
                    paths = (disk_cache.entry_paths(cache.folder, name, _source_hash(tc, source))
                             if cache.folder else None)
                    loaded = _build_and_load(tc, name, source, cache, paths)
            except BuildError as err:
                if not isinstance(err, BuildInterrupted):
                    with _lock:
                        _failed[key] = str(err)
                raise
        lib, fn, path, ms, origin, note = loaded
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = None
        with _lock:
            e = _kernels.get(key)
            if e is None:
                e = KernelEntry(name, "cpu", variant, source, tape=tape)
            e.runtime = "cpu"  # an entry that ran interpreted until now has its kernel
            e.source, e.fn, e.lib, e.build_ms, e.origin = source, fn, lib, ms, origin
            e.disk_path, e.cache_note = (str(path) if path is not None else None), note
            e.misses += 1
            _kernels[key] = e
    if t0:
        _record("kernel_build", t0, name, hit=False, origin=origin, runtime="cpu",
                variant=variant, compile_ms=ms, cache=note)
    return e


def failed(key: str) -> Optional[str]:
    """Why the kernel under ``key`` could not be built (None: it did not fail)."""
    return _failed.get(key)


def clear(disk: bool = False) -> None:
    """Forget every in-process kernel; with ``disk=True`` also delete the on-disk cache
    (except folders their owner made read-only). Background builds still running (tiered
    calls, an eval's parallel prebuild) are waited for first: one finishing after the clear
    would put its kernel back."""
    from . import tiered

    tiered.wait(timeout=120)
    with _lock:
        _kernels.clear()
        _toolchains.clear()
        _failed.clear()
        _key_locks.clear()
        _generation[0] += 1
    tiered.forget()
    kernel_call.forget()  # the generated kernels' call plans hold the cleared kernels
    if disk:
        disk_cache.clear()
