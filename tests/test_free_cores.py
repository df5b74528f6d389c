"""The free-cores rule of the CPU's threads: the kernels' ``ts_threads`` (C, in every generated
kernel) and BLAS's ``free_cores`` (Python) give the same count, which takes no core for a
quiet machine's passing runnable task and one per other task under sustained load."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tapescope.kernels.codegen import render
from tapescope.kernels.cpu import threads


@settings(max_examples=200, deadline=None)
@given(cores=st.integers(1, 64), running=st.integers(0, 80), own=st.integers(1, 8),
       load1=st.floats(0, 80, allow_nan=False))
def test_the_rule(cores, running, own, load1):
    n = threads.free(cores, running, own, load1)
    assert 1 <= n <= cores
    others = max(0, running - own)
    if load1 < 1.5:  # the 1-minute average holds no process besides this one: every core
        assert n == cores
    if load1 >= others + 1.5:  # the load is sustained: one core less per other runnable task
        assert n == max(1, cores - others)
    assert n >= cores - others  # never fewer than the tasks runnable now leave


@pytest.fixture(scope="module")
def ts_threads(tmp_path_factory):
    """A program printing the C rule's ``ts_threads()``, reading a loadavg file of ours."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("ts_threads")
    loadavg = d / "loadavg"
    src = render._C_THREADS.replace('"/proc/loadavg"', f'"{loadavg}"') + (
        '#include <stdio.h>\nint main(void) { printf("%d\\n", ts_threads()); return 0; }\n')
    (d / "t.c").write_text("#include <stdint.h>\n#include <stddef.h>\n" + src)
    r = subprocess.run([cc, "-O1", "-fopenmp", str(d / "t.c"), "-o", str(d / "t")],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cc -fopenmp failed: {r.stderr[-300:]}")

    def run(cores: int, line: str) -> int:
        loadavg.write_text(line)
        env = {**os.environ, "OMP_NUM_THREADS": str(cores)}
        return int(subprocess.run([str(d / "t")], env=env, capture_output=True, text=True,
                                  check=True).stdout)
    return run


@settings(max_examples=40, deadline=None)
@given(cores=st.integers(1, 8), running=st.integers(0, 14), load1=st.integers(0, 1299))
def test_the_kernels_count_is_the_rule(ts_threads, cores, running, load1):
    """The generated kernels' count against ``threads.free`` for the same /proc/loadavg (the
    program's one thread is its own runnable task)."""
    a = load1 / 100
    line = f"{a:.2f} {a:.2f} {a:.2f} {running}/300 12345\n"
    assert ts_threads(cores, line) == threads.free(cores, running, 1, a)


def test_a_passing_task_on_a_quiet_machine_takes_no_core(ts_threads):
    assert ts_threads(2, "1.10 1.00 0.90 2/150 1\n") == 2
    assert ts_threads(2, "4.10 4.00 3.90 5/150 1\n") == 1
    assert ts_threads(16, "9.40 9.00 9.00 9/150 1\n") == 8
