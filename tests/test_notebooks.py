"""Every teaching notebook in notebooks/ executes top to bottom in a real kernel (nbclient)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_without_errors(path, tmp_path):
    if path.name.startswith("04"):
        pytest.importorskip("mlx.core", reason="notebook 04 runs MLX's own mlx.nn (as_mlx)")
    nb = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env={**os.environ, "PYTHONPATH": ":".join(sys.path)})
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    if path.name.startswith("01"):
        assert "primitives run while writing y: 0" in text
        assert "primitives run the second time: 0" in text
        assert "cache_reuse" in text
        assert "active memory grew by 0 bytes" in text
    if path.name.startswith("04"):
        assert "tapescope.core <class 'tapescope.core.array.array'>" in text
        losses = [float(v) for v in re.findall(r"step +\d+  loss ([\d.]+)", text)]
        assert len(losses) == 3 and losses[-1] < losses[0], text  # it learns
        m = re.search(r"(\d+) ops, (\d+) of them backward, (\d+) fused kernels", text)
        assert m and int(m.group(2)) > 0 and int(m.group(1)) > int(m.group(2)), text
        assert re.search(r"compiled step: [\d.]+ ms", text), text
    if path.name.startswith("03"):
        assert re.search(r"eager\s+[\d.]+ ms\s+11 primitives", text), text
        assert re.search(r"compiled\s+[\d.]+ ms\s+1 primitives", text), text
    if path.name.startswith("02"):
        shown = [o for o in outputs if o.get("output_type") in ("display_data", "execute_result")]
        assert any("image/svg+xml" in o.get("data", {}) or "text/html" in o.get("data", {})
                   for o in shown)
        html = "".join(o.get("data", {}).get("text/html", "") for o in shown)
        assert all(f"<th>{d}</th>" in html for d in ("C", "CUDA", "Metal"))  # the kernel, 3 dialects
