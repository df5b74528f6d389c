"""The deferred bounds check of the CUDA gather / scatter kernels: one record per CUDA
stream, read where the host waits for the stream, never at launch.

MLX's CUDA ``gather_axis`` / ``scatter_axis`` / ``gather_qmv`` read any index (an index out
of bounds reads or writes outside the array); PyTorch's CUDA kernels assert on the device,
and the error surfaces at the next synchronisation. Here a checking kernel
(``codegen/bounds_text.py``) writes the first bad index of its launch, its axis and the
size into its stream's record in mapped pinned host memory, and the host raises numpy's
IndexError where it waits for that stream: the eval loop's wait in C (``_driver.c``), a
``CudaEvent``'s host wait, ``device.synchronize``; the record is then cleared. So a
launch costs no host synchronisation, and:

- ``mx.eval`` raises ``IndexError("index 7 is out of bounds for axis 0 with size 5")``
  (numpy's type and message: the first bad index of the first launch that saw one);
- the arrays that eval computed are not readable: each holds the error
  (``kernels/failed.py``), and reading it, or evaluating an op on it, raises the same
  IndexError (``core/eval_loop.py``'s ``fail_outputs``);
- the stream, its record and the allocator are as before: the next eval runs as usual;
- after ``mx.async_eval`` the error is raised by the next host wait on that stream
  (``mx.synchronize()``, the next ``mx.eval`` there, whose arrays are then the failed
  ones); a read of the async eval's array before that wait is not checked (the read does
  not wait for the stream: CuPy's copy on the legacy stream), and its bad elements read 0
  (a gather) or miss their update (a scatter).

Per stream: a *bounds word* of two device words (a lock the kernels take while they
write the record, and the record's address), passed to the kernels as a pointer (a plan's
``SCRATCH`` slot: ``word_for(stream)``), and a record of ``bounds_text.WORDS`` words in a
page of mapped pinned host memory (``cudaHostAlloc``, portable and mapped: under unified
addressing its device address is its host address). The bounds word is set from the
record's last two words by a copy on that stream, ordered before its first kernel.
"""

from __future__ import annotations

import ctypes
import threading

import cupy

from ..codegen import bounds_text as bt
from ..rules.indexing import out_of_bounds

_PAGE = 4096
_PER_PAGE = _PAGE // (8 * bt.WORDS)
_HOST_ALLOC_FLAGS = 0x01 | 0x02  # cudaHostAllocPortable | cudaHostAllocMapped
_MEMCPY_HOST_TO_DEVICE = 1

# CUDA stream pointer -> its record's host address; the C wait reads it (``_driver.c``)
records: dict = {}
_words: dict = {}  # CUDA stream pointer -> (its record's host address, its bounds word's device address)
_pages: list = []  # [host address of a page, records used]
_lock = threading.Lock()


def _new_record() -> int:
    if not _pages or _pages[-1][1] == _PER_PAGE:
        ptr = int(cupy.cuda.runtime.hostAlloc(_PAGE, _HOST_ALLOC_FLAGS))
        ctypes.memset(ptr, 0, _PAGE)
        _pages.append([ptr, 0])
    page = _pages[-1]
    addr = page[0] + 8 * bt.WORDS * page[1]
    page[1] += 1
    return addr


def _words_at(addr: int):
    return (ctypes.c_uint64 * bt.WORDS).from_address(addr)


def word_for(stream_ptr: int) -> int:
    """The device address of the CUDA stream's bounds word (made on its first ask; the
    copy that sets it is enqueued on that stream, before anything that reads it)."""
    got = _words.get(stream_ptr)
    if got is not None:
        return got[1]
    with _lock:
        got = _words.get(stream_ptr)
        if got is None:
            rec = _new_record()
            w = _words_at(rec)
            w[bt.LOCK_INIT], w[bt.ADDRESS] = 0, rec  # (mapped: the device reads it here)
            # (cudaMalloc'd, never freed: no allocator cache or stream order to share it)
            word = int(cupy.cuda.runtime.malloc(16))
            cupy.cuda.runtime.memcpyAsync(word, rec + 8 * bt.LOCK_INIT, 16,
                                          _MEMCPY_HOST_TO_DEVICE, stream_ptr)
            got = _words[stream_ptr] = (rec, word)
            records[stream_ptr] = rec
    return got[1]


def check(stream_ptr: int) -> None:
    """After a host wait on the CUDA stream: raise the IndexError its kernels recorded
    (numpy's message), clearing the record; nothing when there is none."""
    rec = records.get(stream_ptr)
    if rec is None:
        return
    w = _words_at(rec)
    if not w[bt.STATE]:
        return
    value = int(w[bt.VALUE])
    if not w[bt.UNSIGNED] and value >= 1 << 63:
        value -= 1 << 64
    err = out_of_bounds(value, int(w[bt.SIZE]), int(w[bt.AXIS]))
    for k in range(bt.LOCK_INIT):  # (the lock's and address's words stay)
        w[k] = 0
    raise err
