"""Questions about a primitive are answered by its definition, not by its name as a string.

Read with ``ast`` over the package's source: a comparison of an expression with a string
literal that is a primitive's name (``==``, ``!=``, ``in``, ``not in``, against one literal or
a tuple / list / set / dict of them), a ``match`` case on such a literal, a lookup
``TABLE[x]`` / ``TABLE.get(x)`` in a dict keyed by primitive names (a named table or the
literal itself), a hand list (a tuple / list / set / frozenset / dict of two or more
primitive names assigned to a name, at any level: module, class or function), or a table
keyed by a primitive's name among other entries (``{**C_OPS, "Sigmoid": f}``), is reported
across the whole package, outside the definitions (``kernels/primitives.py``,
``kernels/rules/``) and the JAX table (``check/jax_rules.py``). The autodiff and vmap rule
modules may keep a table of rules keyed by primitive names, which they register onto the
definitions as ``defvjp("Exp", rule)`` does (a rule table): a lookup in one, or any
comparison there, is reported all the same. None is left, and a test plants a comparison, a
hand list and a lookup in a temporary tree (and a lookup in a rule table, a comparison in
codegen) and sees each one reported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tapescope.kernels import primitives

ROOT = Path(__file__).parent.parent
FOLDERS = ("interactive", "kernels", "viz")
EXEMPT = ("kernels/primitives.py", "kernels/rules/", "interactive/check/jax_rules.py")
RULE_TABLES = ("interactive/core/autodiff/", "interactive/core/vmap/")  # may keep rule tables

def _names() -> frozenset:
    import tapescope.core  # noqa: F401 (registers every definition)

    return frozenset(primitives.REGISTRY)


def _literals(node) -> list:
    """The string constants of a literal or of a tuple / list / set / frozenset(...) of them
    (None when ``node`` is anything else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "frozenset", "set", "tuple") and len(node.args) == 1:
        return _literals(node.args[0])
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        out = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return out if len(out) == len(node.elts) else None
    if isinstance(node, ast.Dict) and node.keys:  # its keys (``**other`` entries: other's keys)
        keys = []
        for k, v in zip(node.keys, node.values):
            more = _literals(v) if k is None else [k.value] if (
                isinstance(k, ast.Constant) and isinstance(k.value, str)) else None
            if more is None:
                return None
            keys += more
        return keys or None
    if isinstance(node, ast.DictComp) and isinstance(node.generators[0].iter, ast.Tuple) and len(
            node.generators) == 1:  # {n: f for n in ("A", "B")}: keyed by the tuple's names
        return _literals(node.generators[0].iter)
    return None


def findings(path: Path, names: frozenset, rule_tables: bool = False) -> list:
    """(line, what) for every question asked of a primitive's name string in ``path``
    (``rule_tables``: its module-level tables keyed by names are rule tables, not reported
    themselves; a lookup in one is)."""
    tree = ast.parse(path.read_text(), str(path))
    named = lambda lits: lits is not None and lits and all(s in names for s in lits)
    tables = set()  # names assigned dicts keyed by primitive names
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            lits = _literals(node.value)
            if named(lits) and len(lits) >= 2:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if not rule_tables:
                    out.append((node.lineno, "a hand list of primitive names"))
                if isinstance(node.value, ast.Dict):
                    tables.update(t.id for t in targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    left = sides[sides.index(right) - 1]
                    if named(_literals(right)) or named(_literals(left)):
                        out.append((node.lineno, "a comparison with a primitive's name"))
        elif (isinstance(node, ast.Dict) and not rule_tables and _literals(node) is None
              and any(isinstance(k, ast.Constant) and k.value in names for k in node.keys)):
            out.append((node.lineno, "a table keyed by a primitive's name"))
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            if named(_literals(node.pattern.value)):
                out.append((node.pattern.lineno, "a match case on a primitive's name"))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in tables:
            out.append((node.lineno, f"a lookup by name in {node.value.id}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Name) and node.func.value.id in tables):
            out.append((node.lineno, f"a lookup by name in {node.func.value.id}"))
        elif ((isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict)
               and named(_literals(node.value))) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and isinstance(node.func.value, ast.Dict)
                and named(_literals(node.func.value)))):
            out.append((node.lineno, "a lookup by name in a dict literal"))
    return sorted(set(out))


def by_name(root: Path = ROOT) -> dict:
    """file (relative to ``root``) -> its findings, for every file outside the exemptions."""
    names = _names()
    found = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(EXEMPT):
                continue
            f = findings(path, names, rel.startswith(RULE_TABLES))
            if f:
                found[rel] = f
    return found


def test_no_primitive_is_asked_by_its_name_string():
    assert by_name() == {}


def test_a_planted_comparison_hand_list_and_lookup_are_reported(tmp_path):
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            dest = tmp_path / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(path.read_text())
    before = {rel: len(f) for rel, f in by_name(tmp_path).items()}
    target = tmp_path / "viz" / "theme.py"
    target.write_text(target.read_text() + (
        '\n\n_PLANTED = {"Tan": 1, "LogicalNot": 2}\n'
        '_SPREAD = {"Copy": 0, **{n: 1 for n in ("Sum", "Prod")}}\n\n\n'
        'def _planted(prim, name):\n'
        '    if prim.name == "Add" or name not in ("Exp", "Log"):\n'
        '        return _PLANTED.get(prim.name) or _SPREAD[name]\n'
        '    match name:\n'
        '        case "Sum":\n'
        '            return 1\n'
        '    return _PLANTED[name]\n\n\n'
        '_MIXED = {**_SPREAD, "Sigmoid": 1}\n'))
    found = by_name(tmp_path)
    got = found.get("viz/theme.py", [])
    assert len(got) == before.get("viz/theme.py", 0) + 8, got
    whats = [w for _, w in got]
    assert whats.count("a hand list of primitive names") == 2  # _PLANTED and _SPREAD
    assert "a lookup by name in _SPREAD" in whats
    assert whats.count("a comparison with a primitive's name") >= 1
    assert "a match case on a primitive's name" in whats
    assert "a lookup by name in _PLANTED" in whats
    assert "a table keyed by a primitive's name" in whats  # _MIXED
    assert {rel: len(f) for rel, f in found.items() if rel != "viz/theme.py"} == {
        rel: n for rel, n in before.items() if rel != "viz/theme.py"}


def test_codegen_and_the_rule_tables_are_covered(tmp_path):
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            dest = tmp_path / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(path.read_text())
    assert by_name(tmp_path) == {}
    codegen = tmp_path / "kernels" / "codegen" / "lower.py"
    codegen.write_text(codegen.read_text() + '\n\ndef _planted(op):\n    return op.primitive in {"Sum": 0}\n')
    rules = tmp_path / "interactive" / "core" / "autodiff" / "elementwise.py"
    rules.write_text(rules.read_text() + '\n\ndef _planted(name):\n    return U.get(name)\n')
    vmap = tmp_path / "interactive" / "core" / "vmap" / "engine.py"
    vmap.write_text(vmap.read_text() + '\n\ndef _planted(prim):\n    return prim.name != "Copy"\n')
    viz = tmp_path / "viz" / "records.py"
    viz.write_text(viz.read_text() + (
        '\n\ndef _planted(name):\n    fold = {"Sum": 1, "Prod": 2}[name]\n'
        '    local = ("Exp", "Log")\n    return fold, {"Max": 3}.get(name), local\n'))
    found = by_name(tmp_path)
    assert found == {
        "kernels/codegen/lower.py": [(found["kernels/codegen/lower.py"][0][0],
                                      "a comparison with a primitive's name")],
        "interactive/core/autodiff/elementwise.py": [(found["interactive/core/autodiff/elementwise.py"][0][0],
                                                      "a lookup by name in U")],
        "interactive/core/vmap/engine.py": [(found["interactive/core/vmap/engine.py"][0][0],
                                             "a comparison with a primitive's name")],
        "viz/records.py": found.get("viz/records.py"),
    }, found
    whats = sorted(w for _, w in found["viz/records.py"])
    assert whats == ["a hand list of primitive names", "a lookup by name in a dict literal",
                     "a lookup by name in a dict literal"], whats
