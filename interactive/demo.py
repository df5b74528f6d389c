"""``make demo`` (``python -m tapescope.demo``): the tour notebook, executed, as a page.

Executes ``notebooks/00_tour.ipynb`` headlessly (nbclient, a fresh Python kernel), writes it
with its pictures and widget snapshots as ``build/tour.html`` (nbconvert's lab template;
``build/tour-dark.html`` in the dark theme), and prints the tour's own summary (kernels
built, fused tapes, peak memory, the JAX check's verdict: the output of the cell tagged
``tour-summary``, computed in the kernel) and the page's path. Each widget carries a static
HTML snapshot of itself, so the page shows its figures without a running kernel.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "notebooks" / "00_tour.ipynb"
SUMMARY_TAG = "tour-summary"


def execute(path: Path, cwd: Optional[Path] = None, timeout: int = 240) -> Any:
    """``path`` executed top to bottom in a new kernel (errors raise); the notebook node."""
    import nbclient
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd or path.parent)}})
    # the kernel imports this tapescope, wherever it was imported from here
    client.execute(env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    return nb


def stream_text(cell: Any) -> str:
    """What a code cell printed."""
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def summary(nb: Any) -> str:
    """The text the cell tagged ``tour-summary`` printed."""
    for cell in nb.cells:
        if SUMMARY_TAG in cell.get("metadata", {}).get("tags", []):
            return stream_text(cell).rstrip()
    raise ValueError(f"the notebook has no cell tagged {SUMMARY_TAG!r}")


def write_page(nb: Any, out: Path, theme: str = "light") -> Path:
    """``nb`` as one HTML page (lab template, pictures inline). The widgets appear as their
    static snapshots: the live widgets' state is left out (plotly's FigureWidget alone carries
    5 MB of JavaScript per figure, and rendering it needs a widget manager from a CDN)."""
    import copy

    from nbconvert import HTMLExporter

    from tapescope.viz.theme import inline_plotly

    page = copy.deepcopy(nb)
    page.metadata.pop("widgets", None)
    exporter = HTMLExporter(template_name="lab", theme=theme)
    body, _ = exporter.from_notebook_node(page)
    body = inline_plotly(body)  # the snapshots' plots work offline
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body, encoding="utf-8")
    return out


def main(argv: Optional[list] = None) -> int:
    """Execute the tour, write the pages, print the summary and the path."""
    p = argparse.ArgumentParser(prog="python -m tapescope.demo", description=__doc__.splitlines()[0])
    p.add_argument("--notebook", type=Path, default=TOUR, help="the notebook to run (default: the tour)")
    p.add_argument("--out", type=Path, default=Path("build") / "tour.html",
                   help="the page to write (default: build/tour.html; the dark theme beside it)")
    args = p.parse_args(argv)
    print(f"tapescope demo: executing {args.notebook.name} (a fresh kernel, CPU) ...", flush=True)
    nb = execute(args.notebook)
    page = write_page(nb, args.out)
    dark = write_page(nb, args.out.with_name(args.out.stem + "-dark" + args.out.suffix), theme="dark")
    print()
    print(summary(nb))
    print()
    print(f"page: {page.resolve()}")
    print(f"      (dark theme: {dark.resolve()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
