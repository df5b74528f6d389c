"""``mx.distributed`` over MPI: scripts run under ``mpirun -np 2`` and ``-np 4`` on localhost.

``tests/mpi_worker.py`` checks every collective (all_sum / all_max / all_min, all_gather,
sum_scatter) over nine dtypes against numpy, send / recv rings, split groups, MLX's errors,
the timeline's collective records, compile around a collective, and grad / jvp / vmap.
``tests/mpi_data_parallel.py`` trains an MLP data-parallel (gradients averaged with all_sum)
and must reach the single-process full-batch losses. As root (CI: ``make test`` installs
OpenMPI and mpi4py) these must run; elsewhere they skip when mpirun or mpi4py is missing.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
MISSING = [what for what, ok in (("mpirun (openmpi-bin)", shutil.which("mpirun")),
                                 ("mpi4py", importlib.util.find_spec("mpi4py")))
           if not ok]


NUMBER = r"-?\d+\.\d+(?:e[-+]\d+)?"  # as printed: a line run into by another rank's stays apart


@pytest.fixture
def need_mpi():
    if not MISSING:
        return
    if IS_ROOT:  # CI runs as root: the MPI tests must run there, never skip
        pytest.fail(f"the MPI tests need {', '.join(MISSING)} (make test installs them as root)",
                    pytrace=False)
    pytest.skip(f"MPI tests skipped: {', '.join(MISSING)} not installed "
                "(sudo apt-get install -y openmpi-bin libopenmpi-dev; pip install -e '.[dev]')")


def mpirun(n: int, script: str, timeout: int = 60) -> str:
    """Run ``script`` on ``n`` local processes; its output (failing on a non-zero exit)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader", OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    cmd = [shutil.which("mpirun"), "--oversubscribe", "-np", str(n), sys.executable,
           str(HERE / script)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"mpirun -np {n} {script} failed:\n{out[-6000:]}"
    return out


def ranks_ok(out: str, n: int) -> None:
    """Every rank 0..n-1 printed ``OK <rank>`` once. mpirun forwards the ranks' writes as they
    come, so one rank's line may run into another's ("calls 1 67OK 0"): the marker is found
    anywhere but after a letter, and its number ends at the first non-digit."""
    ranks = sorted(re.findall(r"(?<![A-Za-z])OK (\d+)", out), key=int)
    assert ranks == [str(r) for r in range(n)], out[-6000:]


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_send_recv_split_and_errors_under_mpirun(need_mpi, n):
    ranks_ok(mpirun(n, "mpi_worker.py"), n)


def test_data_parallel_training_reaches_the_single_process_loss(need_mpi):
    out = mpirun(4, "mpi_data_parallel.py")
    m = re.search(r"first ({0}) last ({0}) dp_last ({0}) max_diff ({0})".format(NUMBER), out)
    assert m, out
    first, last, dp_last, diff = map(float, m.groups())
    assert last < 0.5 * first  # it trains
    assert diff < 1e-5 and abs(dp_last - last) < 1e-5, out


def test_without_a_launcher_the_group_is_the_singleton_with_mlx_errors():
    """No mpirun: MLX's singleton group, whose collectives record nothing (MLX 0.32.4's
    messages, as it gives them with its MPI backend available)."""
    import numpy as np

    import tapescope.core as mx

    D = mx.distributed
    g = D.init()
    assert (g.rank(), g.size()) == (0, 1) and D.init() is g
    from mlx_compare import mlx_ref

    if mlx_ref is not None:  # MLX's answer is whether libmpi loads; ours whether mpi4py does
        assert D.is_available("mpi") == mlx_ref.distributed.is_available("mpi") or MISSING
    x = mx.array([1.0, 2.0])
    for f in (D.all_sum, D.all_max, D.all_min, D.all_gather, D.sum_scatter):
        y = f(x)
        assert y is not x and y._d is x._d
    with pytest.raises(ValueError, match="^Cannot send to a singleton group$"):
        D.send(x, 0)
    with pytest.raises(ValueError, match="^Cannot recv from a singleton group$"):
        D.recv_like(x, 0)
    with pytest.raises(RuntimeError, match="^Cannot split the distributed group further.$"):
        g.split(0)
    msg = ("[mpi] The world has a single process. Launch with mpirun to initialize the mpi "
           "backend." if D.is_available("mpi") else "[distributed] Couldn't initialize any backend")
    with pytest.raises(RuntimeError) as e:
        D.init(strict=True, backend="mpi")
    assert str(e.value) == msg
    assert np.array_equal(np.asarray(D.all_sum(x)), [1.0, 2.0])


@pytest.mark.parametrize("name", ["all_sum", "all_max", "all_min", "all_gather", "sum_scatter"])
@pytest.mark.parametrize("value", [0.5, 3, True, 1 + 2j, np.arange(3.0)])
def test_a_singleton_collective_of_a_scalar_is_an_array_as_in_mlx(name, value):
    """MLX's collectives take ``scalar | array``: a Python or numpy value comes back an array
    of MLX's dtype for it (``all_sum(0.5).item()``, as mlx-examples' cifar calls it)."""
    import tapescope.core as mx

    out = getattr(mx.distributed, name)(value)
    assert isinstance(out, mx.array)
    expected = np.asarray(value, np.float32 if isinstance(value, (float, np.ndarray)) else None)
    np.testing.assert_array_equal(np.array(out), expected)
    from mlx_compare import mlx_ref

    if mlx_ref is not None:
        ref = getattr(mlx_ref.distributed, name)(value)
        assert (out.shape, str(out.dtype)) == (ref.shape, str(ref.dtype))


def test_a_collective_of_a_list_raises_mlx_error():
    from mlx_compare import same_error

    same_error(lambda m: m.distributed.all_sum([1, 2]))
