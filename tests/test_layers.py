"""The import contract: the layers import downwards only.

Every ``import`` in the package's source (module level or inside a function, or a call of
``importlib.import_module`` / ``__import__`` naming its module, read with
``ast``, through setup.py's package-dir mapping: interactive/ is ``tapescope``, kernels/ is
``tapescope.kernels``, viz/ is ``tapescope.viz``) is checked against the layers, lowest first:
kernels < core < viz < the notebook layer (the rest of ``tapescope``). A module may import its
own layer and those below it; no backend (``kernels/cpu``, ``kernels/cuda``,
``kernels/metal``) imports another backend: what they share lives in ``kernels/`` and
``kernels/common/``. A test plants an upward import and a new
backend-to-backend import in a temporary tree and sees each one reported.

Presentation lives in ``viz/``: no string outside it (docstrings aside) writes an HTML
element; the notebook layer and core call viz for their HTML. A planted fragment is reported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE_DIRS = {"interactive": "tapescope", "kernels": "tapescope.kernels", "viz": "tapescope.viz"}
RANK = {"kernels": 0, "core": 1, "viz": 2, "notebook": 3}
BACKENDS = ("cpu", "cuda", "metal")


def _module(path: Path, root: Path) -> tuple:
    """(dotted module name, whether it is a package's __init__) of ``path`` under ``root``."""
    parts = path.relative_to(root).with_suffix("").parts
    names = [PACKAGE_DIRS[parts[0]]] + [p for p in parts[1:] if p != "__init__"]
    return ".".join(names), path.name == "__init__.py"


def layer(module: str) -> str:
    """The layer of a ``tapescope`` module: kernels, core, viz or notebook."""
    if module.startswith("tapescope.kernels"):
        return "kernels"
    if module.startswith("tapescope.core"):
        return "core"
    if module.startswith("tapescope.viz"):
        return "viz"
    return "notebook"


def backend_of(module: str):
    """``cpu`` / ``cuda`` / ``metal`` for a module of a backend's package, else None."""
    seg = module.split(".")
    return seg[2] if len(seg) > 2 and seg[:2] == ["tapescope", "kernels"] and seg[2] in BACKENDS else None


def imports(path: Path, root: Path) -> list:
    """(line, imported module) for every import of a tapescope module in ``path``; ``from m
    import name`` counts as importing ``m.name`` when that is a module (else ``m``)."""
    mod, is_init = _module(path, root)
    package = mod if is_init else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((node.lineno, sub if _is_module(sub, root) else target))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _dynamic_import(node.func)):
            out.append((node.lineno, node.args[0].value))  # import_module("tapescope.viz.x")
    return [(line, t) for line, t in out if t == "tapescope" or t.startswith("tapescope.")]


def _dynamic_import(func: ast.AST) -> bool:
    """Whether a call of ``func`` imports the module its first argument names
    (``importlib.import_module``, ``import_module``, ``__import__``)."""
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in ("import_module", "__import__")


def _is_module(name: str, root: Path) -> bool:
    for folder, pkg in PACKAGE_DIRS.items():
        if name == pkg or name.startswith(pkg + "."):
            rest = name[len(pkg):].lstrip(".").split(".") if name != pkg else []
            p = root / folder / Path(*rest) if rest else root / folder
            if p.with_suffix(".py").is_file() or (p / "__init__.py").is_file():
                return True
    return False


def violations(root: Path = ROOT) -> list:
    """Every import across the layers' order, as 'file:line importer -> imported (why)'."""
    found = []
    for folder in PACKAGE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            mod, _ = _module(path, root)
            for line, target in imports(path, root):
                a, b = layer(mod), layer(target)
                where = f"{path.relative_to(root)}:{line} {mod} -> {target}"
                if b == "notebook" and target == "tapescope" and a == "notebook":
                    continue
                if RANK[b] > RANK[a]:
                    found.append(f"{where} ({a} imports {b}, a layer above it)")
                ba, bb = backend_of(mod), backend_of(target)
                if ba and bb and ba != bb:
                    found.append(f"{where} (the {ba} backend imports the {bb} backend)")
    return found


def test_the_layers_import_downwards_only():
    assert violations() == []


def test_a_planted_upward_import_and_a_new_backend_crossing_are_reported(tmp_path):
    for folder in PACKAGE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            dest = tmp_path / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(path.read_text())
    assert violations(tmp_path) == []
    rules = tmp_path / "kernels" / "rules" / "elementwise.py"
    rules.write_text(rules.read_text() + "\n\ndef _planted():\n    from tapescope.viz import theme\n")
    core = tmp_path / "interactive" / "core" / "fast.py"
    core.write_text(core.read_text() + "\nfrom tapescope import magic\n")
    viz = tmp_path / "viz" / "theme.py"
    viz.write_text(viz.read_text() + "\nfrom .. import cell_recording\n")
    metal = tmp_path / "kernels" / "metal" / "kernels.py"
    metal.write_text(metal.read_text() + "\nfrom ..cuda import device\n")
    cuda = tmp_path / "kernels" / "cuda" / "casts.py"
    cuda.write_text(cuda.read_text() + (
        "\n\ndef _planted():\n    import importlib\n\n"
        "    return importlib.import_module(\"tapescope.kernels.cpu.gemm\")\n"))
    found = violations(tmp_path)
    assert len(found) == 5, found
    assert any("kernels.rules.elementwise -> tapescope.viz.theme (kernels imports viz" in f for f in found)
    assert any("core.fast -> tapescope.magic (core imports notebook" in f for f in found)
    assert any("viz.theme -> tapescope.cell_recording (viz imports notebook" in f for f in found)
    assert any("metal.kernels -> tapescope.kernels.cuda.device (the metal backend imports the cuda"
               in f for f in found)
    assert any("cuda.casts -> tapescope.kernels.cpu.gemm (the cuda backend imports the cpu"
               in f for f in found)


# an HTML element's opening or closing tag, as a fragment writes it ("<p>", "<td style=", "</div>")
_TAG = re.compile(r"</?(?:a|b|br|caption|code|details|div|h[1-6]|i|img|li|p|pre|script|small|span|"
                  r"style|summary|svg|table|tbody|td|th|thead|tr|ul)[\s>/]")


def html_outside_viz(root: Path = ROOT) -> list:
    """'file:line' for every string (or f-string part) outside ``viz/`` that writes an HTML
    tag, docstrings aside; the kernels layer's generated C is not scanned (``a<b`` is C)."""
    found = []
    for path in sorted((root / "interactive").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docs and _TAG.search(node.value)):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(set(found))


def test_html_is_written_in_viz_only():
    assert html_outside_viz() == []


def test_a_planted_html_fragment_outside_viz_is_reported(tmp_path):
    for path in (ROOT / "interactive").rglob("*.py"):
        dest = tmp_path / path.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(path.read_text())
    magic = tmp_path / "interactive" / "magic.py"
    magic.write_text(magic.read_text() + '\n\ndef _planted(msg):\n    return f"<p class=x>{msg}</p>"\n')
    core = tmp_path / "interactive" / "core" / "printing.py"
    core.write_text(core.read_text() + '\n_PLANTED = "<td>"\n')
    found = html_outside_viz(tmp_path)
    assert len(found) == 2, found
    assert any(f.startswith("interactive/magic.py:") for f in found)
    assert any(f.startswith("interactive/core/printing.py:") for f in found)
