"""HACKING.md's map names files that exist.

The map (the first fenced block) is read as a tree: an entry's first column (``name.py``,
``a.py, b.py``, ``dir/``) sits at two spaces a level under its folder, and every file name in
the entry's description is found under that entry's folder, its top folder or the
repository's root (or, with a ``/`` in it, as the end of a path in the repository); file paths
in backquotes in the rest of the page name files of the repository. A planted name that does
not exist is reported.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
FILE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|c|h|md|ipynb))\b")
SKIP = ("shared/",)  # outside this repository


def _files(root: Path) -> list:
    return [p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts]


def missing(text: str, root: Path = ROOT) -> list:
    """Every file the page names that is not in ``root``, as 'line N: name'."""
    files = _files(root)
    lines = text.split("\n")
    fences = [i for i, l in enumerate(lines) if l.startswith("```")]
    start, end = fences[0], fences[1]
    out = []
    stack = []  # (indent, folder)
    folder = ""

    def exists(name: str, here: str) -> bool:
        if name.startswith(SKIP):
            return True
        if "/" in name:
            return any(f == name or f.endswith("/" + name) for f in files)
        return any(f.startswith(here) and f.rsplit("/", 1)[-1] == name for f in files)

    for n in range(start + 1, end):
        line = lines[n]
        m = re.match(r"( *)([\w.-]+(?:/[\w.-]+)*/?(?:, [\w.-]+(?:/[\w.-]+)*/?)*)(?= |$)", line)
        indent = len(m.group(1)) if m else 99
        if m and indent < 26 and indent % 2 == 0:
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            names = [s.strip() for s in m.group(2).split(",")]
            for name in names:
                if name.endswith("/"):
                    folder = parent + name
                    stack.append((indent, folder))
                    if not any(f.startswith(folder) for f in files):
                        out.append(f"line {n + 1}: {folder}")
                elif not exists(parent + name, parent) and not exists(name, parent):
                    out.append(f"line {n + 1}: {parent + name}")
            here = folder if names[-1].endswith("/") else parent
            desc = line[len(m.group(0)):]
        else:
            here = stack[-1][1] if stack else ""
            desc = line
        for name in FILE.findall(desc):
            top = here.split("/")[0] + "/" if here else ""
            if not (exists(name, here) or exists(name, top) or (root / name).is_file()):
                out.append(f"line {n + 1}: {name}")
    for n, line in enumerate(lines):
        if start <= n <= end:
            continue
        for quoted in re.findall(r"`([^`]+)`", line):
            if "/" in quoted and FILE.fullmatch(quoted) and not exists(quoted, ""):
                out.append(f"line {n + 1}: {quoted}")
    return out


def test_every_file_the_map_names_exists():
    assert missing((ROOT / "HACKING.md").read_text()) == []


def test_a_planted_missing_file_is_reported():
    text = (ROOT / "HACKING.md").read_text()
    planted = text.replace("  buffer_cache.py ", "  no_such_cache.py ", 1).replace(
        "`tests/test_layers.py`", "`tests/test_no_such_file.py`", 1)
    assert planted != text
    found = missing(planted)
    assert any("kernels/no_such_cache.py" in f for f in found), found
    assert any("tests/test_no_such_file.py" in f for f in found), found
    assert len(found) == 2, found
