"""Derivative rules as MLX 0.32.4 gives them (mlx/primitives.cpp), each case computed on
tapescope and compared with MLX itself where installed, and with a hand-derived numpy value
on tapescope alone: gradients with respect to indices raise, MaskedScatter's VJP and JVP,
comparison and bitwise tangents keep the tangent's dtype, Power's exponent gradient at a zero
power, complex Prod's conjugate, an in-place operator on an argument inside the function, and
second derivatives through sort-like ops whose indices carry no gradient."""

from __future__ import annotations

import numpy as np
import pytest

import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import same_error


def _both(case, expected=None, rtol=0.0):
    """``case(M)`` -> list of arrays on tapescope equals MLX's and ``expected`` (numpy)."""
    got = [np.array(a) for a in case(mx)]
    if expected is not None:
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=rtol, atol=0)
    if mlx_ref is not None:
        want = [np.array(a) for a in case(mlx_ref)]
        assert [g.dtype for g in got] == [w.dtype for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=0)
    return got


INDEX_ERRORS = [
    "M.vjp(lambda x, i: M.take(x, i), [M.arange(4.0), M.array([1, 3])], [M.ones((2,))])",
    "M.jvp(lambda x, i: M.take(x, i), [M.arange(4.0), M.array([1, 3])], [M.ones(4), M.ones(2)])",
    "M.vjp(lambda x, i: x[i], [M.arange(4.0), M.array([1, 3])], [M.ones((2,))])",
    "M.vjp(lambda x, i: M.take_along_axis(x, i, axis=0), [M.ones((4, 1)), M.array([[1], [3]])],"
    " [M.ones((2, 1))])",
    "M.jvp(lambda x, i: M.take_along_axis(x, i, axis=0), [M.ones((4, 1)), M.array([[1], [3]])],"
    " [M.ones((4, 1)), M.ones((2, 1))])",
    "M.vjp(lambda x, i, u: x.at[i].add(u), [M.arange(4.0), M.array([1, 3]), M.ones(2)],"
    " [M.ones((4,))])",
    "M.vjp(lambda x, i, u: M.put_along_axis(x, i, u, axis=0), [M.ones((4, 1)),"
    " M.array([[1], [3]]), M.ones((2, 1))], [M.ones((4, 1))])",
    "M.jvp(lambda x, i, u: M.put_along_axis(x, i, u, axis=0), [M.ones((4, 1)),"
    " M.array([[1], [3]]), M.ones((2, 1))], [M.ones((4, 1)), M.ones((2, 1)), M.ones((2, 1))])",
    "M.vjp(lambda x, i: M.slice(x, i, (0,), (2,)), [M.arange(4.0), M.array([1])], [M.ones(2)])",
]


@pytest.mark.parametrize("src", INDEX_ERRORS)
def test_a_gradient_with_respect_to_indices_raises_mlx_error(src):
    same_error(lambda M: eval(src, {"M": M}))


def test_indices_computed_from_the_input_need_stop_gradient():
    def f(w):
        return mx.take(w, mx.stop_gradient(mx.argsort(w)[:2])).sum()

    np.testing.assert_array_equal(np.array(mx.grad(f)(mx.array([4.0, 3.0, 2.0, 1.0]))),
                                  [0, 0, 1, 1])
    with pytest.raises(ValueError, match="stop_gradient on indices"):
        mx.grad(lambda w: mx.take(w, mx.argsort(w)[:2]).sum())(mx.array([4.0, 3.0, 2.0, 1.0]))


def _masked(M, dst, src, mask):
    dst = dst * 1
    dst[M.array(mask)] = src
    return dst


def test_masked_scatter_jvp_and_vjp_match_mlx():
    mask = [True, False, True, False]
    _both(lambda M: M.jvp(lambda s: _masked(M, M.zeros(4), s, mask), [M.ones(2)],
                          [M.array([2.0, 3.0])])[1], [[2, 0, 3, 0]])
    _both(lambda M: M.jvp(lambda d, s: _masked(M, d, s, mask), [M.ones(4), M.ones(2) * 3],
                          [M.ones(4) * 5, M.arange(2.0) * 7])[1], [[0, 5, 7, 5]])
    _both(lambda M: M.vjp(lambda d, s: _masked(M, d, s, mask), [M.ones(4), M.ones(2) * 3],
                          [M.arange(4.0) * 5])[1], [[0, 5, 0, 15], [0, 10]])
    m2 = [[True, False], [False, True], [True, True]]
    c = np.arange(6.0).reshape(3, 2)
    for n in (4, 6):  # a source longer than the selection: its tail gets zeros
        _both(lambda M: M.vjp(lambda d, s: _masked(M, d, s, m2), [M.ones((3, 2)), M.arange(n * 1.0)],
                              [M.array(c)])[1],
              [np.where(m2, 0, c), np.pad(c[np.array(m2)], (0, n - 4))])


@pytest.mark.parametrize("op", ["greater", "less", "equal", "greater_equal", "less_equal",
                                "not_equal"])
def test_a_comparison_tangent_keeps_the_tangent_dtype(op):
    x = mx.array([1.0, -2.0, 3.0])
    got = _both(lambda M: M.jvp(lambda x: getattr(M, op)(x, 0.0), [M.array([1.0, -2.0, 3.0])],
                                [M.ones(3)])[1], [np.zeros(3)])
    assert got[0].dtype == np.float32
    # and the tangent flows on: x + (x > 0) has the tangent of x
    _, (t,) = mx.jvp(lambda x: x + (x > 0).astype(mx.float32), [x], [mx.ones_like(x)])
    np.testing.assert_array_equal(np.array(t), [1, 1, 1])


def test_bitwise_tangent_keeps_the_tangent_dtype():
    _both(lambda M: M.jvp(lambda x: (x == 0) & (x > -1), [M.array([0.0, 1.0])], [M.ones(2)])[1],
          [np.zeros(2, np.float32)])


def test_power_gradient_of_the_exponent_is_zero_where_the_power_is():
    # d/dx (x - y)^x at x = y = 1: 1 * 0^0 ... MLX: exponent term 0 where the power is 0
    _both(lambda M: [M.grad(lambda x, y: (x - y) ** x)(M.array(1.0), M.array(1.0))], [1.0])
    _both(lambda M: [M.grad(lambda y: M.power(M.array(0.0), y))(M.array(2.0))], [0.0])
    _both(lambda M: [M.grad(lambda y: M.power(M.array(2.0), y))(M.array(3.0))],
          [8 * np.log(2.0)], rtol=1e-6)


def test_complex_prod_vjp_is_the_conjugate_times_the_cotangent_as_multiplys():
    rng = np.random.default_rng(0)
    p = (rng.normal(size=(2, 5)) + 1j * rng.normal(size=(2, 5))).astype(np.complex64)
    c = (rng.normal(size=(5,)) + 1j * rng.normal(size=(5,))).astype(np.complex64)
    got = _both(lambda M: M.vjp(lambda x: x.prod(axis=0), [M.array(p)], [M.array(c)])[1],
                [np.stack([np.conj(p[1]) * c, np.conj(p[0]) * c])], rtol=1e-6)
    _, vm = mx.vjp(mx.multiply, [mx.array(p[0]), mx.array(p[1])], [mx.array(c)])
    np.testing.assert_array_equal(np.stack([np.array(v) for v in vm]), got[0])


def test_an_in_place_update_of_an_argument_is_differentiated_through():
    def f(M):
        def g(x, idx):
            x[idx] = 2.0
            return x.sum()
        return [M.grad(g)(M.array([1.0, 2.0, 3.0, 4.0]), M.array([1, 3]))]

    _both(f, [[1, 0, 1, 0]])

    def h(M):
        def g(a, b):
            a[4:-5:-2] = b
            return a
        return M.vjp(g, (M.ones(4), M.zeros(2)), (M.arange(4.0) + 1,))[1]

    _both(h, [[1, 0, 3, 0], [4, 2]])

    def k(M):
        def g(x):
            x += 1
            return x * x
        return M.jvp(g, [M.array([1.0, 2.0])], [M.ones(2)])[1]

    _both(k, [[4, 6]])


@pytest.mark.parametrize("fn", [
    lambda M, a: M.sort(a), lambda M, a: M.partition(a, 2), lambda M, a: M.topk(a, 2),
    lambda M, a: M.cummax(a, axis=0), lambda M, a: M.cummin(a, axis=0, reverse=True),
    lambda M, a: M.cummax(a, axis=0, inclusive=False)])
def test_second_derivatives_through_permutations(fn):
    x0, v0 = np.array([3.0, 1.0, 2.0, 5.0]), np.array([1.0, -2.0, 0.5, 1.5])

    def hvp(M):
        f = lambda a: M.sum(fn(M, a) ** 3)  # noqa: E731
        return [M.grad(lambda a: M.sum(M.grad(f)(a) * M.array(v0)))(M.array(x0))]

    got = _both(hvp, rtol=1e-6)
    eps = 1e-3
    f = lambda a: mx.sum(fn(mx, a) ** 3)  # noqa: E731
    num = (np.array(mx.grad(f)(mx.array(x0 + eps * v0), )) -
           np.array(mx.grad(f)(mx.array(x0 - eps * v0)))) / (2 * eps)
    np.testing.assert_allclose(got[0], num, atol=1e-2)


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "maximum", "minimum"])
def test_at_a_slice_is_a_reducing_slice_update_with_mlx_derivatives(op):
    """``x.at[1:3].multiply(u)`` is MLX's SliceUpdate Prod (a Scatter Prod, which has no
    VJP, for index arrays): values, VJPs and JVPs (MLX raises for prod / max / min) as MLX."""
    src, upd, cot = [1.0, 2.0, 3.0, 4.0], [[2.0, 2.0]], [4.0, 5.0, 6.0, 7.0]
    ref = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
           "divide": np.divide, "maximum": np.maximum, "minimum": np.minimum}[op]
    want = np.array(src)
    want[1:3] = ref(want[1:3], np.array(upd)[0])
    _both(lambda M: [getattr(M.array(src).at[1:3], op)(M.array(upd))], [want], rtol=1e-6)
    f = lambda M: (lambda s, u: getattr(s.at[1:3], op)(u))  # noqa: E731
    _both(lambda M: M.vjp(f(M), [M.array(src), M.array(upd)], [M.array(cot)])[1], rtol=1e-6)
    if op in ("add", "subtract"):
        _both(lambda M: M.jvp(f(M), [M.array(src), M.array(upd)], [M.ones(4), M.ones((1, 2))])[1])
    else:
        same_error(lambda M: M.jvp(f(M), [M.array(src), M.array(upd)],
                                   [M.ones(4), M.ones((1, 2))])[1][0])
    names = {"add": "SliceUpdate Sum", "multiply": "SliceUpdate Prod",
             "maximum": "SliceUpdate Max"}
    if op in names:
        import os
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "g.dot")
            mx.export_to_dot(path, getattr(mx.ones(4).at[1:3], op)(mx.array(upd)))
            assert f'label ="{names[op]}"' in open(path).read()
