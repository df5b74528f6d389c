"""mx.export_to_dot against MLX's own export of the same graphs (ids normalised), and its errors."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from conftest import mlx_ref, requires_mlx

_NUM = re.compile(r"(?<![\w\"])(\d+)(?![\w\"])")


def normalise(text: str) -> str:
    """Primitive ids (MLX prints addresses) renumbered 1, 2, ... in order of appearance."""
    seen: dict = {}

    def sub(m):
        return str(seen.setdefault(m.group(1), len(seen) + 1))

    return "\n".join(_NUM.sub(sub, line) for line in text.split("\n"))


def export(lib, *outs, **names) -> str:
    f = io.StringIO()
    lib.export_to_dot(f, *outs, **names)
    return f.getvalue()


def build(lib, recipe: str, xa: np.ndarray, ya: np.ndarray) -> tuple:
    """The same computation in tapescope or MLX; returns (outputs, named arrays)."""
    x, y = lib.array(xa), lib.array(ya)
    if recipe == "chain":
        return (lib.exp(x) * 2 + 1,), {}
    if recipe == "broadcast":
        return (x + y,), {}
    if recipe == "reduce":
        c = lib.exp(x) + y
        return (c, lib.sum(c)), {}
    if recipe == "divmod":
        q, r = lib.divmod(x, y)
        return (r + 1,), {}
    if recipe == "named":
        c = lib.exp(x) + y
        return (c, lib.sum(c)), {"x": x, "y": y, "cc": c}
    if recipe == "shared":
        c = lib.sin(x)
        return (c * 2, c + y, lib.maximum(c, y)), {}
    if recipe == "evaluated":
        return (x, y), {}
    if recipe == "named_outputs":  # arrays given by name only are exported too
        c = lib.exp(x) * y
        return (), {"x": x, "d1": c + 1, "d2": lib.sum(c)}
    if recipe == "named_and_positional":
        c = lib.exp(x) * y
        return (c - 1,), {"y": y, "d": lib.sum(c, axis=0)}
    raise AssertionError(recipe)


RECIPES = ["chain", "broadcast", "reduce", "divmod", "named", "shared", "evaluated",
           "named_outputs", "named_and_positional"]


@requires_mlx
@pytest.mark.parametrize("recipe", RECIPES)
def test_export_matches_mlx_structure(mlx, recipe):
    xa = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    ya = np.array([3.0, 1.0, 2.0], dtype=np.float32)
    outs, names = build(mx, recipe, xa, ya)
    mine = export(mx, *outs, **names)
    routs, rnames = build(mlx, recipe, xa, ya)
    theirs = export(mlx, *routs, **rnames)
    assert normalise(mine) == normalise(theirs)


@requires_mlx
@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.sampled_from(["exp", "neg", "add", "mul", "sum", "sq"]), min_size=1, max_size=6),
       bshape=st.sampled_from([(3,), (1, 3), (2, 1), ()]))
def test_export_random_chains_match_mlx(ops, bshape):
    mlx = mlx_ref
    xa = np.linspace(0.1, 0.9, 6, dtype=np.float32).reshape(2, 3)
    ba = np.full(bshape, 0.5, dtype=np.float32)

    def run(lib):
        x, b = lib.array(xa), lib.array(ba)
        outs = []
        for op in ops:
            if op == "exp":
                x = lib.exp(x)
            elif op == "neg":
                x = lib.negative(x)
            elif op == "add":
                x = x + b
            elif op == "mul":
                x = lib.multiply(x, b)
            elif op == "sq":
                x = lib.square(x)
            else:
                outs.append(lib.sum(x, axis=0))
        return export(lib, x, *outs)

    assert normalise(run(mx)) == normalise(run(mlx))


def test_export_format_by_hand():
    a = mx.array([1.0, 2.0])
    b = mx.array([3.0, 1.0])
    c = mx.exp(a) + b
    assert export(mx, c) == (
        'digraph {\n{ rank=source; "A"; }\n{ 1 [label ="Exp", shape=rectangle]; }\n"A" -> 1\n'
        '{ "B"; }\n1 -> "B"\n{ rank=source; "C"; }\n{ 2 [label ="Add", shape=rectangle]; }\n'
        '"B" -> 2\n"C" -> 2\n{ rank=sink; "D"; }\n2 -> "D"\n}')


def test_export_writes_path_and_file_object_once(tmp_path):
    a = mx.array([1.0])
    c = mx.exp(a)
    p = tmp_path / "g.dot"
    mx.export_to_dot(str(p), c)
    calls = []

    class W:
        def write(self, s):
            calls.append(s)

    mx.export_to_dot(W(), c)
    assert len(calls) == 1
    assert p.read_text() == calls[0]
    assert calls[0].startswith("digraph {\n") and calls[0].endswith("\n}")


def test_export_is_deterministic():
    a = mx.array([1.0, 2.0])
    c = mx.exp(a) * 3
    first = export(mx, c)
    _ = [mx.exp(a) for _ in range(5)]  # other graphs in between change no id
    assert export(mx, c) == first


def test_export_empty_and_nested_outputs():
    a = mx.array([1.0])
    assert export(mx) == "digraph {\n}"
    assert export(mx, [a], {"k": a}) == 'digraph {\n{ rank=source; "A"; }\n}'


def test_export_compiled_label_lists_its_tape():
    fn = mx.compile(lambda x: mx.exp(x) * 2 + 1)
    out = export(mx, fn(mx.array([1.0, 2.0])))
    labels = re.findall(r'label ="(\w+)"', out)
    assert labels == ["CompiledExpBroadcastMultiplyBroadcastAdd"]


@requires_mlx
def test_export_compiled_label_matches_mlx(mlx):
    def f(lib):
        return lambda x: lib.exp(x) * 2 + 1

    xa = np.array([1.0, 2.0], dtype=np.float32)
    mine = re.findall(r'label ="(\w+)"', export(mx, mx.compile(f(mx))(mx.array(xa))))
    theirs = re.findall(r'label ="(\w+)"', export(mlx, mlx.compile(f(mlx))(mlx.array(xa))))
    assert mine == theirs


@requires_mlx
def test_a_broadcast_needed_outside_a_kernel_is_also_fused_into_it_as_mlx(mlx):
    """MLX splits a Broadcast another op needs too: the kernel computes its own copy."""
    def run(lib):
        def fun(x, y, z):
            yy = lib.broadcast_to(y, z.shape)
            return x + yy * z, yy.sum(), lib.exp(yy) - z

        a, b, c = lib.array(np.arange(6.0).reshape(2, 3)), lib.array(0.5), lib.ones((2, 3))
        d = lib.compile(fun)(a, b, c)
        text = export(lib, a=a, b=b, c=c, d1=d[0], d2=d[1], d3=d[2])
        return normalise(text), [np.array(o) for o in d]

    (mine, got), (theirs, want) = run(mx), run(mlx)
    assert "CompiledBroadcastMultiplyAdd" in mine
    assert mine == theirs
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def _error(lib, *args, **kw):
    try:
        lib.export_to_dot(*args, **kw)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None


ERROR_CASES = [
    ("non-array output", lambda lib, a: ((io.StringIO(), 3), {})),
    ("non-array before bad file", lambda lib, a: ((3, 4), {})),
    ("non-array kwarg", lambda lib, a: ((io.StringIO(), a), {"x": 3})),
    ("list kwarg", lambda lib, a: ((io.StringIO(), a), {"x": [a]})),
    ("list kwarg before bad file", lambda lib, a: ((3, a), {"x": [a]})),
    ("bad file", lambda lib, a: ((3, a), {})),
    ("None output", lambda lib, a: ((io.StringIO(), a, None), {})),
]


@requires_mlx
@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_export_errors_match_mlx(mlx, case):
    _, make = case
    mine_args, mine_kw = make(mx, mx.array([1.0]) + 1)
    theirs_args, theirs_kw = make(mlx, mlx.array([1.0]) + 1)
    mine = _error(mx, *mine_args, **mine_kw)
    theirs = _error(mlx, *theirs_args, **theirs_kw)
    assert mine is not None and mine == theirs


def test_export_errors_without_mlx():
    a = mx.array([1.0])
    with pytest.raises(ValueError, match=r"\[tree_flatten\] The argument should contain only arrays"):
        mx.export_to_dot(io.StringIO(), a, "x")
    with pytest.raises(RuntimeError, match="std::bad_cast"):
        mx.export_to_dot(io.StringIO(), a, x={"y": a})
    with pytest.raises(ValueError, match=r"\[export_to_dot\] Accepts file-like objects"):
        mx.export_to_dot(1.5, a)
    buf = io.StringIO()
    with pytest.raises(ValueError):
        mx.export_to_dot(buf, a, 1)
    assert buf.getvalue() == ""  # nothing written before the error
