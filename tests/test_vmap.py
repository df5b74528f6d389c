"""mx.vmap: every batching rule against a Python loop over the mapped axis (the function run
on each slice, the results stacked), hypothesis over shapes / in_axes / out_axes / dtypes,
MLX's own errors and results, the compositions with grad / jvp / compile / vmap, and
per-example gradients of a small model against ``jax.vmap(jax.grad)``.

A batched graph must not loop: its primitives are the same, one node each, whatever the
batch size (``_names`` of batch 2 and batch 3 are compared)."""

from __future__ import annotations

import collections

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tapescope
import tapescope.core as mx
from conftest import mlx_ref, requires_mlx
from mlx_compare import primitive_names, same_error
from tapescope.kernels import primitives


# -- inputs --------------------------------------------------------------------------------------
def normal(rng, shape):
    return rng.normal(size=shape).astype(np.float32)


def pos(rng, shape):
    return rng.uniform(0.5, 2.0, size=shape).astype(np.float32)


def unit(rng, shape):
    return rng.uniform(-0.9, 0.9, size=shape).astype(np.float32)


def gt1(rng, shape):
    return rng.uniform(1.1, 3.0, size=shape).astype(np.float32)


def ints(rng, shape):
    return rng.integers(-6, 7, size=shape).astype(np.int32)


def small_uint(rng, shape):
    return rng.integers(0, 5, size=shape).astype(np.uint32)


def nonzero_int(rng, shape):
    v = rng.integers(1, 7, size=shape) * rng.choice([-1, 1], size=shape)
    return v.astype(np.int32)


def bools(rng, shape):
    return rng.integers(0, 2, size=shape).astype(np.bool_)


def cplx(rng, shape):
    return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)


def spd(rng, shape):
    a = rng.normal(size=shape).astype(np.float32)
    return (a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1], dtype=np.float32))


def sym(rng, shape):
    a = rng.normal(size=shape).astype(np.float32)
    return a + np.swapaxes(a, -1, -2)


def with_nan(rng, shape):
    a = rng.normal(size=shape).astype(np.float32)
    a.flat[::3] = np.nan
    return a


def keys(rng, shape):
    return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)


def sorted_seq(rng, shape):
    return np.sort(rng.normal(size=shape).astype(np.float32))


_I = mx.array([2, 0, 1])  # index arrays the cases close over (unmapped)
_SEQ = mx.array([-1.0, 0.0, 0.5, 2.0])

UNARY = {
    "Negative": (mx.negative, normal), "Sqrt": (mx.sqrt, pos), "Exp": (mx.exp, normal),
    "Expm1": (mx.expm1, normal), "Log": (mx.log, pos), "Log1p": (mx.log1p, pos),
    "Log2": (mx.log2, pos), "Log10": (mx.log10, pos), "Sin": (mx.sin, normal),
    "Cos": (mx.cos, normal), "Tan": (mx.tan, unit), "ArcSin": (mx.arcsin, unit),
    "ArcCos": (mx.arccos, unit), "ArcTan": (mx.arctan, normal), "Sinh": (mx.sinh, normal),
    "Cosh": (mx.cosh, normal), "Tanh": (mx.tanh, normal), "ArcSinh": (mx.arcsinh, normal),
    "ArcCosh": (mx.arccosh, gt1), "ArcTanh": (mx.arctanh, unit),
    "Conjugate": (mx.conjugate, cplx), "BitwiseInvert": (mx.bitwise_invert, ints),
    "LogicalNot": (mx.logical_not, bools), "Abs": (mx.abs, normal), "Sign": (mx.sign, normal),
    "Rsqrt": (mx.rsqrt, pos), "Square": (mx.square, normal), "Floor": (mx.floor, normal),
    "Ceil": (mx.ceil, normal), "Round": (mx.round, normal), "Sigmoid": (mx.sigmoid, normal),
    "Real": (mx.real, cplx), "Imag": (mx.imag, cplx), "StopGradient": (mx.stop_gradient, normal),
    "Erf": (mx.erf, normal), "ErfInv": (mx.erfinv, unit),
}
BINARY = {
    "Add": (mx.add, normal, normal), "Multiply": (mx.multiply, normal, normal),
    "Divide": (mx.divide, normal, pos), "Equal": (mx.equal, ints, ints),
    "NotEqual": (mx.not_equal, ints, ints), "Less": (mx.less, normal, normal),
    "LessEqual": (mx.less_equal, ints, ints), "Greater": (mx.greater, normal, normal),
    "GreaterEqual": (mx.greater_equal, ints, ints),
    "LogicalAnd": (mx.logical_and, bools, bools), "LogicalOr": (mx.logical_or, bools, bools),
    "ArcTan2": (mx.arctan2, normal, normal), "BitwiseAnd": (mx.bitwise_and, ints, ints),
    "BitwiseOr": (mx.bitwise_or, ints, ints), "BitwiseXor": (mx.bitwise_xor, ints, ints),
    "Maximum": (mx.maximum, normal, normal), "Minimum": (mx.minimum, normal, normal),
    "Subtract": (mx.subtract, normal, normal),
    "NaNEqual": (lambda a, b: mx.array_equal(a, b, equal_nan=True), with_nan, with_nan),
    "FloorDivide": (mx.floor_divide, ints, nonzero_int),
    "Remainder": (mx.remainder, ints, nonzero_int), "Power": (mx.power, pos, normal),
    "LogAddExp": (mx.logaddexp, normal, normal),
    "LeftShift": (mx.left_shift, small_uint, small_uint),
    "RightShift": (mx.right_shift, small_uint, small_uint),
}


def _cases() -> list:
    """(id, function, [(generator, unbatched shape)], in_axes, out_axes)."""
    c = []
    for name, (f, gen) in UNARY.items():
        c.append((name, f, [(gen, (3, 4))], 0, 0))
    for name, (f, ga, gb) in BINARY.items():
        c.append((name, f, [(ga, (3, 4)), (gb, (3, 4))], (0, 1), 0))
        c.append((name + "-unmapped-bcast", f, [(ga, (3, 4)), (gb, (4,))], (1, None), -1))
    c += [
        ("DivMod", lambda a, b: mx.divmod(a, b), [(ints, (3, 4)), (nonzero_int, (4,))],
         (1, 0), [0, 1]),
        ("Select", lambda c_, a, b: mx.where(c_, a, b),
         [(bools, (3, 4)), (normal, (3, 4)), (normal, (4,))], (0, 2, None), 0),
        ("Select-cond-only", lambda c_: mx.where(c_, 1.0, -1.0), [(bools, (3,))], 0, 0),
        ("AsType", lambda a: a.astype(mx.int16), [(normal, (3, 4))], 1, 0),
        ("Reshape", lambda a: mx.reshape(a, (2, 6)), [(normal, (3, 4))], 1, 0),
        ("ExpandDims", lambda a: mx.expand_dims(a, (0, 2)), [(normal, (3, 4))], 1, 2),
        ("Squeeze", lambda a: mx.squeeze(a, 1), [(normal, (3, 1, 4))], 2, 0),
        ("Flatten", lambda a: mx.flatten(a, 1, 2), [(normal, (2, 3, 4))], 2, 0),
        ("Flatten-outside", lambda a: mx.flatten(a, 0, 1), [(normal, (2, 3, 4))], 3, 1),
        ("Unflatten", lambda a: mx.unflatten(a, 1, (2, 2)), [(normal, (3, 4))], 2, 0),
        ("Transpose", lambda a: mx.transpose(a, (2, 0, 1)), [(normal, (2, 3, 4))], 1, -1),
        ("Broadcast", lambda a: mx.broadcast_to(a, (2, 3, 4)), [(normal, (3, 1))], 1, 0),
        ("Concatenate", lambda a, b: mx.concatenate([a, b, a], axis=1),
         [(normal, (3, 4)), (normal, (3, 2))], (1, 0), 0),
        ("Concatenate-unmapped", lambda a, b: mx.concatenate([b, a], axis=0),
         [(normal, (3, 4)), (normal, (2, 4))], (0, None), 2),
        ("Split", lambda a: mx.split(a, [1, 3], axis=1), [(normal, (3, 4))], 1, 0),
        ("Pad", lambda a: mx.pad(a, ((1, 0), (0, 2)), constant_values=3.0),
         [(normal, (3, 4))], 1, 0),
        ("Contiguous", lambda a: mx.contiguous(mx.transpose(a)), [(normal, (3, 4))], 1, 0),
        # MLX's fast primitives: a mapped x stays one primitive, the VJPs through a batched vjp
        ("RMSNorm", lambda x, w: mx.fast.rms_norm(x, w, 1e-5), [(normal, (3, 8)), (normal, (8,))],
         (0, None), 0),
        ("LayerNorm", lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5),
         [(normal, (3, 8)), (normal, (8,)), (normal, (8,))], (1, None, None), 0),
        ("RMSNormVJP", lambda x, w, c: list(mx.vjp(lambda a, b: mx.fast.rms_norm(a, b, 1e-5),
                                                    [x, w], [c])[1]),
         [(normal, (3, 8)), (normal, (8,)), (normal, (3, 8))], (0, None, 0), [0, 0]),
        ("LayerNormVJP", lambda x, w, b, c: list(mx.vjp(
            lambda p, q, r: mx.fast.layer_norm(p, q, r, 1e-5), [x, w, b], [c])[1]),
         [(normal, (3, 8)), (normal, (8,)), (normal, (8,)), (normal, (3, 8))], (0, None, None, 0),
         [0, 0, 0]),
        ("RoPE", lambda x: mx.fast.rope(x, 8, traditional=False, base=10000.0, scale=1.0, offset=2),
         [(normal, (2, 5, 8))], 0, 0),
        ("ScaledDotProductAttention", lambda q, k, v: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=0.3, mask="causal"),
         [(normal, (1, 2, 4, 8)), (normal, (1, 1, 5, 8)), (normal, (1, 1, 5, 8))],
         (0, 1, 4), 0),
        ("NumberOfElements", mx.compile(lambda a: mx.var(a, axis=(0, 1), ddof=1), shapeless=True),
         [(normal, (3, 4))], 1, 0),  # a shapeless mean / var counts with NumberOfElements
        ("View", lambda a: a.view(mx.int32), [(normal, (3, 4))], 1, 0),
        ("View-last-axis", lambda a: a.view(mx.uint8), [(normal, (3, 4))], 2, 0),
        ("Full", lambda a: mx.full((3, 2), a), [(normal, ())], 0, 0),
        ("Sum", lambda a: mx.sum(a, axis=1), [(normal, (3, 4))], 1, 0),
        ("Prod", lambda a: mx.prod(a, axis=(0, 2), keepdims=True), [(pos, (2, 3, 4))], 2, 0),
        ("Max", lambda a: mx.max(a, axis=0), [(normal, (3, 4))], 0, 0),
        ("Min", lambda a: mx.min(a), [(normal, (3, 4))], 2, 0),
        ("And", lambda a: mx.all(a, axis=1), [(bools, (3, 4))], 1, 0),
        ("Or", lambda a: mx.any(a, axis=0), [(bools, (3, 4))], 0, 0),
        ("ArgReduce", lambda a: mx.argmax(a, axis=1), [(normal, (3, 4))], 1, 0),
        ("ArgReduce-min", lambda a: mx.argmin(a, axis=0), [(normal, (3, 4))], 0, 0),
        ("LogSumExp", lambda a: mx.logsumexp(a, axis=-1), [(normal, (3, 4))], 2, 0),
        ("LogSumExp-first", lambda a: mx.logsumexp(a, axis=-1), [(normal, (3, 4))], 0, 0),
        ("Softmax", lambda a: mx.softmax(a, axis=-1), [(normal, (3, 4))], 2, 0),
        ("Softmax-first", lambda a: mx.softmax(a, axis=-1, precise=True), [(normal, (3, 4))],
         0, 0),
        ("CumSum", lambda a: mx.cumsum(a, axis=1), [(normal, (3, 4))], 1, 0),
        ("CumProd", lambda a: mx.cumprod(a, axis=0, reverse=True), [(pos, (3, 4))], 0, 0),
        ("CumMax", lambda a: mx.cummax(a, axis=1, inclusive=False), [(normal, (3, 4))], 2, 0),
        ("CumMin", lambda a: mx.cummin(a, axis=0), [(normal, (3, 4))], 1, 0),
        ("CumLogAddExp", lambda a: mx.logcumsumexp(a, axis=1), [(normal, (3, 4))], 0, 0),
        ("Sort", lambda a: mx.sort(a, axis=0), [(normal, (3, 4))], 1, 0),
        ("ArgSort", lambda a: mx.argsort(a, axis=-1), [(normal, (3, 4))], 2, 0),
        ("Partition", lambda a: mx.partition(a, 1, axis=-1), [(normal, (3, 4))], 0, 0),
        ("ArgPartition", lambda a: mx.argpartition(a, 2, axis=0), [(normal, (3, 4))], 1, 0),
        ("SearchSorted", lambda v: mx.searchsorted(_SEQ, v, side="right"), [(normal, (3,))],
         0, 0),
        ("Matmul", lambda a, b: a @ b, [(normal, (3, 4)), (normal, (4, 2))], (1, 0), 0),
        ("Matmul-unmapped", lambda a, b: a @ b, [(normal, (2, 3, 4)), (normal, (4, 2))],
         (None, 1), 0),
        ("Matmul-vector", lambda a, b: a @ b, [(normal, (4,)), (normal, (4, 3))], (0, 2), 1),
        ("AddMM", lambda c_, a, b: mx.addmm(c_, a, b, alpha=0.5, beta=2.0),
         [(normal, (3, 2)), (normal, (3, 4)), (normal, (4, 2))], (0, None, 2), 0),
        ("Slice", lambda a: a[1:3, ::2], [(normal, (3, 4))], 1, 0),
        ("SliceUpdate", lambda a, u: a.at[1:3, 1].add(u), [(normal, (3, 4)), (normal, (2,))],
         (1, 0), 0),
        ("SliceUpdate-setitem", _set_rows, [(normal, (3, 4)), (normal, (4,))], (0, None), 0),
        ("SliceUpdate-setitem-on-the-argument", _set_arg, [(normal, (3, 4))], 1, 0),
        ("SliceUpdate-src-unmapped", lambda a, u: a.at[0:2].add(u),
         [(normal, (3, 4)), (normal, (2, 4))], (None, 2), 0),
        ("DynamicSlice", lambda a: mx.slice(a, mx.array([1]), [1], [3, 2]),
         [(normal, (3, 4))], 1, 0),
        ("DynamicSliceUpdate", lambda a, u: mx.slice_update(a, u, mx.array([1, 2]), [0, 1]),
         [(normal, (3, 4)), (normal, (2, 2))], (2, 0), 0),
        ("DynamicSliceUpdate-upd-unmapped",
         lambda a, u: mx.slice_update(a, u, mx.array([0]), [0]),
         [(normal, (3, 4)), (normal, (1, 4))], (0, None), 0),
        ("Gather-src", lambda a: a[_I], [(normal, (3, 4))], 1, 0),
        ("Gather-idx", lambda i: mx.arange(12.0).reshape(3, 4)[i, 1:],
         [(lambda r, s: r.integers(0, 3, size=s).astype(np.int32), (2,))], 0, 0),
        ("Gather-both", lambda a, i: a[i, mx.array([0, 3])],
         [(normal, (3, 4)), (lambda r, s: r.integers(0, 3, size=s).astype(np.int32), (2,))],
         (2, 0), 0),
        ("Scatter-both", lambda a, i, u: a.at[i].add(u),
         [(normal, (3, 4)), (lambda r, s: r.integers(0, 3, size=s).astype(np.int32), (2,)),
          (normal, (2, 4))], (1, 0, 0), 0),
        ("Scatter-src", lambda a: a.at[_I].multiply(2.0), [(normal, (3, 4))], 1, 0),
        ("Scatter-idx", lambda i: mx.zeros((3, 4)).at[i].add(1.0),
         [(lambda r, s: r.integers(0, 3, size=s).astype(np.int32), (2,))], 0, 0),
        ("Scatter-upd", lambda u: mx.zeros((3, 4)).at[_I, 1].maximum(u), [(normal, (3,))], 0, 0),
        ("GatherAxis", lambda a, i: mx.take_along_axis(a, i, axis=1),
         [(normal, (3, 4)), (lambda r, s: r.integers(0, 4, size=s).astype(np.int32), (3, 2))],
         (1, 0), 0),
        ("GatherAxis-idx-unmapped", lambda a: mx.take_along_axis(a, mx.array([[1], [0], [3]]), 1),
         [(normal, (3, 4))], 0, 0),
        ("ScatterAxis", lambda a, i: mx.put_along_axis(a, i, mx.array(5.0), axis=0),
         [(normal, (3, 4)), (lambda r, s: r.integers(0, 3, size=s).astype(np.int32), (1, 4))],
         (None, 1), 0),
        ("MaskedScatter", lambda a, m: _masked(a, m), [(normal, (3, 4)), (bools, (3, 4))],
         (1, 0), 0),
        ("MaskedScatter-source-mapped", _masked_src, [(normal, (3, 4)), (normal, (12,))],
         (None, 0), 0),
        ("FFT", lambda a: mx.fft.fft(a, axis=0), [(cplx, (4, 3))], 1, 0),
        ("FFT-real", lambda a: mx.fft.rfft2(a), [(normal, (4, 6))], 2, 0),
        ("FFT-irfft", lambda a: mx.fft.irfft(a, n=6), [(cplx, (2, 4))], 0, 0),
        ("Hadamard", lambda a: mx.hadamard_transform(a), [(normal, (3, 4))], 2, 0),
        ("Hadamard-first", lambda a: mx.hadamard_transform(a, scale=0.5), [(normal, (3, 4))],
         0, 0),
        ("Quantize", lambda a: list(mx.quantize(a, 32, 3)), [(normal, (3, 64))], 1, 0),
        ("Convolution-input", lambda a, w: mx.conv1d(a, w, stride=2, padding=1),
         [(normal, (2, 7, 4)), (normal, (3, 3, 4))], (1, None), 0),
        ("Convolution-weight", lambda a, w: mx.conv_general(a, w, groups=2, flip=True),
         [(normal, (2, 5, 5, 4)), (normal, (4, 2, 3, 2))], (None, 2), 1),
        ("Convolution-both", lambda a, w: mx.conv2d(a, w, padding=(1, 0), groups=2),
         [(normal, (2, 5, 5, 4)), (normal, (4, 2, 3, 2))], (0, 0), 0),
        ("Inverse", lambda a: mx.linalg.inv(a, stream=mx.cpu), [(spd, (3, 3))], 2, 0),
        ("Cholesky", lambda a: mx.linalg.cholesky(a, stream=mx.cpu), [(spd, (3, 3))], 1, 0),
        ("SVD", lambda a: mx.linalg.svd(a, compute_uv=False, stream=mx.cpu), [(normal, (3, 2))],
         2, 0),
        ("Eigh", lambda a: mx.linalg.eigvalsh(a, stream=mx.cpu), [(sym, (3, 3))], 1, 0),
        ("Eig", lambda a: mx.linalg.eigvals(a, stream=mx.cpu), [(sym, (3, 3))], 0, 0),
        ("RandomBits", lambda k: mx.random.uniform(shape=(2, 3), key=k), [(keys, (2,))], 0, 0),
        ("RandomBits-key-last", lambda k: mx.random.randint(0, 9, (3,), key=k), [(keys, (2,))],
         1, 0),
        ("Compiled", mx.compile(lambda a, b: mx.exp(a) * b + 1.0),
         [(normal, (3, 4)), (normal, (4,))], (1, None), 0),
        ("Copy-of-grad", mx.grad(lambda a: mx.sum(mx.sin(a) * a)), [(normal, (3, 4))], 1, 0),
        ("ScatterAxis-sum-of-grad",
         mx.grad(lambda a: mx.sum(mx.take_along_axis(a, mx.array([[1, 1]]), 1) ** 2)),
         [(normal, (1, 4))], 0, 0),
        ("CustomTransforms-default", _custom_plain, [(normal, (3,))], 0, 0),
        ("CustomTransforms-rule", _custom_rule, [(normal, (3,)), (normal, (3,))], (0, None), 0),
    ]
    return c


def _masked(a, m):
    a = mx.array(a)
    a[m] = mx.arange(12.0)
    return a


def _set_rows(a, u):
    a = mx.array(a)
    a[1:3] = u
    return a


def _set_arg(a):
    a[1] = 0.0  # the argument's handle gets a new graph: that graph is what is batched
    return a


def _masked_src(a, v):
    a = mx.array(a)
    a[a > 0] = v
    return a


@mx.custom_function
def _custom_plain(a):
    return mx.sin(a) * 2.0


@_custom_plain.vjp
def _(a, cot, out):
    return cot * 3.0


@mx.custom_function
def _custom_rule(a, b):
    return a * b


@_custom_rule.vmap
def _(inputs, axes):  # the batched rule: the same product, the axis where the input had it
    a, b = inputs
    ax = axes[0] if axes[0] is not None else axes[1]
    if axes[0] is not None and axes[1] is None:
        b = mx.expand_dims(b, ax)
    return a * b, ax


CASES = _cases()


def _batched(rng, specs, in_axes, size):
    """Inputs with a mapped axis of ``size`` inserted at each input's in_axis."""
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(specs)
    out = []
    for (gen, shape), ax in zip(specs, axes):
        if ax is None:
            out.append(gen(rng, shape))
        else:
            out.append(np.moveaxis(gen(rng, (size,) + tuple(shape)), 0, ax))
    return out, axes


def _flat(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _loop(f, xs, axes, size, out_axes):
    """The reference: ``f`` on each slice of the mapped axes, results stacked at out_axes."""
    per = []
    for i in range(size):
        args = [mx.array(x if a is None else np.take(x, i, axis=a)) for x, a in zip(xs, axes)]
        per.append([np.array(o) for o in _flat(f(*args))])
    oax = out_axes if isinstance(out_axes, (tuple, list)) else (out_axes,) * len(per[0])
    return [np.stack([p[k] for p in per], axis=oax[k]) for k in range(len(per[0]))]


def _names(outs) -> collections.Counter:
    return collections.Counter(primitive_names(*outs))


def _assert_close(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


RECORDED: collections.Counter = collections.Counter()  # what the batched graphs recorded
RAN: set = set()  # the cases that passed in this process


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_batching_rule_matches_a_loop_over_the_mapped_axis(case):
    name, f, specs, in_axes, out_axes = case
    rng = np.random.default_rng(0)
    graphs = []
    for size in (2, 3):
        xs, axes = _batched(rng, specs, in_axes, size)
        outs = _flat(mx.vmap(f, in_axes=in_axes, out_axes=out_axes)(*[mx.array(x) for x in xs]))
        graphs.append(_names(outs))
        want = _loop(f, xs, axes, size, out_axes)
        assert len(outs) == len(want)
        for o, w in zip(outs, want):
            _assert_close(np.array(o), w)
    # no Python loop: the same primitives, as many of each, for batch 2 and batch 3
    assert graphs[0] == graphs[1]
    RECORDED.update(graphs[0])
    RAN.add(name)


def test_every_batching_rule_is_exercised():
    """Runs after the loop tests (same module): each rule recorded its primitive."""
    if RAN != {c[0] for c in CASES}:  # some ran elsewhere (split over xdist workers) or not at all
        pytest.skip("run with every loop test, in one process (`--dist loadfile` under xdist)")
    ruled = {n for n, d in primitives.REGISTRY.items() if d.vmap is not None}
    # batched as other primitives: MaskedScatter (per-slice sources: CumSum, GatherAxis,
    # Select), Compiled (replayed as the ops it fused), CustomTransforms (its vmap rule's ops),
    # Quantize, RMSNormVJP, LayerNormVJP (MLX's fallback compositions, batched: the cases
    # above run their rules);
    # the collectives batch only in a group of several processes (tests/mpi_worker.py)
    assert ruled - set(RECORDED) == {"MaskedScatter", "Compiled", "CustomTransforms",
                                     "Quantize", "RMSNormVJP", "LayerNormVJP",
                                     "AllReduce", "AllGather", "Send"}


# -- hypothesis: shapes, in_axes, out_axes, dtypes ------------------------------------------------
_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32}


@st.composite
def _mapped(draw):
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd)))
    size = draw(st.integers(1, 4))
    ax = draw(st.integers(-nd - 1, nd))
    out_ax = draw(st.integers(-nd - 1, nd))
    dtype = draw(st.sampled_from(sorted(_DTYPES)))
    b_mapped = draw(st.booleans())
    b_tail = draw(st.integers(0, nd))  # b broadcasts: a's trailing axes
    return shape, size, ax, out_ax, dtype, b_mapped, b_tail


_FUNS = {
    "binary": lambda a, b: a * b + a,
    "reduce": lambda a, b: mx.sum(a * b, axis=-1),
    "cumsum": lambda a, b: mx.cumsum(a, axis=0) - b,
    "transpose": lambda a, b: mx.transpose(a) + mx.max(b),
}


@settings(max_examples=30)
@given(_mapped(), st.sampled_from(sorted(_FUNS)))
def test_vmap_matches_loop_over_shapes_axes_dtypes(draw, fun):
    shape, size, ax, out_ax, dtype, b_mapped, b_tail = draw
    f = _FUNS[fun]
    rng = np.random.default_rng(1)
    nd = len(shape)
    np_dt = _DTYPES[dtype]
    a = np.moveaxis(rng.integers(-3, 4, size=(size,) + shape), 0, ax % (nd + 1)).astype(np_dt)
    b_shape = shape[nd - b_tail:]
    b = rng.integers(-3, 4, size=((size,) if b_mapped else ()) + b_shape).astype(np_dt)
    out_ax_fn = out_ax
    if fun == "reduce":
        out_ax_fn = out_ax % nd if nd > 0 else 0  # one axis fewer in the output
        out_ax_fn = min(out_ax_fn, nd - 1)
    in_axes = (ax, 0 if b_mapped else None)
    got = mx.vmap(f, in_axes=in_axes, out_axes=out_ax_fn)(mx.array(a), mx.array(b))
    out_nd = got.ndim
    want = _loop(f, [a, b], (ax % (nd + 1), 0 if b_mapped else None), size,
                 out_ax_fn % out_nd)[0]
    assert got.dtype == mx.array(want).dtype or np.array(got).dtype == want.dtype
    _assert_close(np.array(got), want)


_AXIS_OPS = {
    "sum": lambda a, k: mx.sum(a, axis=k),
    "max": lambda a, k: mx.max(a, axis=k, keepdims=True),
    "argmin": lambda a, k: mx.argmin(a, axis=k),
    "cumsum": lambda a, k: mx.cumsum(a, axis=k, reverse=True),
    "sort": lambda a, k: mx.sort(a, axis=k),
    "argsort": lambda a, k: mx.argsort(a, axis=k),
    "softmax": lambda a, k: mx.softmax(a, axis=k),
    "logsumexp": lambda a, k: mx.logsumexp(a, axis=k),
    "expand_dims": lambda a, k: mx.expand_dims(a, k),
    "concatenate": lambda a, k: mx.concatenate([a, a * 2], axis=k),
    "flatten": lambda a, k: mx.flatten(a, start_axis=k),
    "moveaxis": lambda a, k: mx.moveaxis(a, k, 0),
    "slice": lambda a, k: mx.take(a, mx.array([0, 0]), axis=k),
    "take_along": lambda a, k: mx.take_along_axis(a, mx.zeros_like(a).astype(mx.int32), axis=k),
}


@settings(max_examples=40)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.integers(1, 3),
       st.sampled_from(sorted(_AXIS_OPS)), st.data())
def test_axis_ops_match_loop_for_any_mapped_and_op_axis(shape, size, op, data):
    """The ops whose rules shift an axis past the mapped one, over every pair of axes."""
    nd = len(shape)
    ax = data.draw(st.integers(-nd - 1, nd), "in_axis")
    k = data.draw(st.integers(-nd, nd - 1), "op_axis")
    f = lambda a: _AXIS_OPS[op](a, k)  # noqa: E731
    rng = np.random.default_rng(5)
    x = np.moveaxis(rng.normal(size=(size,) + tuple(shape)).astype(np.float32), 0, ax % (nd + 1))
    got = mx.vmap(f, in_axes=ax)(mx.array(x))
    _assert_close(np.array(got), _loop(f, [x], (ax % (nd + 1),), size, 0)[0])


# -- MLX's API: results, errors ------------------------------------------------------------------
_X = "M.arange(6, dtype=M.float32).reshape(3, 2)"
_API = [
    "M.vmap(lambda x: x * 2, in_axes=-1)({X})",
    "M.vmap(lambda x, y: x + y, in_axes=(0, None))({X}, M.ones(2))",
    "M.vmap(lambda d: d['a'] + d['b'], in_axes={{'a': 0, 'b': None}})"
    "({{'a': {X}, 'b': M.ones(2)}})",
    "M.vmap(lambda l: l[0] + l[1], in_axes=[0, 1])([{X}, M.ones((2, 3))])",
    "M.vmap(lambda x: (x, x * 2), out_axes=(0, 1))({X})[1]",
    "M.vmap(lambda x: {{'u': x, 'v': x}}, out_axes={{'u': 1, 'v': 0}})({X})['u']",
    "M.vmap(lambda x: M.ones((4, 5)), out_axes=-1)({X})",
    "M.vmap(lambda x, y: y, in_axes=(0, None))({X}, M.ones(4))",
    "M.vmap(lambda x: x.sum())({X})",
    "M.vmap(lambda x: x, in_axes=(0,), out_axes=(1,))({X})",
    "M.vmap(lambda x: x, in_axes=True)({X})",
]
_ERRORS = [
    "M.vmap(lambda x: x, out_axes=2)({X})",
    "M.vmap(lambda x: x, out_axes=-3)({X})",
    "M.vmap(lambda x: x, in_axes=2)({X})",
    "M.vmap(lambda x: x)(M.array(1.0))",
    "M.vmap(lambda x, y: x + y)({X}, M.ones((2, 3)))",
    "M.vmap(lambda x, y: x + y, in_axes=[0, None])({X}, M.ones(2))",
    "M.vmap(lambda x, y: x + y, in_axes=(0, 0, 0))({X}, {X})",
    "M.vmap(lambda x: x, in_axes='a')({X})",
    "M.vmap(lambda x: x, in_axes=1.0)({X})",
    "M.vmap(lambda x, n: x * n)({X}, 2)",
    "M.vmap(lambda x: (x, 2))({X})",
    "M.vmap(lambda d: d['a'], in_axes={{'a': 0, 'b': 1}})({{'a': {X}}})",
    "M.vmap(lambda d: d['a'], in_axes={{'b': 0}})({{'a': {X}}})",
    "M.vmap(lambda a, b: a + b, in_axes=(0, (0,)))({X}, {X})",
    "M.vmap(lambda x: x, in_axes=[0])({X})",
    "M.vmap(lambda x: x, in_axes=2 ** 40)({X})",
    "M.vmap(lambda: M.ones(3))()",
    "M.vmap(lambda x, y: x, in_axes=(None, None))({X}, {X})",
    "M.vmap(lambda x: x)(x={X})",
    "M.vmap(lambda x: x, out_axes=None)({X})",
    "M.vmap(lambda x: x, None)({X})",
    "M.vmap(3)",
    "M.vmap(lambda x: (x.sum(), x), out_axes=(None, 0))({X})",
    "M.vmap(lambda x: x * x.sum().item())({X})",
    "M.vmap(lambda x: None)({X})",
]


@requires_mlx
@pytest.mark.parametrize("src", _API)
def test_vmap_api_matches_mlx(src):
    code = src.format(X=_X)
    got = eval(code, {"M": mx})
    want = eval(code, {"M": mlx_ref})
    assert got.shape == want.shape and got.dtype.name == str(want.dtype).split(".")[-1]
    np.testing.assert_array_equal(np.array(got), np.array(want))


@pytest.mark.parametrize("src", _ERRORS)
def test_vmap_errors_match_mlx(src):
    same_error(lambda M: eval(src.format(X=_X), {"M": M}))


@pytest.mark.parametrize("src", [
    "M.vmap(lambda s: M.searchsorted(s, M.array(0.5)))(M.ones((2, 3)))",
    "M.vmap(lambda v: M.pad(M.ones(3), 1, constant_values=v))(M.ones(2))",
    "M.vmap(lambda s: M.slice(M.ones(4), s, [0], [2]))(M.array([[0], [1]]))",
    "M.vmap(lambda s: M.slice_update(M.ones(4), M.ones(2), s, [0]))(M.array([[0], [1]]))",
])
def test_batching_rule_errors_match_mlx(src):
    same_error(lambda M: eval(src, {"M": M}))


# -- custom_function.vmap ------------------------------------------------------------------------
def _custom_case(M):
    @M.custom_function
    def f(a, b):
        return a * b, a + b

    @f.vmap
    def f_vmap(inputs, axes):
        a, b = inputs
        return (a * b + 100, a + b), (axes[0], None)  # None: MLX moves axis -1 to out_axes

    def g(a, b):  # an op after the unmapped output: batched as the node it was
        u, v = f(a, b)
        return u, v, v * 2

    return M.vmap(g, in_axes=(0, None))(M.arange(6.0).reshape(3, 2), M.ones(2))


@requires_mlx
def test_custom_function_vmap_matches_mlx():
    got, want = _custom_case(mx), _custom_case(mlx_ref)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_array_equal(np.array(g), np.array(w))


@pytest.mark.parametrize("ret", ["a * 3", "(a * 3, ax, 1)"])
def test_custom_vmap_must_return_two_items(ret):
    def case(M):
        @M.custom_function
        def g(a):
            return a * 2

        @g.vmap
        def g_vmap(a, ax):
            return eval(ret, {"a": a, "ax": ax})

        return M.vmap(g)(M.ones((3, 2)))

    same_error(case)


def test_custom_vmap_refuses_keyword_arguments():
    def case(M):
        @M.custom_function
        def h(a, b):
            return a * b

        @h.vmap
        def h_vmap(inputs, axes):
            return inputs[0], axes[0]

        return M.vmap(lambda a: h(a, b=a))(M.ones((3, 2)))

    same_error(case)


# -- compositions --------------------------------------------------------------------------------
def _f(w, x):
    return mx.sum(mx.tanh(x @ w) ** 2)


def test_vmap_of_grad_and_grad_of_vmap():
    rng = np.random.default_rng(2)
    w, x = mx.array(normal(rng, (3, 2))), mx.array(normal(rng, (5, 3)))
    per = mx.vmap(mx.grad(_f), in_axes=(None, 0))(w, x)
    loop = np.stack([np.array(mx.grad(_f)(w, x[i])) for i in range(5)])
    np.testing.assert_allclose(np.array(per), loop, rtol=1e-5, atol=1e-6)
    total = mx.grad(lambda w: mx.vmap(_f, in_axes=(None, 0))(w, x).sum())(w)
    np.testing.assert_allclose(np.array(total), loop.sum(0), rtol=1e-5, atol=1e-5)


def test_vmap_of_vmap_and_compositions_with_compile_and_jvp():
    rng = np.random.default_rng(3)
    x = normal(rng, (4, 3, 2))
    f = lambda a: mx.sin(a) * mx.cumsum(a) + mx.max(a)  # noqa: E731
    want = np.stack([np.stack([np.array(f(mx.array(x[i, :, j]))) for j in range(2)], 1)
                     for i in range(4)])
    vv = mx.vmap(mx.vmap(f, in_axes=1, out_axes=1))
    _assert_close(np.array(vv(mx.array(x))), want)
    _assert_close(np.array(mx.compile(vv)(mx.array(x))), want)
    _assert_close(np.array(mx.vmap(mx.vmap(mx.compile(f), in_axes=1, out_axes=1))(mx.array(x))),
                  want)
    # jvp of a vmapped function: the loop of jvps
    t = normal(rng, (4, 3, 2))
    g = lambda a: mx.sin(a) * a  # noqa: E731
    _, tans = mx.jvp(mx.vmap(g), [mx.array(x)], [mx.array(t)])
    loop = np.stack([np.array(mx.jvp(g, [mx.array(x[i])], [mx.array(t[i])])[1][0])
                     for i in range(4)])
    np.testing.assert_allclose(np.array(tans[0]), loop, rtol=1e-6, atol=1e-6)
    tans2 = mx.vmap(lambda a, ta: mx.jvp(g, [a], [ta])[1][0])(mx.array(x), mx.array(t))
    np.testing.assert_allclose(np.array(tans2), loop, rtol=1e-6, atol=1e-6)


def test_compile_of_vmap_fuses_the_batched_graph():
    f = mx.compile(mx.vmap(lambda a, b: mx.exp(a) * b + a, in_axes=(0, None)))
    a, b = mx.ones((5, 3)), mx.arange(3.0)
    want = np.broadcast_to(np.e * np.arange(3.0) + 1, (5, 3))
    np.testing.assert_allclose(np.array(f(a, b)), want, rtol=1e-6)
    g = tapescope.trace(mx.vmap(lambda a, b: mx.exp(a) * b + a, in_axes=(0, None)), a, b)
    assert g.kernels, "the batched elementwise chain fused into a kernel"


# -- per-example gradients of a small model against JAX -------------------------------------------
def test_per_example_gradients_match_jax():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(4)
    params = {"w1": normal(rng, (4, 8)), "b1": normal(rng, (8,)), "w2": normal(rng, (8, 3))}
    xs, ys = normal(rng, (6, 4)), rng.integers(0, 3, size=(6,)).astype(np.int32)

    def loss(p, x, y, m):
        h = m.tanh(x @ p["w1"] + p["b1"])
        logits = h @ p["w2"]
        lse = m.log(m.sum(m.exp(logits - m.max(logits)))) + m.max(logits)
        return lse - logits[y]

    got = mx.vmap(mx.grad(lambda p, x, y: loss(p, x, y, mx)), in_axes=(None, 0, 0))(
        {k: mx.array(v) for k, v in params.items()}, mx.array(xs), mx.array(ys))
    want = jax.vmap(jax.grad(lambda p, x, y: loss(p, x, y, jnp)), in_axes=(None, 0, 0))(
        params, xs, ys)
    for k in params:
        assert got[k].shape == (6,) + params[k].shape
        np.testing.assert_allclose(np.array(got[k]), np.array(want[k]), rtol=2e-5, atol=2e-6)


# -- the graph a vmapped function records ---------------------------------------------------------
def test_trace_of_vmap_shows_batched_primitives_not_a_loop():
    f = mx.vmap(lambda a: mx.sum(mx.exp(a) @ a.T, axis=0))
    for size in (3, 7):
        g = tapescope.trace(f, mx.ones((size, 2, 4)), compile=False)
        assert [op.primitive for op in g.ops] == ["Exp", "Transpose", "Matmul", "Sum", "Squeeze"]
        matmul = next(op for op in g.ops if op.primitive == "Matmul")
        assert g.values[matmul.outputs[0]].shape == (size, 2, 2)


def test_check_of_a_vmapped_function_passes_against_jax():
    """``tapescope.check`` runs the batched graph under its JAX rules (every node)."""
    pytest.importorskip("jax")
    rng = np.random.default_rng(6)
    w, x = mx.array(normal(rng, (4, 2))), mx.array(normal(rng, (5, 3, 4)))
    r = tapescope.check(mx.vmap(mx.grad(lambda w, x: mx.sum(mx.tanh(x @ w) ** 2)),
                                in_axes=(None, 0)), w, x, every_node=True)
    assert r.passed, repr(r)
    r = tapescope.check(mx.vmap(lambda a: mx.cumsum(mx.sort(a, axis=0), axis=1)[_I[:2]],
                                in_axes=1), x, every_node=True)
    assert r.passed, repr(r)


_ONE_INPUT = [c for c in CASES if len(c[2]) == 1 and isinstance(c[3], int)
              and not isinstance(c[1], mx.custom_function)]


@pytest.mark.parametrize("case", _ONE_INPUT, ids=[c[0] for c in _ONE_INPUT])
def test_batching_rule_of_an_unmapped_input(case):
    """Every input of a node can arrive unmapped (-1) when a custom vmap rule returns None:
    each rule then computes the unbatched op, as MLX's rules do."""
    name, f, [(gen, shape)], _, _ = case
    fixed = gen(np.random.default_rng(7), shape)

    @mx.custom_function
    def const(a):
        return mx.array(fixed)

    @const.vmap
    def _(a, ax):
        return mx.array(fixed), None

    def g(a):  # the result joins the mapped argument again through a Select
        outs = _flat(f(const(a)))
        same = mx.sum(a) == mx.sum(a)
        return [mx.where(same, o, o) for o in outs]

    x = normal(np.random.default_rng(8), (2, 3))
    got = mx.vmap(g)(mx.array(x))
    want = _loop(g, [x], (0,), 2, 0)
    for o, w in zip(got, want):
        _assert_close(np.array(o), w)
