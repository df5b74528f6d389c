"""The teaching notebooks: generated from notebooks/make_notebooks.py and stored without outputs,
every exercise with a collapsed answer cell, and every notebook executed top to bottom in a
real kernel (nbclient, the CPU), failing on any cell error; what each notebook teaches is
checked in what it printed. The tour is also written as `make demo`'s page.

The notebooks run two at a time (a kernel each) while the tests wait for their results: on a
loaded 2-core machine the kernels' start-up and JAX's import overlap with the other's cells.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from tapescope import demo  # noqa: E402

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
COURSE = ["00_tour", "01_lazy_evaluation", "02_compile_and_fusion", "03_one_tape_three_kernels",
          "04_memory_and_the_buffer_cache", "05_streams_events_and_fences",
          "06_checking_against_jax", "07_interrupting_an_eval", "08_gradients_as_graphs",
          "09_why_is_it_fast_or_slow"]
NEEDS_MLX = {"10_extra_mlx_nn"}  # MLX's own mlx.nn, through as_mlx
HAS_MLX = importlib.util.find_spec("mlx") is not None
NO_GPU = "No GPU here: mx.cuda.is_available() and mx.metal.is_available() are both False"


def _gpu_expected() -> bool:
    """Whether the notebooks' kernels see a GPU runtime: the CUDA runtime opted in
    (TAPESCOPE_CUDA=1, as the GPU machine's notebook part runs) with CuPy seeing a device."""
    import os

    if os.environ.get("TAPESCOPE_CUDA", "") in ("", "0"):
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "notebooks" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_course_is_there():
    stems = [p.stem for p in NOTEBOOKS]
    assert stems[:len(COURSE)] == COURSE
    assert list(_generator().NOTEBOOKS) == stems  # nothing stored that the generator does not write


def test_notebooks_are_generated_and_stored_without_outputs(tmp_path):
    gen = _generator()
    for stem, cells in gen.NOTEBOOKS.items():
        gen.write(cells, tmp_path / f"{stem}.ipynb")
        stored = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())
        assert stored == json.loads((tmp_path / f"{stem}.ipynb").read_text()), \
            f"{stem}.ipynb differs from make_notebooks.py's: run python notebooks/make_notebooks.py"
        for cell in stored["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, stem


def test_every_exercise_has_a_collapsed_answer():
    for path in NOTEBOOKS:
        cells = nbformat.read(str(path), as_version=4).cells
        questions = [i for i, c in enumerate(cells)
                     if c.cell_type == "markdown" and c.source.startswith("**Exercise.**")]
        if path.stem in COURSE:
            assert questions, f"{path.name} has no exercise"
        for i in questions:
            answer = cells[i + 1]
            assert answer.cell_type == "code" and "answer" in answer.metadata.get("tags", []), path.name
            assert answer.metadata.get("jupyter", {}).get("source_hidden") is True, path.name
        answers = [c for c in cells if "answer" in c.metadata.get("tags", [])]
        assert len(answers) == len(questions), path.name


@pytest.fixture(scope="module")
def executed(request, tmp_path_factory):
    """The selected notebooks' executions, started two at a time: name -> future of the node."""
    cwd = tmp_path_factory.mktemp("notebooks")
    selected = " ".join(item.nodeid for item in request.session.items)
    runnable = [p for p in NOTEBOOKS if (HAS_MLX or p.stem not in NEEDS_MLX)
                and (f"[{p.name}]" in selected or (p.stem == "00_tour" and "test_tour_page" in selected))]
    pool = ThreadPoolExecutor(2)
    futures = {p.stem: pool.submit(demo.execute, p, cwd) for p in runnable}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def _texts(nb) -> tuple:
    """(what the code cells printed, their rich outputs' text/html and text/plain)."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    printed = "".join(demo.stream_text(c) for c in code)
    rich = [o for c in code for o in c.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result")]
    html = "".join(o.get("data", {}).get("text/html", "") for o in rich)
    plain = "".join(o.get("data", {}).get("text/plain", "") for o in rich)
    return printed, html, plain


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, (pattern, text)
    return float(m.group(1))


def _check_tour(text, html, plain):
    assert re.search(r"kernels built: [1-9]\d* C kernels on the CPU", text), text
    assert "fused tapes: 1 in gelu's trace" in text and "JAX check of gelu: PASS" in text, text
    assert _number(r"peak memory: ([\d.]+) MiB", text) > 0
    assert "1 fused kernel with 5 tape steps" in text  # the exercise's answer ran
    assert all(f"<th>{d}</th>" in html for d in ("C", "CUDA", "Metal"))  # one tape, three dialects
    if shutil.which("dot"):
        assert "<svg" in html or "image/svg+xml" in plain or "Graph gelu" in plain
    else:  # the GPU machine has no graphviz: the graph cell says so and how to install it
        assert "the graphviz 'dot' program was not found" in plain + text
    assert "tapescope.check: PASS" in plain


def _check_lazy(text, html, plain):
    assert "primitives run while writing y: 0" in text and "primitives run the second time: 0" in text
    assert "w still lazy: True" in text
    assert "ran while evaluating e: ['Broadcast', 'Subtract']" in text  # c was not run again


def _check_fusion(text, html, plain):
    assert re.search(r"eager\s+[\d.]+ ms\s+11 primitives\s+44\.0 MiB written", text), text
    assert re.search(r"compiled\s+[\d.]+ ms\s+1 primitives\s+4\.0 MiB written", text), text
    assert "writes 11x fewer bytes" in text
    assert re.search(r"input B from Sum\s+— reduction", text), text
    assert "mlx fusion:      3 ops, 2 kernels" in text and "extended fusion: 1 ops, 1 kernels" in text


def _check_dialects(text, html, plain):
    assert "C    max |error| vs the eager ops: 0\n" in text
    assert all(f"<th>{d}</th>" in html for d in ("C", "CUDA", "Metal"))
    if "Metal  CPU through the Metal shim" in text:
        assert _number(r"MSL  max \|error\| vs the eager ops: (\S+)", text) < 1e-5
    assert "strided_2" in text and "A_strides" in text
    assert "__float2half_rn" in text and "(half)(tmp_E)" in text


def _check_memory(text, html, plain):
    assert "('cache_reuse', 262144)" in text and "active memory grew by 0 bytes" in text
    eager = _number(r"eager\s+peak above the input: ([\d.]+) MiB", text)
    fused = _number(r"compiled\s+peak above the input: ([\d.]+) MiB", text)
    assert fused < eager
    assert "cache with limit 0: 0 bytes" in text


def _check_streams(text, html, plain):
    fence = re.search(r"fence_update\s+stream (\d+).*fence_wait\s+stream (\d+)\s+primitive\s+stream \2\s+Add",
                      text, re.S)
    assert fence and fence.group(1) != fence.group(2), text
    assert re.search(r"stream \d+: 10 primitives, busy.*\nstream \d+: 10 primitives, busy", text), text


def _check_jax(text, html, plain):
    assert "FAIL — first divergence: Exp#" in text and "PASS after restoring the rule" in text
    assert re.search(r"FAIL Add#\d+ 1 of 10 elements outside tolerance", text), text
    assert "tapescope.check: PASS" in plain and "tapescope.check: FAIL" in plain


def _check_interrupt(text, html, plain):
    assert "KeyboardInterrupt: [eval] Evaluation interrupted" in text, text
    total = _number(r"a chain of (\d+) primitives", text)
    done = _number(r"(\d+) of 300 steps evaluated before the interrupt", text)
    ran = _number(r"resumed: (\d+) primitives ran", text)
    assert "interrupt_eval() -> [True]" in text  # asked while the eval ran
    # the 100th Sin asked: it finished, its step's Add did not run (the next node boundary)
    assert done == 99 and ran < total  # resumed, not started over
    assert "interrupted\n" in text  # the exercise's two-stream eval stopped too
    ours = _number(r"numpy: [\d.]+\s+tapescope: ([\d.]+)", text)
    assert ours == pytest.approx(_number(r"numpy: ([\d.]+)", text), rel=1e-6)


def _check_grads(text, html, plain):
    assert re.search(r"\d+ ops, [1-9]\d* of them backward", text), text
    losses = [float(v) for v in re.findall(r"step +\d+  loss ([\d.]+)", text)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 10, text  # it learns
    assert "tapescope.check: PASS — 4 output(s)" in plain


def _check_speed(text, html, plain):
    for label, n in (("eager", 11), ("fused", 1), ("split", 3), ("extended", 1)):
        assert re.search(rf"{label}\s+[\d.]+ ms\s+{n} primitives", text), (label, text)
    if "No GPU here" in text:
        assert NO_GPU in text


def _check_mlx_nn(text, html, plain):
    assert "tapescope.core <class 'tapescope.core.array.array'>" in text
    losses = [float(v) for v in re.findall(r"step +\d+  loss ([\d.]+)", text)]
    assert len(losses) == 3 and losses[-1] < losses[0], text  # it learns
    m = re.search(r"(\d+) ops, (\d+) of them backward, (\d+) fused kernels", text)
    assert m and int(m.group(2)) > 0 and int(m.group(1)) > int(m.group(2)), text
    assert re.search(r"compiled step: [\d.]+ ms", text), text


def _gpu_cells_text(nb) -> str:
    """What the cells that run on the GPU (``with mx.stream(mx.gpu)``) printed."""
    return "".join(demo.stream_text(c) for c in nb.cells
                   if c.cell_type == "code" and "mx.stream(mx.gpu)" in c.source)


def _check_dialects_gpu(text):
    """Notebook 03's CUDA cell: the tape ran on the GPU, equal to the eager ops, built by NVRTC."""
    assert _number(r"CUDA max \|error\| vs the eager ops: (\S+)", text) < 1e-5, text
    assert re.search(r"built for the GPU: \[\('cuda', '[^']+'\)", text), text


def _check_speed_gpu(text):
    """Notebook 09's GPU section: eager, fused and split summarised on the GPU."""
    for label, n in (("eager", 11), ("fused", 1), ("split", 3)):
        assert re.search(rf"{label}\s+[\d.]+ ms\s+{n} primitives", text), (label, text)


_GPU_CHECKS = {"03": _check_dialects_gpu, "09": _check_speed_gpu}

CHECKS = {"00": _check_tour, "01": _check_lazy, "02": _check_fusion, "03": _check_dialects,
          "04": _check_memory, "05": _check_streams, "06": _check_jax, "07": _check_interrupt,
          "08": _check_grads, "09": _check_speed, "10": _check_mlx_nn}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_teaches(path, executed):
    if path.stem in NEEDS_MLX and not HAS_MLX:
        pytest.skip(f"{path.name} runs MLX's own mlx.nn (as_mlx), and MLX is not installed")
    nb = executed[path.stem].result()  # a cell error raises nbclient's CellExecutionError here
    printed, html, plain = _texts(nb)
    CHECKS[path.stem[:2]](printed, html, plain)
    if path.stem[:2] in ("03", "09"):
        if _gpu_expected():
            assert "No GPU here" not in printed, printed  # the GPU cells ran
            _GPU_CHECKS[path.stem[:2]](_gpu_cells_text(nb))
        elif "No GPU here" in printed:
            assert NO_GPU in printed  # the GPU cells said why they did not run


def test_tour_page_and_summary(executed, tmp_path):
    nb = executed["00_tour"].result()
    text = demo.summary(nb)
    assert text.startswith("tour summary") and "JAX check of gelu: PASS" in text
    page = demo.write_page(nb, tmp_path / "tour.html").read_text()
    assert "tour summary" in page and "<svg" in page  # the summary and the graph pictures
    device = "gpu" if _gpu_expected() else "cpu"  # the memory widget shows the default device
    assert "kernel cache: " in page and "events: " in page, page[-2000:]  # the widgets' snapshots
    assert f"memory ({device})" in page
    assert not re.search(r'<script[^>]*src="https://cdn\.plot\.ly', page)  # plotly.js inline, once
    assert page.count("window.__ts_define = window.define") == 1
    assert "application/vnd.jupyter.widget-state+json" not in page  # snapshots, not 5 MB models
