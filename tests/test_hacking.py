"""HACKING.md's map names files that exist.

The map (the first fenced block) is read as a tree: an entry's first column (``name.py``,
``a.py, b.py``, ``dir/``) sits at two spaces a level under its folder, and every file name in
the entry's description is found under that entry's folder, its top folder or the
repository's root (or, with a ``/`` in it, as the end of a path in the repository); file paths
in backquotes in the rest of the page name files of the repository. The add-an-op recipe
(its section) names what exists: its ``<family>`` folders hold family modules (the rules,
the autodiff and vmap rules, the ops), every keyword it gives a definition (``monoid=``) is
one ``define`` takes, and every function it calls (``defvjp(...)``, ``defvmap(...)``) is
defined in a module the section names. The other way round, every module of the package
(outside the folders of one module per op family) is named in the map, so a new module
comes with its line. Planted names that do not exist, and a planted module the map does
not name, are reported.
"""

from __future__ import annotations

import importlib
import inspect
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


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _module(path: str) -> str:
    """The dotted module of a repository file (setup.py's package-dir mapping)."""
    top, _, rest = path.partition("/")
    package = {"interactive": "tapescope", "kernels": "tapescope.kernels", "viz": "tapescope.viz"}[top]
    return ".".join([package, *rest[:-3].split("/")]).removesuffix(".__init__")


def recipe_gaps(text: str, root: Path = ROOT) -> list:
    """What the add-an-op recipe names that does not exist."""
    from tapescope.kernels import primitives

    sec = re.sub(r"```.*?```", "", _section(text, "Adding an op"), flags=re.S)  # its code blocks
    files = _files(root)
    out, modules = [], []
    for quoted in re.findall(r"`([^`]+)`", sec):
        if "<family>" in quoted:
            folder = quoted.split("<family>")[0]
            kinds = [f for f in files if f.startswith(folder) and f.count("/") == folder.count("/")
                     and f.endswith(".py") and not f.endswith(("__init__.py", "registry.py"))]
            if not kinds:
                out.append(f"{quoted}: no family modules in {folder}")
        elif FILE.fullmatch(quoted) and quoted.endswith(".py"):
            full = [f for f in files if f == quoted or f.endswith("/" + quoted)]
            if not full:
                out.append(f"{quoted}: no such file")
            modules += [_module(f) for f in full if f.startswith(("interactive/", "kernels/"))]
    takes = set(inspect.signature(primitives.define).parameters)
    takes |= set(inspect.signature(primitives.PrimitiveDef.__init__).parameters)
    for kw in re.findall(r"`(\w+)=", sec):
        if kw not in takes:
            out.append(f"{kw}=: not a keyword of define")
    mods = [importlib.import_module(m) for m in modules]
    for fn in set(re.findall(r"`(?:\w+\.)?(\w+)\(", sec)) - {"fn"}:  # fn(...): a placeholder
        if not any(callable(getattr(m, fn, None)) for m in mods):
            out.append(f"{fn}(): defined in none of the modules the recipe names")
    return out


def test_the_add_an_op_recipe_names_what_exists():
    assert recipe_gaps((ROOT / "HACKING.md").read_text()) == []


def test_a_planted_recipe_step_that_does_not_exist_is_reported():
    text = (ROOT / "HACKING.md").read_text()
    planted = text.replace("`defvmap(\"Exp\", rule)`", "`defbatch(\"Exp\", rule)`", 1).replace(
        "`interactive/core/vmap/<family>.py`", "`interactive/core/batching/<family>.py`", 1).replace(
        "`monoid=`", "`fold=`", 1)
    assert planted != text
    found = recipe_gaps(planted)
    assert any(f.startswith("defbatch()") for f in found), found
    assert any("interactive/core/batching/" in f for f in found), found
    assert any(f.startswith("fold=") for f in found), found
    assert len(found) == 3, found


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


# one module per op family: the map names the folder and its convention, not each module
FAMILY_FOLDERS = ("interactive/core/ops/", "interactive/core/autodiff/", "interactive/core/vmap/",
                  "kernels/rules/")


def unnamed(text: str, files: list) -> list:
    """The package's modules (Python, C) outside the family folders that the map does not
    name."""
    lines = text.split("\n")
    fences = [i for i, l in enumerate(lines) if l.startswith("```")]
    layout = "\n".join(lines[fences[0] + 1:fences[1]])
    out = []
    for f in files:
        name = f.rsplit("/", 1)[-1]
        if (not f.startswith(("interactive/", "kernels/", "viz/")) or f.startswith(FAMILY_FOLDERS)
                or name == "__init__.py" or not name.endswith((".py", ".c", ".h"))):
            continue
        if not re.search(rf"(?<![\w.-]){re.escape(name)}\b", layout):
            out.append(f)
    return sorted(out)


def test_the_map_names_every_module():
    assert unnamed((ROOT / "HACKING.md").read_text(), _files(ROOT)) == []


def test_a_planted_module_the_map_does_not_name_is_reported():
    files = _files(ROOT) + ["kernels/planted_module.py", "kernels/rules/planted_family.py"]
    assert unnamed((ROOT / "HACKING.md").read_text(), files) == ["kernels/planted_module.py"]
