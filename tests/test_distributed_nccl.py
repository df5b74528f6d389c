"""``mx.distributed`` over NCCL (CuPy's ``cupy.cuda.nccl``), one GPU per rank.

On a machine with >= 2 GPUs, ``TAPESCOPE_CUDA=1`` and CuPy's NCCL (the lent H200 pair:
``tests/run_gpu_suites.sh``, part ``nccl``): ``tests/nccl_worker.py`` under ``mpirun -np 2``
(every collective and NCCL dtype against numpy, MLX's error for the others, the timeline,
send / recv rings, splits, errors) and started with MLX's own variables (the unique id over
TCP). Elsewhere those skip, saying why; what runs everywhere: the same worker on CPU
processes over tests/fake_cupy.py + tests/fake_nccl.py (the NCCL path's plumbing, not
NCCL), the TCP exchange of the unique id, and MLX's answers where NCCL is unavailable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys

import pytest

from test_distributed_mpi import HERE, MISSING, mpirun, need_mpi, ranks_ok  # noqa: F401  (a fixture)


def _gpu_reason(gpus: int = 2) -> str:
    """Why the real NCCL tests on ``gpus`` GPUs cannot run here ("" when they can). CuPy is
    imported only when the CUDA runtime is asked for (``TAPESCOPE_CUDA=1``)."""
    if os.environ.get("TAPESCOPE_CUDA") != "1":
        return f"NCCL tests need TAPESCOPE_CUDA=1 (the CUDA runtime), >= {gpus} GPUs and CuPy's NCCL"
    if importlib.util.find_spec("cupy") is None:
        return "NCCL tests need CuPy"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device
        return f"NCCL tests need >= {gpus} GPUs; CuPy reaches none ({type(e).__name__}: {e})"
    if count < gpus:
        return f"NCCL tests need >= {gpus} GPUs; CuPy sees {count}"
    try:
        from cupy.cuda import nccl

        nccl.get_version()
    except Exception as e:
        return f"NCCL tests need cupy.cuda.nccl ({type(e).__name__}: {e})"
    return ""


@pytest.fixture
def need_gpus():
    why = _gpu_reason()
    if why:
        pytest.skip(why)


@pytest.fixture
def gpu_mpirun(need_gpus):
    """The GPU machine is not CI: without mpirun / mpi4py there the test skips, saying so."""
    if MISSING:
        pytest.skip(f"NCCL under mpirun needs {', '.join(MISSING)}")


def test_nccl_collectives_send_recv_split_and_errors_on_two_gpus(gpu_mpirun):
    ranks_ok(mpirun(2, "nccl_worker.py", timeout=300), 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(code_or_script: list, n: int, extra: dict, timeout: int) -> str:
    """``n`` processes started with MLX's variables (no mpirun); their joined output."""
    port = str(_free_port())
    procs = []
    for r in range(n):
        env = dict(os.environ, MLX_RANK=str(r), MLX_WORLD_SIZE=str(n), NCCL_HOST_IP="127.0.0.1",
                   NCCL_PORT=port, PYTHONPATH=os.pathsep.join(
                       filter(None, [str(HERE), os.environ.get("PYTHONPATH")])), **extra)
        for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
            env.pop(v, None)
        procs.append(subprocess.Popen([sys.executable] + code_or_script, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = "\n".join(outs)
    assert all(p.returncode == 0 for p in procs), out[-6000:]
    return out


def test_nccl_init_from_mlx_variables_over_tcp_on_two_gpus(need_gpus):
    """MLX's launch: MLX_RANK / MLX_WORLD_SIZE / NCCL_HOST_IP / NCCL_PORT, no mpirun."""
    out = _spawn([str(HERE / "nccl_worker.py"), "tcp"], 2, {"TAPESCOPE_CUDA": "1"}, 240)
    ranks_ok(out, 2)


_WORLD_OF_ONE = r"""
import ml_dtypes, numpy as np, cupy
import tapescope.core as mx
from tapescope.kernels.cuda import nccl
g = mx.distributed.init(strict=True, backend="nccl")
assert (g.rank(), g.size()) == (0, 1), (g.rank(), g.size())
x = mx.array(np.arange(6, dtype=np.float32))
np.testing.assert_array_equal(np.array(mx.distributed.all_sum(x, group=g)), np.arange(6))
c = nccl.world(True)  # the rules' NCCL calls, on a real communicator of one rank
s = cupy.cuda.Stream(non_blocking=True)
host = lambda r: cupy.asnumpy(r) if isinstance(r, cupy.ndarray) else np.asarray(r)
with s:
    for name in ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                 "bfloat16", "float32", "float64"]:
        a = (np.arange(12) - 5).astype(ml_dtypes.bfloat16 if name == "bfloat16" else name)
        d = a if name == "bfloat16" else cupy.asarray(a)  # bfloat16 lives on the host
        for red in ("sum", "max", "min"):
            r = host(nccl.all_reduce(d, red, c))
            s.synchronize()
            assert r.dtype == a.dtype and (r == a).all(), (name, red, r)
        r = host(nccl.all_gather(d, c))
        s.synchronize()
        assert r.shape == (1, 12) and (r[0] == a).all(), (name, r)
        r = host(nccl.reduce_scatter(d, c))
        s.synchronize()
        assert (r == a).all(), (name, r)
    try:
        nccl.nccl_dtype(np.complex64)
        raise AssertionError("complex64 reached NCCL")
    except ValueError as e:
        assert str(e) == "[nccl] Unknown or unsupported dtype"
print("OK 0")
"""


def test_nccl_world_of_one_on_one_gpu():
    """Real NCCL where only one GPU is lent: MLX's variables for a world of one, the unique
    id over TCP, ncclCommInitRank; the group is (0, 1) and all_sum answers as MLX's does
    for one process; the rules' all_reduce (sum, max, min), all_gather and reduce_scatter
    on that communicator for every NCCL dtype (a world of one returns its input)."""
    why = _gpu_reason(gpus=1)
    if why:
        pytest.skip(why)
    ranks_ok(_spawn(["-c", _WORLD_OF_ONE], 1, {"TAPESCOPE_CUDA": "1"}, 240), 1)


def test_the_nccl_path_over_stand_ins_under_mpirun(need_mpi, monkeypatch):
    """The worker on CPU processes: fake CuPy, and an NCCL whose calls (by pointer, count,
    NCCL type and stream) run over MPI. Checks init / split / the rules' plumbing, not NCCL."""
    monkeypatch.setenv("TAPESCOPE_CUDA", "1")  # mpirun passes the environment on
    monkeypatch.setenv("TAPESCOPE_FAKE_NCCL", "1")
    monkeypatch.delenv("TAPESCOPE_DISABLE_GPU", raising=False)
    out = mpirun(2, "nccl_worker.py", timeout=120)
    ranks_ok(out, 2)
    # (mpirun may run the ranks' lines together: "calls 0 72calls 1 72")
    calls = {int(r): int(c) for r, c in re.findall(r"calls (\d+) (\d+)", out)}
    assert len(calls) == 2 and min(calls.values()) > 50, out[-3000:]  # every collective reached NCCL


def test_the_unique_id_goes_from_rank_0_to_every_rank_over_tcp():
    """MLX's bootstrap_unique_id: rank 0 makes the id and sends it; the others retry until
    rank 0 listens."""
    code = ("import os, sys; sys.path.insert(0, %r); import fake_nccl; fake_nccl.install();"
            "from tapescope.kernels.cuda import nccl;"
            "r = int(os.environ['MLX_RANK']);"
            "uid = nccl._tcp_unique_id(r, 3, '127.0.0.1', int(os.environ['NCCL_PORT']), 30.0);"
            "print('ID', r, len(uid), hash(tuple(uid)))" % str(HERE))
    out = _spawn(["-c", code], 3, {}, 60)
    ids = re.findall(r"(?<![A-Za-z])ID (\d) (\d+) (-?\d+)", out)
    assert sorted(r for r, _, _ in ids) == ["0", "1", "2"], out
    assert len({h for _, _, h in ids}) == 1, out  # one id, the same everywhere
    assert all(k == "128" for _, k, _ in ids), out


def test_without_the_cuda_runtime_nccl_is_unavailable_as_in_mlx_without_nccl():
    """No CUDA runtime: is_available('nccl') is False, strict init raises MLX's message
    (``mlx/distributed/nccl/no_nccl.cpp``), and CuPy is never imported."""
    code = (
        "import sys, tapescope.core as mx; D = mx.distributed\n"
        "assert D.is_available('nccl') is False\n"
        "try:\n    D.init(strict=True, backend='nccl')\n    raise SystemExit('no error')\n"
        "except RuntimeError as e:\n    print('ERR', e)\n"
        "g = D.init(backend='nccl'); assert (g.rank(), g.size()) == (0, 1)\n"
        "assert D.init() is g and 'cupy' not in sys.modules, sorted(sys.modules)\n"
        "print('DONE')\n")
    env = {k: v for k, v in os.environ.items() if k != "TAPESCOPE_CUDA"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "DONE" in r.stdout, r.stdout + r.stderr
    assert "ERR Cannot initialize nccl distributed backend." in r.stdout
    from mlx_compare import mlx_ref

    if mlx_ref is not None and not mlx_ref.distributed.is_available("nccl"):
        with pytest.raises(RuntimeError) as e:
            mlx_ref.distributed.init(strict=True, backend="nccl")
        assert str(e.value) == "Cannot initialize nccl distributed backend."
