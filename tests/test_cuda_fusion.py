"""Fused CUDA kernels (``kernels/cuda/compiled.py``): compiled on the GPU equals op by op on
the GPU (bit for bit, as on the CPU), equals compiled on the CPU; every variant (the vector
path and its tails, misaligned slices, strided 1..9 dimensions, broadcasting), the 64-bit
index past UINT32_MAX and sizes around 2^31; the NVRTC cache on disk follows the CPU cache's
rules. Runs where CuPy reaches a GPU and ``TAPESCOPE_CUDA=1`` (the H200 machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.kernels import backends

sys.path.insert(0, str(Path(__file__).parent))
import compile_fuzz  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TAPESCOPE_CUDA") == "1" and backends.cuda_device_count() > 0),
    reason="fused CUDA kernels need CuPy, an NVIDIA GPU and TAPESCOPE_CUDA=1")

TRANSCENDENTAL = {"exp", "log", "sin", "cos", "tanh", "sigmoid", "erf", "erfinv", "log1p",
                  "expm1", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "arcsinh",
                  "arccosh", "arctanh", "sqrt", "rsqrt", "log2", "log10", "power",
                  "logaddexp", "arctan2", "exp2", "cbrt"}


@pytest.fixture(autouse=True)
def _gpu_default(gpu_default_device):
    yield


def _cuda_entries() -> list:
    from tapescope.kernels.cpu import compiler

    return [e for e in compiler.entries() if e.runtime == "cuda"]


def _host(a: mx.array) -> np.ndarray:
    return compile_fuzz.to_numpy(a)


def _subnormal_positions(inputs: list, shape: tuple) -> np.ndarray:
    """Where any input (broadcast to ``shape``) is a float subnormal."""
    mask = np.zeros(shape, bool)
    for a in inputs:
        h = _host(a)
        if h.dtype.kind == "f" or h.dtype == compile_fuzz._BF16:
            f = np.abs(h.astype(np.float64))
            tiny = float(np.finfo(np.float32 if h.dtype == compile_fuzz._BF16 else h.dtype).tiny)
            mask |= np.broadcast_to((f > 0) & (f < tiny), shape)
    return mask


GPU_DTYPES = [d for d in compile_fuzz.DTYPES if d != "float64"]


@pytest.mark.parametrize("seed", range(4))
def test_random_graphs_compiled_on_the_gpu_equal_op_by_op_and_the_cpu_kernels(seed):
    """Fused CUDA == CuPy op by op == fused C, bit for bit (C: without transcendental
    functions, whose CUDA and libm roundings may differ by an ulp), at every element whose
    inputs are not subnormal: CuPy's kernels flush subnormal operands to zero (measured on
    the H200: 1e-45 >= 1.6e-43 is True op by op), so there the three may differ."""
    rng = np.random.default_rng(seed)
    built = len(_cuda_entries())
    bad = []
    for k in range(40):
        # no float64 on a GPU stream (MLX refuses it there: mlx/array.cpp)
        g = compile_fuzz.random_graph(rng, max_size=2**20, dtypes_from=GPU_DTYPES)
        if any(a.dtype == mx.bfloat16 for a in g.inputs):
            continue  # bfloat16 runs on the host on this runtime (a recorded fallback, no CUDA kernel)
        with np.errstate(all="ignore"):
            op = g.fn(*g.inputs)
            mx.eval(op)
            gpu = mx.compile(g.fn)(*g.inputs)
            mx.eval(gpu)
            with mx.stream(mx.cpu):
                cpu_in = [mx.array(_host(a)) for a in g.inputs]
                cpu = mx.compile(g.fn)(*cpu_in)
                mx.eval(cpu)
        exact = not any(s[1] in TRANSCENDENTAL for s in g.steps)
        full = np.broadcast_shapes(*[a.shape for a in (*g.inputs, *gpu)])
        keep = ~_subnormal_positions(g.inputs, full)
        for j, (a, o, c) in enumerate(zip(gpu, op, cpu)):
            an, on, cn = (np.broadcast_to(_host(v), full) for v in (a, o, c))
            m_op = compile_fuzz.mismatches(an[keep], on[keep])
            if m_op:
                bad.append(f"graph {k} output {j}: {m_op} of {an.size} differ from op by op\n"
                           f"  {g.describe()}")
            if exact:
                m_c = compile_fuzz.mismatches(an[keep], cn[keep])
            else:
                with np.errstate(all="ignore"):
                    af, cf = an[keep].astype(np.float64), cn[keep].astype(np.float64)
                    close = np.isclose(af, cf, rtol=2e-2 if a.dtype == mx.float16 else 1e-5,
                                       atol=0, equal_nan=True) | (af == cf)
                m_c = 0 if an.dtype.kind in "iub" else int(np.count_nonzero(~close))
            if m_c:
                bad.append(f"graph {k} output {j}: {m_c} of {an.size} differ from C\n  {g.describe()}")
    assert not bad, "\n".join(bad[:5])
    assert len(_cuda_entries()) > built  # kernels were built, not interpreted


def _chain(x, y):
    return 2 * x + 3 * y - x * y


@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 8, 9, 255, 256, 257, 1023, 1024 * 4 + 3, 2**20 + 1])
@pytest.mark.parametrize("dt", ["float32", "float16", "int8", "float64"])
def test_contiguous_vector_path_tails_and_misaligned_slices(n, dt):
    rng = np.random.default_rng(n)
    a = compile_fuzz.random_values(rng, dt, (n + 3,))
    b = compile_fuzz.random_values(rng, dt, (n + 3,))
    f = mx.compile(_chain)
    for off in range(3):  # slices starting 0, 1, 2 elements in: the vector loads' alignment
        x, y = mx.array(a)[off:off + n], mx.array(b)[off:off + n]
        with np.errstate(all="ignore"):
            want = _chain(x, y)
            got = f(x, y)
            mx.eval(want, got)
        keep = ~_subnormal_positions([x, y], (n,))
        assert compile_fuzz.mismatches(_host(got)[keep], _host(want)[keep]) == 0, (n, dt, off)


@pytest.mark.parametrize("ndim", range(1, 10))
def test_strided_variants_up_to_the_dynamic_kernel(ndim):
    rng = np.random.default_rng(ndim)
    shape = tuple(int(s) for s in rng.integers(2, 4, ndim))
    base = rng.standard_normal(shape[::-1]).astype(np.float32)
    x = mx.transpose(mx.array(base))  # every dimension strided
    if ndim == 1:  # a 1-D transpose is contiguous: every other element instead
        x = mx.array(rng.standard_normal(2 * shape[0]).astype(np.float32))[::2]
    y = mx.array(rng.standard_normal(shape[-1:]).astype(np.float32))  # broadcast along the rest
    f = mx.compile(lambda a, b: mx.exp(a) * b + a)
    got = f(x, y)
    want = mx.exp(x) * y + x
    np.testing.assert_array_equal(_host(got), _host(want))
    names = {e.name for e in _cuda_entries()}
    suffix = f"strided_{ndim}" if ndim <= 8 else "strided_dynamic"
    assert any(n.endswith(suffix) for n in names), sorted(names)[-5:]


def test_compiled_kernels_are_listed_beside_the_c_kernel_of_the_same_tape():
    import tapescope
    from tapescope.kernels.cache_entries import entry_sources

    f = mx.compile(lambda a: mx.sin(a) * 2 + 1)
    mx.eval(f(mx.arange(1000, dtype=mx.float32)))
    with mx.stream(mx.cpu):
        mx.eval(f(mx.arange(1000, dtype=mx.float32)))
    rows = [e for e in tapescope.kernel_cache() if "Sin" in e["name"]]
    by_runtime = {e["runtime"]: e for e in rows}
    assert {"cpu", "cuda"} <= set(by_runtime), [(e["name"], e["runtime"]) for e in rows]
    assert by_runtime["cpu"]["name"] == by_runtime["cuda"]["name"]  # MLX's one kernel name
    cu = by_runtime["cuda"]
    assert 'extern "C" __global__' in cu["source"] and cu["name"] in cu["source"]
    src = entry_sources(cu)
    assert src["cuda"] == cu["source"] and "void" in src["cpu"]


def test_the_cubin_is_cached_on_disk_and_a_corrupt_one_is_rebuilt(tmp_path):
    code = ("import tapescope.core as mx; from tapescope.kernels.cpu import compiler;"
            "mx.set_default_device(mx.gpu);"
            "f = mx.compile(lambda a: mx.cos(a) * 5 - a); mx.eval(f(mx.arange(77, dtype=mx.float32)));"
            "e = [e for e in compiler.entries() if e.runtime == 'cuda'][0]; print(e.origin, e.disk_path)")
    env = dict(os.environ, TAPESCOPE_CACHE_DIR=str(tmp_path / "cache"), TAPESCOPE_CUDA="1")

    def run():
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout.split()

    origin, path = run()
    assert origin == "built" and path.endswith(".cubin")
    assert (Path(path).parent.stat().st_mode & 0o777) == 0o700  # the CPU cache's private folder
    assert run()[0] == "disk"
    Path(path).write_bytes(Path(path).read_bytes()[:100])  # truncated: not ours any more
    assert run()[0] == "built"


def test_large_index_past_uint32_max_contiguous_and_strided():
    free, _ = __import__("cupy").cuda.runtime.memGetInfo()
    if free < 24 << 30:
        pytest.skip("needs about 20 GiB of GPU memory")
    # MLX's shape dimensions are 32-bit: more than 2^32 elements take two dimensions
    rows, m = 3, 1431655769  # 4294967307 elements
    n = rows * m
    period = (np.arange(251) - 125).astype(np.int8)
    x = mx.array(np.resize(period, n).reshape(rows, m))
    f = mx.compile(lambda a: a * 3 + 1)
    out = f(x)
    mx.eval(out)
    names = [e.name for e in _cuda_entries()]
    assert any(nm.endswith("contiguous_large") for nm in names), names
    with np.errstate(over="ignore"):
        want = (period * np.int8(3) + np.int8(1)).astype(np.int8)
    for start in (0, 2**31 - 251 * 3, 2**32 - 251 * 8, n - 7):
        r, c = divmod(start, m)
        stop = min(c + 251 * 8, m)
        got = np.array(out[r, c:stop])
        flat = r * m + np.arange(c, stop)
        np.testing.assert_array_equal(got, want[flat % 251])
    del x, out
    # strided and large: an outer sum of a column and a row, 2^32 + 2^16 + ... elements
    rows, cols = 2**16 + 1, 2**16 + 3
    c = mx.arange(rows, dtype=mx.int32).astype(mx.int8).reshape(rows, 1)
    r = mx.arange(cols, dtype=mx.int32).astype(mx.int8).reshape(1, cols)
    g = mx.compile(lambda a, b: a - b * 2)
    o = g(c, r)
    mx.eval(o)
    assert any(nm.endswith("_large") and "strided" in nm for nm in (e.name for e in _cuda_entries()))
    for i in (0, rows // 2, rows - 1):
        got = np.array(o[i])
        want_row = (np.int8(i % 256 - 256 if i % 256 > 127 else i % 256)
                    - np.arange(cols).astype(np.int8) * np.int8(2)).astype(np.int8)
        np.testing.assert_array_equal(got, want_row)


def test_sizes_around_two_to_the_31():
    free, _ = __import__("cupy").cuda.runtime.memGetInfo()
    if free < 12 << 30:
        pytest.skip("needs about 8 GiB of GPU memory")
    # a dimension is 32-bit (MLX's shapes): past 2^31 elements with two dimensions
    for shape in ((2**31 - 3,), (2, 2**30 + 3)):
        n = int(np.prod(shape))
        period = (np.arange(251) - 125).astype(np.int8)
        x = mx.array(np.resize(period, n).reshape(shape))
        out = mx.compile(lambda a: a * 3 + 1)(x)
        with np.errstate(over="ignore"):
            want = (period * np.int8(3) + np.int8(1)).astype(np.int8)
        last = shape[-1]
        got = np.array(out[(-1,) * (len(shape) - 1) + (slice(last - 251 * 4, None),)])
        flat = n - last + np.arange(last - 251 * 4, last)
        np.testing.assert_array_equal(got, want[flat % 251])
        del x, out


def test_trace_on_the_gpu_shows_the_cuda_kernel_source():
    import tapescope

    f = mx.compile(lambda a: mx.tanh(a) + a * a)
    x = mx.arange(64, dtype=mx.float32)
    mx.eval(f(x))
    g = tapescope.trace(f, x)
    (k,) = g.kernels
    built = [e for e in tapescope.kernel_cache() if e["runtime"] == "cuda" and e["name"] == k.gpu_symbol]
    assert built and k.sources["cuda"] == built[0]["source"]
    assert k.gpu_symbol in k.sources_html()
    dot = g.to_dot()  # the picture's source (the GPU machine has no graphviz binary)
    assert k.name[:12] in dot  # the fused kernel drawn, under its (clipped) MLX name
