"""The CPU runtime: generated C built by the system compiler, loaded with ctypes."""
