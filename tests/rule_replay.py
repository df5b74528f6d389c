"""Every primitive's rule replayed with a second array module, against numpy's result.

``replay(dev)`` evaluates ``CASES`` (MLX ops that record every primitive the registry has,
over several dtypes and layouts) on the CPU. Each rule call is intercepted: the rule runs
with numpy (the reference), then with ``dev.xp`` on the same inputs moved to the device
(``dev.to_device``; an ``out=`` buffer of the device's too, when the rule takes one), and
``dev.compare(name, ref, got)`` judges the results. The CPU evaluation itself goes on
unchanged. Used by ``test_cupy_like_rules.py`` (the CuPy-like module over numpy) and
``test_cuda_rules.py`` (CuPy on a GPU).
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import tapescope.core as mx
from tapescope.kernels.primitives import REGISTRY

_COLLECTIVE = ("a collective: it runs only in a group of several processes, over MPI with host "
               "buffers (tests/test_distributed_mpi.py runs it under mpirun)")
# Primitives no case records, with the reason.
NOT_REPLAYED = {
    "Placeholder": "a compile placeholder's rule only raises (checked by its own test)",
    "AllReduce": _COLLECTIVE,
    "AllGather": _COLLECTIVE,
    "ReduceScatter": _COLLECTIVE,
    "Send": _COLLECTIVE,
    "Recv": _COLLECTIVE,
    "CustomKernel": "user Metal code run through the Metal shim on host buffers "
                    "(tests/test_metal_kernel.py)",
}


def _f(rng, shape, dtype="float32", special=True):
    x = rng.standard_normal(shape).astype(np.float64) * 2
    if special and x.size >= 4:
        flat = x.reshape(-1)
        flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return mx.array(x.astype(dtype))


def _i(rng, shape, dtype="int32", lo=-20, hi=20):
    return mx.array(rng.integers(lo, hi, shape).astype(dtype))


def _c(rng, shape):
    return mx.array((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64))


UNARY = ["negative", "sqrt", "exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos",
         "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh",
         "arctanh", "abs", "sign", "rsqrt", "square", "floor", "ceil", "round", "sigmoid",
         "erf", "erfinv", "stop_gradient"]
BINARY = ["add", "multiply", "divide", "equal", "not_equal", "less", "less_equal", "greater",
          "greater_equal", "arctan2", "maximum", "minimum", "subtract", "floor_divide",
          "remainder", "power", "logaddexp"]
INT_BINARY = ["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
              "floor_divide", "remainder", "power", "maximum", "minimum", "subtract"]


def cases(rng) -> list:
    """(label, thunk) pairs; each thunk records ops and returns what to evaluate."""
    out = []

    def case(label):
        def deco(fn):
            out.append((label, fn))
            return fn
        return deco

    for name in UNARY:
        for dt in ("float32", "float16", "bfloat16"):
            out.append((f"{name}/{dt}", lambda n=name, d=dt: getattr(mx, n)(_f(rng, (3, 5), d))))
    for name in ("exp", "sqrt", "log", "sin", "abs", "sign", "negative", "square", "round",
                 "conjugate", "real", "imag", "tanh", "arctan"):
        out.append((f"{name}/complex64", lambda n=name: getattr(mx, n)(_c(rng, (7,)))))
    for name in ("abs", "sign", "negative", "square", "floor", "ceil", "round"):
        for dt in ("int32", "uint8", "int8"):
            out.append((f"{name}/{dt}", lambda n=name, d=dt: getattr(mx, n)(_i(rng, (9,), d, 0 if d[0] == "u" else -20))))
    out.append(("bitwise_invert", lambda: mx.bitwise_invert(_i(rng, (9,), "int16"))))
    out.append(("logical_not", lambda: mx.logical_not(mx.array([True, False, True]))))
    out.append(("sign/bool", lambda: mx.sign(mx.array([True, False]))))
    for name in BINARY:
        for dt in ("float32", "float16"):
            out.append((f"{name}/{dt}", lambda n=name, d=dt: getattr(mx, n)(
                _f(rng, (4, 5), d), _f(rng, (5,), d, special=False))))
    for name in INT_BINARY:
        for dt in ("int32", "uint8", "int64"):
            out.append((f"{name}/{dt}", lambda n=name, d=dt: getattr(mx, n)(
                _i(rng, (4, 6), d, 0, 40), _i(rng, (6,), d, 0, 9))))
    for name in ("add", "multiply", "divide", "power", "logaddexp", "equal", "subtract"):
        out.append((f"{name}/complex64", lambda n=name: getattr(mx, n)(_c(rng, (6,)), _c(rng, (6,)))))
    out.append(("power/neg-int", lambda: mx.power(_i(rng, (8,)), _i(rng, (8,), lo=-3, hi=4))))
    out.append(("logical_and/or", lambda: [mx.logical_and(mx.array([True, False, True]), mx.array([True, True, False])),
                                          mx.logical_or(mx.array([True, False, False]), mx.array([False, False, True]))]))
    out.append(("bool arithmetic", lambda: [mx.subtract(mx.array([True, False]), mx.array([True, True])),
                                            mx.power(mx.array([True, False]), mx.array([False, False])),
                                            mx.floor_divide(mx.array([True, False]), mx.array([True, True])),
                                            mx.remainder(mx.array([True, False]), mx.array([True, True]))]))
    out.append(("divmod", lambda: list(mx.divmod(_f(rng, (6,)), _f(rng, (6,), special=False)))
                + list(mx.divmod(_i(rng, (6,)), _i(rng, (6,), lo=-3, hi=3)))))
    out.append(("isclose equal_nan", lambda: mx.isclose(_f(rng, (6,)), _f(rng, (6,)), equal_nan=True)))
    out.append(("array_equal nan", lambda: mx.array_equal(_f(rng, (6,)), _f(rng, (6,)), equal_nan=True)))
    out.append(("where", lambda: mx.where(_f(rng, (5,)) > 0, _f(rng, (5,)), _i(rng, (5,)))))
    out.append(("astype", lambda: [_f(rng, (6,)).astype(mx.int32), _i(rng, (6,)).astype(mx.float16),
                                   _f(rng, (6,)).astype(mx.bfloat16), _c(rng, (3,)).astype(mx.float32)]))

    # reductions and scans
    for dt in ("float32", "int32", "float16", "bool"):
        def red(d=dt):
            x = _f(rng, (4, 6), d) if d.startswith("f") else (
                _i(rng, (4, 6)) > 0 if d == "bool" else _i(rng, (4, 6), d))
            return [mx.sum(x, axis=1), mx.prod(x, axis=0), mx.max(x, axis=(0, 1)), mx.min(x, axis=1),
                    mx.all(x, axis=1), mx.any(x, axis=0), mx.argmax(x, axis=1), mx.argmin(x, axis=0)]
        out.append((f"reductions/{dt}", red))
    out.append(("logsumexp/softmax", lambda: [mx.logsumexp(_f(rng, (3, 6)), axis=-1),
                                              mx.softmax(_f(rng, (3, 6), special=False), axis=-1),
                                              mx.softmax(_f(rng, (3, 6), "float16", False), axis=-1, precise=True)]))
    for dt in ("float32", "int32", "float16", "bool", "uint8"):
        def scans(d=dt):
            x = (_f(rng, (5, 9), d) if d.startswith("f") else
                 (_i(rng, (5, 9)) > 0 if d == "bool" else _i(rng, (5, 9), d, 0 if d[0] == "u" else -5, 6)))
            res = []
            for axis in (0, 1):
                for rev in (False, True):
                    for inc in (True, False):
                        kw = dict(axis=axis, reverse=rev, inclusive=inc)
                        res += [mx.cumsum(x, **kw), mx.cumprod(x, **kw), mx.cummax(x, **kw),
                                mx.cummin(x, **kw)]
                        if d.startswith("f"):
                            res.append(mx.logcumsumexp(x, **kw))
            return res
        out.append((f"scans/{dt}", scans))
    out.append(("logcumsumexp/complex64", lambda: [mx.logcumsumexp(_c(rng, (4, 6)), axis=1),
                                                   mx.logcumsumexp(_c(rng, (4, 6)), axis=0, reverse=True)]))
    out.append(("logcumsumexp/long", lambda: mx.logcumsumexp(_f(rng, (3, 1000), special=False), axis=1)))

    # layout
    def layout():
        x = _f(rng, (2, 3, 4))
        return [mx.broadcast_to(_f(rng, (3, 1)), (2, 3, 5)), mx.reshape(x, (6, 4)),
                mx.expand_dims(x, 1), mx.squeeze(mx.expand_dims(x, 0), 0), mx.flatten(x),
                mx.unflatten(mx.flatten(x), 0, (4, 6)), mx.transpose(x, (2, 0, 1)),
                mx.as_strided(x, (3, 3), (4, 1), 2), mx.contiguous(mx.transpose(x)),
                mx.contiguous(mx.transpose(x), allow_col_major=True),
                mx.concatenate([x, x * 2], axis=1), *mx.split(x, [1, 3], axis=2),
                mx.pad(x, [(1, 0), (0, 2), (1, 1)], constant_values=7),
                mx.view(x, mx.int32), mx.view(mx.transpose(x), mx.uint16),
                mx.view(mx.array(3.5), mx.int32), x.astype(mx.float16)]
    out.append(("layout", layout))

    @case("copy")
    def _copy():
        from tapescope.core.ops.shape import copy
        return copy(mx.transpose(_f(rng, (3, 4))))

    # indexing
    def indexing():
        x = _f(rng, (5, 6))
        xi = _i(rng, (5, 6))
        idx = mx.array([0, 4, -1, 2, 2])
        upd = _f(rng, (5, 6), special=False)
        res = [x[1:4:2, ::-1], x[idx], x[:, idx], x[idx, idx], mx.take(x, idx, axis=1),
               mx.take_along_axis(x, mx.array(rng.integers(-6, 6, (5, 3))), axis=1),
               mx.put_along_axis(x, mx.array(rng.integers(0, 6, (5, 3))), _f(rng, (5, 3)), axis=1),
               mx.slice(x, mx.array([1, 2]), (0, 1), (2, 3)),
               mx.slice_update(x, mx.ones((2, 3)), mx.array([3, 4]), (0, 1))]
        y = x + 0
        y[1:3] = 5.0
        res.append(y)
        w = x + 0
        w[mx.array([0, 2, 0, -1])] = _f(rng, (4, 6))  # a repeated row: the last write wins
        res.append(w)
        for m in ("add", "multiply", "maximum", "minimum"):
            res.append(getattr(x.at[idx], m)(upd))
            res.append(getattr(xi.at[idx], m)(_i(rng, (5, 6), lo=-3, hi=4)))
            res.append(getattr(x.at[idx, mx.array([1, 1, 1, 0, 1])], m)(mx.array([2.0, 3, 4, 5, 6])))
        res.append(x.at[idx].add(1))
        res.append(mx.put_along_axis(x, mx.array(rng.integers(0, 5, (2, 6))), _f(rng, (2, 6)), axis=0))
        z = mx.zeros((3, 4))
        z[mx.array([[True, False, True, True]] * 3)] = mx.arange(12, dtype=mx.float32)
        res.append(z)
        return res
    out.append(("indexing", indexing))
    for dt in ("float16", "int8", "uint16", "complex64", "bool", "int64", "uint32", "float64"):
        def scatter_dtypes(d=dt):
            x = (_c(rng, (4, 3)) if d == "complex64" else _i(rng, (4, 3), "int32", 0, 2).astype(mx.bool_)
                 if d == "bool" else _i(rng, (4, 3), d, 0 if d[0] == "u" else -4, 5).astype(getattr(mx, d)))
            u = (_c(rng, (6, 3)) if d == "complex64" else _i(rng, (6, 3), "int32", 0, 2).astype(mx.bool_)
                 if d == "bool" else _i(rng, (6, 3), d, 0 if d[0] == "u" else -4, 5).astype(getattr(mx, d)))
            i = mx.array([0, 3, 0, 0, 1, 3])
            ms = ("add", "multiply") if d in ("complex64",) else ("add", "multiply", "maximum", "minimum")
            return [getattr(x.at[i], m)(u) for m in ms]
        out.append((f"scatter/{dt}", scatter_dtypes))
    out.append(("scatter/empty", lambda: mx.zeros((3,)).at[mx.array([], dtype=mx.int32)].multiply(mx.zeros((0,)))))

    # sort, search
    def sorting():
        x = _f(rng, (4, 7))
        xi = _i(rng, (4, 7), lo=0, hi=3)
        return [mx.sort(x, axis=1), mx.sort(xi, axis=0), mx.argsort(x, axis=1), mx.argsort(xi, axis=1),
                mx.sort(_f(rng, (9,), "bfloat16")), mx.partition(xi, 3, axis=1),
                mx.searchsorted(mx.array([1.0, 2, 2, 5]), mx.array([0.0, 2, 3, 9]), side="right"),
                mx.searchsorted(mx.array([1, 2, 2, 5]), mx.array([0, 2, 3, 9]))]
    out.append(("sorting", sorting))
    # partition order is the selection algorithm's: compared by its property elsewhere
    out.append(("partition/float", lambda: [mx.partition(_f(rng, (3, 8), special=False), 2, axis=1),
                                            mx.argpartition(_i(rng, (8,)), 5)]))

    # products, fft, hadamard, linalg, random, creation
    out.append(("matmul", lambda: [mx.matmul(_f(rng, (2, 3, 4), special=False), _f(rng, (2, 4, 5), special=False)),
                                   mx.matmul(_f(rng, (3, 4), "float16", False), _f(rng, (4, 2), "float16", False)),
                                   mx.addmm(_f(rng, (3, 2), special=False), _f(rng, (3, 4), special=False),
                                            _f(rng, (4, 2), special=False), alpha=0.5, beta=2.0)]))
    out.append(("matmul family", lambda: [
        mx.gather_mm(_f(rng, (3, 2, 4), special=False), _f(rng, (2, 4, 5), special=False),
                     mx.array([2, 0, 1, 2]), mx.array([1, 1, 0, 0])),
        mx.gather_mm(_f(rng, (3, 4), "float16", False), _f(rng, (3, 4, 2), "float16", False), None,
                     mx.array([[0], [2]]), sorted_indices=True),
        mx.block_masked_mm(_f(rng, (40, 70)), _f(rng, (70, 33)), 32, mx.array([[True, False]] * 2),
                           mx.array([[1.0, 0.5, 0.0]] * 2), mx.array([[2.0, 1.0]] * 3)),
        mx.block_masked_mm(_f(rng, (2, 9, 5), "bfloat16", False), _f(rng, (5, 3), "bfloat16", False),
                           64, mx.array([[True]])),
        mx.segmented_mm(_f(rng, (3, 10), special=False), _f(rng, (10, 4), special=False),
                        mx.array([[0, 3], [3, 10], [6, 2]])),
        mx.segmented_mm(_f(rng, (2, 6), "float16", False), _f(rng, (6, 3), "float16", False),
                        mx.array([[[1, 4]], [[0, 6]]]))]))
    out.append(("conv", lambda: [
        mx.conv_general(_f(rng, (2, 7, 6, 4), special=False), _f(rng, (6, 3, 2, 2), special=False),
                        stride=[2, 1], padding=([1, 0], [2, 1]), kernel_dilation=[1, 2],
                        input_dilation=[2, 1], groups=2, flip=True),
        mx.conv1d(_f(rng, (2, 9, 3), "float16", False), _f(rng, (4, 3, 3), "float16", False)),
        mx.conv3d(_f(rng, (1, 4, 5, 3, 2), "bfloat16", False), _f(rng, (3, 2, 2, 2, 2), "bfloat16", False),
                  stride=(1, 2, 1), padding=1)]))
    out.append(("fft", lambda: [mx.fft.fft(_c(rng, (4, 8))), mx.fft.ifft2(_c(rng, (4, 8))),
                                mx.fft.rfft(_f(rng, (3, 10), special=False)),
                                mx.fft.irfft(_c(rng, (3, 6)), n=10)]))
    def quantized():
        w = _f(rng, (2, 16, 64), special=False)
        x = _f(rng, (2, 3, 64), special=False)
        aff = [mx.quantize(w, 32, b) for b in (3, 4)]
        nv, mx8 = mx.quantize(w, mode="nvfp4"), mx.quantize(w, mode="mxfp8")
        idx = mx.array([1, 0, 1], mx.uint32)
        return [*aff[0], *aff[1], mx.quantized_matmul(x, *aff[1], group_size=32, bits=4),
                mx.quantized_matmul(x, nv[0], nv[1], mode="nvfp4"),
                mx.gather_qmm(x[:1], *aff[0], rhs_indices=idx, group_size=32, bits=3),
                mx.gather_qmm(x[:1], mx8[0], mx8[1], mode="mxfp8", rhs_indices=idx),
                mx.qqmm(x[0], w[0], mode="mxfp4"), mx.qqmm(x[0, :1], nv[0][0], nv[1][0]),
                mx.gather_qqmm(x, w, mode="mxfp8", rhs_indices=mx.array([1, 0], mx.uint32)),
                mx.to_fp8(_f(rng, (5, 8))), mx.to_fp8(_f(rng, (9,), "bfloat16")),
                mx.from_fp8(mx.array(np.arange(256, dtype=np.uint8)), mx.float32)]

    out.append(("quantized", quantized))
    out.append(("hadamard", lambda: [mx.hadamard_transform(_f(rng, (3, 16), special=False)),
                                     mx.hadamard_transform(_f(rng, (2, 24), special=False), scale=0.5),
                                     mx.hadamard_transform(_f(rng, (2, 8), "float16", False))]))

    def fast():
        x, w, b = _f(rng, (3, 4, 9), special=False), _f(rng, (9,), special=False), \
            _f(rng, (9,), special=False)
        h = _f(rng, (2, 3, 5, 8), "float16", special=False)
        outs = [mx.fast.rms_norm(x, w, 1e-5), mx.fast.rms_norm(h, None, 1e-5),
                mx.fast.layer_norm(x, w, b, 1e-5), mx.fast.layer_norm(x.T.T[:, 1:], None, b, 1e-5),
                mx.fast.rope(h, 6, traditional=True, base=1e4, scale=0.5, offset=3),
                mx.fast.rope(x, 8, traditional=False, base=None, scale=1.0,
                             offset=mx.array([1, 2, 3]), freqs=_f(rng, (4,), special=False))]
        q, kv = _f(rng, (2, 4, 3, 8), special=False), _f(rng, (2, 2, 5, 8), special=False)
        sdpa = mx.fast.scaled_dot_product_attention
        outs += [sdpa(q, kv, kv, scale=0.3, mask=mx.array(rng.random((3, 5)) > 0.3),
                      sinks=_f(rng, (4,), special=False)),
                 sdpa(h, h, h, scale=0.5, mask="causal"),
                 sdpa(q, kv, kv, scale=0.3, mask=_f(rng, (2, 1, 3, 5), special=False))]
        outs += mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, 1e-5), [x, w], [x])[1]
        outs += mx.vjp(lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5), [x, w, b], [x])[1]
        return outs
    out.append(("fast", fast))

    def spd(n, batch=()):
        a = rng.standard_normal(batch + (n, n))
        return mx.array((a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(np.float32))

    def linalg():
        cpu = mx.cpu
        g = mx.array(rng.standard_normal((2, 4, 4)).astype(np.float32))
        sym = spd(4, (2,))
        return [mx.linalg.inv(g, stream=cpu), mx.linalg.tri_inv(g, upper=True, stream=cpu),
                mx.linalg.cholesky(sym, stream=cpu), mx.linalg.cholesky(sym, upper=True, stream=cpu),
                mx.linalg.cholesky(-sym, stream=cpu),
                *mx.linalg.qr(mx.array(rng.standard_normal((5, 3)).astype(np.float32)), stream=cpu),
                *mx.linalg.svd(mx.array(rng.standard_normal((2, 4, 3)).astype(np.float32)), stream=cpu),
                mx.linalg.svd(mx.array(rng.standard_normal((3, 5)).astype(np.float32)), compute_uv=False, stream=cpu),
                *mx.linalg.eigh(sym, stream=cpu), mx.linalg.eigvalsh(sym, UPLO="U", stream=cpu),
                *mx.linalg.eig(g, stream=cpu), mx.linalg.eigvals(g[0], stream=cpu),
                *mx.linalg.lu_factor(g, stream=cpu)]
    out.append(("linalg", linalg))
    out.append(("random", lambda: [mx.random.uniform(shape=(3, 5), key=mx.random.key(3)),
                                   mx.random.normal((7,), key=mx.random.key(1)),
                                   mx.random.randint(0, 9, (5,), dtype=mx.uint8, key=mx.random.key(2)),
                                   mx.random.randint(0, 9, (6,), dtype=mx.int16, key=mx.random.key(5))]))
    out.append(("depends", lambda: [*mx.depends([_f(rng, (2, 3)), _i(rng, (4,))], [_f(rng, (5,))]),
                                    mx.depends(_c(rng, (3,)), mx.exp(_f(rng, (2,))))]))
    out.append(("creation", lambda: [mx.full((2, 3), 2.5), mx.full((3,), mx.array([1, 2, 3])),
                                     mx.arange(0.5, 7, 0.25), mx.arange(-3, 40, 3, dtype=mx.int8),
                                     mx.zeros((0,)), mx.ones((2, 2), dtype=mx.complex64)]))

    @case("compiled")
    def compiled():
        f = mx.compile(lambda x, y: mx.exp(-x) * mx.sin(y) + 2 * x * y)
        return f(_f(rng, (4, 5), special=False), _f(rng, (5,), special=False))

    @case("custom_function")
    def custom():
        # MLX's custom_function records its node under a transformation (tapescope's vjp
        # then replaces the outputs); record it directly
        from tapescope.core.autodiff.custom import custom_transforms

        return custom_transforms(lambda xs: [mx.sin(xs[0]) * 2, xs[0] + 1],
                                 [_f(rng, (4,), special=False)], None, None)

    @case("load")
    def load():
        # a .npy's bytes read at eval (Load), little- and big-endian
        import os
        import tempfile

        d = tempfile.mkdtemp()
        outs = []
        for i, dt in enumerate(("<f4", ">i2")):
            path = os.path.join(d, f"a{i}.npy")
            np.save(path, (rng.standard_normal((3, 4)) * 100).astype(dt))
            outs.append(mx.load(path))
        return outs

    @case("compiled/shapeless mean")
    def shapeless():
        f = mx.compile(lambda x: mx.mean(x, axis=1) + mx.var(x), shapeless=True)
        return f(_f(rng, (3, 4), special=False))

    return out


@dataclass
class Device:
    """A second array module and how to move data to it and back, and judge its results."""

    xp: Any
    to_device: Callable  # host numpy array -> device array (inputs)
    to_host: Callable  # device array -> host numpy array (must refuse anything else)
    empty: Callable  # (shape, dtype) -> device array (out= buffers)
    compare: Callable  # (primitive, references, results, inputs, params): AssertionError on a mismatch
    supports: Callable = lambda a: True  # whether the device can hold this host array


@dataclass
class Report:
    calls: collections.Counter = field(default_factory=collections.Counter)
    failures: list = field(default_factory=list)
    skipped: collections.Counter = field(default_factory=collections.Counter)


def _as_tuple(r):
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


@contextlib.contextmanager
def _intercepted(dev: Device, report: Report, label: list):
    saved = {n: d.rule for n, d in REGISTRY.items()}
    busy: list = []

    def wrap(name, defn, rule):
        def run(xp, *ins, **kw):
            if not busy:  # not a rule called by a rule being checked (Compiled's interpreter)
                busy.append(name)
                try:
                    _check(dev, report, label[0], name, defn, rule, xp, ins, kw)
                finally:
                    busy.pop()
            return rule(xp, *ins, **kw)
        return run

    # the CPU's generated kernels (cpu/primitive_kernels.py, cpu/fast_kernels.py: the
    # backend's kernel_rules, the dict the eval loop asks) stand aside: the array-module
    # rules are what is replayed
    from tapescope.kernels.backends import backend

    rules = backend("cpu").kernel_rules
    kernels = dict(rules)
    try:
        rules.clear()
        for n, d in REGISTRY.items():
            if d.rule is not None:
                d.rule = wrap(n, d, d.rule)
        yield
    finally:
        for n, d in REGISTRY.items():
            d.rule = saved[n]
        rules.update(kernels)


def _check(dev, report, label, name, defn, rule, xp, ins, kw):
    kw = {k: v for k, v in kw.items() if k not in ("out", "runtime")}
    where = f"{name} [{label}]"
    if xp is not np or not all(isinstance(x, np.ndarray) for x in ins):
        report.failures.append(f"{where}: ran off the CPU ({getattr(xp, '__name__', xp)})")
        return
    try:
        ref = rule(np, *ins, **kw)
    except Exception as e:  # the device must refuse the same input the same way
        ref, ref_exc = None, e
    else:
        ref_exc = None
    if not all(dev.supports(np.asarray(x)) for x in ins):
        report.skipped[name] += 1
        return
    dins = [dev.to_device(x) for x in ins]
    runs = [dict(kw)]
    if defn.takes_out and ref_exc is None and len(_as_tuple(ref)) == 1:
        r = np.asarray(ref)
        runs.append(dict(kw, out=dev.empty(r.shape, r.dtype)))
    report.calls[name] += 1
    for params in runs:
        tag = where + (" out=" if "out" in params else "")
        try:
            got = rule(dev.xp, *dins, **params)
        except Exception as e:
            if ref_exc is not None and type(e) is type(ref_exc) and str(e) == str(ref_exc):
                continue
            report.failures.append(f"{tag}: {type(e).__name__}: {e}")
            continue
        if ref_exc is not None:
            report.failures.append(f"{tag}: numpy raised {ref_exc!r}, the device did not")
            continue
        refs, gots = _as_tuple(ref), _as_tuple(got)
        if len(refs) != len(gots):
            report.failures.append(f"{tag}: {len(gots)} outputs, numpy gave {len(refs)}")
            continue
        hosts = []
        for k, g in enumerate(gots):
            try:
                hosts.append(dev.to_host(g))
            except TypeError as e:
                report.failures.append(f"{tag} output {k}: not a device array ({e})")
        if len(hosts) != len(gots):
            continue
        try:
            dev.compare(name, [np.asarray(r) for r in refs], hosts, ins, kw)
        except AssertionError as e:
            report.failures.append(f"{tag}: {str(e).strip()[:800]}")


def replay(dev: Device, seed: int = 0) -> Report:
    """Evaluate every case on the CPU, each rule call checked on ``dev`` (see the module doc)."""
    rng = np.random.default_rng(seed)
    report = Report()
    label = [""]
    # on the CPU whatever the default device (the GPU's, where a GPU backend is registered)
    with _intercepted(dev, report, label), mx.stream(mx.cpu):
        for lab, thunk in cases(rng):
            label[0] = lab
            outs = thunk()
            mx.eval(outs)
    return report


def each(check: Callable) -> Callable:
    """A ``Device.compare`` applying ``check(name, ref, got, ins, kw)`` to every output."""
    def compare(name, refs, gots, ins, kw):
        for k, (r, g) in enumerate(zip(refs, gots)):
            try:
                check(name, r, g, ins, kw)
            except AssertionError as e:
                raise AssertionError(f"output {k}: {e}") from None
    return compare


def exact(name, ref, got, ins=None, kw=None) -> None:
    """Same dtype, shape and bits (NaNs equal whatever their payload)."""
    assert got.dtype == ref.dtype, f"dtype {got.dtype} != {ref.dtype}"
    assert got.shape == ref.shape, f"shape {got.shape} != {ref.shape}"
    if ref.dtype.kind in "fc" or ref.dtype.name == "bfloat16":
        rr, gg = ref.astype(np.complex128 if ref.dtype.kind == "c" else np.float64), \
            got.astype(np.complex128 if ref.dtype.kind == "c" else np.float64)
        same = (rr == gg) | (np.isnan(rr) & np.isnan(gg))
        if ref.dtype.kind == "f" or ref.dtype.name == "bfloat16":
            same &= np.signbit(rr) == np.signbit(gg)
        assert same.all(), f"differs at {np.argwhere(~same)[:5].tolist()}: {gg[~same][:5]} != {rr[~same][:5]}"
    else:
        np.testing.assert_array_equal(got, ref)
