"""Every rule with a CuPy-like array module (``cupy_like``: numpy that fails where CuPy 14
fails), against numpy's results; and the forms written for what CuPy lacks, over
hypothesis inputs, against numpy's own ufunc methods."""

from __future__ import annotations

import ast
import contextlib
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, strategies as st

import cupy_like
import rule_replay
from tapescope.kernels.primitives import REGISTRY
from tapescope.kernels.rules import forms

pytestmark = [pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

# log-step logaddexp against an exact reference (float64 for float32, long double for
# float64): within ceil(log2 n) + 2 ulps of max(1, |value|) (measured <= 1.8 up to n = 20000,
# where numpy's sequential accumulate drifts to ~60 ulps: about sqrt(n) / 2). Against numpy
# the two errors add up: the replay allows the sum of both bounds.
def logaddexp_ulps(n: int) -> float:
    return math.ceil(math.log2(max(n, 2))) + 2


def logaddexp_vs_numpy_ulps(n: int) -> float:
    return logaddexp_ulps(n) + math.sqrt(n)


# a scatter's sum / product of k updates at one position, tree against sequential order:
# each order is within about k eps of the exact result (the cases repeat a position <= 4 times)
SCATTER_ULPS = 16


def _tolerant(name, ref, got, ins, kw):
    if name == "CumLogAddExp" and ref.dtype.kind in "fc":
        tol = logaddexp_vs_numpy_ulps(ref.shape[kw["axis"]]) * np.finfo(ref.dtype).eps
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
        return
    if name in ("Scatter", "ScatterAxis") and ref.dtype.kind in "fc" and kw["reduce"] in ("sum", "prod"):
        # the segmented scan groups a position's updates as a tree, numpy adds them in turn
        np.testing.assert_allclose(got, ref, rtol=SCATTER_ULPS * np.finfo(ref.dtype).eps)
        return
    rule_replay.exact(name, ref, got)


SHIM = rule_replay.Device(
    xp=cupy_like, to_device=cupy_like.on_device, to_host=cupy_like.to_host,
    empty=lambda shape, dtype: cupy_like.ndarray(shape, dtype), compare=rule_replay.each(_tolerant))


@pytest.fixture(scope="module")
def report():
    return rule_replay.replay(SHIM)


def test_every_rule_gives_numpys_result_with_the_cupy_like_module(report):
    assert not report.failures, "\n".join(report.failures)


def test_every_primitive_is_replayed(report):
    missing = set(REGISTRY) - set(report.calls) - set(rule_replay.NOT_REPLAYED)
    assert not missing, f"no case records {sorted(missing)}"
    assert sum(report.calls.values()) > 500


def test_the_placeholder_rule_raises_with_either_module():
    rule = REGISTRY["Placeholder"].rule
    for xp in (np, cupy_like):
        with pytest.raises(ValueError, match="Attempting to eval an array during function"):
            rule(xp)


def test_the_shim_fails_where_cupy_does():
    a = cupy_like.to_device(np.arange(6.0))
    assert not hasattr(a.flags, "writeable")
    for uf in ("maximum", "minimum", "logaddexp", "logical_and"):
        with pytest.raises(NotImplementedError, match="accumulate"):
            getattr(cupy_like, uf).accumulate(a)
    with pytest.raises(NotImplementedError, match="at"):
        cupy_like.multiply.at(a, cupy_like.to_device(np.array([0, 0])), a[:2])
    with pytest.raises(TypeError, match="add.at only supports"):
        cupy_like.add.at(cupy_like.to_device(np.zeros(3, np.int8)), cupy_like.to_device(np.array([0])),
                         cupy_like.to_device(np.ones(1, np.int8)))
    with pytest.raises(TypeError):
        a + np.ones(6)
    assert isinstance(a.sum(), cupy_like.ndarray) and isinstance(a[0], cupy_like.ndarray)
    assert not hasattr(cupy_like, "errstate")


def test_rules_compute_with_the_array_module_they_are_given():
    """No rule module imports numpy: host data would break every device but the CPU."""
    rules = pathlib.Path(forms.__file__).parent
    for path in sorted(rules.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "numpy" or n.startswith("numpy.") for n in names), path.name


def test_rules_ask_the_backend_not_the_array_modules_name():
    """No rule reads an array module's ``__name__`` or compares anything with a module's name:
    which forms a module has is its backend's declared fact (``forms.sequential``)."""
    rules = pathlib.Path(forms.__file__).parent
    found = []
    for path in sorted(rules.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "__name__" and isinstance(node.ctx, ast.Load):
                found.append(f"{path.name}:{node.lineno} reads __name__")
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if isinstance(side, ast.Constant) and side.value in ("numpy", "cupy"):
                        found.append(f"{path.name}:{node.lineno} compares with {side.value!r}")
    assert found == []


def test_the_forms_follow_the_backends_declared_fact():
    from conftest import registered_as_gpu
    from tapescope.kernels import backends

    registered = contextlib.contextmanager(registered_as_gpu)

    class Gpu(backends.Backend):
        name, device_type, dialect = "formsgpu", "gpu", "c"
        sequential_forms = True

        def run_compiled(self, tape, inputs, shape, out=None, donatable=None):
            raise NotImplementedError

    assert forms.sequential(np) and not forms.sequential(cupy_like)
    a = cupy_like.to_device(np.array([[1.0, 3.0, 2.0]]))
    with pytest.raises(NotImplementedError):  # numpy's form: CuPy-like has no maximum.accumulate
        with registered(Gpu(cupy_like)):
            assert forms.sequential(cupy_like) and forms.sequential(np)
            forms.accumulate(cupy_like, "maximum", a, 1)
    assert not forms.sequential(cupy_like)  # unregistered: the log-step form again
    np.testing.assert_array_equal(cupy_like.to_host(forms.accumulate(cupy_like, "maximum", a, 1)),
                                  [[1.0, 3.0, 3.0]])
    Gpu.sequential_forms = False
    with registered(Gpu(np)):  # the CPU's numpy keeps the CPU's fact
        assert forms.sequential(np)


# -- the forms, over hypothesis inputs -----------------------------------------------------
_DTYPES = st.sampled_from(["float32", "float64", "float16", "int32", "int8", "uint8", "bool"])


@st.composite
def _arrays(draw, dtypes=_DTYPES):
    dtype = draw(dtypes)
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)))
    n = int(np.prod(shape))
    if dtype == "bool":
        vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif dtype.startswith("float"):
        vals = draw(st.lists(st.sampled_from([0.0, -0.0, 1.0, -2.5, 3.0, np.inf, -np.inf, np.nan, 7.25,
                                              -1e30, 1e-30]), min_size=n, max_size=n))
    else:
        info = np.iinfo(dtype)
        vals = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n))
    return np.array(vals, dtype=dtype).reshape(shape)


@given(_arrays(), st.data())
def test_log_step_accumulate_is_numpys_for_max_min_and(a, data):
    axis = data.draw(st.integers(0, a.ndim - 1))
    for uf in ("maximum", "minimum", "logical_and", "logical_or"):
        if uf.startswith("logical") and a.dtype != bool:
            continue
        ref = getattr(np, uf).accumulate(a, axis=axis)
        got = forms.accumulate(cupy_like, uf, cupy_like.on_device(a), axis)
        rule_replay.exact(uf, ref, cupy_like.to_host(got))


@given(st.integers(1, 3000), st.sampled_from(["float32", "float64"]), st.integers(0, 2 ** 32 - 1))
def test_log_step_logaddexp_within_the_stated_bound(n, dtype, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((2, n)) * rng.choice([1, 30, 300])).astype(dtype)
    exact = np.logaddexp.accumulate(a.astype(np.float64 if dtype == "float32" else np.longdouble), axis=1)
    got = cupy_like.to_host(forms.accumulate(cupy_like, "logaddexp", cupy_like.on_device(a), 1))
    err = np.abs(got - exact) / np.maximum(1, np.abs(exact))
    assert float(err.max()) <= logaddexp_ulps(n) * np.finfo(dtype).eps


def _scatter_case(a, seed):
    """A flat target, and up to 3x its size of positions (repeats likely) with updates."""
    a = a.reshape(-1)
    rng = np.random.default_rng(seed)
    if a.size == 0:
        a = np.zeros(3, a.dtype)
    k = int(rng.integers(0, 3 * a.size + 1))
    index = rng.integers(0, a.size, k)
    return a, index, (rng.permutation(np.resize(a, k)) if k else a[:0])


@given(_arrays(st.sampled_from(["float32", "float64", "int32", "int8", "uint8", "bool", "int64"])),
       st.sampled_from(["add", "multiply", "maximum", "minimum"]), st.integers(0, 2 ** 32 - 1))
def test_segmented_scatter_is_numpys_ufunc_at(a, ufunc, seed):
    a, index, updates = _scatter_case(a, seed)
    ref = a.copy()
    getattr(np, ufunc).at(ref, (index,), updates)
    got = cupy_like.to_device(a)
    forms.scatter(cupy_like, ufunc, got, (cupy_like.to_device(index),), cupy_like.to_device(updates))
    got = cupy_like.to_host(got)
    if ufunc == "multiply" and a.dtype.kind == "f":  # the products are grouped differently
        # ... so compare where no grouping can overflow, underflow or meet inf / nan: the
        # exact (float64) product is 0 or a normal number of the dtype
        exact = a.astype(np.float64)
        np.multiply.at(exact, (index,), updates.astype(np.float64))
        fi = np.finfo(a.dtype)
        bad = np.zeros(a.shape, bool)
        np.logical_or.at(bad, (index,), ~np.isfinite(updates) | (np.abs(updates) > 1e4))
        keep = ~bad & np.isfinite(a) & ((exact == 0) | ((np.abs(exact) >= fi.tiny)
                                                        & (np.abs(exact) <= fi.max)))
        np.testing.assert_allclose(got[keep], ref[keep],
                                   rtol=8 * np.finfo(a.dtype).eps * max(1, index.size))
    else:
        rule_replay.exact(ufunc, ref, got)


@given(_arrays(st.sampled_from(["float32", "int8", "bool", "uint8"])), st.integers(0, 2 ** 32 - 1))
def test_assign_keeps_the_last_of_repeated_positions_as_numpy(a, seed):
    a, index, updates = _scatter_case(a, seed)
    ref = a.copy()
    ref[index] = updates  # numpy: the last of repeated positions
    got = cupy_like.to_device(a)
    forms.assign(cupy_like, got, (cupy_like.to_device(index),), cupy_like.to_device(updates))
    rule_replay.exact("assign", ref, cupy_like.to_host(got))
