"""mx.fast (MLX's fallback compositions) and mx.distributed's singleton group, against MLX:
values and gradients over hypothesis shapes and options, dtypes, and MLX's errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapescope.core as mx
from conftest import mlx_ref

pytestmark = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")


def _both(fn, *arrays, grad=True):
    """fn(M, *arrays) on tapescope and MLX, and the gradient of its sum for the first input."""
    res = []
    for M in (mx, mlx_ref):
        xs = [M.array(a) for a in arrays]
        out = fn(M, *xs)
        g = M.grad(lambda x0: fn(M, x0, *xs[1:]).sum())(xs[0]) if grad else out
        res.append((np.array(out), np.array(g)))
    (o1, g1), (o2, g2) = res
    assert o1.dtype == o2.dtype and o1.shape == o2.shape
    np.testing.assert_allclose(o1, o2, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(g1, g2, rtol=2e-5, atol=2e-5)


def _normal(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3)


@settings(max_examples=10, deadline=None)
@given(shapes, st.integers(1, 8), st.booleans(), st.booleans(), st.integers(0, 9))
def test_norms(lead, d, weight, bias, seed):
    x, w, b = _normal((*lead, d), seed), _normal((d,), seed + 1), _normal((d,), seed + 2)
    _both(lambda M, x, w: M.fast.rms_norm(x, w if weight else None, 1e-5), x, w)
    _both(lambda M, x, w, b: M.fast.layer_norm(x, w if weight else None, b if bias else None,
                                               1e-5), x, w, b)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.sampled_from([2, 4, 8]), st.booleans(),
       st.integers(0, 5), st.sampled_from([1.0, 0.5]), st.booleans(), st.booleans(),
       st.integers(0, 9))
def test_rope(heads, L, half_d, traditional, offset, scale, with_freqs, offset_array, seed):
    D = 8
    x = _normal((2, heads, L, D), seed)
    freqs = np.linspace(1.0, 40.0, half_d // 2).astype(np.float32)

    def f(M, x):
        kw = dict(freqs=M.array(freqs), base=None) if with_freqs else dict(base=10000.0)
        off = M.array(offset) if offset_array else offset
        return M.fast.rope(x, half_d, traditional=traditional, scale=scale, offset=off, **kw)

    _both(f, x)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.sampled_from([1, 2]),
       st.sampled_from([None, "causal", "additive", "bool"]), st.booleans(), st.integers(0, 9))
def test_scaled_dot_product_attention(L, kL, reps, mask, sinks, seed):
    n_kv, D = 2, 4
    kL = max(kL, L)
    q, k, v = _normal((2, n_kv * reps, L, D), seed), _normal((2, n_kv, kL, D), seed + 1), \
        _normal((2, n_kv, kL, D), seed + 2)
    m = _normal((L, kL), seed + 3)
    s = _normal((n_kv * reps,), seed + 4)

    def f(M, q, k, v, m, s):
        mk = {None: None, "causal": "causal", "additive": m, "bool": m > -0.5}[mask]
        return M.fast.scaled_dot_product_attention(q, k, v, scale=0.7, mask=mk,
                                                   sinks=s if sinks else None)

    _both(f, q, k, v, m, s)


@settings(max_examples=8, deadline=None)
@given(shapes, st.integers(2, 6), st.integers(0, 9))
def test_cross_entropy(lead, classes, seed):
    logits = _normal((*lead, classes), seed)
    targets = np.random.default_rng(seed).integers(0, classes, lead).astype(np.int32)
    _both(lambda M, l, t: M.fast.cross_entropy(l, t), logits, targets)


def test_half_precision_keeps_the_dtype():
    x = _normal((3, 8), 0)
    for M in (mx, mlx_ref):
        h = M.array(x).astype(M.float16)
        assert M.fast.rms_norm(h, M.ones((8,), M.float16), 1e-5).dtype == M.float16
        assert M.fast.layer_norm(h, None, None, 1e-5).dtype == M.float16
        assert M.fast.rms_norm(h, M.ones((8,)), 1e-5).dtype == M.float32


@pytest.mark.parametrize("call", [
    lambda M: M.fast.rms_norm(M.ones((2, 4)), M.ones((3,)), 1e-5),
    lambda M: M.fast.rms_norm(M.ones((2, 4)), M.ones((2, 4)), 1e-5),
    lambda M: M.fast.rms_norm(M.ones((2, 4), M.int32), None, 1e-5),
    lambda M: M.fast.layer_norm(M.ones((2, 4)), M.ones((3,)), None, 1e-5),
    lambda M: M.fast.layer_norm(M.ones((2, 4)), None, M.ones((5,)), 1e-5),
    lambda M: M.fast.rms_norm(M.array(1.0), None, 1e-5),
    lambda M: M.fast.layer_norm(M.array(1.0), None, None, 1e-5),
    lambda M: M.fast.layer_norm(M.ones((2, 3), M.int32), None, M.ones((3,)), 1e-5),
    lambda M: M.fast.cross_entropy(M.ones((3, 5)), M.ones((3, 5))),
    lambda M: M.fast.scaled_dot_product_attention(M.ones((1, 3, 2, 4)), M.ones((1, 2, 2, 4)),
                                                  M.ones((1, 2, 2, 4)), scale=1.0),
    lambda M: M.fast.rope(M.ones((3, 8)), 8, traditional=False, base=1e4, scale=1.0, offset=0),
    lambda M: M.fast.rope(M.ones((1, 3, 8)), 3, traditional=False, base=1e4, scale=1.0, offset=0),
    lambda M: M.fast.rope(M.ones((1, 3, 8)), 8, traditional=False, base=None, scale=1.0, offset=0),
    lambda M: M.fast.rope(M.ones((1, 3, 8)), 8, traditional=False, base=1e4, scale=1.0, offset=0,
                          freqs=M.ones((4,))),
    lambda M: M.distributed.send(M.ones(2), 0),
    lambda M: M.distributed.recv((2,), M.float32, 0),
    lambda M: M.distributed.recv_like(M.ones(2), 0),
    lambda M: M.distributed.init().split(0),
    lambda M: M.distributed.init(strict=True),
    lambda M: M.distributed.init(backend="foo"),
])
def test_errors_as_mlx(call):
    errs = []
    for M in (mx, mlx_ref):
        with pytest.raises(Exception) as info:
            call(M)
        errs.append((type(info.value), str(info.value)))
    assert errs[0] == errs[1]


def test_singleton_group():
    for M in (mx, mlx_ref):
        g = M.distributed.init()
        assert (g.rank(), g.size()) == (0, 1) and M.distributed.init() is g or M is mlx_ref
        assert M.distributed.is_available() and M.distributed.is_available("ring")
        assert not M.distributed.is_available("foo")  # "mpi": tests/test_distributed_mpi.py
        x = M.arange(6.0).reshape(2, 3)
        for op in ("all_sum", "all_max", "all_min", "all_gather", "sum_scatter"):
            y = getattr(M.distributed, op)(x, group=g)
            assert y.shape == (2, 3) and y.tolist() == x.tolist()
        with pytest.raises(TypeError):
            M.distributed.Group()


_X = "M.ones((2, 3, 4, 8))"
ROPE_ERRORS = [
    f"M.fast.rope({_X}.astype(M.int32), 8, traditional=False, base=1e4, scale=1.0, offset=0)",
    f"M.fast.rope({_X}, 0, traditional=False, base=1e4, scale=1.0, offset=0)",
    f"M.fast.rope({_X}, -2, traditional=False, base=1e4, scale=1.0, offset=0)",
    f"M.fast.rope({_X}, 7, traditional=False, base=1e4, scale=1.0, offset=0)",
    f"M.fast.rope({_X}, 16, traditional=False, base=1e4, scale=1.0, offset=0)",
    f"M.fast.rope({_X}, 8, traditional=False, base=1e4, scale=1.0, offset=M.array([1, 2, 3]))",
    f"M.fast.rope({_X}, 8, traditional=False, base=1e4, scale=1.0, offset=M.array([[1, 2]]))",
    f"M.fast.rope({_X}, 8, traditional=False, base=1e4, scale=1.0, offset=M.array(1.5))",
    f"M.fast.rope({_X}, 8, traditional=False, base=None, scale=1.0, offset=0, freqs=M.ones(3))",
    f"M.fast.rope({_X}, 8, traditional=False, base=None, scale=1.0, offset=0)",
    "M.fast.scaled_dot_product_attention(M.ones((1, 4, 8, 16), M.float16), M.ones((1, 2, 8, 16), "
    "M.float16), M.ones((1, 2, 8, 16), M.float16), scale=0.25, sinks=M.ones((4,)))",
    "M.fast.scaled_dot_product_attention(M.ones((1, 4, 8, 16)), M.ones((1, 2, 8, 16)), "
    "M.ones((1, 2, 8, 16)), scale=0.25, sinks=M.ones((5,)))",
    "M.fast.scaled_dot_product_attention(M.ones((1, 4, 8, 16)), M.ones((1, 2, 8, 16)), "
    "M.ones((1, 2, 8, 16)), scale=0.25, sinks=M.ones(()))",
]


@pytest.mark.parametrize("src", ROPE_ERRORS)
def test_rope_and_attention_argument_errors_match_mlx(src):
    from mlx_compare import same_error

    same_error(lambda M: eval(src, {"M": M}))


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 4, 8), (2, 4, 8)])
def test_rope_with_an_offset_per_batch_element(traditional, shape):
    """A vector offset gives batch element b the positions offset[b] + 0 .. L-1: each is the
    rope of that element alone with its scalar offset."""
    x = mx.array(np.random.default_rng(1).normal(size=shape).astype(np.float32))
    offsets = [1, 5]
    got = np.array(mx.fast.rope(x, 6, traditional=traditional, base=1e4, scale=0.5,
                                offset=mx.array(offsets)))
    for b, o in enumerate(offsets):
        one = mx.fast.rope(x[b:b + 1], 6, traditional=traditional, base=1e4, scale=0.5, offset=o)
        np.testing.assert_allclose(got[b:b + 1], np.array(one), rtol=1e-6, atol=1e-6)
