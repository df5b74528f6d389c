"""The on-disk kernel cache, and the temporary folders kernels are built in.

The cache is a private per-user folder (mode 0700) with one subfolder per toolchain holding
``lib<name>.<tag>.so``, its C source and a sidecar of hashes. A folder is used only when it
is a directory of this user with no group or world permissions (anyone else who can write
there could swap a library under us). A folder whose owner took away its write bit is read
(its kernels still load) but never written and never chmod'ed, for root too, whom the
system would let write anyway. Every such problem becomes a reason that the kernel's
``kernel_build`` record and its ``kernel_cache()`` entry carry.

Kernels compile in a new private temporary folder (``tempfile.mkdtemp``: mode 0700) and are
copied into the cache; when the cache cannot take them (read-only, full, not ours) they are
loaded from that folder instead. The folder is removed as soon as the library is loaded
(Linux and macOS let a loaded library be unlinked), or else at exit.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .settings import settings

MAX_NAME = 230  # MLX clips names over 245 chars (+ a hash); ours also carry ".<source hash>.json"
BUILD_PREFIX = "tapescope-build-"


@dataclass
class DiskCache:
    """One toolchain's folder of the cache and what this process may do with it."""

    folder: Optional[Path]  # where its libraries are read from; None: not used at all
    writable: bool
    reason: str = ""  # why it is not used, or not written ("" when it is both)


def cache_root() -> Path:
    """Where the cache is configured to live (it may not exist yet).

    ``$TAPESCOPE_CACHE_DIR`` overrides; else platformdirs' user cache dir when installed,
    else ``$XDG_CACHE_HOME`` or ``~/.cache``, under ``tapescope/kernels``.
    """
    base = settings.cache_dir
    if base:
        return Path(base)
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("tapescope")) / "kernels"
    except ImportError:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(xdg) / "tapescope" / "kernels"


def _unusable(path: Path, what: str) -> str:
    """Why the folder ``path`` cannot hold kernels ("" when it can)."""
    try:
        st = path.stat()
    except OSError as e:
        return f"{what} {path} cannot be read ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} {path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{what} {path} belongs to another user (uid {st.st_uid})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return (f"{what} {path} has group/world permissions ({mode:04o}); only a private "
                f"folder (0700) is used")
    return ""


def _read_only(path: Path) -> bool:
    """The owner took away ``path``'s write (or search) bit, or the system refuses writes
    there (a read-only mount, an ACL). The bits count for root too."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return True
    if not (mode & stat.S_IWUSR and mode & stat.S_IXUSR):
        return True
    return not os.access(path, os.W_OK | os.X_OK)


def _make(path: Path, what: str, parents: bool = False) -> str:
    """Create the folder ``path`` with mode 0700 unless something is there; "" or why not."""
    if os.path.lexists(path):
        return ""
    if os.path.isdir(path.parent) and _read_only(path.parent):
        return f"{what} {path} cannot be created: {path.parent} is read-only"
    try:
        path.mkdir(parents=parents, exist_ok=True, mode=0o700)
    except OSError as e:
        return f"{what} {path} cannot be created ({e.strerror})"
    return ""


def cache_dir() -> Optional[Path]:
    """The cache's root folder (created when missing), or None when it cannot be used."""
    root = cache_root()
    if _make(root, "the kernel cache", parents=True) or _unusable(root, "the kernel cache"):
        return None
    return root


def open_cache(ident: str) -> DiskCache:
    """The cache folder of the toolchain ``ident``: created when missing and allowed, and
    whether it may be read and written (with the reason when not)."""
    root = cache_root()
    why = _make(root, "the kernel cache", parents=True) or _unusable(root, "the kernel cache")
    if why:
        return DiskCache(None, False, why)
    folder = root / ident
    if not os.path.lexists(folder):
        if _read_only(root):
            return DiskCache(None, False, f"the kernel cache {root} is read-only")
        why = _make(folder, "the kernel folder")
        if why:
            return DiskCache(None, False, why)
    why = _unusable(folder, "the kernel folder")
    if why:
        return DiskCache(None, False, why)
    if _read_only(folder):
        return DiskCache(folder, False, f"the kernel folder {folder} is read-only")
    return DiskCache(folder, True)


def file_stem(name: str) -> str:
    """The file name for a kernel (MLX's rule: long names clipped, plus a hash of the rest)."""
    if len(name) <= MAX_NAME:
        return name
    cut = MAX_NAME - 16
    return name[:cut] + "_" + hashlib.sha256(name[cut:].encode()).hexdigest()[:15]


def entry_paths(folder: Path, name: str, source_hash: str) -> tuple:
    """``(library, sidecar, C source)`` of a kernel in ``folder``."""
    stem = file_stem(name)
    # the source hash is in the library's name: a process that already loaded an older
    # build under the same kernel name would otherwise get that one back from dlopen
    tag = source_hash[:12]
    return folder / f"lib{stem}.{tag}.so", folder / f"{stem}.{tag}.json", folder / f"{stem}.{tag}.c"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def trusted(path: Path) -> bool:
    """The file is this user's and nobody else may write it."""
    return _trusted(path)


def unusable(path: Path) -> str:
    """Why the folder ``path`` cannot hold our files ("" when it can: a private folder of ours)."""
    return _unusable(path, "the folder")


def read_only(path: Path) -> bool:
    """Whether the folder ``path`` may not be written (see ``_read_only``)."""
    return _read_only(path)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file and a rename (readers never see half of it)."""
    _atomic_write(path, data)


def _trusted(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def verified(paths: tuple, source_hash: str) -> bool:
    """True when the library on disk was built by us from this exact source, intact (an
    unreadable, truncated or foreign file is not)."""
    so, meta, _ = paths
    if not (_trusted(so) and _trusted(meta)):
        return False
    try:
        info = json.loads(meta.read_text())
        return (info.get("source_sha256") == source_hash
                and info.get("so_sha256") == sha256(so.read_bytes()))
    except (OSError, ValueError):
        return False


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


def store(paths: tuple, library: Path, source: str, meta: dict) -> None:
    """Copy a built library into the cache with its source and sidecar, each written to a
    temporary name and renamed, the sidecar last; on any error (disk full, quota, a
    read-only mount, an interrupt between two files) what was written is removed and the
    error raised, so the cache never holds half an entry."""
    so, side, csrc = paths
    data = library.read_bytes()
    written = []
    try:
        for path, content in ((so, data), (csrc, source.encode()),
                              (side, json.dumps({**meta, "so_sha256": sha256(data)}).encode())):
            _atomic_write(path, content)
            written.append(path)
    except BaseException:
        for path in written:
            try:
                path.unlink()
            except OSError:
                pass
        raise


# -- temporary build folders ------------------------------------------------------------

_leftover: set = set()  # build folders that could not be removed yet (retried at exit)


def new_build_dir(cache: DiskCache) -> Path:
    """A new private (0700) folder to compile in: in the temporary directory, else (when
    that cannot be written) inside a writable cache folder. Raises OSError."""
    try:
        return Path(tempfile.mkdtemp(prefix=BUILD_PREFIX))
    except OSError:
        if not cache.writable:
            raise
    return Path(tempfile.mkdtemp(prefix="." + BUILD_PREFIX, dir=cache.folder))


def remove_build_dir(folder: Path) -> None:
    """Delete a build folder (the library in it may be loaded); what cannot go now goes at exit."""
    shutil.rmtree(folder, ignore_errors=True)
    if os.path.lexists(folder):
        _leftover.add(folder)


@atexit.register
def _remove_leftovers() -> None:
    for folder in list(_leftover):
        shutil.rmtree(folder, ignore_errors=True)
        _leftover.discard(folder)


def clear() -> None:
    """Delete the cached kernels, except in folders the owner made read-only."""
    root = cache_dir()
    if root is None or _read_only(root):
        return
    for folder in root.iterdir():
        if folder.name.startswith("toolchain-") and folder.suffix == ".json":
            try:  # a remembered compiler probe (compiler.py): probed again next time
                folder.unlink()
            except OSError:
                pass
        elif folder.is_dir() and not folder.is_symlink():
            if not _unusable(folder, "") and not _read_only(folder):
                shutil.rmtree(folder, ignore_errors=True)
