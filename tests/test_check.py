"""tapescope.check: agreement with JAX across dtypes, fault detection and naming, no-reference
reporting, the report's numbers (against numpy) and its HTML."""

from __future__ import annotations

import html.parser
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("jax")

import tapescope  # noqa: E402
import tapescope.core as mx  # noqa: E402
from tapescope.check.compare import compare, default_tolerance, ulp_distance  # noqa: E402
from tapescope.kernels import primitives  # noqa: E402
from tapescope.kernels.settings import settings as ts_settings  # noqa: E402

from conftest import mlx_ref, sweep  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None)
# a few shapes, so JAX's per-shape op compilations are reused across examples
shapes = st.sampled_from([(1,), (5,), (2, 3), (3, 1, 4), (2, 2, 2, 2)])


@pytest.fixture
def fault(monkeypatch):
    """Replace one primitive's rule (in its definition) for the test."""

    def inject(name, fn):
        defn = primitives.lookup(name)
        monkeypatch.setattr(defn, "rule", fn)
        monkeypatch.setattr(defn, "takes_out", False)

    with ts_settings(eager_kernels=False):  # the replaced rule runs, not a GPU's one-op kernel
        yield inject
    monkeypatch.undo()


def _arr(rng, shape, dtype):
    if dtype == "bool":
        return mx.array(rng.random(shape) > 0.5)
    if dtype == "int32":
        return mx.array(rng.integers(-50, 50, shape).astype(np.int32))
    x = rng.standard_normal(shape).astype(np.float32)
    return mx.array(x).astype(getattr(mx, dtype))


# -- correct functions pass -----------------------------------------------------------------

@settings(SETTINGS, max_examples=sweep(30, 12))  # JAX compiles per (shape, dtype) drawn
@given(shape=shapes, dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
       seed=st.integers(0, 2**16))
def test_float_functions_agree_with_jax(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    a, b = _arr(rng, shape, dtype), _arr(rng, shape, dtype)

    def f(a, b):
        y = mx.tanh(a * b + 1) - mx.exp(-mx.abs(a)) / (1 + b * b)
        return {"y": y, "s": mx.sum(y, axis=-1), "m": mx.max(mx.sigmoid(a), axis=0),
                "sm": mx.softmax(a, axis=-1)}

    r = tapescope.check(f, a, b, every_node=True)
    assert r.passed, repr(r)
    assert all(c.dtype == dtype for c in r.outputs)
    assert all(c.ulp is not None for c in r.outputs)


@settings(SETTINGS, max_examples=sweep(30, 12))
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_int_and_bool_functions_agree_exactly(shape, seed):
    rng = np.random.default_rng(seed)
    i, j = _arr(rng, shape, "int32"), _arr(rng, shape, "int32")
    p, q = _arr(rng, shape, "bool"), _arr(rng, shape, "bool")

    def f(i, j, p, q):
        return [i // j, i % j, mx.maximum(i, j) * 3 - j, mx.cumsum(i, axis=-1),
                mx.logical_and(p, mx.logical_not(q)), mx.any(p, axis=-1), i < j,
                mx.where(p, i, j), mx.sort(i, axis=-1), mx.argmax(i, axis=-1)]

    r = tapescope.check(f, i, j, p, q, every_node=True)
    assert r.passed, repr(r)
    assert {c.dtype for c in r.outputs} >= {"int32", "bool"}
    assert all((c.rtol, c.atol) == (0.0, 0.0) for c in r.outputs if c.dtype in ("int32", "bool"))


@settings(SETTINGS, max_examples=sweep(30, 12))
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_mixed_dtypes_agree(shape, seed):
    rng = np.random.default_rng(seed)
    h, i = _arr(rng, shape, "float16"), _arr(rng, shape, "int32")
    bf, p = _arr(rng, shape, "bfloat16"), _arr(rng, shape, "bool")

    def make(m):
        return lambda h, i, bf, p: (h + i, bf * h, m.where(p, bf, 2), (i * p).astype(m.float16),
                                    h > bf)

    r = tapescope.check(make(mx), h, i, bf, p)
    assert r.passed, repr(r)
    if mlx_ref is not None:  # the output dtypes are MLX's promotions
        m = make(mlx_ref)(*[mlx_ref.array(np.array(x)) if x.dtype != mx.bfloat16 else
                mlx_ref.array(np.array(x.astype(mx.float32))).astype(mlx_ref.bfloat16)
                for x in (h, i, bf, p)])
        assert [c.dtype for c in r.outputs] == [str(y.dtype).split(".")[-1] for y in m]


def test_compiled_function_is_checked_through_its_tape():
    rng = np.random.default_rng(0)
    a, b = _arr(rng, (4, 5), "float32"), _arr(rng, (5,), "float32")
    r = tapescope.check(mx.compile(lambda a, b: mx.exp(a * b - 1) + mx.sin(b)), a, b,
                        every_node=True)
    assert r.passed, repr(r)
    assert "Compiled" in [c.primitive for c in r.nodes]


@pytest.mark.parametrize("fn", [
    lambda a: mx.concatenate([a, a * 2], axis=1)[:, ::-2],
    lambda a: mx.pad(a, ((1, 0), (0, 2)), constant_values=3.0),
    lambda a: mx.split(a, [1, 3], axis=1),
    lambda a: mx.transpose(a)[1:, None],
    lambda a: mx.take(a, mx.array([2, 0, -1]), axis=1),
    lambda a: mx.take_along_axis(a, mx.argsort(a, axis=1), axis=1),
    lambda a: mx.cumprod(a, axis=0, reverse=True, inclusive=False),
    lambda a: mx.logsumexp(a, axis=1),
    lambda a: a @ mx.transpose(a),
    lambda a: mx.addmm(a[:, :4], a[:, :4], a[:, :4], alpha=0.5, beta=2.0),
    lambda a: a.at[mx.array([0, 0, 2])].add(1.0),
    lambda a: mx.fft.rfft(a, axis=1),
    lambda a: mx.erf(a) + mx.erfinv(a * 0.1),
    lambda a: mx.arange(0.5, 3.0, 0.25) * a[0, 0],
    lambda a: mx.left_shift(mx.array([1, 3, -2], mx.int32), mx.array([33, 2, 31], mx.int32)),
], ids=["slice", "pad", "split", "transpose", "take", "gather_axis", "scan", "logsumexp",
        "matmul", "addmm", "scatter", "fft", "erf", "arange", "shift"])
def test_more_primitives_agree_with_jax(fn):
    a = mx.array(np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32))
    r = tapescope.check(fn, a, every_node=True)
    assert r.passed, repr(r)


# -- faults are caught and named ------------------------------------------------------------

def test_fault_in_one_primitive_fails_and_is_named(fault):
    a = mx.array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    fault("Exp", lambda xp, x, out=None: xp.exp(x) + np.float32(0.25))

    def f(a):
        return mx.sum(mx.exp(a * 2) - 1, axis=1)

    r = tapescope.check(f, a, every_node=True)
    assert not r.passed and r.status == "FAIL"
    assert r.first_divergence is not None and r.first_divergence.label.startswith("Exp#")
    assert r.first_divergence.max_abs == pytest.approx(0.25, rel=1e-5)
    # the divergence lists its input: the Multiply that fed it, with tapescope's values
    (label, shape, dtype, ts, _), = r.first_divergence.inputs
    assert label.startswith("Multiply#") and shape == (3, 4) and dtype == "float32"
    # only Exp fails on its own inputs; its consumers compute correctly from what they got
    assert [c.label for c in r.nodes if c.status == "fail"] == [r.first_divergence.label]
    out, = r.outputs
    assert out.status == "fail" and out.max_abs == pytest.approx(1.0, rel=1e-5)  # 4 * 0.25
    assert "first divergence: Exp#" in repr(r)


def test_integer_fault_is_exact(fault):
    fault("Add", lambda xp, x, y, out=None: x + y + (x == 7))
    i = mx.array(np.arange(10, dtype=np.int32))
    r = tapescope.check(lambda i: (i + 1) * 2, i, every_node=True)
    assert r.first_divergence.label.startswith("Add#")
    assert r.first_divergence.mismatches == 1 and r.first_divergence.max_abs == 1
    assert r.outputs[0].max_abs == 2


def test_fault_without_every_node_fails_the_output_only(fault):
    fault("Sin", lambda xp, x, out=None: xp.cos(x))
    a = mx.array(np.array([0.5, 1.0], np.float32))
    r = tapescope.check(mx.sin, a)
    assert not r.passed and r.first_divergence is None and r.nodes == []
    expected = np.abs(np.cos(np.float32([0.5, 1.0])) - np.sin(np.float32([0.5, 1.0]))).max()
    assert r.outputs[0].max_abs == pytest.approx(expected, rel=1e-5)


# -- no reference ---------------------------------------------------------------------------

def test_primitive_without_jax_rule_is_no_reference_never_pass():
    a = mx.array(np.array([[3.0, 1.0, 2.0, 0.0]], np.float32))
    r = tapescope.check(lambda a: (mx.partition(a, 1, axis=1) + 1, a * 2), a, every_node=True)
    part, doubled = r.outputs
    assert part.status == "no reference" and "Partition" in part.reason
    assert doubled.status == "pass"
    assert not r.passed and r.status == "NO REFERENCE"
    assert r.no_reference == ["Partition"]
    statuses = {c.primitive: c.status for c in r.nodes}
    assert statuses["Partition"] == "no reference"
    assert statuses["Add"] == "pass"  # its own check runs on tapescope's input


def test_output_without_unique_reference_is_no_reference():
    m = np.array([[2.0, 1.0], [1.0, 3.0]], np.float32)
    w, v = tapescope.check(lambda a: mx.linalg.eigh(a, stream=mx.cpu), mx.array(m)).outputs
    assert w.status == "pass"
    assert v.status == "no reference"


# -- the report -----------------------------------------------------------------------------

class _Cells(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.cell, self.tables = [], None, 0

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables += 1
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def test_html_report_is_a_table_with_one_row_per_output(fault):
    fault("Exp", lambda xp, x, out=None: xp.exp(x) * np.float32(2))
    a = mx.array(np.ones((2, 2), np.float32))
    r = tapescope.check(lambda a: {"<ok>": a + 1, "bad": mx.exp(a)}, a, every_node=True)
    p = _Cells()
    p.feed(r._repr_html_())
    assert p.tables == 3  # outputs, every node, the divergence's inputs
    header, ok, bad = p.rows[:3]
    assert header[:4] == ["array", "primitive", "shape", "dtype"]
    assert ok[0] == "out['<ok>']" and ok[header.index("status")] == "pass"
    assert bad[header.index("status")] == "fail"
    assert "&lt;ok&gt;" in r._repr_html_()
    assert float(bad[header.index("max abs")]) == pytest.approx(np.e, rel=1e-3)


def test_compare_numbers_against_numpy():
    x = np.array([1.0, 2.0, -3.0, 0.0], np.float32)
    y = x.copy()
    y[1] = np.nextafter(np.nextafter(y[1], np.float32(9)), np.float32(9))  # 2 ulps up
    c = compare("o", "", y, x, None, None)
    assert c.ulp == 2 and c.status == "pass"
    assert c.max_abs == pytest.approx(float(y[1]) - 2.0)
    assert c.max_rel == pytest.approx((float(y[1]) - 2.0) / 2.0)
    assert ulp_distance(np.float32([-0.0]), np.float32([0.0])) == 0
    assert ulp_distance(np.float32([np.nextafter(0, -1, dtype=np.float32)]),
                        np.float32([np.nextafter(0, 1, dtype=np.float32)])) == 2
    bf = np.array([1.0, 1.0078125], ml_dtypes.bfloat16)  # adjacent bfloat16 values
    assert ulp_distance(bf[1:], bf[:1]) == 1
    nan = np.float32([np.nan, 1.0])
    assert compare("o", "", nan, nan.copy(), None, None).status == "pass"
    one_side = compare("o", "", nan, np.float32([0.0, 1.0]), None, None)
    assert one_side.status == "fail" and "NaN" in one_side.reason
    assert compare("o", "", np.float32([np.inf]), np.float32([np.inf]), None, None).status == "pass"
    assert compare("o", "", np.int32([5]), np.int32([6]), None, None).status == "fail"
    assert compare("o", "", np.int32([5]), np.int32([6]), 0.0, 1.0).status == "pass"
    assert compare("o", "", np.float32([1.001]), np.float32([1.0]), 1e-2, 0).status == "pass"
    assert compare("o", "", np.float32([1, 2]), np.float32([1]), None, None).status == "fail"
    assert default_tolerance(np.float16) == (5e-3, 1e-3)
    assert default_tolerance(np.int32) == (0.0, 0.0)


def test_explicit_tolerances_apply(fault):
    fault("Exp", lambda xp, x, out=None: xp.exp(x) * np.float32(1.001))
    a = mx.array(np.float32([0.0, 1.0]))
    assert not tapescope.check(mx.exp, a).passed
    r = tapescope.check(mx.exp, a, rtol=1e-2)
    assert r.passed and r.outputs[0].rtol == 1e-2


# -- devices, errors, laziness --------------------------------------------------------------

def test_device_cpu_and_unavailable_gpu():
    import jax

    a = mx.array(np.float32([1, 2]))
    assert tapescope.check(mx.exp, a, device="cpu").device.startswith("TFRT_CPU") or \
        "cpu" in tapescope.check(mx.exp, a, device=mx.cpu).device.lower()
    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(ValueError, match=r"\[check\] JAX has no gpu device"):
            tapescope.check(mx.exp, a, device="gpu")
    with pytest.raises(ValueError, match=r"\[check\] Unknown device"):
        tapescope.check(mx.exp, a, device="tpu9")


def test_default_reference_device_follows_tapescope_default_device():
    """JAX's default is its GPU when it has one; with tapescope's CPU as the default device the
    reference runs on JAX's CPU (on the H200 machine this failed with JAX on cuda:0)."""
    a = mx.array(np.float32([1, 2]))
    with mx.stream(mx.cpu):
        assert mx.default_device() == mx.cpu
        assert "cpu" in tapescope.check(mx.exp, a).device.lower()


def test_function_without_arrays_is_an_error():
    with pytest.raises(ValueError, match=r"\[check\]"):
        tapescope.check(lambda: 3)


def test_lazy_arguments_and_dead_siblings():
    a = mx.array(np.arange(1, 7, dtype=np.int32)) * 3  # a lazy argument: its graph is checked
    r = tapescope.check(lambda x: mx.divmod(x, 4)[1], a, every_node=True)
    assert r.passed, repr(r)
    assert {"Multiply", "DivMod"} <= {c.primitive for c in r.nodes}


def test_import_tapescope_does_not_import_jax_or_tqdm():
    code = "import sys, tapescope, tapescope.core; print('jax' in sys.modules, 'tqdm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_status_cells_carry_dark_text_on_their_pale_colours(fault):
    """A dark theme's light text on the pale pass / fail colours was unreadable (the tour page
    in nbconvert's dark theme): each coloured status cell sets its own text colour."""
    a = mx.array(np.linspace(-1, 1, 6, dtype=np.float32))
    page = tapescope.check(lambda a: mx.exp(a) + 1.0, a, every_node=True)._repr_html_()
    cells = re.findall(r'<td style="([^"]*)">(pass|fail|no reference)</td>', page)
    assert cells and all("background:" in st and "color:#1a1a1a" in st for st, _ in cells)
    fault("Exp", lambda xp, x, out=None: xp.exp(x) + np.float32(0.25))
    page = tapescope.check(lambda a: mx.exp(a) + 1.0, a, every_node=True)._repr_html_()
    failing = [st for st, status in re.findall(r'<td style="([^"]*)">(pass|fail)</td>', page) if status == "fail"]
    assert failing and all("color:#1a1a1a" in st for st in failing)


def test_the_verdict_says_the_tolerance_and_where_the_largest_ulp_distance_is():
    from tapescope.viz.check import CheckReport

    e = np.array([[1.0, 2.0, 3.0], [4.0, 1e-7, 6.0]], np.float32)
    a = e.copy()
    a[0, 2] = np.nextafter(a[0, 2], np.float32(9))  # 1 ulp
    a[1, 1] = np.float32(1.2e-7)  # many ulps of a value near zero, far inside atol
    ulps = np.abs(a.view(np.int32).astype(np.int64) - e.view(np.int32).astype(np.int64))
    c = compare("out", "Exp", a, e, None, None)
    v = CheckReport([c], device="cpu").verdict()
    want = int(ulps.max())
    assert c.ulp == want and c.ulp_at == tuple(int(i) for i in np.unravel_index(ulps.argmax(), a.shape))
    assert v.startswith("PASS within rtol 1e-05, atol 1e-06 for float32")
    assert f"largest distance {want} ulp at out[1, 1]" in v and "near zero" in v and "inside atol" in v
    a[0, 0] = 1.5  # now an element outside the tolerance
    bad = CheckReport([compare("out", "Exp", a, e, None, None)], device="cpu").verdict()
    assert bad == "FAIL: out: 1 of 6 elements outside tolerance (rtol 1e-05, atol 1e-06 for float32)"
    assert "PASS within" in repr(CheckReport([c], device="cpu")).splitlines()[1]
