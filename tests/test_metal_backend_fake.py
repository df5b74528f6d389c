"""The Metal runtime's plumbing (registration, queues per stream, commits, shared buffers,
pipelines cached by name, shared events, fallbacks on the timeline, the wired limit) run on
Linux over ``tests/fake_metal.py``, a stand-in for PyObjC's ``Metal`` whose kernels run on the
Metal shim: test_metal_runtime.py in a fresh process whose ``import Metal`` is the stand-in.
On a Mac the real one runs instead (test_metal_runtime.py itself)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.skipif(sys.platform == "darwin", reason="a Mac runs the real Metal suite")
def test_metal_backend_runs_the_gpu_tests_over_a_stand_in_metal():
    code = (
        "import sys; sys.path.insert(0, %r); import fake_metal; fake_metal.install();"
        "import pytest; rc = pytest.main(['-p', 'no:cacheprovider', '-q', '-o', 'addopts=', %r]);"
        "print('LOG', fake_metal.LOG); sys.exit(rc)" % (str(HERE), str(HERE / "test_metal_runtime.py")))
    env = dict(os.environ, MLX_MAX_OPS_PER_BUFFER="3")
    env.pop("TAPESCOPE_DISABLE_GPU", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, cwd=HERE.parent)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-2000:]
    log = eval(r.stdout.split("LOG ")[-1].splitlines()[0])
    # kernels ran as dispatches, committed by MLX's op limit (3 here) and at syncs; one
    # library per tape, one pipeline per kernel name
    assert log["dispatches"] > 10 and log["commits"] >= log["dispatches"] / 4
    assert log["pipelines"] <= log["dispatches"]
