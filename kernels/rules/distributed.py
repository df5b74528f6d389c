"""MLX's distributed primitives over MPI (``mlx/distributed/primitives.h``): ``AllReduce``
(sum / max / min), ``AllGather``, ``ReduceScatter`` (sum_scatter), ``Send`` and ``Recv``.

A rule gets the group's communicator (an mpi4py ``Comm``) as its ``comm`` parameter; mpi4py
is imported here only when a rule runs. Buffers are host (numpy) arrays. Reductions MPI has
a type for run as ``MPI_Allreduce`` / ``MPI_Reduce_scatter_block``; float16, bfloat16 and
bool are gathered as bytes and reduced in rank order in their own type (MLX's MPI backend
has its own float16 / bfloat16 ops; for bool its MPI_SUM aborts, here it is a logical or).
Each run adds a ``"collective"`` record to the timeline with the bytes it sent.

On the "nccl" backend ``comm`` is a ``kernels/cuda/nccl.NcclComm`` (its ``nccl`` is true):
the rule runs inside the CUDA backend's device context and enqueues NCCL on the ``mx``
stream's CUDA stream (``kernels/cuda/nccl.py``; CuPy imported only then).
"""

from __future__ import annotations

from .. import timeline
from ..primitives import DISTRIBUTED, define

_NEVER_FUSED = "a collective: never fused, it runs as its own node between kernels"
_NO_JAX = "tapescope.check runs one process: a collective has no single-process JAX reference"


def _mpi():
    from mpi4py import MPI

    return MPI


def _flat_bytes(xp, a):
    return xp.ascontiguousarray(a).reshape(-1).view(xp.uint8)


def _native(a, reduce: str) -> bool:
    """Whether MPI has a type (and the operation) for ``a``'s dtype."""
    if a.dtype.kind in "iu" or a.dtype.name in ("float32", "float64"):
        return True
    return reduce == "sum" and a.dtype.name in ("complex64", "complex128")


def _log(name: str, t0: int, comm, nbytes: int, **detail) -> None:
    if timeline.enabled:
        timeline.add("collective", t0, timeline.now(), name=name, nbytes=int(nbytes),
                     detail={"rank": comm.Get_rank(), "group_size": comm.Get_size(), **detail})


def _gathered(xp, a, comm):
    """Every rank's ``a`` stacked on a new leading axis, in rank order."""
    a = xp.ascontiguousarray(a)
    buf = xp.empty((comm.Get_size(), a.nbytes), dtype=xp.uint8)
    comm.Allgather(_flat_bytes(xp, a), buf)
    return buf.view(a.dtype).reshape((comm.Get_size(),) + a.shape)


def _reduce_parts(xp, parts, reduce: str):
    out = parts[0].copy()
    for p in parts[1:]:
        if reduce == "sum":
            out = (out | p) if out.dtype == bool else (out + p).astype(out.dtype)
        elif reduce == "max":
            out = xp.maximum(out, p)
        else:
            out = xp.minimum(out, p)
    return out


def _nccl(comm):
    """``kernels/cuda/nccl`` when ``comm`` is an NCCL communicator, else None."""
    if getattr(comm, "nccl", False):
        from ..cuda import nccl

        return nccl
    return None


def _same(shapes: list, **_) -> list:
    return [tuple(shapes[0])]


def _same_dtype(dtypes: list, **_) -> list:
    return [dtypes[0]]


def _gather_shape(shapes: list, *, comm, **_) -> list:
    s = tuple(shapes[0]) or (1,)
    return [(s[0] * comm.Get_size(),) + s[1:]]


def _scatter_shape(shapes: list, *, comm, **_) -> list:
    s = tuple(shapes[0])
    return [(s[0] // comm.Get_size(),) + s[1:]]


def _recv_shape(shapes: list, *, shape, **_) -> list:
    return [tuple(shape)]


def _recv_dtype(dtypes: list, *, dtype, **_) -> list:
    return [dtype]


_WHY = {"c": _NEVER_FUSED, "jax": _NO_JAX}


@define("AllReduce", family=DISTRIBUTED, shape=_same, dtype=_same_dtype, why=_WHY)
def all_reduce(xp, a, *, reduce, comm):
    """``reduce`` ("sum", "max" or "min") of ``a`` over every rank of ``comm``."""
    t0 = timeline.now()
    if _nccl(comm):
        out = _nccl(comm).all_reduce(a, reduce, comm)
    elif _native(a, reduce):
        MPI = _mpi()
        a = xp.ascontiguousarray(a)
        out = xp.empty_like(a)
        comm.Allreduce(a, out, op={"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[reduce])
    else:
        out = _reduce_parts(xp, _gathered(xp, a, comm), reduce)
    _log("AllReduce", t0, comm, a.nbytes, reduce=reduce)
    return out


@define("AllGather", family=DISTRIBUTED, shape=_gather_shape, dtype=_same_dtype, why=_WHY)
def all_gather(xp, a, *, comm):
    """Every rank's ``a`` concatenated on axis 0 (a scalar counts as shape (1,))."""
    t0 = timeline.now()
    a = a.reshape(1) if a.ndim == 0 else a
    parts = _nccl(comm).all_gather(a, comm) if _nccl(comm) else _gathered(xp, a, comm)
    _log("AllGather", t0, comm, a.nbytes)
    return parts.reshape((parts.shape[0] * a.shape[0],) + a.shape[1:])


@define("ReduceScatter", family=DISTRIBUTED, shape=_scatter_shape, dtype=_same_dtype, why=_WHY)
def reduce_scatter(xp, a, *, comm):
    """The sum over ranks of ``a``, of which rank r keeps block r of axis 0."""
    t0 = timeline.now()
    n, r = comm.Get_size(), comm.Get_rank()
    a = a if _nccl(comm) else xp.ascontiguousarray(a)  # NCCL's own copy (bfloat16 stays host)
    m = a.shape[0] // n
    if _nccl(comm):
        out = _nccl(comm).reduce_scatter(a, comm)
    elif _native(a, "sum"):
        out = xp.empty((m,) + a.shape[1:], dtype=a.dtype)
        comm.Reduce_scatter_block(a, out, op=_mpi().SUM)
    else:
        out = _reduce_parts(xp, _gathered(xp, a, comm), "sum")[r * m:(r + 1) * m]
    _log("ReduceScatter", t0, comm, a.nbytes)
    return out


@define("Send", family=DISTRIBUTED, shape=_same, dtype=_same_dtype, why=_WHY)
def send(xp, a, *, dst, comm):
    """Send ``a`` to rank ``dst`` (blocking, as MLX's MPI backend); the output is ``a``."""
    t0 = timeline.now()
    if _nccl(comm):
        _nccl(comm).send(a, dst, comm)
    else:
        comm.Send(_flat_bytes(xp, a), dest=dst, tag=0)
    _log("Send", t0, comm, a.nbytes, dst=dst)
    return a


@define("Recv", family=DISTRIBUTED, shape=_recv_shape, dtype=_recv_dtype, why=_WHY)
def recv(xp, *, shape, dtype, src, comm):
    """An array of ``shape`` and ``dtype`` received from rank ``src``."""
    t0 = timeline.now()
    if _nccl(comm):
        out = _nccl(comm).recv(tuple(shape), dtype, src, comm)
    else:
        out = xp.empty(shape, dtype=dtype)
        comm.Recv(out.reshape(-1).view(xp.uint8), source=src, tag=0)
    _log("Recv", t0, comm, out.nbytes, src=src)
    return out
