"""A backend per device: what evaluating a primitive on a device's stream needs.

``Backend`` is the contract the core asks (``backend(stream.device)``) instead of naming an
array module or a device itself, as MLX's eval loop asks a primitive's ``eval_cpu`` /
``eval_gpu`` and the device's allocator, streams and events (mlx/backend/cpu/eval.h,
mlx/backend/gpu/eval.h: ``new_stream``, ``eval``, ``synchronize``; mlx/allocator.h,
mlx/event.h). ``CONTRACT`` lists it: a backend writes its hooks and declares its facts.

- evaluating: ``run_compiled`` (a fused tape: MLX's ``Compiled::eval_cpu`` / ``eval_gpu``,
  the one hook each backend must write), ``kernel_rules`` (primitive name -> the device's
  own rule: MLX's reductions and fast primitives as generated kernels) and
  ``device_context`` (None on the host; a GPU's ``(stream, node) -> DeviceContext``: the
  node's stream made current, its ``rule`` the device's own rule for the node, None for the
  definition's), run with the array module ``xp`` on arrays of ``array_type``;
  ``to_device`` makes a value (an input of another device, a rule's result) this device's
  array;
- the device: ``name`` / ``device_type`` (the runtime, the DeviceType it serves),
  ``allocator`` (its ``Allocator``, which also says which allocation an array
  lives in and moves host data in and out: ``memory_of``, ``owner``, ``import_host``,
  ``export``), ``event_type`` (an event is *recorded on a stream* by ``signal``, *waited on
  by a stream* by ``wait(value, stream=...)``, *waited on by the host* by ``wait(value)``),
  ``new_stream`` / ``synchronize`` (MLX's), ``info`` (``mx.device_info``), ``machine``
  (the roofline's limits);
- what fusion asks before it makes a tape: ``dialect`` (its kernels' renderer dialect),
  ``reduction_tapes``, ``sequential_forms`` (what the rules ask of the array module,
  ``rules/forms.py``);
- the loaded kernels the eval loop launches without a rule (read once per backend:
  core/_loop.c ``BackendInfo``; None where it has none): ``compiled_launch`` (a fused
  call's plan), ``eager_kernel`` (an eager elementwise op's one-op kernel),
  ``launch_fused`` (the launch of either on a stream), ``device_api`` (the same launch and
  the eval's host wait in C), ``compiled_prebuild`` (an eval's new kernels built in
  parallel).

``quiet`` (the floating-point state a rule runs in: numpy's warnings silenced, as MLX has
none) follows from ``array_type``; it is not declared. Each backend declares its name,
device type and dialect (the base is no device's, the CPU's included); the other defaults
are host memory's (numpy arrays, no device context). Backends are registered per device type (``"cpu"``,
``"gpu"``): the CPU one (``cpu/backend.py``) always; a GPU one only when a GPU runtime
really evaluates arrays (the CUDA runtime of ``kernels/cuda``, opt-in with
``TAPESCOPE_CUDA=1`` for now; the Metal runtime of ``kernels/metal`` on macOS, opt-in with
``TAPESCOPE_METAL=1``), or when a test registers its own (``register``). ``mx.gpu`` is
available, and the default device, only while a GPU backend is registered (one GPU per
process: ``gpu_count``). CuPy is imported only here and in ``kernels/cuda``, only when asked.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import sys
import threading
from typing import Any, Callable, Optional

import numpy as np

from .allocator import Allocator, allocator as _allocator_of
from .rules import forms
from .stream_workers import Event
from .settings import settings


def _quiet_numpy():
    """A context that silences numpy's floating-point warnings (MLX has none).

    ``np.errstate`` costs ~1.7 us per use; numpy 2 keeps the state in a context variable,
    so where that exists the ignore-all state is made once and set / reset directly."""
    try:
        from numpy._core._ufunc_config import _extobj_contextvar as var
    except ImportError:  # another numpy: the public, slower way
        return lambda: np.errstate(all="ignore")
    with np.errstate(all="ignore"):
        ignore_all = var.get()

    class _Quiet:
        __slots__ = ("token",)

        def __enter__(self):
            self.token = var.set(ignore_all)

        def __exit__(self, *exc):
            var.reset(self.token)
            return False

    return _Quiet


class DeviceContext:
    """What a GPU backend's ``device_context(stream, node)`` returns: a context manager
    entered around the node's rule, whose ``rule`` is the device's own rule for the node
    (None: the definition's rule runs with the backend's array module). This one does
    nothing on entry; a backend's subclass makes the node's stream current."""

    __slots__ = ("rule",)

    def __init__(self, rule: Optional[Callable] = None):
        self.rule = rule

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_QUIET = _quiet_numpy()


class Backend(abc.ABC):
    """The contract every device's runtime fulfils (``cpu/backend.py``, ``cuda/backend.py``,
    ``metal/backend.py``): the hooks and declared facts of ``CONTRACT``. Each declares who
    it is (``DECLARED``); the other defaults here are host memory's (numpy arrays, no
    device context)."""

    # -- facts ------------------------------------------------------------------------------
    #: who it is, which each backend declares (the base is no device's): the runtime's name
    #: (``kernel.sources`` keys, timeline ``runtime``), the DeviceType name it serves, the
    #: renderer dialect of its compiled kernels
    name: str
    device_type: str
    dialect: str
    reduction_tapes = True  # run_compiled runs extended fusion's reduction tapes as one kernel
    #: the device's events (``event_type(stream)``; a fence's producer events too): the
    #: host's ``stream_workers.Event`` is made and signalled by the eval loop in C
    event_type = Event
    array_type = np.ndarray  # the type of the device's arrays; others are moved in (to_device)
    #: a device array type whose storage (``x.raw``, an ``array_type``) CuPy-like rules view
    #: and plans read as it is, ``storage_type(raw)`` wrapping a view of it (CUDA's bfloat16:
    #: ``BF16Array`` over uint16); the eval loop in C takes it for a device's views and its
    #: plans' inputs. None: none
    storage_type: Optional[type] = None
    #: None: the host (the eval loop runs the rules on the caller's thread); a GPU's
    #: function ``(stream, node) -> DeviceContext``: the context a node's rule runs in, which
    #: names the device's own rule for the node
    device_context: Optional[Callable] = None
    #: its array module has numpy's sequential forms (every ufunc's ``accumulate`` and ``at``
    #: in order, the last of repeated positions kept by an assignment, linalg raising where
    #: it cannot factor, a host loop over an axis cheap): the rules ask it through
    #: ``rules/forms.sequential(xp)``; False: they use the forms' log-step versions
    sequential_forms = True
    #: primitive name -> the device's generated-kernel rule for it (the CPU's: MLX's
    #: reductions and fast primitives as C), which the eval loop runs in place of the
    #: definition's rule on a device without a device context (the context's ``rule`` on one
    #: with); the eval loop in C finds the plans of those that are ``KernelRule``s
    kernel_rules: dict = {}
    #: a function of a fused call, ``(tape, inputs, shape) -> launch plan or None``, giving
    #: its loaded kernel's plan (what ``launch_fused`` runs: a ``kernel_call.PlanLookup``)
    compiled_launch: Optional[Callable] = None
    #: a function building an eval's new fused kernels in parallel, ``(items) -> None``
    compiled_prebuild: Optional[Callable] = None
    #: a device's eager elementwise op as a plan of its own one-op kernel, ``eager_kernel(
    #: prim, inputs, dtype, shape) -> plan or None``, launched as a loaded fused call is
    #: (``device_api``, else ``launch_fused``); None: the op's rule runs. Its ``casts``:
    #: whether it plans ``AsType`` (a cast) as well
    eager_kernel: Optional[Callable] = None
    #: the backend's launch and host wait in C (a capsule of the table in
    #: kernels/_device_api.h), which the eval loop (core/_loop.c) calls for a device's
    #: loaded fused call and an eval's wait; None: it calls ``launch_fused`` and waits on the
    #: eval's event in Python. A host backend has none (its launch is the call itself)
    device_api = None

    def __init__(self, xp: Any = np, alloc: Optional[Allocator] = None):
        undeclared = [f for f in DECLARED if not hasattr(self, f)]
        if undeclared:
            raise TypeError(f"{type(self).__name__} declares no {', '.join(undeclared)} "
                            "(each backend says who it is)")
        self.xp = xp
        self.allocator = alloc if alloc is not None else _allocator_of(self.device_type)
        # (derived, not declared: numpy raises floating-point warnings, MLX has none)
        self.quiet = _QUIET if self.array_type is np.ndarray else contextlib.nullcontext

    # -- evaluating -------------------------------------------------------------------------
    @abc.abstractmethod
    def run_compiled(self, tape, inputs, shape, out=None, donatable=None) -> list:
        """The outputs of fused tape ``tape`` on ``inputs`` (its device's arrays) for the
        kernel shape ``shape``: ``out`` is memory offered for a single output, ``donatable``
        the inputs whose buffers the outputs may take (MLX's Compiled::eval_cpu / eval_gpu).
        The ``Compiled`` rule is given ``backend.run_compiled`` as its runtime."""

    def to_device(self, data: Any) -> Any:
        """``data`` as this device's array: an input that lives elsewhere (another device's
        array) moved in, a rule's result (a numpy scalar, a device's lazy value) made an
        array."""
        return host_array(data)

    def launch_fused(self, stream: Any, launch: Any, inputs: list, out: Any) -> None:
        """Run a loaded kernel's plan (a ``compiled_launch`` or ``eager_kernel`` plan) on
        ``inputs`` into ``out`` for a node of ``stream`` (the host's C kernel: called right
        here). The eval loop's one hook into a backend for a loaded kernel (core/_loop.c
        run_node, ``evaluate._fused_launch``); a GPU's enqueues on the stream's device queue."""
        launch.call(inputs, (out,))

    # -- streams and the device -------------------------------------------------------------
    def new_stream(self, stream: Any) -> None:
        """Called once per stream that evaluates on this backend (MLX's ``new_stream``: a
        GPU makes its device stream or queue)."""

    def synchronize(self, stream: Any) -> None:
        """Wait for the device work of ``stream`` (the host's is the worker's: nothing)."""

    def info(self) -> dict:
        """``mx.device_info`` of this backend's device (the CPU's is in core)."""
        return {}

    def machine(self) -> Optional[Any]:
        """The device's limits for the roofline (``roofline.Machine``: copy bandwidth, peak
        FLOP/s), measured on the first call; None where the backend has none."""
        return None

    def __repr__(self) -> str:
        return f"<Backend {self.name} on {self.device_type}: {getattr(self.xp, '__name__', self.xp)}>"


#: The contract: the hooks a backend may write (``run_compiled`` it must), then the facts it
#: declares (``xp`` and ``allocator`` given to ``Backend.__init__``). Nothing else of a
#: backend is asked by the layers above it; ``quiet`` is derived from ``array_type``.
CONTRACT = {
    "methods": ("run_compiled", "to_device", "launch_fused", "new_stream", "synchronize",
                "info", "machine"),
    "facts": ("name", "device_type", "dialect", "reduction_tapes", "event_type", "array_type",
              "storage_type", "device_context", "sequential_forms", "kernel_rules", "compiled_launch",
              "compiled_prebuild", "eager_kernel", "device_api", "xp", "allocator"),
    "derived": ("quiet",),
}


#: the facts with no default: each backend declares its own (``Backend.__init__`` checks)
DECLARED = ("name", "device_type", "dialect")


_lock = threading.Lock()
_backends: dict[str, Backend] = {}
_by_stream: dict[int, Backend] = {}  # stream index -> its device's backend (the eval loop's lookup)


def register(backend_: Backend) -> Optional[Backend]:
    """Make ``backend_`` the runtime of its device type; returns the one it replaces."""
    with _lock:
        old = _backends.get(backend_.device_type)
        _backends[backend_.device_type] = backend_
        _by_stream.clear()
        _declare_forms()
        return old


def unregister(device_type: str) -> Optional[Backend]:
    """Remove the runtime of ``device_type`` (the CPU's cannot be removed)."""
    if device_type == "cpu":
        raise ValueError("the CPU backend cannot be unregistered")
    with _lock:
        _by_stream.clear()
        old = _backends.pop(device_type, None)
        _declare_forms()
        return old


def _declare_forms() -> None:
    """Tell the rules which backend computes with each array module (``rules/forms.py``; the
    CPU's last: its numpy wins over a test GPU that computes with numpy too)."""
    forms.declare(sorted(_backends.values(), key=lambda b: b.device_type == "cpu"))


def backend(device: Any) -> Backend:
    """The backend of a device: a ``Device``, a ``Stream`` (its device), a ``DeviceType``
    or a type name."""
    if not isinstance(device, str):
        device = getattr(device, "device", device)
        device = getattr(device, "type", device).name
    try:
        return _backends[device]
    except KeyError:
        raise RuntimeError(f"no tapescope backend runs on device type {device!r}") from None


def existing_stream_backend(index: int) -> Optional[Backend]:
    """The backend a stream has run on so far (None: no work has gone to it yet)."""
    return _by_stream.get(index)


def stream_backend(stream: Any) -> Backend:
    """``backend(stream)``, remembered per stream index (one dict lookup per node)."""
    b = _by_stream.get(stream.index)
    if b is None:
        b = backend(stream)
        b.new_stream(stream)
        _by_stream[stream.index] = b
    return b


def host_array(data: Any) -> np.ndarray:
    """``data`` in host memory: itself for a numpy array, a copy of a device array, a numpy
    scalar as a 0-d array. A device array broadcast along some axes (stride 0) copies one
    element along them and is the same read-only broadcast on the host, as MLX's CPU reads
    a broadcast in place: it is not materialised, which could take more memory than the
    device has."""
    if type(data) is np.ndarray:
        return data
    if isinstance(data, np.generic):
        return np.asarray(data)
    get = getattr(data, "get", None)  # CuPy: device to host
    if get is None:
        return data if isinstance(data, np.ndarray) else np.asarray(data)
    if data.size > 1 and 0 in data.strides:
        one = tuple(slice(0, 1) if s == 0 else slice(None) for s in data.strides)
        return np.broadcast_to(data[one].get(), data.shape)
    return get()


def registered() -> dict:
    """Device type -> backend, for every registered runtime."""
    return dict(_backends)


from .cpu.backend import CpuBackend  # noqa: E402 (it subclasses Backend, defined above)

register(CpuBackend())


@functools.lru_cache(maxsize=None)
def cuda_device_count() -> int:
    """The number of CUDA devices CuPy can reach (0 when CuPy or a GPU is missing)."""
    if settings.disable_gpu:
        return 0
    try:
        import cupy  # noqa: F401

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def cuda_runtime_available() -> bool:
    """Whether tapescope's CUDA runtime evaluates arrays here (``mx.cuda.is_available``).

    True once ``kernels/cuda``'s backend is registered (see ``_register_cuda``)."""
    if not gpu_available():
        return False
    b = _backends.get("gpu")
    return b is not None and b.name == "cuda"


def gpu_available() -> bool:
    """Whether some GPU backend evaluates arrays here (the CUDA runtime registers itself on
    the first question, see ``_register_cuda``). ``TAPESCOPE_DISABLE_GPU`` hides every GPU
    backend."""
    if _cuda_state is None:
        _register_cuda()
    if _metal_state is None:
        _register_metal()
    return "gpu" in _backends and not settings.disable_gpu


_cuda_state: Optional[str] = None  # None: not tried; else what happened


def _register_cuda() -> None:
    """Register the CUDA runtime (``kernels/cuda``) when CuPy reaches a GPU.

    Opt-in (``TAPESCOPE_CUDA=1``) until its suite has passed on a GPU machine: without it a
    machine with a GPU keeps the CPU as the default device, as before the runtime existed."""
    global _cuda_state
    with _lock:
        if _cuda_state is not None:
            return
        _cuda_state = "off"
    if not settings.cuda or settings.disable_gpu:
        return
    if "gpu" in _backends or cuda_device_count() == 0:
        return
    from .cuda.backend import CudaBackend

    register(CudaBackend())
    _cuda_state = "registered"


_metal_state: Optional[str] = None  # None: not tried; else what happened


def _register_metal() -> None:
    """Register the Metal runtime (``kernels/metal``) on macOS with PyObjC's Metal.

    Opt-in (``TAPESCOPE_METAL=1``) until its suite (tests/test_metal_runtime.py) has passed
    on Apple hardware, which it has not yet: without it a Mac keeps the CPU as the default
    device."""
    global _metal_state
    with _lock:
        if _metal_state is not None:
            return
        _metal_state = "off"
    if (sys.platform != "darwin" or not settings.metal or settings.disable_gpu
            or "gpu" in _backends):
        return
    try:
        from .metal.backend import MetalBackend

        register(MetalBackend())
        _metal_state = "registered"
    except Exception as e:  # no PyObjC, no device: the CPU stays the default
        _metal_state = f"unavailable: {e}"


def metal_runtime_available() -> bool:
    """Whether tapescope's Metal runtime evaluates arrays here (``mx.metal.is_available``)."""
    if not gpu_available():
        return False
    b = _backends.get("gpu")
    return b is not None and b.name == "metal"


def gpu_count() -> int:
    """GPUs that tapescope's GPU runtime can use (0 without one): one per process, as MLX's
    NCCL backend gives each rank one (``cuda/device.py selected``)."""
    return 1 if gpu_available() else 0
