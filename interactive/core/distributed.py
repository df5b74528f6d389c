"""``mx.distributed``: the singleton group, and MPI (through mpi4py) when launched by mpirun.

A process no launcher started gets MLX's singleton group (rank 0, size 1), on which every
collective returns its input (``mlx/distributed/ops.cpp``: ``if (group.size() == 1) return
x;``) and point-to-point calls raise MLX's errors. Under ``mpirun -np N`` (N > 1, mpi4py
installed) ``init()`` gives the MPI world; each collective is then recorded as MLX's
primitive (``AllReduce``, ``AllGather``, ``ReduceScatter``, ``Send``, ``Recv``; definitions
and rules in ``kernels/rules/distributed.py``) carrying the group's communicator, so it is
lazy, drawn in graphs, never fused, and on the timeline.

NCCL (``backend="nccl"``, or "any" when the CUDA runtime is registered and CuPy's NCCL
loads, as MLX tries NCCL first on CUDA): one GPU per rank, the communicator from
``kernels/cuda/nccl.py`` (ranks and the unique id from mpirun through mpi4py, or MLX's
``MLX_RANK`` / ``MLX_WORLD_SIZE`` / ``NCCL_HOST_IP`` / ``NCCL_PORT``); its collectives run
on a GPU stream (MLX's ``communication_stream``: the default GPU stream unless given).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Callable, Optional, Sequence

from .array import array
from .device import StreamOrDevice, resolve_stream
from .ops.convert import to_array
from .primitive import Primitive

_BACKENDS = ("any", "mpi", "nccl", "jaccl", "ring")
# What launchers set: Open MPI's mpirun, and PMI / PMIx (MPICH's hydra, Slurm).
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")


class Group:
    """A group of processes that communicate: the singleton group, an MPI communicator, or
    an NCCL one (``kernels/cuda/nccl.NcclComm``, which answers mpi4py's calls)."""

    def __init__(self) -> None:
        raise TypeError("No constructor defined!")

    @classmethod
    def _make(cls, comm=None) -> "Group":
        g = object.__new__(cls)
        g._comm = comm  # an mpi4py Comm, or None for the singleton group
        return g

    def rank(self) -> int:
        """This process's rank in the group."""
        return 0 if self._comm is None else self._comm.Get_rank()

    def size(self) -> int:
        """The number of processes in the group."""
        return 1 if self._comm is None else self._comm.Get_size()

    def split(self, color: int, key: int = -1) -> "Group":
        """The subgroup of the processes that pass the same ``color``, ranked by ``key``
        (this rank when ``key`` is negative), as ``MPI_Comm_split`` in MLX's MPI backend
        (``ncclCommSplit`` in its NCCL one)."""
        if self._comm is None:
            raise RuntimeError("Cannot split the distributed group further.")
        return Group._make(self._comm.Split(int(color), self.rank() if key < 0 else int(key)))


_WORLD: Optional[Group] = None
_MPI_WORLD: Optional[Group] = None
_NCCL_WORLD: Optional[Group] = None
_SINGLETON: Optional[Group] = None


def _singleton() -> Group:
    global _SINGLETON
    if _SINGLETON is None:
        _SINGLETON = Group._make()
    return _SINGLETON


def _launched_size() -> int:
    for var in _SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def _mpi_world() -> Optional[Group]:
    """The MPI world group when a launcher started more than one process (mpi4py then
    initializes MPI at import), else None."""
    global _MPI_WORLD
    if _MPI_WORLD is None and _launched_size() > 1 and is_available("mpi"):
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_size() > 1:
            _MPI_WORLD = Group._make(MPI.COMM_WORLD)
    return _MPI_WORLD


def _mpi_comm_world():
    """mpi4py's COMM_WORLD when mpirun launched more than one process, else None."""
    if _launched_size() > 1 and is_available("mpi"):
        from mpi4py import MPI

        return MPI.COMM_WORLD
    return None


def _nccl_world(strict: bool) -> Optional[Group]:
    """The NCCL world group (``kernels/cuda/nccl.world``), or None / MLX's error."""
    global _NCCL_WORLD
    if _NCCL_WORLD is None:
        if not is_available("nccl"):
            if strict:  # as MLX built without NCCL (mlx/distributed/nccl/no_nccl.cpp)
                raise RuntimeError("Cannot initialize nccl distributed backend.")
            return None
        from tapescope.kernels.cuda import nccl

        comm = nccl.world(strict, _mpi_comm_world())
        _NCCL_WORLD = None if comm is None else Group._make(comm)
    return _NCCL_WORLD


def _check_backend(backend: str) -> None:
    if backend not in _BACKENDS:
        raise ValueError(
            "[distributed] The only valid values for backend are 'any', 'mpi', 'nccl', "
            f"'jaccl' and 'ring' but '{backend}' was provided.")


def is_available(backend: str = "any") -> bool:
    """Whether a distributed backend is available: the singleton group always is (MLX's
    ring backend is compiled in), MPI when mpi4py is installed."""
    if backend == "mpi":
        return importlib.util.find_spec("mpi4py") is not None
    if backend == "nccl":  # the CUDA runtime, and CuPy's NCCL bindings loading
        from tapescope.kernels import backends

        if not backends.cuda_runtime_available():
            return False
        from tapescope.kernels.cuda import nccl

        return nccl.available()
    return backend in ("any", "ring")  # MLX answers False for an unknown name


def init(strict: bool = False, backend: str = "any", *,
         all_gather_factory: Optional[Callable[[int, int], Callable[[bytes, int], bytes]]] = None,
         ) -> Group:
    """The world group: NCCL's (backend "nccl", or "any" on the CUDA runtime with NCCL) or
    MPI's when mpirun launched this process (backend "any" or "mpi"), else the singleton
    group (or MLX's error when ``strict``)."""
    global _WORLD
    _check_backend(backend)
    world = None
    if backend == "nccl" or (backend == "any" and is_available("nccl")):
        world = _nccl_world(strict and backend == "nccl")
    if world is None and backend in ("any", "mpi"):
        world = _mpi_world()
    if world is None and strict:
        if backend == "mpi" and is_available("mpi"):
            raise RuntimeError("[mpi] The world has a single process. Launch with mpirun to "
                               "initialize the mpi backend.")
        raise RuntimeError("[distributed] Couldn't initialize any backend")
    if world is None:
        world = _singleton()
    if _WORLD is None:  # the first group initialized is the default one, as in MLX
        _WORLD = world
    return world


def _group(group: Optional[Group]) -> Group:
    return init() if group is None else group


def _collective(name: str, x: Any, group: Optional[Group], stream: StreamOrDevice,
                **params) -> Any:
    """``x`` itself (a new handle) in a singleton group, else the recorded primitive; a
    scalar or numpy ``x`` becomes an array first, as MLX's ``scalar | array`` binding does."""
    g = _group(group)
    x = to_array(x)
    if g.size() == 1:
        return x._handle()
    s = _comm_stream(g, stream)
    prim = Primitive(name, s, comm=g._comm, **params)
    shape = prim.defn.shape([x.shape], comm=g._comm, **params)[0]
    return array._make1(shape, x.dtype, prim, [x])


def _comm_stream(g: Group, stream: StreamOrDevice):
    """MLX's ``communication_stream``: NCCL's collectives default to the GPU's stream."""
    if stream is None and getattr(g._comm, "nccl", False):
        from .device import default_stream, gpu

        return default_stream(gpu)
    return resolve_stream(stream)


def all_sum(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Sum of ``x`` over the group's processes (``x`` itself in the singleton group)."""
    return _collective("AllReduce", x, group, stream, reduce="sum")


def all_max(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Maximum of ``x`` over the group's processes (``x`` itself in the singleton group)."""
    return _collective("AllReduce", x, group, stream, reduce="max")


def all_min(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Minimum of ``x`` over the group's processes (``x`` itself in the singleton group)."""
    return _collective("AllReduce", x, group, stream, reduce="min")


def all_gather(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """``x`` of every process concatenated on axis 0 (``x`` itself in the singleton group)."""
    return _collective("AllGather", x, group, stream)


def sum_scatter(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Sum over the group, each process keeping its slice (``x`` in the singleton group)."""
    n = _group(group).size()
    if n > 1:
        shape = tuple(x.shape) if isinstance(x, array) else ()
        if not shape or shape[0] % n:
            dims = ",".join(str(d) for d in shape)
            raise ValueError(
                f"[sum_scatter] Invalid shape=({dims}) for a group of size {n}. The first "
                "dimension (axis 0) must be divisible by the group size and input mst have "
                "at least one.")
    return _collective("ReduceScatter", x, group, stream)


def _peer(g: Group, rank: int, what: str) -> None:
    if not 0 <= rank < g.size():
        raise ValueError(f"Invalid {what}={rank} for a group of size {g.size()}")


def send(x: Any, dst: int, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Send ``x`` to rank ``dst``; the result is ``x`` once sent (evaluate it to send)."""
    g = _group(group)
    if g.size() == 1:
        raise ValueError("Cannot send to a singleton group")
    _peer(g, dst, "destination")
    return _collective("Send", x, g, stream, dst=int(dst))


def recv(shape: Sequence[int], dtype: Any, src: int, *, group: Optional[Group] = None,
         stream: StreamOrDevice = None) -> Any:
    """Receive an array of ``shape`` and ``dtype`` from rank ``src``."""
    g = _group(group)
    if g.size() == 1:
        raise ValueError("Cannot recv from a singleton group")
    _peer(g, src, "source")
    shape = tuple(int(d) for d in shape)
    prim = Primitive("Recv", _comm_stream(g, stream), shape=shape, dtype=dtype.np,
                     src=int(src), comm=g._comm)
    return array._make1(shape, dtype, prim, [])


def recv_like(x: Any, src: int, *, group: Optional[Group] = None,
              stream: StreamOrDevice = None) -> Any:
    """Receive an array shaped and typed like ``x`` from rank ``src``."""
    return recv(x.shape, x.dtype, src, group=group, stream=stream)
