"""A stand-in for ``cupy.cuda.nccl`` over mpi4py, on ``tests/fake_cupy.py``: runs the NCCL
path of ``mx.distributed`` (init, the communicator, split, the rules' calls by pointer,
count and NCCL type) on CPU processes under ``mpirun``, without a GPU or NCCL.

``install()`` installs fake_cupy, gives its arrays CuPy's ``.data.ptr`` and
``asnumpy(..., stream=)``, and makes ``from cupy.cuda import nccl`` this module. A
communicator is an MPI communicator of the ranks that passed the same unique id (split from
COMM_WORLD: every world rank must make one, as in this repository's worker). Buffers are
read and written through their addresses, as NCCL does; the work is synchronous.
"""

from __future__ import annotations

import ctypes
import os
import sys
import types
import zlib

import ml_dtypes
import numpy as np

NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = range(6)
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
_TYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32,
          NCCL_UINT32: np.uint32, NCCL_INT64: np.int64, NCCL_UINT64: np.uint64,
          NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64,
          NCCL_BFLOAT16: ml_dtypes.bfloat16}
calls: list = []  # (name, stream) of every call: the tests check the stream NCCL ran on


def get_version() -> int:
    return 22800


def get_unique_id() -> bytes:  # CuPy 14's form (on the H200 machine): the id's 128 bytes
    return os.urandom(128)


def _view(ptr: int, count: int, t: int) -> np.ndarray:
    dt = np.dtype(_TYPES[t])
    if count == 0:
        return np.empty(0, dt)
    raw = (ctypes.c_uint8 * (count * dt.itemsize)).from_address(ptr)
    return np.frombuffer(raw, np.uint8).view(dt)


def _reduce(parts: np.ndarray, op: int) -> np.ndarray:
    f = {NCCL_SUM: np.sum, NCCL_MAX: np.max, NCCL_MIN: np.min}[op]
    return f(parts, axis=0).astype(parts.dtype)


class NcclCommunicator:
    def __init__(self, ndev: int, commId: bytes, rank: int):
        from mpi4py import MPI

        if not isinstance(commId, bytes):
            raise TypeError("Argument 'commId' has incorrect type (expected bytes)")
        color = zlib.crc32(commId) & 0x7FFFFFFF
        self.mpi = MPI.COMM_WORLD.Split(color, rank)
        assert self.mpi.Get_size() == ndev and self.mpi.Get_rank() == rank, (ndev, rank)

    def _gather(self, a: np.ndarray) -> np.ndarray:
        n = self.mpi.Get_size()
        buf = np.empty((n, a.nbytes), np.uint8)
        self.mpi.Allgather(np.ascontiguousarray(a).view(np.uint8), buf)
        return buf.view(a.dtype).reshape((n,) + a.shape)

    def allReduce(self, send, recv, count, t, op, stream):
        calls.append(("allReduce", stream))
        _view(recv, count, t)[...] = _reduce(self._gather(_view(send, count, t).copy()), op)

    def allGather(self, send, recv, count, t, stream):
        calls.append(("allGather", stream))
        parts = self._gather(_view(send, count, t).copy())
        _view(recv, count * self.mpi.Get_size(), t)[...] = parts.reshape(-1)

    def reduceScatter(self, send, recv, recvcount, t, op, stream):
        calls.append(("reduceScatter", stream))
        n, r = self.mpi.Get_size(), self.mpi.Get_rank()
        parts = self._gather(_view(send, recvcount * n, t).copy())
        total = _reduce(parts, op)
        _view(recv, recvcount, t)[...] = total[r * recvcount:(r + 1) * recvcount]

    def send(self, send, count, t, peer, stream):
        calls.append(("send", stream))
        self.mpi.Send(_view(send, count, t).view(np.uint8).copy(), dest=peer, tag=7)

    def recv(self, recv, count, t, peer, stream):
        calls.append(("recv", stream))
        self.mpi.Recv(_view(recv, count, t).view(np.uint8), source=peer, tag=7)


def install() -> None:
    """fake_cupy as ``cupy`` and this module as ``cupy.cuda.nccl`` (a fresh process only)."""
    import fake_cupy

    fake_cupy.install()
    fake_cupy.ndarray.data = property(
        lambda self: types.SimpleNamespace(ptr=self.__array_interface__["data"][0]))
    plain = fake_cupy.asnumpy
    fake_cupy.asnumpy = lambda a, stream=None, **kw: plain(a)
    fake_cupy.cuda.Stream.ptr = property(lambda self: id(self))
    fake_cupy.cuda.nccl = sys.modules[__name__]
    sys.modules["cupy.cuda"] = fake_cupy.cuda
    sys.modules["cupy.cuda.nccl"] = sys.modules[__name__]
