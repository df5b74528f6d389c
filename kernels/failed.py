"""``Failed``: the data of an array whose eval's device work failed after it was enqueued
(a deferred check's IndexError, ``cuda/bounds.py``), raised where the host waited.

The eval's arrays were set (their nodes ran: the kernels were enqueued) before the device
said that it failed, so none of them is readable as a value: each holds a ``Failed`` in
place of its device array (its buffer given back), and every use of it, a read on the
host (``np.array``, ``item``, ``repr``) or an op's eval that takes it as an input, raises
the error again, with the same type and message.
"""

from __future__ import annotations


class Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def again(self) -> BaseException:
        """The error anew (its type and arguments): a raise per use, no traceback kept."""
        try:
            return type(self.error)(*self.error.args)
        except Exception:  # an exception type that takes other arguments
            return self.error

    def __getattr__(self, name: str):  # (what a read or a kernel asks of device data)
        raise self.again()

    def __repr__(self) -> str:
        return f"Failed({self.error!r})"
