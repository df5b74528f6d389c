"""One renderer, three dialects: every fused tape of the compile tests renders in C, CUDA and
Metal (MSL); the CUDA sources compile with ``nvcc`` where it is on PATH (skipped cleanly
otherwise); MSL, which has no compiler on Linux, is checked for its structure and against
golden files (one tape, every variant; ``TAPESCOPE_REGEN_GOLDEN=1`` rewrites them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tapescope
import tapescope.core as mx
from tapescope.core.fusion import tapes
from tapescope.kernels.codegen import cuda as cuda_mod
from tapescope.kernels.codegen import metal as metal_mod
from tapescope.kernels.codegen.c_ops import Unsupported
from tapescope.kernels.codegen.gpu import variant_suffix
from tapescope.kernels.codegen.render import CFamily, renderer

sys.path.insert(0, str(Path(__file__).parent))
import compile_fuzz  # noqa: E402
import test_compile_ops  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "dialects"


def _corpus() -> list:
    """The fused tapes of the compile tests: every spelled op per dtype (test_compile_ops'
    programs), the random graphs of the fuzz sample, and the DAG chains' ops."""
    out = []
    for name in test_compile_ops.ALL:
        _, fn = test_compile_ops.program(name)
        cf = mx.compile(fn)
        x = mx.array(np.zeros(4, dtype=test_compile_ops.npdt(name)))
        cf(x, x)  # traced, not evaluated
        out += [t for p in cf.programs() for t in tapes(p)]
    rng = np.random.default_rng(0)
    for _ in range(40):
        g = compile_fuzz.random_graph(rng, max_size=64)
        cf = mx.compile(g.fn)
        cf(*g.inputs)
        out += [t for p in cf.programs() for t in tapes(p)]
    seen = {}
    for t in out:
        seen.setdefault(t.lib_name, t)
    return list(seen.values())


@pytest.fixture(scope="module")
def corpus():
    c = _corpus()
    assert len(c) > 30
    return c


def _metal_may_refuse(t, e: Unsupported) -> bool:
    """Metal has no double: a float64 value or a spelling computed in double."""
    return "float64" in str(e) or "double" in str(e)


def test_every_tape_renders_in_c_cuda_and_metal(corpus):
    c, cu, ms = renderer("c"), renderer("cuda"), renderer("metal")
    refused = 0
    for t in corpus:
        for contiguous, ndim, large in [(True, 1, False), (True, 1, True), (False, 1, False),
                                        (False, 3, False), (False, 4, True), (False, 9, False)]:
            assert "void" in c.render(t, "k", contiguous, ndim, large)
            assert "__global__" in cu.render(t, "k", contiguous, ndim, large)
            try:
                assert "[[kernel]]" in ms.render(t, "k", contiguous, ndim, large)
            except Unsupported as e:
                assert _metal_may_refuse(t, e), e
                refused += 1
    assert refused < 6 * len(corpus) / 2  # most tapes have an MSL kernel


@pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                    reason="nvcc is not on PATH: the CUDA sources are rendered but not compiled")
def test_cuda_sources_compile_with_nvcc(corpus, tmp_path):
    """Every tape in three variants (contiguous, strided large, strided beyond 8 dims) and
    the golden tape's whole module (MLX's: contiguous, strided 1..8 and dynamic, each 32-bit
    and large), one translation unit with a namespace per tape, to PTX."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    d = renderer("cuda")
    tape, lib = _golden_tape()
    module = d.module(tape, lib)
    assert module.startswith(d.prelude)
    parts = [d.prelude, f"namespace golden {{\n{module[len(d.prelude):]}}}\n"]
    for i, t in enumerate(corpus):
        kernels = [d.schedule.render(d, t, f"{t.lib_name}_{variant_suffix(c, n, lg, 8)}", c, n, lg,
                                     preamble=False)
                   for c, n, lg in ((True, 1, False), (False, 3, True), (False, 9, False))]
        parts.append(f"namespace tape{i} {{\n{d.preamble(t)[len(d.prelude):]}{''.join(kernels)}}}\n")
    cu = tmp_path / "all.cu"
    cu.write_text("".join(parts))
    r = subprocess.run([nvcc, "--ptx", str(cu), "-o", str(tmp_path / "all.ptx"), "-Werror",
                        "all-warnings"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    ptx = (tmp_path / "all.ptx").read_text()
    assert f".entry {lib}_strided_dynamic_large(" in ptx and f".entry {lib}_contiguous(" in ptx


def _golden_tape():
    def f(x, y):
        return mx.exp(-x) * mx.sin(y) + 2 * x * y - mx.tanh(x)

    x = mx.array(np.ones((4, 4), dtype=np.float16))
    g = tapescope.trace(f, x, x)
    (k,) = g.kernels
    return k.tape, k.name


METAL_VARIANTS = [(True, 1, False), (True, 1, True), (False, 1, False), (False, 3, False),
                  (False, 4, False), (False, 4, True), (False, 7, False), (False, 8, False),
                  (False, 9, True)]


@pytest.mark.parametrize("contiguous,ndim,large", METAL_VARIANTS)
def test_msl_golden_per_variant(contiguous, ndim, large):
    tape, lib = _golden_tape()
    d = renderer("metal")
    suffix = variant_suffix(contiguous, ndim, large, 7)
    src = d.render(tape, f"{lib}_{suffix}", contiguous, ndim, large)
    path = GOLDEN / f"metal_{suffix}.metal"
    if os.environ.get("TAPESCOPE_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src.replace(lib, "LIB"))
    assert src.replace(lib, "LIB") == path.read_text()


def _check_msl_structure(src: str, name: str) -> None:
    assert src.count("{") == src.count("}") and src.count("(") == src.count(")")
    assert f"[[kernel]] void {name}(" in src
    sig = src[src.index(f"[[kernel]] void {name}("):]
    sig = sig[:sig.index(") {")]
    buffers = [int(b) for b in re.findall(r"\[\[buffer\((\d+)\)\]\]", sig)]
    assert buffers == list(range(len(buffers)))  # bound in order, MLX's argument order
    assert "[[thread_position_in_grid]]" in sig
    for word in ("double", "_Float16", "#pragma omp", "__global__", "void**", "ts_stream"):
        assert word not in src, word


def test_every_cuda_kernel_ends_at_its_completion_word(corpus):
    """A CUDA kernel takes the host's completion word last (kernels/cuda/_lane.c) and every
    thread reaches its end, where one writes the word after a barrier and a system-wide
    fence: no early ``return``, every exit a jump to ``done``."""
    d = renderer("cuda")
    for t in corpus[:20]:
        for contiguous, ndim, large in d.schedule.variants():
            src = d.render(t, "k", contiguous, ndim, large)
            sig = "unsigned int* __restrict__ done_word,\n    const unsigned int done_value) {"
            assert sig in src
            body = src[src.index(sig):]
            assert "return;" not in body
            assert body.count("done:") == 1 and "goto done;" in body
            end = body[body.index("done:"):]
            assert end.index("__syncthreads();") < end.index("__threadfence_system();") \
                < end.index("*(volatile unsigned int*)done_word = done_value;")
            assert "if (done_word != nullptr)" in end


def test_msl_structure_of_every_variant(corpus):
    d = renderer("metal")
    n = 0
    for t in corpus:
        try:
            src = d.module(t, t.lib_name)
        except Unsupported as e:
            assert _metal_may_refuse(t, e), e
            continue
        n += 1
        for contiguous, ndim, large in d.schedule.variants():
            _check_msl_structure(src, f"{t.lib_name}_{variant_suffix(contiguous, ndim, large)}")
    assert n > len(corpus) / 2


def test_metal_work_per_thread_follows_mlx():
    sched = renderer("metal").schedule
    tape, _ = _golden_tape()  # float16 output: 8 / 2 = 4 elements per thread
    assert sched.work_per_thread(tape, True, 1, False) == 4
    assert sched.work_per_thread(tape, False, 3, False) == 1
    assert sched.work_per_thread(tape, False, 4, False) == 2
    assert sched.work_per_thread(tape, False, 4, True) == 4
    src = renderer("metal").render(tape, "k", True, 1, False)
    assert "* 4;" in src and "for (int w = 0; w < 4; ++w)" in src
    assert variant_suffix(False, 8, False) == "strided_dynamic"
    assert variant_suffix(False, 7, True) == "strided_7_large"


def test_dialects_are_tables_over_the_shared_base():
    for mod, cls in ((cuda_mod, cuda_mod.CUDADialect), (metal_mod, metal_mod.MetalDialect)):
        lines = Path(mod.__file__).read_text().splitlines()
        assert len(lines) <= 150, (mod.__name__, len(lines))
        assert issubclass(cls, CFamily)
        # the structure is the base's: no dialect renders loads, the body or the loops
        for method in ("body", "stores", "arguments", "render", "preamble", "literal", "op_expr"):
            assert method not in cls.__dict__, (cls, method)


def test_trace_kernel_gives_its_source_for_every_runtime():
    def f(x):
        return mx.exp(-x) * mx.sin(x) + 2 * x

    g = tapescope.trace(f, mx.ones((4, 4)))
    (k,) = g.kernels
    src = k.sources
    assert set(src) == {"cpu", "cuda", "metal"}
    assert f"void {k.symbol}(void** args)" in src["cpu"]
    assert f"__global__ void __launch_bounds__(256) {k.symbol}(" in src["cuda"]
    assert f"[[kernel]] void {k.symbol}(" in src["metal"]
    html = k.sources_html()
    assert html.count("<th>") == 3 and "Metal" in html and "CUDA" in html


def test_a_float64_tape_says_why_metal_has_no_kernel():
    g = tapescope.trace(lambda x: mx.exp(x) + 1, mx.ones((4,), dtype=mx.float64), )
    (k,) = g.kernels
    assert k.sources["metal"].startswith("// no Metal kernel") and "float64" in k.sources["metal"]
    assert "__global__" in k.sources["cuda"]
