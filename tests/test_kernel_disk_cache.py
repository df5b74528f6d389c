"""The on-disk kernel cache on odd file systems: a read-only, full, shared, foreign or
misplaced cache never breaks a compiled call. The kernel is built in a private temporary
folder instead (or, when even that fails, the tape runs interpreted), the reason is on the
timeline and in ``kernel_cache()``, no folder's mode is changed, and no build folder is left
in the temporary directory.

Tests may run as root, whom the system lets write into a mode-0500 folder: the cache honours
the owner's write bit itself, so the mode tests are real for everyone; failures only the
system can produce (a full disk, a refused write, an unreadable file for root) are simulated
and say so in their names, and the real-permission twins skip under root.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest

import tapescope
import tapescope.core as mx
from tapescope.kernels import disk_cache
from tapescope.kernels.cpu import compiler

ROOT = os.geteuid() == 0
needs_compiler = pytest.mark.skipif(compiler.toolchain() is None, reason="no C compiler")
pytestmark = needs_compiler


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A fresh cache root and a fresh, empty temporary directory (for Python and the compiler)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TAPESCOPE_CACHE_DIR", str(tmp_path / "kcache"))
    tapescope.clear_kernel_cache()
    yield tmp_path
    tapescope.clear_kernel_cache()
    for p in (tmp_path / "kcache", *(tmp_path / "kcache").glob("*")):  # let pytest delete it
        if p.is_dir() and not p.is_symlink() and p.stat().st_uid == os.geteuid():
            os.chmod(p, 0o700)


def _kernel_folder(root: Path) -> Path:
    return root / compiler.toolchain().ident


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


XN = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
YN = np.linspace(0.5, 3, 6, dtype=np.float32)


def _call() -> tuple:
    """Run a fused chain (a kernel miss) under a recording; (timeline records, this kernel's
    ``kernel_cache()`` entry). Checks the values against numpy."""
    with tapescope.record() as rec:
        out = mx.compile(lambda x, y: mx.tanh(x) * y + mx.exp(x * 0.5))(mx.array(XN), mx.array(YN))
        mx.eval(out)
    x, y = XN.astype(np.float64), YN.astype(np.float64)
    np.testing.assert_allclose(np.array(out), np.tanh(x) * y + np.exp(x * 0.5), rtol=1e-5, atol=1e-6)
    (entry,) = [e for e in tapescope.kernel_cache() if "Tanh" in e["name"]]
    return rec.records, entry


def _built(records: list) -> dict:
    (r,) = [r for r in records if r.kind == "kernel_build" and not r.detail["hit"]]
    return r.detail


def _temp_listing(tmp_path: Path) -> list:
    return sorted(os.listdir(tmp_path / "tmp"))


def _watch_build_dirs(monkeypatch) -> list:
    """Record the mode of every build folder when it is made."""
    made = []
    real = disk_cache.new_build_dir

    def spy(cache):
        d = real(cache)
        made.append((d, _mode(d)))
        return d

    monkeypatch.setattr(disk_cache, "new_build_dir", spy)
    return made


def _assert_built_in_temp(records, entry, reason, made) -> None:
    detail = _built(records)
    assert detail["origin"] == "temp" and reason in detail["cache"]
    assert entry["origin"] == "temp" and reason in entry["cache_note"] and entry["runtime"] == "cpu"
    assert entry["disk_path"] is None
    assert len(made) == 1 and made[0][1] == 0o700 and not made[0][0].exists()


# -- a kernel folder the user made read-only -------------------------------------------------

def test_read_only_kernel_folder_builds_in_private_temp_folder_leaving_nothing(env, monkeypatch):
    folder = _kernel_folder(env / "kcache")
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(env / "kcache", 0o700)
    os.chmod(folder, 0o500)
    made = _watch_build_dirs(monkeypatch)
    assert _temp_listing(env) == []
    records, entry = _call()
    _assert_built_in_temp(records, entry, "is read-only", made)
    assert _mode(folder) == 0o500 and os.listdir(folder) == []
    assert _temp_listing(env) == []
    # the next call is an in-memory hit on the same kernel
    _, again = _call()
    assert again["hits"] == 1 and again["misses"] == 1


def test_read_only_kernel_folder_still_serves_kernels_cached_before(env):
    _, first = _call()
    assert first["origin"] == "built"
    folder = Path(first["disk_path"]).parent
    tapescope.clear_kernel_cache()
    os.chmod(folder, 0o500)
    records, entry = _call()
    assert entry["origin"] == "disk" and entry["disk_path"] == first["disk_path"]
    assert _built(records)["cache"] == ""
    assert _mode(folder) == 0o500 and _temp_listing(env) == []


def test_clear_kernel_cache_on_disk_keeps_a_read_only_folder(env):
    _, first = _call()
    folder = Path(first["disk_path"]).parent
    other = env / "kcache" / "other-toolchain"
    other.mkdir(mode=0o700)
    os.chmod(folder, 0o500)
    tapescope.clear_kernel_cache(disk=True)
    assert os.path.exists(first["disk_path"]) and _mode(folder) == 0o500
    assert not other.exists()


# -- the cache root and its folders: read-only, a file, shared, foreign ----------------------

def _cache_root_read_only(env, monkeypatch):
    root = env / "kcache"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o500)
    return root, 0o500, "is read-only"


def _cache_path_is_a_file(env, monkeypatch):
    root = env / "kcache"
    root.write_text("not a folder")
    return root, None, "is not a directory"


def _cache_parent_is_a_file(env, monkeypatch):
    (env / "afile").write_text("x")
    monkeypatch.setenv("TAPESCOPE_CACHE_DIR", str(env / "afile" / "kcache"))
    return env / "afile", None, "cannot be created"


def _cache_root_group_world_readable(env, monkeypatch):
    root = env / "kcache"
    root.mkdir()
    os.chmod(root, 0o755)
    return root, 0o755, "group/world permissions"


def _kernel_folder_group_writable(env, monkeypatch):
    root = env / "kcache"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o700)
    folder = _kernel_folder(root)
    folder.mkdir()
    os.chmod(folder, 0o770)
    return folder, 0o770, "group/world permissions"


CASES = [_cache_root_read_only, _cache_path_is_a_file, _cache_parent_is_a_file,
         _cache_root_group_world_readable, _kernel_folder_group_writable]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.lstrip("_") for c in CASES])
def test_unusable_cache_builds_in_temp_folder_with_reason_and_mode_unchanged(env, monkeypatch, case):
    made = _watch_build_dirs(monkeypatch)
    path, mode, reason = case(env, monkeypatch)
    records, entry = _call()
    _assert_built_in_temp(records, entry, reason, made)
    if mode is not None:  # a folder: its mode unchanged, nothing written into it
        assert _mode(path) == mode and [p for p in path.rglob("*") if p.is_file()] == []
    else:
        assert path.read_text() in ("not a folder", "x")
    assert _temp_listing(env) == []


@pytest.mark.skipif(not ROOT, reason="chown to another user needs root")
def test_cache_owned_by_another_user_is_not_used_real_chown(env, monkeypatch):
    root = env / "kcache"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    made = _watch_build_dirs(monkeypatch)
    records, entry = _call()
    _assert_built_in_temp(records, entry, "belongs to another user", made)
    assert os.stat(root).st_uid == 65534 and os.listdir(root) == []
    assert _temp_listing(env) == []


def test_cache_owned_by_another_user_is_not_used_simulated_uid(env, monkeypatch):
    root = env / "kcache"
    root.mkdir(mode=0o700)
    me = os.geteuid()
    monkeypatch.setattr(disk_cache.os, "geteuid", lambda: me + 4242)  # we "are" someone else
    made = _watch_build_dirs(monkeypatch)
    records, entry = _call()
    _assert_built_in_temp(records, entry, "belongs to another user", made)
    assert os.listdir(root) == [] and _temp_listing(env) == []


# -- the system refuses a write: disk full, quota, permission, read-only mount (simulated) --

@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS],
                         ids=errno.errorcode.get)
def test_write_refused_by_system_simulated_falls_back_to_temp_folder(env, monkeypatch, code):
    def refuse(path, data):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(disk_cache, "_atomic_write", refuse)
    made = _watch_build_dirs(monkeypatch)
    records, entry = _call()
    _assert_built_in_temp(records, entry, os.strerror(code), made)
    folder = _kernel_folder(env / "kcache")
    assert os.listdir(folder) == []  # nothing half-written left in the cache
    assert _temp_listing(env) == []


def test_sidecar_write_fails_simulated_disk_full_removes_the_stored_library(env, monkeypatch):
    real = disk_cache._atomic_write

    def full_on_sidecar(path, data):
        if path.suffix == ".json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(disk_cache, "_atomic_write", full_on_sidecar)
    made = _watch_build_dirs(monkeypatch)
    records, entry = _call()
    _assert_built_in_temp(records, entry, os.strerror(errno.ENOSPC), made)
    assert os.listdir(_kernel_folder(env / "kcache")) == [] and _temp_listing(env) == []


# -- no temporary folder either ---------------------------------------------------------------

def test_read_only_cache_and_no_temp_folder_runs_interpreted_with_reason(env, monkeypatch):
    compiler.toolchain()  # probed while the temporary directory still works
    root = env / "kcache"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o500)
    monkeypatch.setattr(tempfile, "tempdir", str(env / "gone"))
    records, entry = _call()
    (fb,) = [r for r in records if r.kind == "kernel_fallback"]
    assert "no temporary build folder" in fb.detail["reason"] and "is read-only" in fb.detail["reason"]
    assert entry["runtime"] == "numpy" and "no temporary build folder" in entry["origin"]
    assert _mode(root) == 0o500 and os.listdir(root) == []
    assert not (env / "gone").exists() and _temp_listing(env) == []


def test_no_temp_folder_before_the_compiler_was_probed_runs_interpreted_with_reason(env, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(env / "gone"))  # the probe needs one too
    records, entry = _call()
    (fb,) = [r for r in records if r.kind == "kernel_fallback"]
    assert "could not be probed" in fb.detail["reason"] and entry["runtime"] == "numpy"
    assert not (env / "gone").exists() and _temp_listing(env) == []


def test_writable_cache_and_no_temp_folder_builds_inside_the_cache(env, monkeypatch):
    compiler.toolchain()
    monkeypatch.setattr(tempfile, "tempdir", str(env / "gone"))
    records, entry = _call()
    assert entry["origin"] == "built" and _built(records)["cache"] == ""
    folder = Path(entry["disk_path"]).parent
    assert not [n for n in os.listdir(folder) if n.startswith(".")]  # its build folder is gone


# -- an unreadable cached library is rebuilt --------------------------------------------------

@pytest.mark.skipif(ROOT, reason="root reads a mode-000 file; see the simulated twin")
def test_unreadable_cached_library_is_rebuilt_real_permissions(env):
    _, first = _call()
    os.chmod(first["disk_path"], 0)
    tapescope.clear_kernel_cache()
    _, entry = _call()
    assert entry["origin"] == "built" and entry["disk_path"] == first["disk_path"]
    assert os.access(first["disk_path"], os.R_OK)


def test_unreadable_cached_library_is_rebuilt_simulated_read_error(env, monkeypatch):
    _, first = _call()
    tapescope.clear_kernel_cache()
    real = Path.read_bytes

    def unreadable(self):
        if str(self) == first["disk_path"] and unreadable.armed:
            unreadable.armed = False  # the rebuild reads its own new copy
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self)

    unreadable.armed = True
    monkeypatch.setattr(Path, "read_bytes", unreadable)
    _, entry = _call()
    assert not unreadable.armed
    assert entry["origin"] == "built" and entry["disk_path"] == first["disk_path"]


# -- build folders that cannot be removed at once go at exit ----------------------------------

def test_build_folder_left_by_a_failed_removal_is_removed_at_exit(env, monkeypatch):
    d = Path(tempfile.mkdtemp(prefix=disk_cache.BUILD_PREFIX))
    (d / "libx.so").write_bytes(b"x")
    with monkeypatch.context() as m:
        m.setattr(disk_cache.shutil, "rmtree", lambda *a, **k: None)  # as Windows would
        disk_cache.remove_build_dir(d)
    assert d.exists() and d in disk_cache._leftover
    disk_cache._remove_leftovers()
    assert not d.exists() and d not in disk_cache._leftover
