"""README.md states nothing of its own about performance or the notebooks: its benchmark rows are
BENCHMARKS.md's, its notebook list is notebooks/'s, and the pictures it shows exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_benchmark_rows_are_benchmarks_md_rows():
    bench = set((ROOT / "BENCHMARKS.md").read_text().splitlines())
    perf = README.split("## Performance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in perf.splitlines() if line.startswith("|") and not line.startswith("|---")]
    assert len(rows) >= 8
    assert [r for r in rows if r not in bench] == []


def test_notebook_list_is_the_notebooks():
    listed = re.findall(r"^\| `(\d\d_\w+)` \|", README, re.M)
    assert listed == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_pictures_exist():
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert pictures and all((ROOT / p).is_file() for p in pictures), pictures
