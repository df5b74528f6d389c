"""The CPU runtime: generated C built by the system compiler, loaded with ctypes."""

from .threads import apply_policy

apply_policy()  # before the first kernel library loads libgomp (threads.py says why)
