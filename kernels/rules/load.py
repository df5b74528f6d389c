"""The rule for Load: an array's bytes read from a file at an offset (MLX's ``Load``,
mlx/backend/common/load.cpp): the reader (core/file_reader.py) is shared by the arrays of one
``mx.load``; a short read raises at eval; big-endian data is swapped after the read."""

from __future__ import annotations

from ..primitives import IO, define

_NO_INPUTS = "no inputs: a file's bytes, never on a path from a transformed argument"


@define("Load", family=IO, out=True, moves=True,
        why={"vjp": _NO_INPUTS, "jvp": _NO_INPUTS, "vmap": _NO_INPUTS})
def load(xp, out=None, *, reader, offset, shape, dtype, swap):
    """``shape`` x ``dtype`` bytes from ``reader`` at ``offset`` into ``out`` (the allocator's
    buffer; on a device, through a host buffer); ``swap``: the file's byte order is not the
    host's (a complex number's parts are swapped one by one)."""
    host = reader.read_array(out, offset, shape, dtype, swap)
    if out is None:
        return xp.asarray(host)
    if host is not out:
        out[...] = xp.asarray(host)
    return out
