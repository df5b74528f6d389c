"""The API surface against MLX 0.32 itself: public names of ``mlx.core`` and its submodules,
the methods of ``mx.array``, and every function's signature (parameter names, kinds and
defaults), read from nanobind's ``__nb_signature__``. The diff must be empty except for the
names below, each with what is missing and why."""

from __future__ import annotations

import ast
import inspect
import re
import types

import pytest

import tapescope.core as mx
from conftest import mlx_ref

pytestmark = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")

P = inspect.Parameter
# Public names of mlx.core that tapescope.core lacks: name -> (what, why).
MISSING: dict = {}
# Submodules that tapescope.core does not have yet (their names are checked once they exist).
MISSING_SUBMODULES: dict = {}
# Names MLX's submodules have that tapescope's lack: (submodule, name) -> (what, why).
MISSING_IN_SUBMODULE = {
}
MISSING_METHODS: dict = {}  # methods of mlx.core.array: name -> (what, why)

# MLX's declared signature (the nb_sig text) and its binding disagree; tapescope follows the
# binding, and test_declared_signature_differs_from_binding shows the binding's behaviour.
BINDING_NOT_DECLARATION = {
    "roll": "declared roll(a, shift, axis=None, /, ...), but the binding takes axis= by keyword",
    "save_gguf": "declared without a default for metadata, but the binding's is None",
}


def _public(module) -> set:
    return {n for n in dir(module) if not n.startswith("_")}


def _norm_default(v):
    """Defaults compared by value; dtypes by name (MLX's text says ``float32``)."""
    if type(v).__name__ == "Dtype":
        return str(v).rsplit(".", 1)[-1]
    return v


def _mlx_signatures(fn) -> list:
    """[(name, kind, default), ...] for each overload, from nanobind's signature text."""
    out = []
    for text, _doc, defaults in fn.__nb_signature__:
        src = re.sub(r"\\(\d+)", r"__d\1", text)
        src = re.sub(r"\[[^\[\]]*=[^\[\]]*\]", "", src)  # ndarray[writable=False]
        node = ast.parse(src + ":\n    pass").body[0]
        args = node.args

        def value(d):
            if d is None:
                return P.empty
            if isinstance(d, ast.Name) and d.id.startswith("__d"):
                return _norm_default(defaults[int(d.id[3:])])
            try:
                return ast.literal_eval(d)
            except ValueError:
                return ast.unparse(d)

        positional = args.posonlyargs + args.args
        pdefaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        params = [(a.arg, P.POSITIONAL_ONLY if i < len(args.posonlyargs) else P.POSITIONAL_OR_KEYWORD,
                   value(d)) for i, (a, d) in enumerate(zip(positional, pdefaults))]
        if args.vararg:
            params.append((args.vararg.arg, P.VAR_POSITIONAL, P.empty))
        params += [(a.arg, P.KEYWORD_ONLY, value(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
        if args.kwarg:
            params.append((args.kwarg.arg, P.VAR_KEYWORD, P.empty))
        out.append(tuple(params))
    return out


def _our_signature(fn) -> tuple:
    return tuple((p.name, p.kind, _norm_default(p.default))
                 for p in inspect.signature(fn).parameters.values())


def _binds_every_overload(ours, overloads) -> bool:
    """For an overloaded MLX function: each overload's positional call and each of its
    keyword calls binds to our one signature."""
    sig = inspect.signature(ours)
    for ov in overloads:
        required = [(n, k) for n, k, d in ov if d is P.empty and k not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
        positional = [n for n, k in required if k != P.KEYWORD_ONLY]
        try:
            sig.bind(*positional)
            sig.bind(**{n: n for n, k in required if k != P.POSITIONAL_ONLY})
        except TypeError:
            return False
        names = {n for n, _, _ in ov}
        if not names <= set(sig.parameters):
            return False
    return True


def _signature_diff(mlx_module, our_module, names) -> list:
    bad = []
    for name in sorted(names):
        theirs, ours = getattr(mlx_module, name), getattr(our_module, name, None)
        if ours is None or isinstance(theirs, type) or not hasattr(theirs, "__nb_signature__"):
            continue
        if name in BINDING_NOT_DECLARATION and mlx_module is mlx_ref:
            continue
        overloads = _mlx_signatures(theirs)
        if len(overloads) > 1:
            if not _binds_every_overload(ours, overloads):
                bad.append((name, overloads, _our_signature(ours)))
        elif _our_signature(ours) != overloads[0]:
            bad.append((name, overloads[0], _our_signature(ours)))
    return bad


def test_core_has_every_public_name_of_mlx_core():
    missing = _public(mlx_ref) - _public(mx)
    assert missing == set(MISSING), sorted(missing ^ set(MISSING))


def test_core_adds_no_public_function_or_class_mlx_lacks():
    extra = {n for n in _public(mx) - _public(mlx_ref)
             if not isinstance(getattr(mx, n), types.ModuleType)}  # Python binds submodules
    assert extra == set(), sorted(extra)


@pytest.mark.parametrize("sub", ["linalg", "fft", "random", "fast", "distributed", "metal", "cuda"])
def test_submodule_has_every_public_name(sub):
    if sub in MISSING_SUBMODULES:
        assert not hasattr(mx, sub), f"mx.{sub} exists now: check its names, drop it from the list"
        pytest.skip(f"mx.{sub} is missing: {MISSING_SUBMODULES[sub]}")
    theirs, ours = getattr(mlx_ref, sub), getattr(mx, sub)
    missing = {(sub, n) for n in _public(theirs) - _public(ours)}
    assert missing == {k for k in MISSING_IN_SUBMODULE if k[0] == sub}
    # our submodules import helpers; what they define themselves must be MLX's
    extra = {n for n in _public(ours) - _public(theirs)
             if getattr(getattr(ours, n), "__module__", None) == ours.__name__}
    assert extra == set(), sorted(extra)


def test_array_has_every_method_of_mlx_array():
    missing = set(dir(mlx_ref.array)) - set(dir(mx.array))
    assert missing == set(MISSING_METHODS), sorted(missing)
    extra = {n for n in dir(mx.array) if not n.startswith("_")} - set(dir(mlx_ref.array))
    assert extra == set(), sorted(extra)


@pytest.mark.parametrize("sub", ["", "linalg", "fft", "random", "fast", "distributed", "metal",
                                 "cuda"])
def test_function_signatures_match_mlx(sub):
    theirs = getattr(mlx_ref, sub) if sub else mlx_ref
    ours = getattr(mx, sub) if sub else mx
    assert _signature_diff(theirs, ours, _public(theirs)) == []


def test_array_method_signatures_match_mlx():
    """Named methods (operators take ``self, other`` and are checked by behaviour elsewhere)."""
    names = {n for n in dir(mlx_ref.array) if not n.startswith("__")}
    assert _signature_diff(mlx_ref.array, mx.array, names) == []


def test_declared_signature_differs_from_binding():
    a = [[1, 2, 3], [4, 5, 6]]
    for m in (mlx_ref, mx):  # the binding takes axis= by keyword, its text says positional-only
        assert m.roll(m.array(a), 1, axis=1).tolist() == [[3, 1, 2], [6, 4, 5]]
        with pytest.raises(TypeError):
            m.roll(a=m.array(a), shift=1)
    # save_gguf's text has no default for metadata; the binding's is None
    assert inspect.signature(mx.save_gguf).parameters["metadata"].default is None
    assert set(BINDING_NOT_DECLARATION) <= _public(mlx_ref)


def test_signature_reader_sees_kinds_and_defaults():
    """The parser itself, on signatures whose text is known."""
    (s,) = _mlx_signatures(mlx_ref.sum)
    assert s[0] == ("a", P.POSITIONAL_ONLY, P.empty)
    assert ("keepdims", P.POSITIONAL_OR_KEYWORD, False) in s
    assert s[-1] == ("stream", P.KEYWORD_ONLY, None)
    (z,) = _mlx_signatures(mlx_ref.zeros)
    assert ("dtype", P.POSITIONAL_OR_KEYWORD, "float32") in z
    assert len(_mlx_signatures(mlx_ref.arange)) == 2
