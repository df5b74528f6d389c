"""A stand-in for PyObjC's ``Metal`` module, for running the Metal runtime's plumbing on
Linux: only the calls ``kernels/metal/runtime.py`` makes, with PyObjC's selector spellings.
Buffers are host bytearrays; libraries compile with the Metal shim (the system C++
compiler); a command buffer runs its encoded dispatches, in order, when it is committed;
shared events are counters. It checks the call shapes the runtime depends on, not Metal's
timing or concurrency. ``install()`` puts it in ``sys.modules["Metal"]``."""

from __future__ import annotations

import sys
import types

import numpy as np

MTLResourceStorageModeShared = 0
LOG: dict = {"libraries": 0, "pipelines": 0, "commits": 0, "dispatches": 0}


def MTLSizeMake(x, y, z):
    return (int(x), int(y), int(z))


class _Named:
    def __init__(self, name):
        self._name = name

    def name(self):
        return self._name


class _Contents:
    def __init__(self, data):
        self.data = data

    def as_buffer(self, n):
        return memoryview(self.data)[:n]


class FakeBuffer:
    def __init__(self, n):
        self.data = bytearray(n)

    def contents(self):
        return _Contents(self.data)

    def length(self):
        return len(self.data)


class FakeFunction:
    def __init__(self, lib, name):
        self.lib, self.name = lib, name


class FakeLibrary:
    def __init__(self, source):
        self.source = source
        self.shim = {}  # function name -> shim Library

    def newFunctionWithName_(self, name):
        return FakeFunction(self, name) if f" {name}(" in self.source else None


class FakePipeline:
    def __init__(self, fn):
        from tapescope.kernels.metal import shim

        self.fn = fn
        self.lib = shim.Library([fn.lib.source], [shim.Entry(0, fn.name)])

    def maxTotalThreadsPerThreadgroup(self):
        return 1024


class FakeEvent:
    def __init__(self):
        self.value = 0

    def signaledValue(self):
        return self.value

    def setSignaledValue_(self, v):
        self.value = v


class FakeEncoder:
    def __init__(self, cb):
        self.cb, self.pso, self.binds = cb, None, {}

    def setComputePipelineState_(self, pso):
        self.pso = pso

    def setBuffer_offset_atIndex_(self, buf, off, k):
        self.binds[k] = (buf, off)

    def setBytes_length_atIndex_(self, data, n, k):
        self.binds[k] = (np.frombuffer(bytes(data), np.uint8)[:n].copy(), 0)

    def dispatchThreads_threadsPerThreadgroup_(self, grid, tg):
        self.cb.commands.append(("dispatch", self.pso, dict(self.binds), grid, tg))

    def endEncoding(self):
        pass


class FakeCommandBuffer:
    def __init__(self):
        self.commands, self.handlers, self.done = [], [], False

    def computeCommandEncoder(self):
        return FakeEncoder(self)

    def encodeSignalEvent_value_(self, ev, v):
        self.commands.append(("signal", ev, v))

    def encodeWaitForEvent_value_(self, ev, v):
        self.commands.append(("wait", ev, v))

    def addCompletedHandler_(self, fn):
        self.handlers.append(fn)

    def commit(self):
        LOG["commits"] += 1
        for cmd in self.commands:
            if cmd[0] == "dispatch":
                _, pso, binds, grid, tg = cmd
                bufs = {}
                for k, (b, off) in binds.items():
                    raw = b if isinstance(b, np.ndarray) else np.frombuffer(b.data, np.uint8)
                    bufs[k] = raw[off:]
                pso.lib.run(0, bufs, grid, tg)
                LOG["dispatches"] += 1
            elif cmd[0] == "signal":
                cmd[1].value = max(cmd[1].value, cmd[2])
            elif cmd[1].value < cmd[2]:  # a GPU would wait forever: a test bug
                raise RuntimeError("fake Metal: wait on an event not yet signalled")
        self.done = True
        for fn in self.handlers:
            fn(self)

    def waitUntilCompleted(self):
        assert self.done, "waitUntilCompleted before commit"

    def error(self):
        return None


class FakeQueue:
    def commandBuffer(self):
        return FakeCommandBuffer()


class FakeDevice:
    def name(self):
        return "Fake Metal device (tests/fake_metal.py over the Metal shim)"

    def architecture(self):
        return _Named("applegpu_g15s")

    def maxBufferLength(self):
        return 1 << 34

    def recommendedMaxWorkingSetSize(self):
        return 1 << 33

    def newCommandQueue(self):
        return FakeQueue()

    def newBufferWithLength_options_(self, n, opts):
        assert opts == MTLResourceStorageModeShared
        return FakeBuffer(n)

    def newLibraryWithSource_options_error_(self, source, opts, err):
        LOG["libraries"] += 1
        return FakeLibrary(source), None

    def newComputePipelineStateWithFunction_error_(self, fn, err):
        LOG["pipelines"] += 1
        return FakePipeline(fn), None

    def newSharedEvent(self):
        return FakeEvent()


class _Options:
    def setFastMathEnabled_(self, on):
        self.fast = on


MTLCompileOptions = types.SimpleNamespace(new=_Options)
_DEVICE = FakeDevice()


def MTLCreateSystemDefaultDevice():
    return _DEVICE


def install() -> None:
    sys.modules["Metal"] = sys.modules[__name__]
