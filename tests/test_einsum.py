"""einsum / einsum_path: random expressions against numpy.einsum (values, shapes) and MLX
(dtypes, paths, primitives, every error)."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from mlx_compare import primitive_names
from tapescope.core.array import array as _array

from conftest import mlx_ref, requires_mlx

SETTINGS = settings(max_examples=100, deadline=None)
LETTERS = "abcdef"


@st.composite
def expressions(draw, max_ops: int = 3, ellipsis: bool = True, pool: str = LETTERS[:4]):
    """A random einsum: subscripts, operand shapes and the full (broadcast) label sizes.

    Operands share, contract and repeat letters; an axis may be 1 where others are not
    (broadcasting); with ``...`` each operand gets a suffix of one batch shape, some of its
    dims 1."""
    n = draw(st.integers(1, max_ops))
    dims = {c: draw(st.integers(2, 3)) for c in pool}
    use_ell = ellipsis and draw(st.booleans())
    batch = draw(st.lists(st.integers(1, 3), max_size=2)) if use_ell else []
    subs, shapes = [], []
    for _ in range(n):
        letters = draw(st.lists(st.sampled_from(pool), max_size=4))
        ones = {c: draw(st.integers(0, 4)) == 0 for c in letters}  # broadcast this label
        shape = [1 if ones[c] else dims[c] for c in letters]
        sub = "".join(letters)
        if use_ell and draw(st.booleans()):
            k = draw(st.integers(0, len(batch)))
            b = [1 if draw(st.integers(0, 3)) == 0 else d for d in batch[len(batch) - k:]]
            at = draw(st.integers(0, len(letters)))
            sub = sub[:at] + "..." + sub[at:]
            shape = shape[:at] + b + shape[at:]
        subs.append(sub)
        shapes.append(tuple(shape))
    expr = ",".join(subs)
    if draw(st.booleans()):
        used = sorted(set("".join(subs)) - {"."})
        out = draw(st.permutations(used))[:draw(st.integers(0, len(used)))]
        out = "".join(out)
        if "..." in expr:
            at = draw(st.integers(0, len(out)))
            out = out[:at] + "..." + out[at:]
        expr += "->" + out
    return expr, shapes, dims


def _numpy_einsum(expr: str, xs: list) -> np.ndarray:
    """numpy's einsum after broadcasting every size-1 label axis to the label's largest
    size among the operands (numpy takes a repeated label at one size only)."""
    ins = expr.replace(" ", "").split("->")[0].split(",")
    parts = [(s.split("...")[0], s.split("...")[1] if "..." in s else "") for s in ins]
    sizes: dict = {}
    for x, (pre, post) in zip(xs, parts):
        for c, d in zip(pre + post, x.shape[:len(pre)] + x.shape[x.ndim - len(post):]):
            sizes[c] = max(sizes.get(c, 1), d)
    full = []
    for x, (pre, post) in zip(xs, parts):
        nb = x.ndim - len(pre) - len(post)
        shape = ([sizes[c] for c in pre] + list(x.shape[len(pre):len(pre) + nb])
                 + [sizes[c] for c in post])
        full.append(np.broadcast_to(x, shape))
    return np.einsum(expr, *full)


def _operands(shapes, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return [rng.integers(0, 2, s).astype(np.bool_) for s in shapes]
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(0, 4, s).astype(dtype) for s in shapes]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the exception itself is what is compared
        return ("err", type(e), str(e))


def _mlx_dtype(d) -> str:
    return str(d)


# --------------------------------------------------------------------------- values

@SETTINGS
@given(expressions(), st.integers(0, 2**16))
def test_random_expressions_match_numpy_einsum(case, seed):
    expr, shapes, _ = case
    xs = _operands(shapes, seed)
    want = _numpy_einsum(expr, xs)
    got = mx.einsum(expr, *[mx.array(x) for x in xs])
    assert got.shape == want.shape
    assert got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(expressions(max_ops=4, ellipsis=False), st.integers(0, 2**16))
def test_four_operand_greedy_contractions_match_numpy(case, seed):
    expr, shapes, _ = case
    xs = _operands(shapes, seed)
    want = _numpy_einsum(expr, xs)
    got = mx.einsum(expr, *[mx.array(x) for x in xs])
    assert got.shape == want.shape
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-4)


@requires_mlx
@settings(max_examples=50, deadline=None)
@given(expressions(max_ops=3), st.sampled_from([np.float32, np.float16, np.int32, np.int8,
                                                  np.uint8, np.bool_]),
       st.sampled_from([np.float32, np.float16, np.int32, np.bool_]), st.integers(0, 2**16))
def test_dtypes_and_integer_contraction_errors_match_mlx(case, d0, d1, seed):
    expr, shapes, _ = case
    xs = _operands(shapes, seed, d0)
    if len(xs) > 1:  # a second dtype for the later operands: promotion across steps
        xs[1:] = _operands(shapes[1:], seed + 1, d1)
    got = _outcome(lambda: mx.einsum(expr, *[mx.array(x) for x in xs]))
    want = _outcome(lambda: mlx_ref.einsum(expr, *[mlx_ref.array(x) for x in xs]))
    assert got[0] == want[0], (got, want)
    if got[0] == "err":
        assert got[1:] == want[1:]
        return
    g, w = got[1], want[1]
    assert g.shape == w.shape and str(g.dtype) == _mlx_dtype(w.dtype)
    tol = 2e-2 if np.float16 in (d0, d1) else 1e-4
    np.testing.assert_allclose(np.array(g).astype(np.float64), np.array(w).astype(np.float64),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("expr, shapes", [
    ("ii->i", [(4, 4)]), ("ii", [(3, 3)]), ("ijij->ij", [(2, 3, 2, 3)]),
    ("iijj->ij", [(2, 2, 3, 3)]), ("iij,jk", [(3, 3, 4), (4, 5)]), ("i,i", [(3,), (3,)]),
    (",i->i", [(), (3,)]), ("ij->", [(2, 3)]), ("Ab,bC->CA", [(2, 3), (3, 4)]),
    (" i j , j k -> k i ", [(2, 3), (3, 4)]), ("...,...", [(2, 3), (3,)]),
    ("i...->...", [(2, 3, 4)]), ("ij,jk,kl,lm->mi", [(2, 3), (3, 4), (4, 5), (5, 2)]),
    ("i,j,k->kji", [(2,), (3,), (4,)]),
])
def test_named_expressions_match_numpy(expr, shapes):
    xs = _operands(shapes, 7)
    want = _numpy_einsum(expr.replace(" ", ""), xs)
    got = mx.einsum(expr, *[mx.array(x) for x in xs])
    assert got.shape == want.shape
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


def test_stream_keyword_and_laziness():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = mx.einsum("ij,kj->ik", mx.array(x), mx.array(x), stream=mx.cpu)
    assert out._d.node is not None  # recorded, not computed
    np.testing.assert_allclose(np.array(out), x @ x.T)


# --------------------------------------------------------------------------- paths

@requires_mlx
@settings(max_examples=100, deadline=None)
@given(expressions(max_ops=5), st.integers(0, 2**16))
def test_einsum_path_matches_mlx(case, seed):
    expr, shapes, _ = case
    xs = _operands(shapes, seed)
    got = mx.einsum_path(expr, *[mx.array(x) for x in xs])
    want = mlx_ref.einsum_path(expr, *[mlx_ref.array(x) for x in xs])
    assert got == want


@requires_mlx
@pytest.mark.parametrize("expr, shapes", [
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("i,j,k,l", [(2,), (3,), (4,), (5,)]),
    ("ab,cd,bc,da->", [(9, 2), (3, 8), (2, 3), (8, 9)]),
    ("abc,bcd,cde,def,efa->", [(2, 3, 4), (3, 4, 5), (4, 5, 6), (5, 6, 2), (6, 2, 2)]),
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("ij", [(2, 3)]), ("i j -> j i", [(2, 3)]),
    ("ij,jk,kl->im", [(2, 3), (3, 4), (4, 5)]),  # an output letter no input has
])
def test_einsum_path_named_cases_match_mlx(expr, shapes):
    got = mx.einsum_path(expr, *[mx.zeros(s) for s in shapes])
    want = mlx_ref.einsum_path(expr, *[mlx_ref.zeros(s) for s in shapes])
    assert got == want
    assert isinstance(got, tuple) and all(isinstance(p, tuple) for p in got[0])


def test_einsum_path_agrees_with_numpy_greedy_on_a_chain():
    shapes = [(2, 30), (30, 40), (40, 5)]
    ops = [np.zeros(s, np.float32) for s in shapes]
    want = np.einsum_path("ij,jk,kl->il", *ops, optimize="greedy")[0][1:]
    got, text = mx.einsum_path("ij,jk,kl->il", *[mx.array(x) for x in ops])
    assert got == want
    assert text.startswith("  Complete contraction:  ij,jk,kl->il\n")


# --------------------------------------------------------------------------- primitives

def _prims(out) -> collections.Counter:
    return collections.Counter(primitive_names(out))


def _mlx_prims(out, tmp_path) -> collections.Counter:
    path = tmp_path / "g.dot"
    mlx_ref.export_to_dot(str(path), out)
    labels = re.findall(r'label\s*=\s*"([^"]*)"', path.read_text())
    return collections.Counter(x for x in labels if x[:1].isupper())


@requires_mlx
@pytest.mark.parametrize("expr, shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("ii->i", [(3, 3)]), ("i,i", [(3,), (3,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("ij->ji", [(2, 3)]), ("ij->", [(2, 3)]),
    ("i,j->ij", [(2,), (3,)]), ("iij,jk", [(3, 3, 4), (4, 5)]), ("ijij->ij", [(2, 3, 2, 3)]),
    ("iijj,jk", [(2, 2, 3, 3), (3, 4)]), ("...ij,...jk", [(2, 1, 3), (2, 3, 4)]),
    ("ij,ij,ij->", [(2, 3), (1, 3), (2, 1)]), ("bac,cd,ad->b", [(2, 3, 4), (4, 5), (3, 5)]),
])
def test_records_the_primitives_mlx_records(expr, shapes, tmp_path):
    xs = _operands(shapes, 3)
    got = _prims(mx.einsum(expr, *[mx.array(x) for x in xs]))
    want = _mlx_prims(mlx_ref.einsum(expr, *[mlx_ref.array(x) for x in xs]), tmp_path)
    assert got == want


@requires_mlx
@settings(max_examples=60, deadline=None)
@given(expressions(max_ops=4, pool="anAbNoqdQ"), st.integers(0, 2**16))
def test_random_expressions_record_mlx_primitives(tmp_path_factory, case, seed):
    # letters whose codes collide modulo MLX's hash-bucket counts, so the axis orders of
    # intermediates (and the Transposes / Broadcasts they need) are exercised
    expr, shapes, _ = case
    xs = _operands(shapes, seed)
    got = mx.einsum(expr, *[mx.array(x) for x in xs])
    want = mlx_ref.einsum(expr, *[mlx_ref.array(x) for x in xs])
    assert _prims(got) == _mlx_prims(want, tmp_path_factory.mktemp("dot"))
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- errors

ERROR_CASES = [
    ("ij", []), ("", []), ("ij,jk", [(2, 3)]), ("i,j", [(2,)]), ("i$", [(2,)]),
    ("i......", [(2, 3)]), ("...i...", [(2, 3)]), ("..i", [(3,)]), ("i.j", [(2, 3)]),
    ("ii->ii", [(2, 2)]), ("ij", [(2,)]), ("i", [()]), ("ii", [(2, 3)]),
    ("ij,ij", [(2, 3), (4, 3)]), ("i,i", [(3,), (4,)]), ("...ijk", [(2, 3)]),
    ("ij->i->j", [(2, 3)]), ("ij-", [(2, 3)]), ("1j", [(2, 3)]), ("i>j", [(2, 3)]),
    ("ij->i$", [(2, 3)]), ("i\tj", [(2, 3)]), ("ij->...i.", [(2, 3)]),
    ("...ij,...jk", [(2, 1, 3), (5, 3, 4)]), ("iij,jk", [(3, 2, 4), (4, 5)]),
    ("ij->ik", [(2, 3)]), ("ij,jk->il", [(2, 3), (3, 4)]),
    ("ij,jk,kl->im", [(2, 3), (3, 4), (4, 5)]), ("ijk->lmi", [(2, 3, 4)]),
]


@requires_mlx
@pytest.mark.parametrize("fn", ["einsum", "einsum_path"])
@pytest.mark.parametrize("expr, shapes", ERROR_CASES)
def test_errors_match_mlx(fn, expr, shapes):
    got = _outcome(lambda: getattr(mx, fn)(expr, *[mx.zeros(s) for s in shapes]))
    want = _outcome(lambda: getattr(mlx_ref, fn)(expr, *[mlx_ref.zeros(s) for s in shapes]))
    assert got[0] == want[0] == ("err" if fn == "einsum" or got[0] == "err" else "ok")
    if got[0] == "err":
        assert got[1] is want[1] and got[2] == want[2]


@requires_mlx
@pytest.mark.parametrize("dtype", ["int32", "int8", "bool_", "uint16"])
@pytest.mark.parametrize("expr", ["ij,jk->ik", "ij,jk", "ij,jk,kl->il", "i,i", "ij,j->"])
def test_integer_contractions_raise_matmuls_error(dtype, expr):
    shapes = {"ij": (2, 3), "jk": (3, 4), "kl": (4, 5), "i": (3,), "j": (3,)}
    subs = expr.split("->")[0].split(",")
    got = _outcome(lambda: mx.einsum(expr, *[mx.zeros(shapes[s], getattr(mx, dtype))
                                             for s in subs]))
    want = _outcome(lambda: mlx_ref.einsum(expr, *[mlx_ref.zeros(shapes[s],
                                                                  getattr(mlx_ref, dtype))
                                                   for s in subs]))
    assert got[0] == want[0] == "err"
    assert got[1] is want[1] and got[2] == want[2]


@requires_mlx
@pytest.mark.parametrize("call", [
    lambda m: m.einsum(1, m.zeros((2, 3))),
    lambda m: m.einsum(b"ij", m.zeros((2, 3))),
    lambda m: m.einsum_path(1, m.zeros((2, 3))),
    lambda m: m.einsum("i,j", 1, 2),
    lambda m: m.einsum("ij,jk", np.ones((2, 3), np.float32), m.zeros((3, 4))),
    lambda m: m.einsum_path("ij", m.zeros((2, 3)), 3.0),
])
def test_argument_type_errors_match_mlx(call):
    got, want = _outcome(lambda: call(mx)), _outcome(lambda: call(mlx_ref))
    assert got[0] == want[0] == "err"
    assert got[1] is want[1] and got[2] == want[2]


def test_python_signature_errors_are_type_errors():
    # MLX's binding words these its own way; the exception type is what matches
    with pytest.raises(TypeError):
        mx.einsum_path("ij", mx.zeros((2, 3)), stream=mx.cpu)
    with pytest.raises(TypeError):
        mx.einsum()


@pytest.mark.parametrize("expr, dtype, shapes", [
    ("ij,jk->ik", mx.int32, [(2, 3), (3, 4)]),  # Matmul's dtype error, after a plan
    ("ii,ij->ik", mx.float32, [(3, 3), (3, 4)]),  # Transpose's error, after a Gather
    ("ij,jk,kl->im", mx.float32, [(2, 3), (3, 4), (4, 5)]),
    ("iij,jk", mx.float32, [(3, 2, 4), (4, 5)]),
])
def test_bad_input_records_no_node(monkeypatch, expr, dtype, shapes):
    made = []
    real = _array._make
    monkeypatch.setattr(_array, "_make", staticmethod(lambda *a: made.append(a) or real(*a)))
    xs = [mx.zeros(s, dtype) for s in shapes]
    for x in xs:
        mx.eval(x)
    made.clear()
    with pytest.raises(ValueError):
        mx.einsum(expr, *xs)
    assert made == []
