"""Static snapshots: a notebook with the widgets, executed in a real kernel (nbclient) and
converted to HTML by nbconvert without any saved widget state (as GitHub or a reader without
a kernel sees it), shows each widget's figures, never an empty widget or an error."""

from __future__ import annotations

import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
nbconvert = pytest.importorskip("nbconvert")
pytest.importorskip("ipywidgets")
pytest.importorskip("ipykernel")

CELLS = [
    "%load_ext tapescope\nimport numpy as np, tapescope\nfrom tapescope import viz",
    "%%mlx --compile\nx = mx.array(np.linspace(0, 1, 256, dtype=np.float32))\ny = mx.exp(x) * 2 + x",
    "import tapescope.core as mx\nwith tapescope.record() as rec:\n    mx.eval(mx.zeros((4096,)) + 1)\n"
    "viz.MemoryWidget(rec.records, live=False)",
    "viz.CacheWidget()",
    "viz.EventsWidget()",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}})
    client.execute(env={**os.environ, "PYTHONPATH": ":".join(sys.path)})
    return nb


def _bundles(cell) -> list:
    return [o.get("data", {}) for o in cell.outputs if o.get("output_type") in ("display_data", "execute_result")]


def test_every_widget_is_shown_as_its_snapshot_then_its_live_view(executed):
    for cell in executed.cells[1:]:
        bundles = _bundles(cell)
        kinds = ["snapshot" if "tapescope-snapshot" in b.get("text/html", "") else
                 "live" if "application/vnd.jupyter.widget-view+json" in b else "other" for b in bundles]
        assert [k for k in kinds if k != "other"] == ["snapshot", "live"], (cell.source, kinds)
        live = next(b for b in bundles if "application/vnd.jupyter.widget-view+json" in b)
        assert "text/html" not in live  # nbconvert without widget state must not show it twice


def test_nbconvert_html_without_widget_state_shows_the_snapshots(executed):
    nb = nbformat.from_dict(executed)
    nb.metadata.pop("widgets", None)  # what a reader without the saved state gets
    html, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    assert "model not found" not in html
    assert "tapescope-cell" in html and "Look at" in html  # the %%mlx summary
    assert "fused kernel" in html
    assert "largest live buffers" in html and "memory limit" in html  # MemoryWidget
    assert "kernel cache:" in html and "Exp" in html  # CacheWidget: the compiled kernel's name
    assert "events:" in html and "primitive run" in html  # EventsWidget
    # plots drawn by plotly (its HTML and script): the %%mlx cell's memory and events, the
    # MemoryWidget's and the EventsWidget's
    assert html.count("class=\"plotly-graph-div\"") >= 4 and "Plotly.newPlot" in html
