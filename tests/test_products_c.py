"""matmul / addmm and the array's ``@`` recorded in C (``interactive/core/_products.c``)
against their Python reference (``ops/products.py``'s ``matmul_py`` / ``addmm_py``, the
Python ``__matmul__``): the same graph node for node (primitives, parameters, shapes,
dtypes, inputs), the same errors, every case the C declines handed to Python; values
against numpy float64. Skips where the extension is not built or the C call is off."""

from __future__ import annotations

import numpy as np
import pytest

import tapescope.core as mx
from tapescope.core import array_methods
from tapescope.core.ops import products
from tapescope.core.walk import topological

_call = pytest.importorskip("tapescope.core._call", reason="interactive/core/_call.c is not built")
pytestmark = pytest.mark.skipif(products._matmul is not getattr(_call, "matmul", None),
                                reason="matmul in C is off (TAPESCOPE_C_CALL=0)")


def _signature(out) -> list:
    descs = [o._d for o in (out if isinstance(out, (list, tuple)) else [out])]
    order = topological(descs)
    pos = {id(n): k for k, n in enumerate(order)}
    leaves: dict = {}
    sig = []
    for n in order:
        ins = [(pos[id(x.node)], x.index) if x.node is not None and id(x.node) in pos
               else ("leaf", leaves.setdefault(id(x), len(leaves))) for x in n.inputs]
        kw = {k: (v, type(v).__name__) for k, v in n.primitive.kw.items()}
        outs = [(o.shape, type(o.shape).__name__, o.dtype.name, o.stream)
                for o in (r() for r in n.outputs) if o is not None]
        sig.append((n.primitive.name, repr(kw), list(n.primitive.kw), n.primitive.stream,
                    outs, ins))
    return sig + [[(d.shape, d.dtype.name, d.node is not None) for d in descs]]


def _python(monkeypatch) -> None:
    monkeypatch.setattr(products, "_matmul", products._matmul_py)
    monkeypatch.setattr(products, "_addmm", products._addmm_py)
    monkeypatch.setattr(mx.array, "__matmul__", array_methods.PY_OPERATORS["__matmul__"])


def _outcome(f):
    try:
        out = f()
    except Exception as e:  # noqa: BLE001 (the error is the outcome compared)
        return ("error", type(e), str(e))
    outs = out if isinstance(out, list) else [out]
    return ("ok", _signature(out), [np.array(o.astype(mx.float32) if o.dtype == mx.bfloat16 else o)
                                    for o in outs])


def _same(monkeypatch, f):
    c = _outcome(f)
    _python(monkeypatch)
    py = _outcome(f)
    monkeypatch.undo()
    assert c[0] == py[0] and c[1] == py[1], (c[:2], py[:2])
    if c[0] == "ok":
        for a, b in zip(c[2], py[2]):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    else:
        assert c[2] == py[2]
    return c


rng = np.random.default_rng(0)


def _a(*shape, dtype=mx.float32):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


MATMULS = {
    "2d": lambda: mx.matmul(_a(3, 4), _a(4, 5)),
    "2d_float16": lambda: mx.matmul(_a(3, 4, dtype=mx.float16), _a(4, 5, dtype=mx.float16)),
    "2d_bfloat16": lambda: _a(3, 4, dtype=mx.bfloat16) @ _a(4, 5, dtype=mx.bfloat16),
    "2d_complex": lambda: _a(2, 3, dtype=mx.complex64) @ _a(3, 2, dtype=mx.complex64),
    "2d_float64": lambda: mx.matmul(_a(2, 3, dtype=mx.float64), _a(3, 2, dtype=mx.float64),
                                    stream=mx.cpu),
    "3d_by_2d": lambda: _a(2, 3, 4) @ _a(4, 5),
    "4d_by_transposed": lambda: _a(2, 1, 3, 4) @ _a(5, 4).T,
    "lazy_operands": lambda: mx.matmul(mx.exp(_a(3, 4)), _a(4, 2) * 2.0),
    "stream_cpu": lambda: mx.matmul(_a(3, 4), _a(4, 5), stream=mx.cpu),
    "device_cpu": lambda: mx.matmul(_a(3, 4), _a(4, 5), stream=mx.Device(mx.cpu)),
    "empty": lambda: _a(0, 4) @ _a(4, 3),
    # declined: the Python path's own steps
    "vector_left": lambda: mx.matmul(_a(4), _a(4, 5)),
    "vector_right": lambda: _a(3, 4) @ _a(4),
    "batched": lambda: _a(2, 3, 4) @ _a(2, 4, 5),
    "mixed_dtypes": lambda: _a(3, 4) @ _a(4, 5, dtype=mx.float16),
    "numpy_operand": lambda: _a(3, 4) @ np.ones((4, 2), np.float32),
    # errors
    "ints": lambda: mx.matmul(mx.array(np.ones((2, 2), np.int32)), mx.array(np.ones((2, 2), np.int32))),
    "mismatch": lambda: _a(3, 4) @ _a(5, 2),
    "scalar": lambda: mx.matmul(_a(3, 4), mx.array(2.0)),
    "list_operand": lambda: _a(2, 2) @ [[1.0, 0.0], [0.0, 1.0]],
    "bad_stream": lambda: mx.matmul(_a(3, 4), _a(4, 5), stream="gpu0"),
}

ADDMMS = {
    "row_c": lambda: mx.addmm(_a(5), _a(3, 4), _a(4, 5)),
    "full_c": lambda: mx.addmm(_a(3, 5), _a(3, 4), _a(4, 5), 0.5, 2.0),
    "column_c": lambda: mx.addmm(_a(3, 1), _a(3, 4), _a(4, 5), alpha=2, beta=-1),
    "one_by_one_c": lambda: mx.addmm(_a(1, 1), _a(3, 4), _a(4, 5), beta=np.float32(0.25)),
    "scalar_c": lambda: mx.addmm(mx.array(1.5), _a(3, 4), _a(4, 5)),
    "one_c": lambda: mx.addmm(_a(1), _a(3, 4), _a(4, 5)),
    "transposed": lambda: mx.addmm(_a(5), _a(3, 4), _a(5, 4).T, stream=mx.cpu),
    "bfloat16": lambda: mx.addmm(_a(5, dtype=mx.bfloat16), _a(3, 4, dtype=mx.bfloat16),
                                 _a(4, 5, dtype=mx.bfloat16)),
    "float64": lambda: mx.addmm(_a(5, dtype=mx.float64), _a(3, 4, dtype=mx.float64),
                                _a(4, 5, dtype=mx.float64), stream=mx.cpu),
    # declined
    "c_other_dtype": lambda: mx.addmm(_a(5, dtype=mx.float16), _a(3, 4), _a(4, 5)),
    "complex": lambda: mx.addmm(_a(2, dtype=mx.complex64), _a(2, 3, dtype=mx.complex64),
                                _a(3, 2, dtype=mx.complex64)),
    "batched": lambda: mx.addmm(_a(5), _a(2, 3, 4), _a(4, 5)),
    "vector": lambda: mx.addmm(_a(5), _a(4), _a(4, 5)),
    "c_three_axes": lambda: mx.addmm(_a(1, 3, 5), _a(3, 4), _a(4, 5)),
    # errors
    "c_not_broadcasting": lambda: mx.addmm(_a(4), _a(3, 4), _a(4, 5)),
    "ints": lambda: mx.addmm(mx.array(np.ones(2, np.int32)), mx.array(np.ones((2, 2), np.int32)),
                             mx.array(np.ones((2, 2), np.int32))),
    "bad_alpha": lambda: mx.addmm(_a(5), _a(3, 4), _a(4, 5), alpha="two"),
    "bad_beta": lambda: mx.addmm(_a(5), _a(3, 4), _a(4, 5), beta=None),
    "mismatch": lambda: mx.addmm(_a(5), _a(3, 4), _a(3, 5)),
}


@pytest.mark.parametrize("table, seed, name", [("matmul", 1, n) for n in sorted(MATMULS)] +
                         [("addmm", 2, n) for n in sorted(ADDMMS)])
def test_products_in_c_record_the_python_graph(monkeypatch, table, seed, name):
    global rng
    rng = np.random.default_rng(seed)
    state = rng.bit_generator.state

    def f():
        rng.bit_generator.state = state  # (the same operands on both paths)
        return (MATMULS if table == "matmul" else ADDMMS)[name]()

    _same(monkeypatch, f)


def test_the_common_cases_are_the_ones_c_takes(monkeypatch):
    """The cases above meant for C do not reach the Python versions; the declined ones do."""
    seen = []
    for attr in ("matmul_py", "addmm_py"):
        real = getattr(products, attr)
        monkeypatch.setattr(products, attr, lambda *a, _r=real, _n=attr, **k: (seen.append(_n), _r(*a, **k))[1])
    products._c_products()  # (configured with the counting versions)
    try:
        python = {"vector_left", "vector_right", "batched", "mixed_dtypes", "ints", "mismatch",
                  "scalar", "c_other_dtype", "complex", "vector", "c_three_axes",
                  "c_not_broadcasting"}
        for table in (MATMULS, ADDMMS):
            for name in table:
                seen.clear()
                try:
                    table[name]()
                except Exception:  # noqa: BLE001
                    pass
                assert bool(seen) == (name in python), name
    finally:
        monkeypatch.undo()
        products._c_products()


def test_values_against_float64():
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    c = rng.standard_normal(5)
    got = mx.array(a.astype(np.float32)) @ mx.array(b.astype(np.float32))
    np.testing.assert_allclose(np.array(got), a @ b, rtol=1e-5, atol=1e-5)
    got = mx.addmm(mx.array(c.astype(np.float32)), mx.array(a[0].astype(np.float32)),
                   mx.array(b.astype(np.float32)), 0.5, 2.0)
    np.testing.assert_allclose(np.array(got), 0.5 * a[0] @ b + 2.0 * c, rtol=1e-5, atol=1e-5)


def test_a_shapeless_trace_takes_the_python_path():
    f = mx.compile(lambda x, w: x @ w, shapeless=True)
    w = mx.array(np.eye(4, 3, dtype=np.float32))
    for n in (2, 5):
        x = mx.array(np.arange(n * 3 * 4, dtype=np.float32).reshape(n, 3, 4))
        np.testing.assert_array_equal(np.array(f(x, w)), np.array(x) @ np.array(w))
