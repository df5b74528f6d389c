"""Build generated C with the system compiler and load it: in-process and on-disk caches.

The compiler (``$CC``, ``cc``, ``gcc`` or ``clang``) is found on PATH at run time. Kernels
build with optimisation, OpenMP and glibc's vector math (declared ``omp declare simd``),
and never with ``-ffast-math``: NaN, infinities, signed zeros and overflow behave as in
numpy (``-ffp-contract=off`` also keeps a*b+c from fusing into one rounding).

Caches: a dict keyed by kernel name (double-checked locking), and a private per-user
directory (mode 0700) holding ``lib<name>.so`` with a sidecar of hashes; a library is loaded
only when the sidecar's source hash matches and the file's own hash matches, so a truncated
or foreign file is rebuilt, never loaded. Files are written to a temporary name and renamed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .. import timeline

# -fno-trapping-math: no code here enables floating-point traps, and without it gcc will not
# if-convert a NaN-propagating select (Maximum, Minimum, ...), leaving the whole loop, and every
# math call in it, scalar ("control flow in loop"). Values are unchanged: NaN, inf, signed zeros
# and rounding stay IEEE (that would take -ffast-math's other parts, which are never used).
BASE_FLAGS = ["-std=gnu11", "-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math",
              "-ffp-contract=off", "-fwrapv", "-w"]
MAX_NAME = 230  # MLX clips names over 245 chars (+ a hash); ours also carry ".<source hash>.json"


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
    disk_path: Optional[str] = None
    origin: str = ""  # "built" or "disk"
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


_lock = threading.Lock()
_kernels: dict[str, KernelEntry] = {}
_generation = [0]  # bumped by clear(): call plans holding an older kernel are rebuilt


def generation() -> int:
    """How many times the in-process cache was cleared (call plans compare it)."""
    return _generation[0]


def record_hit(name: str, variant: str) -> None:
    """Put an in-memory cache hit on the timeline (the fast call path's ``get_kernel``)."""
    if timeline.enabled:
        t0 = timeline.now()
        _record("kernel_build", t0, name, hit=True, origin="memory", runtime="cpu",
                variant=variant, compile_ms=0.0)
_toolchains: dict[tuple, Optional["Toolchain"]] = {}
_failed: dict[str, str] = {}  # kernel name -> why its build failed (not retried)


@dataclass
class Toolchain:
    """A working compiler and the flags it accepted."""

    path: str
    version: str
    flags: list
    libs: list
    vector_math: tuple

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
    """Probe the compiler on PATH once: which of -march=native, OpenMP, libmvec it takes."""
    cc = find_compiler()
    key = (cc, os.environ.get("PATH", ""))
    if key in _toolchains:
        return _toolchains[key]
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
                r = subprocess.run([cc, *BASE_FLAGS, *extra, str(src), "-o", str(out), *libs],
                                   capture_output=True, text=True, timeout=120)
                if r.returncode == 0:
                    try:
                        ctypes.CDLL(str(out))
                    except OSError:
                        continue
                    tc = Toolchain(cc, ver, BASE_FLAGS + extra, libs, vmath)
                    break
    _toolchains[key] = tc
    return tc


def cache_dir() -> Optional[Path]:
    """The private per-user on-disk kernel cache (mode 0700), or None if unusable.

    ``$TAPESCOPE_CACHE_DIR`` overrides; else platformdirs' user cache dir when installed,
    else ``$XDG_CACHE_HOME`` or ``~/.cache``, under ``tapescope/kernels``.
    """
    base = os.environ.get("TAPESCOPE_CACHE_DIR")
    if base:
        root = Path(base)
    else:
        try:
            import platformdirs

            root = Path(platformdirs.user_cache_dir("tapescope")) / "kernels"
        except ImportError:
            xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            root = Path(xdg) / "tapescope" / "kernels"
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = root.stat()
        if st.st_uid != os.getuid():
            return None
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(root, 0o700)
    except OSError:
        return None
    return root


def file_stem(name: str) -> str:
    """The file name for a kernel (MLX's rule: long names clipped, plus a hash of the rest)."""
    if len(name) <= MAX_NAME:
        return name
    cut = MAX_NAME - 16
    return name[:cut] + "_" + hashlib.sha256(name[cut:].encode()).hexdigest()[:15]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _trusted(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _disk_paths(tc: Toolchain, name: str, source_hash: str) -> Optional[tuple]:
    root = cache_dir()
    if root is None:
        return None
    d = root / tc.ident
    try:
        d.mkdir(exist_ok=True, mode=0o700)
    except OSError:
        return None
    stem = file_stem(name)
    # the source hash is in the library's name: a process that already loaded an older
    # build under the same kernel name would otherwise get that one back from dlopen
    tag = source_hash[:12]
    return d / f"lib{stem}.{tag}.so", d / f"{stem}.{tag}.json", d / f"{stem}.{tag}.c"


def _load_from_disk(paths: tuple, source_hash: str) -> bool:
    """True when the library on disk was built by us from this exact source, intact."""
    so, meta, _ = paths
    if not (_trusted(so) and _trusted(meta)):
        return False
    try:
        info = json.loads(meta.read_text())
        return info.get("source_sha256") == source_hash and info.get("so_sha256") == _sha(so.read_bytes())
    except (OSError, ValueError):
        return False


def build(tc: Toolchain, name: str, source: str, paths: Optional[tuple]) -> tuple:
    """Compile ``source`` to a shared library; returns (path, build ms). Raises BuildError."""
    t0 = time.perf_counter()
    workdir = paths[0].parent if paths else Path(tempfile.mkdtemp(prefix="tapescope-"))
    fd, src = tempfile.mkstemp(dir=workdir, prefix=".src-", suffix=".c")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    fd, out = tempfile.mkstemp(dir=workdir, prefix=".lib-", suffix=".so")
    os.close(fd)
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
        raise BuildError(f"[Compile::eval_cpu] Failed to compile function {name}: Failed to "
                         f"execute command with return code {r.returncode}: \"{' '.join(cmd)}\", "
                         f"the output is: {r.stdout}{r.stderr}")
    ms = (time.perf_counter() - t0) * 1000
    if paths is None:
        return Path(out), ms
    so, meta, csrc = paths
    os.chmod(out, 0o600)
    os.replace(out, so)
    data = so.read_bytes()
    _atomic_write(csrc, source.encode())
    _atomic_write(meta, json.dumps({"name": name, "source_sha256": _source_hash(tc, source),
                                    "so_sha256": _sha(data), "compiler": tc.version,
                                    "flags": tc.flags}).encode())
    return so, ms


def _source_hash(tc: Toolchain, source: str) -> str:
    return _sha((tc.ident + "\n" + source).encode())


def _record(kind: str, t0: int, name: str, **detail) -> None:
    if timeline.enabled:
        timeline.add(kind, t0, timeline.now(), name=name, device="cpu", detail=detail)


def get_kernel(name: str, variant: str, source_fn: Callable[[Toolchain], str],
               key: Optional[str] = None) -> KernelEntry:
    """The loaded kernel ``name``, building it on a miss; raises BuildError without one.

    Double-checked: a lock-free lookup first, then under the lock again before building.
    ``key`` (default: the name) is what the in-process cache is keyed by: MLX's kernel name
    does not say which tape nodes are outputs, so tapes that differ only there need their
    own entries (the C symbol keeps MLX's name; the disk file is told apart by its source hash).
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
        e = _kernels.get(key)
        if e is not None and e.fn is not None:
            e.hits += 1
            return e
        if key in _failed:
            raise BuildError(_failed[key])
        tc = toolchain()
        if tc is None:
            raise BuildError("no C compiler on PATH (cc, gcc or clang)")
        source = source_fn(tc)
        shash = _source_hash(tc, source)
        paths = _disk_paths(tc, name, shash)
        origin, ms, path = "disk", 0.0, None
        if paths is not None and _load_from_disk(paths, shash):
            path = paths[0]
        if path is None:
            try:
                path, ms = build(tc, name, source, paths)
            except BuildError as err:
                _failed[key] = str(err)
                raise
            origin = "built"
        try:
            lib = ctypes.CDLL(str(path))
            fn = getattr(lib, name)
        except (OSError, AttributeError) as err:
            if origin == "disk":  # unloadable on disk: rebuild once
                path, ms = build(tc, name, source, paths)
                origin = "built"
                lib = ctypes.CDLL(str(path))
                fn = getattr(lib, name)
            else:
                raise BuildError(f"[Compile::eval_cpu] Failed to load compiled function {name}\n{err}") from None
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = None
        if e is None:
            e = KernelEntry(name, "cpu", variant, source)
        e.source, e.fn, e.lib, e.build_ms, e.origin = source, fn, lib, ms, origin
        e.disk_path = str(path) if paths is not None else None
        e.misses += 1
        _kernels[key] = e
    if t0:
        _record("kernel_build", t0, name, hit=False, origin=origin, runtime="cpu",
                variant=variant, compile_ms=ms)
    return e


def note_fallback(name: str, variant: str, source: str, reason: str) -> None:
    """Count a tape that ran interpreted (no compiler, failed build, unsupported op)."""
    with _lock:
        e = _kernels.get(name)
        if e is None:
            e = _kernels[name] = KernelEntry(name, "numpy", variant, source)
        e.misses += 1
        e.origin = f"fallback: {reason}"


def entries() -> list:
    """Every kernel in the in-process cache."""
    with _lock:
        return list(_kernels.values())


def clear(disk: bool = False) -> None:
    """Forget every in-process kernel; with ``disk=True`` also delete the on-disk cache."""
    with _lock:
        _kernels.clear()
        _toolchains.clear()
        _failed.clear()
        _generation[0] += 1
    if disk:
        root = cache_dir()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
