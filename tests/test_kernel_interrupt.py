"""Jupyter's interrupt button during a long ``mx.eval`` in a real kernel.

A real IPython kernel is started through nbclient's machinery (jupyter_client); a cell runs a
long eval, the kernel is interrupted (SIGINT, as the notebook's button sends) mid-cell, the
cell ends with KeyboardInterrupt, and the next cell evaluates the same array correctly.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
jupyter_client = pytest.importorskip("jupyter_client")

SETUP = """
import numpy as np
import tapescope.core as mx
x = mx.array(np.zeros(16, dtype=np.int32))
for _ in range(200000):
    x = x + 1
"""

LONG = """
print("eval-start", flush=True)
mx.eval(x)
print("eval-finished", flush=True)
"""

AFTER = """
print("lazy" if x._d.node is not None else "done")
mx.eval(x)
print(int(x[0].item()) if hasattr(x, '__getitem__') else None, bool((np.array(x) == 200000).all()))
"""


def _run(kc, code: str, timeout: float = 120):
    """Execute ``code``; return (status, ename, stdout text)."""
    msg_id = kc.execute(code)
    out, status, ename = [], None, None
    deadline = time.time() + timeout
    while time.time() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        t = msg["msg_type"]
        if t == "stream":
            out.append(msg["content"]["text"])
        elif t == "error":
            ename = msg["content"]["ename"]
        elif t == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    status = reply["content"]["status"]
    return status, ename or reply["content"].get("ename"), "".join(out)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT interrupts are POSIX")
def test_interrupt_button_stops_a_long_eval_and_the_next_cell_resumes():
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.kernel_spec_manager.ensure_native_kernel = True
    km.start_kernel(extra_arguments=["--HistoryManager.enabled=False"],
                    env={**os.environ, "PYTHONPATH": ":".join(sys.path)})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        status, ename, _ = _run(kc, SETUP)
        assert status == "ok", ename
        msg_id = kc.execute(LONG)
        ename, out, interrupted = None, [], False
        deadline = time.time() + 120
        while time.time() < deadline:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
                if "eval-start" in msg["content"]["text"] and not interrupted:
                    time.sleep(0.5)  # mid-cell: evaluating 200000 nodes takes seconds
                    km.interrupt_kernel()
                    interrupted = True
            if msg["msg_type"] == "error":
                ename = msg["content"]["ename"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        kc.get_shell_msg(timeout=60)
        assert interrupted and ename == "KeyboardInterrupt", (ename, "".join(out))
        assert "eval-finished" not in "".join(out)
        status, ename, out = _run(kc, AFTER)
        assert status == "ok", ename
        lines = out.split()
        assert lines[0] == "lazy"  # stopped at a node boundary, the rest left lazy
        assert lines[-1] == "True"  # and the next cell evaluated it correctly
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
