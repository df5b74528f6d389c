"""Questions about a primitive are answered by its definition, not by its name as a string.

Read with ``ast`` over the package's source: a comparison of an expression with a string
literal that is a primitive's name (``==``, ``!=``, ``in``, ``not in``, against one literal or
a tuple / list / set / dict naming one), a ``match`` case on such a literal (alone, among
alternatives, in a class or mapping pattern), a lookup ``TABLE[x]`` / ``TABLE.get(x)`` /
``x in TABLE`` in a table of primitive names (a named table, the literal itself, or one the
definitions keep and this module imports), a hand list (a tuple / list / set / frozenset /
dict / ``dict(Exp=...)`` of two or more primitive names assigned to a name, at any level:
module, class or function), or a table keyed by a primitive's name among other entries
(``{**C_OPS, "Sigmoid": f}``), is reported across the whole package, outside the definitions
(``kernels/primitives.py``, ``kernels/rules/``) and the JAX table (``check/jax_rules.py``).
The autodiff and vmap rule modules may keep module-level tables of rules keyed by primitive
names, which they register onto the definitions as ``defvjp("Exp", rule)`` does (a rule
table): a lookup in one, a hand list inside a function, or any comparison there, is
reported all the same. None is left, and the tests plant each form in a temporary tree and
see each one reported.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

from tapescope.kernels import primitives

ROOT = Path(__file__).parent.parent
FOLDERS = ("interactive", "kernels", "viz")
EXEMPT = ("kernels/primitives.py", "kernels/rules/", "interactive/check/jax_rules.py")
RULE_TABLES = ("interactive/core/autodiff/", "interactive/core/vmap/")  # may keep rule tables

def _names() -> frozenset:
    import tapescope.core  # noqa: F401 (registers every definition)

    return frozenset(primitives.REGISTRY)


def _literals(node) -> list:
    """The string constants of a literal or of a tuple / list / set / frozenset(...) /
    dict(...) of them (None when ``node`` is anything else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "frozenset", "set", "tuple") and len(node.args) == 1:
        return _literals(node.args[0])
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict"
            and not node.args and node.keywords and all(k.arg for k in node.keywords)):
        return [k.arg for k in node.keywords]  # dict(Exp=..., Log=...)
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


def _is_dict(node) -> bool:
    return isinstance(node, (ast.Dict, ast.DictComp)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict")


def _hand_lists(tree: ast.Module, names: frozenset, module_only: bool) -> list:
    """(assignment, its target names, whether a dict) for every hand list of two or more
    primitive names ``tree`` binds (``module_only``: at module level only)."""
    nodes = tree.body if module_only else ast.walk(tree)
    out = []
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            lits = _literals(node.value)
            if lits and len(lits) >= 2 and all(s in names for s in lits):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out.append((node, [t.id for t in targets if isinstance(t, ast.Name)],
                            _is_dict(node.value)))
    return out


def defined_tables(root: Path, names: frozenset) -> dict:
    """name -> whether a dict, for the module-level hand lists of primitive names that the
    definitions, the JAX table and the rule tables keep: another module importing one asks
    it as it would ask its own."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(EXEMPT + RULE_TABLES):
                tree = ast.parse(path.read_text(), str(path))
                for _, targets, is_dict in _hand_lists(tree, names, True):
                    out.update((t, is_dict) for t in targets)
    return out


def _table_of(node, tables: dict):
    """The table name ``node`` reads (``TABLE`` or ``module.TABLE``), or None."""
    if isinstance(node, ast.Name) and node.id in tables:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr in tables and isinstance(node.value, ast.Name):
        return node.attr
    return None


def findings(path: Path, names: frozenset, rule_tables: bool = False,
             imported: Optional[dict] = None) -> list:
    """(line, what) for every question asked of a primitive's name string in ``path``
    (``rule_tables``: its module-level tables keyed by names are rule tables, not reported
    themselves; a lookup in one is). ``imported``: the tables of the exempt modules
    (``defined_tables``), asked here when this module imports one."""
    tree = ast.parse(path.read_text(), str(path))
    named = lambda lits: bool(lits) and any(s in names for s in lits)
    tables = {}  # name -> whether a dict: the hand lists this module binds or imports
    out = []
    registered = {id(n) for n, _, _ in _hand_lists(tree, names, True)} if rule_tables else set()
    # a rule module's module-level tables (keyed by names among other entries too) register
    rule_values = {id(n.value) for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                   and n.value is not None} if rule_tables else set()
    for node, targets, is_dict in _hand_lists(tree, names, False):
        if id(node) not in registered:
            out.append((node.lineno, "a hand list of primitive names"))
        tables.update((t, is_dict) for t in targets)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and imported:
            for a in node.names:
                if a.name in imported:
                    tables[a.asname or a.name] = imported[a.name]
    if imported:
        attrs = {k: v for k, v in imported.items() if k not in tables}
    else:
        attrs = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                left, right = sides[i], sides[i + 1]
                if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    if named(_literals(right)) or named(_literals(left)):
                        out.append((node.lineno, "a comparison with a primitive's name"))
                if isinstance(op, (ast.In, ast.NotIn)):
                    t = _table_of(right, tables) or (
                        _table_of(right, attrs) if isinstance(right, ast.Attribute) else None)
                    if t is not None:
                        out.append((node.lineno, f"a lookup by name in {t}"))
        elif (isinstance(node, ast.Dict) and id(node) not in rule_values and _literals(node) is None
              and any(isinstance(k, ast.Constant) and k.value in names for k in node.keys)):
            out.append((node.lineno, "a table keyed by a primitive's name"))
        elif isinstance(node, ast.match_case):
            for p in ast.walk(node.pattern):  # "A" | "B", Op(name="A"), {"A": x}
                values = [p.value] if isinstance(p, ast.MatchValue) else list(
                    p.keys) if isinstance(p, ast.MatchMapping) else []
                if any(named(_literals(v)) for v in values):
                    out.append((p.lineno, "a match case on a primitive's name"))
        elif isinstance(node, ast.Subscript) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"):
            of = node.value if isinstance(node, ast.Subscript) else node.func.value
            t = _table_of(of, tables) or (_table_of(of, attrs) if isinstance(of, ast.Attribute) else None)
            if t is not None and {**attrs, **tables}[t]:
                out.append((node.lineno, f"a lookup by name in {t}"))
            elif isinstance(of, ast.Dict) and named(_literals(of)):
                out.append((node.lineno, "a lookup by name in a dict literal"))
    return sorted(set(out))


def by_name(root: Path = ROOT) -> dict:
    """file (relative to ``root``) -> its findings, for every file outside the exemptions."""
    names = _names()
    imported = defined_tables(root, names)
    found = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(EXEMPT):
                continue
            f = findings(path, names, rel.startswith(RULE_TABLES), imported)
            if f:
                found[rel] = f
    return found


def _copy_tree(tmp_path: Path) -> None:
    """The package's source under ``tmp_path``, to plant questions in."""
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            dest = tmp_path / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(path.read_text())


def test_no_primitive_is_asked_by_its_name_string():
    assert by_name() == {}


def test_a_planted_comparison_hand_list_and_lookup_are_reported(tmp_path):
    _copy_tree(tmp_path)
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
    _copy_tree(tmp_path)
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


def test_every_form_of_the_question_is_reported(tmp_path):
    """The forms beyond a literal compared or a local table looked up: match cases of
    alternatives and class patterns, a tuple naming a primitive among other strings,
    ``dict(Exp=...)``, a rule table's own hand list asked with ``in``, a hand list inside a
    rule module's function, and a table the definitions keep, imported and asked."""
    _copy_tree(tmp_path)
    assert by_name(tmp_path) == {}
    rules = tmp_path / "kernels" / "rules" / "sort.py"  # the definitions: a table of theirs
    rules.write_text(rules.read_text() + '\n\nPLANTED_SORTS = ("Sort", "Partition")\n')
    viz = tmp_path / "viz" / "style.py"
    viz.write_text(viz.read_text() + (
        '\n\ndef _planted(prim, op):\n'
        '    from tapescope.kernels.rules.sort import PLANTED_SORTS as sorts\n'
        '    from tapescope.kernels.rules import sort\n\n'
        '    match prim.name:\n'
        '        case "Sum" | "Prod":\n'
        '            return 1\n'
        '    match op:\n'
        '        case Op(primitive="Exp"):\n'
        '            return 2\n'
        '    if prim.name in ("Exp", "not a primitive"):\n'
        '        return 3\n'
        '    table = dict(Exp=1, Log=2)\n'
        '    return prim.name in sorts, op in sort.PLANTED_SORTS, table[op]\n'))
    vmap = tmp_path / "interactive" / "core" / "vmap" / "engine.py"
    vmap.write_text(vmap.read_text() + (
        '\n\n_PLANTED_LINEAR = ("Add", "Subtract")\n\n\n'
        'def _planted(prim):\n'
        '    local = ("Exp", "Log")\n'
        '    return prim.name in _PLANTED_LINEAR, local\n'))
    found = by_name(tmp_path)
    assert set(found) == {"viz/style.py", "interactive/core/vmap/engine.py"}, found
    whats = sorted(w for _, w in found["viz/style.py"])
    assert whats == sorted([
        "a match case on a primitive's name", "a match case on a primitive's name",
        "a comparison with a primitive's name", "a lookup by name in sorts",
        "a lookup by name in PLANTED_SORTS", "a hand list of primitive names",
        "a lookup by name in table"]), whats
    assert sorted(w for _, w in found["interactive/core/vmap/engine.py"]) == [
        "a hand list of primitive names", "a lookup by name in _PLANTED_LINEAR"]
