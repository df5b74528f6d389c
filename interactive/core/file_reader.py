"""The readers a lazily loaded array reads its bytes through (MLX's ``io::Reader``:
mlx/io/load.h ``ParallelFileReader``, python/src/load.cpp ``PyFileReader``). One reader is
shared by the arrays of one ``mx.load``; a path's file descriptor is closed when the last
of them is evaluated or freed (the reader goes with the last ``Load`` that holds it)."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np


class Reader:
    """What every reader shares: an array's bytes read into host memory (the ``Load`` rule's
    numpy side, so the rule itself computes only with the array module it is given)."""

    def read_into(self, buf: memoryview, offset: int) -> None:
        raise NotImplementedError

    def read_array(self, out: Any, offset: int, shape: tuple, dtype: Any,
                   swap: bool) -> np.ndarray:
        """``shape`` x ``dtype`` bytes at ``offset``: into ``out`` itself when it is a
        row-contiguous host array, else into a new host array; ``swap``: byte-swapped after
        the read (the file's order is not the host's; a complex number's parts one by one)."""
        host = out if isinstance(out, np.ndarray) and out.flags.c_contiguous else \
            np.empty(shape, dtype)
        self.read_into(memoryview(host.reshape(-1).view(np.uint8)), offset)
        if swap:
            host.byteswap(inplace=True)
        return host


class FileReader(Reader):
    """A file opened by path, read at an offset with ``pread`` (thread-safe, no shared
    position: the arrays of one load may be read on different streams at once)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def read(self, n: int, offset: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer at the file's end)."""
        parts, got = [], 0
        while got < n:
            part = os.pread(self.fd, min(n - got, 1 << 30), offset + got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def read_into(self, buf: memoryview, offset: int) -> None:
        """Exactly ``len(buf)`` bytes at ``offset`` (MLX's error on a short read)."""
        got, n = 0, len(buf)
        while got < n:
            m = os.preadv(self.fd, [buf[got:got + (1 << 30)]], offset + got)
            if m <= 0:
                raise RuntimeError("[read] Unable to read from file.")
            got += m

    def label(self) -> str:
        return f"file {self.path}"

    def __del__(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)


class PyFileReader(Reader):
    """A Python file object (seek and read under a lock, as MLX's ``PyFileReader`` holds the
    GIL); ``mx.load`` evaluates its arrays before it returns, as MLX does for a stream it
    does not own."""

    def __init__(self, f: Any):
        self.f = f
        self.lock = threading.Lock()

    def read_into(self, buf: memoryview, offset: int) -> None:
        with self.lock:
            self.f.seek(offset)
            got, n = 0, len(buf)
            while got < n:
                part = self.f.read(n - got)
                if not part:
                    raise RuntimeError("[load] Failed to read from python stream")
                buf[got:got + len(part)] = part
                got += len(part)

    def label(self) -> str:
        return "python file object"


class ZipMemberReader(PyFileReader):
    """An ``.npz`` member (a zipfile member object): read as a file object, then to its end,
    where zipfile checks the member's CRC; zipfile's errors (``errors``) raise as a
    RuntimeError naming the member, at eval as at load."""

    def __init__(self, member: Any, name: str, where: str, errors: tuple):
        super().__init__(member)
        self.name, self.where, self.errors = name, where, errors

    def read_into(self, buf: memoryview, offset: int) -> None:
        try:
            super().read_into(buf, offset)
            with self.lock:
                self.f.read()  # the rest (nothing, for a well-formed member): the CRC check
        except self.errors as e:
            if type(e) in (RuntimeError, ValueError) and str(e).startswith("["):
                raise
            raise RuntimeError(f"[load_npz] Corrupt member '{self.name}' in {self.where}: "
                               f"{e}") from None
