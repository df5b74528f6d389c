"""The deferred bounds check's device side: the record a checking kernel writes for an index
out of bounds, and the function that writes it, as CUDA and as C (the stand-in driver's
builds, walking a grid in order).

A checking kernel (``cuda/indexing.py``'s gather and scatter, ``qmv_cuda.py``'s gather
form) takes one more pointer, its stream's *bounds word* (``cuda/bounds.py``: two words of
device memory, a lock and the address of the stream's record in mapped pinned host
memory). A thread whose index lies outside ``[-size, size)`` moves nothing and calls
``bounds_note``, which under the lock keeps the lowest position of its launch (the first
bad index in the kernel's walk, numpy's first) in the record: its position, the index,
the axis and the size numpy's message names, the launch's owner (its index array's
address: a later launch over other indices leaves the first launch's error alone). The
host reads the record where it waits for the stream (``cuda/bounds.py``), never at launch:
PyTorch's device-side assert, which surfaces at the next synchronisation, with numpy's
IndexError instead of an abort. MLX's CUDA gather / scatter check nothing.
"""

from __future__ import annotations

# the record's words (uint64), in mapped pinned host memory
STATE, POS, VALUE, AXIS, SIZE, OWNER, UNSIGNED = range(7)
LOCK_INIT, ADDRESS = 8, 9  # the bounds word's initial two words (a zero lock, the record)
WORDS = 16  # a record's size in words (128 bytes)

_NOTE = """(unsigned long long* bounds, unsigned long long pos, unsigned long long value,
    long long axis, long long size, unsigned long long owner, int is_unsigned) {
  volatile unsigned long long* rec = (volatile unsigned long long*)bounds[1];
  LOCK_TAKE;
  if (rec[0] == 0ull || (rec[5] == owner && pos < rec[1])) {
    rec[1] = pos; rec[2] = value; rec[3] = (unsigned long long)axis;
    rec[4] = (unsigned long long)size; rec[5] = owner; rec[6] = (unsigned long long)is_unsigned;
    FENCE;
    rec[0] = 1ull;
  }
  FENCE;
  LOCK_GIVE;
}
"""

CUDA = ("static __device__ __noinline__ void bounds_note" + _NOTE).replace(
    "LOCK_TAKE", "while (atomicCAS((unsigned int*)bounds, 0u, 1u) != 0u) {}\n  __threadfence()"
).replace("FENCE", "__threadfence_system()").replace(
    "LOCK_GIVE", "atomicExch((unsigned int*)bounds, 0u)")
# (a C build walks its threads one after another: no lock, no fence)
C = ("static void bounds_note" + _NOTE).replace("LOCK_TAKE;\n", "").replace(
    "    FENCE;\n", "").replace("  FENCE;\n", "").replace("  LOCK_GIVE;\n", "")
