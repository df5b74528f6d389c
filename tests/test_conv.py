"""Convolutions (MLX's ``Convolution`` primitive): conv1d / 2d / 3d, conv_general,
conv_transpose1d / 2d / 3d and convolve against MLX itself over hypothesis inputs (shapes,
strides, padding, dilation, groups, flip, dtypes) with MLX's errors; gradients against
``jax.grad`` of ``lax.conv_general_dilated`` and finite differences; vmap against a loop;
and a small conv net's forward pass against MLX's."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import tapescope
import tapescope.core as mx
from conftest import mlx_ref, sweep
from mlx_compare import primitive_names, same_error

needs_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# Tolerance relative to sum |x| |w| over a window (the scale of the rounding): float32
# results are accumulated in float32 by both libraries in different orders; half types are
# accumulated in float32 and rounded once, so within a half ulp of the result's dtype (plus
# the float32 order differences).
REL = {"float32": 1e-6, "float16": 2 ** -10, "bfloat16": 2 ** -7}


def _outcome(module, fn):
    try:
        out = fn(module)
        module.eval(out)
        return out
    except Exception as e:  # noqa: BLE001
        return e


def _against_mlx(fn, dtype="float32", scale=None):
    """``fn(M)`` in both libraries: the same error, or values within the stated tolerance
    (``scale``: ``fn(M)`` over |x|, |w|, bounding each result's rounding)."""
    want, got = _outcome(mlx_ref, fn), _outcome(mx, fn)
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want), (got, want)
        return None
    assert not isinstance(got, Exception), got
    assert got.shape == tuple(want.shape) and got.dtype.name == str(want.dtype).split(".")[-1]
    g = np.array(got.astype(mx.float32))
    w = np.array(want.astype(mlx_ref.float32))
    bound = REL[dtype] * (1.0 if scale is None else np.array(scale.astype(mx.float32))) + 1e-6
    assert np.all(np.abs(g - w) <= 2 * bound + 1e-6 * np.abs(w)), np.abs(g - w).max()
    return got


def _reads_past_end(spatial, kernel, lo, hi, kd=1, idil=1) -> bool:
    """Whether MLX's C division lets a window run past the (sliced, dilated, padded) input:
    MLX then reads memory past it (undefined values), so such cases are not compared."""
    n = len(spatial)
    vec = lambda v: list(v) if isinstance(v, (list, tuple)) else [v] * n
    lo, hi, kd, idil = vec(lo), vec(hi), vec(kd), vec(idil)
    for i in range(n):
        m = spatial[i] - max(0, -lo[i]) - max(0, -hi[i])
        if m >= 1 and (m - 1) * idil[i] + 1 + max(lo[i], 0) + max(hi[i], 0) < \
                (kernel[i] - 1) * kd[i] + 1:
            return True
    return False


def _data(rng, shape, dtype):
    return rng.standard_normal(shape).astype(NP[dtype])


@st.composite
def conv_cases(draw):
    nd = draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, 2])) if nd < 3 else 1
    cin = groups * draw(st.integers(1, 2))
    cout = groups * draw(st.integers(1, 2))
    spatial = [draw(st.integers(1, 6)) for _ in range(nd)]
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    vec = lambda lo, hi: draw(st.one_of(st.integers(lo, hi),
                                        st.lists(st.integers(lo, hi), min_size=nd, max_size=nd)))
    kw = dict(stride=vec(1, 3), kernel_dilation=vec(1, 2), input_dilation=vec(1, 2),
              groups=groups, flip=draw(st.booleans()))
    if draw(st.booleans()):  # asymmetric (low, high) lists, a negative one now and then
        kw["padding"] = (draw(st.lists(st.integers(-1, 2), min_size=nd, max_size=nd)),
                         draw(st.lists(st.integers(-1, 2), min_size=nd, max_size=nd)))
        # MLX reads past an input its negative padding emptied (garbage values)
        assume(all(n + min(lo, 0) + min(hi, 0) >= 1
                   for n, lo, hi in zip(spatial, *kw["padding"])))
    else:
        kw["padding"] = vec(0, 2)
    pad = kw["padding"]
    assume(not _reads_past_end(spatial, kernel, *(pad if isinstance(pad, tuple) else (pad, pad)),
                               kw["kernel_dilation"], kw["input_dilation"]))
    return ((draw(st.integers(1, 2)), *spatial, cin), (cout, *kernel, cin // groups), kw,
            draw(st.sampled_from(["float32", "float16", "bfloat16"])), draw(st.integers(0, 99)))


def _abs(M, a):
    return M.abs(a)


@needs_mlx
@settings(max_examples=60, deadline=None)
@given(conv_cases())
def test_conv_general_matches_mlx(case):
    xs, ws, kw, dtype, seed = case
    rng = np.random.default_rng(seed)
    x, w = _data(rng, xs, dtype), _data(rng, ws, dtype)
    fn = lambda M: M.conv_general(M.array(x), M.array(w), **kw)
    scale = None
    if not isinstance(_outcome(mlx_ref, fn), Exception):
        scale = mx.conv_general(mx.abs(mx.array(x)), mx.abs(mx.array(w)), **kw)
    _against_mlx(fn, dtype, scale)


@needs_mlx
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(0, 99), st.data())
def test_conv_nd_and_transposes_match_mlx(nd, seed, data):
    rng = np.random.default_rng(seed)
    groups = data.draw(st.sampled_from([1, 2])) if nd < 3 else 1
    cin, cout = groups * data.draw(st.integers(1, 2)), groups * data.draw(st.integers(1, 2))
    one = lambda lo, hi: data.draw(
        st.one_of(st.integers(lo, hi), st.tuples(*[st.integers(lo, hi)] * nd)) if nd > 1
        else st.integers(lo, hi))
    spatial = [data.draw(st.integers(2, 6)) for _ in range(nd)]
    x = rng.standard_normal((2, *spatial, cin)).astype(np.float32)
    kern = [data.draw(st.integers(1, 3)) for _ in range(nd)]
    stride, padding, dilation = one(1, 3), one(0, 2), one(1, 2)
    w = rng.standard_normal((cout, *kern, cin // groups)).astype(np.float32)
    assume(not _reads_past_end(x.shape[1:-1], kern, padding, padding, dilation))
    conv = lambda M: getattr(M, f"conv{nd}d")(M.array(x), M.array(w), stride, padding, dilation,
                                              groups)
    _against_mlx(conv, scale=None if isinstance(_outcome(mlx_ref, conv), Exception) else
                 getattr(mx, f"conv{nd}d")(mx.abs(mx.array(x)), mx.abs(mx.array(w)), stride,
                                           padding, dilation, groups) * 8)
    out_pad = one(0, 2)
    wt = rng.standard_normal((cout, *kern, cin // groups)).astype(np.float32)
    tconv = lambda M: getattr(M, f"conv_transpose{nd}d")(
        M.array(x), M.array(wt), stride=stride, padding=padding, dilation=dilation,
        output_padding=out_pad, groups=groups)
    ok = not isinstance(_outcome(mlx_ref, tconv), Exception)
    _against_mlx(tconv, scale=getattr(mx, f"conv_transpose{nd}d")(
        mx.abs(mx.array(x)), mx.abs(mx.array(wt)), stride=stride, padding=padding,
        dilation=dilation, output_padding=out_pad, groups=groups) * 8 if ok else None)


@needs_mlx
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.sampled_from(["full", "same", "valid"]),
       st.integers(0, 99))
def test_convolve_matches_mlx_and_numpy(na, nv, mode, seed):
    rng = np.random.default_rng(seed)
    a, v = rng.standard_normal(na).astype(np.float32), rng.standard_normal(nv).astype(np.float32)
    got = _against_mlx(lambda M: M.convolve(M.array(a), M.array(v), mode),
                       scale=mx.convolve(mx.abs(mx.array(a)), mx.abs(mx.array(v)), mode) * 4)
    if mode != "same" or (min(na, nv) % 2):  # MLX pads an even filter 1 left of numpy's
        np.testing.assert_allclose(np.array(got), np.convolve(a, v, mode), rtol=1e-5, atol=1e-5)


@needs_mlx
def test_recorded_graphs_and_dtypes_match_mlx():
    x, w = np.ones((1, 5, 2), np.float16), np.ones((3, 2, 2), np.float32)
    got = mx.conv1d(mx.array(x), mx.array(w))
    assert got.dtype == mx.float32 and sorted(primitive_names(got)) == ["AsType", "Convolution"]
    neg = mx.conv_general(mx.array(np.ones((1, 5, 1), np.float32)),
                          mx.array(np.ones((1, 2, 1), np.float32)), padding=([-1], [0]))
    assert sorted(primitive_names(neg)) == ["Convolution", "Slice"]
    assert primitive_names(mx.convolve(mx.ones((5,)), mx.ones((3,)))) .count("Convolution") == 1
    # MLX's op slices whole elements for negative padding, even under input dilation
    ramp = np.arange(5.0, dtype=np.float32).reshape(1, 5, 1)
    _against_mlx(lambda M: M.conv_general(M.array(ramp), M.ones((1, 1, 1)), input_dilation=2,
                                          padding=([-1], [-1])))


@needs_mlx
@pytest.mark.parametrize("case", [
    lambda M: M.conv1d(M.ones((2, 9, 4)), M.ones((6, 3, 3))),
    lambda M: M.conv1d(M.ones((2, 9, 4)), M.ones((6, 3, 4)), stride=0),
    lambda M: M.conv1d(M.ones((2, 9, 4)), M.ones((6, 3, 4)), 1.0),
    lambda M: M.conv1d(M.ones((2, 9, 4)), M.ones((6, 3, 2)), groups=3),
    lambda M: M.conv1d(M.ones((2, 9, 4)), M.ones((5, 3, 2)), groups=2),
    lambda M: M.conv1d(M.ones((2, 9, 4)), M.ones((6, 3, 1)), groups=2),
    lambda M: M.conv1d(M.ones((2, 9, 4), dtype=M.int32), M.ones((6, 3, 4))),
    lambda M: M.conv1d(M.ones((2, 9)), M.ones((6, 3, 4))),
    lambda M: M.conv1d(M.ones((2, 9, 4)), M.ones((6, 4))),
    lambda M: M.conv1d(M.ones((2, 2, 4)), M.ones((6, 3, 4))),
    lambda M: M.conv2d(M.ones((1, 4, 4, 2)), M.ones((2, 3, 3, 2)), stride=(1, 2, 3)),
    lambda M: M.conv3d(M.ones((1, 4, 4, 4, 2)), M.ones((2, 3, 3, 3, 1)), groups=2),
    lambda M: M.conv_general(M.ones((2, 9)), M.ones((3, 3))),
    lambda M: M.conv_general(M.ones((2, 9, 4)), M.ones((6, 3, 4)), padding=([1, 2], [3, 3])),
    lambda M: M.conv_general(M.ones((2, 9, 4)), M.ones((6, 3, 4)), stride=[1, 2]),
    lambda M: M.conv_general(M.ones((2, 9, 4)), M.ones((6, 3, 4)), kernel_dilation=[0]),
    lambda M: M.conv_general(M.ones((2, 9, 4)), M.ones((6, 3, 4)), input_dilation=0),
    lambda M: M.conv_general(M.ones((2, 9, 4)), M.ones((6, 3, 4)), padding=([1], [2], [3])),
    lambda M: M.conv_general(M.ones((2, 9, 4)), M.ones((6, 3, 4)), flip=1),
    lambda M: M.conv_general(M.ones((2, 9, 4)), np.ones((6, 3, 4), np.float32)),
    lambda M: M.conv_transpose2d(M.ones((1, 4, 4, 2)), M.ones((2, 3, 3, 2)), padding=(1,)),
    lambda M: M.convolve(M.ones((3,)), M.ones((3,)), mode="x"),
    lambda M: M.convolve(M.ones((3, 1)), M.ones((3,))),
    lambda M: M.convolve(M.ones((0,)), M.ones((3,))),
    lambda M: M.convolve(M.ones((3,), dtype=M.int32), M.ones((3,), dtype=M.int32)),
    lambda M: M.convolve([1.0, 2.0], M.ones((3,))),
])
def test_errors_match_mlx(case):
    same_error(case)


# -- transformations -------------------------------------------------------------------------
GRAD_CASES = [
    (1, dict(stride=[2], padding=([1], [2]), kernel_dilation=[2], input_dilation=[3], groups=2,
             flip=True)),
    (2, dict(stride=[2, 1], padding=([1, 0], [0, 2]), kernel_dilation=[1, 2],
             input_dilation=[2, 1], groups=2)),
    (2, dict(stride=[3, 2], padding=([0, 1], [1, 0]))),
    # forward padding past the kernel: the gradients' convs get negative padding on a
    # stride-dilated cotangent / input-dilated input (cropped on the dilated grid)
    (2, dict(stride=[2, 3], padding=([3, 0], [0, 4]), input_dilation=[2, 1], flip=True)),
    (2, dict(padding=([-1, 2], [1, -1]), kernel_dilation=[2, 1])),
    (3, dict(stride=[1, 2, 1], padding=1, flip=True)),
]


def _jax_conv(x, w, nd, kw):
    import jax.numpy as jnp
    from jax import lax

    one = lambda v, d: list(v) if isinstance(v, list) else [v] * nd if v is not None else [d] * nd
    pad = kw.get("padding", 0)
    lo, hi = pad if isinstance(pad, tuple) else (pad, pad)
    sp = "DHW"[3 - nd:]
    if kw.get("flip"):
        w = jnp.flip(w, axis=tuple(range(1, nd + 1)))
    return lax.conv_general_dilated(
        x, w, one(kw.get("stride"), 1), list(zip(one(lo, 0), one(hi, 0))),
        one(kw.get("input_dilation"), 1), one(kw.get("kernel_dilation"), 1),
        ("N" + sp + "C", "O" + sp + "I", "N" + sp + "C"),
        feature_group_count=kw.get("groups", 1), precision=lax.Precision.HIGHEST)


def _grad_inputs(nd: int, kw: dict) -> tuple:
    """A gradient case's input, weight and output cotangent (float64 numpy)."""
    rng = np.random.default_rng(nd)
    g = kw.get("groups", 1)
    x = rng.standard_normal((2,) + (6,) * nd + (4,))
    w = rng.standard_normal((6,) + (3,) * nd + (4 // g,))
    shape = mx.conv_general(mx.array(x, dtype=mx.float32), mx.array(w, dtype=mx.float32), **kw).shape
    return x, w, rng.standard_normal(shape)


def _conv_loss(kw: dict, ct):
    return lambda a, b: mx.sum(mx.conv_general(a, b, **kw) * mx.array(ct, dtype=a.dtype))


@pytest.mark.parametrize("nd,kw", GRAD_CASES)
def test_grads_match_jax_grad_of_the_lax_conv(nd, kw):
    import jax

    x, w, ct = _grad_inputs(nd, kw)
    with jax.enable_x64(True):  # scoped: the other test files run JAX in float32
        out = _jax_conv(x, w, nd, kw)
        jx, jw = jax.grad(lambda a, b: (_jax_conv(a, b, nd, kw) * ct).sum(),
                          argnums=(0, 1))(x, w)
        jx, jw = np.asarray(jx), np.asarray(jw)
    d64 = lambda a: mx.array(a, dtype=mx.float64)
    ours = mx.conv_general(d64(x), d64(w), **kw)
    assert ours.shape == out.shape
    gx, gw = mx.grad(_conv_loss(kw, ct), argnums=(0, 1))(d64(x), d64(w))
    assert jx.dtype == np.float64
    np.testing.assert_allclose(np.array(gx), jx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.array(gw), jw, rtol=1e-10, atol=1e-10)


# make test's: between them every parameter (1-d: all but negative padding; 2-d: negative
# padding; 3-d); a check of a gradient takes seconds (jax.vjp of the JAX forward graph)
@pytest.mark.parametrize("nd,kw", sweep(GRAD_CASES, [GRAD_CASES[i] for i in (0, 4, 5)]))
def test_check_of_the_conv_gradients_passes(nd, kw):
    """tapescope.check's own reference for the gradients (jax.vjp of the JAX forward graph)
    agrees with them."""
    x, w, ct = _grad_inputs(nd, kw)
    rep = tapescope.check(mx.grad(_conv_loss(kw, ct), argnums=(0, 1)), mx.array(x.astype(np.float32)),
                          mx.array(w.astype(np.float32)), rtol=1e-4, atol=1e-5)
    assert rep.passed, rep


@pytest.mark.parametrize("nd,kw", GRAD_CASES[:5])
def test_jvp_matches_finite_differences(nd, kw):
    rng = np.random.default_rng(10 + nd)
    g = kw.get("groups", 1)
    x = rng.standard_normal((2,) + (6,) * nd + (4,))
    w = rng.standard_normal((6,) + (3,) * nd + (4 // g,))
    tx, tw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    f = lambda a, b: mx.conv_general(a, b, **kw)
    d64 = lambda a: mx.array(a, dtype=mx.float64)
    _, (tan,) = mx.jvp(f, [d64(x), d64(w)], [d64(tx), d64(tw)])
    eps = 1e-6
    fd = (np.array(f(d64(x + eps * tx), d64(w + eps * tw)))
          - np.array(f(d64(x - eps * tx), d64(w - eps * tw)))) / (2 * eps)
    np.testing.assert_allclose(np.array(tan), fd, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axes", [(0, None), (None, 0), (0, 0), (2, 1)])
@pytest.mark.parametrize("groups", [1, 2])
def test_vmap_matches_a_loop(axes, groups):
    rng = np.random.default_rng(groups)
    b = 3
    x = rng.standard_normal((2, 7, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3, 4 // groups)).astype(np.float32)
    xb = np.stack([x + i for i in range(b)], axes[0]) if axes[0] is not None else x
    wb = np.stack([w * (i + 1) for i in range(b)], axes[1]) if axes[1] is not None else w
    kw = dict(stride=2, padding=([1], [2]), kernel_dilation=2, groups=groups, flip=True)
    f = lambda a, v: mx.conv_general(a, v, **kw)
    got = mx.vmap(f, in_axes=axes)(mx.array(xb), mx.array(wb))
    take = lambda arr, ax, i: arr if ax is None else np.take(arr, i, axis=ax)
    want = np.stack([np.array(f(mx.array(take(xb, axes[0], i)), mx.array(take(wb, axes[1], i))))
                     for i in range(b)])
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


# -- a small conv net ------------------------------------------------------------------------
@needs_mlx
def test_a_small_conv_nets_forward_pass_equals_mlxs():
    rng = np.random.default_rng(7)
    params = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(8) * 0.1,
              "w2": rng.standard_normal((16, 3, 3, 8)) * 0.2, "b2": rng.standard_normal(16) * 0.1,
              "wl": rng.standard_normal((16 * 4 * 4, 10)) * 0.1, "bl": rng.standard_normal(10)}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    images = rng.standard_normal((4, 16, 16, 3)).astype(np.float32)

    def net(M, x):
        p = {k: M.array(v) for k, v in params.items()}
        h = M.maximum(M.conv2d(x, p["w1"], stride=2, padding=1) + p["b1"], 0.0)
        h = M.maximum(M.conv2d(h, p["w2"], stride=2, padding=1) + p["b2"], 0.0)
        return M.reshape(h, (h.shape[0], -1)) @ p["wl"] + p["bl"]

    want = np.array(net(mlx_ref, mlx_ref.array(images)))
    got = np.array(net(mx, mx.array(images)))
    assert got.shape == want.shape == (4, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert tapescope.check(lambda x: net(mx, x), mx.array(images)).passed


def test_its_definition_is_complete():
    from tapescope.kernels.primitives import REGISTRY

    d = REGISTRY["Convolution"]
    assert all(d.facets()[f] is not None for f in ("rule", "shape", "dtype", "vjp", "jvp", "vmap"))
    params = dict(strides=(2,), padding_lo=(1,), padding_hi=(0,), kernel_dilation=(1,),
                  input_dilation=(1,), groups=1, flip=False)
    assert d.shape([(2, 9, 4), (6, 3, 4)], **params) == [(2, 4, 6)]
