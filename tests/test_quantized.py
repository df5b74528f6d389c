"""Quantization against MLX itself: ``quantize`` / ``dequantize`` in every mode, bit width and
group size MLX accepts (bit for bit, over hypothesis shapes, dtypes and value ranges),
``quantized_matmul`` / ``gather_qmm`` within float tolerance, ``qqmm`` where MLX's CPU computes
it (and against the JAX reference elsewhere), ``to_fp8`` / ``from_fp8`` bit for bit over every
class of float input, MLX's errors, recorded primitives, gradients and batching."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope.core as mx
from conftest import mlx_ref
from mlx_compare import outcome, primitive_names, same_error

needs_mlx = pytest.mark.skipif(mlx_ref is None, reason="mlx is not installed")

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# (mode, group size, bits): every combination MLX 0.32.4 accepts
CONFIGS = ([("affine", g, b) for g in (32, 64, 128) for b in (1, 2, 3, 4, 5, 6, 8)]
           + [("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)])
# accumulation error allowed, relative to |x| @ |w| (MLX's CPU accumulates half types in
# their own type; ours in float32, rounded once)
REL = {"float32": 2e-6, "float16": 2 ** -7, "bfloat16": 2 ** -4}


def _arr(module, a: np.ndarray, dtype: str):
    return module.array(a.astype(np.float32)).astype(getattr(module, dtype))


def _np(a) -> np.ndarray:
    """float32 (or the integer type) numpy copy of an array of either library."""
    if str(a.dtype).endswith("float16"):  # float16, bfloat16
        a = a.astype(mx.float32 if isinstance(a, mx.array) else mlx_ref.float32)
    return np.array(a)


def _mlx_to_ours(a):
    return _arr(mx, _np(a), str(a.dtype).split(".")[-1]) if "float" in str(a.dtype) else \
        mx.array(np.array(a))


def _mlx_names(*outs) -> list:
    import io
    import re

    buf = io.StringIO()
    mlx_ref.export_to_dot(buf, *outs)
    return re.findall(r'label ="(\w+)", shape=rectangle', buf.getvalue())


def _weights(rng, shape, spread):
    w = rng.standard_normal(shape) * spread
    if w.size >= 40:  # a constant group, a zero group start, one large outlier
        flat = w.reshape(-1)
        flat[:16] = 0.0
        flat[20] *= 50
    return w


# -- quantize / dequantize -----------------------------------------------------------------
@needs_mlx
@settings(max_examples=40, deadline=None)
@given(cfg=st.sampled_from(CONFIGS), dtype=st.sampled_from(sorted(NP)),
       batch=st.sampled_from([(), (2,)]), rows=st.integers(1, 3), groups=st.integers(1, 3),
       spread=st.sampled_from([1e-3, 1.0, 300.0]), seed=st.integers(0, 2 ** 16))
def test_quantize_and_dequantize_equal_mlx_bit_for_bit(cfg, dtype, batch, rows, groups, spread,
                                                      seed):
    mode, gs, bits = cfg
    w = _weights(np.random.default_rng(seed), batch + (rows, gs * groups), spread)
    want = None
    try:
        qm = mlx_ref.quantize(_arr(mlx_ref, w, dtype), gs, bits, mode)
        mlx_ref.eval(qm)
    except Exception as e:  # noqa: BLE001 - MLX's fp composition needs 32 codes per reshape
        want = e
    if want is not None:
        with pytest.raises(type(want)) as got:
            mx.eval(mx.quantize(_arr(mx, w, dtype), gs, bits, mode))
        assert str(got.value) == str(want)
        return
    qt = mx.quantize(_arr(mx, w, dtype), gs, bits, mode)
    assert type(qt) is type(qm) is list and len(qt) == len(qm) == (3 if mode == "affine" else 2)
    for a, b in zip(qt, qm):
        assert a.shape == tuple(b.shape) and a.dtype.name == str(b.dtype).split(".")[-1]
        np.testing.assert_array_equal(_np(a), _np(b))
    # dequantize MLX's own quantization, in each output type
    ins = [_mlx_to_ours(a) for a in qm]
    for out in (None, "float32", "float16"):
        kw = {} if out is None else {"dtype": getattr(mlx_ref, out)}
        ko = {} if out is None else {"dtype": getattr(mx, out)}
        if mode == "affine":
            dm = mlx_ref.dequantize(*qm, gs, bits, mode, **kw)
            dt = mx.dequantize(*ins, gs, bits, mode, **ko)
        else:
            dm = mlx_ref.dequantize(qm[0], qm[1], None, gs, bits, mode, **kw)
            dt = mx.dequantize(ins[0], ins[1], None, gs, bits, mode, **ko)
        assert dt.dtype.name == str(dm.dtype).split(".")[-1] and dt.shape == tuple(dm.shape)
        np.testing.assert_array_equal(_np(dt), _np(dm))


@needs_mlx
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nvfp4_global_scale_equals_mlx(dtype):
    w = _weights(np.random.default_rng(3), (4, 64), 2.0)
    g = np.float32(123.5)
    qm = mlx_ref.quantize(_arr(mlx_ref, w, dtype), mode="nvfp4", global_scale=mlx_ref.array(g))
    qt = mx.quantize(_arr(mx, w, dtype), mode="nvfp4", global_scale=mx.array(g))
    for a, b in zip(qt, qm):
        np.testing.assert_array_equal(_np(a), _np(b))
    dm = mlx_ref.dequantize(qm[0], qm[1], mode="nvfp4", global_scale=mlx_ref.array(g))
    dt = mx.dequantize(qt[0], qt[1], mode="nvfp4", global_scale=mx.array(g))
    assert dt.dtype.name == str(dm.dtype).split(".")[-1]
    np.testing.assert_array_equal(_np(dt), _np(dm))


@needs_mlx
def test_recorded_primitives_follow_mlx():
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    wt, wm = mx.array(w), mlx_ref.array(w)
    assert primitive_names(*mx.quantize(wt)) == ["Quantize"] == _mlx_names(*mlx_ref.quantize(wm))
    for mode in ("mxfp4", "mxfp8", "nvfp4"):  # MLX's CPU composes these of ops
        ours = primitive_names(*mx.quantize(wt, mode=mode))
        assert "Quantize" not in ours and {"Max", "Abs", "Reshape"} <= set(ours)
        assert ("ToFP8" in ours) == ("ToFP8" in _mlx_names(*mlx_ref.quantize(wm, mode=mode)))
    q = mx.quantize(wt)
    mx.eval(q)
    x = mx.array(w[:2])
    assert primitive_names(mx.quantized_matmul(x, *q)) == ["QuantizedMatmul"]
    assert primitive_names(mx.to_fp8(x)) == ["ToFP8"]
    assert primitive_names(mx.from_fp8(mx.to_fp8(x), mx.float32)) == ["FromFP8", "ToFP8"]
    assert "Quantize" not in primitive_names(mx.dequantize(*q))  # affine: shifts and a concat


# -- the matmuls -------------------------------------------------------------------------------
def _close(got, want, scale, dtype):
    assert got.shape == tuple(want.shape) and got.dtype.name == str(want.dtype).split(".")[-1]
    g, w = _np(got), _np(want)
    bound = REL[dtype] * scale + 1e-6
    assert np.all(np.abs(g - w) <= bound), np.abs(g - w).max()


@needs_mlx
@settings(max_examples=30, deadline=None)
@given(cfg=st.sampled_from(CONFIGS), dtype=st.sampled_from(sorted(NP)), transpose=st.booleans(),
       xbatch=st.sampled_from([(), (2,), (2, 1)]), wbatch=st.sampled_from([(), (1,), (3,)]),
       m=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_quantized_matmul_matches_mlx(cfg, dtype, transpose, xbatch, wbatch, m, seed):
    mode, gs, bits = cfg
    rng = np.random.default_rng(seed)
    k = n = gs * 2 if gs < 128 else 128
    w = rng.standard_normal(wbatch + ((n, k) if transpose else (k, n)))
    x = rng.standard_normal(xbatch + (m, k))
    qm = mlx_ref.quantize(_arr(mlx_ref, w, dtype), gs, bits, mode)
    qt = [_mlx_to_ours(a) for a in qm]

    def run(M, q):
        return M.quantized_matmul(_arr(M, x, dtype), q[0], q[1], q[2] if mode == "affine"
                                  else None, transpose, gs, bits, mode)

    try:
        want = run(mlx_ref, qm)
        mlx_ref.eval(want)
    except Exception as e:  # noqa: BLE001 - batch shapes that do not broadcast
        with pytest.raises(type(e)) as got:
            mx.eval(run(mx, qt))
        assert str(got.value) == str(e)
        return
    bias_m = qm[2] if mode == "affine" else None
    got = run(mx, qt)
    deq = mlx_ref.dequantize(qm[0], qm[1], bias_m, gs, bits, mode, dtype=mlx_ref.float32)
    deq = np.abs(np.array(deq))
    scale = np.abs(x) @ (np.swapaxes(deq, -1, -2) if transpose else deq)
    if x.ndim == 2 and scale.ndim > 2:  # MLX multiplies an unbatched x by w's first matrix
        scale = scale.reshape(-1, *scale.shape[-2:])[0]
    _close(got, want, np.broadcast_to(scale, tuple(want.shape)), dtype)


@needs_mlx
@settings(max_examples=20, deadline=None)
@given(mode=st.sampled_from(["affine", "mxfp4", "mxfp8", "nvfp4"]), transpose=st.booleans(),
       lhs=st.sampled_from([None, [0, 1, 1]]), n_rhs=st.integers(1, 3),
       sorted_indices=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gather_qmm_matches_mlx(mode, transpose, lhs, n_rhs, sorted_indices, seed):
    rng = np.random.default_rng(seed)
    k = n = 64
    w = rng.standard_normal((4, n, k))
    x = rng.standard_normal((2, 1, 3, k)) if lhs is not None else rng.standard_normal((3, 2, k))
    rhs = np.sort(rng.integers(0, 4, n_rhs if lhs is None else 3)).astype(np.uint32)
    if lhs is None:
        x = x[:1].reshape(1, 2, k) if n_rhs else x

    def run(M, x_, q):
        b = q[2] if mode == "affine" else None
        li = None if lhs is None else M.array(np.array(lhs, np.int32))
        return M.gather_qmm(x_, q[0], q[1], b, li, M.array(rhs), transpose, mode=mode,
                            sorted_indices=sorted_indices)

    qm = mlx_ref.quantize(mlx_ref.array(w.astype(np.float32)), mode=mode)
    try:
        want = run(mlx_ref, mlx_ref.array(x.astype(np.float32)), qm)
        mlx_ref.eval(want)
    except Exception as e:  # noqa: BLE001 - shapes MLX refuses: the same error
        with pytest.raises(type(e)) as got:
            mx.eval(run(mx, mx.array(x.astype(np.float32)), [_mlx_to_ours(a) for a in qm]))
        assert str(got.value) == str(e)
        return
    got = run(mx, mx.array(x.astype(np.float32)), [_mlx_to_ours(a) for a in qm])
    scale = np.abs(np.array(want)).max() + float(np.abs(x).sum(-1).max()) * 8
    _close(got, want, scale, "float32")


@needs_mlx
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("dtype", sorted(NP))
def test_qqmm_matches_mlx_where_its_cpu_computes(mode, dtype):
    """MLX's CPU computes qqmm for a quantized w and one row of x."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((48, 64)) * 0.7
    x = rng.standard_normal((64,)) * 3
    qm = mlx_ref.quantize(_arr(mlx_ref, w, dtype), mode=mode)
    qt = [_mlx_to_ours(a) for a in qm]
    for shape in ((64,), (1, 64)):
        want = mlx_ref.qqmm(_arr(mlx_ref, x.reshape(shape), dtype), qm[0], qm[1], mode=mode)
        got = mx.qqmm(_arr(mx, x.reshape(shape), dtype), qt[0], qt[1], mode=mode)
        deq = np.abs(_np(mlx_ref.dequantize(qm[0], qm[1], mode=mode, dtype=mlx_ref.float32)))
        _close(got, want, np.abs(x) @ deq.T * 4, dtype)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_qqmm_and_gather_qqmm_against_the_jax_reference(mode):
    """Where MLX's CPU raises NYI (many rows, float w, global scales, gather): the JAX rule,
    written from MLX's semantics."""
    import functools

    import jax

    from tapescope.check import jax_rules

    def T(name, *args, **params):  # one compiled graph: eager JAX compiles op by op
        return np.array(jax.jit(functools.partial(jax_rules.table()[name], **params))(*args))

    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    w = rng.standard_normal((3, 16, 64)).astype(np.float32)
    gx = gw = None
    if mode == "nvfp4":
        gx, gw = mx.array(np.float32(40.0)), mx.array(np.float32(9.0))
    got = mx.qqmm(mx.array(x), mx.array(w[0]), mode=mode, global_scale_x=gx, global_scale_w=gw)
    rest = [] if gx is None else [np.array(gx), np.array(gw)]
    gs, bits = (16 if mode == "nvfp4" else 32), (8 if mode == "mxfp8" else 4)
    want = T("QQMatmul", x.reshape(10, 64), w[0], *rest, group_size=gs, bits=bits, mode=mode)
    np.testing.assert_allclose(np.array(got), want.reshape(2, 5, 16), rtol=1e-5, atol=1e-5)
    rhs = np.array([2, 0], np.uint32)
    got = mx.gather_qqmm(mx.array(x), mx.array(w), rhs_indices=mx.array(rhs), mode=mode)
    want = T("GatherQQMM", x, w, np.array([0, 1], np.uint32), rhs, group_size=gs, bits=bits,
             mode=mode)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


# -- fp8 -------------------------------------------------------------------------------------------
@needs_mlx
def test_to_fp8_is_bit_exact_over_every_class_of_float():
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32),
                           np.arange(0x3A000000, 0x3C800000, 4099, dtype=np.uint32)])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448, 449, 464, 465, 480,
                        2.0 ** -6, 2.0 ** -7, 2.0 ** -9, 2.0 ** -10, 1.5 * 2 ** -10, 1e-45,
                        3e38], np.float32)
    x = np.concatenate([bits.view(np.float32), special, -special])
    np.testing.assert_array_equal(np.array(mx.to_fp8(mx.array(x))),
                                  np.array(mlx_ref.to_fp8(mlx_ref.array(x))))
    every16 = np.arange(1 << 16, dtype=np.uint16)
    for dtype in ("float16", "bfloat16"):  # every value of the type, from its bits
        ours = mx.to_fp8(mx.array(every16).view(getattr(mx, dtype)))
        theirs = mlx_ref.to_fp8(mlx_ref.array(every16).view(getattr(mlx_ref, dtype)))
        np.testing.assert_array_equal(np.array(ours), np.array(theirs))


@needs_mlx
@pytest.mark.parametrize("dtype", sorted(NP))
def test_from_fp8_of_every_byte_equals_mlx(dtype):
    b = np.arange(256, dtype=np.uint8)
    got = mx.from_fp8(mx.array(b), getattr(mx, dtype))
    want = mlx_ref.from_fp8(mlx_ref.array(b), getattr(mlx_ref, dtype))
    assert got.dtype.name == dtype
    g, w = _np(got), _np(want)
    if dtype == "float32":  # bit for bit, the nans' too
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    else:  # MLX's half-type nans carry other payloads
        np.testing.assert_array_equal(g, w)
    assert mx.from_fp8(mx.array(b)).dtype == mx.bfloat16


# -- errors ----------------------------------------------------------------------------------------
ERRORS = [
    "M.quantize(M.ones((4, 64)), mode='bad')",
    "M.quantize(M.ones((4, 64)), group_size=16)",
    "M.quantize(M.ones((4, 64)), bits=7)",
    "M.quantize(M.ones((4, 64)), bits=0)",
    "M.quantize(M.ones((4, 64)), bits=9)",
    "M.quantize(M.ones((4, 64)), group_size=48)",
    "M.quantize(M.ones((64,)))",
    "M.quantize(M.ones((4, 64), M.int32))",
    "M.quantize(M.ones((4, 96)))",
    "M.quantize(M.ones((4, 64)), mode='mxfp4', group_size=64)",
    "M.quantize(M.ones((4, 64)), mode='mxfp8', bits=4)",
    "M.quantize(M.ones((4, 64)), mode='nvfp4', group_size=32)",
    "M.quantize(M.ones((4, 64)), mode='mxfp4', global_scale=M.array(1.0))",
    "M.quantize(M.ones((4, 64)), mode='nvfp4', global_scale=M.ones((2,)))",
    "M.quantize(M.ones((4, 64)), mode='nvfp4', global_scale=M.array(1.0, M.float16))",
    "M.quantize(M.ones((4, 64), M.float64))",
    "M.quantize(M.ones((4, 64)), 64.0)",
    "M.quantize([[1.0] * 64])",
    "M.quantize(M.ones((4, 64)), mode=4)",
    "M.dequantize(*M.quantize(M.ones((4, 64))), mode='nope')",
    "M.dequantize(M.quantize(M.ones((4, 64)))[0], M.quantize(M.ones((4, 64)))[1])",
    "M.dequantize(*M.quantize(M.ones((4, 64))), bits=0)",
    "M.dequantize(*M.quantize(M.ones((4, 64))), group_size=-1)",
    "M.dequantize(*M.quantize(M.ones((4, 64))), group_size=32)",
    "M.dequantize(M.ones((4, 8), M.int32), M.ones((4, 1)), M.ones((4, 1)))",
    "M.dequantize(M.ones((8,), M.uint32), M.ones((1,)), M.ones((1,)))",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 1), M.int32), M.ones((4, 1), M.int32))",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 1)), M.ones((4, 1, 1)))",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((3, 1)), M.ones((3, 1)))",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 1)), M.ones((4, 1)), dtype=M.int32)",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 3), M.uint8), mode='mxfp4')",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 1)), mode='mxfp4')",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 1), M.uint8), M.ones((4, 1)), "
    "mode='mxfp4')",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 2), M.uint8), mode='nvfp4', bits=8)",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 2), M.uint8), mode='mxfp8')",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((2, 1), M.uint8), mode='mxfp8')",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 1, 1), M.uint8), mode='mxfp8')",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 4), M.uint8), mode='nvfp4', "
    "global_scale=M.ones((2,)))",
    "M.dequantize(M.ones((4, 8), M.uint32), M.ones((4, 4), M.uint8), mode='mxfp4', "
    "global_scale=M.array(2.0))",
    "M.quantized_matmul(M.ones((2, 64)), *M.quantize(M.ones((8, 64))), mode='x')",
    "M.quantized_matmul(M.ones((2, 32)), *M.quantize(M.ones((8, 64))))",
    "M.quantized_matmul(M.ones((2, 64)), *M.quantize(M.ones((8, 64))), transpose=False)",
    "M.quantized_matmul(M.ones((2, 64), M.int32), M.ones((8, 8), M.uint32), "
    "M.ones((8, 2), M.uint8), mode='mxfp4')",
    "M.quantized_matmul(M.ones((2, 64)), M.ones((8, 8)), M.ones((8, 1)), M.ones((8, 1)))",
    "M.quantized_matmul(M.ones((2, 64)), M.ones((8, 8), M.uint32), M.ones((8, 1)), "
    "M.ones((8, 2)))",
    "M.quantized_matmul(M.ones((2, 64)), M.ones((8, 8), M.uint32), M.ones((8, 2)), "
    "M.ones((8, 2)), group_size=64)",
    "M.quantized_matmul(M.ones((2, 64)), M.ones((2, 8, 8), M.uint32), M.ones((3, 8, 1)), "
    "M.ones((3, 8, 1)))",
    "M.quantized_matmul(M.ones((2, 64)), M.ones((8, 8), M.uint32), M.ones((8, 3), M.uint8), "
    "mode='mxfp4')",
    "M.quantized_matmul(M.ones((2, 64)), M.ones((8, 8), M.uint32), M.ones((8, 1)))",
    "M.quantized_matmul(M.ones((2, 64)), *M.quantize(M.ones((8, 64))), transpose=1)",
    "M.gather_qmm(M.ones((2, 1, 64)), *M.quantize(M.ones((2, 8, 64))), "
    "rhs_indices=M.array([1.0, 0.0]))",
    "M.gather_qmm(M.ones((2, 1, 64)), *M.quantize(M.ones((2, 8, 64))), "
    "rhs_indices=M.array([1, 0]), mode='mxfp4')",
    "M.gather_qmm(M.ones((2, 1, 64)), *M.quantize(M.ones((2, 8, 64)), mode='nvfp4'), "
    "mode='nvfp4', global_scale=M.ones((2,)))",
    "M.gather_qmm(M.ones((2, 1, 64)), *M.quantize(M.ones((2, 8, 64)), mode='nvfp4'), "
    "mode='nvfp4', global_scale=M.ones((2,)), rhs_indices=M.array([1, 0]))",
    "M.gather_qmm(M.ones((2, 1, 64)), *M.quantize(M.ones((2, 8, 64)), mode='nvfp4'), "
    "mode='nvfp4', global_scale=M.ones((3,)), rhs_indices=M.array([1, 0]))",
    "M.gather_qmm(M.ones((2, 1, 64)), *M.quantize(M.ones((2, 8, 64)), mode='nvfp4'), "
    "mode='nvfp4', global_scale=M.ones((2,), M.float16), rhs_indices=M.array([1, 0]))",
    "M.gather_qmm(M.ones((2, 1, 64)), *M.quantize(M.ones((2, 8, 64))), "
    "global_scale=M.ones((2,)), rhs_indices=M.array([1, 0]))",
    "M.gather_qmm(M.ones((2, 1, 32)), *M.quantize(M.ones((2, 8, 64))), "
    "rhs_indices=M.array([1, 0]))",
    "M.gather_qmm(M.ones((2, 1, 64), M.int32), M.ones((2, 8, 8), M.uint32), "
    "M.ones((2, 8, 2), M.uint8), rhs_indices=M.array([1, 0]), mode='mxfp4')",
    "M.gather_qmm(M.ones((2, 1, 64)), *M.quantize(M.ones((2, 8, 64))), "
    "rhs_indices=M.array([1, 0]), sorted_indices=1)",
    "M.qqmm(M.ones((2, 64)), M.ones((8, 64)), mode='y')",
    "M.qqmm(M.ones((2, 2, 64)), M.ones((2, 8, 64)))",
    "M.qqmm(M.ones((2, 64)), M.ones((8, 8), M.uint32))",
    "M.qqmm(M.ones((2, 64)), M.ones((8, 64), M.int32))",
    "M.qqmm(M.ones((2, 64), M.float64), M.ones((8, 64)))",
    "M.qqmm(M.ones((2, 64)), M.ones((8, 32)))",
    "M.qqmm(M.ones((2, 64)), M.ones((8, 64)), global_scale_x=M.array(1.0))",
    "M.qqmm(M.ones((2, 64)), M.ones((8, 64)), mode='mxfp8', global_scale_x=M.array(1.0))",
    "M.qqmm(M.ones((2, 64)), M.ones((8, 64)), global_scale_x=M.ones((2,)), "
    "global_scale_w=M.array(1.0))",
    "M.qqmm(M.ones((1, 64)), M.ones((8, 8), M.uint32), M.ones((8, 4), M.uint8), mode='mxfp4')",
    "M.to_fp8(M.ones((3,), M.int32))",
    "M.to_fp8(1.0)",
    "M.from_fp8(M.ones((3,)))",
    "M.from_fp8(M.ones((3,), M.uint8), M.int32)",
    "M.from_fp8(M.ones((3,), M.uint8), 'float32')",
]


@needs_mlx
@pytest.mark.parametrize("source", ERRORS)
def test_errors_equal_mlx(source):
    same_error(lambda M: eval(source, {"M": M}))


# -- transformations -------------------------------------------------------------------------------
def _both(fn):
    out = []
    for M in (mlx_ref, mx):
        res = fn(M)
        out.append([np.array(r) for r in (res if isinstance(res, (list, tuple)) else [res])])
    return out


@needs_mlx
@pytest.mark.parametrize("transpose", [True, False])
def test_quantized_matmul_gradients_and_jvp_equal_mlx(transpose):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 64) if transpose else (64, 64)).astype(np.float32)
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)

    def grads(M):
        q, s, b = M.quantize(M.array(w))
        loss = lambda x_, s_, b_: (M.quantized_matmul(x_, q, s_, b_, transpose) ** 2).sum()
        g = M.grad(loss, argnums=(0, 1, 2))(M.array(x), s, b)
        t = M.jvp(lambda x_: M.quantized_matmul(x_, q, s, b, transpose), [M.array(x)],
                  [M.ones(x.shape)])[1][0]
        return [*g, t]

    want, got = _both(grads)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=2e-4, atol=2e-3 * np.abs(w_).max())


@needs_mlx
def test_gradient_errors_equal_mlx():
    for src in [
        "M.grad(lambda w: M.quantized_matmul(M.ones((2, 64)), w, *M.quantize(M.ones((8, 64)))[1:]"
        ").sum())(M.quantize(M.ones((8, 64)))[0])",
        "M.grad(lambda s: M.quantized_matmul(M.ones((2, 64)), M.quantize(M.ones((8, 64)), "
        "mode='mxfp4')[0], s, mode='mxfp4').sum())(M.quantize(M.ones((8, 64)), mode='mxfp4')[1]"
        ".astype(M.float32))",
        "M.grad(lambda x: M.from_fp8(M.to_fp8(x), M.float32).sum())(M.ones((3,)))",
        "M.jvp(M.to_fp8, [M.ones((3,))], [M.ones((3,))])",
    ]:
        want, got = outcome(mlx_ref, src), outcome(mx, src)
        assert want is not None and got == want, (got, want)


@needs_mlx
def test_gather_qmm_gradients_equal_mlx():
    rng = np.random.default_rng(9)
    w = rng.standard_normal((3, 32, 64)).astype(np.float32)
    x = rng.standard_normal((2, 4, 64)).astype(np.float32)
    lhs, rhs = np.array([0, 1, 1], np.uint32), np.array([2, 0, 2], np.uint32)

    def grads(M):
        q, s, b = M.quantize(M.array(w))
        loss = lambda x_, s_, b_: (M.gather_qmm(x_, q, s_, b_, M.array(lhs), M.array(rhs))
                                   ** 2).sum()
        return M.grad(loss, argnums=(0, 1, 2))(M.array(x), s, b)

    want, got = _both(grads)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=2e-4, atol=2e-3 * np.abs(w_).max())


@needs_mlx
def test_quantize_gradient_jvp_and_vmap_go_through_mlx_s_fallback():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 4, 64)).astype(np.float32)

    def transforms(M):
        f = lambda w_: (M.quantize(w_)[1] * M.arange(4)[:, None]).sum() + \
            M.quantize(w_)[2].sum() * 0.5
        g = M.grad(f)(M.array(w[0]))
        t = M.jvp(lambda w_: M.quantize(w_)[1], [M.array(w[0])], [M.ones((4, 64))])[1][0]
        v = M.vmap(lambda w_: M.quantize(w_)[1])(M.array(w))
        return [g, t, v]

    want, got = _both(transforms)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["affine", "mxfp4", "mxfp8", "nvfp4"])
def test_check_and_compile_of_a_quantized_graph(mode):
    """tapescope.check against the JAX rules (forward and a VJP), and compile's result."""
    import tapescope

    rng = np.random.default_rng(2)
    w = mx.array(rng.standard_normal((32, 64)).astype(np.float32))
    x = mx.array(rng.standard_normal((3, 64)).astype(np.float32))

    def f(x, w):
        q = mx.quantize(w, mode=mode)
        b = q[2] if mode == "affine" else None
        out = mx.quantized_matmul(x, q[0], q[1], b, mode=mode)
        return out + mx.dequantize(q[0], q[1], b, mode=mode, dtype=mx.float32).sum()

    assert tapescope.check(f, x, w).passed
    vjp = lambda x, w: mx.vjp(lambda x_: f(x_, w), [x], [mx.ones((3, 32))])[1][0]
    assert tapescope.check(vjp, x, w).passed
    np.testing.assert_array_equal(np.array(mx.compile(f)(x, w)), np.array(f(x, w)))
