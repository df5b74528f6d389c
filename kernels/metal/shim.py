"""Run Metal Shading Language on the CPU through the shim header (a test tool).

``shim/metal_shim.h`` maps MSL onto C++ (its docstring says how far); this module compiles
MSL sources with the system C++ compiler against it and runs a kernel over its launch grid
(``dispatchThreads(grid, threadgroup)``) on numpy buffers bound by index, so generated MSL is
verified on machines without an Apple GPU. It is not the Metal runtime (``runtime.py``):
nothing here says how fast a GPU runs the kernel.

``Library(pieces, entries)`` builds one shared object from several MSL sources (each in its
own namespace) and one launcher per entry; builds are cached on disk by a hash of everything
that goes into them (the private kernel-cache folder of ``kernels/disk_cache``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..settings import settings

HERE = Path(__file__).parent / "shim"
HEADER = HERE / "metal_shim.h"
FLAGS = ["-std=gnu++17", "-O0", "-fPIC", "-shared", "-fno-strict-aliasing", "-fwrapv",
         "-fsingle-precision-constant",  # Metal has no double: 1.0 is a float
         "-Wno-attributes", "-w"]

METAL_HEADERS = ("metal_stdlib", "metal_math", "metal_integer", "metal_atomic",
                 "metal_simdgroup", "metal_compute", "metal_common", "metal_logging")
# the attributes the launcher can give (Table 5.8 of the MSL specification; a subset)
ATTRIBUTES = {
    "thread_position_in_grid": "ts_t.pos_grid", "threads_per_grid": "ts_t.grid_size",
    "grid_size": "ts_t.grid_size", "thread_position_in_threadgroup": "ts_t.pos_tg",
    "threadgroup_position_in_grid": "ts_t.tg_pos", "threads_per_threadgroup": "ts_t.tg_size",
    "dispatch_threads_per_threadgroup": "ts_t.tg_size",
    "threadgroups_per_grid": "ts_t.n_tg", "thread_index_in_threadgroup": "ts_t.index_tg",
    "thread_index_in_simdgroup": "ts_t.simd_lane", "simdgroup_index_in_threadgroup":
    "ts_t.simd_group", "simdgroups_per_threadgroup": "ts_t.n_simd",
    "dispatch_simdgroups_per_threadgroup": "ts_t.n_simd",
    "threads_per_simdgroup": "ts_simd_width", "thread_execution_width": "ts_simd_width",
    "grid_origin": "uint3(0, 0, 0)",
}
_COOPERATIVE = re.compile(r"\b(simd_\w+|threadgroup_barrier|simdgroup_barrier)\s*\(|"
                          r"\bTS_THREADGROUP_ARRAY\b")
# a threadgroup variable that is not an array declared in a kernel's body
_THREADGROUP_MEMORY = re.compile(r"\bthreadgroup\s+[\w:<>, ]+\s+\w+\s*(;|=)")
_THREADGROUP_ARRAY = re.compile(r"(?m)^([ \t]*)threadgroup\s+([\w:<>, ]+?)\s+(\w+)\s*(\[[^;]*\])\s*;")


def threadgroup_arrays(src: str) -> str:
    """A kernel's ``threadgroup T name[N];`` as a static array: one threadgroup runs at a
    time on the shim's one OS thread, so its threads (fibers) share it, as on a GPU."""
    return _THREADGROUP_ARRAY.sub(r"\1TS_THREADGROUP_ARRAY \2 \3\4;", src)


def enabled() -> bool:
    """Whether ``mx.fast.metal_kernel`` runs through the shim where there is no Metal
    (``settings.metal_shim``; tapescope's extension, off by default, as MLX raises "No
    Metal back-end")."""
    return settings.metal_shim


def enable(on: bool = True) -> bool:
    """Turn the shim path of ``mx.fast.metal_kernel`` on or off (``settings.metal_shim``,
    whose initial value ``TAPESCOPE_METAL_SHIM`` gives); returns the previous setting."""
    old = settings.metal_shim
    settings.metal_shim = bool(on)
    return old


class ShimError(RuntimeError):
    """The shim cannot compile or run this source (the message says why)."""


def compiler() -> Optional[str]:
    """The system C++ compiler on PATH (``$CXX``, g++, c++, clang++), or None."""
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _strip_comments(src: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", src, flags=re.S)


def _split_top(text: str) -> list:
    """Split at commas outside (), <>, [] and {}."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


@dataclass
class Param:
    """One kernel parameter: its C++ type text, name, and ``buffer`` index or attribute."""

    type: str
    name: str
    buffer: Optional[int] = None
    attribute: Optional[str] = None


def signature(source: str, name: str) -> list:
    """The parameters of kernel function ``name`` in ``source`` (its definition's list)."""
    src = _strip_comments(source)
    m = re.search(rf"\bvoid\s+{re.escape(name)}\s*\(", src)
    if m is None:
        raise ShimError(f"no kernel function named {name} in the source")
    i, depth = m.end(), 1
    j = i
    while depth:
        if src[j] == "(":
            depth += 1
        elif src[j] == ")":
            depth -= 1
        j += 1
    params, implicit = [], 0
    for text in _split_top(src[i:j - 1]):
        text = " ".join(text.split())
        attr = re.search(r"\[\[\s*(\w+)\s*(?:\((\d+)\))?\s*\]\]\s*$", text)
        decl = text[:attr.start()].strip() if attr else text
        pm = re.search(r"(\w+)\s*$", decl)
        ptype, pname = decl[:pm.start()].strip(), pm.group(1)
        if attr is None or attr.group(1) == "buffer":
            # a buffer without an index takes the next one, as Metal assigns them
            k = int(attr.group(2)) if attr else implicit
            implicit = k + 1
            params.append(Param(ptype, pname, buffer=k))
        elif attr.group(1) in ATTRIBUTES:
            params.append(Param(ptype, pname, attribute=attr.group(1)))
        else:
            raise ShimError(f"the shim has no [[{attr.group(1)}]]")
    return params


@dataclass
class Entry:
    """A kernel to launch: ``piece`` (index into the library's sources), the function's
    ``name``, its ``call`` expression (``name<float, 4>`` for a template; default ``name``)
    and ``defs``, C++ declarations the launcher needs first (``using T = float;``)."""

    piece: int
    name: str
    call: str = ""
    defs: str = ""
    decl: str = ""  # the text defining the kernel, when an included header holds it
    params: list = field(default_factory=list)
    cooperative: bool = False


_LOCK = threading.Lock()
_LOADED: dict = {}


def _cache_folder() -> Path:
    from .. import disk_cache

    root = disk_cache.cache_dir()
    if root is None:
        return Path(tempfile.mkdtemp(prefix="tapescope-shim-"))
    folder = root / "metal-shim"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


class Library:
    """MSL sources compiled together for the CPU, with a launcher per entry."""

    def __init__(self, pieces: Sequence[str], entries: Sequence[Entry]):
        cxx = compiler()
        if cxx is None:
            raise ShimError("no C++ compiler on PATH: the Metal shim needs g++ or clang++")
        parts = ['#include "metal_shim.h"\n']
        pieces = [threadgroup_arrays(src) for src in pieces]
        for k, src in enumerate(pieces):
            if _THREADGROUP_MEMORY.search(_strip_comments(src)):
                raise ShimError("the shim shares only threadgroup arrays declared in a kernel "
                                "(threadgroup T name[N];), not this use of threadgroup memory")
            # several sources: one namespace each (one source may include headers that
            # reopen namespace metal, so it stays at file scope)
            parts.append(f"namespace ts_piece{k} {{\n{src}\n}}\n" if len(pieces) > 1 else src + "\n")
        self.entries = list(entries)
        for i, e in enumerate(self.entries):
            src = pieces[e.piece]
            if not e.call:  # a template kernel's host_name instantiation names its arguments
                m = re.search(r'template\s*\[\[\s*host_name\(\s*"' + re.escape(e.name)
                              + r'"\s*\)\s*\]\]\s*\[\[kernel\]\]\s*decltype\(([^;]*)\)\s', src)
                e.call = m.group(1).strip() if m else e.name
            e.params = signature(e.decl or src, e.call.split("<")[0].strip())
            e.cooperative = bool(_COOPERATIVE.search(_strip_comments(src + e.decl)))
            parts.append(self._launcher(i, e, len(pieces) > 1))
        text = "".join(parts)
        key = hashlib.sha256((text + HEADER.read_text() + " ".join(FLAGS) + cxx).encode()).hexdigest()[:32]
        with _LOCK:
            lib = _LOADED.get(key)
            if lib is None:
                lib = _LOADED[key] = ctypes.CDLL(str(self._build(cxx, text, key)))
        self.lib = lib
        self.source = text

    @staticmethod
    def _launcher(i: int, e: Entry, spaced: bool) -> str:
        args = []
        for p in e.params:
            if p.buffer is not None:
                args.append(f"ts_buffer{{bufs[{p.buffer}]}}")
            else:
                args.append(f"ts_attribute{{uint3({ATTRIBUTES[p.attribute]})}}")
        space = f"ts_piece{e.piece}" if spaced else ""
        call = f"{space}::{e.call or e.name}"
        return (f"static void ts_body{i}(void** bufs) {{\n"
                + (f"  using namespace {space};\n" if spaced else "") + f"  {e.defs}\n"
                f"  {call}({', '.join(args)});\n}}\n"
                f'extern "C" void ts_entry{i}(void** bufs, const unsigned* g) {{\n'
                f"  ts_launch(uint3(g[0], g[1], g[2]), uint3(g[3], g[4], g[5]), "
                f"{'true' if e.cooperative else 'false'}, ts_body{i}, bufs);\n}}\n")

    @staticmethod
    def _build(cxx: str, text: str, key: str) -> Path:
        folder = _cache_folder()
        so = folder / f"shim-{key}.so"
        if so.exists():
            return so
        with tempfile.TemporaryDirectory(prefix="tapescope-shim-") as tmp:
            inc = Path(tmp) / "include"  # Metal's standard headers, each the shim
            inc.mkdir()
            for h in METAL_HEADERS:
                (inc / h).write_text('#include "metal_shim.h"\n')
            cpp = Path(tmp) / "kernels.cpp"
            cpp.write_text(text)
            out = Path(tmp) / "k.so"
            r = subprocess.run([cxx, *FLAGS, "-I", str(HERE), "-I", str(inc),
                                *os.environ.get("TAPESCOPE_SHIM_INCLUDE", "").split(),
                                str(cpp), "-o", str(out)],
                               capture_output=True, text=True)
            if r.returncode:
                raise ShimError(f"the Metal shim could not compile the source:\n{r.stderr[-6000:]}")
            tmp_so = folder / f".tmp-{key}-{os.getpid()}.so"
            shutil.copyfile(out, tmp_so)
            os.replace(tmp_so, so)
        return so

    def run(self, entry: int, buffers: dict, grid: Sequence[int],
            threadgroup: Sequence[int] = (1, 1, 1)) -> None:
        """Launch entry ``entry`` over ``grid`` threads in ``threadgroup``-sized groups, its
        buffers given by index (numpy arrays, written in place; C-contiguous)."""
        e = self.entries[entry]
        n = 1 + max([p.buffer for p in e.params if p.buffer is not None], default=-1)
        ptrs = (ctypes.c_void_p * max(n, 1))()
        keep = []
        for k in range(n):
            a = buffers.get(k)
            if a is None:
                raise ShimError(f"{e.name}: no array for buffer({k})")
            if not (isinstance(a, np.ndarray) and a.flags.c_contiguous):
                raise ShimError(f"{e.name}: buffer({k}) must be a C-contiguous numpy array")
            keep.append(a)
            ptrs[k] = a.ctypes.data if a.size else None
        g = [int(v) for v in grid] + [1] * (3 - len(grid))
        t = [max(1, min(int(v), gv)) for v, gv in zip(list(threadgroup) + [1] * (3 - len(threadgroup)), g)]
        if any(v <= 0 for v in g):
            return
        geom = (ctypes.c_uint * 6)(*g, *t)
        getattr(self.lib, f"ts_entry{entry}")(ptrs, geom)


# -- tapescope's own kernels on the shim ---------------------------------------------------
class TapeLibrary:
    """The MSL modules of several tapes (every variant of each) in one shared object."""

    def __init__(self, tapes: Sequence, variants: Optional[Sequence[tuple]] = None):
        """``variants``: (contiguous, ndim, large) to build (default: all, MLX's module)."""
        from ..codegen.gpu import variant_suffix
        from ..codegen.render import renderer

        d = renderer("metal")
        sched = d.schedule
        self.tapes = list(tapes)
        pieces, entries, self.index = [], [], {}
        for k, t in enumerate(self.tapes):
            src = [d.preamble(t)]
            for c, n, lg in variants or sched.variants():
                name = f"{t.lib_name}_{variant_suffix(c, n, lg, sched.max_static_ndim)}"
                src.append(sched.render(d, t, name, c, n, lg, preamble=False))
                self.index[(k, name)] = len(entries)
                entries.append(Entry(k, name))
            pieces.append("".join(src))
        self.lib = Library(pieces, entries)

    def run(self, k: int, inputs: Sequence, shape: Sequence[int], **force) -> tuple:
        """Tape ``k`` on ``inputs`` (arrays; constants are filled in from the tape): its
        outputs and the variant that ran (``force_strided`` / ``force_large`` / ``grid_x``
        as ``kernels.fused_call``)."""
        from .kernels import fused_call

        t = self.tapes[k]
        arrays = [np.asarray(x.constant, dtype=x.dtype) if x.is_constant else a
                  for x, a in zip(t.inputs, inputs)]
        call = fused_call(t, arrays, shape, **force)
        self.lib.run(self.index[(k, call.name)], call.buffers, call.grid, call.threadgroup)
        return call.outputs, call.variant
