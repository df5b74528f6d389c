"""``mx.distributed`` for one process: the singleton group and its collectives.

A process that is not launched by a distributed launcher gets MLX's singleton group (rank 0,
size 1), on which every collective returns its input (``mlx/distributed/ops.cpp``:
``if (group.size() == 1) return x;``) and point-to-point calls raise MLX's errors. Real
backends (MPI, NCCL, ring) are issue 22; ``mlx.nn`` needs this much at import and run time.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from .array import array
from .device import StreamOrDevice

_BACKENDS = ("any", "mpi", "nccl", "jaccl", "ring")


class Group:
    """A group of processes that communicate (here always the singleton group)."""

    def __init__(self) -> None:
        raise TypeError("No constructor defined!")

    @classmethod
    def _singleton(cls) -> "Group":
        return object.__new__(cls)

    def rank(self) -> int:
        """This process's rank in the group."""
        return 0

    def size(self) -> int:
        """The number of processes in the group."""
        return 1

    def split(self, color: int, key: int = -1) -> "Group":
        """Split the group into subgroups (a singleton group cannot be split)."""
        raise RuntimeError("Cannot split the distributed group further.")


_WORLD: Optional[Group] = None


def _check_backend(backend: str) -> None:
    if backend not in _BACKENDS:
        raise ValueError(
            "[distributed] The only valid values for backend are 'any', 'mpi', 'nccl', "
            f"'jaccl' and 'ring' but '{backend}' was provided.")


def is_available(backend: str = "any") -> bool:
    """Whether a distributed backend is available (the singleton group always is, as MLX's
    ring backend is compiled in)."""
    return backend in ("any", "ring")  # MLX answers False for an unknown name


def init(strict: bool = False, backend: str = "any", *,
         all_gather_factory: Optional[Callable[[int, int], Callable[[bytes, int], bytes]]] = None,
         ) -> Group:
    """The world group: the singleton group, since no launcher started this process."""
    global _WORLD
    _check_backend(backend)
    if strict:
        raise RuntimeError("[distributed] Couldn't initialize any backend")
    if _WORLD is None:
        _WORLD = Group._singleton()
    return _WORLD


def _group(group: Optional[Group]) -> Group:
    return init() if group is None else group


def _collective(x: Any, group: Optional[Group], stream: StreamOrDevice) -> Any:
    _group(group)
    return x._handle() if isinstance(x, array) else x


def all_sum(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Sum of ``x`` over the group's processes (``x`` itself in the singleton group)."""
    return _collective(x, group, stream)


def all_max(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Maximum of ``x`` over the group's processes (``x`` itself in the singleton group)."""
    return _collective(x, group, stream)


def all_min(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Minimum of ``x`` over the group's processes (``x`` itself in the singleton group)."""
    return _collective(x, group, stream)


def all_gather(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """``x`` of every process concatenated on axis 0 (``x`` itself in the singleton group)."""
    return _collective(x, group, stream)


def sum_scatter(x: Any, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Sum over the group, each process keeping its slice (``x`` in the singleton group)."""
    return _collective(x, group, stream)


def send(x: Any, dst: int, *, group: Optional[Group] = None, stream: StreamOrDevice = None) -> Any:
    """Send ``x`` to rank ``dst``."""
    if _group(group).size() == 1:
        raise ValueError("Cannot send to a singleton group")
    raise NotImplementedError("point-to-point communication needs issue 22's backends")


def recv(shape: Sequence[int], dtype: Any, src: int, *, group: Optional[Group] = None,
         stream: StreamOrDevice = None) -> Any:
    """Receive an array of ``shape`` and ``dtype`` from rank ``src``."""
    if _group(group).size() == 1:
        raise ValueError("Cannot recv from a singleton group")
    raise NotImplementedError("point-to-point communication needs issue 22's backends")


def recv_like(x: Any, src: int, *, group: Optional[Group] = None,
              stream: StreamOrDevice = None) -> Any:
    """Receive an array shaped and typed like ``x`` from rank ``src``."""
    return recv(x.shape, x.dtype, src, group=group, stream=stream)
