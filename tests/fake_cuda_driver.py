"""The CUDA backend's kernel path over ``tests/fake_cupy.py``, with no GPU and no NVRTC:
kernels "load" without being compiled and launches run nothing, so what is left is the
host side of every call exactly as on a GPU (plans, the eval loop's C launch through
``cuda/_driver.c``, the rules' Python launches). For host-cost measurements (cProfile call
counts, callgrind instructions per call) and launch counts per op; the results of such a
run are not computed (the device never runs), except fused tapes' after
``run_fused_tapes()`` (interpreted at the pointers their launch words hold).

``install()`` after ``fake_cupy.install()`` and before tapescope asks for a GPU:

- a stand-in ``libcuda.so.1`` (``tests/fake_libcuda.c``, built here with ``cc``) is loaded
  globally, so ``_driver.configure`` finds cuLaunchKernel / cuStreamQuery as it finds the
  driver CuPy loads, and counts each launch (``launches()``, ``launch(k)``);
- the stand-in arrays get device pointers (``x.data.ptr``: their host address, read in C by
  ``tests/fake_ptr.c`` as CuPy reads its own) and the stand-in streams a ``ptr``;
- ``compiled.get_kernel`` gives a kernel entry whose function is a ``FakeFunction`` (a
  ``ptr`` the C launch passes; callable as CuPy's ``RawKernel`` for the Python launches,
  counted in ``PY_LAUNCHES``), its source rendered as NVRTC would get it;
- ``cupy.cuda.driver.launchKernel`` (``PackedLaunch.call``'s Python launch) is counted too.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import os
import subprocess
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).parent
PY_LAUNCHES = [0]  # launches made from Python (a RawKernel call or driver.launchKernel)
PY_CALLS: list = []  # the last RawKernel calls' (kernel pointer, grid, block, arguments)
_lib: list = [None]


class FakeFunction:
    """A loaded kernel: ``ptr`` (its CUfunction), callable as a RawKernel."""

    _ids = itertools.count(1)

    def __init__(self, name: str) -> None:
        self.name, self.ptr, self.calls = name, 0x10000 * next(self._ids), 0

    def __call__(self, grid, block, args, **kw) -> None:
        self.calls += 1
        PY_CALLS.append((self.ptr, grid, block, args))
        del PY_CALLS[:-64]
        PY_LAUNCHES[0] += 1


def build(folder=None) -> str:
    """The stand-in driver library's path, built from ``fake_libcuda.c`` (once per source:
    a folder of the temporary directory named by its hash, reused)."""
    src = HERE / "fake_libcuda.c"
    tag = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    folder = Path(folder or Path(tempfile.gettempdir()) / f"tapescope_fake_libcuda_{os.getuid()}_{tag}")
    out = folder / "libcuda.so.1"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"libcuda.so.1.{os.getpid()}"
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC",
                        "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(src)], check=True)
        os.replace(tmp, out)  # atomic: a parallel build never loads a half-written file
    return str(out)


def build_ptr(folder=None) -> str:
    """``fake_ptr.c``'s library (``x.data.ptr`` in C), built with the Python headers as
    ``build`` builds the driver's."""
    import sysconfig

    src = HERE / "fake_ptr.c"
    inc = sysconfig.get_paths()["include"]
    tag = hashlib.sha256(src.read_bytes() + inc.encode()).hexdigest()[:16]
    folder = Path(folder or Path(tempfile.gettempdir()) / f"tapescope_fake_ptr_{os.getuid()}_{tag}")
    out = folder / "fake_ptr.so"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"fake_ptr.so.{os.getpid()}"
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", f"-I{inc}",
                        "-o", str(tmp), str(src)], check=True)
        os.replace(tmp, out)
    return str(out)


def _get_kernel(name, variant, source_fn, key, tape=None):
    from tapescope.kernels import kernel_registry

    ckey = "cuda:" + key
    e = kernel_registry._kernels.get(ckey)
    if e is None or e.fn is None:
        e = kernel_registry.KernelEntry(name, "cuda", variant, source_fn(), tape=tape)
        e.fn, e.origin = FakeFunction(name), "fake"
        e.misses += 1
        with kernel_registry._lock:
            kernel_registry._kernels[ckey] = e
    e.hits += 1
    return e


def _py_launch(*args) -> None:
    PY_LAUNCHES[0] += 1
    if _RUNNER[0] is not None:  # (fn, grid, 1, 1, block, 1, 1, shared, stream, params, extra)
        _run_launch(args[9])


# -- fused tapes computed at their launch (run_fused_tapes) --------------------------------
_RUNNER: list = [None]  # the ctypes callback given to the stand-in driver (kept alive)
_PACKS: dict = {}  # a launch pack's pointer-array address -> (plan, its argument words)
RAN = [0]  # fused-tape launches computed
ALIASES: list = []  # (kernel, output, input) where an output's buffer was an input's it does not read
LAST: list = [None]  # the last computed launch: (tape, {input: (pointer, shape)}, [output pointers])


def run_fused_tapes() -> None:
    """From now on a fused tape's launch (a ``compiled.Launch``, from C or from Python)
    computes: its tape interpreted by numpy (``codegen/interpret.py``, the CPU's rules) over
    the arrays at the pointers its argument words hold (the layouts it was planned for; a
    by-value scalar's bits), written at its output words' pointers, every input read before
    any output is written. So a wrong pointer, a wrong output order or a donation the kernel
    cannot take gives a wrong value; an output written over an input it does not read (the
    kernels' pointers are restrict: ``compiled._outputs``) is noted in ``ALIASES``. Other
    launches (reductions' and other primitives' plans) still run nothing."""
    from tapescope.kernels.cuda import compiled

    if _RUNNER[0] is not None:
        return
    real = compiled.PackedLaunch._pack

    def _pack(self):
        pack = real(self)
        _PACKS[pack[2]] = (self, pack[0])
        return pack

    compiled.PackedLaunch._pack = _pack
    cb = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
        lambda f, stream, params: _run_launch(params))
    _lib[0].fake_set_runner(ctypes.cast(cb, ctypes.c_void_p))
    _RUNNER[0] = cb


def _at(ptr: int, shape: tuple, strides: tuple, dtype):
    """The array of ``shape`` / ``strides`` (bytes) at the stand-in device pointer ``ptr``."""
    import numpy as np

    dtype = np.dtype(dtype)
    extent = dtype.itemsize * (1 + sum((n - 1) * s for n, s in zip(shape, strides) if n))
    buf = (ctypes.c_char * max(extent, dtype.itemsize)).from_address(ptr)
    return np.ndarray(shape, dtype, buf, 0, strides)


def _with_cast_dtypes(tape):
    """``tape`` with each parameterless cast's dtype as its parameter (an eager cast's
    one-op tape keeps it in the plan's key, its op's dtype: the interpreter's rule wants it)."""
    from tapescope.kernels.codegen.tape import Tape, TapeOp

    if all(op.primitive != "AsType" or op.params for op in tape.ops):
        return tape
    ops = tuple(TapeOp(op.name, op.primitive, op.dtype, op.inputs, (("dtype", op.dtype),))
                if op.primitive == "AsType" and not op.params else op for op in tape.ops)
    return Tape(tape.inputs, ops, tape.outputs, tape.lib_name)


_HOST_KERNELS: list = []  # kernel-name prefixes whose launches run their CUDA source's host build


def run_kernels_on_host(*prefixes: str) -> None:
    """From now on a launch of a primitive's plan (not a fused tape's) whose kernel's name
    starts with one of ``prefixes`` computes: its CUDA source (the entry's, as NVRTC would
    get it) built by g++ against ``tests/cuda_host_shim.h`` (``tests/cuda_host.py``) and run
    over the grid with the launch's own argument pack (the pointers and words the C launch
    or the plan's Python call wrote), so the words a plan packs are checked, not only its
    kernel. Fused tapes' launches compute too (``run_fused_tapes``)."""
    _HOST_KERNELS.extend(prefixes)
    run_fused_tapes()


def _run_host_kernel(ln, params: int) -> None:
    from cuda_host import build

    name = ln.name
    fn = getattr(build(ln.entry.source, [name]), f"ts_run_{name}")
    fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
    if fn(ln.grid, ln.block, params) != 0:
        raise RuntimeError(f"{name}: threads of a block wait at different meetings")
    RAN[0] += 1


def _run_launch(params: int) -> None:
    import numpy as np

    from tapescope.kernels.codegen.interpret import interpret
    from tapescope.kernels.cuda.compiled import Launch

    got = _PACKS.get(params)
    if got is not None and type(got[0]) is not Launch:
        if any(got[0].name.startswith(p) for p in _HOST_KERNELS):
            _run_host_kernel(got[0], params)
        return
    if got is None:
        return
    ln, words = got
    tape = ln.entry.tape
    key = next(k for k, v in tape.launches.items() if v is ln)  # ("cuda", shape, layouts...)
    layouts = dict(zip(tape.launches["cuda"], key[2:]))
    slots, values = dict(ln.slots), {i: (j, size) for i, j, size in ln.values}
    ins, arrays = [], {}
    for i, x in enumerate(tape.inputs):
        if x.is_constant:
            ins.append(None)
        elif i in values:
            j, size = values[i]
            raw = int(words[j]).to_bytes(8, "little")[:size]
            ins.append(np.frombuffer(raw, x.dtype).reshape(()))
        else:
            shape, strides = layouts[i]
            arrays[i] = _at(int(words[slots[i]]), shape, strides, x.dtype)
            ins.append(arrays[i])
    res = interpret(_with_cast_dtypes(tape), ins, ln.shape, np)
    of = {x.name: {x.name} for x in tape.inputs}  # per value: the inputs it reads
    for op in tape.ops:
        of[op.name] = set().union(*[of.get(n, set()) for n in op.inputs])
    it = [np.dtype(d).itemsize for d in ln.dtypes]
    outs = []
    for k, (r, dt) in enumerate(zip(res, ln.dtypes)):
        strides, acc = [], it[k]
        dims = ln.shape if ln.order == "C" else ln.shape[::-1]
        for n in reversed(dims):
            strides.append(acc)
            acc *= n
        strides = strides[::-1] if ln.order == "C" else strides
        o = _at(int(words[ln.n_out_at + k]), ln.shape, tuple(strides), dt)
        for i, a in arrays.items():
            if np.may_share_memory(o, a) and tape.inputs[i].name not in of[tape.outputs[k]]:
                ALIASES.append((ln.name, k, i))
        outs.append((o, r))
    for o, r in outs:
        o[...] = r
    RAN[0] += 1
    LAST[0] = (tape, {i: (int(words[slots[i]]), a.shape) for i, a in arrays.items()},
               [int(words[ln.n_out_at + k]) for k in range(len(outs))])


def install() -> None:
    import cupy

    assert getattr(cupy, "__fake__", False), "fake_cupy.install() first"
    if _lib[0] is None:
        lib = ctypes.CDLL(build(), mode=ctypes.RTLD_GLOBAL)
        lib.fake_launches.restype = ctypes.c_longlong
        lib.fake_launch.argtypes = [ctypes.c_longlong] + [ctypes.c_void_p] * 4
        lib.fake_set_runner.argtypes = [ctypes.c_void_p]
        _lib[0] = lib
    # CuPy's MemoryPointer as far as the launches read it (``ptr``): in C, as CuPy's own
    # attributes are (fake_ptr.c), so the host's cost per read is CuPy's, not numpy's
    # __array_interface__ dict; a stream's ``ptr`` kept on it after its first read
    ptr = ctypes.PyDLL(build_ptr())
    ptr.fake_data_descriptor.restype = ctypes.py_object
    cupy.ndarray.data = ptr.fake_data_descriptor()
    cupy.Stream.ptr = functools.cached_property(lambda self: id(self))
    cupy.Stream.ptr.__set_name__(cupy.Stream, "ptr")
    cupy.cuda.driver = types.SimpleNamespace(launchKernel=_py_launch)
    # cudaMemsetAsync on the stand-in's host memory (the stream runs nothing: done at once)
    cupy.cuda.runtime.memsetAsync = lambda ptr, value, size, stream: ctypes.memset(ptr, value, size)
    from tapescope.kernels.cuda import compiled

    compiled.get_kernel = _get_kernel
    compiled.toolchain_ident = lambda: "fake"


def launches() -> int:
    """Launches the C path made (cuLaunchKernel calls) so far."""
    return int(_lib[0].fake_launches())


def launch(k: int) -> tuple:
    """The k-th C launch's (kernel pointer, grid, block, stream pointer)."""
    fn, st = ctypes.c_void_p(), ctypes.c_void_p()
    grid, block = ctypes.c_uint(), ctypes.c_uint()
    if _lib[0].fake_launch(k, ctypes.byref(fn), ctypes.byref(grid), ctypes.byref(block),
                           ctypes.byref(st)) != 0:
        raise IndexError(k)
    return fn.value, grid.value, block.value, st.value
