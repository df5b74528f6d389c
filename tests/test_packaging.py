"""Packaging: every source folder is installed, no bare top-level names, the demo command runs."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"interactive": "tapescope", "kernels": "tapescope.kernels", "viz": "tapescope.viz"}


def _setup_packages() -> set[str]:
    """The package list setup.py hands to setuptools (computed without running setup())."""
    src = (ROOT / "setup.py").read_text()
    ns: dict = {"__name__": "not_main"}
    exec(compile(src.split("\nsetup(")[0], "setup.py", "exec"), ns)
    return set(ns["_packages"]())


def test_every_python_folder_is_a_listed_package():
    listed = _setup_packages()
    for folder, name in FOLDERS.items():
        for d, dirs, files in os.walk(ROOT / folder):
            dirs[:] = [x for x in dirs if x != "__pycache__" and not x.startswith(".")]
            if any(f.endswith(".py") for f in files):
                rel = Path(d).relative_to(ROOT / folder)
                pkg = ".".join([name, *rel.parts]) if rel.parts else name
                assert pkg in listed, f"{d} holds Python files but {pkg} is not installed"


def test_no_bare_top_level_names(tmp_path):
    """The install maps only ``tapescope`` onto the checkout: none of its folders is importable
    under its own name (another distribution's ``kernels``, e.g. transformers' dependency,
    is not this project's)."""
    code = ("import importlib.util as u, os, sys, tapescope.core, tapescope.kernels, tapescope.viz; "
            "root = os.path.realpath(%r); "
            "env = os.path.realpath(sys.prefix); "
            "mine = lambda p: p.startswith(root) and not p.startswith(env); "
            "ours = lambda s: any(mine(os.path.realpath(p)) for p in "
            "(s.submodule_search_locations or [s.origin or ''])); "
            "print([n for n in ('kernels', 'viz', 'interactive', 'core') "
            "if (s := u.find_spec(n)) and ours(s)])" % str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_kernels_import_nothing_from_core():
    for path in (ROOT / "kernels").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert not n.startswith(("tapescope.core", "tapescope.viz", "interactive")), (path, n)


def test_demo_command_is_there():
    """`make demo` runs `python -m tapescope.demo` (tests/test_notebooks.py executes the tour and
    writes its page with the same functions; running it again here would cost ~20 s)."""
    out = subprocess.run([sys.executable, "-m", "tapescope.demo", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "build/tour.html" in out.stdout
    from tapescope import demo

    assert demo.TOUR.is_file() and demo.TOUR.name == "00_tour.ipynb"


def test_ci_script_runs_make_test():
    script = (ROOT / ".ci" / "run")
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text and "make test" in text
