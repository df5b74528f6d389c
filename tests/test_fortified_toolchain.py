"""Kernels build with a fortifying toolchain: Ubuntu's gcc defines ``_FORTIFY_SOURCE`` at -O1
and up, and glibc's fortified ``open`` then failed the build of every CPU kernel (its
unoptimised thread-count helpers), so each ran interpreted with numpy. The GPU machine's
gcc (Ubuntu 13.3) does this; Debian's does not, so the test passes the macro itself."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

CODE = r"""
import json
import numpy as np
import tapescope, tapescope.core as mx
x = np.linspace(-3, 3, 1 << 17).astype(np.float32)
f = mx.compile(lambda a: mx.sin(a) * 2 + 1)                # an elementwise kernel
got = {"fused": np.array(f(mx.array(x))).tolist()[:: 1 << 10]}
got["sum"] = np.array(mx.sum(mx.array(x.reshape(256, 512)), axis=-1)).tolist()
got["rms"] = np.array(mx.fast.rms_norm(mx.array(x.reshape(256, 512)), None, 1e-5)).tolist()[0]
got["runtimes"] = sorted({e["runtime"] for e in tapescope.kernel_cache()})
got["origins"] = [e.get("origin", "")[:400] for e in tapescope.kernel_cache()]
print("RESULT" + json.dumps(got))
"""


def test_kernels_build_and_run_in_c_with_fortify_source(tmp_path):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    env = {"TAPESCOPE_KERNEL_CFLAGS": "-D_FORTIFY_SOURCE=2",
           "TAPESCOPE_CACHE_DIR": str(tmp_path / "kernels"), "TAPESCOPE_CUDA": "0"}
    r = subprocess.run([sys.executable, "-c", CODE], env={**os.environ, **env}, timeout=300,
                       capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(line[-1][len("RESULT"):])
    assert got["runtimes"] == ["cpu"], got["origins"]  # no interpreted fallback
    x = np.linspace(-3, 3, 1 << 17).astype(np.float64)
    np.testing.assert_allclose(got["fused"], (np.sin(x) * 2 + 1)[:: 1 << 10], rtol=1e-6, atol=1e-6)
    m = x.reshape(256, 512)
    np.testing.assert_allclose(got["sum"], m.sum(-1), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(got["rms"], m[0] / np.sqrt((m[0] ** 2).mean() + 1e-5), rtol=1e-5)

