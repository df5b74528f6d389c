"""The JAX reference: each tapescope primitive (by MLX name) computed with jax.numpy / jax.lax.

Written from MLX's semantics, independently of tapescope's numpy rules in
``tapescope.kernels.rules``, so a mistake in one is caught by the other. A rule is
``fn(*inputs, **params)`` (the primitive's parameters, as the graph records them) and returns
one jax array or a tuple (one per output); ``None`` in place of an output, or raising
``NoReference``, means JAX gives no unique answer for it (eigenvectors' signs, the order
inside a partition) and that output is reported as "no reference", never as a pass.

JAX is imported when the table is first built, never by ``import tapescope``.
"""

from __future__ import annotations

import functools
from typing import Callable


class NoReference(Exception):
    """The reference has no (unique) value for this primitive with these parameters."""


# Primitives deliberately without a JAX rule, and why (the registry test requires one or the
# other for every primitive tapescope defines).
WITHOUT_RULE: dict[str, str] = {
    "Placeholder": "no value to compare: a trace placeholder is never evaluated",
    "Partition": "no unique answer: the order inside each side of the kth element is "
                 "unspecified",
    "ArgPartition": "no unique answer: the order inside each side of the kth element is "
                    "unspecified",
    "Eig": "no unique answer: eigenvectors are defined up to scale, eigenvalues up to order",
    "RandomBits": "no JAX equivalent: MLX's threefry key and counter layout is not "
                  "jax.random's, so the bits differ by design",
}


@functools.lru_cache(maxsize=None)
def table() -> dict[str, Callable]:
    """Primitive name -> JAX rule (built once, on first use)."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    import ml_dtypes
    import numpy as np

    bf16 = np.dtype(ml_dtypes.bfloat16)
    T: dict[str, Callable] = {}

    def kind(a) -> str:
        d = np.dtype(a.dtype)
        return "V" if d == bf16 else d.kind

    def is_half(a) -> bool:
        return np.dtype(a.dtype) in (np.dtype(np.float16), bf16)

    def f32(a):
        return a.astype(jnp.float32) if is_half(a) else a

    # -- unary ------------------------------------------------------------------------------
    for name, fn in {
        "Negative": jnp.negative, "Sqrt": jnp.sqrt, "Exp": jnp.exp, "Expm1": jnp.expm1,
        "Log": jnp.log, "Log1p": jnp.log1p, "Log2": jnp.log2, "Log10": jnp.log10,
        "Sin": jnp.sin, "Cos": jnp.cos, "Tan": jnp.tan, "ArcSin": jnp.arcsin,
        "ArcCos": jnp.arccos, "ArcTan": jnp.arctan, "Sinh": jnp.sinh, "Cosh": jnp.cosh,
        "Tanh": jnp.tanh, "ArcSinh": jnp.arcsinh, "ArcCosh": jnp.arccosh,
        "ArcTanh": jnp.arctanh, "Conjugate": jnp.conjugate, "LogicalNot": jnp.logical_not,
        "Real": jnp.real, "Imag": jnp.imag, "Sigmoid": jax.nn.sigmoid,
        "Erf": jax.scipy.special.erf, "ErfInv": jax.scipy.special.erfinv,
        "StopGradient": lax.stop_gradient,
    }.items():
        T[name] = (lambda f: lambda a: f(a))(fn)

    T["Rsqrt"] = lambda a: lax.rsqrt(a)
    T["BitwiseInvert"] = lambda a: jnp.logical_not(a) if kind(a) == "b" else jnp.bitwise_not(a)
    T["Abs"] = lambda a: a if kind(a) in "bu" else jnp.abs(a)
    T["Square"] = lambda a: a if kind(a) == "b" else lax.square(a)
    T["Floor"] = lambda a: jnp.floor(a) if kind(a) in "fV" else a
    T["Ceil"] = lambda a: jnp.ceil(a) if kind(a) in "fV" else a

    def round_(a):
        if kind(a) == "c":
            return lax.complex(jnp.round(jnp.real(a)), jnp.round(jnp.imag(a)))
        return jnp.round(a) if kind(a) in "fV" else a  # jnp.round: half to even, as MLX

    T["Round"] = round_

    def sign(a):
        k = kind(a)
        if k == "b":
            return a
        if k == "c":
            mag = jnp.abs(a)
            return jnp.where(mag == 0, jnp.zeros_like(a), a / jnp.where(mag == 0, 1, mag))
        # MLX: (a > 0) - (a < 0), so sign(NaN) is 0
        return (a > 0).astype(a.dtype) - (a < 0).astype(a.dtype)

    T["Sign"] = sign

    # -- binary -----------------------------------------------------------------------------
    for name, fn in {
        "Add": jnp.add, "Multiply": jnp.multiply, "Divide": jnp.true_divide,
        "Maximum": jnp.maximum, "Minimum": jnp.minimum, "Equal": jnp.equal,
        "NotEqual": jnp.not_equal, "Less": jnp.less, "LessEqual": jnp.less_equal,
        "Greater": jnp.greater, "GreaterEqual": jnp.greater_equal,
        "LogicalAnd": jnp.logical_and, "LogicalOr": jnp.logical_or, "ArcTan2": jnp.arctan2,
        "BitwiseAnd": jnp.bitwise_and, "BitwiseOr": jnp.bitwise_or,
        "BitwiseXor": jnp.bitwise_xor, "LogAddExp": jnp.logaddexp,
    }.items():
        T[name] = (lambda f: lambda a, b: f(a, b))(fn)

    T["Subtract"] = lambda a, b: (a != b) if kind(a) == "b" else jnp.subtract(a, b)
    T["NaNEqual"] = lambda a, b: (a == b) | (jnp.isnan(a) & jnp.isnan(b)) if kind(a) in "fVc" \
        else a == b

    def floor_divide(a, b):
        k = kind(a)
        if k == "c":
            return a / b
        if k in "fV":
            return jnp.floor(a / b)
        if k == "b":
            return a & b
        # integers: Python's floor division, with x // 0 == 0 (MLX)
        q = jnp.floor_divide(a, jnp.where(b == 0, jnp.ones_like(b), b))
        return jnp.where(b == 0, jnp.zeros_like(q), q)

    def remainder(a, b):
        k = kind(a)
        if k == "b":
            return a & jnp.logical_not(b)
        if k in "fV":
            return jnp.remainder(a, b)  # the divisor's sign, as MLX
        r = jnp.remainder(a, jnp.where(b == 0, jnp.ones_like(b), b))
        return jnp.where(b == 0, a, r)  # x % 0 == x (MLX)

    T["FloorDivide"] = floor_divide
    T["Remainder"] = remainder
    T["DivMod"] = lambda a, b: (floor_divide(a, b), remainder(a, b))
    # Depends (mlx/ops.cpp): the first ``count`` inputs unchanged; the rest only ordered
    T["Depends"] = lambda *ins, count: tuple(ins[:count])

    def power(a, b):
        k = kind(a)
        if k == "b":
            return a | jnp.logical_not(b)
        if k == "i":  # a negative integer exponent gives 0 (MLX)
            r = jnp.power(a, jnp.where(b < 0, 0, b))
            return jnp.where(b < 0, jnp.zeros_like(r), r)
        return jnp.power(a, b)

    T["Power"] = power

    def shift(a, b, left: bool):
        # MLX on x86: narrow types shift as 32-bit ints (count mod 32) and are truncated
        # back; 32/64-bit types take the count modulo their width.
        dt = a.dtype
        bits = np.dtype(dt).itemsize * 8
        if kind(a) == "b":
            a = a.astype(jnp.int32)
        if bits < 32:
            wide = jnp.int32 if kind(a) in "bi" else jnp.uint32
            aw, cnt = a.astype(wide), (b.astype(jnp.int64) & 31).astype(wide)
        else:
            aw, cnt = a, (b.astype(jnp.int64) & (bits - 1)).astype(a.dtype)
        r = lax.shift_left(aw, cnt) if left else (
            lax.shift_right_arithmetic(aw, cnt) if np.dtype(aw.dtype).kind == "i"
            else lax.shift_right_logical(aw, cnt))
        return r.astype(dt)

    T["LeftShift"] = lambda a, b: shift(a, b, True)
    T["RightShift"] = lambda a, b: shift(a, b, False)
    T["Select"] = lambda c, a, b: jnp.where(c, a, b)

    # -- layout -----------------------------------------------------------------------------
    T["Broadcast"] = lambda a, *, shape: jnp.broadcast_to(a, tuple(shape))
    T["AsType"] = lambda a, *, dtype: a.astype(np.dtype(dtype))
    for name in ("Reshape", "ExpandDims", "Squeeze", "Flatten", "Unflatten"):
        T[name] = lambda a, *, shape, **_: jnp.reshape(a, tuple(shape))
    T["Transpose"] = lambda a, *, axes: jnp.transpose(a, tuple(axes))
    T["Copy"] = lambda a: jnp.array(a, copy=True)
    T["Contiguous"] = lambda a, **_: a
    T["Full"] = lambda a: jnp.array(a, copy=True)

    def number_of_elements(a, *, axes, inverted, dtype):
        n = float(np.prod([a.shape[ax] for ax in axes]))
        return jnp.asarray((1.0 / n if n else np.inf) if inverted else n).astype(np.dtype(dtype))
    T["NumberOfElements"] = number_of_elements
    T["Concatenate"] = lambda *arrays, axis: jnp.concatenate(arrays, axis=axis)
    T["Split"] = lambda a, *, indices, axis: tuple(jnp.split(a, list(indices), axis=axis))

    def as_strided(a, *, shape, strides, offset):
        flat = jnp.reshape(a, (-1,))
        idx = jnp.full(tuple(shape), offset, dtype=jnp.int64)
        for d, (n, st) in enumerate(zip(shape, strides)):
            shp = [1] * len(shape)
            shp[d] = n
            idx = idx + jnp.arange(n, dtype=jnp.int64).reshape(shp) * st
        return flat[idx] if idx.size else jnp.zeros(tuple(shape), a.dtype)

    T["AsStrided"] = as_strided

    def pad(a, val, *, axes, low_pad_size, high_pad_size):
        widths = [(0, 0)] * a.ndim
        for ax, lo, hi in zip(axes, low_pad_size, high_pad_size):
            widths[ax] = (lo, hi)
        return jnp.pad(a, widths, mode="constant", constant_values=val.reshape(()))

    T["Pad"] = pad

    def arange(*, start, step, size, dtype):
        dt = np.dtype(dtype)
        i = jnp.arange(size, dtype=jnp.float64)
        return (start + i * step).astype(dt)

    T["Arange"] = arange

    def load(*, reader, offset, shape, dtype, swap):
        # the file's bytes read by numpy on its own (np.fromfile at the offset, in the file's
        # byte order), not through tapescope's reader; a file object's or zip member's
        # bytes have no second way in
        path = getattr(reader, "path", None)
        if path is None:
            raise NoReference("the bytes come from a file object: no independent read")
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        stored = dt.newbyteorder(">") if swap else dt
        host = np.fromfile(path, dtype=stored, count=count, offset=offset)
        if host.size != count:
            raise NoReference(f"the file holds {host.size} of the {count} elements")
        return jnp.asarray(host.astype(dt).reshape(shape))

    T["Load"] = load

    # -- slicing, gathers, scatters ---------------------------------------------------------
    def ranges(start, stop, strides):
        # bounds come normalised by slice.indices: with a negative step, stop -1 is "below 0"
        return [np.arange(b, e, s) for b, e, s in zip(start, stop, strides)]

    def slice_(a, *, start_indices, end_indices, strides):
        for ax, r in enumerate(ranges(start_indices, end_indices, strides)):
            a = jnp.take(a, jnp.asarray(r, dtype=jnp.int64), axis=ax)
        return a

    def slice_update(a, update, *, start_indices, end_indices, strides, reduce="none"):
        rs = ranges(start_indices, end_indices, strides)
        if any(len(r) == 0 for r in rs):
            return a
        at = a.at[jnp.ix_(*[jnp.asarray(r) for r in rs])]
        return {"none": at.set, "sum": at.add, "prod": at.multiply, "max": at.max,
                "min": at.min}[reduce](update)

    T["Slice"] = slice_
    T["SliceUpdate"] = slice_update

    def full_start(a, start, axes):
        st = [0] * a.ndim
        for ax, v in zip(axes, np.asarray(start).reshape(-1).tolist()):
            st[ax] = int(v) + a.shape[ax] if int(v) < 0 else int(v)
        return st

    T["DynamicSlice"] = lambda a, start, *, axes, slice_size: lax.dynamic_slice(
        a, full_start(a, start, axes), tuple(slice_size))
    T["DynamicSliceUpdate"] = lambda a, update, start, *, axes: lax.dynamic_update_slice(
        a, update.astype(a.dtype), full_start(a, start, axes))

    def window_index(shape, indices, axes, sizes):
        """Advanced index: for every index position, a window of ``sizes`` starting at the
        (wrapped) indices along ``axes`` and at 0 elsewhere."""
        ishape = jnp.broadcast_shapes(*[i.shape for i in indices]) if indices else ()
        ni, nd = len(ishape), len(shape)
        out = []
        for d in range(nd):
            w = jnp.arange(sizes[d]).reshape((1,) * ni + tuple(sizes[d] if j == d else 1
                                                                  for j in range(nd)))
            if d in axes:
                ix = jnp.broadcast_to(indices[list(axes).index(d)].astype(jnp.int64), ishape)
                ix = jnp.where(ix < 0, ix + shape[d], ix)
                w = ix.reshape(ishape + (1,) * nd) + w
            out.append(w)
        return tuple(out)

    T["Gather"] = lambda a, *indices, axes, slice_sizes: a[
        window_index(a.shape, list(indices), axes, slice_sizes)]

    def scatter_to(target, reduce, values):
        if reduce == "none":
            return target.set(values)
        return {"sum": target.add, "prod": target.multiply, "max": target.max,
                "min": target.min}[reduce](values)

    def scatter(a, *rest, axes, reduce):
        *indices, updates = rest
        sizes = updates.shape[updates.ndim - a.ndim:]
        return scatter_to(a.at[window_index(a.shape, indices, axes, sizes)], reduce,
                          updates.astype(a.dtype))

    T["Scatter"] = scatter

    def axis_index(shape, idx, axis):
        idx = idx.astype(jnp.int64)
        idx = jnp.where(idx < 0, idx + shape[axis], idx)
        grid = list(jnp.indices(idx.shape, sparse=True))
        grid[axis] = idx
        return tuple(grid)

    T["GatherAxis"] = lambda a, indices, *, axis: a[axis_index(a.shape, indices, axis)]
    T["ScatterAxis"] = lambda a, indices, updates, *, axis, reduce: scatter_to(
        a.at[axis_index(a.shape, indices, axis)], reduce, updates.astype(a.dtype))

    def masked_scatter(a, mask, src):
        where = jnp.nonzero(jnp.broadcast_to(mask, a.shape))
        n = int(where[0].shape[0]) if where else 0
        return a.at[where].set(jnp.reshape(src, (-1,))[:n].astype(a.dtype))

    T["MaskedScatter"] = masked_scatter

    # -- reductions, scans ------------------------------------------------------------------
    def wide(a):
        k = kind(a)
        if k in "V" or is_half(a):
            return a.astype(jnp.float32)
        if k == "i":
            return a.astype(jnp.int64)
        if k == "u":
            return a.astype(jnp.uint64)
        return a

    T["Sum"] = lambda a, *, axes: jnp.sum(wide(a), axis=tuple(axes), keepdims=True)
    T["Prod"] = lambda a, *, axes: jnp.prod(wide(a), axis=tuple(axes), keepdims=True)
    T["Max"] = lambda a, *, axes: jnp.max(a, axis=tuple(axes), keepdims=True)
    T["Min"] = lambda a, *, axes: jnp.min(a, axis=tuple(axes), keepdims=True)
    T["And"] = lambda a, *, axes: jnp.all(a, axis=tuple(axes), keepdims=True)
    T["Or"] = lambda a, *, axes: jnp.any(a, axis=tuple(axes), keepdims=True)
    T["ArgReduce"] = lambda a, *, reduce_type, axis: (
        jnp.argmax if reduce_type == "argmax" else jnp.argmin)(a, axis=axis, keepdims=True)
    T["LogSumExp"] = lambda a: jax.nn.logsumexp(f32(a), axis=-1, keepdims=True)
    T["Softmax"] = lambda a, *, precise: jax.nn.softmax(f32(a), axis=-1)

    def scan(a, *, reduce_type, axis, reverse, inclusive):
        if kind(a) == "b" and reduce_type in ("max", "min", "prod"):
            out = {"max": lax.cummax, "min": lax.cummin, "prod": lax.cummin}[reduce_type](
                a.astype(jnp.int32), axis=axis % a.ndim, reverse=reverse).astype(bool)
        else:
            x = wide(a) if reduce_type in ("sum", "prod", "logaddexp") else a
            if kind(x) == "b":
                x = x.astype(jnp.int64)
            fn = {"sum": lax.cumsum, "prod": lax.cumprod, "max": lax.cummax,
                  "min": lax.cummin, "logaddexp": lax.cumlogsumexp}[reduce_type]
            out = fn(x, axis=axis % a.ndim, reverse=reverse)
        if inclusive or a.shape[axis] == 0:
            return out
        ident = {"sum": 0, "prod": 1, "logaddexp": -np.inf}.get(reduce_type)
        if ident is None:
            dt = np.dtype(out.dtype)
            if dt.kind == "b":
                ident = reduce_type == "min"
            elif dt.kind in "iu":
                info = np.iinfo(dt)
                ident = info.min if reduce_type == "max" else info.max
            else:
                ident = -np.inf if reduce_type == "max" else np.inf
        n = a.shape[axis]
        head = jnp.full_like(lax.slice_in_dim(out, 0, 1, axis=axis), ident)
        if reverse:
            return jnp.concatenate([lax.slice_in_dim(out, 1, n, axis=axis), head], axis=axis)
        return jnp.concatenate([head, lax.slice_in_dim(out, 0, n - 1, axis=axis)], axis=axis)

    for name in ("CumSum", "CumProd", "CumMax", "CumMin", "CumLogAddExp"):
        T[name] = scan

    # -- sorting (partitions have no unique answer) -----------------------------------------
    T["Sort"] = lambda a, *, axis: jnp.sort(a, axis=axis)
    T["ArgSort"] = lambda a, *, axis: jnp.argsort(a, axis=axis, stable=True)

    # -- products ---------------------------------------------------------------------------
    hi = lax.Precision.HIGHEST

    def matmul(a, b):
        return jnp.matmul(f32(a), f32(b), precision=hi)

    T["Matmul"] = matmul
    T["AddMM"] = lambda a, b, c, *, alpha, beta: alpha * matmul(a, b) + beta * f32(c)

    def gather_mm(a, b, lhs, rhs, *, left_sorted, right_sorted):
        """MLX's GatherMM: the product of matrix ``lhs[i]`` of ``a`` and ``rhs[i]`` of ``b``,
        each counted over the flattened batch axes."""
        sa = f32(a).reshape((-1,) + a.shape[-2:])
        sb = f32(b).reshape((-1,) + b.shape[-2:])
        return matmul(sa[lhs.reshape(-1)], sb[rhs.reshape(-1)]).reshape(
            lhs.shape + (a.shape[-2], b.shape[-1]))

    def block_masked_mm(a, b, *masks, block_size):
        """MLX's BlockMaskedMM: masks (out, lhs, rhs; three inputs = out only, four = the
        operands only) cover block_size squares; a bool block keeps or zeroes, a float block
        scales."""
        def apply(x, mask):
            full = jnp.repeat(jnp.repeat(mask, block_size, -2), block_size, -1)
            full = full[..., :x.shape[-2], :x.shape[-1]]
            return jnp.where(full, x, 0) if kind(mask) == "b" else x * f32(full)
        x, y = f32(a), f32(b)
        if len(masks) >= 2:
            x, y = apply(x, masks[-2]), apply(y, masks[-1])
        out = matmul(x, y)
        return apply(out, masks[0]) if len(masks) in (1, 3) else out

    def segmented_mm(a, b, segments):
        """MLX's SegmentedMM: ``a[:, s:e] @ b[s:e, :]`` per ``(s, e)`` pair (zero if e <= s)."""
        k = jnp.arange(a.shape[1])
        seg = segments.reshape(-1, 2).astype(jnp.int64)
        inside = (k >= seg[:, :1]) & (k < seg[:, 1:])
        x = jnp.where(inside[:, None, :], f32(a)[None], 0)
        y = jnp.where(inside[:, :, None], f32(b)[None], 0)
        return matmul(x, y).reshape(segments.shape[:-1] + (a.shape[0], b.shape[1]))

    T["GatherMM"] = gather_mm
    T["BlockMaskedMM"] = block_masked_mm
    T["SegmentedMM"] = segmented_mm

    def convolution(x, w, *, strides, padding_lo, padding_hi, kernel_dilation, input_dilation,
                    groups, flip):
        """MLX's channels-last Convolution: input (N, *S, C_in), weight (C_out, *K, C_in / g);
        ``flip`` reverses the kernel's spatial axes (convolution, not cross-correlation)."""
        nd = x.ndim - 2
        sp = "DHW"[3 - nd:]
        wf = jnp.flip(f32(w), axis=tuple(range(1, nd + 1))) if flip else f32(w)
        hi_pad = []
        for i in range(nd):  # MLX's C division lets a window run past the end, over zeros
            n = padding_lo[i] + (x.shape[1 + i] - 1) * input_dilation[i] + 1 + padding_hi[i]
            k = (w.shape[1 + i] - 1) * kernel_dilation[i] + 1
            o = (abs(n - k) // strides[i]) * (1 if n >= k else -1) + 1
            hi_pad.append(padding_hi[i] + max(0, (o - 1) * strides[i] + k - n))
        y = lax.conv_general_dilated(
            f32(x), wf, window_strides=tuple(strides),
            padding=tuple(zip(padding_lo, hi_pad)), lhs_dilation=tuple(input_dilation),
            rhs_dilation=tuple(kernel_dilation),
            dimension_numbers=("N" + sp + "C", "O" + sp + "I", "N" + sp + "C"),
            feature_group_count=groups, precision=hi)
        return y.astype(x.dtype)

    T["Convolution"] = convolution

    # -- quantization (mlx/ops.cpp, mlx/backend/cpu/quantized.cpp) ----------------------------
    fp4_values = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                           -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)

    def e4m3(x):
        """``x`` converted to float8_e4m3fn. The barrier keeps the conversion: XLA's GPU
        pipeline folds a float32 -> float8 -> float32 round trip into nothing."""
        return lax.optimization_barrier(x.astype(jnp.float8_e4m3fn))

    def to_fp8(a):
        """e4m3fn, rounded to nearest even, saturating at +-448 (inf and nan too)."""
        x = f32(a)
        x = jnp.where(jnp.isnan(x), jnp.where(jnp.signbit(x), -448.0, 448.0),
                      jnp.clip(x, -448.0, 448.0))
        return lax.bitcast_convert_type(e4m3(x), jnp.uint8)

    def from_fp8(b, *, dtype):
        return lax.bitcast_convert_type(b, jnp.float8_e4m3fn).astype(jnp.float32)

    def codes(w, bits):
        """uint32 words -> the bits-wide codes of their little-endian bit stream."""
        bit = (w[..., None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
        bit = bit.reshape(w.shape[:-1] + (-1, bits))
        return (bit << jnp.arange(bits, dtype=jnp.uint32)).sum(-1).astype(jnp.uint32)

    def fp_scale(s, group_size):
        if group_size == 16:
            return from_fp8(s, dtype=None)
        return jnp.exp2(s.astype(jnp.float32) - 127.0)

    def dequant(w, scales, biases, group_size, bits, mode):
        q = codes(w, bits)
        q = q.reshape(q.shape[:-1] + (-1, group_size))
        if mode == "affine":
            v = q.astype(jnp.float32) * f32(scales)[..., None] + f32(biases)[..., None]
        else:
            v = (jnp.asarray(fp4_values)[q] if bits == 4
                 else from_fp8(q.astype(jnp.uint8), dtype=None))
            v = v * fp_scale(scales, group_size)[..., None]
        return v.reshape(v.shape[:-2] + (-1,))

    def quantize(w, *, group_size, bits, mode):
        """Affine: the larger-magnitude edge of each group lands exactly on a code."""
        g = f32(w).reshape(w.shape[:-1] + (-1, group_size))
        n_bins = float((1 << bits) - 1)
        hi_, lo_ = g.max(-1), g.min(-1)
        neg = jnp.abs(lo_) > jnp.abs(hi_)
        scale = jnp.maximum((hi_ - lo_) / n_bins, 1e-7)
        scale = jnp.where(neg, scale, -scale)
        edge = jnp.where(neg, lo_, hi_)
        q0 = jnp.round(edge / scale)
        scale = jnp.where(q0 != 0, edge / jnp.where(q0 != 0, q0, 1.0), scale)
        bias = jnp.where(q0 != 0, edge, 0.0)
        if bits == 1:  # one bit: the group's minimum, and its range as the step
            scale, bias = jnp.maximum(hi_ - lo_, 1e-7), lo_
        q = jnp.clip(jnp.round((g - bias[..., None]) / scale[..., None]), 0, n_bins)
        q = q.astype(jnp.uint32).reshape(w.shape)
        bit = ((q[..., None] >> jnp.arange(bits, dtype=jnp.uint32)) & 1)
        bit = bit.reshape(w.shape[:-1] + (-1, 32))
        packed = (bit << jnp.arange(32, dtype=jnp.uint32)).sum(-1).astype(jnp.uint32)
        return packed, scale.astype(w.dtype), bias.astype(w.dtype)

    def qmm_product(x, wd, transpose):
        return matmul(x, jnp.swapaxes(wd, -1, -2) if transpose else wd)

    def quantized_matmul(x, w, scales, *biases, group_size, bits, mode, transpose):
        wd = dequant(w, scales, biases[0] if biases else None, group_size, bits, mode)
        if x.ndim <= 2 < wd.ndim:  # an unbatched x meets w's first matrix
            wd = wd.reshape((-1,) + wd.shape[-2:])[0]
        return qmm_product(x, wd, transpose).astype(x.dtype)

    def gather_qmm(x, w, scales, *rest, group_size, bits, mode, transpose, left_sorted,
                   right_sorted):
        *b, lhs, rhs = rest
        wd = dequant(w, scales, b[0] if b else None, group_size, bits, mode)
        xs = x.reshape((-1,) + x.shape[-2:])[lhs.reshape(-1)]
        ws = wd.reshape((-1,) + wd.shape[-2:])[rhs.reshape(-1)]
        out = qmm_product(xs, ws, transpose)
        return out.reshape(lhs.shape + out.shape[-2:]).astype(x.dtype)

    def fp_round(a, group_size, bits, global_scale=None):
        """Rounded through fp quantization: the group's scale (e4m3 of amax / 6 for nvfp4,
        else the power of two at or above amax / max), values to e2m1 / e4m3 (nearest even)."""
        g = f32(a).reshape(a.shape[:-1] + (-1, group_size))
        scale = jnp.abs(g).max(-1, keepdims=True) / (6.0 if bits == 4 else 448.0)
        if group_size == 16:
            enc = 1.0 if global_scale is None else 2688.0 / f32(global_scale).reshape(())
            scale = from_fp8(to_fp8(scale * enc), dtype=None) / enc
        else:
            e = jnp.round(jnp.log2(jnp.where(scale > 0, scale, 1.0)))
            e = jnp.where(jnp.exp2(e) < scale, e + 1, e)
            scale = jnp.exp2(jnp.clip(jnp.where(scale > 0, e, -127.0), -127, 127))
        v = jnp.where(scale == 0, 0.0, g / jnp.where(scale == 0, 1.0, scale))
        v = e2m1(v) if bits == 4 else e4m3(v).astype(jnp.float32)
        return (scale * v).reshape(a.shape)

    def e2m1(v):
        """The nearest e2m1 value (ties to the even code), saturating at +-6; nan to 6."""
        mags = jnp.asarray(fp4_values[:8])
        a = jnp.abs(v)
        hi_i = jnp.clip(jnp.searchsorted(mags, a, side="left"), 1, 7)
        lo_v, hi_v = mags[hi_i - 1], mags[hi_i]
        d_lo, d_hi = a - lo_v, hi_v - a
        up = (d_hi < d_lo) | ((d_hi == d_lo) & (hi_i % 2 == 0))
        r = jnp.where(a >= 6.0, 6.0, jnp.where(up, hi_v, lo_v))
        r = jnp.where(jnp.isnan(v), 6.0, r)
        return jnp.where(jnp.signbit(v), -r, r)

    def qq_operands(x, w, rest, group_size, bits, mode):
        scales = rest[0] if len(rest) in (1, 3) else None
        gx, gw = rest[-2:] if len(rest) >= 2 else (None, None)
        xq = fp_round(x, group_size, bits, gx)
        if w.dtype == jnp.uint32:
            wd = dequant(w, scales, None, group_size, bits, mode)
            wd = wd if gw is None else wd * (f32(gw).reshape(()) / 2688.0)
        else:
            wd = fp_round(w, group_size, bits, gw)
        return xq, wd

    def qqmm(x, w, *rest, group_size, bits, mode):
        xq, wd = qq_operands(x, w, rest, group_size, bits, mode)
        return matmul(xq, jnp.swapaxes(wd, -1, -2)).astype(x.dtype)

    def gather_qqmm(x, w, lhs, rhs, *rest, group_size, bits, mode):
        xq, wd = qq_operands(x, w, rest, group_size, bits, mode)
        xs = xq.reshape((-1,) + xq.shape[-2:])[lhs.reshape(-1)]
        ws = wd.reshape((-1,) + wd.shape[-2:])[rhs.reshape(-1)]
        out = matmul(xs, jnp.swapaxes(ws, -1, -2))
        return out.reshape(lhs.shape + out.shape[-2:]).astype(x.dtype)

    T["ToFP8"] = to_fp8
    T["FromFP8"] = from_fp8
    T["Quantize"] = quantize
    T["QuantizedMatmul"] = quantized_matmul
    T["GatherQMM"] = gather_qmm
    T["QQMatmul"] = qqmm
    T["GatherQQMM"] = gather_qqmm

    # -- linear algebra ---------------------------------------------------------------------
    def inverse(a, *, tri=False, upper=False):
        if tri:
            a = jnp.triu(a) if upper else jnp.tril(a)
        out = jnp.linalg.inv(a)
        return (jnp.triu(out) if upper else jnp.tril(out)) if tri else out

    def cholesky(a, *, upper=False):
        low = jnp.tril(a)
        sym = low + jnp.swapaxes(jnp.tril(a, -1), -1, -2).conj()
        l = lax.linalg.cholesky(sym, symmetrize_input=False)
        return jnp.swapaxes(l, -1, -2).conj() if upper else l

    def eigh(a, *, uplo="L", compute_eigenvectors=True):
        v, w = lax.linalg.eigh(a, lower=uplo == "L", symmetrize_input=False)
        return (w, None) if compute_eigenvectors else w  # eigenvectors: signs are free

    def svd(a, *, compute_uv=True):
        s = jnp.linalg.svd(a, compute_uv=False)
        return (None, s, None) if compute_uv else s  # U, Vt: signs are free

    def luf(a):
        lu, piv, perm = lax.linalg.lu(a)
        return lu, piv, perm

    T["Inverse"] = inverse
    T["Cholesky"] = cholesky
    T["Eigh"] = eigh
    T["SVD"] = svd
    T["QRF"] = lambda a: tuple(jnp.linalg.qr(a, mode="reduced"))
    T["LUF"] = luf

    def fft(a, *, axes, inverse, real, out_shape):
        axes = tuple(axes)
        if real and inverse:
            return jnp.fft.irfftn(a, s=tuple(out_shape[ax] for ax in axes), axes=axes)
        if real:
            return jnp.fft.rfftn(a, axes=axes)
        return (jnp.fft.ifftn if inverse else jnp.fft.fftn)(a, axes=axes)

    T["FFT"] = fft

    def view(a, *, dtype):
        """The same bytes read as ``dtype``: the last axis scales by the itemsize ratio."""
        dt = np.dtype(dtype)
        src = a.astype(jnp.uint8) if kind(a) == "b" else a
        tgt = np.dtype(np.uint8) if dt.kind == "b" else dt
        n_in, n_out = np.dtype(src.dtype).itemsize, tgt.itemsize
        if n_in == n_out:
            out = lax.bitcast_convert_type(src, tgt)
        elif n_in > n_out:
            out = lax.bitcast_convert_type(src, tgt)
            out = out.reshape(out.shape[:-2] + (out.shape[-2] * out.shape[-1],)) if a.ndim else \
                out.reshape((-1,))
        else:
            r = n_out // n_in
            out = lax.bitcast_convert_type(src.reshape(src.shape[:-1] + (src.shape[-1] // r, r)), tgt)
        return out.astype(bool) if dt.kind == "b" else out

    T["View"] = view

    def hadamard(a, *, scale):
        """Sylvester's matrix by Kronecker doubling (n a power of 2), times ``scale``. MLX's
        H_12 / H_20 / H_28 (n = m * 2^k) have no independent JAX source: no reference."""
        n = a.shape[-1]
        if n & (n - 1):
            raise NoReference(f"no independent reference for MLX's Hadamard matrix of size {n}")
        h = jnp.ones((1, 1), jnp.float32)
        while h.shape[0] < n:
            h = jnp.kron(jnp.array([[1.0, 1.0], [1.0, -1.0]], jnp.float32), h)
        y = jnp.matmul(a.astype(jnp.float32), h.T, precision=lax.Precision.HIGHEST)
        return (y * jnp.float32(scale)).astype(a.dtype)

    T["Hadamard"] = hadamard

    # -- MLX's fast primitives (mlx/fast.cpp's semantics: float32 statistics, the normalised
    # value rounded to the output type before the weight / bias) --------------------------
    def rms_norm(x, w, *, eps):
        y = x.astype(jnp.float32)
        y = (y * lax.rsqrt(jnp.mean(y * y, -1, keepdims=True) + jnp.float32(eps))).astype(x.dtype)
        return y * w if w.ndim else y

    def layer_norm(x, w, b, *, eps):
        y = x.astype(jnp.float32)
        yc = y - jnp.mean(y, -1, keepdims=True)
        y = (yc * lax.rsqrt(jnp.mean(yc * yc, -1, keepdims=True) + jnp.float32(eps))).astype(x.dtype)
        y = y * w if w.ndim else y
        return y + b if b.ndim else y

    def _vjp_of(fn, n):
        def rule(*ins, eps):
            *prim, g = ins
            f32 = [p.astype(jnp.float32) for p in prim]
            _, back = jax.vjp(lambda *a: fn(*a, eps=eps), *f32)
            grads = back(g.astype(jnp.float32))
            return tuple(gr.astype(p.dtype) for gr, p in zip(grads, prim))[:n]
        return rule

    def rope(x, offset, *freqs, dims, traditional, base, scale, forward):
        shape = x.shape
        B, L, D = shape[0], shape[-2], shape[-1]
        v = x.reshape(B, -1, L, D).astype(jnp.float32)
        half = dims // 2
        inv = (1 / freqs[0].astype(jnp.float32)) if freqs else \
            jnp.float32(base) ** (-jnp.arange(half, dtype=jnp.float32) / half)
        off = offset.reshape(-1, 1, 1, 1).astype(jnp.float32)
        theta = (jnp.arange(L, dtype=jnp.float32)[None, None, :, None] + off) * scale * inv
        c, s_ = jnp.cos(theta), jnp.sin(theta)
        if traditional:
            x1, x2 = v[..., 0:dims:2], v[..., 1:dims:2]
        else:
            x1, x2 = v[..., :half], v[..., half:dims]
        if not forward:
            s_ = -s_
        r1, r2 = x1 * c - x2 * s_, x1 * s_ + x2 * c
        rot = jnp.stack([r1, r2], -1).reshape(B, -1, L, dims) if traditional else \
            jnp.concatenate([r1, r2], -1)
        out = jnp.concatenate([rot, v[..., dims:]], -1) if dims < D else rot
        return out.reshape(shape).astype(x.dtype)

    T["RMSNorm"] = rms_norm
    T["LayerNorm"] = layer_norm
    T["RMSNormVJP"] = _vjp_of(rms_norm, 2)
    T["LayerNormVJP"] = _vjp_of(layer_norm, 3)
    T["RoPE"] = rope

    def sdpa(q, k, v, *rest, scale, causal, has_mask, has_sinks):
        """In float32 at the highest precision, rounded once (the fused kernels' math)."""
        B, H, L, D = q.shape
        Hk, kL = k.shape[1], k.shape[2]
        f = [a.astype(jnp.float32) for a in (q, k, v)]
        kk, vv = jnp.repeat(f[1], H // Hk, 1), jnp.repeat(f[2], H // Hk, 1)
        s_ = jnp.einsum("bhld,bhkd->bhlk", f[0], kk, precision=lax.Precision.HIGHEST) * scale
        low = jnp.float32(jnp.finfo(jnp.float32).min)
        if causal:
            s_ = jnp.where(jnp.arange(L)[:, None] + (kL - L) >= jnp.arange(kL)[None], s_, low)
        if has_mask:
            m = rest[0]
            s_ = jnp.where(m, s_, low) if m.dtype == jnp.bool_ else s_ + m.astype(jnp.float32)
        if has_sinks:
            sk = jnp.broadcast_to(rest[-1].astype(jnp.float32)[None, :, None, None], (B, H, L, 1))
            p = jax.nn.softmax(jnp.concatenate([sk, s_], -1), -1)[..., 1:]
        else:
            p = jax.nn.softmax(s_, -1)
        out = jnp.einsum("bhlk,bhkd->bhld", p, vv, precision=lax.Precision.HIGHEST)
        return out.astype(q.dtype)

    T["ScaledDotProductAttention"] = sdpa
    T["SearchSorted"] = lambda seq, values, *, side: jnp.searchsorted(seq, values, side=side)

    # -- Compiled: the fused tape, op by op, with this same table ---------------------------
    def compiled(*inputs, tape, shape):
        env = {}
        for x, a in zip(tape.inputs, inputs):
            env[x.name] = (jnp.asarray(np.asarray(x.constant, dtype=x.dtype))
                           if x.is_constant else a)
        for op in tape.ops:
            args = [env[n] for n in op.inputs]
            if op.primitive == "Broadcast" and tape.reduction is not None:
                val = jnp.broadcast_to(args[0], tuple(dict(op.params)["shape"]))
            elif op.primitive == "Broadcast":  # broadcasting happens in the consumers
                val = args[0]
            else:
                r = T.get(op.primitive)
                if r is None:
                    raise NoReference(f"no JAX rule for {op.primitive} inside the tape")
                val = r(*args, **dict(op.params))
            env[op.name] = jnp.asarray(val).astype(np.dtype(op.dtype))
        red = tape.reduction  # a fused reduction's outputs: the full or the reduced shape
        outs = tuple(jnp.broadcast_to(env[n], red.shape_of(n, shape) if red else tuple(shape))
                     for n in tape.outputs)
        return outs[0] if len(outs) == 1 else outs

    T["Compiled"] = compiled

    def custom_transforms(*inputs, num_outputs, **_):
        """A custom function's node hands its trailing inputs (the body's outputs) through."""
        outs = inputs[len(inputs) - num_outputs:]
        return outs[0] if num_outputs == 1 else tuple(outs)

    T["CustomTransforms"] = custom_transforms
    return T


def rule_for(name: str):
    """The JAX rule for a primitive name, or None when there is no reference for it."""
    return table().get(name)
