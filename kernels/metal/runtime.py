"""The Metal runtime through PyObjC (``pyobjc-framework-Metal``): macOS on Apple silicon only.

Reviewed against Apple's Metal API (MTLDevice, MTLCommandQueue, MTLCommandBuffer,
MTLComputeCommandEncoder, MTLBuffer, MTLSharedEvent) and MLX's use of it
(mlx/backend/metal/device.cpp, allocator.cpp, event.cpp), but NOT run on Apple hardware by
its authors: the machines it was written on are Linux. ``tests/test_metal_runtime.py`` runs
it on a Mac, and on Linux over ``tests/fake_metal.py``, a stand-in for PyObjC's ``Metal``
module whose kernels run on the Metal shim.

- ``MetalDevice``: the system default device, MLX's ``device_info`` keys, the command
  buffer limits by architecture (device.cpp: 'p' 20 ops / 40 MB, 'g' 40 / 40, 's' and 'd'
  50 / 50, else 40 / 40; ``MLX_MAX_OPS_PER_BUFFER`` / ``MLX_MAX_MB_PER_BUFFER`` override),
  libraries and pipelines cached by name, shared-storage buffers viewed as numpy arrays;
- ``Queue``: one MTLCommandQueue per ``mx`` stream; kernels are encoded into the current
  command buffer, which is committed once it holds more than the op or megabyte limit (MLX's
  ``CommandEncoder::needs_commit``), or when the stream is synchronised or signals an event;
- ``SharedEvent``: an MTLSharedEvent: signalled / waited on a stream by the GPU
  (``encodeSignalEvent:value:`` / ``encodeWaitForEvent:value:``), waited on by the host.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

import numpy as np

import Metal  # noqa: F401 - PyObjC's framework module; ImportError off macOS

_SHARED = Metal.MTLResourceStorageModeShared
# mlx/backend/metal/device.cpp: command buffer limits by the architecture's last letter
_LIMITS = {"p": (20, 40), "g": (40, 40), "s": (50, 50), "d": (50, 50)}


class MetalError(RuntimeError):
    """A Metal call failed (the message is Metal's)."""


class MetalDevice:
    """The system default Metal device and what is cached on it."""

    def __init__(self):
        self.mtl = Metal.MTLCreateSystemDefaultDevice()
        if self.mtl is None:
            raise MetalError("[metal::Device] Unable to load device")
        arch = self.mtl.architecture().name() if hasattr(self.mtl, "architecture") else ""
        self.arch = str(arch or "")
        ops, mb = _LIMITS.get(self.arch[-1:], (40, 40))
        self.max_ops = int(os.environ.get("MLX_MAX_OPS_PER_BUFFER", ops))
        self.max_mb = int(os.environ.get("MLX_MAX_MB_PER_BUFFER", mb))
        self._lock = threading.Lock()
        self._pipelines: dict = {}  # kernel name -> MTLComputePipelineState
        self._libraries: dict = {}  # library name -> MTLLibrary
        self.buffers: dict = {}  # id(numpy view) -> (MTLBuffer, view)

    def info(self) -> dict:
        """MLX's ``device_info`` for Metal (mlx/backend/metal/device_info.cpp)."""
        memsize = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return {"device_name": str(self.mtl.name()), "architecture": self.arch,
                "max_buffer_length": int(self.mtl.maxBufferLength()),
                "max_recommended_working_set_size": int(self.mtl.recommendedMaxWorkingSetSize()),
                "memory_size": int(memsize), "resource_limit": 499000}

    # -- memory ---------------------------------------------------------------------------
    def new_buffer(self, nbytes: int) -> np.ndarray:
        """A shared-storage MTLBuffer of ``nbytes`` as a uint8 numpy array over its memory
        (unified memory: the CPU and the GPU see the same bytes)."""
        buf = self.mtl.newBufferWithLength_options_(max(nbytes, 1), _SHARED)
        if buf is None:
            raise MetalError(f"[metal::malloc] Unable to allocate {nbytes} bytes.")
        root = np.frombuffer(buf.contents().as_buffer(max(nbytes, 1)), dtype=np.uint8)
        self.buffers[id(root)] = (buf, root)
        return root[:nbytes]

    def free(self, view: np.ndarray) -> None:
        root = view
        while isinstance(root.base, np.ndarray):
            root = root.base
        self.buffers.pop(id(root), None)

    def find(self, a: np.ndarray) -> Optional[tuple]:
        """(MTLBuffer, byte offset of ``a``'s first element) when ``a`` views one of ours."""
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        hit = self.buffers.get(id(root))
        if hit is None:
            return None
        off = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return hit[0], off

    # -- kernels --------------------------------------------------------------------------
    def pipeline(self, kernel: str, library: str, source: str) -> Any:
        """The pipeline of function ``kernel`` in library ``library`` (compiled from
        ``source`` on first use); both cached by name, as MLX's get_library / get_kernel."""
        with self._lock:
            pso = self._pipelines.get(kernel)
            if pso is not None:
                return pso
            lib = self._libraries.get(library)
            if lib is None:
                opts = Metal.MTLCompileOptions.new()
                opts.setFastMathEnabled_(False)  # IEEE inf / NaN, as MLX's "safe" math mode
                lib, err = self.mtl.newLibraryWithSource_options_error_(source, opts, None)
                if lib is None:
                    raise MetalError(f"[metal::Device] Unable to build metal library from "
                                     f"source\n{err}")
                self._libraries[library] = lib
            fn = lib.newFunctionWithName_(kernel)
            if fn is None:
                raise MetalError(f"[metal::Device] Unable to load function {kernel}")
            pso, err = self.mtl.newComputePipelineStateWithFunction_error_(fn, None)
            if pso is None:
                raise MetalError(f"[metal::Device] Unable to load kernel {kernel}\n{err}")
            self._pipelines[kernel] = pso
            return pso

    def new_event(self) -> "SharedEvent":
        return SharedEvent(self.mtl.newSharedEvent())


class Queue:
    """One ``mx`` stream's command queue and its open command buffer."""

    def __init__(self, device: MetalDevice):
        self.device = device
        self.mtl = device.mtl.newCommandQueue()
        self.buffer = None  # the open MTLCommandBuffer
        self.ops = 0
        self.nbytes = 0
        self.keep: list = []  # host copies bound to the open buffer (alive until it completes)
        self.last = None  # the last committed command buffer

    def _open(self):
        if self.buffer is None:
            self.buffer = self.mtl.commandBuffer()
        return self.buffer

    def dispatch(self, pso: Any, buffers: dict, grid: tuple, threadgroup: tuple,
                 outputs: frozenset = frozenset()) -> None:
        """Encode one kernel: buffers by index (numpy arrays: views of our MTLBuffers are
        bound with their offset, other small ones as bytes, larger ones copied into a new
        shared buffer; ``outputs`` must be ours), then ``dispatchThreads`` of ``grid`` in
        ``threadgroup`` groups."""
        for k in outputs:
            if self.device.find(buffers[k]) is None:
                raise MetalError(f"buffer({k}) is an output outside Metal memory")
        cb = self._open()
        enc = cb.computeCommandEncoder()
        enc.setComputePipelineState_(pso)
        for k, a in buffers.items():
            a = np.ascontiguousarray(a)
            hit = self.device.find(a)
            if hit is not None:
                enc.setBuffer_offset_atIndex_(hit[0], hit[1], k)
            elif a.nbytes <= 4096:
                enc.setBytes_length_atIndex_(a.tobytes(), a.nbytes, k)
            else:
                tmp = self.device.new_buffer(a.nbytes)
                tmp[:] = a.reshape(-1).view(np.uint8)
                self.keep.append(tmp)
                buf, off = self.device.find(tmp)
                enc.setBuffer_offset_atIndex_(buf, off, k)
            self.nbytes += a.nbytes
        tg = tuple(max(1, min(int(t), int(g))) for t, g in zip(threadgroup, grid))
        enc.dispatchThreads_threadsPerThreadgroup_(Metal.MTLSizeMake(*grid), Metal.MTLSizeMake(*tg))
        enc.endEncoding()
        self.ops += 1
        if self.ops > self.device.max_ops or (self.nbytes >> 20) > self.device.max_mb:
            self.commit()

    def commit(self) -> None:
        if self.buffer is None:
            return
        self.buffer.commit()
        self.last, self.buffer = self.buffer, None
        self.ops = self.nbytes = 0
        keep, self.keep = self.keep, []
        if keep:  # freed once the buffer using them has completed
            self.last.addCompletedHandler_(lambda _cb: [self.device.free(k) for k in keep])

    def synchronize(self) -> None:
        """Commit and wait for everything encoded so far; a GPU error raises."""
        self.commit()
        if self.last is not None:
            self.last.waitUntilCompleted()
            if self.last.error() is not None:
                raise MetalError(f"[METAL] Command buffer execution failed: {self.last.error()}")

    def signal(self, event: "SharedEvent", value: int) -> None:
        self._open().encodeSignalEvent_value_(event.mtl, value)
        self.commit()

    def wait(self, event: "SharedEvent", value: int) -> None:
        self.commit()
        self._open().encodeWaitForEvent_value_(event.mtl, value)


class SharedEvent:
    """An MTLSharedEvent; the host waits by polling its signalled value."""

    def __init__(self, mtl: Any):
        self.mtl = mtl

    def value(self) -> int:
        return int(self.mtl.signaledValue())

    def host_wait(self, value: int) -> None:
        delay = 1e-5
        while self.value() < value:
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def host_signal(self, value: int) -> None:
        self.mtl.setSignaledValue_(value)
