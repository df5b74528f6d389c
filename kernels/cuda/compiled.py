"""Fused tapes on an NVIDIA GPU: CUDA source from the shared renderer, compiled by NVRTC,
cached in memory and on disk, launched on the mx stream's CUDA stream.

Mirrors MLX's ``Compiled::eval_gpu`` (``mlx/backend/cuda/compiled.cpp``): the same variant
choice as the CPU (contiguity check and dim collapse pick ``_contiguous`` or
``_strided_<n>`` / ``_strided_dynamic``, ``_large`` past UINT32_MAX), one kernel per variant
compiled on first use (MLX's ``cu::get_jit_module`` also builds per name), outputs in a
donated input's buffer where MLX's rules allow it, else fresh device memory. The on-disk
cache keeps the CPU cache's rules (``kernels/disk_cache.py``): a private folder per
toolchain (NVRTC version and the GPU's architecture), files written atomically, a cubin
loaded only when its sidecar says we built it from this exact source and it is intact.
A tape the CUDA dialect cannot spell runs as CuPy ops, one kernel per op, and the timeline
and the kernel cache say why.
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import cupy
import ml_dtypes
import numpy as np

from .. import timeline
from ..codegen.gpu import variant_suffix
from ..codegen.interpret import interpret
from ..codegen.render import Unsupported, renderer
from ..codegen.tape import Tape
from .. import disk_cache, kernel_registry
from ..kernel_call import PlanLookup
from ..codegen.layout import output_order, plan
from .bfloat16 import empty, upload

_BF16 = np.dtype(ml_dtypes.bfloat16)
_lock = threading.Lock()
_unsupported: dict = {}  # tape lib name -> why the CUDA dialect cannot spell it (None: it can)
_failed: dict = {}  # cache key -> why its build failed (not retried)


def _dialect():
    d = _DIALECT[0]
    if d is None:
        d = _DIALECT[0] = renderer("cuda")
    return d


_DIALECT: list = [None]


# -- the toolchain: NVRTC for this GPU ------------------------------------------------------
def _arch() -> str:
    cc = cupy.cuda.Device().compute_capability  # "90" on an H100 / H200
    return f"sm_{cc}"


def _nvrtc():
    from cupy_backends.cuda.libs import nvrtc

    return nvrtc


def toolchain_ident() -> str:
    """The disk cache's folder name: cubins are valid for one NVRTC and one architecture."""
    major, minor = _nvrtc().getVersion()
    return f"cuda-nvrtc{major}.{minor}-{_arch()}"


def _include_dirs() -> list:
    """Where ``cuda_fp16.h`` / ``cuda_bf16.h`` are: the CUDA toolkit CuPy found, and the
    headers CuPy ships with its wheels."""
    dirs = []
    try:
        from cupy.cuda import get_cuda_path

        root = get_cuda_path()
        if root:
            dirs += [Path(root) / "include", Path(root) / "targets" / "x86_64-linux" / "include"]
    except Exception:  # noqa: BLE001 - no toolkit path: NVRTC's built-in headers may do
        pass
    try:
        import cupy as _c

        base = Path(_c.__file__).parent
        dirs += [base / "_core" / "include", base / "_core" / "include" / "cupy" / "_cccl" / "libcudacxx"]
    except Exception:  # noqa: BLE001
        pass
    return [str(d) for d in dirs if (d / "cuda_fp16.h").exists()]


def nvrtc_compile(name: str, source: str) -> tuple:
    """``(cubin bytes, milliseconds)`` of ``source``; BuildError with NVRTC's log."""
    nvrtc = _nvrtc()
    t0 = time.perf_counter()
    # IEEE as the C kernels: no contraction into FMA, subnormals kept, exact / and sqrt
    opts = [f"--gpu-architecture={_arch()}", "--std=c++17", "-default-device", "--fmad=false",
            "--ftz=false", "--prec-div=true", "--prec-sqrt=true"] + [f"-I{d}" for d in _include_dirs()]
    prog = nvrtc.createProgram(source, f"{name[:64]}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise kernel_registry.BuildError(
                f"[Compiled::eval_gpu] Failed to compile kernel {name} with NVRTC: {e}\n{log}"
            ) from None
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return bytes(cubin), (time.perf_counter() - t0) * 1e3


def _load(cubin_path: Path, name: str):
    mod = cupy.RawModule(path=str(cubin_path))
    return mod, mod.get_function(name)


def get_kernel(name: str, variant: str, source_fn, key: str, tape: Optional[Tape] = None):
    """The loaded CUDA kernel ``name`` (a ``kernel_registry.KernelEntry`` of runtime "cuda", listed
    by ``tapescope.kernel_cache()`` beside the C kernel of the same name), from memory, from
    the disk cache, or built by NVRTC; raises BuildError without one."""
    ckey = "cuda:" + key
    t0 = timeline.now() if timeline.enabled else 0
    e = kernel_registry._kernels.get(ckey)
    if e is not None and e.fn is not None:
        e.hits += 1
        if t0:
            _record(t0, name, hit=True, origin="memory", variant=variant, compile_ms=0.0)
        return e
    with _lock:
        e = kernel_registry._kernels.get(ckey)
        if e is not None and e.fn is not None:
            e.hits += 1
            return e
        if ckey in _failed:
            raise kernel_registry.BuildError(_failed[ckey])
        try:
            ident = toolchain_ident()
        except Exception as err:  # noqa: BLE001 - no NVRTC library: the tape runs as CuPy ops
            _failed[ckey] = f"NVRTC is not available ({err})"  # not probed again per call
            raise kernel_registry.BuildError(_failed[ckey]) from None
        source = source_fn()
        shash = disk_cache.sha256((ident + "\n" + source).encode())
        cache = disk_cache.open_cache(ident)
        paths = _entry_paths(cache.folder, name, shash) if cache.folder else None
        mod = fn = path = None
        ms, origin, note = 0.0, "disk", cache.reason
        if paths is not None and disk_cache.verified(paths, shash):
            try:
                mod, fn = _load(paths[0], name)
                path = paths[0]
            except Exception:  # noqa: BLE001 - a cubin the driver refuses is rebuilt
                mod = fn = None
        if fn is None:
            try:
                cubin, ms = nvrtc_compile(name, source)
            except kernel_registry.BuildError as err:
                _failed[ckey] = str(err)
                raise
            origin = "built"
            if cache.writable:
                try:
                    _store(cache, paths, cubin, source, {
                        "name": name, "source_sha256": shash, "toolchain": ident})
                    path = paths[0]
                except OSError as err:
                    note = (f"the kernel folder {cache.folder} could not take the cubin "
                            f"({err.strerror or err})")
            if path is None:
                origin = "memory only"
                mod = _module_from_bytes(cubin)
                fn = mod.get_function(name)
            else:
                mod, fn = _load(path, name)
        if e is None:
            e = kernel_registry.KernelEntry(name, "cuda", variant, source, tape=tape)
        e.source, e.fn, e.lib, e.build_ms, e.origin = source, fn, mod, ms, origin
        e.disk_path, e.cache_note = (str(path) if path is not None else None), note
        e.misses += 1
        with kernel_registry._lock:  # the one in-process cache: kernel_cache() lists it, clear() forgets it
            kernel_registry._kernels[ckey] = e
    if t0:
        _record(t0, name, hit=False, origin=origin, variant=variant, compile_ms=ms, cache=note)
    return e


def _entry_paths(folder: Path, name: str, shash: str) -> tuple:
    """``(cubin, sidecar, CUDA source)`` of a kernel in the toolchain's cache folder."""
    tag = f"{disk_cache.file_stem(name)}.{shash[:12]}"
    return folder / f"{tag}.cubin", folder / f"{tag}.json", folder / f"{tag}.cu"


def _store(cache, paths: tuple, cubin: bytes, source: str, meta: dict) -> None:
    """Into the cache by the CPU cache's ``store`` (atomic files, the sidecar last)."""
    work = disk_cache.new_build_dir(cache)
    try:
        built = work / "kernel.cubin"
        built.write_bytes(cubin)
        disk_cache.store(paths, built, source, meta)
    finally:
        disk_cache.remove_build_dir(work)


def _module_from_bytes(cubin: bytes):
    """A module loaded straight from the cubin's bytes (the cache could not take it)."""
    from cupy.cuda import function

    m = function.Module()
    m.load(cubin)
    return m


def _record(t0: int, name: str, **detail) -> None:
    if timeline.enabled:
        timeline.add("kernel_build", t0, timeline.now(), name=name, device="gpu",
                     detail={"runtime": "cuda", **detail})


# -- one call --------------------------------------------------------------------------------
class PackedLaunch:
    """One kernel launch with everything but the arrays' pointers fixed, its arguments packed
    once as ``cuLaunchKernel`` takes them: the parameters' bytes in 8-byte words
    (``packed``; one run of words per argument, ``offsets`` each run's first word), where
    each array's device pointer goes (``slots``: (input, word); ``n_out_at``: the output's
    word) and each by-value scalar's bits (``values``: (input, word, itemsize)), the grid and
    block, and per thread an array of pointers to the arguments (``packs``). A call writes
    the pointers into this thread's words and launches through the driver (CuPy's
    ``RawKernel`` call spends ~13 us per launch converting its arguments). The eval loop's C
    launch (``cuda/_driver.c``) reads these same attributes once into its record
    (``lane``). Subclasses: ``Launch`` (a fused tape's), ``primitive_plans.KernelPlan`` (a
    primitive's loop-IR kernel)."""

    __slots__ = ("entry", "gen", "name", "variant", "shape", "grid", "block", "slots",
                 "values", "n_out_at", "word_at", "dtypes", "order", "packed", "offsets",
                 "packs", "fn_ptr", "lane", "out_shape", "out_dtype")

    def _set_pack(self, entry, words: list, offsets: list, slots, values, n_out_at: int,
                  word_at: int, grid: int, block: int, dtypes: list, order: str,
                  shape: tuple, name: str, variant: str) -> None:
        self.entry, self.gen, self.name, self.variant = entry, kernel_registry.generation(), name, variant
        self.packed, self.offsets = words, tuple(offsets)
        self.slots, self.values = tuple(slots), tuple(values)
        self.n_out_at, self.word_at = n_out_at, word_at
        self.grid, self.block = grid, block
        self.dtypes, self.order, self.shape = dtypes, order, shape
        # what a single-output plan writes (the eval loop compares the node's output)
        self.out_shape, self.out_dtype = shape, dtypes[0] if len(dtypes) == 1 else None
        self.packs: dict = {}  # thread id -> (words, pointers to the arguments, address)
        self.lane = None  # what the C launch reads of this plan, made there (cuda/_driver.c)
        self.fn_ptr = _function_ptr(entry.fn)

    def takes(self, out) -> bool:
        """Whether the kernel writes its single output straight into ``out``."""
        return (len(self.dtypes) == 1 and out.shape == self.shape and out.dtype == self.dtypes[0]
                and (out.flags.c_contiguous if self.order == "C" else out.flags.f_contiguous))

    def call(self, inputs: Sequence, outs: Sequence, hit: bool = True, stream=None) -> None:
        """Launch the kernel on these device arrays (of the layouts this plan was made for)
        on ``stream`` (default: the current CUDA stream); ``hit``: count it as a hit of the
        kernel cache."""
        if hit:
            self.entry.hits += 1
        pack = self.packs.get(threading.get_ident()) or self._pack()
        vals = pack[0]
        for i, j in self.slots:
            vals[j] = inputs[i].data.ptr
        for i, j, _ in self.values:
            vals[j] = value_bits(inputs[i])
        j = self.n_out_at
        for o in outs:
            vals[j] = o.data.ptr
            j += 1
        t0 = timeline.now() if timeline.enabled else 0
        if stream is None:
            stream = cupy.cuda.get_current_stream()
        _launch(self.fn_ptr, self.grid, 1, 1, self.block, 1, 1, 0, stream.ptr, pack[2], 0)
        if t0:
            timeline.add("kernel_launch", t0, timeline.now(), name=self.name, device="gpu",
                         detail=self.launch_detail())

    def launch_detail(self) -> dict:
        """The ``kernel_launch`` record's detail."""
        return {"runtime": "cuda", "variant": self.variant, "grid": self.grid, "block": self.block}

    def _pack(self) -> tuple:
        """This thread's argument slots (the constant ones filled in) and their pointers.
        The driver needs the primary context current on this thread (``current_context``)."""
        current_context()
        vals = (ctypes.c_uint64 * len(self.packed))(*self.packed)
        base = ctypes.addressof(vals)
        ptrs = (ctypes.c_void_p * len(self.offsets))(*[base + 8 * o for o in self.offsets])
        pack = self.packs[threading.get_ident()] = (vals, ptrs, ctypes.addressof(ptrs))
        return pack


class Launch(PackedLaunch):
    """A fused tape's call: everything about it that depends only on the tape and the
    layouts. The shape and strides are parameters' values (MLX passes them by value), as is
    a by-value scalar (an eager op's Python scalar): a launch reads no memory that a copy,
    on whichever stream, must have written first. ``reads``: per output, the inputs its
    value reads as a bit mask over the input positions (the only inputs that may give it
    their buffer: ``_outputs``; the eval loop's C part reads it too)."""

    __slots__ = ("contiguous", "args", "reads")

    def __init__(self, tape: Tape, inputs: Sequence, shape: tuple, entry, contiguous: bool,
                 cshape: list, strides: list, large: bool, name: str, variant: str):
        d = _dialect()
        self.contiguous = contiguous
        size = int(np.prod(shape, dtype=np.int64))
        ndim = len(cshape)
        wpt = d.schedule.work_per_thread(tape, contiguous, ndim, large)
        dynamic = ndim > d.schedule.max_static_ndim
        idx = np.int64 if large else np.uint32
        words: list = []  # the parameters' bytes, 8 to a word
        offsets: list = []  # per argument: its first word
        args: list = []  # device arrays the dynamic variant's arguments point at (kept)
        slots, values, k = [], [], 0

        def arg(ws) -> int:
            offsets.append(len(words))
            words.extend(ws)
            return offsets[-1]

        def ints(vals, dt) -> list:  # an array parameter's value, packed into words
            raw = np.asarray(vals, dtype=dt).tobytes()
            raw += b"\0" * (-len(raw) % 8)
            return [int(w) for w in np.frombuffer(raw, dtype=np.uint64)] or [0]

        def pointer(host, dt) -> list:  # the dynamic variant: a device array, copied now
            a = cupy.asarray(np.asarray(host, dtype=dt))
            cupy.cuda.runtime.deviceSynchronize()  # once per plan: every stream may read it
            args.append(a)
            return [a.data.ptr]

        for i, x in enumerate(tape.inputs):
            if x.is_constant:
                continue
            if x.by_value:
                values.append((i, arg([0]), np.dtype(x.dtype).itemsize))
                continue
            slots.append((i, arg([0])))
            if not contiguous and not x.scalar:
                arg(pointer(strides[k], np.int64) if dynamic else ints(strides[k], np.int64))
                k += 1
        n_out_at = len(words)
        for _ in tape.outputs:
            arg([0])
        if contiguous:
            arg([int(idx(size))])
        else:
            arg(pointer(cshape, np.int32) if dynamic else ints(cshape, np.int32))
            if dynamic:
                arg([ndim])
        # the completion word and its value (codegen/cuda.py): null in every launch here
        word_at = arg([0])
        arg([0])
        self.args = args
        self.reads = tuple(sum(1 << i for i, x in enumerate(tape.inputs)
                               if x.name in r and not x.is_constant) for r in _reads(tape))
        block = _block_size(entry.fn, d.schedule.block_size)
        threads = -(-size // wpt)
        self._set_pack(entry, words, offsets, slots, values, n_out_at, word_at,
                       max(1, -(-threads // block)), block,
                       [np.dtype(tape.dtype_of(n)) for n in tape.outputs],
                       output_order(tape, inputs, shape, contiguous), shape, name, variant)


def value_bits(x) -> int:
    """A by-value scalar's parameter word: the bits of its (first) element, little-endian,
    zero-padded (a host 0-d array, or a host broadcast of one)."""
    a = np.asarray(x)
    return int.from_bytes(a.reshape(-1)[:1].tobytes().ljust(8, b"\0"), "little") if a.size else 0


def _launch(*args) -> None:
    """``cuLaunchKernel`` (CuPy's binding of the driver call)."""
    cupy.cuda.driver.launchKernel(*args)


def _function_ptr(fn) -> int:
    """The ``CUfunction`` of a loaded kernel: a ``RawModule``'s ``get_function`` gives a
    ``RawKernel``, whose driver function is its ``kernel``; a raw ``Module``'s is itself."""
    inner = getattr(fn, "kernel", fn)
    return int(inner.ptr)


def current_context() -> None:
    """Make this thread's device's primary context current for the driver API calls that
    follow (``cudaSetDevice`` initialises it on a thread that has made no CUDA call yet; a
    driver call there fails with CUDA_ERROR_INVALID_CONTEXT)."""
    cupy.cuda.runtime.setDevice(cupy.cuda.runtime.getDevice())


def _block_size(fn, limit: int) -> int:
    """Threads per block: the occupancy calculator's choice for this kernel, at most the
    kernel's launch bounds (``cuOccupancyMaxPotentialBlockSize``)."""
    block = 0
    current_context()  # a plan made on a stream's thread before its first CUDA call
    try:
        _, block = cupy.cuda.driver.occupancyMaxPotentialBlockSize(_function_ptr(fn), 0, limit)
    except AttributeError:  # an older CuPy without the driver call
        pass
    return int(block) if block > 0 else limit


def _prepare(tape: Tape, inputs: Sequence, shape: tuple):
    contiguous, cshape, strides, large = plan(tape, inputs, shape)
    ndim = len(cshape)
    d = _dialect()
    suffix = variant_suffix(contiguous, ndim, large, d.schedule.max_static_ndim)
    name = f"{tape.lib_name}_{suffix}"
    if tape.lib_name not in _unsupported:
        try:
            d.render(tape, name, contiguous, ndim, large)
            _unsupported[tape.lib_name] = None
        except Unsupported as e:
            _unsupported[tape.lib_name] = f"the CUDA dialect cannot express it: {e}"
    if _unsupported[tape.lib_name]:
        return kernel_registry.BuildError(_unsupported[tape.lib_name]), name, suffix
    key = name if tape.outputs == (tape.ops[-1].name,) else name + "|" + ",".join(tape.outputs)
    try:
        entry = get_kernel(name, suffix, lambda: d.render(tape, name, contiguous, ndim, large),
                           key=key, tape=tape)
    except kernel_registry.BuildError as e:  # (its message: the traceback holds the inputs)
        return kernel_registry.BuildError(str(e)), name, suffix
    return Launch(tape, inputs, shape, entry, contiguous, cshape, strides, large, name, suffix)


def _reads(tape: Tape) -> tuple:
    """Per output of the tape, the names of the inputs its value reads (kept on the tape)."""
    reads = tape.launches.get("cuda-reads")
    if reads is None:
        of = {x.name: frozenset((x.name,)) for x in tape.inputs}
        for op in tape.ops:
            of[op.name] = frozenset().union(*[of.get(n, frozenset()) for n in op.inputs])
        reads = tape.launches["cuda-reads"] = tuple(of.get(n, frozenset()) for n in tape.outputs)
    return reads


def _outputs(tape: Tape, ln: Launch, inputs: Sequence, out, donatable) -> list:
    """Where the kernel writes: ``out`` when its layout is the kernel's, else donated inputs
    (MLX's Compiled rules: not a constant or a scalar, same itemsize, row-contiguous with the
    output's size on the strided path), else fresh device arrays in the inputs' order.

    An input gives its buffer only to an output whose value reads it: the kernels' pointers
    are ``__restrict__`` (MLX's are not), so the compiler may move a load after a store
    to another pointer; a store that depends on the load cannot go first. (An output that
    did not read the input it overwrote was stored before the input was loaded: MLX's
    test_compile ``test_compile_many_outputs`` gave [26, 68] for [64, 128] on the H200.)"""
    dts, shape = ln.dtypes, ln.shape
    if out is not None and ln.takes(out):
        return [out]
    size = int(np.prod(shape, dtype=np.int64))
    outs: list = []
    if donatable:
        reads = _reads(tape)
        for x, a, ok in zip(tape.inputs, inputs, donatable):
            if len(outs) == len(dts) or not ok or x.is_constant or a.ndim == 0:
                continue
            dt = dts[len(outs)]
            if a.dtype.itemsize != dt.itemsize or x.name not in reads[len(outs)]:
                continue
            if ln.contiguous and a.size == size:
                outs.append(a.view(dt))
            elif not ln.contiguous and a.flags.c_contiguous and a.size == size:
                outs.append(a.view(dt).reshape(shape))
    for dt in dts[len(outs):]:
        outs.append(empty(shape, dt, order=ln.order))
    return outs


def run_compiled(tape: Tape, inputs: Sequence, shape: Sequence[int], out=None,
                 donatable: Optional[Sequence[bool]] = None) -> list:
    """The outputs of ``tape`` on device ``inputs`` (constants included by position),
    computed by its fused CUDA kernel on the current CUDA stream."""
    shape = tuple(int(s) for s in shape)
    arrays = tape.launches.get("cuda")
    if arrays is None:
        arrays = tape.launches["cuda"] = tuple(i for i, x in enumerate(tape.inputs) if not x.is_constant)
    key = ("cuda", shape, *[(inputs[i].shape, inputs[i].strides) for i in arrays])
    ln = tape.launches.get(key)
    if ln is None or ln.gen != kernel_registry.generation():
        if any(s == 0 for s in shape):
            return [empty(shape, tape.dtype_of(n)) for n in tape.outputs]
        ln = _prepare(tape, inputs, shape)
        if isinstance(ln, tuple):  # no kernel: CuPy ops, one kernel each (says why each time)
            err, name, variant = ln
            t0 = timeline.now() if timeline.enabled else 0
            kernel_registry.note_fallback("cuda:" + name, variant, "", str(err), tape=tape)
            outs = _interpret(tape, inputs, shape)
            if t0:
                timeline.add("kernel_fallback", t0, timeline.now(), name=name, device="gpu",
                             detail={"reason": str(err), "runtime": "cupy", "variant": variant})
            return outs
        tape.launches[key] = ln
    else:
        ln.entry.hits += 1
    outs = _outputs(tape, ln, inputs, out, donatable)
    ln.call(inputs, outs, hit=False)
    return outs


def _interpret(tape: Tape, inputs: Sequence, shape: tuple) -> list:
    """The tape as CuPy ops; one reading or making bfloat16 (which CuPy cannot compute) is
    interpreted by numpy on host copies, as the CPU runs it, its results copied back."""
    if not any(np.dtype(tape.dtype_of(n)) == _BF16
               for n in (*[x.name for x in tape.inputs], *[op.name for op in tape.ops])):
        return interpret(tape, inputs, shape, cupy)
    host = [a.get() if hasattr(a, "get") else np.asarray(a) for a in inputs]
    return [upload(o) if o.dtype == _BF16 else cupy.asarray(o)
            for o in interpret(tape, host, shape, np)]


def kernel_for(tape: Tape, inputs: Sequence, shape: tuple) -> Optional[Launch]:
    """The call plan of ``tape`` for these device layouts, its kernel built or loaded
    (``run_compiled``'s), or None where it has no kernel (the reason noted once in the
    kernel cache): the one-op kernels of eager ops (``cuda/eager.py``, ``cuda/bfloat16.py``).
    Operands all column-contiguous make a column-order plan (``order`` "F", as MLX keeps
    their strides): the eval loop gives it a column-order output."""
    shape = tuple(int(s) for s in shape)
    arrays = tape.launches.get("cuda")
    if arrays is None:
        arrays = tape.launches["cuda"] = tuple(i for i, x in enumerate(tape.inputs) if not x.is_constant)
    key = ("cuda", shape, *[(inputs[i].shape, inputs[i].strides) for i in arrays])
    launches = tape.launches
    ln = launches.get(key)
    if ln is None or ln.gen != kernel_registry.generation():
        if ("cuda-none",) + key[1:] in launches:
            return None
        ln = _prepare(tape, inputs, shape)
        if isinstance(ln, tuple):
            err, name, variant = ln
            kernel_registry.note_fallback("cuda:" + name, variant, "", str(err), tape=tape)
            launches[("cuda-none",) + key[1:]] = True
            return None
        launches[key] = ln
    return ln


# launch_for(tape, inputs, shape): the call plan made for these layouts (its kernel
# loaded; the key ``("cuda", shape, ...)`` it is filed under above), or None: the eval
# loop's fast lane for a fused call, which then gives the output buffer itself and calls
# ``Launch.call`` (``run_compiled`` does everything else). A host array (a Python scalar's,
# which a GPU keeps on the host) where the kernel reads device memory has none:
# run_compiled. A PlanLookup (kernels/kernel_call.py), in C where built.
launch_for = PlanLookup("cuda", kernel_registry._generation, np.ndarray)
