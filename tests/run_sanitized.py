"""Run a command with every generated C kernel built under AddressSanitizer and UBSan.

``python tests/run_sanitized.py CMD ARGS...``: kernels get ``-fsanitize=address,undefined``
(any undefined behaviour aborts), the sanitizer runtimes are preloaded into the
uninstrumented Python, and the kernels build into a fresh private cache. Exits 77 (skip)
when the compiler has no sanitizer runtimes. ``make test-ub`` uses it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"


def sanitizer_env(cache_dir: str) -> Optional[dict]:
    """The environment for a sanitized run, or None when the runtimes are missing."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        return None
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True,
                              text=True).stdout.strip()
        if not os.path.isabs(path) or not os.path.exists(path):
            return None
        libs.append(path)
    env = dict(os.environ)
    env.update(
        CC=cc,
        LD_PRELOAD=" ".join(libs + [env.get("LD_PRELOAD", "")]).strip(),
        # Python itself is not instrumented: its allocations look leaked, and libasan
        # cannot be first in the link order
        ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0:abort_on_error=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
        TAPESCOPE_KERNEL_CFLAGS=FLAGS,
        TAPESCOPE_CACHE_DIR=cache_dir,
    )
    return env


def main(argv: list) -> int:
    if not argv:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="tapescope-ub-") as d:
        env = sanitizer_env(os.path.join(d, "kernels"))
        if env is None:
            print("run_sanitized: this compiler has no ASan/UBSan runtimes; skipped")
            return 77
        return subprocess.run(argv, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
