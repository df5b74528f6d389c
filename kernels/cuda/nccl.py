"""NCCL through CuPy (``cupy.cuda.nccl``): the communicator of ``mx.distributed``'s "nccl"
backend and the collectives its rules run (``mlx/distributed/nccl/nccl.cpp``).

- ``world(strict)``: one ``NcclCommunicator`` per process, on this process's GPU
  (``device.selected()``: local rank % device count; MLX: ``cudaSetDevice(rank % ndev)``).
  Ranks and the unique id come from the launcher: under ``mpirun`` mpi4py's ``COMM_WORLD``
  (rank 0's ``get_unique_id()`` broadcast), else MLX's variables ``MLX_RANK``,
  ``MLX_WORLD_SIZE``, ``NCCL_HOST_IP``, ``NCCL_PORT`` (rank 0 listens on the port and sends
  the id to every other rank over TCP, as MLX's ``bootstrap_unique_id``).
- ``NcclComm`` answers ``Get_rank`` / ``Get_size`` as mpi4py's communicators do (the shape
  rules and the timeline read those) and ``Split`` as ``ncclCommSplit`` (MLX's split): the
  (color, key) of every rank are gathered over NCCL, each color's first rank by key makes a
  unique id that is gathered too, and the members make a new communicator.
- ``all_reduce`` / ``all_gather`` / ``reduce_scatter`` / ``send`` / ``recv`` enqueue NCCL on
  CuPy's current stream: inside ``CudaBackend.device_context`` that is the ``mx`` stream's
  CUDA stream (``device.cuda_stream(stream.index)``), so they are ordered with the GPU work
  around them and the host does not wait. Dtypes are MLX's NCCL list (int8, uint8, int32,
  uint32, int64, uint64, float16, bfloat16, float32, float64); others raise MLX's
  ``[nccl] Unknown or unsupported dtype``. bfloat16 arrays live on the host in this runtime
  (CuPy has no bfloat16): their bytes go to the device and back, waited for on the stream.
- MLX's NCCL backend raises for send / recv ("[nccl] Send not supported in NCCL backend.");
  here they run as ``ncclSend`` / ``ncclRecv`` (an extension: tapescope's MPI backend has
  them, and the same program then runs on either).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any, Optional

import cupy
import numpy as np

from . import device

_UNSUPPORTED = "[nccl] Unknown or unsupported dtype"
_ID_BYTES = 128


def _nccl():
    from cupy.cuda import nccl

    return nccl


def available() -> bool:
    """Whether CuPy's NCCL bindings load (``cupy.cuda.nccl`` with a usable libnccl)."""
    try:
        _nccl().get_version()
        return True
    except Exception:
        return False


def _dtypes() -> dict:
    n = _nccl()
    table = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
             "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
             "float16": "NCCL_FLOAT16", "bfloat16": "NCCL_BFLOAT16",
             "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}
    # NCCL's ncclBfloat16 is 9 where CuPy predates the constant
    return {k: getattr(n, v, 9 if k == "bfloat16" else None) for k, v in table.items()}


def nccl_dtype(dtype: Any) -> int:
    """NCCL's data type of a numpy dtype, or MLX's ValueError."""
    t = _dtypes().get(np.dtype(dtype).name)
    if t is None:
        raise ValueError(_UNSUPPORTED)
    return t


class NcclComm:
    """A CuPy ``NcclCommunicator`` with mpi4py's ``Get_rank`` / ``Get_size`` / ``Split``."""

    nccl = True

    def __init__(self, comm: Any, rank: int, size: int, device_id: int):
        self.comm, self.rank, self.size, self.device_id = comm, rank, size, device_id

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Split(self, color: int, key: int) -> "NcclComm":
        """``ncclCommSplit``: the ranks with the same ``color``, ranked by ``key`` (then by
        rank). Every rank of this communicator must call it (NCCL's rule, as MLX's)."""
        with cupy.cuda.Device(self.device_id):
            s = cupy.cuda.Stream(non_blocking=True)
            mine = cupy.asarray(np.array([color, key, self.rank], np.int64))
            rows = _gather_now(self, mine, s).reshape(self.size, 3)
            members = sorted((int(k), int(r)) for c, k, r in rows if int(c) == int(color))
            new_rank = [r for _, r in members].index(self.rank)
            uid = np.zeros(_ID_BYTES, np.int8)
            if new_rank == 0:
                uid[:] = _as_id(_nccl().get_unique_id())
            ids = _gather_now(self, cupy.asarray(uid), s).reshape(self.size, _ID_BYTES)
            leader = members[0][1]
            comm = _communicator(len(members), _as_id(ids[leader]), new_rank)
        return NcclComm(comm, new_rank, len(members), self.device_id)


def _gather_now(c: NcclComm, a: "cupy.ndarray", s: "cupy.cuda.Stream") -> np.ndarray:
    out = cupy.empty((c.size,) + a.shape, a.dtype)
    c.comm.allGather(a.data.ptr, out.data.ptr, a.size, nccl_dtype(a.dtype), s.ptr)
    s.synchronize()
    return cupy.asnumpy(out)


def _as_id(raw: Any) -> tuple:
    """A unique id as its 128 signed byte values, from any form CuPy gives it: ``bytes``
    (CuPy 14's ``get_unique_id``, seen on the H200 machine), or a sequence of ints."""
    if isinstance(raw, (bytes, bytearray)):
        return tuple(int(v) for v in np.frombuffer(bytes(raw), np.int8))
    return tuple(int(v) for v in np.asarray(raw).astype(np.int8))


def _communicator(size: int, uid: tuple, rank: int) -> Any:
    """CuPy's ``NcclCommunicator`` over a unique id (``_as_id``'s values) in the form this
    CuPy takes: ``bytes`` (CuPy 14), else the tuple of ints older CuPy documents."""
    n = _nccl()
    try:
        return n.NcclCommunicator(size, np.array(uid, np.int8).tobytes(), rank)
    except TypeError:
        return n.NcclCommunicator(size, tuple(uid), rank)


# -- the world communicator -------------------------------------------------------------------
_MLX_VARS = ("NCCL_HOST_IP", "NCCL_PORT", "MLX_RANK", "MLX_WORLD_SIZE")


def _missing_var_error(strict: bool) -> Optional[str]:
    """MLX's strict error for its first unset variable (``get_env_var_or_throw``)."""
    for v in _MLX_VARS:
        if not os.environ.get(v):
            return (f"[nccl] Required environment variable '{v}' is not set. Please set it "
                    "before initializing the distributed backend.")
    return None


def _tcp_unique_id(rank: int, size: int, host: str, port: int, timeout: float = 60.0) -> tuple:
    """MLX's ``bootstrap_unique_id``: rank 0 makes the id and sends it to every other rank."""
    if rank == 0:
        uid = _as_id(_nccl().get_unique_id())
        payload = struct.pack(f"{_ID_BYTES}b", *uid)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind((host, port))
            srv.listen(size)
            srv.settimeout(timeout)
            for _ in range(size - 1):
                conn, _ = srv.accept()
                with conn:
                    conn.sendall(payload)
        return uid
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=5.0) as conn:
                buf = b""
                while len(buf) < _ID_BYTES:
                    chunk = conn.recv(_ID_BYTES - len(buf))
                    if not chunk:
                        raise ConnectionError("[nccl] the unique id's connection closed early")
                    buf += chunk
                return struct.unpack(f"{_ID_BYTES}b", buf)
        except (ConnectionRefusedError, socket.timeout, OSError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"[Rank {rank}] connect() failed after {int(timeout * 1000)}"
                                   f" ms to {host}:{port}") from None
            time.sleep(0.05)


def world(strict: bool, mpi_comm: Any = None) -> Optional[NcclComm]:
    """The NCCL world: from ``mpi_comm`` (mpi4py's COMM_WORLD under mpirun) or MLX's
    variables; None when neither launched more than one process (MLX's error if strict)."""
    dev = device.selected()
    if mpi_comm is not None and mpi_comm.Get_size() > 1:
        rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        uid = mpi_comm.bcast(_as_id(_nccl().get_unique_id()) if rank == 0 else None, root=0)
    else:
        err = _missing_var_error(strict)
        if err is not None:
            if strict:
                raise RuntimeError(err)
            return None
        rank, size = int(os.environ["MLX_RANK"]), int(os.environ["MLX_WORLD_SIZE"])
        uid = _tcp_unique_id(rank, size, os.environ["NCCL_HOST_IP"],
                             int(os.environ["NCCL_PORT"]))
    with cupy.cuda.Device(dev):
        comm = _communicator(size, uid, rank)
    return NcclComm(comm, rank, size, dev)


# -- the collectives (run by kernels/rules/distributed.py) ------------------------------------
def _on_device(a: Any):
    """``a`` as a contiguous device array NCCL can read, and its host dtype when it came
    from the host (bfloat16: its bytes as uint16)."""
    t = nccl_dtype(a.dtype)
    if isinstance(a, cupy.ndarray):
        return cupy.ascontiguousarray(a), None, t
    h = np.ascontiguousarray(a)
    raw = h.view(np.uint16) if h.dtype.name == "bfloat16" else h
    return cupy.asarray(raw), h.dtype, t


def _back(out: "cupy.ndarray", host_dtype: Any):
    if host_dtype is None:
        return out
    s = cupy.cuda.get_current_stream()
    h = cupy.asnumpy(out, stream=s)
    s.synchronize()
    return h.view(host_dtype)


def _op(reduce: str) -> int:
    n = _nccl()
    return {"sum": n.NCCL_SUM, "max": n.NCCL_MAX, "min": n.NCCL_MIN}[reduce]


def all_reduce(a: Any, reduce: str, c: NcclComm):
    d, host, t = _on_device(a)
    out = cupy.empty_like(d)
    c.comm.allReduce(d.data.ptr, out.data.ptr, d.size, t, _op(reduce),
                     cupy.cuda.get_current_stream().ptr)
    return _back(out, host)


def all_gather(a: Any, c: NcclComm):
    """Every rank's ``a`` stacked on a new leading axis, in rank order."""
    d, host, t = _on_device(a)
    out = cupy.empty((c.size,) + d.shape, d.dtype)
    c.comm.allGather(d.data.ptr, out.data.ptr, d.size, t, cupy.cuda.get_current_stream().ptr)
    return _back(out, host)


def reduce_scatter(a: Any, c: NcclComm):
    """The sum over ranks of ``a``; this rank keeps block ``rank`` of axis 0."""
    d, host, t = _on_device(a)
    out = cupy.empty((d.shape[0] // c.size,) + d.shape[1:], d.dtype)
    c.comm.reduceScatter(d.data.ptr, out.data.ptr, out.size, t, _nccl().NCCL_SUM,
                         cupy.cuda.get_current_stream().ptr)
    return _back(out, host)


def send(a: Any, dst: int, c: NcclComm) -> None:
    d, host, t = _on_device(a)
    s = cupy.cuda.get_current_stream()
    c.comm.send(d.data.ptr, d.size, t, dst, s.ptr)
    if host is not None:  # the staging copy must outlive the send
        s.synchronize()


def recv(shape: tuple, dtype: Any, src: int, c: NcclComm):
    t = nccl_dtype(dtype)
    dt = np.dtype(dtype)
    host = dt if dt.name == "bfloat16" else None
    out = cupy.empty(shape, np.uint16 if host is not None else dt)
    c.comm.recv(out.data.ptr, out.size, t, src, cupy.cuda.get_current_stream().ptr)
    return _back(out, host)
